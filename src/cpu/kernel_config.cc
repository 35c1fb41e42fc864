// KernelConfig (sparq/kernel_config.h): the machine as cpuid and the OS report it, the target.
#include "sparq/kernel_config.h"

#include <hwy/targets.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstring>

#if HWY_ARCH_X86
#include <cpuid.h>
#endif

namespace sparq {
namespace {

CpuInfo DetectCpu() {
  CpuInfo c;
#if HWY_ARCH_X86
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(0, &eax, &ebx, &ecx, &edx)) {
    char v[13] = {};
    std::memcpy(v, &ebx, 4);
    std::memcpy(v + 4, &edx, 4);
    std::memcpy(v + 8, &ecx, 4);
    c.vendor = v;
  }
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx)) {
    const int base = static_cast<int>((eax >> 8) & 0xf);
    c.family = base == 0xf ? base + static_cast<int>((eax >> 20) & 0xff) : base;
    const int model = static_cast<int>((eax >> 4) & 0xf);
    c.model_id = base == 0xf || base == 0x6 ? model + (static_cast<int>((eax >> 16) & 0xf) << 4)
                                            : model;
  }
  unsigned max_ext = 0;
  if (__get_cpuid(0x80000000u, &max_ext, &ebx, &ecx, &edx) && max_ext >= 0x80000004u) {
    char brand[49] = {};
    for (unsigned i = 0; i < 3; ++i) {
      unsigned r[4];
      __get_cpuid(0x80000002u + i, &r[0], &r[1], &r[2], &r[3]);
      std::memcpy(brand + 16 * i, r, 16);
    }
    std::string b(brand);
    b.erase(0, b.find_first_not_of(' '));
    b.erase(b.find_last_not_of(' ') + 1);
    c.model = b;
  }
#endif
  c.l1d_bytes = std::max<long>(0, sysconf(_SC_LEVEL1_DCACHE_SIZE));
  c.l2_bytes = std::max<long>(0, sysconf(_SC_LEVEL2_CACHE_SIZE));
  c.llc_bytes = std::max<long>(0, sysconf(_SC_LEVEL3_CACHE_SIZE));
  if (c.llc_bytes == 0) c.llc_bytes = c.l2_bytes;
  return c;
}

int DispatchIndexOf(int64_t target) {
  hwy::ChosenTarget ct;
  ct.Update(target);
  return static_cast<int>(ct.GetIndex());
}

}  // namespace

std::vector<int64_t> KernelConfig::SupportedTargets() {
  std::vector<int64_t> out = hwy::SupportedAndGeneratedTargets();
  std::sort(out.begin(), out.end());  // lower bits are newer targets: best first
  return out;
}

std::string KernelConfig::target_name() const { return hwy::TargetName(target); }

KernelConfig KernelConfig::WithTarget(int64_t t) const {
  KernelConfig c = *this;
  c.target = t;
  c.dispatch_index = DispatchIndexOf(t);
  return c;
}

Result<KernelConfig> KernelConfig::FromMachine(const std::string& max_isa) {
  KernelConfig c;
  c.cpu = DetectCpu();
  if (c.cpu.l2_bytes > 0) {
    c.xt_tile_bytes = std::clamp<int64_t>(c.cpu.l2_bytes / 4 * 3, 128 << 10, 16 << 20);
  }
  // The row kernels' k blocks take two thirds of L1 for their X^T slice, rounded down to a power
  // of two: 16 KiB of a 32 KiB L1 as before, 32 KiB of a 48 KiB one, where the wider blocks halve
  // the accumulator reloads per kept weight; the row-group kernels measured no better with them
  // (docs/kernels.md). The bits do not depend on the block size.
  if (c.cpu.l1d_bytes > 0) {
    const uint64_t two_thirds = static_cast<uint64_t>(c.cpu.l1d_bytes) * 2 / 3;
    c.row_xt_block_bytes =
        std::max<int64_t>(8 << 10, static_cast<int64_t>(std::bit_floor(two_thirds)));
  }
  int64_t cap = 0;
  if (!max_isa.empty()) {
    std::string s = max_isa;
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char ch) { return std::toupper(ch); });
    if (s == "AVX3_DL") cap = HWY_AVX3_DL;
    if (s == "AVX3" || s == "AVX512" || s == "AVX-512") cap = HWY_AVX3;
    if (s == "AVX2") cap = HWY_AVX2;
    if (s == "SSE4") cap = HWY_SSE4;
    if (s == "SSSE3") cap = HWY_SSSE3;
    if (s == "EMU128") cap = HWY_EMU128;
    if (s == "SCALAR") cap = HWY_SCALAR;
    if (cap == 0) {
      return InvalidInput("--max-isa " + max_isa +
                                     ": not an instruction set sparq knows (AVX3_DL, AVX3, AVX2, "
                                     "SSE4, SSSE3, EMU128, SCALAR)");
    }
  }
  for (int64_t t : SupportedTargets()) {  // best first
    if (t >= cap) return c.WithTarget(t);
  }
  return c.WithTarget(HWY_SCALAR);
}

}  // namespace sparq
