// What a benchmark ran on, for its table header and its JSON rows (`cpu_model`, `isa`):
// the CPU's model name and the SIMD target sparq's kernels dispatch to.
#pragma once

#include <string>

#include "sparq/kernel_config.h"

namespace sparq::cli {

struct MachineInfo {
  std::string cpu_model;  // "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz"; "unknown" if unread
  std::string isa;        // the running Highway target: "AVX3", "AVX2", "SSE4", "EMU128", ...
};

// `isa` is the target of cfg, the run's config (main() caps it by --max-isa).
MachineInfo DescribeMachine(const KernelConfig& cfg);

// "cpu: MODEL; isa: TARGET" (one line, no newline).
std::string MachineLine(const MachineInfo& m);

}  // namespace sparq::cli
