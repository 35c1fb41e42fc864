// The machine-limit loops of `sparq bench machine`: the FMA loop must run as many distinct chains
// as it counts flops for (a loop whose chains the compiler can prove equal collapses to one
// latency-bound chain and overstates the peak).
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cmath>

#include "sparq/kernel_config.h"
#include "sparq/machine.h"

namespace sparq::cpu {
namespace {

TEST(MachineTest, FmaLoopRunsDistinctChainsItCounts) {
  const int64_t iters = 5000;
  int64_t flops = 0;
  int chains = 0;
  const double sum = FmaLoop(iters, &flops, &chains, KernelConfig::FromMachine().value());
  ASSERT_GE(chains, 12);
  // Independent model: each chain in double, a <- a * m + c, from its own start value.
  double want = 0;
  for (int i = 0; i < chains; ++i) {
    double a = FmaChainStart(i);
    for (int64_t t = 0; t < iters; ++t) a = a * static_cast<double>(kFmaMul) + static_cast<double>(kFmaAdd);
    want += a;
  }
  // f32 rounding: each step adds at most half an ulp (~6e-8 relative) to a value near 1, and the
  // factor m < 1 damps older errors, so each chain stays within iters * 6e-8 = 3e-4 relative.
  EXPECT_NEAR(sum, want, 3e-4 * std::abs(want));
  // Distinct starts: a loop that ran one chain and scaled it would give chains * chain 0.
  double one = FmaChainStart(0);
  for (int64_t t = 0; t < iters; ++t) one = one * static_cast<double>(kFmaMul) + static_cast<double>(kFmaAdd);
  EXPECT_GT(std::abs(sum - chains * one), 0.1);
  // The flops it counts are those of the chains it reports: 2 per lane, 1 to 16 f32 lanes.
  ASSERT_EQ(flops % (iters * chains * 2), 0);
  const int64_t lanes = flops / (iters * chains * 2);
  EXPECT_TRUE(lanes == 1 || lanes == 2 || lanes == 4 || lanes == 8 || lanes == 16) << lanes;
}

TEST(MachineTest, LoadFmaLoopRunsDistinctChainsOnTheLoadedValues) {
  const int64_t iters = 5000;
  int64_t flops = 0;
  int chains = 0;
  const double sum =
      LoadFmaLoop(iters, &flops, &chains, KernelConfig::FromMachine().value());
  ASSERT_GE(chains, 12);
  // Independent model: each chain in double, a <- v(i % blocks, j) * m + a.
  double want = 0, chain0 = 0;
  for (int j = 0; j < chains; ++j) {
    double a = FmaChainStart(j);
    for (int64_t t = 0; t < iters; ++t) {
      a += static_cast<double>(LoadFmaValue(static_cast<int>(t % kLoadFmaBlocks), j)) *
           static_cast<double>(kFmaMul);
    }
    want += a;
    if (j == 0) chain0 = a;
  }
  // f32 rounding: each step rounds a value below 2.1 to half an ulp (1.2e-7), 5000 steps: 6e-4
  // per chain at most; the final sum of 16 values adds ~16 half-ulps more.
  EXPECT_NEAR(sum, want, 6e-4 * chains);
  // Distinct chains: one chain scaled by the count would be off by ~1 (starts 0.0625 apart).
  EXPECT_GT(std::abs(sum - chains * chain0), 0.1);
  // The loaded values were added: the chains grew (0.24 in all, 25x the tolerance).
  double starts = 0;
  for (int j = 0; j < chains; ++j) starts += FmaChainStart(j);
  EXPECT_GT(sum - starts, 0.5 * (want - starts));
  ASSERT_EQ(flops % (iters * chains * 2), 0);
  const int64_t lanes = flops / (iters * chains * 2);
  EXPECT_TRUE(lanes == 1 || lanes == 2 || lanes == 4 || lanes == 8 || lanes == 16) << lanes;
}

// f32 lanes of an x86 target's vectors (the compiled x86 ones and the portable two), else 0.
int64_t F32Lanes(int64_t t) {
  if (t == HWY_AVX3 || t == HWY_AVX3_DL) return 16;
  if (t == HWY_AVX2) return 8;
  if (t == HWY_SSE4 || t == HWY_SSSE3 || t == HWY_EMU128) return 4;
  if (t == HWY_SCALAR) return 1;
  return 0;
}

// The probes run the target of the config they are passed, not Highway's dispatch: every supported
// target's loop counts its own vector width (AVX-512 16 f32 lanes, AVX2 8, SSE4 4, ...).
TEST(MachineTest, ProbesRunTheTargetOfTheirConfig) {
  const KernelConfig best = KernelConfig::FromMachine().value();
  for (int64_t t : KernelConfig::SupportedTargets()) {
    const KernelConfig cfg = best.WithTarget(t);
    const int64_t want = F32Lanes(t);
    if (want == 0) continue;  // a target this table does not know (another architecture)
    int64_t flops = 0, load_flops = 0;
    int chains = 0, load_chains = 0;
    FmaLoop(100, &flops, &chains, cfg);
    LoadFmaLoop(100, &load_flops, &load_chains, cfg);
    EXPECT_EQ(flops / (100 * chains * 2), want) << cfg.target_name();
    EXPECT_EQ(load_flops / (100 * load_chains * 2), want) << cfg.target_name();
  }
}

}  // namespace
}  // namespace sparq::cpu
