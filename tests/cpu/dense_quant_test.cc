// Dense quantized weights (DenseQuantWeight, spmm_packed.h; the i8 / i4 / i4s *_dense_* rows of
// the kernel table): every row on every compiled target the CPU supports against the double
// reference of the dequantized weights, over the model's k (576, 1536), k past a chunk / group
// boundary, rows not a multiple of the row tile, and decode / tiled token counts; equal bits for
// 1, 2 and 3 threads; packing from stored codes (GGUF / .sparq conventions) equals packing the
// dequantized values round-to-nearest.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "sparq/dtype.h"
#include "sparq/linear.h"
#include "sparq/quant.h"
#include "src/cpu/spmm.h"
#include "tests/cpu/spmm_testutil.h"

namespace sparq {
namespace {

using testing_cpu::Cfg;
using testing_cpu::ForEachTarget;
using testing_cpu::RandomVector;
using testing_cpu::RunRow;


// Code of W[r, c] read from the packed bytes as spmm_packed.h documents them (int8: a byte per
// code, rows k_pad apart; int4: per chunk of 16, byte b holds code b low and code b + 8 high).
int PackedCode(const cpu::DenseQuantWeight& d, int64_t r, int64_t c) {
  const uint8_t* row = d.codes.data_as<uint8_t>() + r * d.row_bytes();
  if (d.values.dtype == DType::kI8) return static_cast<int8_t>(row[c]);
  const uint8_t byte = row[(c / 16) * 8 + (c % 8)];
  return (c % 16) < 8 ? (byte & 0x0F) : (byte >> 4);
}

// W[r, c] from quant.h's formulas on the packed code and group parameters.
float Dequantized(const cpu::DenseQuantWeight& d, int64_t r, int64_t c) {
  const int q = PackedCode(d, r, c);
  const int64_t g = r * d.groups_per_row + c / d.values.group;
  if (d.values.dtype == DType::kI8) return float(q) * d.scales[g];
  if (d.values.sym) return float(q - 8) * d.scales[g];
  return std::fma(float(q), d.scales[g], d.mins[g]);
}

// Weights whose group magnitudes spread over 2^0..2^6 (a neighbouring group's scale, wherever
// misapplied, is off by 2x or more), with an exact zero now and then.
std::vector<float> GroupSpreadWeights(int64_t m, int64_t k, int group, uint64_t seed) {
  std::vector<float> w = RandomVector(size_t(m * k), seed);
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t c = 0; c < k; ++c) {
      w[r * k + c] *= std::ldexp(1.0f, int((r * 7 + c / group) % 7));
      if ((r + c) % 29 == 0) w[r * k + c] = 0.0f;
    }
  }
  return w;
}

