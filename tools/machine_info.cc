#include "tools/machine_info.h"

#include <fstream>

#include "sparq/kernel_config.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace sparq::cli {
namespace {

std::string Trim(std::string s) {
  const size_t b = s.find_first_not_of(" \t");
  const size_t e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

// /proc/cpuinfo's first "model name" (Linux), else the cpuid brand string (x86).
std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) {
      if (const size_t colon = line.find(':'); colon != std::string::npos) {
        std::string v = Trim(line.substr(colon + 1));
        if (!v.empty()) return v;
      }
    }
  }
#if defined(__x86_64__) || defined(__i386__)
  unsigned int regs[12] = {};
  if (static_cast<unsigned int>(__get_cpuid_max(0x80000000u, nullptr)) >= 0x80000004u) {
    for (unsigned int i = 0; i < 3; ++i) {
      __get_cpuid(0x80000002u + i, &regs[4 * i], &regs[4 * i + 1], &regs[4 * i + 2], &regs[4 * i + 3]);
    }
    std::string v = Trim(std::string(reinterpret_cast<const char*>(regs), sizeof(regs)).c_str());
    if (!v.empty()) return v;
  }
#endif
  return "unknown";
}

}  // namespace

MachineInfo DescribeMachine(const KernelConfig& cfg) { return {CpuModel(), cfg.target_name()}; }

std::string MachineLine(const MachineInfo& m) { return "cpu: " + m.cpu_model + "; isa: " + m.isa; }

}  // namespace sparq::cli
