// Quantized (int8 / int4) N:M values (tests/quant: the value spec and group quantization): every
// i8 / i4 row of the kernel table on every compiled target against (a) the f32 row of the same
// layout on the dequantized weights, bit for bit (the kernels dequantize with the expressions of
// sparq/quant.h, so the products are those of the dequantized f32 weights), and (b) the double
// reference of the dequantized weights; bits for 1..3 threads.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <string>

#include "sparq/quant.h"
#include "src/cpu/kernel_entry.h"
#include "src/cpu/spmm.h"
#include "tests/cpu/spmm_testutil.h"

namespace sparq {
namespace {

using testing_cpu::Cfg;
using testing_cpu::ForEachTarget;
using testing_cpu::RandomVector;
using testing_cpu::RunRow;
using testing_cpu::RowNamed;


struct QCase {
  std::string pattern;
  std::string values;
};

// The packed quantized weight, and the dense f32 of its dequantized values at its kept positions.
struct QBuilt {
  cpu::PackedWeight q;     // quantized
  cpu::PackedWeight f;     // f32 N:M of the dequantized weights (same positions)
  std::vector<float> dense;
};

// Code of value j of row r, read from the packed bytes as spmm_packed.h documents them (int8: one
// byte per value; int4: 8 bytes per chunk of 16, byte b holding value b low and value b + 8 high).
int PackedCode(const cpu::NmWeight& nm, int64_t r, int64_t j) {
  const int64_t row_vals = nm.chunks * cpu::kNmChunk;
  if (nm.spec.dtype == DType::kI8) return nm.values.data_as<int8_t>()[r * row_vals + j];
  const uint8_t byte = nm.values.data_as<uint8_t>()[r * row_vals / 2 + (j / 16) * 8 + (j % 8)];
  return (j % 16) < 8 ? (byte & 0x0F) : (byte >> 4);
}

// The value of a code, computed here from quant.h's formulas (not through NmWeight::Value).
float Dequantized(const cpu::NmWeight& nm, int64_t r, int64_t j) {
  const int q = PackedCode(nm, r, j);
  const int64_t g = r * nm.groups_per_row + j / nm.spec.group;
  if (nm.spec.dtype == DType::kI8) return float(q) * nm.scales[g];
  if (!nm.spec.has_min()) return float(q - 8) * nm.scales[g];
  return std::fma(float(q), nm.scales[g], nm.mins[g]);
}

// Test weights with what real ones have and uniform ones lack: group magnitudes spread over 2^0..
// 2^6 by quantization group (a neighbouring group's scale, wherever misapplied, is off by 2x or
// more), and exact zeros in kept slots (an N:M group with fewer than N nonzeros).
std::vector<float> QuantTestWeights(const Pattern& p, const ValueSpec& spec, int64_t m, int64_t k,
                                    uint64_t seed) {
  std::vector<float> w = testing_cpu::PatternWeights(p, m, k, seed);
  const int64_t cols_per_group = int64_t{spec.group} / p.n * p.m;  // every m-group keeps n slots
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t c = 0; c < k; ++c) w[r * k + c] = std::ldexp(w[r * k + c], int((c / cols_per_group) % 7));
    // In every third group of m (shifted by row), the first nonzero becomes 0; it stays a kept slot.
    for (int64_t g0 = (r % 3) * p.m; g0 < k; g0 += 3 * p.m) {
      for (int64_t c = g0; c < std::min(k, g0 + p.m); ++c) {
        if (w[r * k + c] != 0.0f) {
          w[r * k + c] = 0.0f;
          break;
        }
      }
    }
  }
  return w;
}

