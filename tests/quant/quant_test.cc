// The value spec users name (--values) and round-to-nearest group quantization against its promise.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "sparq/quant.h"

namespace sparq {
namespace {

// Deterministic values in [-1, 1] (no generator needed: any spread of signs and magnitudes).
std::vector<float> Wave(size_t n, uint64_t seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(std::sin(0.7 * double(i) + 1.3 * double(seed)));
  return v;
}

TEST(ValueSpecTest, ParsesTheDocumentedForms) {
  struct Want { const char* text; DType dt; int group; bool sym; const char* name; };
  const Want good[] = {{"f32", DType::kF32, 64, false, "f32"},
                       {"bf16", DType::kBF16, 64, false, "bf16"},
                       {"int8", DType::kI8, 64, true, "int8:g64"},
                       {"int8:g32", DType::kI8, 32, true, "int8:g32"},
                       {"int4", DType::kI4, 64, false, "int4:g64"},
                       {"int4:g128", DType::kI4, 128, false, "int4:g128"},
                       {"int4:g32:sym", DType::kI4, 32, true, "int4:g32:sym"},
                       {"int4:sym:g64", DType::kI4, 64, true, "int4:g64:sym"}};
  for (const Want& w : good) {
    auto s = ValueSpec::Parse(w.text);
    ASSERT_TRUE(s.ok()) << w.text << ": " << s.status().ToString();
    EXPECT_EQ(s->dtype, w.dt) << w.text;
    EXPECT_EQ(s->quantized() ? s->group : 64, w.group) << w.text;
    EXPECT_EQ(s->sym, w.sym) << w.text;
    EXPECT_EQ(s->Name(), w.name) << w.text;
    EXPECT_EQ(ValueSpec::Parse(s->Name())->Name(), s->Name());
  }
  for (const char* bad : {"", "int3", "int8:sym", "int4:g48", "int4:g", "int4:g64:g32", "f32:g64",
                          "int4:sym:sym", "int4:x", "int4:g99999", "int8:"}) {
    auto s = ValueSpec::Parse(bad);
    ASSERT_FALSE(s.ok()) << "'" << bad << "' parsed";
    EXPECT_NE(s.status().message().find("values '"), std::string::npos) << s.status().ToString();
  }
  EXPECT_DOUBLE_EQ(ValueSpec::Parse("int4:g64")->BitsPerValue(), 4.5);
  EXPECT_DOUBLE_EQ(ValueSpec::Parse("int4:g64:sym")->BitsPerValue(), 4.25);
  EXPECT_DOUBLE_EQ(ValueSpec::Parse("int8:g32")->BitsPerValue(), 8.5);
}

// Round-to-nearest promise: every code in range, and each value within half a step of its
// dequantized code (plus the f32 rounding of the dequantization itself, a few ulp of the value),
// since the grid covers [min, max] (with a min) or [-amax, amax].
TEST(ValueSpecTest, QuantizeGroupIsRoundToNearestOnItsGrid) {
  for (const char* text : {"int8:g32", "int4:g64", "int4:g32:sym"}) {
    const ValueSpec spec = *ValueSpec::Parse(text);
    for (uint64_t seed = 1; seed <= 50; ++seed) {
      std::vector<float> v = Wave(size_t(spec.group), seed);
      const float mag = std::ldexp(1.0f, int(seed % 13) - 6);
      for (auto& e : v) e = seed % 5 == 0 ? std::fabs(e) * mag + mag : e * mag;  // some all > 0
      if (seed % 7 == 0) v.assign(v.size(), 0.0f);
      if (seed % 11 == 0) v.assign(v.size(), 0.25f);
      std::vector<int8_t> q(v.size());
      auto g = QuantizeGroup(v.data(), int64_t(v.size()), spec, q.data());
      ASSERT_TRUE(g.ok()) << g.status().ToString();
      EXPECT_EQ(F16ToF32(g->scale_f16), g->scale);
      if (spec.has_min()) {
        EXPECT_EQ(F16ToF32(g->min_f16), g->min);
      }
      for (size_t i = 0; i < v.size(); ++i) {
        const int lo = spec.dtype == DType::kI8 ? -127 : spec.sym ? 1 : 0;
        const int hi = spec.dtype == DType::kI8 ? 127 : 15;
        ASSERT_GE(q[i], lo) << text;
        ASSERT_LE(q[i], hi) << text;
        const float d = Dequantize(q[i], *g, spec);
        const double tol = 0.5 * g->scale * (1 + 1e-3) + 4 * std::numeric_limits<float>::epsilon() * std::fabs(v[i]);
        ASSERT_LE(std::fabs(double(d) - v[i]), tol) << text << " seed " << seed << " v " << v[i];
      }
      if (seed % 7 == 0 && !spec.has_min()) {
        for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(Dequantize(q[i], *g, spec), 0.0f);
      }
    }
  }
  const ValueSpec spec = *ValueSpec::Parse("int8:g32");
  std::vector<float> big(32, 1e9f);
  std::vector<int8_t> q(32);
  EXPECT_FALSE(QuantizeGroup(big.data(), 32, spec, q.data()).ok());
  big[3] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(QuantizeGroup(big.data(), 32, spec, q.data()).ok());
}

// The least f16 whose value is >= x (x >= 0), by bisection over the positive f16 bit patterns,
// which are ordered like their values: independent of the library's rounding helpers.
uint16_t LeastF16AtLeast(double x) {
  uint32_t lo = 0, hi = 0x7c00;  // 0x7c00: infinity
  while (lo < hi) {
    const uint32_t mid = (lo + hi) / 2;
    if (double(F16ToF32(uint16_t(mid))) >= x) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return uint16_t(lo);
}

// The scale each spec promises (quant.h): amax / 127, amax / 7, (max - min) / 15 with min the f16
// at or below the smallest value, rounded up to f16; the extreme code reached wherever the scale is
// a normal f16; every value within half a step (half the scale) of its code, at magnitudes from
// 2^-40 to 2^12, across the subnormal scales (int8 groups with amax below ~8e-3), where a scale
// rounded to nearest clamps the largest values by several half-steps.
TEST(ValueSpecTest, ScaleIsTheDocumentedFormulaAndEveryValueIsWithinHalfAStep) {
  int groups = 0, subnormal = 0;
  for (const char* text : {"int8:g64", "int4:g64:sym", "int4:g32"}) {
    const ValueSpec spec = *ValueSpec::Parse(text);
    const double steps = spec.dtype == DType::kI8 ? 127 : spec.sym ? 7 : 15;
    for (int e = -40; e <= 12; ++e) {
      for (uint64_t seed = 1; seed <= 3; ++seed) {
        std::vector<float> v = Wave(size_t(spec.group), seed * 31 + uint64_t(e + 40));
        for (auto& x : v) x = std::ldexp(x, e);
        std::vector<int8_t> q(v.size());
        auto g = QuantizeGroup(v.data(), int64_t(v.size()), spec, q.data());
        ASSERT_TRUE(g.ok()) << text << " 2^" << e << ": " << g.status().ToString();
        double lo = 0, hi = 0, amax = 0;
        for (float x : v) {
          lo = std::min(lo, double(x));
          hi = std::max(hi, double(x));
          amax = std::max(amax, std::fabs(double(x)));
        }
        double range = amax;
        if (spec.has_min()) {
          // The min: the largest f16 <= the smallest value (lo <= 0 here, so the f16 at or below).
          const uint16_t up = LeastF16AtLeast(-lo);  // |min| rounded up
          EXPECT_EQ(g->min, -F16ToF32(up)) << text << " 2^" << e;
          range = hi - double(g->min);
        }
        EXPECT_EQ(g->scale_f16, LeastF16AtLeast(range / steps)) << text << " 2^" << e;
        const bool normal = g->scale >= std::ldexp(1.0f, -14);
        subnormal += !normal;
        int qmin = 127, qmax = -127;
        for (size_t i = 0; i < v.size(); ++i) {
          qmin = std::min<int>(qmin, q[i]);
          qmax = std::max<int>(qmax, q[i]);
          const double d = Dequantize(q[i], *g, spec);
          // Half a step, plus the f32 rounding of the dequantization (one ulp of the value).
          const double tol = 0.5 * double(g->scale) + std::ldexp(std::fabs(d), -23) + 1e-45;
          ASSERT_LE(std::fabs(d - double(v[i])), tol)
              << text << " 2^" << e << " seed " << seed << " value " << i << " " << v[i]
              << " code " << int(q[i]) << " scale " << g->scale;
        }
        if (normal) {
          // The extreme code: +-127 / 1 or 15 for the symmetric ones, 15 (at max) with a min.
          if (spec.has_min()) {
            EXPECT_EQ(qmax, 15) << text << " 2^" << e;
          } else {
            const int top = spec.dtype == DType::kI8 ? 127 : 15, bottom = spec.dtype == DType::kI8 ? -127 : 1;
            EXPECT_TRUE(qmax == top || qmin == bottom) << text << " 2^" << e << " codes " << qmin << ".." << qmax;
          }
        }
        ++groups;
      }
    }
  }
  EXPECT_EQ(groups, 3 * 53 * 3);
  EXPECT_GT(subnormal, 20);  // the subnormal side was reached
}

// Exact zeros (a kept N:M slot of a group with fewer than N nonzeros): int8 and symmetric int4
// give 0 back bit for bit; int4 with a min gives the grid value nearest 0, within half a step.
TEST(ValueSpecTest, ZerosComeBackExactlyOnSymmetricGridsAndNearestWithAMin) {
  for (const char* text : {"int8:g32", "int4:g32:sym", "int4:g32"}) {
    const ValueSpec spec = *ValueSpec::Parse(text);
    for (uint64_t seed = 1; seed <= 40; ++seed) {
      std::vector<float> v = Wave(32, seed);
      for (size_t i = seed % 3; i < v.size(); i += 3 + seed % 4) v[i] = 0.0f;
      if (seed % 5 == 0) {
        for (auto& x : v) x = std::fabs(x) + 0.5f;  // all positive, then zeros: the min is 0
        v[seed % 32] = 0.0f;
      }
      std::vector<int8_t> q(v.size());
      auto g = QuantizeGroup(v.data(), 32, spec, q.data());
      ASSERT_TRUE(g.ok());
      for (size_t i = 0; i < v.size(); ++i) {
        if (v[i] != 0.0f) continue;
        const float d = Dequantize(q[i], *g, spec);
        if (!spec.has_min()) {
          EXPECT_EQ(d, 0.0f) << text << " seed " << seed;
          continue;
        }
        // The nearest of all 16 grid values (ties: either).
        float best = std::numeric_limits<float>::infinity();
        for (int c = 0; c <= 15; ++c) best = std::min(best, std::fabs(Dequantize(c, *g, spec)));
        EXPECT_EQ(std::fabs(d), best) << text << " seed " << seed;
        EXPECT_LE(std::fabs(d), 0.5f * g->scale);
      }
    }
  }
}

}  // namespace
}  // namespace sparq

namespace sparq {
namespace {

// DenseQuantToF32 (src/formats/dense_quant.cc) dequantizes int4 codes with a min as a multiply and
// an add, not Dequantize's fma: the same bits because a 4-bit code times an f16 scale is exact in
// f32 (at most 4 + 11 significant bits, exponents far inside f32's range), so both round once.
// Every 4th finite f16 scale (either sign, subnormals included), every code, 1024 mins spread over
// all finite f16 values.
TEST(ValueSpecTest, IntFourWithAMinIsTheSameWithoutAnFma) {
  int64_t checked = 0;
  for (uint32_t sb = 0; sb < 0x10000; sb += 4) {
    const float scale = F16ToF32(static_cast<uint16_t>(sb));
    if (!std::isfinite(scale)) continue;
    for (uint32_t mb = 1; mb < 0x10000; mb += 64) {
      const float min = F16ToF32(static_cast<uint16_t>(mb));
      if (!std::isfinite(min)) continue;
      for (int q = 0; q < 16; ++q) {
        const float product = static_cast<float>(q) * scale;
        ASSERT_EQ(static_cast<double>(product), double(q) * double(scale)) << sb;  // exact
        const float fused = __builtin_fmaf(static_cast<float>(q), scale, min);
        const float split = product + min;
        ASSERT_TRUE(fused == split || (std::isnan(fused) && std::isnan(split)))
            << "scale bits " << sb << " min bits " << mb << " code " << q;
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 10'000'000);
}

}  // namespace
}  // namespace sparq
