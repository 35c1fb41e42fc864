// `sparq info`: build facts (SIMD targets compiled and chosen, BLAS), for bug reports.
#include <hwy/highway.h>
#include <hwy/targets.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "sparq/machine.h"
#include "tools/command.h"

namespace sparq::cli {
namespace {

Registrar reg("info", "Print build information: SIMD targets, threads", [](CLI::App& sub) -> RunFn {
  return [](const KernelConfig& cfg) -> Status {
    std::string compiled;
    for (int64_t t : hwy::SupportedAndGeneratedTargets()) {
      compiled += std::string(hwy::TargetName(t)) + " ";
    }
    std::printf("sparq 0.1.0\nSIMD targets compiled and supported here: %s\n", compiled.c_str());
    std::printf("Kernels run on: %s\n", cfg.target_name().c_str());  // after --max-isa
    const char* env = std::getenv("OPENBLAS_CORETYPE");
    std::printf("OpenBLAS kernels: %s%s\n", cpu::BlasCoreName().c_str(),
                env ? (std::string(" (OPENBLAS_CORETYPE=") + env + ")").c_str() : "");
    return Status::Ok();
  };
});

}  // namespace
}  // namespace sparq::cli