QBuilt BuildQ(const QCase& c, int64_t m, int64_t k, uint64_t seed) {
  const Pattern p = *Pattern::Parse(c.pattern);
  const ValueSpec spec = *ValueSpec::Parse(c.values);
  const std::vector<float> w = QuantTestWeights(p, spec, m, k, seed);
  auto s = Encode(w, m, k, FormatKind::kNM, p, DType::kF32);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  cpu::PackOptions opt;
  opt.values = spec;
  auto q = cpu::Pack(*s, "w", opt);
  EXPECT_TRUE(q.ok()) << c.pattern << " " << c.values << ": " << q.status().ToString();
  QBuilt b;
  b.q = std::move(q).value();
  const cpu::NmWeight& nm = b.q.nm();
  EXPECT_EQ(nm.spec.Name(), spec.Name());
  b.dense.assign(size_t(m * k), 0.0f);
  std::vector<uint8_t> slot(size_t(m * k), 0);
  int kept_zeros = 0;
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t ch = 0; ch < nm.chunks; ++ch) {
      for (int j = 0; j < cpu::kNmChunk; ++j) {
        const int64_t col = nm.Col(r, ch, j);
        if (col >= k) continue;
        const int64_t vj = ch * cpu::kNmChunk + j;
        const float d = Dequantized(nm, r, vj);
        // NmWeight::Value (what the kernels' tests and --explain read) agrees bit for bit.
        EXPECT_EQ(nm.Value(r, vj), d) << c.pattern << " " << c.values << " row " << r;
        b.dense[r * k + col] = d;
        slot[r * k + col] = 1;
        const float scale = nm.scales[r * nm.groups_per_row + vj / nm.spec.group];
        // Round to nearest on the group's grid: within half a step (plus one f32 rounding of the
        // dequantization, an ulp of the value).
        EXPECT_LE(std::fabs(double(d) - w[r * k + col]),
                  0.5 * double(scale) + std::ldexp(std::fabs(double(d)), -23))
            << c.pattern << " " << c.values << " row " << r << " col " << col;
        if (w[r * k + col] == 0.0f) {
          ++kept_zeros;
          // quant.h: exact 0 on symmetric grids; with a min, the grid value nearest 0.
          if (!nm.spec.has_min()) {
            EXPECT_EQ(d, 0.0f) << c.values << " row " << r << " col " << col;
          } else {
            const float mn = nm.mins[r * nm.groups_per_row + vj / nm.spec.group];
            float best = std::numeric_limits<float>::infinity();
            for (int code = 0; code <= 15; ++code) {
              best = std::min(best, std::fabs(std::fma(float(code), scale, mn)));
            }
            EXPECT_EQ(std::fabs(d), best) << c.values << " row " << r << " col " << col;
          }
        }
      }
    }
  }
  EXPECT_GT(kept_zeros, 0) << "no kept slot held 0: the zero semantics went unchecked";
  // The mask survives: every nonzero weight has a slot, and no m-group has more than n slots.
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t g0 = 0; g0 < k; g0 += p.m) {
      int slots = 0;
      for (int64_t col = g0; col < std::min(k, g0 + p.m); ++col) {
        slots += slot[r * k + col];
        if (w[r * k + col] != 0.0f) {
          EXPECT_TRUE(slot[r * k + col]) << "row " << r << " col " << col;
        }
        if (!slot[r * k + col]) {
          EXPECT_EQ(b.dense[r * k + col], 0.0f);
        }
      }
      EXPECT_LE(slots, p.n) << "row " << r << " group at " << g0;
    }
  }
  // The f32 twin: the same packed positions (meta) with the dequantized values. (Re-encoding the
  // dense matrix could move a kept value that quantized to 0 to another lane of its group, which
  // changes the decode's lane sums by an ulp.) Padding lanes (col >= k) keep their dequantized
  // values: they multiply X's zero padding.
  b.f = b.q;
  cpu::NmWeight& f = b.f.nm();
  f.values = Tensor::Alloc(DType::kF32, {m, nm.chunks * cpu::kNmChunk});
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t j = 0; j < nm.chunks * cpu::kNmChunk; ++j) {
      f.values.mutable_data_as<float>()[r * nm.chunks * cpu::kNmChunk + j] = Dequantized(nm, r, j);
    }
  }
  f.spec = ValueSpec{};  // f32
  f.scales.clear();
  f.mins.clear();
  return b;
}

