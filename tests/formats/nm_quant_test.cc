// Quantized N:M values (format.h QuantParts): NmMatrix::Quantize keeps the mask bit for bit and
// rounds each kept value to nearest on its group's grid, given groups are taken as they are, and
// Validate rejects every malformed quantized part with a message naming the part and position.
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

// rows x cols with exactly two nonzeros in each group of four columns (the short tail group of
// cols % 4 columns keeps min(2, len)), at seed-dependent positions and magnitudes.
std::vector<float> TwoFour(int64_t rows, int64_t cols, uint64_t seed) {
  std::vector<float> r = testing_formats::RandomMatrix(rows, cols, seed, 0.0);
  std::vector<float> w(r.size(), 0.0f);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t g = 0; g < cols; g += 4) {
      const int64_t len = std::min<int64_t>(4, cols - g);
      const int64_t a = (i * 7 + g / 4 * 3 + int64_t(seed)) % len;
      const int64_t b = (a + 1 + (i + g / 4) % std::max<int64_t>(1, len - 1)) % len;
      w[i * cols + g + a] = r[i * cols + g + a];
      w[i * cols + g + b] = r[i * cols + g + b];
    }
  }
  return w;
}

const char* kSpecs[] = {"int8:g32", "int8:g128", "int4:g32", "int4:g64", "int4:g64:sym",
                        "int4:g128:sym"};

// The f16 parameters of group g of row r of a quantized matrix.
QuantGroup GroupOf(const NmMatrix& q, int64_t r, int64_t g) {
  const int64_t qg = q.quant_groups(q.quant.spec);
  const uint16_t s = q.quant.scales.data_as<uint16_t>()[r * qg + g];
  const uint16_t mn = q.quant.spec.has_min() ? q.quant.mins.data_as<uint16_t>()[r * qg + g] : 0;
  return QuantGroupFromF16(s, mn, q.quant.spec);
}

// 70 columns: 18 groups of 4 (the last one 2 wide), 36 stored values per row, so every group
// size leaves a short last quantization group (36 = 32 + 4; 64 and 128 are one short group).
TEST(NmQuantize, KeepsTheMaskAndRoundsEachKeptValueToNearestOnItsGrid) {
  const int64_t rows = 5, cols = 70;
  const std::vector<float> w = TwoFour(rows, cols, 3);
  const NmMatrix src = *NmMatrix::FromDense(w, rows, cols, 2, 4);
  const Tensor sv = src.StoredValuesF32();
  const int64_t per_row = sv.shape()[1];
  ASSERT_EQ(per_row, 36);
  for (const char* text : kSpecs) {
    SCOPED_TRACE(text);
    const ValueSpec spec = *ValueSpec::Parse(text);
    auto q = NmMatrix::Quantize(src, spec, {}, "w");
    ASSERT_TRUE(q.ok()) << q.status().ToString();
    ASSERT_TRUE(q->Validate("w").ok());
    EXPECT_TRUE(IsQuantized(SparseMatrix(*q)));
    EXPECT_EQ(ValuesName(SparseMatrix(*q)), spec.Name());
    ASSERT_EQ(q->meta.nbytes(), src.meta.nbytes());
    EXPECT_EQ(std::memcmp(q->meta.data(), src.meta.data(), src.meta.nbytes()), 0);
    const int64_t qg = (per_row + spec.group - 1) / spec.group;
    EXPECT_EQ(q->quant_groups(spec), qg);
    EXPECT_EQ(q->quant.scales.shape(), (std::vector<int64_t>{rows, qg}));
    // Bytes: codes, f16 scales (and mins), meta.
    const uint64_t code_bytes = spec.dtype == DType::kI8 ? rows * per_row : rows * ((per_row + 1) / 2);
    EXPECT_EQ(q->ByteSize(), code_bytes + uint64_t(rows * qg) * (spec.has_min() ? 4 : 2) +
                                 src.meta.nbytes());

    const Tensor qv = q->StoredValuesF32();
    const Tensor dense = q->ToDense();
    const float* d = dense.data_as<float>();
    for (int64_t i = 0; i < rows * cols; ++i) {
      if (w[i] == 0.0f) {
        EXPECT_EQ(d[i], 0.0f) << "pruned position " << i << " became nonzero";
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t g = 0; g < qg; ++g) {
        const QuantGroup p = GroupOf(*q, r, g);
        const int64_t j0 = g * spec.group, j1 = std::min<int64_t>(per_row, j0 + spec.group);
        float lo = INFINITY, hi = -INFINITY;
        for (int64_t j = j0; j < j1; ++j) {
          lo = std::min(lo, sv.data_as<float>()[r * per_row + j]);
          hi = std::max(hi, sv.data_as<float>()[r * per_row + j]);
        }
        for (int64_t j = j0; j < j1; ++j) {
          const float x = sv.data_as<float>()[r * per_row + j];
          const float y = qv.data_as<float>()[r * per_row + j];
          // Nearest: no allowed code of this grid is closer (ties either way).
          for (int c = MinCode(spec); c <= MaxCode(spec); ++c) {
            EXPECT_LE(std::fabs(y - x), std::fabs(Dequantize(c, p, spec) - x) * (1 + 1e-6f) + 1e-30f)
                << "row " << r << " value " << j << ": code " << c << " is nearer";
          }
          // And the grid covers the group: within half a step (the f16 rounding of the scale
          // leaves a step at most 0.1% wider; one ulp of slack for the f32 evaluation).
          EXPECT_LE(std::fabs(y - x), 0.5f * p.scale * 1.002f + 4e-7f * std::fabs(x))
              << "row " << r << " value " << j << " in [" << lo << ", " << hi << "]";
        }
      }
    }
    // The dense form puts each stored value at its column: the f32 twin of the codes.
    NmMatrix twin = src;
    twin.values = qv;
    const Tensor twin_dense = twin.ToDense();
    EXPECT_TRUE(testing_formats::BitEqual(
        dense, std::vector<float>(twin_dense.data_as<float>(), twin_dense.data_as<float>() + rows * cols),
        rows, cols));
  }
}

