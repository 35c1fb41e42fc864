// Quantized CSR values (format.h CsrMatrix + QuantParts): a group is spec.group dense columns of
// a row; Quantize keeps row_ptr / col_idx and rounds each stored value to nearest on its group's
// grid (fitted on the values stored in the group), ToDense gives the grid values back at the
// stored positions, FromDenseMasked stores a mask whatever its values, and Validate rejects every
// malformed quantized part by name.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
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

// 7 x 150: every group size leaves a short last group; row 2 is empty and row 4 has a group
// with nothing stored (columns 32..63), so groups of zero values are covered.
constexpr int64_t kRows = 7, kCols = 150;

std::vector<float> Weights(uint64_t seed) {
  std::vector<float> w = testing_formats::RandomMatrix(kRows, kCols, seed, 0.5);
  for (int64_t j = 0; j < kCols; ++j) w[2 * kCols + j] = 0.0f;
  for (int64_t j = 32; j < 64; ++j) w[4 * kCols + j] = 0.0f;
  return w;
}

CsrMatrix Source(uint64_t seed) { return *CsrMatrix::FromDense(Weights(seed), kRows, kCols); }

TEST(CsrQuantize, EachStoredValueGetsItsColumnGroupsRoundToNearestCode) {
  const std::vector<float> w = Weights(5);
  const CsrMatrix src = *CsrMatrix::FromDense(w, kRows, kCols);
  for (const char* text : kSpecs) {
    SCOPED_TRACE(text);
    const ValueSpec spec = *ValueSpec::Parse(text);
    auto q = CsrMatrix::Quantize(src, spec, {}, "w");
    ASSERT_TRUE(q.ok()) << q.status().ToString();
    ASSERT_TRUE(q->Validate("w").ok());
    EXPECT_TRUE(IsQuantized(SparseMatrix(*q)));
    EXPECT_EQ(ValuesName(SparseMatrix(*q)), spec.Name());
    // The mask is the source's, bit for bit.
    ASSERT_EQ(q->nnz(), src.nnz());
    EXPECT_EQ(std::memcmp(q->row_ptr.data(), src.row_ptr.data(), src.row_ptr.nbytes()), 0);
    EXPECT_EQ(std::memcmp(q->col_idx.data(), src.col_idx.data(), src.col_idx.nbytes()), 0);
    const int64_t qg = (kCols + spec.group - 1) / spec.group;
    ASSERT_EQ(q->quant_groups(spec), qg);
    const int64_t code_bytes = spec.dtype == DType::kI8 ? src.nnz() : (src.nnz() + 1) / 2;
    EXPECT_EQ(q->values.shape(), (std::vector<int64_t>{code_bytes}));
    EXPECT_EQ(q->ByteSize(), src.row_ptr.nbytes() + src.col_idx.nbytes() + uint64_t(code_bytes) +
                                 uint64_t(kRows * qg * 2 * (spec.has_min() ? 2 : 1)));
    const Tensor d = q->ToDense();
    for (int64_t r = 0; r < kRows; ++r) {
      for (int64_t g = 0; g < qg; ++g) {
        // Reference: QuantizeGroup (quant.cc) on the nonzeros of the group's columns alone.
        const int64_t j0 = g * spec.group, j1 = std::min<int64_t>(kCols, j0 + spec.group);
        std::vector<float> kept;
        std::vector<int64_t> at;
        for (int64_t j = j0; j < j1; ++j) {
          if (w[r * kCols + j] != 0.0f) {
            kept.push_back(w[r * kCols + j]);
            at.push_back(j);
          }
        }
        std::vector<int8_t> codes(kept.size());
        auto p = QuantizeGroup(kept.data(), int64_t(kept.size()), spec, codes.data());
        ASSERT_TRUE(p.ok());
        EXPECT_EQ(q->quant.scales.data_as<uint16_t>()[r * qg + g], p->scale_f16);
        if (spec.has_min()) {
          EXPECT_EQ(q->quant.mins.data_as<uint16_t>()[r * qg + g], p->min_f16);
        }
        if (kept.empty()) {
          EXPECT_EQ(p->scale_f16, 0);  // (row 2, row 4's columns 32..63)
        }
        std::vector<float> want(j1 - j0, 0.0f);
        for (size_t i = 0; i < kept.size(); ++i) want[at[i] - j0] = Dequantize(codes[i], *p, spec);
        for (int64_t j = j0; j < j1; ++j) {
          const float got = d.data_as<float>()[r * kCols + j];
          ASSERT_EQ(F32Bits(got), F32Bits(want[j - j0])) << "row " << r << " col " << j;
        }
      }
    }
  }
}

