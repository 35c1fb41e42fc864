// Quantized bit-mask weights (MaskWeight with int8 / int4 codes, spmm_packed.h; the i8 / i4 / i4s
// *_mask_* rows of the kernel table): every row on every compiled target the CPU supports against
// (a) the f32 mask row of the same name on the dequantized weight, bit for bit (the kernels
// dequantize with the expressions of sparq/quant.h and sum in the f32 rows' order; except the
// AVX3_DL int4 decode of groups >= 64 columns, which sums each 64-column block's lanes in another
// order, MaskQuantDecodeBlocks, and is held to (b) alone), and (b) the
// double reference of the dequantized weight; bits for 1, 2 and 3 threads. The weights make a
// wrong scale, a min reaching a pruned lane, or a swapped nibble fail: group magnitudes 2^0..2^6,
// mins far from 0, codes read back from the packed bytes here.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "sparq/quant.h"
#include "src/cpu/spmm.h"
#include "tests/cpu/spmm_testutil.h"

namespace sparq {
namespace {

using testing_cpu::Cfg;
using testing_cpu::ForEachTarget;
using testing_cpu::RandomVector;
using testing_cpu::RunRow;
using testing_cpu::RowNamed;


// Half kept at random, group magnitudes spread by dense-column group, every group offset away from
// 0 (so int4's min is large: a min leaking into a pruned lane moves y by min * x), row 2 empty.
std::vector<float> MaskQuantWeights(int64_t m, int64_t k, int group, uint64_t seed) {
  std::vector<float> w = testing_cpu::PatternWeights(Pattern::Unstructured(0.5), m, k, seed);
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t c = 0; c < k; ++c) {
      float& v = w[r * k + c];
      if (v == 0.0f) continue;
      v = std::ldexp(std::fabs(v) + 0.5f, int((r * 3 + c / group) % 7)) * ((r + c / group) % 2 ? 1 : -1);
      if (r == 2) v = 0.0f;
    }
  }
  return w;
}

// Kept value p of row r at column c from the packed bytes as spmm_packed.h documents them (int8 a
// byte each; int4 code p in the low nibble of byte p / 2 when p is even) and quant.h's formulas.
float Dequantized(const cpu::MaskWeight& mw, int64_t r, int64_t c, int64_t p) {
  const uint8_t* b = mw.values.data_as<uint8_t>();
  const int q = mw.spec.dtype == DType::kI8 ? int(int8_t(b[p])) : (p % 2 ? b[p / 2] >> 4 : b[p / 2] & 15);
  const size_t gi = size_t((r * mw.groups_per_row + c / mw.spec.group) * mw.params_per_group());
  const float scale = F16ToF32(mw.params[gi]);
  if (mw.spec.dtype == DType::kI8) return float(q) * scale;
  if (mw.spec.sym) return float(q - 8) * scale;
  return std::fma(float(q), scale, F16ToF32(mw.params[gi + 1]));
}

