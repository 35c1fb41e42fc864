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

}  // namespace
}  // namespace sparq
