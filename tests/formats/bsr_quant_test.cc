// Quantized BSR values (format.h BsrMatrix, QuantParts): groups are ranges of dense columns of a
// row, as CSR's, so BsrMatrix::Quantize of a matrix whose blocks hold no zeros must give the
// scales, mins and dequantized matrix of CsrMatrix::Quantize on the same weights bit for bit (CSR's
// rounding is checked in csr_quant tests); the block structure survives unchanged, padding holds
// code 0, and Validate names every malformed quantized part.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "sparq/format.h"
#include "sparq/quant.h"

namespace sparq {
namespace {

// rows x cols in blocks of bh x bw, about half the blocks kept, every kept value nonzero.
std::vector<float> BlockWeights(int64_t rows, int64_t cols, int bh, int bw, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist;
  std::vector<float> w(rows * cols, 0.0f);
  for (int64_t r0 = 0; r0 < rows; r0 += bh) {
    for (int64_t c0 = 0; c0 < cols; c0 += bw) {
      if (rng() % 2) continue;
      for (int64_t r = r0; r < std::min(rows, r0 + bh); ++r) {
        for (int64_t c = c0; c < std::min(cols, c0 + bw); ++c) {
          const float x = dist(rng);
          w[r * cols + c] = x != 0.0f ? x : 0.25f;
        }
      }
    }
  }
  return w;
}

const char* kSpecs[] = {"int8:g32", "int8:g128",    "int4:g32",
                        "int4:g64", "int4:g64:sym", "int4:g128:sym"};

bool SameBytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         (a.nbytes() == 0 || std::memcmp(a.data(), b.data(), a.nbytes()) == 0);
}

// 37 x 150 (edge blocks on both sides) in blocks of 4 x 16 and 3 x 5 (an odd width: int4's
// spare nibble; blocks straddling group boundaries).
TEST(BsrQuantize, GivesCsrQuantizesGroupsOnTheSameWeights) {
  const int64_t rows = 37, cols = 150;
  for (const auto& [bh, bw] : {std::pair{4, 16}, std::pair{3, 5}}) {
    const std::vector<float> w = BlockWeights(rows, cols, bh, bw, 7 + bw);
    const BsrMatrix src = *BsrMatrix::FromDense(w, rows, cols, bh, bw);
    const CsrMatrix csr = *CsrMatrix::FromDense(w, rows, cols);
    for (const char* text : kSpecs) {
      SCOPED_TRACE(std::to_string(bh) + "x" + std::to_string(bw) + " " + text);
      const ValueSpec spec = *ValueSpec::Parse(text);
      auto q = BsrMatrix::Quantize(src, spec, {}, "w");
      ASSERT_TRUE(q.ok()) << q.status().ToString();
      const CsrMatrix qc = *CsrMatrix::Quantize(csr, spec, {}, "w");
      ASSERT_TRUE(q->Validate("w").ok());
      const SparseMatrix sm(*q);
      EXPECT_TRUE(IsQuantized(sm));
      EXPECT_EQ(ValuesName(sm), spec.Name());
      EXPECT_EQ(q->quant_groups(spec), qc.quant_groups(spec));
      EXPECT_TRUE(SameBytes(q->quant.scales, qc.quant.scales));
      EXPECT_TRUE(SameBytes(q->quant.mins, qc.quant.mins));
      EXPECT_TRUE(SameBytes(q->row_ptr, src.row_ptr));
      EXPECT_TRUE(SameBytes(q->col_idx, src.col_idx));
      const Tensor d = q->ToDense();
      EXPECT_TRUE(SameBytes(d, qc.ToDense()));
      EXPECT_TRUE(SameBytes(ToDense(sm), d));
      const int64_t rb = spec.dtype == DType::kI8 ? bw : (bw + 1) / 2;
      EXPECT_EQ(q->values.shape(), (std::vector<int64_t>{src.nblocks(), bh, rb}));
      EXPECT_EQ(q->ByteSize(), src.row_ptr.nbytes() + src.col_idx.nbytes() + q->values.nbytes() +
                                   q->quant.scales.nbytes() + q->quant.mins.nbytes());
      // Dequantized values: the dense matrix's at real positions, 0 in the padding.
      const Tensor sv = q->StoredValuesF32();
      const BsrMatrix twin = [&] {
        BsrMatrix t = src;
        t.values = sv;
        return t;
      }();
      EXPECT_TRUE(twin.Validate("twin").ok());
      EXPECT_TRUE(SameBytes(twin.ToDense(), d));
      auto twice = BsrMatrix::Quantize(*q, spec, {}, "blk.0.w");
      ASSERT_FALSE(twice.ok());
      EXPECT_NE(twice.status().message().find("values are quantized already"), std::string::npos);
    }
  }
}

// GPTQ's groups are taken as given: values on those grids come back bit for bit.
TEST(BsrQuantize, GivenGroupsReproduceValuesOnTheirGridExactly) {
  const int64_t rows = 10, cols = 200;
  const BsrMatrix shape =
      *BsrMatrix::FromDense(BlockWeights(rows, cols, 2, 8, 3), rows, cols, 2, 8);
  const Tensor dense = shape.ToDense();
  for (const char* text : kSpecs) {
    SCOPED_TRACE(text);
    const ValueSpec spec = *ValueSpec::Parse(text);
    const int64_t qg = shape.quant_groups(spec);
    std::vector<QuantGroup> groups(rows * qg);
    for (int64_t i = 0; i < rows * qg; ++i) {
      const float s = 0.01f * float(1 + i % 7),
                  mn = spec.has_min() ? -0.05f * float(1 + i % 3) : 0.0f;
      groups[i] = QuantGroupFromF16(F32ToF16(s), F32ToF16(mn), spec);
    }
    // Every stored value moved onto its group's grid, through the dense matrix.
    std::vector<float> w(dense.data_as<float>(), dense.data_as<float>() + rows * cols);
    const int span = MaxCode(spec) - MinCode(spec) + 1;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        if (w[r * cols + c] == 0.0f) continue;
        const int code = MinCode(spec) + int((r * 31 + c * 17) % span);
        float x = Dequantize(code, groups[r * qg + c / spec.group], spec);
        w[r * cols + c] = x != 0.0f ? x
                                    : Dequantize(code == MaxCode(spec) ? code - 1 : code + 1,
                                                 groups[r * qg + c / spec.group], spec);
      }
    }
    const BsrMatrix on_grid = *BsrMatrix::FromDense(w, rows, cols, 2, 8);
    ASSERT_TRUE(SameBytes(on_grid.col_idx, shape.col_idx));
    auto q = BsrMatrix::Quantize(on_grid, spec, groups, "w");
    ASSERT_TRUE(q.ok()) << q.status().ToString();
    EXPECT_TRUE(SameBytes(q->ToDense(), on_grid.ToDense()));
    groups.pop_back();
    EXPECT_FALSE(BsrMatrix::Quantize(on_grid, spec, groups, "w").ok());
  }
}