TEST(CsrQuantize, FittedGroupsAreTakenAsTheyAreAndReproduceGridValues) {
  const CsrMatrix src = Source(9);
  const ValueSpec spec = *ValueSpec::Parse("int4:g32");
  auto rtn = CsrMatrix::Quantize(src, spec);
  ASSERT_TRUE(rtn.ok());
  // Quantizing the dequantized values again with the same groups gives the same codes.
  const Tensor deq = rtn->ToDense();
  auto again = CsrMatrix::FromDenseMasked(
      std::span<const float>(deq.data_as<float>(), size_t(deq.numel())),
      [&] {
        const Tensor d = src.ToDense();
        std::vector<uint8_t> keep(size_t(d.numel()));
        for (size_t i = 0; i < keep.size(); ++i) keep[i] = d.data_as<float>()[i] != 0.0f;
        return keep;
      }(),
      kRows, kCols);
  ASSERT_TRUE(again.ok());
  const int64_t qg = rtn->quant_groups(spec);
  std::vector<QuantGroup> fitted(size_t(kRows * qg));
  for (int64_t i = 0; i < kRows * qg; ++i) {
    fitted[i] = QuantGroupFromF16(rtn->quant.scales.data_as<uint16_t>()[i],
                                  rtn->quant.mins.data_as<uint16_t>()[i], spec);
  }
  auto q = CsrMatrix::Quantize(*again, spec, fitted);
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  ASSERT_EQ(q->values.nbytes(), rtn->values.nbytes());
  EXPECT_EQ(std::memcmp(q->values.data(), rtn->values.data(), q->values.nbytes()), 0);
  EXPECT_EQ(std::memcmp(q->quant.scales.data(), rtn->quant.scales.data(), q->quant.scales.nbytes()), 0);
  // A wrong count of fitted groups is an error naming the tensor.
  auto bad = CsrMatrix::Quantize(src, spec, std::span<const QuantGroup>(fitted).first(3), "w");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("w: 3 fitted groups"));
}

TEST(CsrFromDenseMasked, StoresEveryKeptPositionZerosIncluded) {
  std::vector<float> w = {1, 0, 0, 2, 0, 0, 3, 0, -0.0f, 0, 0, 0};
  std::vector<uint8_t> keep = {1, 1, 0, 1, 0, 0, 0, 0, 1, 0, 0, 1};
  auto c = CsrMatrix::FromDenseMasked(w, keep, 3, 4);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(c->Validate("c").ok());
  EXPECT_EQ(c->nnz(), 5);  // the kept zeros at (0, 1), (2, 0) and (2, 3) too; 3 at (1, 2) is not kept
  const int64_t want_rp[] = {0, 3, 3, 5};
  const uint16_t want_ci[] = {0, 1, 3, 0, 3};
  EXPECT_EQ(std::memcmp(c->row_ptr.data(), want_rp, sizeof(want_rp)), 0);
  EXPECT_EQ(std::memcmp(c->col_idx.data(), want_ci, sizeof(want_ci)), 0);
  EXPECT_FALSE(CsrMatrix::FromDenseMasked(w, std::span<const uint8_t>(keep).first(5), 3, 4).ok());
}

TEST(CsrQuantize, RefusesWhatItCannotQuantize) {
  const CsrMatrix src = Source(3);
  auto f32 = CsrMatrix::Quantize(src, *ValueSpec::Parse("bf16"), {}, "w");
  ASSERT_FALSE(f32.ok());
  EXPECT_THAT(f32.status().message(), HasSubstr("w: 'bf16' is not a quantized spec"));
  auto q = *CsrMatrix::Quantize(src, *ValueSpec::Parse("int8:g32"));
  auto twice = CsrMatrix::Quantize(q, *ValueSpec::Parse("int8:g32"), {}, "w");
  ASSERT_FALSE(twice.ok());
  EXPECT_THAT(twice.status().message(), HasSubstr("quantized already"));
  std::vector<float> huge(kRows * kCols, 0.0f);
  huge[3] = 1e9f;
  auto h = CsrMatrix::Quantize(*CsrMatrix::FromDense(huge, kRows, kCols),
                               *ValueSpec::Parse("int8:g64"), {}, "w");
  ASSERT_FALSE(h.ok());
  EXPECT_THAT(h.status().message(), HasSubstr("w.values row 0 group 0"));
}