TEST(DenseQuantTest, EveryDenseQuantRowMatchesTheReferenceOfTheDequantizedWeights) {
  const char* specs[] = {"int8:g32", "int8:g128", "int4:g64", "int4:g32:sym", "int4:g128"};
  // k: the model's 576 (4.5 groups of 128) and 1536, one past a chunk of 16 and in a short group
  // (100: groups of 32 hold 3 + 4 columns), below a chunk (7). m: 5 and 33 leave 1 row past the
  // 4-row tiles, 70 a short second panel of the sgemm rows' 64. n: decode (1, 3, 16) and tiled
  // (17, 64; partial token tiles).
  const int64_t ms[] = {5, 33, 70};
  const int64_t ks[] = {7, 100, 576, 1536};
  const int64_t ns[] = {1, 3, 16, 17, 64};
  ThreadPool pool2(2), pool3(3);
  std::set<std::string> rows_run;
  uint64_t seed = 700;
  const int targets = ForEachTarget([&](const std::string& target) {
    for (const char* sv : specs) {
      const ValueSpec spec = *ValueSpec::Parse(sv);
      for (int64_t m : ms) {
        for (int64_t k : ks) {
          const std::vector<float> w0 = GroupSpreadWeights(m, k, spec.group, seed++);
          auto packed = cpu::PackDenseQuant(w0.data(), m, k, k, spec, "w");
          ASSERT_TRUE(packed.ok()) << packed.status().ToString();
          const cpu::PackedWeight& pw = *packed;
          const cpu::DenseQuantWeight& d = pw.dense_quant();
          std::vector<float> dense(size_t(m * k));
          for (int64_t r = 0; r < m; ++r) {
            for (int64_t c = 0; c < k; ++c) {
              dense[r * k + c] = Dequantized(d, r, c);
              // Round-to-nearest: within half a step of the source value.
              const double step = d.scales[r * d.groups_per_row + c / spec.group];
              ASSERT_LE(std::fabs(double(dense[r * k + c]) - w0[r * k + c]),
                        0.5 * step * (1 + 1e-6))
                  << sv << " r " << r << " c " << c;
            }
          }
          for (int64_t n : ns) {
            const std::vector<float> x = RandomVector(size_t(n * k), 31 + n);
            // Double reference of the dequantized weights. The kernels dequantize each weight with
            // the f32 expressions of quant.h (exactly the values above) and sum k FMA products in
            // f32 over lane partial sums and a log2(L) <= 4 step reduction: each output is a sum
            // of k terms with at most k + 4 roundings, so |y - ref| <= (k + 4) eps sum|w x|
            // <= (k + 4) eps k max|w| max|x| (abs_sum is sum|w x|; 2x margin).
            std::vector<double> want, abs_sum;
            testing_cpu::ReferenceForward(dense, m, k, x.data(), n, k, Epilogue{}, want, abs_sum);
            const double eps = std::numeric_limits<float>::epsilon();
            for (const auto& kern : cpu::KernelTable()) {
              if (!cpu::Declines(kern, pw, 0, Cfg(), true).empty()) continue;
              rows_run.insert(target + " " + kern.name);
              const std::string what = target + " " + sv + " " + kern.name +
                                       " m=" + std::to_string(m) + " k=" + std::to_string(k) +
                                       " n=" + std::to_string(n);
              const std::vector<float> y = RunRow(kern, pw, x, m, k, n, nullptr);
              for (int64_t i = 0; i < n * m; ++i) {
                ASSERT_LE(std::fabs(y[i] - want[i]), 2.0 * (k + 4) * eps * abs_sum[i] + 1e-30)
                    << what << " y[" << i << "]";
              }
              for (ThreadPool* p : {&pool2, &pool3}) {
                const std::vector<float> yt = RunRow(kern, pw, x, m, k, n, p);
                ASSERT_EQ(0, std::memcmp(y.data(), yt.data(), y.size() * 4)) << what << " threads";
              }
              const std::vector<float> again = RunRow(kern, pw, x, m, k, n, nullptr);
              ASSERT_EQ(0, std::memcmp(y.data(), again.data(), y.size() * 4)) << what << " repeat";
            }
          }
        }
      }
    }
  });
  EXPECT_GE(targets, 2);
  // Every dense quantized row ran on every supported target of its range.
  for (int64_t t : KernelConfig::SupportedTargets()) {
    for (const auto& kern : cpu::KernelTable()) {
      if (kern.layout != cpu::KernelLayout::kDenseQuant) continue;
      if (kern.mode == cpu::KernelMode::kDecodeInt8X) continue;  // Int8XRowsStayWithin... below
      if (t < kern.best || t > kern.worst) continue;
      EXPECT_TRUE(rows_run.count(std::string(hwy::TargetName(t)) + " " + kern.name))
          << kern.name << " never ran on " << hwy::TargetName(t);
    }
  }
}