::testing::AssertionResult FailsWith(const Status& st, const std::string& want) {
  if (st.ok()) return ::testing::AssertionFailure() << "Validate passed; expected: " << want;
  if (st.code() != StatusCode::kInvalidInput) return ::testing::AssertionFailure() << st.ToString();
  if (st.message().find(want) == std::string::npos) {
    return ::testing::AssertionFailure()
           << "message '" << st.message() << "' lacks '" << want << "'";
  }
  return ::testing::AssertionSuccess();
}

// 9 x 70 in blocks of 4 x 6: edge blocks of 1 row and 4 columns; 3 groups of 32 columns.
BsrMatrix Quantized(const char* spec) {
  const std::vector<float> w = BlockWeights(9, 70, 4, 6, 5);
  return *BsrMatrix::Quantize(*BsrMatrix::FromDense(w, 9, 70, 4, 6), *ValueSpec::Parse(spec));
}

TEST(BsrQuantValidate, NamesEveryMalformedPart) {
  for (const char* s : kSpecs) EXPECT_TRUE(Quantized(s).Validate("w").ok()) << s;
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), INFINITY, -0.5f}) {
    BsrMatrix q = Quantized("int4:g32");
    q.quant.scales.mutable_data_as<uint16_t>()[2 * 3 + 1] = F32ToF16(bad);
    EXPECT_TRUE(FailsWith(q.Validate("blk.1.w"), "blk.1.w.scales: row 2 group 1 has scale")) << bad;
  }
  {
    BsrMatrix q = Quantized("int4:g64");
    q.quant.mins.mutable_data_as<uint16_t>()[4 * 2 + 1] =
        F32ToF16(std::numeric_limits<float>::quiet_NaN());
    EXPECT_TRUE(FailsWith(q.Validate("w"), "w.mins: row 4 group 1 has a non-finite min"));
  }
  {
    BsrMatrix q = Quantized("int4:g32");
    q.quant.scales = Tensor::Alloc(DType::kF16, {9, 2});
    EXPECT_TRUE(FailsWith(q.Validate("w"), "w.scales"));
  }
  {
    BsrMatrix q = Quantized("int4:g64");
    q.quant.mins = Tensor();
    EXPECT_TRUE(FailsWith(q.Validate("w"), "w.mins"));
  }
  {
    BsrMatrix q = Quantized("int8:g32");  // codes i8 [nblocks, 4, 6]
    q.values = Tensor::Alloc(DType::kI8, {q.nblocks(), 4, 5});
    EXPECT_TRUE(FailsWith(q.Validate("w"), "w.values"));
  }
  {
    BsrMatrix q = Quantized("int4:g32");  // codes u8 [nblocks, 4, 3]
    q.values = Tensor::Alloc(DType::kU8, {q.nblocks(), 4, 6});
    EXPECT_TRUE(FailsWith(q.Validate("w"), "w.values"));
  }
  {
    BsrMatrix q = Quantized("int8:g32");
    q.values.mutable_data_as<int8_t>()[1 * 6 + 2] = -128;  // block 0, row 1, value 2
    EXPECT_TRUE(FailsWith(q.Validate("w"), "w.values: block 0 row 1 value 2 has code -128"));
  }
  {
    // The last block row holds one real row: row 1 of its blocks is padding.
    BsrMatrix q = Quantized("int8:g32");
    const int64_t last = q.nblocks() - 1;
    q.values.mutable_data_as<int8_t>()[(last * 4 + 1) * 6] = 3;
    EXPECT_TRUE(FailsWith(q.Validate("w"), "in its padding; padding codes must be 0"));
  }
  {
    BsrMatrix q = Quantized("int4:g32");
    q.quant.spec.group = 48;
    EXPECT_TRUE(FailsWith(q.Validate("w"), "unsupported spec"));
  }
}

}  // namespace
}  // namespace sparq