// Values that already lie on given grids come back bit for bit when Quantize is handed those
// grids: what joint SparseGPT + GPTQ relies on (its swept weights are grid values).
TEST(NmQuantize, GivenGroupsReproduceValuesOnTheirGridExactly) {
  const int64_t rows = 4, cols = 200;
  const std::vector<float> w = TwoFour(rows, cols, 11);
  const NmMatrix shape = *NmMatrix::FromDense(w, rows, cols, 2, 4);
  for (const char* text : kSpecs) {
    SCOPED_TRACE(text);
    const ValueSpec spec = *ValueSpec::Parse(text);
    const int64_t per_row = shape.groups() * 2, qg = shape.quant_groups(spec);
    std::vector<QuantGroup> groups(rows * qg);
    for (int64_t i = 0; i < rows * qg; ++i) {
      // Scales and mins unlike round to nearest's: the grid is the caller's, not refitted.
      const float s = 0.01f * float(1 + i % 7), mn = spec.has_min() ? -0.05f * float(1 + i % 3) : 0.0f;
      groups[i] = QuantGroupFromF16(F32ToF16(s), F32ToF16(mn), spec);
    }
    NmMatrix on_grid = shape;
    Tensor v = Tensor::Alloc(DType::kF32, {rows, per_row});
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < per_row; ++j) {
        const int span = MaxCode(spec) - MinCode(spec) + 1;
        const int code = MinCode(spec) + int((r * 31 + j * 17) % span);
        v.mutable_data_as<float>()[r * per_row + j] = Dequantize(code, groups[r * qg + j / spec.group], spec);
      }
    }
    on_grid.values = v;
    auto q = NmMatrix::Quantize(on_grid, spec, groups, "w");
    ASSERT_TRUE(q.ok()) << q.status().ToString();
    const Tensor back = q->StoredValuesF32();
    EXPECT_EQ(std::memcmp(back.data(), v.data(), v.nbytes()), 0);
    for (int64_t i = 0; i < rows * qg; ++i) {
      EXPECT_EQ(q->quant.scales.data_as<uint16_t>()[i], groups[i].scale_f16);
    }
    // A wrong number of groups is refused.
    groups.pop_back();
    auto bad = NmMatrix::Quantize(on_grid, spec, groups, "w");
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.status().message().find("fitted groups"), std::string::npos);
  }
}

TEST(NmQuantize, RefusesWhatItCannotQuantize) {
  std::vector<float> w = TwoFour(2, 8, 1);
  const NmMatrix src = *NmMatrix::FromDense(w, 2, 8, 2, 4);
  const ValueSpec i4 = *ValueSpec::Parse("int4:g32");
  auto twice = NmMatrix::Quantize(*NmMatrix::Quantize(src, i4), i4, {}, "blk.0.w");
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.status().message().find("blk.0.w: values are quantized already"), std::string::npos);
  auto f32 = NmMatrix::Quantize(src, *ValueSpec::Parse("bf16"), {}, "blk.0.w");
  ASSERT_FALSE(f32.ok());
  EXPECT_NE(f32.status().message().find("not a quantized spec"), std::string::npos);
  // A value too large for an f16 scale (int8: scale = amax / 127 > 65504).
  NmMatrix huge = src;
  huge.values.mutable_data_as<float>()[5] = 1e8f;
  auto big = NmMatrix::Quantize(huge, *ValueSpec::Parse("int8:g32"), {}, "blk.0.w");
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("row 1 group 0"), std::string::npos) << big.status().ToString();
}

// ---- Validate on quantized parts ---------------------------------------------------------------

::testing::AssertionResult FailsWith(const Status& st, const std::string& want) {
  if (st.ok()) return ::testing::AssertionFailure() << "Validate passed; expected: " << want;
  if (st.code() != StatusCode::kInvalidInput) return ::testing::AssertionFailure() << st.ToString();
  if (st.message().find(want) == std::string::npos) {
    return ::testing::AssertionFailure() << "message '" << st.message() << "' lacks '" << want << "'";
  }
  return ::testing::AssertionSuccess();
}

