// Validate(): one test per malformed kind, each expecting its specific message, which must name
// the tensor and the position.
#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <string>
#include <vector>

#include "sparq/format.h"

namespace sparq {
namespace {

::testing::AssertionResult FailsWith(const Status& st, const std::string& want) {
  if (st.ok()) return ::testing::AssertionFailure() << "Validate passed; expected: " << want;
  if (st.code() != StatusCode::kInvalidInput) {
    return ::testing::AssertionFailure() << "wrong code: " << st.ToString();
  }
  if (st.message().find(want) == std::string::npos) {
    return ::testing::AssertionFailure() << "message '" << st.message() << "' lacks '" << want
                                         << "'";
  }
  return ::testing::AssertionSuccess();
}

// 3 x 6: row 0 has columns 1, 4; row 1 is empty; row 2 has 0, 2, 5.
const std::vector<float> kW = {0, 1, 0, 0, 2, 0,  //
                               0, 0, 0, 0, 0, 0,  //
                               3, 0, 4, 0, 0, 5};

CsrMatrix Csr() { return *CsrMatrix::FromDense(kW, 3, 6); }
template <typename T>
T* Mut(Tensor& t) {
  return t.mutable_data_as<T>();
}

TEST(ValidateCsr, GoodMatrixPasses) { EXPECT_TRUE(Csr().Validate("w").ok()); }

TEST(ValidateCsr, NonMonotoneRowPtr) {
  CsrMatrix c = Csr();
  Mut<int64_t>(c.row_ptr)[1] = 3;  // row_ptr = 0, 3, 2, 5
  EXPECT_TRUE(FailsWith(c.Validate("blk.0.w"),
                        "blk.0.w.row_ptr[2] = 2 < row_ptr[1] = 3: row pointers must be "
                        "non-decreasing (row 1)"));
}

TEST(ValidateCsr, RowPtrMustStartAtZeroAndEndAtNnz) {
  CsrMatrix c = Csr();
  Mut<int64_t>(c.row_ptr)[0] = 1;
  EXPECT_TRUE(FailsWith(c.Validate("w"), "w.row_ptr[0] = 1, must be 0"));
  c = Csr();
  Mut<int64_t>(c.row_ptr)[3] = 4;
  EXPECT_TRUE(FailsWith(c.Validate("w"), "w.row_ptr[3] = 4, expected nnz = 5"));
}

TEST(ValidateCsr, ColumnOutOfRange) {
  CsrMatrix c = Csr();
  Mut<uint16_t>(c.col_idx)[4] = 6;
  EXPECT_TRUE(FailsWith(c.Validate("w"),
                        "w.col_idx[4] = 6 (row 2): column out of range, cols = 6"));
}

TEST(ValidateCsr, UnsortedColumns) {
  CsrMatrix c = Csr();
  Mut<uint16_t>(c.col_idx)[3] = 0;
  Mut<uint16_t>(c.col_idx)[2] = 2;  // row 2: 2, 0, 5
  EXPECT_TRUE(FailsWith(c.Validate("w"),
                        "w.col_idx[3] = 0 (row 2): column indices unsorted in the row "
                        "(previous 2)"));
}

TEST(ValidateCsr, DuplicateColumns) {
  CsrMatrix c = Csr();
  Mut<uint16_t>(c.col_idx)[1] = 1;  // row 0: 1, 1
  EXPECT_TRUE(FailsWith(c.Validate("w"), "w.col_idx[1] = 1 (row 0): duplicate column index"));
}

TEST(ValidateCsr, WrongLengthsAndDTypes) {
  CsrMatrix c = Csr();
  c.col_idx = Tensor::Alloc(DType::kU16, {4});
  EXPECT_TRUE(FailsWith(c.Validate("w"), "w.col_idx: expected u16|u32[5], got u16[4]"));
  c = Csr();
  c.values = Tensor::Alloc(DType::kI8, {5});
  EXPECT_TRUE(FailsWith(c.Validate("w"), "w.values: expected f32|bf16|f16[5], got i8[5]"));
  c = Csr();
  c.row_ptr = Tensor::Alloc(DType::kI32, {4});
  EXPECT_TRUE(FailsWith(c.Validate("w"), "w.row_ptr: expected i64[4], got i32[4]"));
  c = Csr();
  c.row_ptr = Tensor::Alloc(DType::kI64, {3});
  EXPECT_TRUE(FailsWith(c.Validate("w"), "w.row_ptr: expected i64[4], got i64[3]"));
  c = Csr();
  c.values = Tensor::Alloc(DType::kF32, {5, 1});
  EXPECT_TRUE(FailsWith(c.Validate("w"), "w.values: expected a 1-D tensor [nnz], got f32[5, 1]"));
  c = Csr();
  c.row_ptr = Tensor();
  EXPECT_TRUE(FailsWith(c.Validate("w"), "w.row_ptr: expected i64[4], got nothing"));
}

TEST(ValidateCsr, BadDims) {
  CsrMatrix c = Csr();
  c.rows = -1;
  EXPECT_TRUE(FailsWith(c.Validate("w"), "w: negative shape -1 x 6"));
  c = Csr();
  c.cols = int64_t{1} << 62;
  EXPECT_TRUE(FailsWith(c.Validate("w"), "overflow"));
}

TEST(ValidateCoo, Malformed) {
  CooMatrix good = *CooMatrix::FromDense(kW, 3, 6);
  EXPECT_TRUE(good.Validate("w").ok());
  CooMatrix c = good;
  c.row_idx = good.row_idx.Clone();
  Mut<uint32_t>(c.row_idx)[2] = 3;
  EXPECT_TRUE(FailsWith(c.Validate("w"), "w.row_idx[2] = 3: row out of range, rows = 3"));
  c.row_idx = good.row_idx.Clone();
  c.col_idx = good.col_idx.Clone();
  Mut<uint32_t>(c.col_idx)[0] = 9;
  EXPECT_TRUE(
      FailsWith(c.Validate("w"), "w.col_idx[0] = 9 (row 0): column out of range, cols = 6"));
  c.col_idx = good.col_idx.Clone();
  Mut<uint32_t>(c.col_idx)[1] = 1;  // (0,1), (0,1)
  EXPECT_TRUE(FailsWith(c.Validate("w"), "w: entry 1 (row 0, col 1): duplicate entry"));
  c.col_idx = good.col_idx.Clone();
  Mut<uint32_t>(c.col_idx)[1] = 0;  // (0,1), (0,0)
  EXPECT_TRUE(FailsWith(c.Validate("w"),
                        "w: entry 1 (row 0, col 0) comes after (row 0, col 1): entries must be "
                        "sorted by (row, col)"));
  c.col_idx = good.col_idx.Clone();
  c.values = Tensor::Alloc(DType::kF32, {4});
  EXPECT_TRUE(FailsWith(c.Validate("w"), "w.row_idx: expected u32[4], got u32[5]"));
}

BsrMatrix Bsr() {
  // 5 x 7 in 2x3 blocks: 3 block rows x 3 block columns, edge blocks partial.
  std::vector<float> w(35, 0.0f);
  w[0 * 7 + 0] = 1;  // block (0, 0)
  w[1 * 7 + 6] = 2;  // block (0, 2), edge column
  w[4 * 7 + 4] = 3;  // block (2, 1), edge row
  return *BsrMatrix::FromDense(w, 5, 7, 2, 3);
}

TEST(ValidateBsr, Malformed) {
  EXPECT_TRUE(Bsr().Validate("w").ok());
  BsrMatrix b = Bsr();
  Mut<int64_t>(b.row_ptr)[1] = 3;
  EXPECT_TRUE(FailsWith(b.Validate("w"),
                        "w.row_ptr[2] = 2 < row_ptr[1] = 3: row pointers must be non-decreasing "
                        "(block row 1)"));
  b = Bsr();
  Mut<uint16_t>(b.col_idx)[1] = 3;
  EXPECT_TRUE(FailsWith(b.Validate("w"),
                        "w.col_idx[1] = 3 (block row 0): block column out of range, block "
                        "columns = 3"));
  b = Bsr();
  Mut<uint16_t>(b.col_idx)[1] = 0;
  EXPECT_TRUE(FailsWith(b.Validate("w"), "w.col_idx[1] = 0 (block row 0): duplicate block column"));
  b = Bsr();
  Mut<uint16_t>(b.col_idx)[0] = 2;
  Mut<uint16_t>(b.col_idx)[1] = 1;
  EXPECT_TRUE(FailsWith(b.Validate("w"), "w.col_idx[1] = 1 (block row 0): block column indices "
                                         "unsorted"));
  b = Bsr();
  b.values = Tensor::Alloc(DType::kF32, {3, 3, 2});
  EXPECT_TRUE(FailsWith(b.Validate("w"), "w.values: expected f32|bf16|f16[3, 2, 3], got f32[3, 3, 2]"));
  b = Bsr();
  // Block 1 is block (0, 2): its column 1 (matrix column 7) is padding.
  Mut<float>(b.values)[1 * 6 + 0 * 3 + 1] = 5.0f;
  EXPECT_TRUE(FailsWith(b.Validate("w"),
                        "w.values: block 1 (block row 0, block column 2) holds a nonzero at (0, 1) "
                        "in its padding"));
  b = Bsr();
  // Block 2 is block (2, 1): its row 1 (matrix row 5) is padding.
  Mut<float>(b.values)[2 * 6 + 1 * 3 + 0] = -0.0f;
  EXPECT_TRUE(FailsWith(b.Validate("w"), "block 2 (block row 2, block column 1) holds a nonzero "
                                         "at (1, 0)"));
  b = Bsr();
  b.bh = 0;
  EXPECT_TRUE(FailsWith(b.Validate("w"), "w: block 0x3: each side must be in 1..4096"));
}

NmMatrix Nm24() {
  // 2 x 8, 2:4.
  const std::vector<float> w = {0, 1, 0, 2, 3, 0, 4, 0,  //
                                5, 6, 0, 0, 0, 0, 7, 8};
  return *NmMatrix::FromDense(w, 2, 8, 2, 4);
}

TEST(ValidateNm, IllegalIndex) {
  // m = 3 uses 2-bit indices, so index 3 is representable but illegal.
  const std::vector<float> w = {1, 0, 2};
  NmMatrix s = *NmMatrix::FromDense(w, 1, 3, 2, 3);
  EXPECT_TRUE(s.Validate("w").ok());
  Mut<uint8_t>(s.meta)[0] = 0x3 << 2;  // (0, 3)
  EXPECT_TRUE(FailsWith(s.Validate("w"),
                        "w.meta: row 0, group 0 (columns 0..2), index 1 = 3: illegal for m = 3"));
}

TEST(ValidateNm, NonAscendingAndDuplicateIndices) {
  NmMatrix s = Nm24();
  EXPECT_TRUE(s.Validate("w").ok());
  Mut<uint8_t>(s.meta)[1] = 0x81;  // row 1 group 0: (1, 0) not ascending
  EXPECT_TRUE(FailsWith(s.Validate("w"),
                        "w.meta: row 1, group 0 (columns 0..3), index 1 = 0: indices not "
                        "ascending (previous 1)"));
  s = Nm24();
  Mut<uint8_t>(s.meta)[0] = 0xAD;  // row 0 group 1: (2, 2)
  EXPECT_TRUE(FailsWith(s.Validate("w"),
                        "w.meta: row 0, group 1 (columns 4..7), index 1 = 2: duplicate index"));
}

TEST(ValidateNm, IndexIntoPaddedTail) {
  // 2:4 over 7 columns: the tail (3 columns) never needs the padding.
  const std::vector<float> w = {1, 0, 0, 2, 0, 3, 0};
  NmMatrix s = *NmMatrix::FromDense(w, 1, 7, 2, 4);
  EXPECT_TRUE(s.Validate("w").ok());
  Mut<uint8_t>(s.meta)[0] = static_cast<uint8_t>((s.meta.data_as<uint8_t>()[0] & 0x0F) |
                                                 ((1 | 3 << 2) << 4));  // tail (1, 3)
  EXPECT_TRUE(FailsWith(s.Validate("w"),
                        "w.meta: row 0, group 1 (columns 4..6), index 1 = 3: points into the "
                        "padded tail beyond cols = 7"));
  // 2:4 over 5 columns: the tail pads one slot, which must hold zero.
  const std::vector<float> w5 = {1, 2, 0, 0, 3};
  NmMatrix t = *NmMatrix::FromDense(w5, 1, 5, 2, 4);
  EXPECT_TRUE(t.Validate("w").ok());
  Mut<float>(t.values)[3] = 1.0f;
  EXPECT_TRUE(FailsWith(t.Validate("w"), "index 1 = 1: points into the padded tail beyond cols "
                                         "= 5 with a nonzero value"));
}

// Validate reads whole bytes of the meta stream through a table where groups fill them (n * bits
// = 1, 2, 4, 8 bits): against the rule written out here, index by index, every byte of a few
// patterns' streams set to every value must pass or fail alike, and a failure name the first bad
// group. Quantized codes too (their padding slots stand for nothing, so only indices decide).
TEST(ValidateNm, EveryMetaByteAgreesWithTheRuleIndexByIndex) {
  struct Case {
    int n, m;
    int64_t cols;
  };
  // 1:2 (1 bit, 8 groups a byte), 1:4 (2 bits, 4), 2:4 (2 groups), 1:16 (4 bits, 2), 4:8 (3 bits:
  // no table), with tails of every kind (none, fewer than n real columns, n or more).
  const Case cases[] = {{1, 2, 19}, {1, 4, 37}, {2, 4, 40}, {2, 4, 37}, {2, 4, 38},
                        {1, 16, 70}, {4, 8, 45}, {2, 4, 5}};
  for (const Case& c : cases) {
    for (const bool quantized : {false, true}) {
      const int64_t rows = 3;
      // n of every m columns nonzero, at positions that move with the group and the row.
      std::vector<float> w(size_t(rows * c.cols), 0.0f);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c0 = 0; c0 < c.cols; c0 += c.m) {
          for (int j = 0; j < c.n; ++j) {
            const int64_t col = c0 + (c0 / c.m + r + j * (c.m / c.n)) % c.m;
            if (col < c.cols) w[size_t(r * c.cols + col)] = float(1 + (col + r) % 5);
          }
        }
      }
      auto made = NmMatrix::FromDense(w, rows, c.cols, c.n, c.m);
      ASSERT_TRUE(made.ok()) << made.status().ToString();
      NmMatrix base = *made;
      if (quantized) base = *NmMatrix::Quantize(base, *ValueSpec::Parse("int4:g32"));
      ASSERT_TRUE(base.Validate("w").ok());
      const int bits = std::bit_width(unsigned(c.m - 1));
      const int64_t groups = (c.cols + c.m - 1) / c.m;
      const int64_t row_bytes = base.meta.numel() / rows;
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t b = 0; b < row_bytes; ++b) {
          for (int v = 0; v < 256; ++v) {
            NmMatrix s = base;
            s.meta = Tensor::Alloc(DType::kU8, {rows, row_bytes});
            std::memcpy(Mut<uint8_t>(s.meta), base.meta.data(), base.meta.nbytes());
            uint8_t* row = Mut<uint8_t>(s.meta) + r * row_bytes;
            row[b] = uint8_t(v);
            // The rule: indices < m, strictly ascending in a group; one past cols only in a tail
            // of fewer than n real columns, over a stored 0 (float values; codes: any).
            int64_t bad_group = -1;
            for (int64_t g = 0; g < groups && bad_group < 0; ++g) {
              const int64_t real = std::min<int64_t>(c.m, c.cols - g * c.m);
              int prev = -1;
              for (int j = 0; j < c.n; ++j) {
                int idx = 0;
                for (int k = 0; k < bits; ++k) {
                  const int64_t bit = (g * c.n + j) * bits + k;
                  idx |= ((row[bit / 8] >> (bit % 8)) & 1) << k;
                }
                const bool pad_ok = idx < real || (real < c.n && (quantized ||
                    s.values.data_as<float>()[r * groups * c.n + g * c.n + j] == 0.0f));
                if (idx >= c.m || idx <= prev || !pad_ok) bad_group = g;
                prev = idx;
              }
            }
            const Status st = s.Validate("w");
            ASSERT_EQ(st.ok(), bad_group < 0)
                << c.n << ":" << c.m << " cols " << c.cols << (quantized ? " int4" : "") << " row "
                << r << " byte " << b << " = " << v << ": " << st.ToString();
            if (bad_group >= 0) {
              const std::string want = "w.meta: row " + std::to_string(r) + ", group " +
                                       std::to_string(bad_group) + " ";
              EXPECT_TRUE(FailsWith(st, want)) << c.n << ":" << c.m << " byte " << b << " = " << v;
            }
          }
        }
      }
    }
  }
}