// A checkpoint's quantized N:M matrix packs straight from its stored indices and codes (no f32
// twin): every value of the packed layout sits at the column the stored stream names (read here
// bit by bit) and dequantizes to the stored value (NmMatrix::StoredValuesF32) bit for bit, for
// index widths of 1-4 bits (m = 2, 4, 8, 16: streams copied whole, or index by index), rows and
// tails of every length, and stream padding bits set (no lane's index).
TEST(QuantNmTest, StoredCodesPackAtTheirStoredColumnsWithTheirStoredValues) {
  const char* patterns[] = {"1:2", "2:4", "1:4", "4:8", "8:16", "4:16"};
  const char* specs[] = {"int8:g32", "int4:g64", "int4:g128:sym"};
  for (const char* pat : patterns) {
    for (const char* sp : specs) {
      for (const int64_t k : {int64_t{64}, int64_t{203}, int64_t{530}}) {
        const Pattern p = *Pattern::Parse(pat);
        const ValueSpec spec = *ValueSpec::Parse(sp);
        const int64_t rows = 5;
        const std::vector<float> w = QuantTestWeights(p, spec, rows, k, 7);
        auto f = NmMatrix::FromDense(w, rows, k, p.n, p.m);
        ASSERT_TRUE(f.ok()) << f.status().ToString();
        auto q = NmMatrix::Quantize(*f, spec);
        ASSERT_TRUE(q.ok()) << pat << " " << sp << ": " << q.status().ToString();
        NmMatrix s = std::move(q).value();
        const int bits = std::bit_width(unsigned(p.m - 1));
        const int64_t per_row = s.groups() * p.n;
        const int64_t row_bytes = s.meta.numel() / rows;
        if (const int64_t used = per_row * bits; used % 8 != 0) {
          for (int64_t r = 0; r < rows; ++r) {
            s.meta.mutable_data_as<uint8_t>()[r * row_bytes + row_bytes - 1] |=
                static_cast<uint8_t>(0xFF << (used % 8));
          }
        }
        ASSERT_TRUE(s.Validate("w").ok());
        const Tensor stored = s.StoredValuesF32();
        cpu::PackOptions opt;
        opt.values = spec;
        auto packed = cpu::Pack(SparseMatrix(s), "w", opt);
        ASSERT_TRUE(packed.ok()) << pat << " " << sp << ": " << packed.status().ToString();
        const cpu::NmWeight& nm = packed->nm();
        ASSERT_EQ(nm.spec.Name(), spec.Name());
        const std::string what = std::string(pat) + " " + sp + " k " + std::to_string(k);
        for (int64_t r = 0; r < rows; ++r) {
          const uint8_t* mrow = s.meta.data_as<uint8_t>() + r * row_bytes;
          for (int64_t j = 0; j < nm.chunks * cpu::kNmChunk; ++j) {
            const int64_t col = nm.Col(r, j / cpu::kNmChunk, int(j % cpu::kNmChunk));
            if (j >= per_row) {
              EXPECT_GE(col, k) << what << ": padding lane " << j << " of row " << r;
              continue;
            }
            int idx = 0;
            for (int b = 0; b < bits; ++b) {
              const int64_t bit = j * bits + b;
              idx |= ((mrow[bit / 8] >> (bit % 8)) & 1) << b;
            }
            ASSERT_EQ(col, (j / p.n) * p.m + idx) << what << " row " << r << " value " << j;
            if (col < k) {
              EXPECT_EQ(Dequantized(nm, r, j), stored.data_as<float>()[r * per_row + j])
                  << what << " row " << r << " value " << j;
            }
          }
        }
      }
    }
  }
}