// The dense int8-X decode rows (dense_x8-inl.h, KernelConfig::int8_activations): X rounded to int8
// per block of 32 columns, s_b = max |x| / 127 of the block. Against the double product of the
// dequantized weights and the f32 X, each output is within the rounding of X, sum over columns of
// |w| * s_b / 2 (the int32 dot products are exact), plus the f32 rounding of the epilogue: per step
// (64 columns on AVX3_DL, 32 on AVX2) and lane code x sum * (s_b * scale), accumulated over the
// steps, the offsets (min, or -8 * scale) times each group's f32 sum of rounded x over the groups
// (16 or 8 a vector), the lanes summed: at most k_pad / 32 + groups / 8 + 20 roundings of terms bounded by (max |code| |scale| + |offset|) (|x| +
// s_b) per column (4x margin). On each other target the rows decline and say where they run.
TEST(DenseQuantTest, Int8XRowsStayWithinTheRoundingOfX) {
  const char* specs[] = {"int8:g32", "int8:g128", "int4:g32", "int4:g64", "int4:g32:sym",
                         "int4:g128:sym"};
  // k: below a chunk (7), a short last block (48: the second 32-column block is half a step's),
  // a group-tail (100), the model's 576 and 1536.
  const int64_t ms[] = {1, 5, 33};
  const int64_t ks[] = {7, 48, 100, 576, 1536};
  const int64_t ns[] = {1, 2, 5, 16};
  ThreadPool pool2(2), pool3(3);
  std::set<std::string> rows_run;
  int rounded = 0;  // outputs where the int8-X row differs from the f32-X row: it rounded X
  uint64_t seed = 1700;
  const int targets = ForEachTarget([&](const std::string& target) {
    testing_cpu::MutableCfg().int8_activations = true;
    for (const char* sv : specs) {
      const ValueSpec spec = *ValueSpec::Parse(sv);
      for (int64_t m : ms) {
        for (int64_t k : ks) {
          const std::vector<float> w0 = GroupSpreadWeights(m, k, spec.group, seed++);
          auto packed = cpu::PackDenseQuant(w0.data(), m, k, k, spec, "w");
          ASSERT_TRUE(packed.ok()) << packed.status().ToString();
          const cpu::PackedWeight& pw = *packed;
          const cpu::DenseQuantWeight& d = pw.dense_quant();
          std::vector<float> dense(size_t(m * k));
          for (int64_t r = 0; r < m; ++r) {
            for (int64_t c = 0; c < k; ++c) dense[r * k + c] = Dequantized(d, r, c);
          }
          const double qmax = spec.dtype == DType::kI8 ? 127 : 15;
          for (const auto& kern : cpu::KernelTable()) {
            if (kern.mode != cpu::KernelMode::kDecodeInt8X) continue;
            const std::string why = cpu::Declines(kern, pw, 0, Cfg(), true);
            if (!why.empty()) {
              if (kern.values == cpu::ValueKindOf(pw) && kern.layout == cpu::KernelLayout::kDenseQuant) {
                EXPECT_NE(why.find("runs on"), std::string::npos) << kern.name << ": " << why;
              }
              continue;
            }
            rows_run.insert(target + " " + kern.name);
            for (int64_t n : ns) {
              const std::string what = target + " " + sv + " " + kern.name + " m=" +
                                       std::to_string(m) + " k=" + std::to_string(k) +
                                       " n=" + std::to_string(n);
              std::vector<float> x = RandomVector(size_t(n * k), 60 + n);
              for (size_t i = 0; i < x.size(); i += 37) x[i] *= 30.0f;  // outlier channels
              const std::vector<float> y = RunRow(kern, pw, x, m, k, n, nullptr);
              for (ThreadPool* p : {&pool2, &pool3}) {
                const std::vector<float> yt = RunRow(kern, pw, x, m, k, n, p);
                ASSERT_EQ(0, std::memcmp(y.data(), yt.data(), y.size() * 4)) << what << " threads";
              }
              const double eps = std::numeric_limits<float>::epsilon();
              const double roundings = double((d.k_pad + 31) / 32 + d.groups_per_row / 8 + 20);
              for (int64_t t = 0; t < n; ++t) {
                const float* xt = x.data() + t * k;
                std::vector<double> sb(size_t((k + 31) / 32), 0.0);
                for (int64_t c = 0; c < k; ++c) {
                  sb[size_t(c / 32)] = std::max(sb[size_t(c / 32)], std::fabs(double(xt[c])) / 127);
                }
                for (int64_t r = 0; r < m; ++r) {
                  double want = 0, round_x = 0, f32 = 0;
                  for (int64_t c = 0; c < k; ++c) {
                    const double wv = dense[r * k + c];
                    want += wv * xt[c];
                    round_x += std::fabs(wv) * sb[size_t(c / 32)] / 2;
                    const int64_t g = r * d.groups_per_row + c / spec.group;
                    const double sc = std::fabs(double(d.scales[size_t(g)]));
                    const double off = spec.dtype == DType::kI8 ? 0
                                       : spec.has_min()        ? std::fabs(double(d.mins[size_t(g)]))
                                                               : 8 * sc;
                    f32 += (qmax * sc + off) * (std::fabs(double(xt[c])) + sb[size_t(c / 32)]);
                  }
                  const double got = y[size_t(t * m + r)];
                  const double bound = round_x * (1 + 1e-5) + 4 * eps * roundings * f32;
                  ASSERT_LE(std::fabs(got - want), bound)
                      << what << " t=" << t << " r=" << r << " got " << got << " want " << want;
                }
              }
              // A NaN in X gives NaN outputs.
              std::vector<float> xn = x;
              xn[size_t(k / 2)] = std::numeric_limits<float>::quiet_NaN();
              const std::vector<float> yn = RunRow(kern, pw, xn, m, k, n, nullptr);
              for (int64_t r = 0; r < m; ++r) EXPECT_TRUE(std::isnan(yn[size_t(r)])) << what;
              const cpu::KernelRow* twin = nullptr;
              for (const auto& row : cpu::KernelTable()) {
                if (row.layout == cpu::KernelLayout::kDenseQuant && row.values == kern.values &&
                    row.mode == cpu::KernelMode::kDecode) {
                  twin = &row;
                }
              }
              ASSERT_NE(twin, nullptr) << kern.name << " has no f32-X decode twin";
              const std::vector<float> yf = RunRow(*twin, pw, x, m, k, n, nullptr);
              for (size_t i = 0; i < y.size(); ++i) rounded += y[i] != yf[i];
            }
          }
          // Dispatch takes the row with the switch on (where it runs), never with it off.
          KernelConfig off = Cfg();
          off.int8_activations = false;
          EXPECT_NE(cpu::ChooseKernel(pw, 1, off).mode, cpu::KernelMode::kDecodeInt8X) << sv;
          if (target == "AVX3_DL" || target == "AVX2") {
            const cpu::KernelRow& on = cpu::ChooseKernel(pw, 1, Cfg());
            EXPECT_EQ(on.mode, cpu::KernelMode::kDecodeInt8X) << sv << " got " << on.name;
            EXPECT_EQ(cpu::ChooseKernel(pw, 17, Cfg()).mode, cpu::KernelMode::kTiled) << sv;
          }
        }
      }
    }
    testing_cpu::MutableCfg().int8_activations = false;
  });
  EXPECT_GE(targets, 2);
  // Every dense int8-X row ran on its target where the CPU has it (AVX3_DL, AVX2).
  size_t want = 0;
  for (int64_t t : KernelConfig::SupportedTargets()) {
    for (const auto& kern : cpu::KernelTable()) {
      if (kern.layout != cpu::KernelLayout::kDenseQuant ||
          kern.mode != cpu::KernelMode::kDecodeInt8X || t < kern.best || t > kern.worst) {
        continue;
      }
      ++want;
      EXPECT_TRUE(rows_run.count(std::string(hwy::TargetName(t)) + " " + kern.name))
          << kern.name << " never ran on " << hwy::TargetName(t);
    }
  }
  EXPECT_EQ(rows_run.size(), want);
  EXPECT_GE(want, 3u) << "no target of this CPU ran the dense int8-X rows (AVX2 or AVX3_DL)";
  EXPECT_GT(rounded, 0) << "the int8-X rows gave the f32 rows' bits everywhere: X was not rounded";
}