TEST(ValidateNm, WrongBufferLengthsAndParams) {
  NmMatrix s = Nm24();
  s.meta = Tensor::Alloc(DType::kU8, {2, 2});
  EXPECT_TRUE(FailsWith(s.Validate("w"), "w.meta: expected u8[2, 1], got u8[2, 2]"));
  s = Nm24();
  s.values = Tensor::Alloc(DType::kBF16, {2, 3});
  EXPECT_TRUE(FailsWith(s.Validate("w"), "w.values: expected f32|bf16|f16[2, 4], got bf16[2, 3]"));
  s = Nm24();
  s.n = 4;
  EXPECT_TRUE(FailsWith(s.Validate("w"), "w: N:M = 4:4 is outside 1 <= N < M <= 16"));
}

TEST(ValidateVnm, Malformed) {
  const std::vector<float> w = {1, 0, 2, 0, 0, 3, 0, 4,  //
                                5, 0, 6, 0, 0, 0, 0, 7,  //
                                0, 8, 0, 0, 9, 0, 0, 0};
  VnmMatrix s = *VnmMatrix::FromDense(w, 3, 8, 2, 2, 4);
  EXPECT_TRUE(s.Validate("w").ok());
  VnmMatrix t = s;
  t.meta = s.meta.Clone();
  Mut<uint8_t>(t.meta)[1] = 0x41;  // slab 1 group 0: (1, 0)
  EXPECT_TRUE(FailsWith(t.Validate("w"),
                        "w.meta: slab 1 (rows 2..2), group 0 (columns 0..3), index 1 = 0: "
                        "indices not ascending"));
  t.meta = Tensor::Alloc(DType::kU8, {3, 1});
  EXPECT_TRUE(FailsWith(t.Validate("w"), "w.meta: expected u8[2, 1], got u8[3, 1]"));
  t = s;
  t.v = 0;
  EXPECT_TRUE(FailsWith(t.Validate("w"), "w: V = 0 is outside 1..64"));
}

TEST(ValidateDense, WrongShape) {
  DenseMatrix d = *DenseMatrix::FromDense(kW, 3, 6, DType::kF16);
  EXPECT_TRUE(d.Validate("w").ok());
  d.cols = 5;
  EXPECT_TRUE(FailsWith(d.Validate("w"), "w.values: expected f32|bf16|f16[3, 5], got f16[3, 6]"));
}

TEST(ValidateVariant, DispatchesToTheFormat) {
  SparseMatrix s = Csr();
  EXPECT_TRUE(Validate(s, "w").ok());
  std::get<CsrMatrix>(s).rows = 4;
  EXPECT_TRUE(FailsWith(Validate(s, "x"), "x.row_ptr: expected i64[5]"));
}

}  // namespace
}  // namespace sparq