TEST(MaskQuantTest, EveryQuantizedMaskRowHasTheBitsOfF32OnTheDequantizedWeight) {
  const char* specs[] = {"int8:g32", "int4:g64", "int4:g32:sym", "int4:g128", "int8:g128",
                         "int4:g64:sym"};
  // k: below a chunk (7), one past a chunk in a short group (100), SmolLM2's 576 (4.5 groups of
  // 128) and 1536; m leaves 1 row past the 4-row and 2-row tiles; n: decode (1, 3, 16) and tiled
  // (17, 65: partial token tiles).
  const int64_t ms[] = {5, 33};
  const int64_t ks[] = {7, 100, 576, 1536};
  const int64_t ns[] = {1, 3, 16, 17, 65};
  ThreadPool pool2(2), pool3(3);
  std::set<std::string> rows_run;
  uint64_t seed = 900;
  const double eps = std::numeric_limits<float>::epsilon();
  cpu::PackOptions opt;
  opt.csr_layout = CsrLayout::kBitmask;
  const int targets = ForEachTarget([&](const std::string& target) {
    for (const char* sv : specs) {
      const ValueSpec spec = *ValueSpec::Parse(sv);
      for (int64_t m : ms) {
        for (int64_t k : ks) {
          const std::vector<float> w0 = MaskQuantWeights(m, k, spec.group, seed++);
          const CsrMatrix src = *CsrMatrix::FromDense(w0, m, k);
          auto q = CsrMatrix::Quantize(src, spec, {}, "w");
          ASSERT_TRUE(q.ok()) << q.status().ToString();
          auto packed = cpu::Pack(*q, "w", opt);
          ASSERT_TRUE(packed.ok()) << packed.status().ToString();
          const cpu::PackedWeight& pw = *packed;
          ASSERT_EQ(pw.kind(), cpu::PackedKind::kMask) << sv;
          ASSERT_EQ(pw.source, std::string("csr ") + sv + " as bitmask");
          const cpu::MaskWeight& mw = pw.mask();
          ASSERT_TRUE(mw.quantized());
          // The dequantized weight, and its f32 bit-mask twin (same bits, f32 values).
          std::vector<float> dense(size_t(m * k), 0.0f);
          std::vector<uint8_t> keep(size_t(m * k), 0);
          const uint16_t* bits = mw.bits.data_as<uint16_t>();
          for (int64_t r = 0; r < m; ++r) {
            int64_t p = mw.row_ptr[r];
            for (int64_t c = 0; c < k; ++c) {
              if (!((bits[r * mw.chunks + c / 16] >> (c % 16)) & 1)) continue;
              dense[r * k + c] = Dequantized(mw, r, c, p);
              keep[r * k + c] = 1;
              ASSERT_EQ(mw.Value(r, c, p), dense[r * k + c]) << sv << " r " << r << " c " << c;
              ++p;
            }
            ASSERT_EQ(p, mw.row_ptr[r + 1]);
          }
          const CsrMatrix twin_src = *CsrMatrix::FromDenseMasked(dense, keep, m, k);
          auto twin = cpu::Pack(twin_src, "w", opt);
          ASSERT_TRUE(twin.ok()) << twin.status().ToString();
          for (int64_t n : ns) {
            const std::vector<float> x = RandomVector(size_t(n * k), 41 + n);
            // Double reference of the dequantized weight: each output sums k products with at most
            // k + 4 f32 roundings (lane partial sums, then a log2(L) <= 4 step reduction), so
            // |y - ref| <= (k + 4) eps sum|w x| (abs_sum; 2x margin).
            std::vector<double> want, abs_sum;
            testing_cpu::ReferenceForward(dense, m, k, x.data(), n, k, Epilogue{}, want, abs_sum);
            for (const auto& kern : cpu::KernelTable()) {
              if (!cpu::Declines(kern, pw, 0, Cfg(), true).empty()) continue;
              const std::string name = kern.name;
              rows_run.insert(target + " " + name);
              const std::string what = target + " " + sv + " " + name + " m=" + std::to_string(m) +
                                       " k=" + std::to_string(k) + " n=" + std::to_string(n);
              const cpu::KernelRow* f32 = RowNamed("f32" + name.substr(name.find('_')));
              ASSERT_NE(f32, nullptr) << name;
              ASSERT_TRUE(cpu::Declines(*f32, *twin, 0, Cfg(), true).empty()) << f32->name;
              const std::vector<float> y = RunRow(kern, pw, x, m, k, n, nullptr);
              const std::vector<float> yf = RunRow(*f32, *twin, x, m, k, n, nullptr);
              // MaskQuantDecodeBlocks: AVX3_DL int4 decode, groups of >= 64, one whole block.
              const bool block_order = target == "AVX3_DL" && kern.mode == cpu::KernelMode::kDecode &&
                                       spec.dtype == DType::kI4 && spec.group >= 64 && k > 48;
              if (!block_order) {
                ASSERT_EQ(0, std::memcmp(y.data(), yf.data(), y.size() * 4)) << what << " vs f32";
              }
              for (int64_t i = 0; i < n * m; ++i) {
                ASSERT_LE(std::fabs(y[i] - want[i]), 2.0 * (k + 4) * eps * abs_sum[i] + 1e-30)
                    << what << " y[" << i << "]";
              }
              for (ThreadPool* pl : {&pool2, &pool3}) {
                const std::vector<float> yt = RunRow(kern, pw, x, m, k, n, pl);
                ASSERT_EQ(0, std::memcmp(y.data(), yt.data(), y.size() * 4)) << what << " threads";
              }
            }
          }
        }
      }
    }
  });
  EXPECT_GE(targets, 2);
  // Every quantized mask row ran on every supported target of its range.
  for (int64_t t : KernelConfig::SupportedTargets()) {
    for (const auto& kern : cpu::KernelTable()) {
      if (kern.layout != cpu::KernelLayout::kMask || kern.values == cpu::ValueKind::kF32 ||
          kern.values == cpu::ValueKind::kBf16) {
        continue;
      }
      if (t < kern.best || t > kern.worst) continue;
      EXPECT_TRUE(rows_run.count(std::string(hwy::TargetName(t)) + " " + kern.name))
          << kern.name << " never ran on " << hwy::TargetName(t);
    }
  }
}

// A group the 16-column chunks do not tile is declined with its reason (the dequantized f32 path
// runs instead, PackCsrValues); the specs a file can hold (groups 32, 64, 128) are not.
TEST(MaskQuantTest, GroupsMustBeWholeChunks) {
  ValueSpec spec = *ValueSpec::Parse("int4:g64");
  EXPECT_EQ(cpu::MaskQuantDeclines(spec), "");
  spec.group = 24;
  EXPECT_EQ(cpu::MaskQuantDeclines(spec),
            "group 24 is not a power-of-two multiple of the 16-column mask chunk");
  spec.group = 48;
  EXPECT_NE(cpu::MaskQuantDeclines(spec), "");
  EXPECT_EQ(cpu::MaskQuantDeclines(ValueSpec{}), "values are not quantized");
}

}  // namespace
}  // namespace sparq