// Stored codes in the file formats' conventions for a [rows, cols] weight: each group holds its
// spec's extreme codes (so round-to-nearest of the dequantized values finds the same scale) and
// random codes between; f16 scales (and mins) with few mantissa bits, so that 15 * scale + min and
// the scale's recovery from the extremes are exact in f32.
struct StoredCodes {
  std::vector<uint8_t> codes;
  std::vector<uint16_t> scales, mins;
};
StoredCodes MakeStored(const ValueSpec& spec, int64_t rows, int64_t cols, uint64_t seed) {
  const int64_t groups = (cols + spec.group - 1) / spec.group;
  const bool i8 = spec.dtype == DType::kI8;
  StoredCodes s;
  s.codes.assign(size_t(rows * (i8 ? cols : (cols + 1) / 2)), 0);
  const std::vector<float> u = RandomVector(size_t(rows * cols + 2 * rows * groups), seed);
  size_t ui = 0;
  auto uniform = [&]() { return 0.5 * (u[ui++] + 1.0); };  // [0, 1)
  const int lo = MinCode(spec), hi = MaxCode(spec);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const int e = int(r + g) % 6;
      const float scale = std::ldexp(1.0f + std::floor(float(uniform()) * 64) / 64, -4 - e);
      s.scales.push_back(F32ToF16(scale));
      if (spec.has_min()) {
        s.mins.push_back(F32ToF16(-std::floor(float(uniform()) * 64) / 8 * scale));
      }
    }
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t in_group = c % spec.group;
      // Both extremes open each group (the shapes below leave no one-column group).
      int q = std::min(hi, lo + int(uniform() * (hi - lo + 1)));
      if (in_group == 0) q = hi;
      if (in_group == 1) q = lo;
      if (i8) {
        s.codes[r * cols + c] = static_cast<uint8_t>(static_cast<int8_t>(q));
      } else {
        uint8_t& b = s.codes[r * ((cols + 1) / 2) + c / 2];
        b = static_cast<uint8_t>(b | ((q & 0x0F) << (c % 2 ? 4 : 0)));
      }
    }
  }
  return s;
}

