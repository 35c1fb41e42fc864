// V:N:M and BSR weights with int8 / int4 values (format.h VnmMatrix, BsrMatrix) through
// LinearWeight: in groups of 2 or 4 rows their codes run as stored through the quantized
// row-group rows ({i8,i4,i4s}_rowgroups_*), one-row groups dequantized into f32 CSR rows; on every
// compiled target the CPU supports, decode and tiled, against the double reference of the
// dequantized weight; stored codes and round to nearest at pack time give the same bits; a spec
// that disagrees with the stored one, or a malformed stored part, is an error naming the weight.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <set>
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
using testing_cpu::RandomVector;

// 37 rows (a short last slab for every v), 150 columns (a 2-column tail group; 76 kept values a
// row, so g32 / g64 / g128 all end in a short group).
constexpr int64_t kM = 37, kK = 150;

VnmMatrix Weights(int v, uint64_t seed) {
  const std::vector<float> w = testing_cpu::PatternWeights(Pattern::VNM(v, 2, 4), kM, kK, seed);
  return *VnmMatrix::FromDense(w, kM, kK, v, 2, 4);
}

TEST(VnmQuantLinearTest, RunsTheQuantizedRowsOnEveryTarget) {
  std::set<std::string> ran;
  const int targets = ForEachTarget([&](const std::string& target) {
    for (const int v : {2, 4, 8}) {
      const VnmMatrix src = Weights(v, 20 + v);
      for (const char* text : {"int8:g64", "int4:g64", "int4:g32:sym", "int4:g128"}) {
        SCOPED_TRACE(target + " v " + std::to_string(v) + " " + text);
        const ValueSpec spec = *ValueSpec::Parse(text);
        auto q = VnmMatrix::Quantize(src, spec, {}, "w");
        ASSERT_TRUE(q.ok()) << q.status().ToString();
        const Tensor deq = q->ToDense();
        const std::vector<float> wd(deq.data_as<float>(), deq.data_as<float>() + deq.numel());
        auto stored = LinearWeight::FromMatrix(*q, "w", Cfg());
        ASSERT_TRUE(stored.ok()) << stored.status().ToString();
        auto rounded = LinearWeight::FromMatrix(src, spec, "w", Cfg());
        ASSERT_TRUE(rounded.ok()) << rounded.status().ToString();
        EXPECT_EQ(stored->format(), "vnm " + std::to_string(v) + ":2:4 " + text);
        const std::string prefix = spec.dtype == DType::kI8 ? "i8_"
                                   : spec.has_min()         ? "i4_"
                                                            : "i4s_";
        for (int64_t n : {1, 3, 4, 5, 40, 200}) {
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
          testing_cpu::ExpectClose(want, abs_sum, y.data(), n, kM, kM, kK, "vnm quant");
          EXPECT_THAT(stored->kernel_name(n), HasSubstr(prefix + "rowgroups_")) << "n " << n;
          ran.insert(stored->kernel_name(n).substr(0, stored->kernel_name(n).find('(')));
        }
      }
    }
  });
  EXPECT_GE(targets, 2);
  // Both quantized row-group rows of every value kind ran.
  for (const char* p : {"i8", "i4", "i4s"}) {
    for (const char* r : {"_rowgroups_decode_Gx1", "_rowgroups_tiled_GxNV"}) {
      EXPECT_EQ(ran.count(std::string(p) + r), 1u) << p << r << " never ran";
    }
  }
}