TEST(QuantNmTest, EveryQuantizedRowHasTheBitsOfF32OnTheDequantizedWeights) {
  const QCase cases[] = {{"2:4", "int8:g64"},  {"2:4", "int4:g64"},   {"2:4", "int4:g32:sym"},
                         {"2:4", "int8:g128"}, {"1:4", "int4:g128"},  {"4:8", "int8:g32"},
                         {"8:16", "int4:g64"}, {"2:4", "int4:g128:sym"}, {"1:4", "int8:g64"}};
  // k: below / at / past a chunk (16 kept of 2:4 = 32 columns), groups with a short tail (576: 288
  // kept = 4.5 groups of 64), and one past the k blocks; n: decode, its token blocks, the tiles.
  const int64_t ms[] = {1, 5, 33};
  const int64_t ks[] = {7, 64, 65, 300, 576};
  const int64_t ns[] = {1, 2, 5, 16, 17, 65, 130};
  ThreadPool pool2(2), pool3(3);
  int targets = 0;
  std::set<std::string> rows_run;
  ForEachTarget([&](const std::string& target) {
    ++targets;
    uint64_t seed = 300;
    for (const QCase& c : cases) {
      for (int64_t m : ms) {
        for (int64_t k : ks) {
          const QBuilt b = BuildQ(c, m, k, seed++);
          for (const auto& kern : cpu::KernelTable()) {
            if (!cpu::Declines(kern, b.q, 0, Cfg(), true).empty()) continue;
            const std::string name = kern.name;
            const cpu::KernelRow* twin = RowNamed("f32" + name.substr(name.find('_')));
            ASSERT_NE(twin, nullptr) << name << " has no f32 row";
            ASSERT_TRUE(cpu::Declines(*twin, b.f, 0, Cfg(), true).empty()) << twin->name;
            rows_run.insert(target + " " + name);
            for (int64_t n : ns) {
              const std::string what = target + " " + c.pattern + " " + c.values + " " + name +
                                       " m=" + std::to_string(m) + " k=" + std::to_string(k) +
                                       " n=" + std::to_string(n);
              const std::vector<float> x = RandomVector(size_t(n * k), 9 + n);
              const std::vector<float> yq = RunRow(kern, b.q, x, m, k, n, nullptr);
              const std::vector<float> yf = RunRow(*twin, b.f, x, m, k, n, nullptr);
              for (size_t i = 0; i < yq.size(); ++i) {
                if (std::memcmp(&yq[i], &yf[i], 4) != 0) {
                  ADD_FAILURE() << what << ": y[" << i << "] " << yq[i] << " vs f32 twin " << yf[i];
                  break;
                }
              }
              for (ThreadPool* p : {&pool2, &pool3}) {
                const std::vector<float> yt = RunRow(kern, b.q, x, m, k, n, p);
                ASSERT_EQ(0, std::memcmp(yq.data(), yt.data(), yq.size() * 4)) << what << " threads";
              }
              // The double reference of the dequantized weights, tolerance as in spmm_test.cc
              // (k f32 roundings of partial sums bounded by sum |w x|).
              std::vector<double> want, abs_sum;
              testing_cpu::ReferenceForward(b.dense, m, k, x.data(), n, k, Epilogue{}, want, abs_sum);
              const double eps = std::numeric_limits<float>::epsilon();
              for (int64_t i = 0; i < n * m; ++i) {
                ASSERT_LE(std::fabs(yq[i] - want[i]), 2.0 * (k + 4) * eps * abs_sum[i] + 1e-30) << what;
              }
            }
          }
        }
      }
    }
  });
  EXPECT_GE(targets, 2);
  for (int64_t t : KernelConfig::SupportedTargets()) {  // each target ran quantized rows
    const std::string tn = std::string(hwy::TargetName(t)) + " ";
    EXPECT_TRUE(std::any_of(rows_run.begin(), rows_run.end(),
                            [&](const std::string& r) { return r.rfind(tn, 0) == 0; })) << tn << "ran no row";
  }
  // Every i8 / i4 row ran on some target (the __avx2 ones on AVX2, the generic ones elsewhere).
  for (const auto& kern : cpu::KernelTable()) {
    const std::string name = kern.name;
    if (name.rfind("i8_", 0) != 0 && name.rfind("i4_", 0) != 0) continue;
    if (kern.layout == cpu::KernelLayout::kDenseQuant) continue;  // dense_quant_test.cc
    if (kern.layout == cpu::KernelLayout::kMask) continue;        // mask_quant_test.cc
    if (kern.layout == cpu::KernelLayout::kRowGroups) continue;   // rowgroup_quant_test.cc
    if (kern.mode == cpu::KernelMode::kDecodeInt8X) continue;     // Int8XRowsStayWithin... below
    bool ran = false;
    for (const std::string& r : rows_run) {
      ran = ran || (r.size() > name.size() && r.compare(r.size() - name.size(), name.size(), name) == 0);
    }
    EXPECT_TRUE(ran) << name << " never ran";
  }
}

