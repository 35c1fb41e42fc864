// Decode attention in key ranges (src/cpu/attention.h) against a double-precision softmax, for
// every compiled Highway target: any split of the keys merges to the same weighted sum.
#include <gtest/gtest.h>

#include <hwy/targets.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "sparq/dtype.h"
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

// An f16 KV cache's rows: StoreF16 rounds as the scalar F32ToF16 (nearest even) after
// saturating at +-65504, on every target (F16C in vectors from AVX2 up, the scalar conversion
// below), and LoadF16 widens exactly as F16ToF32.
TEST(AttentionTest, F16CacheRowsRoundAsF32ToF16OnEveryTarget) {
  std::vector<float> x = RandomVector(1000, 7);
  for (float& v : x) v *= 8.0f;
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> special = {
      0.0f, -0.0f, 65504.0f, 65519.0f, 65520.0f, -65520.0f, 1e6f, -1e6f, inf, -inf,
      std::numeric_limits<float>::quiet_NaN(), 1e-8f, -3e-6f, 6.1e-5f, 0x1.0p-25f, 0x1.8p-24f,
      1.0f + 0x1.0p-11f /* tie: down to even */, 1.0f + 0x1.8p-10f /* tie: up to even */};
  x.insert(x.begin() + 37, special.begin(), special.end());  // inside the vector part, and a tail
  const auto n = static_cast<int64_t>(x.size());
  std::vector<uint16_t> want(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const float v = x[i];
    want[i] = F32ToF16(std::fabs(v) > 65504.0f ? std::copysign(65504.0f, v) : v);
  }
  EXPECT_EQ(want[37 + 4], 0x7BFF);  // 65520 would round to inf: saturated
  EXPECT_EQ(want[37 + 9], 0xFBFF);  // -inf too
  const int targets = testing_cpu::ForEachTarget([&](const std::string& target) {
    std::vector<uint16_t> got(x.size(), 0xAAAA);
    cpu::StoreF16(testing_cpu::Cfg(), x.data(), n, got.data());
    std::vector<float> back(x.size());
    cpu::LoadF16(testing_cpu::Cfg(), got.data(), n, back.data());
    for (size_t i = 0; i < x.size(); ++i) {
      if (std::isnan(x[i])) {
        EXPECT_TRUE(std::isnan(F16ToF32(got[i]))) << target << " " << i;
        EXPECT_TRUE(std::isnan(back[i])) << target << " " << i;
        continue;
      }
      ASSERT_EQ(got[i], want[i]) << target << " x[" << i << "] = " << x[i];
      ASSERT_EQ(std::bit_cast<uint32_t>(back[i]), std::bit_cast<uint32_t>(F16ToF32(want[i])))
          << target << " " << i;
    }
  });
  EXPECT_GE(targets, 2);
}

// Decode attention over an f16 cache (keys in tiles of kKvTile positions, values in rows) for
// 1 to 5 query heads sharing the KV head, against a double-precision softmax on the f16 values:
// every compiled target, a range ending inside a tile, a single key, none.
TEST(AttentionTest, F16TilesGiveTheSoftmaxWeightedSumOfEveryHead) {
  for (int64_t hd : {64, 5, 48}) {
    const int64_t cap = 320;  // whole tiles
    std::vector<uint16_t> kt(cap * hd), v16(cap * hd);
    std::vector<double> kd(cap * hd), vd(cap * hd);  // the f16 values, [position][hd]
    const std::vector<float> k0 = RandomVector(cap * hd, 12), v0 = RandomVector(cap * hd, 13);
    for (int64_t j = 0; j < cap; ++j) {
      for (int64_t e = 0; e < hd; ++e) {
        const uint16_t kh = F32ToF16(4.0f * k0[j * hd + e]);  // peaked scores
        kt[(j / cpu::kKvTile * hd + e) * cpu::kKvTile + j % cpu::kKvTile] = kh;
        kd[j * hd + e] = F16ToF32(kh);
        v16[j * hd + e] = F32ToF16(v0[j * hd + e]);
        vd[j * hd + e] = F16ToF32(v16[j * hd + e]);
      }
    }
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    for (int64_t heads : {1, 3, 5}) {
      const std::vector<float> q = RandomVector(heads * hd, 11 + heads);
      for (int64_t len : {int64_t{300}, int64_t{17}, int64_t{1}, int64_t{0}}) {
        // Reference: per head, exp(s - max) and the unnormalized weighted sum, in double.
        std::vector<double> want(heads * hd, 0.0), want_sum(heads, 0.0), want_max(heads, -INFINITY);
        for (int64_t h = 0; h < heads; ++h) {
          std::vector<double> sd(len);
          for (int64_t j = 0; j < len; ++j) {
            double d = 0.0;
            for (int64_t e = 0; e < hd; ++e) d += double(q[h * hd + e]) * kd[j * hd + e];
            sd[j] = d * scale;
            want_max[h] = std::max(want_max[h], sd[j]);
          }
          for (int64_t j = 0; j < len; ++j) {
            const double w = std::exp(sd[j] - want_max[h]);
            want_sum[h] += w;
            for (int64_t e = 0; e < hd; ++e) want[h * hd + e] += w * vd[j * hd + e];
          }
        }
        testing_cpu::ForEachTarget([&](const std::string& target) {
          const int64_t stride = 320;
          std::vector<float> scores(heads * stride), outs(heads * hd, 7.0f);
          std::vector<cpu::AttendPartial> parts(heads);
          for (int64_t h = 0; h < heads; ++h) parts[h].out = outs.data() + h * hd;
          cpu::AttendTilesF16(testing_cpu::Cfg(), q.data(), heads, kt.data(), hd * cpu::kKvTile,
                              v16.data(), len, hd, scale, scores.data(), stride, parts.data());
          for (int64_t h = 0; h < heads; ++h) {
            const std::string at = target + " hd=" + std::to_string(hd) + " heads=" +
                                   std::to_string(heads) + " len=" + std::to_string(len) +
                                   " h=" + std::to_string(h);
            ASSERT_EQ(parts[h].sum == 0.0, len == 0) << at;
            if (len == 0) {
              for (int64_t e = 0; e < hd; ++e) ASSERT_EQ(outs[h * hd + e], 0.0f) << at;
              continue;
            }
            // Scores |s| <= ~30 to a few f32 ulps: the max to ~1e-5, the weights relative ~1e-5,
            // and each output a sum of |v| <= 1 values divided by the sum of the weights.
            ASSERT_NEAR(parts[h].max, want_max[h], 1e-4) << at;
            ASSERT_NEAR(parts[h].sum / want_sum[h], std::exp(want_max[h] - parts[h].max), 2e-5) << at;
            for (int64_t e = 0; e < hd; ++e) {
              ASSERT_NEAR(outs[h * hd + e] / parts[h].sum, want[h * hd + e] / want_sum[h], 2e-5)
                  << at << " e=" << e;
            }
          }
        });
      }
    }
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
