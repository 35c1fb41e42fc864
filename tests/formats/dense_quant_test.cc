// Quantized dense values (format.h DenseMatrix + QuantParts): Quantize rounds each value to
// nearest on its group's grid (groups of spec.group columns, the last one short), ToDense gives
// the grid values back, and Validate rejects every malformed quantized part by name.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "sparq/format.h"
#include "sparq/quant.h"
#include "tests/formats/formats_testutil.h"

namespace sparq {
namespace {

using ::testing::HasSubstr;

const char* kSpecs[] = {"int8:g32", "int8:g128",    "int4:g32",
                        "int4:g64", "int4:g64:sym", "int4:g128:sym"};

// 37 columns: every group size leaves a short last group, and int4 rows end in half a byte.
constexpr int64_t kRows = 5, kCols = 37;

DenseMatrix Source(uint64_t seed) {
  const std::vector<float> w = testing_formats::RandomMatrix(kRows, kCols, seed, 0.2);
  return *DenseMatrix::FromDense(w, kRows, kCols);
}

TEST(DenseQuantize, EachValueGetsItsGroupsRoundToNearestCode) {
  const DenseMatrix src = Source(5);
  const float* w = src.values.data_as<float>();
  for (const char* text : kSpecs) {
    SCOPED_TRACE(text);
    const ValueSpec spec = *ValueSpec::Parse(text);
    auto q = DenseMatrix::Quantize(src, spec, {}, "w");
    ASSERT_TRUE(q.ok()) << q.status().ToString();
    ASSERT_TRUE(q->Validate("w").ok());
    EXPECT_EQ(q->quant.spec.Name(), spec.Name());
    const int64_t qg = (kCols + spec.group - 1) / spec.group;
    ASSERT_EQ(q->quant_groups(spec), qg);
    const int64_t code_bytes = spec.dtype == DType::kI8 ? kCols : (kCols + 1) / 2;
    EXPECT_EQ(q->values.shape(), (std::vector<int64_t>{kRows, code_bytes}));
    EXPECT_EQ(q->ByteSize(),
              uint64_t(kRows * code_bytes + kRows * qg * 2 * (spec.has_min() ? 2 : 1)));
    const Tensor d = q->ToDense();
    const Tensor sv = q->StoredValuesF32();
    for (int64_t r = 0; r < kRows; ++r) {
      for (int64_t g = 0; g < qg; ++g) {
        // Reference: QuantizeGroup on the group's values alone (quant.cc), dequantized here.
        const int64_t j0 = g * spec.group, cnt = std::min<int64_t>(spec.group, kCols - j0);
        std::vector<int8_t> codes(cnt);
        auto p = QuantizeGroup(w + r * kCols + j0, cnt, spec, codes.data());
        ASSERT_TRUE(p.ok());
        EXPECT_EQ(q->quant.scales.data_as<uint16_t>()[r * qg + g], p->scale_f16);
        for (int64_t i = 0; i < cnt; ++i) {
          const float want = Dequantize(codes[i], *p, spec);
          const float got = d.data_as<float>()[r * kCols + j0 + i];
          EXPECT_EQ(F32Bits(got), F32Bits(want)) << r << "," << j0 + i;
          EXPECT_EQ(F32Bits(sv.data_as<float>()[r * kCols + j0 + i]), F32Bits(want));
          // What round to nearest promises: within half a step.
          EXPECT_LE(std::fabs(got - w[r * kCols + j0 + i]), p->scale / 2 * (1 + 1e-6f));
        }
      }
    }
  }
}

TEST(DenseQuantize, FittedGroupsAreTakenAsTheyAre) {
  const DenseMatrix src = Source(9);
  const ValueSpec spec = *ValueSpec::Parse("int4:g32");
  std::vector<QuantGroup> fitted(kRows * 2);
  for (size_t i = 0; i < fitted.size(); ++i) {
    fitted[i].scale_f16 = F32ToF16(0.25f * (1 + i % 3));
    fitted[i].min_f16 = F32ToF16(-1.0f);
  }
  auto q = DenseMatrix::Quantize(src, spec, fitted, "w");
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  for (size_t i = 0; i < fitted.size(); ++i) {
    EXPECT_EQ(q->quant.scales.data_as<uint16_t>()[i], fitted[i].scale_f16);
    EXPECT_EQ(q->quant.mins.data_as<uint16_t>()[i], fitted[i].min_f16);
  }
  EXPECT_THAT(DenseMatrix::Quantize(src, spec, std::span(fitted).first(3), "w").status().message(),
              HasSubstr("w: 3 fitted groups, want 10"));
  EXPECT_THAT(DenseMatrix::Quantize(*q, spec, {}, "w").status().message(),
              HasSubstr("quantized already"));
  EXPECT_FALSE(DenseMatrix::Quantize(src, *ValueSpec::Parse("bf16"), {}, "w").ok());
}

TEST(DenseQuantize, SparseMatrixAccessorsSeeTheSpec) {
  const SparseMatrix s = *DenseMatrix::Quantize(Source(1), *ValueSpec::Parse("int8:g32"));
  EXPECT_TRUE(IsQuantized(s));
  EXPECT_EQ(ValuesName(s), "int8:g32");
  EXPECT_EQ(ValueDType(s), DType::kI8);
  EXPECT_TRUE(Validate(s, "w").ok());
  EXPECT_FALSE(IsQuantized(SparseMatrix(Source(1))));
}

// Hand-set codes and scales: negative scales and symmetric code 0 are legal for dense (GGUF
// Q4_0 stores both) and mean exactly Dequantize's expression.
TEST(DenseQuantValidate, NegativeScaleAndSymmetricCodeZeroDequantize) {
  DenseMatrix d = *DenseMatrix::Quantize(Source(2), *ValueSpec::Parse("int4:g32:sym"));
  d.values = d.values.Clone();
  d.quant.scales = d.quant.scales.Clone();
  d.values.mutable_data_as<uint8_t>()[0] = 0x80;           // codes 0 (column 0) and 8 (column 1)
  d.quant.scales.mutable_data_as<uint16_t>()[0] = 0xc000;  // -2
  ASSERT_TRUE(d.Validate("w").ok()) << d.Validate("w").ToString();
  const Tensor x = d.ToDense();
  EXPECT_EQ(x.data_as<float>()[0], 16.0f);                    // (0 - 8) * -2
  EXPECT_EQ(F32Bits(x.data_as<float>()[1]), F32Bits(-0.0f));  // (8 - 8) * -2
}

TEST(DenseQuantValidate, RejectsEachMalformedPart) {
  auto fresh = [](const char* spec) {
    DenseMatrix d = *DenseMatrix::Quantize(Source(3), *ValueSpec::Parse(spec));
    d.values = d.values.Clone();
    d.quant.scales = d.quant.scales.Clone();
    if (d.quant.mins.numel()) d.quant.mins = d.quant.mins.Clone();
    return d;
  };
  auto err = [](const DenseMatrix& d) { return d.Validate("w").message(); };
  DenseMatrix d = fresh("int4:g32");
  d.quant.scales.mutable_data_as<uint16_t>()[3] = F32ToF16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_THAT(err(d), HasSubstr("w.scales: row 1 group 1 has scale"));
  d = fresh("int4:g32");
  d.quant.scales.mutable_data_as<uint16_t>()[0] = 0x7c00;  // +inf
  EXPECT_THAT(err(d), HasSubstr("w.scales: row 0 group 0"));
  d = fresh("int4:g32");
  d.quant.mins.mutable_data_as<uint16_t>()[2] = 0xfc00;  // -inf
  EXPECT_THAT(err(d), HasSubstr("w.mins: row 1 group 0 has a non-finite min"));
  d = fresh("int4:g32");
  d.quant.mins = Tensor();
  EXPECT_THAT(err(d), HasSubstr("w.mins"));
  d = fresh("int4:g32:sym");
  d.quant.mins = d.quant.scales;
  EXPECT_THAT(err(d), HasSubstr("w.mins: present, but int4:g32:sym values have no min"));
  d = fresh("int8:g32");
  d.values = Tensor::Alloc(DType::kI8, {kRows, kCols - 1});  // short rows of codes
  EXPECT_THAT(err(d), HasSubstr("w.values"));
  d = fresh("int8:g32");
  d.values = Tensor::Alloc(DType::kU8, {kRows, kCols});
  EXPECT_THAT(err(d), HasSubstr("w.values"));
  d = fresh("int8:g32");
  d.quant.spec.group = 64;  // scales sized for g32: 2 per row, g64 wants 1
  EXPECT_THAT(err(d), HasSubstr("w.scales"));
  d = fresh("int8:g32");
  d.quant.spec.group = 48;
  EXPECT_THAT(err(d), HasSubstr("unsupported spec"));
  d = fresh("int8:g32");
  d.values.mutable_data_as<int8_t>()[kCols + 4] = -128;
  EXPECT_THAT(err(d),
              HasSubstr("w.values: row 1 column 4 has code -128, outside int8:g32's -127..127"));
  d = fresh("int4:g32");
  d.values.mutable_data_as<uint8_t>()[(kCols + 1) / 2 - 1] |= 0x30;
  EXPECT_THAT(err(d), HasSubstr("w.values: row 0 has bits in the unused high nibble"));
  d = *DenseMatrix::FromDense(std::vector<float>(4, 1.0f), 2, 2);
  d.quant.scales = Tensor::Alloc(DType::kF16, {2, 1});
  EXPECT_THAT(err(d), HasSubstr("scales or mins present, but the values are not quantized"));
}

}  // namespace
}  // namespace sparq