// BSR blocks of 1 (CSR rows), 2 and 4+ rows (row groups of 2 and 4), edge blocks on both sides.
TEST(BsrQuantLinearTest, RunsTheQuantizedRowsOnEveryTarget) {
  const int targets = ForEachTarget([&](const std::string& target) {
    for (const auto& [bh, bw] :
         {std::pair{1, 8}, std::pair{2, 16}, std::pair{4, 4}, std::pair{8, 6}}) {
      const Pattern p = Pattern::Block(bh, bw, 0.5);
      const std::vector<float> w = testing_cpu::PatternWeights(p, kM, kK, 30 + bh);
      const BsrMatrix src = *BsrMatrix::FromDense(w, kM, kK, bh, bw);
      for (const char* text : {"int8:g64", "int4:g64", "int4:g32:sym"}) {
        SCOPED_TRACE(target + " block " + p.ToString() + " " + text);
        const ValueSpec spec = *ValueSpec::Parse(text);
        auto q = BsrMatrix::Quantize(src, spec, {}, "w");
        ASSERT_TRUE(q.ok()) << q.status().ToString();
        const Tensor deq = q->ToDense();
        const std::vector<float> wd(deq.data_as<float>(), deq.data_as<float>() + deq.numel());
        auto stored = LinearWeight::FromMatrix(*q, "w", Cfg());
        ASSERT_TRUE(stored.ok()) << stored.status().ToString();
        auto rounded = LinearWeight::FromMatrix(src, spec, "w", Cfg());
        ASSERT_TRUE(rounded.ok()) << rounded.status().ToString();
        if (bh == 1) {  // CSR rows, which take no codes
          EXPECT_THAT(stored->format(), HasSubstr(std::string("bsr ") + text + " dequantized, "));
        } else {
          EXPECT_EQ(stored->format(),
                    "bsr " + std::to_string(bh) + "x" + std::to_string(bw) + " " + text);
        }
        for (int64_t n : {1, 3, 4, 5, 40, 200}) {
          const std::vector<float> x = RandomVector(size_t(n * kK), 9 + n);
          std::vector<float> y(size_t(n * kM)), y2(size_t(n * kM));
          ThreadPool pool(2);
          stored->Forward(x.data(), n, y.data(), &pool);
          rounded->Forward(x.data(), n, y2.data(), &pool);
          EXPECT_EQ(std::memcmp(y.data(), y2.data(), y.size() * sizeof(float)), 0) << "n " << n;
          std::vector<double> want, abs_sum;
          testing_cpu::ReferenceForward(wd, kM, kK, x.data(), n, kK, Epilogue{}, want, abs_sum);
          testing_cpu::ExpectClose(want, abs_sum, y.data(), n, kM, kM, kK, "bsr quant");
        }
      }
    }
  });
  EXPECT_GE(targets, 2);
}

// The decode row runs up to 4 tokens beside each other (AVX-512: each vector of codes dequantized
// once for all of them); a token's outputs are the same bits whatever the batch around it.
TEST(VnmQuantLinearTest, DecodeTokenBitsDoNotDependOnTheBatch) {
  const int targets = ForEachTarget([&](const std::string& target) {
    for (const char* text : {"int8:g64", "int4:g32", "int4:g64:sym"}) {
      SCOPED_TRACE(target + " " + text);
      auto lw = LinearWeight::FromMatrix(Weights(4, 41), *ValueSpec::Parse(text), "w", Cfg());
      ASSERT_TRUE(lw.ok()) << lw.status().ToString();
      // The decode row serves up to 4 tokens on AVX-512, one elsewhere (tiled rows above).
      for (int64_t n : {2, 3, 4}) {
        if (lw->kernel_name(n).find("_rowgroups_decode") == std::string::npos) continue;
        const std::vector<float> x = RandomVector(size_t(n * kK), 17);
        std::vector<float> y(static_cast<size_t>(n * kM)), one(static_cast<size_t>(kM));
        lw->Forward(x.data(), n, y.data(), nullptr);
        for (int64_t t = 0; t < n; ++t) {
          lw->Forward(x.data() + t * kK, 1, one.data(), nullptr);
          EXPECT_EQ(std::memcmp(one.data(), y.data() + t * kM, one.size() * sizeof(float)), 0)
              << "token " << t << " of " << n;
        }
      }
    }
  });
  EXPECT_GE(targets, 2);
}

