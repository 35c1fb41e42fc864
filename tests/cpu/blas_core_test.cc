// The OpenBLAS kernel-family check and the command line's restart with OPENBLAS_CORETYPE.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "sparq/machine.h"

namespace sparq::cpu {
namespace {

std::string RunShell(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  std::array<char, 256> buf;
  while (fgets(buf.data(), buf.size(), p) != nullptr) out += buf.data();
  pclose(p);
  return out;
}

bool PreAvx2Family(const std::string& core) {
  for (const char* o : {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom",
                        "Sandybridge"}) {
    if (core.find(o) != std::string::npos) return true;
  }
  return false;
}

TEST(BlasCore, NoSuggestionWhereTheUserChoseTheFamily) {
  EXPECT_EQ(SuggestedOpenBlasCore(/*user_chose=*/true), nullptr);
}

TEST(BlasCore, SuggestionOnlyForPreAvx2FamiliesOnAvx2Cpus) {
  const char* user = std::getenv("OPENBLAS_CORETYPE");
  const char* s = SuggestedOpenBlasCore(user != nullptr && *user != '\0');
  const std::string core = BlasCoreName();
  if (s != nullptr) {
    EXPECT_TRUE(PreAvx2Family(core) || core == "unknown") << core;
    EXPECT_TRUE(std::string(s) == "SkylakeX" || std::string(s) == "Haswell") << s;
  }
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (PreAvx2Family(core) && std::getenv("OPENBLAS_CORETYPE") == nullptr &&
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    EXPECT_NE(s, nullptr) << "OpenBLAS chose " << core << " on an AVX2 CPU";
  }
#endif
}

// `sparq info` reports the family after the command line's own fix: never a pre-AVX2 family on
// a CPU with AVX2 (unless the user forces one), and the user's choice is kept.
TEST(BlasCore, CommandLineRunsWithAnAvx2Family) {
  const std::string cli = SPARQ_CLI_PATH;
  const std::string out = RunShell("env -u OPENBLAS_CORETYPE " + cli + " info 2>&1");
  ASSERT_NE(out.find("OpenBLAS kernels: "), std::string::npos) << out;
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    const std::string line = out.substr(out.find("OpenBLAS kernels: "));
    EXPECT_FALSE(PreAvx2Family(line.substr(0, line.find('\n')))) << out;
  }
#endif
  const std::string forced = RunShell("OPENBLAS_CORETYPE=Haswell " + cli + " info 2>&1");
  EXPECT_NE(forced.find("OpenBLAS kernels: Haswell (OPENBLAS_CORETYPE=Haswell)"), std::string::npos)
      << forced;
}

}  // namespace
}  // namespace sparq::cpu