NmMatrix Quantized(const char* spec, int64_t cols = 70) {
  const std::vector<float> w = TwoFour(3, cols, 5);
  return *NmMatrix::Quantize(*NmMatrix::FromDense(w, 3, cols, 2, 4), *ValueSpec::Parse(spec));
}

TEST(NmQuantValidate, GoodMatricesPass) {
  for (const char* s : kSpecs) EXPECT_TRUE(Quantized(s).Validate("w").ok()) << s;
}

TEST(NmQuantValidate, ScalesMustBeFiniteAndNonNegative) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), INFINITY, -0.5f}) {
    NmMatrix q = Quantized("int4:g32");
    q.quant.scales.mutable_data_as<uint16_t>()[1 * 2 + 1] = F32ToF16(bad);
    EXPECT_TRUE(FailsWith(q.Validate("blk.1.w"), "blk.1.w.scales: row 1 group 1 has scale")) << bad;
  }
  NmMatrix q = Quantized("int4:g64");
  q.quant.mins.mutable_data_as<uint16_t>()[2] = F32ToF16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(FailsWith(q.Validate("w"), "w.mins: row 2 group 0 has a non-finite min"));
}

TEST(NmQuantValidate, PartsMustHaveTheirShapesAndDtypes) {
  {
    NmMatrix q = Quantized("int4:g32");
    q.quant.scales = Tensor::Alloc(DType::kF16, {3, 1});  // 36 values in groups of 32: 2 groups
    EXPECT_TRUE(FailsWith(q.Validate("w"), "w.scales"));
  }
  {
    NmMatrix q = Quantized("int4:g32");
    q.quant.scales = Tensor::Alloc(DType::kF32, {3, 2});
    EXPECT_TRUE(FailsWith(q.Validate("w"), "w.scales"));
  }
  {
    NmMatrix q = Quantized("int4:g64");
    q.quant.mins = Tensor();
    EXPECT_TRUE(FailsWith(q.Validate("w"), "w.mins"));
  }
  {
    NmMatrix q = Quantized("int4:g64:sym");
    q.quant.mins = Tensor::Alloc(DType::kF16, {3, 1});
    EXPECT_TRUE(FailsWith(q.Validate("w"), "w.mins: present, but int4:g64:sym values have no min"));
  }
  {
    NmMatrix q = Quantized("int8:g32");  // codes are i8 [rows, 36]
    q.values = Tensor::Alloc(DType::kI8, {3, 35});
    EXPECT_TRUE(FailsWith(q.Validate("w"), "w.values"));
  }
  {
    NmMatrix q = Quantized("int4:g32");  // codes are u8 [rows, 18]
    q.values = Tensor::Alloc(DType::kI8, {3, 18});
    EXPECT_TRUE(FailsWith(q.Validate("w"), "w.values"));
  }
  {
    NmMatrix q = Quantized("int4:g32");
    q.quant.spec.group = 48;
    EXPECT_TRUE(FailsWith(q.Validate("w"), "unsupported spec"));
  }
}

TEST(NmQuantValidate, CodesMustBeInRange) {
  {
    NmMatrix q = Quantized("int8:g32");
    q.values.mutable_data_as<int8_t>()[36 + 4] = -128;
    EXPECT_TRUE(FailsWith(q.Validate("w"), "w.values: row 1 value 4 has code -128, outside int8:g32's -127..127"));
  }
  {
    NmMatrix q = Quantized("int4:g32:sym");
    uint8_t& b = q.values.mutable_data_as<uint8_t>()[2 * 18 + 3];
    b = static_cast<uint8_t>(b & 0x0F);  // value 7 (high nibble of byte 3) gets code 0
    EXPECT_TRUE(FailsWith(q.Validate("w"), "w.values: row 2 value 7 has code 0, outside int4:g32:sym's 1..15"));
  }
  {
    // An odd number of stored values per row needs an odd N: 1:4 over 12 columns stores 3
    // values per row in 2 bytes, the last high nibble spare.
    const int64_t cols = 12;
    std::vector<float> w(3 * cols, 0.0f);
    for (int64_t r = 0; r < 3; ++r) {
      for (int64_t g = 0; g < 3; ++g) w[r * cols + g * 4 + (r + g) % 4] = float(1 + r + g);
    }
    NmMatrix q = *NmMatrix::Quantize(*NmMatrix::FromDense(w, 3, cols, 1, 4), *ValueSpec::Parse("int4:g32"));
    ASSERT_TRUE(q.Validate("w").ok());
    q.values.mutable_data_as<uint8_t>()[1 * 2 + 1] |= 0x30;
    EXPECT_TRUE(FailsWith(q.Validate("w"), "w.values: row 1 has bits in the unused high nibble"));
  }
}

}  // namespace
}  // namespace sparq