// Beyond 65,536 columns the groups' column indices are u32 (the decode's masked index loads and
// gathers at a segment's end read them as such); BSR 2x2 and 4x4 blocks, groups of 2 and 4 rows.
TEST(BsrQuantLinearTest, U32ColumnIndicesBeyond65536Columns) {
  const int64_t m = 8, k = 70000;
  const int targets = ForEachTarget([&](const std::string& target) {
    for (const int b : {2, 4}) {
      const Pattern p = Pattern::Block(b, b, 0.99);
      const std::vector<float> w = testing_cpu::PatternWeights(p, m, k, 50 + b);
      const BsrMatrix src = *BsrMatrix::FromDense(w, m, k, b, b);
      for (const char* text : {"int8:g64", "int4:g32"}) {
        SCOPED_TRACE(target + " " + p.ToString() + " " + text);
        auto q = BsrMatrix::Quantize(src, *ValueSpec::Parse(text), {}, "w");
        ASSERT_TRUE(q.ok()) << q.status().ToString();
        const Tensor deq = q->ToDense();
        const std::vector<float> wd(deq.data_as<float>(), deq.data_as<float>() + deq.numel());
        auto lw = LinearWeight::FromMatrix(*q, "w", Cfg());
        ASSERT_TRUE(lw.ok()) << lw.status().ToString();
        for (int64_t n : {1, 2, 7, 40}) {
          const std::vector<float> x = RandomVector(size_t(n * k), 3 + n);
          std::vector<float> y(size_t(n * m));
          lw->Forward(x.data(), n, y.data(), nullptr);
          std::vector<double> want, abs_sum;
          testing_cpu::ReferenceForward(wd, m, k, x.data(), n, k, Epilogue{}, want, abs_sum);
          testing_cpu::ExpectClose(want, abs_sum, y.data(), n, m, m, k, "bsr quant u32");
        }
      }
    }
  });
  EXPECT_GE(targets, 2);
}

// Enough groups (600 rows: 150 groups of 4) that the tiled rows' dequantization runs as several
// tasks on the pool, into the calling thread's twin; the same bits on 1, 2 and 3 threads.
TEST(VnmQuantLinearTest, ManyGroupsDequantizeOnThePool) {
  const int64_t m = 600, k = 96, n = 100;
  const std::vector<float> w = testing_cpu::PatternWeights(Pattern::VNM(4, 2, 4), m, k, 77);
  const VnmMatrix q = *VnmMatrix::Quantize(*VnmMatrix::FromDense(w, m, k, 4, 2, 4),
                                           *ValueSpec::Parse("int4:g32"), {}, "w");
  const Tensor deq = q.ToDense();
  const std::vector<float> wd(deq.data_as<float>(), deq.data_as<float>() + deq.numel());
  auto lw = LinearWeight::FromMatrix(q, "w", Cfg());
  ASSERT_TRUE(lw.ok()) << lw.status().ToString();
  EXPECT_THAT(lw->kernel_name(n), HasSubstr("i4_rowgroups_tiled"));
  const std::vector<float> x = RandomVector(size_t(n * k), 5);
  std::vector<float> y1(size_t(n * m)), y(size_t(n * m));
  lw->Forward(x.data(), n, y1.data(), nullptr);
  for (int threads : {2, 3}) {
    ThreadPool pool(threads);
    lw->Forward(x.data(), n, y.data(), &pool);
    EXPECT_EQ(std::memcmp(y.data(), y1.data(), y.size() * sizeof(float)), 0)
        << threads << " threads";
  }
  std::vector<double> want, abs_sum;
  testing_cpu::ReferenceForward(wd, m, k, x.data(), n, k, Epilogue{}, want, abs_sum);
  testing_cpu::ExpectClose(want, abs_sum, y1.data(), n, m, m, k, "vnm quant, many groups");
}

TEST(VnmQuantLinearTest, StoredSpecMustMatchAndPartsMustBeValid) {
  auto q = VnmMatrix::Quantize(Weights(4, 4), *ValueSpec::Parse("int8:g64"));
  ASSERT_TRUE(q.ok());
  auto lw = LinearWeight::FromMatrix(*q, *ValueSpec::Parse("int4:g64"), "blk.0.ffn_up", Cfg());
  ASSERT_FALSE(lw.ok());
  EXPECT_THAT(lw.status().message(),
              HasSubstr("blk.0.ffn_up: values are stored as int8:g64, not int4:g64"));
  VnmMatrix bad = *q;
  bad.quant.scales = bad.quant.scales.Clone();
  bad.quant.scales.mutable_data_as<uint16_t>()[0] = 0x7E00;
  auto lb = LinearWeight::FromMatrix(bad, "blk.0.ffn_up", Cfg());
  ASSERT_FALSE(lb.ok());
  EXPECT_THAT(lb.status().message(), HasSubstr("blk.0.ffn_up.scales: row 0 group 0"));
}

}  // namespace
}  // namespace sparq