// The int8-X decode rows (nm_x8-inl.h, KernelConfig::int8_activations; AVX3_DL and AVX2): X
// rounded to int8 per block of 32 columns, scale s_b = max |x| / 127 of the block. Against the
// double product of the dequantized weights and the f32 X, each output is within the rounding of
// X, sum over kept weights of |w| * s_b / 2 (the int32 dot products are exact), plus the f32
// rounding of the per-step epilogue (t = q.x * scale + sum x * min, one rounding each, accumulated
// over the row's steps of 64 (AVX3_DL) or 32 (AVX2) kept weights and summed over 16 or 8 lanes),
// bounded by 4 eps (steps + 20) sum (15 |scale| + |min|) (|x| + s_b). A row declines on every
// target but its own, and says why.
TEST(QuantNmTest, Int8XRowsStayWithinTheRoundingOfX) {
  const QCase cases[] = {{"2:4", "int4:g64"}, {"2:4", "int4:g128"}, {"2:4", "int4:g64:sym"},
                         {"2:4", "int4:g128:sym"}};
  const int64_t ms[] = {1, 5, 33};
  const int64_t ks[] = {7, 64, 65, 300, 576};
  const int64_t ns[] = {1, 2, 5, 16};
  ThreadPool pool2(2), pool3(3);
  std::set<std::string> rows_run;
  int rounded = 0;  // outputs where the int8 row differs from the f32 row: it did round X
  const int targets = ForEachTarget([&](const std::string& target) {
    testing_cpu::MutableCfg().int8_activations = true;
    uint64_t seed = 900;
    for (const QCase& c : cases) {
      for (int64_t m : ms) {
        for (int64_t k : ks) {
          const QBuilt b = BuildQ(c, m, k, seed++);
          const cpu::NmWeight& nm = b.q.nm();
          for (const auto& kern : cpu::KernelTable()) {
            if (kern.mode != cpu::KernelMode::kDecodeInt8X) continue;
            if (kern.layout != cpu::KernelLayout::kNm24) continue;  // dense, mask: their own tests
            const std::string why = cpu::Declines(kern, b.q, 0, Cfg(), true);
            if (!why.empty()) {
              if (kern.values == cpu::ValueKindOf(b.q)) {
                EXPECT_NE(target, hwy::TargetName(kern.best)) << kern.name << ": " << why;
                EXPECT_NE(why.find("runs on"), std::string::npos) << kern.name << ": " << why;
              }
              continue;
            }
            rows_run.insert(target + " " + kern.name);
            for (int64_t n : ns) {
              const std::string what = target + " " + c.values + " " + kern.name + " m=" +
                                       std::to_string(m) + " k=" + std::to_string(k) +
                                       " n=" + std::to_string(n);
              std::vector<float> x = RandomVector(size_t(n * k), 40 + n);
              for (size_t i = 0; i < x.size(); i += 37) x[i] *= 30.0f;  // outlier channels
              const std::vector<float> y = RunRow(kern, b.q, x, m, k, n, nullptr);
              for (ThreadPool* p : {&pool2, &pool3}) {
                const std::vector<float> yt = RunRow(kern, b.q, x, m, k, n, p);
                ASSERT_EQ(0, std::memcmp(y.data(), yt.data(), y.size() * 4)) << what << " threads";
              }
              const double eps = std::numeric_limits<float>::epsilon();
              const int64_t steps = kern.best == HWY_AVX2 ? (nm.chunks + 1) / 2 : (nm.chunks + 3) / 4;
              for (int64_t t = 0; t < n; ++t) {
                const float* xt = x.data() + t * k;
                std::vector<double> sb(size_t((k + 31) / 32), 0.0);
                for (int64_t col = 0; col < k; ++col) {
                  sb[size_t(col / 32)] = std::max(sb[size_t(col / 32)], std::fabs(double(xt[col])) / 127);
                }
                for (int64_t r = 0; r < m; ++r) {
                  double want = 0, round_x = 0, f32 = 0;
                  for (int64_t col = 0; col < k; ++col) {
                    want += double(b.dense[r * k + col]) * xt[col];
                    round_x += std::fabs(double(b.dense[r * k + col])) * sb[size_t(col / 32)] / 2;
                  }
                  for (int64_t ch = 0; ch < nm.chunks; ++ch) {
                    for (int j = 0; j < cpu::kNmChunk; ++j) {
                      const int64_t col = nm.Col(r, ch, j);
                      if (col >= k) continue;  // padding: x is 0 there
                      const int64_t g = r * nm.groups_per_row + (ch * cpu::kNmChunk + j) / nm.spec.group;
                      const double mn = nm.spec.has_min() ? std::fabs(double(nm.mins[size_t(g)]))
                                                          : 8 * std::fabs(double(nm.scales[size_t(g)]));
                      f32 += (15 * std::fabs(double(nm.scales[size_t(g)])) + mn) *
                             (std::fabs(double(xt[col])) + sb[size_t(col / 32)]);
                    }
                  }
                  const double got = y[size_t(t * m + r)];
                  const double bound = round_x * (1 + 1e-5) + 4 * eps * double(steps + 20) * f32;
                  ASSERT_LE(std::fabs(got - want), bound)
                      << what << " t=" << t << " r=" << r << " got " << got << " want " << want;
                }
              }
              // A NaN in X gives NaN outputs (every row keeps weights in every 32-column block).
              if (k >= 64) {
                std::vector<float> xn = x;
                xn[size_t(k / 2)] = std::numeric_limits<float>::quiet_NaN();
                const std::vector<float> yn = RunRow(kern, b.q, xn, m, k, n, nullptr);
                for (int64_t r = 0; r < m; ++r) EXPECT_TRUE(std::isnan(yn[size_t(r)])) << what;
              }
              const cpu::KernelRow* twin = RowNamed(std::string(kern.values == cpu::ValueKind::kI4
                                                                    ? "i4" : "i4s") +
                                                    "_nm_m4_window_decode_4xT");
              ASSERT_NE(twin, nullptr);
              const std::vector<float> yf = RunRow(*twin, b.q, x, m, k, n, nullptr);
              for (size_t i = 0; i < y.size(); ++i) rounded += y[i] != yf[i];
            }
          }
          // Dispatch takes the row with the switch on (where it runs), never with it off.
          const cpu::KernelRow& on = cpu::ChooseKernel(b.q, 1, Cfg());
          KernelConfig off = Cfg();
          off.int8_activations = false;
          EXPECT_NE(cpu::ChooseKernel(b.q, 1, off).mode, cpu::KernelMode::kDecodeInt8X) << c.values;
          if (target == "AVX3_DL" || target == "AVX2") {
            EXPECT_EQ(on.mode, cpu::KernelMode::kDecodeInt8X) << c.values << " got " << on.name;
          }
        }
      }
    }
    testing_cpu::MutableCfg().int8_activations = false;
  });
  EXPECT_GE(targets, 2);
  // Each target the CPU has that an int8-X row serves ran both of its rows (i4, i4s).
  const auto& supported = KernelConfig::SupportedTargets();
  const auto has = [&](int64_t t) { return std::find(supported.begin(), supported.end(), t) != supported.end(); };
  size_t want = 0;
  for (int64_t t : {int64_t{HWY_AVX3_DL}, int64_t{HWY_AVX2}}) want += has(t) ? 2 : 0;
  EXPECT_EQ(rows_run.size(), want);
  if (want > 0) {
    EXPECT_GT(rounded, 0) << "the int8-X rows gave the f32 rows' bits everywhere: X was not rounded";
  } else {
    std::printf("no AVX3_DL or AVX2 on this CPU: the int8-X rows declined on every target (checked)\n");
  }
  // Groups of 32 kept values do not fit the rows' steps: each declines on its own target and says so.
  const QBuilt g32 = BuildQ({"2:4", "int4:g32"}, 4, 128, 7);
  for (const auto& kern : cpu::KernelTable()) {
    if (kern.mode != cpu::KernelMode::kDecodeInt8X || kern.values != cpu::ValueKind::kI4 ||
        kern.layout != cpu::KernelLayout::kNm24 || !has(kern.best)) {
      continue;
    }
    KernelConfig on = Cfg().WithTarget(kern.best);
    on.int8_activations = true;
    const std::string why = cpu::Declines(kern, g32.q, 1, on);
    EXPECT_NE(why.find("groups of 64 or more"), std::string::npos) << kern.name << ": " << why;
  }
}