TEST(DenseQuantTest, PackingFromCodesEqualsRoundToNearestOfTheDequantizedValues) {
  // Q8_0 = int8:g32, Q4_0 = int4:g32:sym, Q4_1 = int4:g32 (GGUF), and the other group sizes.
  const char* specs[] = {"int8:g32", "int4:g32:sym", "int4:g32", "int8:g64", "int4:g128"};
  const int64_t shapes[][2] = {{3, 576}, {5, 1536}, {4, 100}, {2, 34}};
  uint64_t seed = 900;
  for (const char* sv : specs) {
    const ValueSpec spec = *ValueSpec::Parse(sv);
    for (const auto& sh : shapes) {
      const int64_t rows = sh[0], cols = sh[1];
      const StoredCodes s = MakeStored(spec, rows, cols, seed++);
      auto from_codes = cpu::PackDenseQuantCodes(
          rows, cols, spec, s.codes.data(), int64_t(s.codes.size()), s.scales.data(),
          spec.has_min() ? s.mins.data() : nullptr, int64_t(s.scales.size()), "w");
      ASSERT_TRUE(from_codes.ok()) << sv << ": " << from_codes.status().ToString();
      const cpu::DenseQuantWeight& a = from_codes->dense_quant();
      // The dequantized values, from the stored codes and quant.h's Dequantize.
      std::vector<float> dq(size_t(rows * cols));
      const int64_t groups = (cols + spec.group - 1) / spec.group;
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          const int64_t gi = r * groups + c / spec.group;
          const QuantGroup g =
              QuantGroupFromF16(s.scales[gi], spec.has_min() ? s.mins[gi] : 0, spec);
          const int q = spec.dtype == DType::kI8
                            ? static_cast<int8_t>(s.codes[r * cols + c])
                            : (s.codes[r * ((cols + 1) / 2) + c / 2] >> (c % 2 ? 4 : 0)) & 0x0F;
          dq[r * cols + c] = Dequantize(q, g, spec);
          ASSERT_EQ(Dequantized(a, r, c), dq[r * cols + c]) << sv << " r " << r << " c " << c;
        }
      }
      auto from_f32 = cpu::PackDenseQuant(dq.data(), rows, cols, cols, spec, "w");
      ASSERT_TRUE(from_f32.ok()) << from_f32.status().ToString();
      const cpu::DenseQuantWeight& b = from_f32->dense_quant();
      const std::string what =
          std::string(sv) + " " + std::to_string(rows) + "x" + std::to_string(cols);
      EXPECT_EQ(a.scales, b.scales) << what;
      EXPECT_EQ(a.mins, b.mins) << what;
      ASSERT_EQ(a.codes.nbytes(), b.codes.nbytes()) << what;
      EXPECT_EQ(0, std::memcmp(a.codes.data(), b.codes.data(), a.codes.nbytes())) << what;
      EXPECT_EQ(from_codes->weight_bytes, from_f32->weight_bytes);
    }
  }
}

