// CSR weights with int8 / int4 values (format.h CsrMatrix, groups of dense columns) through
// LinearWeight: codes kept in the bit-mask layout, dequantized to f32 for column indices, on
// every compiled target the CPU supports, against the double reference of the dequantized weight;
// stored codes and round to nearest at pack time give the same bits; a spec that disagrees with
// the stored one is an error naming the weight.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "sparq/linear.h"
#include "sparq/quant.h"
#include "tests/cpu/spmm_cases_testutil.h"
#include "tests/cpu/spmm_testutil.h"

namespace sparq {
namespace {

using ::testing::HasSubstr;
using testing_cpu::Cfg;
using testing_cpu::ForEachTarget;
using testing_cpu::MutableCfg;
using testing_cpu::RandomVector;

// 37 x 150 at about half kept (so kAuto picks the bit mask), 150 columns: g32 / g64 / g128 all
// end in a short group, and the last 16-column chunk is partial; row 3 is empty.
constexpr int64_t kM = 37, kK = 150;

CsrMatrix Weights(uint64_t seed) {
  std::vector<float> w = testing_cpu::PatternWeights(Pattern::Unstructured(0.5), kM, kK, seed);
  for (int64_t j = 0; j < kK; ++j) w[3 * kK + j] = 0.0f;
  return *CsrMatrix::FromDense(w, kM, kK);
}

TEST(CsrQuantLinearTest, RunsTheDequantizedWeightOnEveryTargetAndLayout) {
  const CsrMatrix src = Weights(21);
  const int targets = ForEachTarget([&](const std::string& target) {
    for (CsrLayout layout : {CsrLayout::kBitmask, CsrLayout::kColumns}) {
      MutableCfg().csr_layout = layout;
      for (const char* text : {"int8:g64", "int4:g64", "int4:g32:sym", "int4:g128"}) {
        SCOPED_TRACE(target + " " + text + (layout == CsrLayout::kBitmask ? " bitmask" : " columns"));
        const ValueSpec spec = *ValueSpec::Parse(text);
        auto q = CsrMatrix::Quantize(src, spec, {}, "w");
        ASSERT_TRUE(q.ok()) << q.status().ToString();
        const Tensor deq = q->ToDense();
        const std::vector<float> wd(deq.data_as<float>(), deq.data_as<float>() + deq.numel());
        // Stored codes, and the float matrix quantized at pack time.
        auto stored = LinearWeight::FromMatrix(*q, "w", Cfg());
        ASSERT_TRUE(stored.ok()) << stored.status().ToString();
        auto rounded = LinearWeight::FromMatrix(src, spec, "w", Cfg());
        ASSERT_TRUE(rounded.ok()) << rounded.status().ToString();
        // The bit mask keeps the codes (mask_quant_test.cc); column lists run dequantized.
        EXPECT_THAT(stored->format(),
                    HasSubstr(layout == CsrLayout::kBitmask
                                  ? std::string("csr ") + text + " as bitmask"
                                  : std::string("csr ") + text + " dequantized, csr f32"));
        for (int64_t n : {1, 5, 40}) {
          const std::vector<float> x = RandomVector(size_t(n * kK), 6 + n);
          std::vector<float> y(size_t(n * kM)), y2(size_t(n * kM));
          ThreadPool pool(2);
          stored->Forward(x.data(), n, y.data(), &pool);
          rounded->Forward(x.data(), n, y2.data(), &pool);
          EXPECT_EQ(std::memcmp(y.data(), y2.data(), y.size() * sizeof(float)), 0) << "n " << n;
          // The double reference of the dequantized weight; the tolerance (spmm_cases_testutil.cc)
          // is eps(f32) times the sum of |w x| over k, per output.
          std::vector<double> want, abs_sum;
          testing_cpu::ReferenceForward(wd, kM, kK, x.data(), n, kK, Epilogue{}, want, abs_sum);
          testing_cpu::ExpectClose(want, abs_sum, y.data(), n, kM, kM, kK, "csr quant");
        }
      }
    }
    MutableCfg().csr_layout = CsrLayout::kAuto;
  });
  EXPECT_GE(targets, 2);
}

TEST(CsrQuantLinearTest, StoredSpecMustMatchTheAskedOne) {
  auto q = CsrMatrix::Quantize(Weights(4), *ValueSpec::Parse("int8:g64"));
  ASSERT_TRUE(q.ok());
  auto lw = LinearWeight::FromMatrix(*q, *ValueSpec::Parse("int4:g64"), "blk.0.ffn_up", Cfg());
  ASSERT_FALSE(lw.ok());
  EXPECT_THAT(lw.status().message(),
              HasSubstr("blk.0.ffn_up: values are stored as int8:g64, not int4:g64"));
  // A malformed stored matrix is refused by name before packing.
  CsrMatrix bad = *q;
  bad.quant.scales = bad.quant.scales.Clone();
  bad.quant.scales.mutable_data_as<uint16_t>()[0] = 0x7E00;
  auto lb = LinearWeight::FromMatrix(bad, "blk.0.ffn_up", Cfg());
  ASSERT_FALSE(lb.ok());
  EXPECT_THAT(lb.status().message(), HasSubstr("blk.0.ffn_up.scales: row 0 group 0"));
}

}  // namespace
}  // namespace sparq
