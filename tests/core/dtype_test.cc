// f16 / bf16 conversions, exhaustively over all 65,536 bit patterns of each 16-bit type, against
// an independent reference: the compiler's own _Float16 conversions (IEEE round-to-nearest-even;
// where the compiler has no _Float16 on x86, as clang 14, the CPU's F16C instructions) and, for
// bf16, exact arithmetic on the f32 value in double.
#include <gtest/gtest.h>
#if !defined(__FLT16_MAX__) && defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include <cmath>
#include <cstring>
#include <random>

#include "sparq/dtype.h"

namespace sparq {
namespace {

bool IsNanF32(float f) { return std::isnan(f); }

#if defined(__FLT16_MAX__)
constexpr bool kHaveRef = true;
float RefF16ToF32(uint16_t hb) {
  _Float16 hf;
  std::memcpy(&hf, &hb, 2);
  return static_cast<float>(hf);
}
uint16_t RefF32ToF16(float f) {
  const _Float16 ref = static_cast<_Float16>(f);
  uint16_t rb;
  std::memcpy(&rb, &ref, 2);
  return rb;
}
#elif defined(__x86_64__)
// CPUID leaf 1, ECX bit 29 (clang 14's __builtin_cpu_supports does not know "f16c").
const bool kHaveRef = [] {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & (1u << 29)) != 0;
}();
__attribute__((target("f16c"))) float RefF16ToF32(uint16_t hb) { return _cvtsh_ss(hb); }
__attribute__((target("f16c"))) uint16_t RefF32ToF16(float f) {
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}
#else
constexpr bool kHaveRef = false;
float RefF16ToF32(uint16_t) { return 0.0f; }
uint16_t RefF32ToF16(float) { return 0; }
#endif

TEST(DType, F16ToF32ExhaustiveMatchesCompiler) {
  ASSERT_TRUE(kHaveRef) << "no independent f16 reference: this compiler has no _Float16 and the "
                           "CPU no F16C (GCC >= 12 on x86-64 has _Float16)";
  for (uint32_t h = 0; h < 65536; ++h) {
    uint16_t hb = static_cast<uint16_t>(h);
    const float ref = RefF16ToF32(hb);
    const float got = F16ToF32(hb);
    if (IsNanF32(ref)) {
      ASSERT_TRUE(IsNanF32(got)) << h;
      // Sign and payload top bits kept.
      ASSERT_EQ(F32Bits(got) >> 31, h >> 15) << h;
    } else {
      ASSERT_EQ(F32Bits(got), F32Bits(ref)) << "f16 bits " << h;
    }
    // Round trip f16 -> f32 -> f16 is the identity (NaN: stays NaN with the same sign).
    const uint16_t back = F32ToF16(got);
    if (IsNanF32(ref)) {
      ASSERT_TRUE((back & 0x7c00) == 0x7c00 && (back & 0x3ff) != 0) << h;
    } else {
      ASSERT_EQ(back, hb) << h;
    }
  }
}

TEST(DType, F32ToF16RoundsNearestEvenLikeCompiler) {
  // Every f16 value, plus midpoints and neighbours of midpoints between consecutive f16 values,
  // plus random f32 values: the classic places where rounding goes wrong.
  ASSERT_TRUE(kHaveRef) << "no independent f16 reference: this compiler has no _Float16 and the "
                           "CPU no F16C (GCC >= 12 on x86-64 has _Float16)";
  auto check = [](float f) {
    const uint16_t rb = RefF32ToF16(f);
    const uint16_t got = F32ToF16(f);
    if (std::isnan(f)) {
      ASSERT_TRUE((got & 0x7c00) == 0x7c00 && (got & 0x3ff) != 0);
    } else {
      ASSERT_EQ(got, rb) << "f32 bits " << F32Bits(f);
    }
  };
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    const float a = F16ToF32(static_cast<uint16_t>(h));
    const float b = F16ToF32(static_cast<uint16_t>(h + 1));
    const double mid = (static_cast<double>(a) + b) / 2;
    const float midf = static_cast<float>(mid);  // exact: f16 midpoints are representable in f32
    for (float f : {a, midf, std::nextafter(midf, 0.f), std::nextafter(midf, 1e30f)}) {
      check(f);
      check(-f);
    }
  }
  std::mt19937 rng(12345);
  for (int i = 0; i < 1000000; ++i) {
    check(F32FromBits(static_cast<uint32_t>(rng())));
  }
  check(INFINITY);
  check(-INFINITY);
  check(NAN);
  check(65520.f);  // rounds to Inf
  check(65519.f);  // rounds to 65504
}

TEST(DType, BF16ExhaustiveRoundTripAndRounding) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t hb = static_cast<uint16_t>(h);
    const float f = BF16ToF32(hb);
    ASSERT_EQ(F32Bits(f), h << 16);
    const uint16_t back = F32ToBF16(f);
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(BF16ToF32(back))) << h;
      ASSERT_EQ(back >> 15, h >> 15);
    } else {
      ASSERT_EQ(back, hb) << h;
    }
    // Rounding: compare against exact nearest-even in double for points around each value.
    if (!std::isfinite(f) || (h & 0x7fff) >= 0x7f7f) continue;
    const float next = BF16ToF32(static_cast<uint16_t>(h + 1));
    const double mid = (static_cast<double>(f) + next) / 2;
    const float midf = static_cast<float>(mid);
    ASSERT_EQ(static_cast<double>(midf), mid);
    const uint16_t even = (hb & 1) ? static_cast<uint16_t>(h + 1) : hb;
    ASSERT_EQ(F32ToBF16(midf), even) << h;
    ASSERT_EQ(F32ToBF16(std::nextafter(midf, f)), hb) << h;
    ASSERT_EQ(F32ToBF16(std::nextafter(midf, next)), static_cast<uint16_t>(h + 1)) << h;
  }
  EXPECT_EQ(F32ToBF16(INFINITY), 0x7f80);
  EXPECT_TRUE(std::isnan(BF16ToF32(F32ToBF16(NAN))));
  // A NaN whose payload lives only in the low 16 bits must not become Inf.
  EXPECT_TRUE(std::isnan(BF16ToF32(F32ToBF16(F32FromBits(0x7f800001u)))));
}

TEST(DType, NamesRoundTrip) {
  for (auto t : {DType::kF32, DType::kF16, DType::kBF16, DType::kI8, DType::kI4, DType::kU4,
                 DType::kU16, DType::kU32, DType::kI64}) {
    auto p = ParseDType(DTypeName(t));
    ASSERT_TRUE(p.has_value());
    EXPECT_EQ(*p, t);
  }
  EXPECT_EQ(DTypeBytes(DType::kI4, 3), 2u);
  EXPECT_FALSE(ParseDType("f8").has_value());
}

}  // namespace
}  // namespace sparq
