// Quantized V:N:M values (format.h QuantParts): a V:N:M matrix's values are laid out as an N:M
// matrix's, so VnmMatrix::Quantize of a matrix must give the same codes, scales and mins, bit for
// bit, as NmMatrix::Quantize of the same weights (whose rounding nm_quant_test.cc checks against
// every code of the grid); the slab's shared meta survives unchanged, the dequantized matrix has
// zeros exactly where the weights do, and Validate names every malformed quantized part.
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

// rows x cols in slabs of v rows, every row of a slab keeping the same two columns of each group
// of four (chosen per slab and group), all kept values nonzero. The tail group of cols % 4
// columns keeps min(2, len).
std::vector<float> VnmWeights(int64_t rows, int64_t cols, int v, uint64_t seed) {
  std::vector<float> r = testing_formats::RandomMatrix(rows, cols, seed, 0.0);
  std::vector<float> w(r.size(), 0.0f);
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t slab = i / v;
    for (int64_t g = 0; g < cols; g += 4) {
      const int64_t len = std::min<int64_t>(4, cols - g);
      const int64_t a = (slab * 5 + g / 4 * 3 + int64_t(seed)) % len;
      const int64_t b = (a + 1 + (slab + g / 4) % std::max<int64_t>(1, len - 1)) % len;
      for (const int64_t c : {a, b}) {
        const float x = r[i * cols + g + c];
        w[i * cols + g + c] = x != 0.0f ? x : 0.5f;
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

// 7 rows (slabs of 4: the last slab 3 rows) x 70 columns (18 groups, the last 2 wide): 36 kept
// values per row, so every group size leaves a short last quantization group.
TEST(VnmQuantize, GivesNmQuantizesCodesAndKeepsTheSlabMeta) {
  const int64_t rows = 7, cols = 70;
  const int v = 4;
  const std::vector<float> w = VnmWeights(rows, cols, v, 3);
  const VnmMatrix src = *VnmMatrix::FromDense(w, rows, cols, v, 2, 4);
  const NmMatrix nm = *NmMatrix::FromDense(w, rows, cols, 2, 4);
  // The same kept values in the same order: the premise of comparing the two quantizations.
  ASSERT_TRUE(SameBytes(src.StoredValuesF32(), nm.StoredValuesF32()));
  for (const char* text : kSpecs) {
    SCOPED_TRACE(text);
    const ValueSpec spec = *ValueSpec::Parse(text);
    auto q = VnmMatrix::Quantize(src, spec, {}, "w");
    ASSERT_TRUE(q.ok()) << q.status().ToString();
    const NmMatrix qn = *NmMatrix::Quantize(nm, spec, {}, "w");
    ASSERT_TRUE(q->Validate("w").ok());
    const SparseMatrix sm(*q);
    EXPECT_TRUE(IsQuantized(sm));
    EXPECT_EQ(ValuesName(sm), spec.Name());
    EXPECT_EQ(q->quant_groups(spec), qn.quant_groups(spec));
    EXPECT_TRUE(SameBytes(q->values, qn.values)) << "codes differ from N:M's";
    EXPECT_TRUE(SameBytes(q->quant.scales, qn.quant.scales));
    EXPECT_TRUE(SameBytes(q->quant.mins, qn.quant.mins));
    EXPECT_TRUE(SameBytes(q->meta, src.meta)) << "the slab meta changed";
    EXPECT_EQ(q->ByteSize(), q->values.nbytes() + src.meta.nbytes() + q->quant.scales.nbytes() +
                                 q->quant.mins.nbytes());
    // Dequantized: N:M's dense matrix bit for bit, zero wherever the weights are.
    const Tensor d = q->ToDense(), dn = qn.ToDense();
    ASSERT_TRUE(SameBytes(d, dn));
    for (int64_t i = 0; i < rows * cols; ++i) {
      if (w[i] == 0.0f) {
        EXPECT_EQ(d.data_as<float>()[i], 0.0f) << "pruned position " << i;
      }
    }
    EXPECT_TRUE(SameBytes(ToDense(sm), d));
    // Through the generic entry point too, and a second quantization is refused.
    auto g = QuantizeMatrix(SparseMatrix(src), spec, {}, "w");
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    EXPECT_TRUE(SameBytes(std::get<VnmMatrix>(*g).values, q->values));
    auto twice = VnmMatrix::Quantize(*q, spec, {}, "blk.0.w");
    ASSERT_FALSE(twice.ok());
    EXPECT_NE(twice.status().message().find("blk.0.w: values are quantized already"),
              std::string::npos);
  }
}

// GPTQ's groups are taken as given: values on those grids come back bit for bit.
TEST(VnmQuantize, GivenGroupsReproduceValuesOnTheirGridExactly) {
  const int64_t rows = 6, cols = 136;
  const std::vector<float> w = VnmWeights(rows, cols, 2, 11);
  const VnmMatrix shape = *VnmMatrix::FromDense(w, rows, cols, 2, 2, 4);
  for (const char* text : kSpecs) {
    SCOPED_TRACE(text);
    const ValueSpec spec = *ValueSpec::Parse(text);
    const int64_t per_row = shape.groups() * 2, qg = shape.quant_groups(spec);
    std::vector<QuantGroup> groups(rows * qg);
    for (int64_t i = 0; i < rows * qg; ++i) {
      const float s = 0.01f * float(1 + i % 7),
                  mn = spec.has_min() ? -0.05f * float(1 + i % 3) : 0.0f;
      groups[i] = QuantGroupFromF16(F32ToF16(s), F32ToF16(mn), spec);
    }
    VnmMatrix on_grid = shape;
    Tensor vals = Tensor::Alloc(DType::kF32, {rows, per_row});
    const int span = MaxCode(spec) - MinCode(spec) + 1;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < per_row; ++j) {
        const int code = MinCode(spec) + int((r * 31 + j * 17) % span);
        vals.mutable_data_as<float>()[r * per_row + j] =
            Dequantize(code, groups[r * qg + j / spec.group], spec);
      }
    }
    on_grid.values = vals;
    auto q = VnmMatrix::Quantize(on_grid, spec, groups, "w");
    ASSERT_TRUE(q.ok()) << q.status().ToString();
    EXPECT_TRUE(SameBytes(q->StoredValuesF32(), vals));
    groups.pop_back();
    EXPECT_FALSE(VnmMatrix::Quantize(on_grid, spec, groups, "w").ok());
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

VnmMatrix Quantized(const char* spec) {
  const std::vector<float> w = VnmWeights(5, 70, 2, 5);  // 36 kept values a row
  return *VnmMatrix::Quantize(*VnmMatrix::FromDense(w, 5, 70, 2, 2, 4), *ValueSpec::Parse(spec));
}

TEST(VnmQuantValidate, NamesEveryMalformedPart) {
  for (const char* s : kSpecs) EXPECT_TRUE(Quantized(s).Validate("w").ok()) << s;
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), INFINITY, -0.5f}) {
    VnmMatrix q = Quantized("int4:g32");
    q.quant.scales.mutable_data_as<uint16_t>()[3 * 2 + 1] = F32ToF16(bad);
    EXPECT_TRUE(FailsWith(q.Validate("blk.1.w"), "blk.1.w.scales: row 3 group 1 has scale")) << bad;
  }
  {
    VnmMatrix q = Quantized("int4:g64");
    q.quant.mins.mutable_data_as<uint16_t>()[4] = F32ToF16(std::numeric_limits<float>::quiet_NaN());
    EXPECT_TRUE(FailsWith(q.Validate("w"), "w.mins: row 4 group 0 has a non-finite min"));
  }
  {
    VnmMatrix q = Quantized("int4:g32");
    q.quant.scales = Tensor::Alloc(DType::kF16, {5, 1});  // 36 values in groups of 32: 2 groups
    EXPECT_TRUE(FailsWith(q.Validate("w"), "w.scales"));
  }
  {
    VnmMatrix q = Quantized("int4:g64");
    q.quant.mins = Tensor();
    EXPECT_TRUE(FailsWith(q.Validate("w"), "w.mins"));
  }
  {
    VnmMatrix q = Quantized("int8:g32");  // codes i8 [5, 36]
    q.values = Tensor::Alloc(DType::kI8, {5, 35});
    EXPECT_TRUE(FailsWith(q.Validate("w"), "w.values"));
  }
  {
    VnmMatrix q = Quantized("int4:g32");  // meta is one row per slab of 2: [3, 9]
    q.meta = Tensor::Alloc(DType::kU8, {5, 9});
    EXPECT_TRUE(FailsWith(q.Validate("w"), "w.meta"));
  }
  {
    VnmMatrix q = Quantized("int8:g32");
    q.values.mutable_data_as<int8_t>()[36 + 4] = -128;
    EXPECT_TRUE(FailsWith(q.Validate("w"),
                          "w.values: row 1 value 4 has code -128, outside int8:g32's -127..127"));
  }
  {
    VnmMatrix q = Quantized("int4:g32");
    q.quant.spec.group = 48;
    EXPECT_TRUE(FailsWith(q.Validate("w"), "unsupported spec"));
  }
}

}  // namespace
}  // namespace sparq
