// Decode attention in key ranges (src/cpu/attention.h) against a double-precision softmax, for
// every compiled Highway target: any split of the keys merges to the same weighted sum.
#include <gtest/gtest.h>

#include <hwy/targets.h>

#include <cmath>
#include <vector>

#include "src/cpu/attention.h"
#include "tests/cpu/spmm_testutil.h"

namespace sparq {
namespace {

using testing_cpu::RandomVector;

TEST(AttentionTest, RangesMergeToTheSoftmaxWeightedSum) {
  for (int64_t hd : {64, 5, 48}) {
    const int64_t len = 700, stride = 3 * hd + 2;  // rows of a KV cache with 3 KV heads, padded
    const std::vector<float> q = RandomVector(hd, 1);
    std::vector<float> k = RandomVector(len * stride, 2), v = RandomVector(len * stride, 3);
    for (float& x : k) x *= 4.0f;  // peaked scores: the max shift matters
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    // Reference: double softmax over all keys.
    std::vector<double> s(len), want(hd, 0.0);
    double mx = -INFINITY, sum = 0.0;
    for (int64_t j = 0; j < len; ++j) {
      double d = 0.0;
      for (int64_t e = 0; e < hd; ++e) d += double(q[e]) * k[j * stride + e];
      s[j] = d * scale;
      mx = std::max(mx, s[j]);
    }
    for (int64_t j = 0; j < len; ++j) sum += (s[j] = std::exp(s[j] - mx));
    for (int64_t j = 0; j < len; ++j) {
      for (int64_t e = 0; e < hd; ++e) want[e] += s[j] / sum * v[j * stride + e];
    }
    const int targets = testing_cpu::ForEachTarget([&](const std::string& target) {
      for (int64_t ranges : {1, 2, 3, 8}) {
        const int64_t chunk = (len + ranges - 1) / ranges;
        std::vector<float> outs(ranges * hd), scores(chunk), out(hd);
        std::vector<cpu::AttendPartial> parts(ranges);
        for (int64_t r = 0; r < ranges; ++r) {
          parts[r].out = outs.data() + r * hd;
          const int64_t j0 = r * chunk, n = std::min(chunk, len - j0);
          cpu::AttendRange(testing_cpu::Cfg(), q.data(), k.data() + j0 * stride,
                           v.data() + j0 * stride, n, stride, hd, scale, scores.data(), &parts[r]);
        }
        cpu::MergeAttend(parts.data(), ranges, hd, out.data());
        // Each output is a convex combination of |v| <= 1 values: errors of a few f32 ulps of the
        // scores (|s| <= ~30) move the weights by ~1e-5 relative.
        for (int64_t e = 0; e < hd; ++e) {
          ASSERT_NEAR(out[e], want[e], 2e-5) << target << " hd=" << hd << " ranges=" << ranges << " e=" << e;
        }
      }
      // An empty range contributes nothing.
      std::vector<float> o0(hd), o1(hd), out(hd);
      std::vector<float> scores(len);
      cpu::AttendPartial parts[2];
      parts[0].out = o0.data();
      parts[1].out = o1.data();
      const KernelConfig& cfg = testing_cpu::Cfg();
      cpu::AttendRange(cfg, q.data(), k.data(), v.data(), len, stride, hd, scale, scores.data(),
                       &parts[0]);
      cpu::AttendRange(cfg, q.data(), k.data(), v.data(), 0, stride, hd, scale, scores.data(),
                       &parts[1]);
      cpu::MergeAttend(parts, 2, hd, out.data());
      for (int64_t e = 0; e < hd; ++e) ASSERT_NEAR(out[e], want[e], 2e-5) << target << " empty range";
    });
    EXPECT_GE(targets, 2) << "hd=" << hd;
  }
}

// --max-isa caps attention: its bodies run on the config's target, not on the best one Highway
// would pick for this host (Highway's supported set is left alone here, so a fallback to its own
// dispatch would show up as the host's best target). The host's default config runs the best
// supported target, the body HWY_DYNAMIC_DISPATCH used to run, so the default bits are unchanged.
TEST(AttentionTest, RunsOnTheConfiguredTarget) {
  const KernelConfig machine = KernelConfig::FromMachine().value();
  const std::vector<int64_t> targets = KernelConfig::SupportedTargets();
  ASSERT_FALSE(targets.empty());
  EXPECT_EQ(cpu::AttentionTarget(machine), targets.front()) << hwy::TargetName(machine.target);
  for (int64_t t : targets) {
    EXPECT_EQ(cpu::AttentionTarget(machine.WithTarget(t)), t) << hwy::TargetName(t);
  }
  if (hwy::SupportedTargets() & HWY_AVX2) {
    const KernelConfig avx2 = KernelConfig::FromMachine("AVX2").value();
    EXPECT_EQ(cpu::AttentionTarget(avx2), HWY_AVX2);
  }
}

}  // namespace
}  // namespace sparq