// ---- Validate: each malformed part by name ------------------------------------------------------

CsrMatrix Quantized(const char* spec) { return *CsrMatrix::Quantize(Source(7), *ValueSpec::Parse(spec)); }

std::string ErrorOf(const CsrMatrix& c) {
  Status st = c.Validate("w");
  EXPECT_FALSE(st.ok());
  return st.message();
}

TEST(CsrQuantValidate, RejectsEachMalformedPart) {
  CsrMatrix c = Quantized("int4:g32");
  c.quant.scales = c.quant.scales.Clone();
  c.quant.scales.mutable_data_as<uint16_t>()[6] = F32ToF16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_THAT(ErrorOf(c), HasSubstr("w.scales: row 1 group 1 has scale"));
  c = Quantized("int4:g32");
  c.quant.scales = c.quant.scales.Clone();
  c.quant.scales.mutable_data_as<uint16_t>()[0] = 0xBC00;  // -1
  EXPECT_THAT(ErrorOf(c), HasSubstr("w.scales: row 0 group 0 has scale -1"));
  c = Quantized("int4:g64");
  c.quant.mins = c.quant.mins.Clone();
  c.quant.mins.mutable_data_as<uint16_t>()[1] = 0x7C00;
  EXPECT_THAT(ErrorOf(c), HasSubstr("w.mins: row 0 group 1 has a non-finite min"));
  c = Quantized("int4:g64");
  c.quant.mins = Tensor();
  EXPECT_THAT(ErrorOf(c), HasSubstr("w.mins: expected f16[7, 3], got nothing"));
  c = Quantized("int4:g64:sym");
  c.quant.mins = Tensor::Alloc(DType::kF16, {kRows, 3});
  EXPECT_THAT(ErrorOf(c), HasSubstr("w.mins: present, but int4:g64:sym values have no min"));
  c = Quantized("int8:g32");
  c.quant.scales = Tensor::Alloc(DType::kF16, {kRows, 4});  // 150 columns: 5 groups of 32
  EXPECT_THAT(ErrorOf(c), HasSubstr("w.scales: expected f16[7, 5]"));
  c = Quantized("int8:g32");
  c.values = Tensor::Alloc(DType::kI8, {c.nnz() - 1});
  EXPECT_THAT(ErrorOf(c), HasSubstr("w.values: expected i8["));
  c = Quantized("int8:g32");
  c.values = Tensor::Alloc(DType::kU8, {c.nnz()});
  EXPECT_THAT(ErrorOf(c), HasSubstr("w.values: expected i8["));
  c = Quantized("int8:g32");
  c.values = c.values.Clone();
  c.values.mutable_data_as<int8_t>()[4] = -128;
  EXPECT_THAT(ErrorOf(c), HasSubstr("w.values: value 4 has code -128, outside int8:g32's -127..127"));
  c = Quantized("int4:g32:sym");
  c.values = c.values.Clone();
  c.values.mutable_data_as<uint8_t>()[0] &= 0xF0;  // code 0: not a symmetric int4 code here
  EXPECT_THAT(ErrorOf(c), HasSubstr("w.values: value 0 has code 0"));
  c = Quantized("int8:g32");
  c.quant.spec.group = 48;
  EXPECT_THAT(ErrorOf(c), HasSubstr("w: quantized values with an unsupported spec"));
  // The structure is still checked first, with its own messages.
  c = Quantized("int8:g32");
  c.row_ptr = c.row_ptr.Clone();
  c.row_ptr.mutable_data_as<int64_t>()[kRows] += 1;
  EXPECT_THAT(ErrorOf(c), HasSubstr("w.row_ptr[7]"));
}

TEST(CsrQuantValidate, UnusedHighNibbleMustBeZero) {
  // An odd number of stored values: the last byte's high nibble is unused.
  std::vector<float> w(3 * 40, 0.0f);
  w[0] = 1, w[41] = 2, w[119] = -3;
  auto c = *CsrMatrix::Quantize(*CsrMatrix::FromDense(w, 3, 40), *ValueSpec::Parse("int4:g32"));
  ASSERT_EQ(c.nnz(), 3);
  ASSERT_TRUE(c.Validate("w").ok());
  c.values = c.values.Clone();
  c.values.mutable_data_as<uint8_t>()[1] |= 0x10;
  EXPECT_THAT(ErrorOf(c), HasSubstr("w.values: bits in the unused high nibble of the last byte"));
}

}  // namespace
}  // namespace sparq