TEST(DenseQuantTest, FromDenseQuantRunsAsStoredAndChecksSizes) {
  const ValueSpec spec = *ValueSpec::Parse("int4:g32");  // Q4_1
  const int64_t rows = 9, cols = 576;
  const StoredCodes s = MakeStored(spec, rows, cols, 77);
  auto lw =
      LinearWeight::FromDenseQuant(rows, cols, spec, s.codes, s.scales, s.mins, "tok_emb", Cfg());
  ASSERT_TRUE(lw.ok()) << lw.status().ToString();
  EXPECT_EQ(lw->format(), "dense int4:g32");
  // Codes (half a byte each, padded to 16 columns) plus an f16 scale and min per 32 columns.
  EXPECT_EQ(lw->weight_bytes(), uint64_t(rows * 576 / 2 + rows * 18 * 8));  // f32 scale + min
  for (int64_t n : {1, 40}) {
    EXPECT_NE(lw->kernel_name(n).find("i4_dense_"), std::string::npos) << lw->kernel_name(n);
    const std::vector<float> x = RandomVector(size_t(n * cols), 5);
    std::vector<float> y(size_t(n * rows));
    lw->Forward(x.data(), n, y.data(), nullptr);
    const cpu::DenseQuantWeight* d = nullptr;
    auto packed =
        cpu::PackDenseQuantCodes(rows, cols, spec, s.codes.data(), int64_t(s.codes.size()),
                                 s.scales.data(), s.mins.data(), int64_t(s.scales.size()), "w");
    ASSERT_TRUE(packed.ok());
    d = &packed->dense_quant();
    std::vector<float> dense(size_t(rows * cols));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) dense[r * cols + c] = Dequantized(*d, r, c);
    }
    std::vector<double> want, abs_sum;
    testing_cpu::ReferenceForward(dense, rows, cols, x.data(), n, cols, Epilogue{}, want, abs_sum);
    const double eps = std::numeric_limits<float>::epsilon();
    for (int64_t i = 0; i < n * rows; ++i) {  // tolerance as in the row test above
      ASSERT_LE(std::fabs(y[i] - want[i]), 2.0 * (cols + 4) * eps * abs_sum[i] + 1e-30) << i;
    }
  }
  // Wrong sizes are errors naming the weight and the part.
  std::vector<uint8_t> short_codes(s.codes.begin(), s.codes.end() - 1);
  auto bad = LinearWeight::FromDenseQuant(rows, cols, spec, short_codes, s.scales, s.mins,
                                          "tok_emb", Cfg());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("tok_emb.codes"), std::string::npos)
      << bad.status().ToString();
  bad = LinearWeight::FromDenseQuant(rows, cols, spec, s.codes, s.scales, {}, "tok_emb", Cfg());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("tok_emb.mins"), std::string::npos);
  bad = LinearWeight::FromDenseQuant(rows, cols, *ValueSpec::Parse("bf16"), s.codes, s.scales,
                                     s.mins, "tok_emb", Cfg());
  EXPECT_FALSE(bad.ok());
}

}  // namespace
}  // namespace sparq
