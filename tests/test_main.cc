// The main of every test executable (in place of GTest::gtest_main). With SPARQ_MAX_ISA set (AVX3_DL,
// AVX3, AVX2, SSE4, SSSE3, EMU128, SCALAR: the spellings of `sparq --max-isa`), the whole suite runs
// as on a CPU that has at most that instruction set: Highway's targets above it are disabled (so
// hwy::SupportedTargets(), the tests' "every target" loops and HWY_DYNAMIC_DISPATCH stop there).
// KernelConfig::FromMachine() picks from those targets, so every config a test builds for "this
// machine" is the capped one: no process-wide config is set. CLI runs started by the tests inherit
// the variable and are capped by the CLI itself. Only tests read the environment; the library
// never does.
//
//   SPARQ_MAX_ISA=AVX2 ctest --preset release        (docs/building.md)
#include <gtest/gtest.h>
#include <hwy/targets.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <string>

#ifdef SPARQ_TEST_MAIN_CPU
#include "sparq/kernel_config.h"
#endif

namespace {

// The Highway target a SPARQ_MAX_ISA value names (as KernelConfig::FromMachine reads it), 0 if none.
int64_t CapTarget(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char ch) { return std::toupper(ch); });
  if (s == "AVX3_DL") return HWY_AVX3_DL;
  if (s == "AVX3" || s == "AVX512" || s == "AVX-512") return HWY_AVX3;
  if (s == "AVX2") return HWY_AVX2;
  if (s == "SSE4") return HWY_SSE4;
  if (s == "SSSE3") return HWY_SSSE3;
  if (s == "EMU128") return HWY_EMU128;
  if (s == "SCALAR") return HWY_SCALAR;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const char* env = std::getenv("SPARQ_MAX_ISA");
  if (env != nullptr && *env != '\0') {
    const int64_t cap = CapTarget(env);
    if (cap == 0) {
      std::fprintf(stderr, "SPARQ_MAX_ISA=%s: not an instruction set sparq knows (AVX3_DL, AVX3, "
                           "AVX2, SSE4, SSSE3, EMU128, SCALAR)\n", env);
      return 2;
    }
#ifdef SPARQ_TEST_MAIN_CPU
    // OpenBLAS picks its kernels when it loads: cap it as `sparq --max-isa AVX2` does, by setting
    // OPENBLAS_CORETYPE (unless the caller chose one) and starting again.
    if (cap == HWY_AVX2 && std::getenv("OPENBLAS_CORETYPE") == nullptr) {
      setenv("OPENBLAS_CORETYPE", "Haswell", 1);
      execv("/proc/self/exe", argv);  // returns only on failure: then run as we are
    }
#endif
    // Lower bits are better targets on x86: disable every bit below the cap (Highway keeps the
    // compiled baseline whatever the mask).
    hwy::DisableTargets(cap - 1);
    std::string left;
    for (int64_t t : hwy::SupportedAndGeneratedTargets()) left += std::string(" ") + hwy::TargetName(t);
#ifdef SPARQ_TEST_MAIN_CPU
    auto cfg = sparq::KernelConfig::FromMachine(env);
    if (!cfg.ok()) {
      std::fprintf(stderr, "SPARQ_MAX_ISA=%s: %s\n", env, cfg.status().ToString().c_str());
      return 2;
    }
    // Not stored anywhere: this only reports what every FromMachine() of the tests now returns.
    std::fprintf(stderr, "sparq tests: SPARQ_MAX_ISA=%s: kernels run on %s; Highway targets left:%s\n",
                 env, cfg->target_name().c_str(), left.c_str());
#else
    std::fprintf(stderr, "sparq tests: SPARQ_MAX_ISA=%s: Highway targets left:%s\n", env,
                 left.c_str());
#endif
  }
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