TEST(QuantNmTest, LayoutsWithoutQuantizedKernelsAreErrorsNamingTheWeight) {
  const int64_t m = 8, k = 64;
  cpu::PackOptions opt;
  opt.values = *ValueSpec::Parse("int4:g64");
  // (dense packs quantized too: dense_quant_test.cc; CSR, V:N:M and BSR dequantized:
  // csr_quant_test.cc, rowgroup_quant_test.cc; 3:8's groups of 3 kept values do not fill a group
  // of 64)
  for (const char* pat : {"3:8"}) {
    const Pattern p = *Pattern::Parse(pat);
    const std::vector<float> w = testing_cpu::PatternWeights(p, m, k, 5);
    auto s = Encode(w, m, k, PickFormat(p), p, DType::kF32);
    ASSERT_TRUE(s.ok()) << pat;
    auto q = cpu::Pack(*s, "layers.0.w", opt);
    ASSERT_FALSE(q.ok()) << pat << " packed with int4 values";
    EXPECT_NE(q.status().message().find("layers.0.w"), std::string::npos) << q.status().ToString();
    EXPECT_NE(q.status().message().find("int4:g64"), std::string::npos) << q.status().ToString();
  }
  // A value beyond what an f16 scale holds names the tensor, row and group.
  const Pattern p = *Pattern::Parse("2:4");
  std::vector<float> w = testing_cpu::PatternWeights(p, m, k, 6);
  for (auto& v : w) v *= 1e9f;
  auto s = Encode(w, m, k, FormatKind::kNM, p, DType::kF32);
  ASSERT_TRUE(s.ok());
  auto q = cpu::Pack(*s, "layers.1.w", opt);
  ASSERT_FALSE(q.ok());
  EXPECT_NE(q.status().message().find("layers.1.w.values row 0 group 0"), std::string::npos)
      << q.status().ToString();
}

}  // namespace
}  // namespace sparq
