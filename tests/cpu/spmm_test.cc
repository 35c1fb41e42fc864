// Every kernel of the registry against the densified double reference, on every compiled Highway
// target: shape sweeps around the tile sizes, all formats and value types, epilogues, misaligned
// pointers, guard bytes, and bitwise thread-count invariance.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <set>

#include "src/cpu/kernel_entry.h"
#include "src/cpu/spmm.h"
#include "tests/cpu/spmm_testutil.h"

namespace sparq {
namespace {

using cpu::PackedWeight;
using cpu::SpmmArgs;
using testing_cpu::Cfg;
using testing_cpu::ForEachTarget;
using testing_cpu::RandomVector;

struct Case {
  FormatKind format;
  std::string pattern;
  DType dtype;
  CsrLayout layout = CsrLayout::kAuto;  // CSR / COO: column indices or bit mask
};

std::string Name(const Case& c) {
  const char* layout[] = {"", " (columns)", " (bitmask)"};
  return std::string(FormatName(c.format)) + " " + c.pattern + " " + std::string(DTypeName(c.dtype)) +
         layout[static_cast<int>(c.layout)];
}

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    cases.push_back({FormatKind::kDense, "dense", dt});
    cases.push_back({FormatKind::kNM, "2:4", dt});
    cases.push_back({FormatKind::kCsr, "unstructured:0.7", dt});
    cases.push_back({FormatKind::kBsr, "block:4x4:0.5", dt});
    cases.push_back({FormatKind::kVNM, "vnm:8:2:4", dt});
  }
  for (DType dt : {DType::kF32, DType::kBF16}) {
    cases.push_back({FormatKind::kNM, "1:4", dt});
    cases.push_back({FormatKind::kNM, "4:8", dt});
    cases.push_back({FormatKind::kNM, "8:16", dt});
    cases.push_back({FormatKind::kNM, "3:8", dt});  // packed as CSR (3 does not divide 16)
    cases.push_back({FormatKind::kCoo, "unstructured:0.9", dt});
    cases.push_back({FormatKind::kCsr, "unstructured:0.0", dt});
    cases.push_back({FormatKind::kCsr, "unstructured:1.0", dt});
    cases.push_back({FormatKind::kBsr, "block:1x8:0.5", dt});
    cases.push_back({FormatKind::kBsr, "block:8x1:0.5", dt});
    cases.push_back({FormatKind::kBsr, "block:2x3:0.5", dt});
    cases.push_back({FormatKind::kBsr, "block:3x2:0.5", dt});
    cases.push_back({FormatKind::kBsr, "block:16x16:0.7", dt});
    cases.push_back({FormatKind::kVNM, "vnm:2:2:4", dt});
    cases.push_back({FormatKind::kVNM, "vnm:6:1:4", dt});
    // Both CSR layouts at densities on either side of kMaskMinDensity, and the extremes.
    for (const char* pat : {"unstructured:0.0", "unstructured:0.5", "unstructured:0.95", "unstructured:1.0"}) {
      cases.push_back({FormatKind::kCsr, pat, dt, CsrLayout::kColumns});
      cases.push_back({FormatKind::kCsr, pat, dt, CsrLayout::kBitmask});
    }
    cases.push_back({FormatKind::kCoo, "unstructured:0.6", dt, CsrLayout::kBitmask});
  }
  for (DType dt : {DType::kF32, DType::kBF16}) cases.push_back({FormatKind::kBsr, "block:2x2:0.5", dt});
  return cases;
}

struct Built {
  std::vector<float> dense;  // what the format stores, as f32
  PackedWeight packed;
};

Built Build(const Case& c, int64_t m, int64_t k, uint64_t seed) {
  auto p = Pattern::Parse(c.pattern);
  EXPECT_TRUE(p.ok()) << c.pattern;
  std::vector<float> w = testing_cpu::PatternWeights(*p, m, k, seed);
  auto s = Encode(w, m, k, c.format, *p, c.dtype);
  EXPECT_TRUE(s.ok()) << Name(c) << ": " << s.status().ToString();
  Built b;
  b.dense = testing_cpu::Densify(*s);
  auto pw = cpu::Pack(*s, "w", cpu::PackOptions{c.layout, {}});
  EXPECT_TRUE(pw.ok()) << Name(c) << ": " << pw.status().ToString();
  if (pw.ok() && c.layout != CsrLayout::kAuto) {
    EXPECT_EQ(pw->kind(), c.layout == CsrLayout::kBitmask ? cpu::PackedKind::kMask
                                                            : cpu::PackedKind::kRowGroups) << Name(c);
  }
  b.packed = std::move(pw).value();
  return b;
}

// Tolerance: the kernels sum k products in f32 in some order; each rounding is at most eps/2
// relative to a partial sum bounded by sum|w x|, so |error| <= k * eps * sum|w x| (+ a few eps for
// bias, activation and residual, whose slopes are <= 1.13). Values are exact in both (bf16 / f16
// are widened exactly), so that bound, with a factor 2 margin, is the tolerance.
void ExpectClose(const std::vector<double>& want, const std::vector<double>& abs_sum,
                 const float* y, int64_t n, int64_t m, int64_t ldy, int64_t k,
                 const std::string& what) {
  const double eps = std::numeric_limits<float>::epsilon();
  int bad = 0;
  for (int64_t t = 0; t < n && bad < 5; ++t) {
    for (int64_t r = 0; r < m && bad < 5; ++r) {
      const double tol = 2.0 * (k + 4) * eps * abs_sum[t * m + r] + 1e-30;
      const double got = y[t * ldy + r];
      if (!(std::fabs(got - want[t * m + r]) <= tol)) {
        ADD_FAILURE() << what << ": y[" << t << "][" << r << "] = " << got << ", want "
                      << want[t * m + r] << " (tol " << tol << ")";
        ++bad;
      }
    }
  }
}

constexpr float kGuard = -12345.0f;

// Y (n x m, dense rows) of kernel `kern` on X (n x k) with the default config, for bit comparisons.
std::vector<float> RunPlain(const cpu::KernelRow& kern, const Built& b, const std::vector<float>& x,
                            int64_t m, int64_t k, int64_t n, ThreadPool* pool) {
  SpmmArgs a;
  a.cfg = &Cfg();
  a.x = x.data();
  a.n = n;
  a.ldx = k;
  std::vector<float> y(size_t(n * m), kGuard);
  a.y = y.data();
  a.ldy = m;
  kern.Run(b.packed, a, pool);
  return y;
}

// Runs kernel `kern` with X misaligned by one float and Y inside a guarded buffer.
// The plain reference as a table row's run function.
void RunReference(const cpu::KernelRow&, const cpu::PackedWeight& w, const cpu::SpmmArgs& a,
                  ThreadPool* pool) {
  cpu::SpmmReference(w, a, pool);
}

void RunAndCheck(const cpu::KernelRow& kern, const Built& b, int64_t m, int64_t k, int64_t n,
                 const Epilogue& ep, ThreadPool* pool, const std::string& what) {
  const int64_t ldx = k + 3, ldy = m + 2;
  std::vector<float> xbuf = RandomVector(size_t(n * ldx + 1), 7 + n);
  const float* x = xbuf.data() + 1;
  std::vector<float> ybuf(size_t(n * ldy + 2 * 16 + 1), kGuard);
  float* y = ybuf.data() + 17;
  SpmmArgs a;
  a.cfg = &Cfg();
  a.x = x;
  a.n = n;
  a.ldx = ldx;
  a.y = y;
  a.ldy = ldy;
  a.ep = ep;
  kern.Run(b.packed, a, pool);
  std::vector<double> want, abs_sum;
  testing_cpu::ReferenceForward(b.dense, m, k, x, n, ldx, ep, want, abs_sum);
  ExpectClose(want, abs_sum, y, n, m, ldy, k, what);
  for (int64_t i = 0; i < 17; ++i) ASSERT_EQ(ybuf[i], kGuard) << what << ": write before Y";
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t r = m; r < ldy; ++r) ASSERT_EQ(y[t * ldy + r], kGuard) << what << ": write past row";
  }
  for (size_t i = 17 + n * ldy; i < ybuf.size(); ++i) ASSERT_EQ(ybuf[i], kGuard) << what << ": write after Y";
}

// The full case list on every compiled target this CPU supports (ForEachTarget): each target
// runs its own kernel bodies (the gather N:M decode's 1:4 and 4-lane 8:16 paths, bf16 4:8,
// 2-row groups with u16 indices, AVX2's 4x3 group tile...), which the default target never
// reaches. The test records which rows ran per case and target, prints the counts, and fails when
// a target ran no row for a case, a case ran no decode or no tiled row on a target, or a row
// (except the quantized ones: quant_nm_test.cc) never ran on a target its range includes.
TEST(SpmmTest, EveryKernelEveryFormatMatchesReference) {
  const int64_t ms[] = {1, 5, 33};
  const int64_t ks[] = {1, 7, 64, 65, 300};
  const int64_t ns[] = {1, 2, 17, 65};
  ThreadPool pool(2);
  const std::vector<Case> cases = AllCases();
  struct TargetRun {
    std::string name;
    int64_t target = 0;
    int64_t lanes = 0;  // f32 lanes of its vectors
    int64_t calls = 0;  // kernel calls checked against the reference
    double seconds = 0;
    std::map<std::string, std::set<std::string>> rows;  // case -> rows that ran it
    std::map<std::string, std::string> groups;          // row-group case -> "g=<rows> u16|u32"
  };
  std::vector<TargetRun> runs;
  ForEachTarget([&](const std::string& target) {
    TargetRun tr;
    tr.name = target;
    tr.target = Cfg().target;
    tr.lanes = cpu::LanesAt(Cfg());
    const auto t0 = std::chrono::steady_clock::now();
    uint64_t seed = 1;
    for (const Case& c : cases) {
      std::set<std::string>& rows = tr.rows[Name(c)];
      for (int64_t m : ms) {
        for (int64_t k : ks) {
          const Built b = Build(c, m, k, seed++);
          if (b.packed.kind() == cpu::PackedKind::kRowGroups && !b.packed.row_groups().implicit_cols) {
            tr.groups[Name(c)] = "g=" + std::to_string(b.packed.row_groups().g) +
                                 (b.packed.row_groups().idx16 ? " u16" : " u32");
          }
          for (const auto& kern : cpu::KernelTable()) {
            if (!cpu::Declines(kern, b.packed, 0, Cfg(), true).empty()) continue;
            rows.insert(kern.name);
            for (int64_t n : ns) {
              const std::string what = target + " " + Name(c) + " " + kern.name +
                                       " m=" + std::to_string(m) + " k=" + std::to_string(k) +
                                       " n=" + std::to_string(n);
              RunAndCheck(kern, b, m, k, n, Epilogue{}, &pool, what);
              ++tr.calls;
            }
          }
          // The reference walks the packed layout: checks packing independently of the kernels.
          const cpu::KernelRow reference{"reference", cpu::LayoutOf(b.packed), cpu::ValueKind::kF32,
                                         cpu::KernelMode::kBlas, "", 0, 0, 0, 0, RunReference,
                                         0, nullptr};
          RunAndCheck(reference, b, m, k, 3, Epilogue{}, nullptr, target + " " + Name(c) + " reference");
        }
      }
    }
    tr.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    runs.push_back(std::move(tr));
  });
  ASSERT_GE(runs.size(), 2u) << "at least one SIMD target and the emulated/scalar one";

  auto mode_of = [](const std::string& row) {
    for (const auto& kern : cpu::KernelTable()) {
      if (row == kern.name) return kern.mode;
    }
    return cpu::KernelMode::kBlas;
  };
  for (const TargetRun& tr : runs) {
    std::set<std::string> all_rows;
    for (const auto& [name, rows] : tr.rows) all_rows.insert(rows.begin(), rows.end());
    std::printf("[ coverage ] %-8s %zu cases, %lld kernel calls, %zu rows, %.1f s:", tr.name.c_str(),
                tr.rows.size(), static_cast<long long>(tr.calls), all_rows.size(), tr.seconds);
    for (const std::string& r : all_rows) std::printf(" %s", r.c_str());
    std::printf("\n");
    EXPECT_GT(tr.calls, 0) << tr.name << ": no kernel call";
    // Every case through a decode and a tiled row on every target (dense f32 and f16, widened to
    // f32, run OpenBLAS).
    for (const Case& c : cases) {
      const std::set<std::string>& rows = tr.rows.at(Name(c));
      EXPECT_FALSE(rows.empty()) << tr.name << " " << Name(c) << ": no row ran";
      if (c.format == FormatKind::kDense && c.dtype != DType::kBF16) {
        EXPECT_EQ(rows, std::set<std::string>{"f32_dense_blas"}) << tr.name << " " << Name(c);
        continue;
      }
      for (cpu::KernelMode mode : {cpu::KernelMode::kDecode, cpu::KernelMode::kTiled}) {
        bool ran = false;
        for (const std::string& r : rows) ran = ran || mode_of(r) == mode;
        EXPECT_TRUE(ran) << tr.name << " " << Name(c) << ": no "
                         << (mode == cpu::KernelMode::kDecode ? "decode" : "tiled") << " row ran";
      }
    }
    // Every row ran on every target of its range (the quantized rows need quantized values).
    for (const auto& kern : cpu::KernelTable()) {
      const std::string name = kern.name;
      if (name.rfind("i8_", 0) == 0 || name.rfind("i4", 0) == 0) continue;
      if (tr.target < kern.best || tr.target > kern.worst) continue;
      EXPECT_TRUE(all_rows.count(name)) << tr.name << ": " << name << " never ran";
    }
    // The bodies issue 43 found unreached off the default target, by the case and row that reach
    // them (the layout picks the body: gather N:M decode for 1:4 and, on 4-lane targets, 8:16;
    // 2-row groups of u16 indices for BSR 2x2 / 2x3 and V:N:M 2:2:4; AVX2's 4x3 tile for 3-row
    // blocks, packed as groups of 4, from 48 tokens: n = 65).
    auto groups_of = [&](const Case& c) {
      const auto it = tr.groups.find(Name(c));
      return it == tr.groups.end() ? std::string("not row groups") : it->second;
    };
    for (DType dt : {DType::kF32, DType::kBF16}) {
      for (const Case& c : {Case{FormatKind::kBsr, "block:2x2:0.5", dt},
                            Case{FormatKind::kBsr, "block:2x3:0.5", dt},
                            Case{FormatKind::kVNM, "vnm:2:2:4", dt}}) {
        EXPECT_EQ(groups_of(c), "g=2 u16") << tr.name << " " << Name(c);
      }
      EXPECT_EQ(groups_of({FormatKind::kBsr, "block:3x2:0.5", dt}), "g=4 u16") << tr.name;
    }
    if (&tr == &runs.front()) {  // the packing does not depend on the target
      std::printf("[ coverage ] row groups:");
      for (const auto& [name, g] : tr.groups) std::printf(" [%s: %s]", name.c_str(), g.c_str());
      std::printf("\n");
    }
    struct Want {
      Case c;
      const char* row;
    };
    // 8:16's window permute needs 8 lanes, 4:8's 4: on narrower targets the window rows decline
    // (and SCALAR has none), so the gather rows run.
    const bool wide8 = tr.lanes % 8 == 0;
    const Want wants[] = {
        {{FormatKind::kNM, "1:4", DType::kF32}, "f32_nm_m4_gather_decode_4xT"},
        {{FormatKind::kNM, "1:4", DType::kBF16}, "bf16_nm_m4_gather_decode_4xT"},
        {{FormatKind::kNM, "8:16", DType::kF32},
         wide8 ? "f32_nm_m16_window_decode_4xT" : "f32_nm_m16_gather_decode_4xT"},
        {{FormatKind::kNM, "8:16", DType::kBF16},
         wide8 ? "bf16_nm_m16_window_decode_4xT" : "bf16_nm_m16_gather_decode_4xT"},
        {{FormatKind::kNM, "4:8", DType::kBF16},
         tr.lanes % 4 == 0 ? "bf16_nm_m16_window_decode_4xT" : "bf16_nm_m16_gather_decode_4xT"},
        {{FormatKind::kBsr, "block:2x3:0.5", DType::kF32}, "f32_rowgroups_decode_Gx1"},
        {{FormatKind::kBsr, "block:2x3:0.5", DType::kBF16}, "bf16_rowgroups_tiled_GxNV"},
        {{FormatKind::kVNM, "vnm:2:2:4", DType::kF32}, "f32_rowgroups_tiled_GxNV"},
        {{FormatKind::kVNM, "vnm:2:2:4", DType::kBF16}, "bf16_rowgroups_decode_Gx1"},
        {{FormatKind::kBsr, "block:3x2:0.5", DType::kF32}, "f32_rowgroups_tiled_GxNV"},
        {{FormatKind::kBsr, "block:3x2:0.5", DType::kBF16}, "bf16_rowgroups_tiled_GxNV"},
        {{FormatKind::kBsr, "block:2x2:0.5", DType::kF32}, "f32_rowgroups_decode_Gx1"},
        {{FormatKind::kBsr, "block:2x2:0.5", DType::kBF16}, "bf16_rowgroups_tiled_GxNV"},
    };
    for (const Want& w : wants) {
      EXPECT_TRUE(tr.rows.at(Name(w.c)).count(w.row)) << tr.name << " " << Name(w.c) << ": " << w.row
                                                      << " did not run";
    }
    if (tr.target == HWY_AVX2) {
      for (const char* row : {"f32_rowgroups_tiled_4x3__avx2", "bf16_rowgroups_tiled_4x3__avx2"}) {
        const DType dt = row[0] == 'f' ? DType::kF32 : DType::kBF16;
        EXPECT_TRUE(tr.rows.at(Name({FormatKind::kBsr, "block:3x2:0.5", dt})).count(row))
            << "AVX2 block:3x2: " << row << " did not run";
      }
    }
  }
}

TEST(SpmmTest, AllTargetsAroundTileSizes) {
  // Shapes one below / at / above the vector widths (4, 8, 16 lanes), the 16-value N:M chunk,
  // the token tiles (16..64; N:M on AVX-512 also 128: n = 200; CSR's narrow 4- and 8-token tiles:
  // n = 3, 5, 8) and the k blocks (128..512 columns).
  const int64_t ms[] = {4, 9};
  const int64_t ks[] = {15, 16, 17, 129, 513};
  const int64_t ns[] = {1, 3, 5, 8, 15, 16, 31, 33, 64, 66, 200};
  const Case cases[] = {{FormatKind::kNM, "2:4", DType::kF32},
                        {FormatKind::kNM, "2:4", DType::kBF16},
                        {FormatKind::kNM, "4:8", DType::kF32},
                        {FormatKind::kCsr, "unstructured:0.9", DType::kBF16},
                        {FormatKind::kCsr, "unstructured:0.5", DType::kF32},
                        {FormatKind::kCsr, "unstructured:0.5", DType::kBF16, CsrLayout::kBitmask},
                        {FormatKind::kCsr, "unstructured:0.9", DType::kF32, CsrLayout::kBitmask},
                        {FormatKind::kCsr, "unstructured:0.5", DType::kF32, CsrLayout::kColumns},
                        {FormatKind::kBsr, "block:4x4:0.5", DType::kF32},
                        {FormatKind::kVNM, "vnm:4:2:4", DType::kBF16},
                        {FormatKind::kDense, "dense", DType::kBF16}};
  int targets_run = 0;
  ForEachTarget([&](const std::string& target) {
    // The dispatcher really runs the mocked target (not the best one).
    EXPECT_EQ(cpu::TargetNameAt(Cfg()), target);
    ++targets_run;
    uint64_t seed = 100;
    for (const Case& c : cases) {
      int64_t calls = 0;  // kernel calls of this case on this target
      for (int64_t m : ms) {
        for (int64_t k : ks) {
          const Built b = Build(c, m, k, seed++);
          for (const auto& kern : cpu::KernelTable()) {
            if (!cpu::Declines(kern, b.packed, 0, Cfg(), true).empty() || kern.mode == cpu::KernelMode::kBlas) continue;
            for (int64_t n : ns) {
              ++calls;
              RunAndCheck(kern, b, m, k, n, Epilogue{}, nullptr,
                          target + " " + Name(c) + " " + kern.name + " m=" + std::to_string(m) +
                              " k=" + std::to_string(k) + " n=" + std::to_string(n));
            }
          }
        }
      }
      EXPECT_GT(calls, 0) << target << " " << Name(c) << ": no kernel ran";
    }
  });
  EXPECT_GE(targets_run, 2);  // at least one SIMD target and the emulated/scalar one
}

// The bit-mask decode prefetches per row stream when rows average over 2 KiB (k = 2100 at 50%:
// 2.1 KiB of bf16 values, 4.2 KiB of f32), linearly otherwise; its prefetch positions index
// row_ptr up to the last row (m = 9: two blocks of 4 rows and a single row). Every target.
TEST(SpmmTest, MaskDecodeLongRowsMatchReference) {
  const int targets = ForEachTarget([&](const std::string& target) {
    uint64_t seed = 300;
    for (const Case& c :
         {Case{FormatKind::kCsr, "unstructured:0.5", DType::kF32, CsrLayout::kBitmask},
          Case{FormatKind::kCsr, "unstructured:0.5", DType::kBF16, CsrLayout::kBitmask}}) {
      int decode_calls = 0;
      for (int64_t k : {2100, 4200}) {
        const Built b = Build(c, 9, k, seed++);
        for (const auto& kern : cpu::KernelTable()) {
          if (!cpu::Declines(kern, b.packed, 0, Cfg(), true).empty()) continue;
          for (int64_t n : {1, 2, 3, 5, 12}) {
            decode_calls += kern.mode == cpu::KernelMode::kDecode;
            RunAndCheck(kern, b, 9, k, n, Epilogue{}, nullptr,
                        target + " " + Name(c) + " " + kern.name + " k=" + std::to_string(k) +
                            " n=" + std::to_string(n));
          }
        }
      }
      EXPECT_GT(decode_calls, 0) << target << " " << Name(c) << ": the mask decode never ran";
    }
  });
  EXPECT_GE(targets, 2);
}

TEST(SpmmTest, TiledLoopOrdersAndKBlocksMatchReference) {
  // The row-group tiled kernel runs task-outer (each task keeps its weights cached across the
  // token tiles) or tile-outer (one X^T tile stays cached while every task streams its weights
  // over it), chosen per call by the bytes each moves; both with several token tiles and k blocks
  // (k = 200 -> blocks of 64 columns), the column ranges of each block found once per call. Each
  // order, forced, must match the reference, and the two must give the same bits (the order
  // changes which tile runs when, not any sum). m = 300, n = 70 / 130: two / three 64-token tiles.
  // Tile-outer with several threads gives each thread whole tiles where they share evenly (2
  // tiles on 2 threads, 3 on 3) and splits each tile's tasks otherwise (3 on 2, 2 on 3): 1, 2 and
  // 3 threads must give the same bits.
  const int64_t m = 300, k = 200;
  ThreadPool pool(2), pool3(3);
  struct ResetOrder {
    ~ResetOrder() { testing_cpu::MutableCfg().tiled_order = TiledOrder::kAuto; }
  } reset;
  for (const Case& c : {Case{FormatKind::kVNM, "vnm:16:2:4", DType::kF32},
                        Case{FormatKind::kVNM, "vnm:8:2:4", DType::kBF16},
                        Case{FormatKind::kBsr, "block:16x16:0.5", DType::kF32},
                        Case{FormatKind::kBsr, "block:8x1:0.7", DType::kBF16},
                        Case{FormatKind::kDense, "dense", DType::kBF16},
                        Case{FormatKind::kCsr, "unstructured:0.9", DType::kF32, CsrLayout::kColumns},
                        Case{FormatKind::kCsr, "unstructured:0.99", DType::kBF16, CsrLayout::kColumns}}) {
    const Built b = Build(c, m, k, 21);
    int tiled_rows = 0;
    for (const auto& kern : cpu::KernelTable()) {
      if (!cpu::Declines(kern, b.packed, 0, Cfg(), true).empty()) continue;
      tiled_rows += kern.mode == cpu::KernelMode::kTiled;
      for (int64_t n : {70, 130}) {
        const std::vector<float> x = RandomVector(size_t(n * k), 5 + n);
        std::vector<std::vector<float>> ys;
        for (auto order : {TiledOrder::kAuto, TiledOrder::kTaskOuter,
                           TiledOrder::kTileOuter}) {
          testing_cpu::MutableCfg().tiled_order = order;
          const std::string what = Name(c) + " " + kern.name + " n=" + std::to_string(n) +
                                   " order=" + std::to_string(int(order));
          RunAndCheck(kern, b, m, k, n, Epilogue{}, &pool, what);
          SpmmArgs a;
          a.cfg = &Cfg();
          a.x = x.data();
          a.n = n;
          a.ldx = k;
          ys.emplace_back(size_t(n * m), kGuard);
          a.y = ys.back().data();
          a.ldy = m;
          kern.Run(b.packed, a, &pool);
          if (ys.size() > 1) {
            ASSERT_EQ(0, std::memcmp(ys[0].data(), ys.back().data(), ys[0].size() * sizeof(float)))
                << what << ": bits differ from the automatic order's";
          }
          for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool3}) {
            std::vector<float> y(size_t(n * m), kGuard);
            a.y = y.data();
            kern.Run(b.packed, a, p);
            ASSERT_EQ(0, std::memcmp(ys[0].data(), y.data(), y.size() * sizeof(float)))
                << what << ": bits differ with " << (p ? 3 : 1) << " thread(s)";
          }
        }
      }
    }
    EXPECT_GT(tiled_rows, 0) << Name(c) << ": no tiled row ran";
  }
}

// The row kernels' k block follows the L1 size (KernelConfig::FromMachine: 16 KiB of a 32 KiB L1,
// 32 KiB of a 48 KiB one): every tiled family must match the reference at any block size and give
// the same bits, since a block boundary only stores and reloads the running sums.
TEST(SpmmTest, KBlockSizeChangesNoBits) {
  const int64_t m = 96, k = 520;
  ThreadPool pool(2);
  struct ResetBlock {
    int64_t saved = testing_cpu::MutableCfg().xt_block_bytes;
    int64_t saved_row = testing_cpu::MutableCfg().row_xt_block_bytes;
    ~ResetBlock() {
      testing_cpu::MutableCfg().xt_block_bytes = saved;
      testing_cpu::MutableCfg().row_xt_block_bytes = saved_row;
    }
  } reset;
  for (const Case& c : {Case{FormatKind::kNM, "2:4", DType::kF32},
                        Case{FormatKind::kNM, "2:4", DType::kBF16},
                        Case{FormatKind::kCsr, "unstructured:0.5", DType::kF32, CsrLayout::kBitmask},
                        Case{FormatKind::kCsr, "unstructured:0.5", DType::kBF16, CsrLayout::kBitmask},
                        Case{FormatKind::kCsr, "unstructured:0.9", DType::kF32, CsrLayout::kColumns},
                        Case{FormatKind::kVNM, "vnm:16:2:4", DType::kF32},
                        Case{FormatKind::kBsr, "block:16x16:0.5", DType::kBF16}}) {
    const Built b = Build(c, m, k, 33);
    int tiled_rows = 0;
    for (const auto& kern : cpu::KernelTable()) {
      if (!cpu::Declines(kern, b.packed, 0, Cfg(), true).empty()) continue;
      tiled_rows += kern.mode == cpu::KernelMode::kTiled;
      for (int64_t n : {70, 200}) {
        const std::vector<float> x = RandomVector(size_t(n * k), 9 + n);
        std::vector<float> first;
        for (int64_t bytes : {int64_t{8} << 10, int64_t{16} << 10, int64_t{32} << 10,
                              int64_t{64} << 10}) {
          testing_cpu::MutableCfg().xt_block_bytes = bytes;
          testing_cpu::MutableCfg().row_xt_block_bytes = bytes;
          const std::string what = Name(c) + " " + kern.name + " n=" + std::to_string(n) +
                                   " block=" + std::to_string(bytes);
          RunAndCheck(kern, b, m, k, n, Epilogue{}, &pool, what);
          const std::vector<float> y = RunPlain(kern, b, x, m, k, n, &pool);
          if (first.empty()) {
            first = y;
          } else {
            ASSERT_EQ(0, std::memcmp(first.data(), y.data(), y.size() * sizeof(float)))
                << what << ": bits differ from the 8 KiB block's";
          }
        }
      }
    }
    EXPECT_GT(tiled_rows, 0) << Name(c) << ": no tiled row ran";
  }
}

TEST(SpmmTest, TiledStreamedYKeepsBitsAndGuards) {
  // Large outputs are written with non-temporal stores in 16-row squares from each task's first
  // whole 64-byte line of Y, plain stores before and after it; tasks are cut at line starts where
  // the row blocks allow. Streamed and plain writes must give the same bits for every offset of
  // Y in a line (m = 300 and 320 rows, ldy = 320, tasks of ~32 rows), and leave the columns
  // between m and ldy untouched. Every target (only AVX-512 streams; the rest ignore the request).
  struct ResetStream {
    ~ResetStream() { testing_cpu::MutableCfg().stream_y = StreamYMode::kAuto; }
  } reset;
  const int64_t k = 200, ldy = 320;
  ThreadPool pool(2);
  const int targets = ForEachTarget([&](const std::string& target) {
    for (const Case& c :
         {Case{FormatKind::kNM, "2:4", DType::kF32},
          Case{FormatKind::kCsr, "unstructured:0.5", DType::kBF16, CsrLayout::kBitmask},
          Case{FormatKind::kCsr, "unstructured:0.9", DType::kF32, CsrLayout::kColumns},
          Case{FormatKind::kVNM, "vnm:16:2:4", DType::kF32},
          Case{FormatKind::kBsr, "block:8x1:0.7", DType::kBF16},
          Case{FormatKind::kBsr, "block:32x32:0.5", DType::kF32},
          Case{FormatKind::kDense, "dense", DType::kBF16}}) {
      int calls = 0;
      for (int64_t m : {300, 320}) {
        const Built b = Build(c, m, k, 31 + m);
        for (const auto& kern : cpu::KernelTable()) {
          if (!cpu::Declines(kern, b.packed, 0, Cfg(), true).empty() || kern.min_n > 130) continue;
          for (int64_t n : {70, 130}) {
            if (n < kern.min_n || n > kern.max_n) continue;
            ++calls;
            const std::vector<float> x = RandomVector(size_t(n * k), 7 + n);
            for (int64_t off : {0, 1, 4, 8, 13}) {
              for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
                const std::string what = target + " " + Name(c) + " " + kern.name +
                                         " m=" + std::to_string(m) + " n=" + std::to_string(n) +
                                         " offset=" + std::to_string(off) + (p ? " 2 threads" : "");
                std::vector<float> ys[2];
                int i = 0;
                for (auto mode : {StreamYMode::kNever, StreamYMode::kAlways}) {
                  testing_cpu::MutableCfg().stream_y = mode;
                  std::vector<float> buf(size_t(n * ldy + 32), kGuard);
                  float* y = buf.data();
                  while (reinterpret_cast<uintptr_t>(y) % 64 != 0) ++y;
                  y += off;
                  SpmmArgs a;
                  a.cfg = &Cfg();
                  a.x = x.data();
                  a.n = n;
                  a.ldx = k;
                  a.y = y;
                  a.ldy = ldy;
                  kern.Run(b.packed, a, p);
                  for (int64_t t = 0; t < n; ++t) {
                    for (int64_t r = m; r < ldy; ++r) {
                      ASSERT_EQ(y[t * ldy + r], kGuard) << what << ": wrote past row " << m;
                    }
                  }
                  for (float* g = buf.data(); g < y; ++g) ASSERT_EQ(*g, kGuard) << what;
                  ys[i++].assign(y, y + n * ldy);
                }
                ASSERT_EQ(0, std::memcmp(ys[0].data(), ys[1].data(), ys[0].size() * sizeof(float)))
                    << what << ": streamed bits differ from plain stores";
              }
            }
          }
        }
      }
      EXPECT_GT(calls, 0) << target << " " << Name(c) << ": no kernel ran";
    }
  });
  EXPECT_GE(targets, 2);
}

TEST(SpmmTest, EpilogueBiasActivationResidual) {
  const int64_t m = 19, k = 40;
  const std::vector<float> bias = RandomVector(m, 3);
  const std::vector<float> residual = RandomVector(70 * (m + 5), 4);
  for (const Case& c : {Case{FormatKind::kNM, "2:4", DType::kF32},
                        Case{FormatKind::kDense, "dense", DType::kF32},
                        Case{FormatKind::kDense, "dense", DType::kBF16},
                        Case{FormatKind::kCsr, "unstructured:0.8", DType::kBF16},
                        Case{FormatKind::kCsr, "unstructured:0.5", DType::kF32, CsrLayout::kBitmask},
                        Case{FormatKind::kBsr, "block:2x2:0.5", DType::kF32}}) {
    const Built b = Build(c, m, k, 9);
    int calls = 0;
    for (Activation act : {Activation::kNone, Activation::kRelu, Activation::kGelu, Activation::kSilu}) {
      for (bool with_bias : {false, true}) {
        for (bool with_res : {false, true}) {
          Epilogue ep;
          ep.act = act;
          ep.bias = with_bias ? bias.data() : nullptr;
          ep.residual = with_res ? residual.data() : nullptr;
          ep.ld_residual = with_res ? m + 5 : 0;
          for (const auto& kern : cpu::KernelTable()) {
            if (!cpu::Declines(kern, b.packed, 0, Cfg(), true).empty()) continue;
            for (int64_t n : {1, 5, 70}) {
              ++calls;
              RunAndCheck(kern, b, m, k, n, ep, nullptr,
                          Name(c) + " " + kern.name + " act=" + std::to_string(int(act)) +
                              " bias=" + std::to_string(with_bias) + " res=" + std::to_string(with_res));
            }
          }
        }
      }
    }
    EXPECT_GT(calls, 0) << Name(c) << ": no kernel ran";
  }
}

// The kernels' vector epilogue against double-precision math on every target: SiLU within 4 ulp
// (Highway's Exp is 1 ulp; the sigmoid's divide and the product round twice more) or within
// FLT_MIN where the result underflows, including the arguments where exp(-v) overflows; ReLU,
// bias and residual exactly as the scalar reference; NaN and infinities as v / (1 + exp(-v))
// gives them; and an element's bits the same whether it sits in a full vector or in the tail.
TEST(SpmmTest, VectorEpilogueMatchesDoubleOnEveryTarget) {
  std::vector<float> v = {0.0f, -0.0f, 1e-30f, -1e-30f, 1e-7f, -1e-7f, 0.5f, -0.5f, 1.0f, -1.0f,
                          3.0f, -3.0f, 15.0f, -15.0f, 80.0f, -80.0f, 87.0f, -87.0f, 88.5f, -88.5f,
                          89.0f, -89.0f, 103.0f, -103.0f, 105.0f, -105.0f, 200.0f, -200.0f,
                          3e38f, -3e38f};
  for (int i = 0; i < 301; ++i) v.push_back(-30.0f + 0.2f * static_cast<float>(i) + 1e-3f);
  const auto m = static_cast<int64_t>(v.size());
  const std::vector<float> bias = RandomVector(m, 5);
  const std::vector<float> residual = RandomVector(m, 6);
  const int targets = ForEachTarget([&](const std::string& target) {
    Epilogue silu;
    silu.act = Activation::kSilu;
    std::vector<float> y = v;
    cpu::ApplyEpilogueRow(Cfg(), y.data(), 0, 0, m, m, silu);
    for (int64_t i = 0; i < m; ++i) {
      const double x = v[i];
      const double want = x / (1.0 + std::exp(-x));
      const double ulp = std::nextafter(static_cast<float>(std::fabs(want)), INFINITY) -
                         static_cast<float>(std::fabs(want));
      const double err = std::fabs(y[i] - want);
      EXPECT_TRUE(err <= 4 * ulp || err <= std::numeric_limits<float>::min())
          << target << " silu(" << v[i] << ") = " << y[i] << ", want " << want;
    }
    // Specials: NaN stays NaN, silu(+inf) = +inf, silu(-inf) = -inf / inf = NaN (as the reference).
    std::vector<float> sp = {std::numeric_limits<float>::quiet_NaN(), INFINITY, -INFINITY};
    cpu::ApplyEpilogueRow(Cfg(), sp.data(), 0, 0, 3, 3, silu);
    EXPECT_TRUE(std::isnan(sp[0])) << target;
    EXPECT_EQ(sp[1], INFINITY) << target;
    EXPECT_TRUE(std::isnan(sp[2])) << target;
    // Element by element (every element in a tail) gives the whole row's bits.
    for (Activation act : {Activation::kNone, Activation::kRelu, Activation::kGelu, Activation::kSilu}) {
      Epilogue ep;
      ep.act = act;
      ep.bias = bias.data();
      ep.residual = residual.data();
      std::vector<float> whole = v, single = v;
      cpu::ApplyEpilogueRow(Cfg(), whole.data(), 0, 0, m, m, ep);
      for (int64_t r = 0; r < m; ++r) cpu::ApplyEpilogueRow(Cfg(), single.data(), 0, r, r + 1, m, ep);
      EXPECT_EQ(std::memcmp(whole.data(), single.data(), sizeof(float) * m), 0)
          << target << " act " << static_cast<int>(act);
      if (act == Activation::kSilu) continue;
      for (int64_t r = 0; r < m; ++r) {  // no transcendental: the scalar reference's exact bits
        const float want = cpu::ApplyEpilogue(v[r], 0, r, m, ep);
        EXPECT_TRUE(std::memcmp(&whole[r], &want, sizeof(float)) == 0 ||
                    (std::isnan(whole[r]) && std::isnan(want)))
            << target << " act " << static_cast<int>(act) << " r " << r << ": " << whole[r]
            << " vs " << want;
      }
    }
  });
  EXPECT_GE(targets, 2);
}

// A case of every float layout and value type (N:M of 2- and 4-bit indices, window and gather).
std::vector<Case> SameBitsCases() {
  std::vector<Case> cases;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (const char* nm : {"2:4", "4:8", "1:4", "2:8"}) cases.push_back({FormatKind::kNM, nm, dt});
    cases.push_back({FormatKind::kCsr, "unstructured:0.9", dt});
    cases.push_back({FormatKind::kCsr, "unstructured:0.5", dt, CsrLayout::kBitmask});
    cases.push_back({FormatKind::kBsr, "block:16x16:0.5", dt});
    cases.push_back({FormatKind::kVNM, "vnm:16:2:4", dt});
  }
  cases.push_back({FormatKind::kCsr, "unstructured:0.5", DType::kF32, CsrLayout::kColumns});
  cases.push_back({FormatKind::kDense, "dense", DType::kBF16});
  return cases;
}

// Every row that serves each case, forced in turn on every compiled target this CPU supports.
TEST(SpmmTest, SameBitsForOneTwoThreeThreadsAndRepeatedCalls) {
  const int64_t m = 150, k = 200;
  ThreadPool p1(1), p2(2), p3(3);
  std::set<std::string> all_rows;
  std::vector<int64_t> targets;
  ForEachTarget([&](const std::string& target) {
    targets.push_back(Cfg().target);
    for (const Case& c : SameBitsCases()) {
      const Built b = Build(c, m, k, 11);
      int rows_run = 0;
      for (const auto& kern : cpu::KernelTable()) {
        if (!cpu::Declines(kern, b.packed, 0, Cfg(), true).empty()) continue;
        ++rows_run;
        all_rows.insert(kern.name);
        for (int64_t n : {1, 8, 100}) {
          const std::vector<float> x = RandomVector(n * k, 12);
          std::vector<float> ys[4];
          ThreadPool* pools[4] = {&p1, &p2, &p3, &p3};
          for (int i = 0; i < 4; ++i) {
            ys[i].assign(n * m, 0.0f);
            SpmmArgs a;
            a.cfg = &Cfg();
            a.x = x.data();
            a.n = n;
            a.ldx = k;
            a.y = ys[i].data();
            a.ldy = m;
            kern.Run(b.packed, a, pools[i]);
          }
          for (int i = 1; i < 4; ++i) {
            EXPECT_EQ(0, std::memcmp(ys[0].data(), ys[i].data(), ys[0].size() * 4))
                << target << " " << Name(c) << " " << kern.name << " n=" << n << " run " << i;
          }
        }
      }
      EXPECT_GT(rows_run, 0) << target << " " << Name(c) << ": no kernel ran";
    }
  });
  // Every f32 / bf16 row ran on a target of its range (dense f32 runs OpenBLAS, whose bits by
  // thread count the next test checks).
  for (const auto& kern : cpu::KernelTable()) {
    const std::string name = kern.name;
    if ((name.rfind("f32_", 0) != 0 && name.rfind("bf16_", 0) != 0) || name == "f32_dense_blas") {
      continue;
    }
    const bool in_range = std::any_of(targets.begin(), targets.end(), [&](int64_t t) {
      return t >= kern.best && t <= kern.worst;
    });
    if (in_range) EXPECT_TRUE(all_rows.count(name)) << name << " never ran";
  }
}

// The dense f32 row runs OpenBLAS, whose own threading changes the bits with the thread count
// (sgemm at these shapes on every kernel family of Debian's 0.3.21, sgemv with 3 threads): the
// kernel's fixed grid of single-threaded calls must give the same bits for 1, 2 and 3 threads.
TEST(SpmmTest, DenseF32SameBitsForOneTwoThreeThreads) {
  ThreadPool p1(1), p2(2), p3(3);
  struct Shape {
    int64_t m, k, n;
  };
  for (const Shape& sh : {Shape{300, 700, 8}, Shape{300, 700, 300}, Shape{512, 1000, 100},
                          Shape{2048, 512, 1}}) {
    const Built b = Build(Case{FormatKind::kDense, "dense", DType::kF32}, sh.m, sh.k, 21);
    ASSERT_EQ(b.packed.kind(), cpu::PackedKind::kDenseF32);
    const std::vector<float> x = RandomVector(sh.n * sh.k, 22);
    int ran = 0;
    for (const auto& kern : cpu::KernelTable()) {
      if (!cpu::Declines(kern, b.packed, 0, Cfg(), true).empty()) continue;
      ++ran;
      std::vector<float> ys[3];
      ThreadPool* pools[3] = {&p1, &p2, &p3};
      for (int i = 0; i < 3; ++i) {
        ys[i].assign(sh.n * sh.m, 0.0f);
        SpmmArgs a;
        a.cfg = &Cfg();
        a.x = x.data();
        a.n = sh.n;
        a.ldx = sh.k;
        a.y = ys[i].data();
        a.ldy = sh.m;
        kern.Run(b.packed, a, pools[i]);
      }
      for (int i = 1; i < 3; ++i) {
        EXPECT_EQ(0, std::memcmp(ys[0].data(), ys[i].data(), ys[0].size() * 4))
            << kern.name << " " << sh.m << "x" << sh.k << " n=" << sh.n
            << " threads=" << pools[i]->num_threads();
      }
    }
    EXPECT_GT(ran, 0) << "no kernel row serves dense f32";
  }
}

// Each output of the row-tiled kernels (N:M, bit mask) is one chain of multiply-adds over the row's
// kept weights in order, whatever the token tile width and whether k runs in blocks. So n = 128
// in one call (on AVX-512 a single 128-token tile, run by k blocks) gives the bits of two calls of
// 64 tokens each (64-token tiles, whole k); n = 100 and 90 (7- and 6-vector tiles, k blocks)
// those of 37 + 63 and 41 + 49 (3- and 4-vector tiles, whole k); n = 200 (two 7-vector tiles)
// those of 72 + 128. Checked on every compiled target; k = 1000 spans many k blocks.
TEST(SpmmTest, RowTiledOutputsKeepTheirBitsAcrossTileWidthsAndKBlocks) {
  const int64_t m = 40, k = 1000;
  const int targets = ForEachTarget([&](const std::string& target) {
    for (const Case& c :
         {Case{FormatKind::kNM, "2:4", DType::kF32}, Case{FormatKind::kNM, "2:4", DType::kBF16},
          Case{FormatKind::kNM, "4:8", DType::kF32},
          Case{FormatKind::kCsr, "unstructured:0.5", DType::kF32, CsrLayout::kBitmask},
          Case{FormatKind::kCsr, "unstructured:0.5", DType::kBF16, CsrLayout::kBitmask}}) {
      const Built b = Build(c, m, k, 31);
      int tiled_rows = 0;
      for (const auto& kern : cpu::KernelTable()) {
        if (!cpu::Declines(kern, b.packed, 0, Cfg(), true).empty() ||
            std::string(kern.name).find("tiled") == std::string::npos) {
          continue;
        }
        ++tiled_rows;
        for (const auto& [n, split] :
             {std::pair<int64_t, int64_t>{128, 64}, {100, 37}, {90, 41}, {200, 72}}) {
          const std::vector<float> x = RandomVector(n * k, 32);
          auto run = [&](int64_t t0, int64_t t1) {
            std::vector<float> y((t1 - t0) * m);
            SpmmArgs a;
            a.cfg = &Cfg();
            a.x = x.data() + t0 * k;
            a.n = t1 - t0;
            a.ldx = k;
            a.y = y.data();
            a.ldy = m;
            kern.Run(b.packed, a, nullptr);
            return y;
          };
          const std::vector<float> whole = run(0, n);
          std::vector<float> parts = run(0, split);
          const std::vector<float> rest = run(split, n);
          parts.insert(parts.end(), rest.begin(), rest.end());
          EXPECT_EQ(0, std::memcmp(whole.data(), parts.data(), whole.size() * 4))
              << target << " " << Name(c) << " " << kern.name << " n=" << n;
        }
      }
      EXPECT_GT(tiled_rows, 0) << target << " " << Name(c) << ": no tiled row ran";
    }
  });
  EXPECT_GE(targets, 2);
}

TEST(LinearWeightTest, ForwardMatchesReferenceAndNamesKernel) {
  const int64_t m = 40, k = 64;
  std::vector<float> w = testing_cpu::PatternWeights(Pattern::NM(2, 4), m, k, 5);
  auto s = NmMatrix::FromDense(w, m, k, 2, 4, DType::kF32);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  auto lw = LinearWeight::FromMatrix(std::move(s).value(), "blk.0.ffn_up", Cfg());
  ASSERT_TRUE(lw.ok()) << lw.status().ToString();
  EXPECT_EQ(lw->rows(), m);
  EXPECT_EQ(lw->cols(), k);
  EXPECT_EQ(lw->weight_bytes(), uint64_t(m) * 32 * 4 + uint64_t(m) * 2 * 4);  // values + meta
  // AVX2 decodes 2:4 with its in-lane window permute and runs 64-token tiles of one row (rows of
  // their own); the other targets the generic rows.
  EXPECT_EQ(lw->kernel_name(1), lw->config().target == HWY_AVX2
                                    ? "f32_nm24_decode_4xT__avx2(nm 2:4 f32)"
                                    : "f32_nm_m4_window_decode_4xT(nm 2:4 f32)");
  EXPECT_EQ(lw->kernel_name(512), lw->config().target == HWY_AVX2
                                      ? "f32_nm_m4_tiled_1x8__avx2(nm 2:4 f32)"
                                      : "f32_nm_m4_tiled_4xNV(nm 2:4 f32)");
  for (int64_t n : {1, 7}) {
    const std::vector<float> x = RandomVector(n * k, 6);
    std::vector<float> y(n * m);
    ThreadPool pool(2);
    lw->Forward(x.data(), n, y.data(), &pool);
    std::vector<double> want, abs_sum;
    testing_cpu::ReferenceForward(w, m, k, x.data(), n, k, Epilogue{}, want, abs_sum);
    ExpectClose(want, abs_sum, y.data(), n, m, m, k, "LinearWeight");
  }
}

TEST(LinearWeightTest, CsrLayoutFollowsDensity) {
  // 50% kept: one bit per weight (2 bytes per 16 columns) beats a u16 index per kept weight, so
  // the rows are packed as a bit mask; 5% kept: column indices.
  const int64_t m = 24, k = 100;  // 7 chunks of 16 columns per row, the last one partial
  for (double sparsity : {0.5, 0.95}) {
    std::vector<float> w = testing_cpu::PatternWeights(Pattern::Unstructured(sparsity), m, k, 8);
    auto s = CsrMatrix::FromDense(w, m, k, DType::kF32);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    const uint64_t nnz = s->values.numel();
    auto lw = LinearWeight::FromMatrix(std::move(s).value(), "w", Cfg());
    ASSERT_TRUE(lw.ok()) << lw.status().ToString();
    if (sparsity == 0.5) {
      EXPECT_EQ(lw->kernel_name(1), "f32_mask_decode_4xT(csr f32 as bitmask)");
      EXPECT_EQ(lw->kernel_name(12), "f32_mask_decode_4xT(csr f32 as bitmask)");
      EXPECT_EQ(lw->kernel_name(13), "f32_mask_tiled_2xNV(csr f32 as bitmask)");
      EXPECT_EQ(lw->weight_bytes(), nnz * 4 + uint64_t(m) * 7 * 2 + 8 * uint64_t(m + 1));
    } else {
      EXPECT_EQ(lw->kernel_name(1), "f32_csr_decode_1x1(csr f32 u16)");
      EXPECT_EQ(lw->weight_bytes(), nnz * 4 + nnz * 2 + 8 * uint64_t(m + 1));
    }
    for (int64_t n : {1, 5, 40}) {
      const std::vector<float> x = RandomVector(n * k, 9);
      std::vector<float> y(n * m);
      lw->Forward(x.data(), n, y.data(), nullptr);
      std::vector<double> want, abs_sum;
      testing_cpu::ReferenceForward(w, m, k, x.data(), n, k, Epilogue{}, want, abs_sum);
      ExpectClose(want, abs_sum, y.data(), n, m, m, k, "CSR " + std::to_string(sparsity));
    }
  }
}

TEST(SpmmTest, DispatchSwitchesFromDecodeToTiledByLayout) {
  // Each sparse weight runs its kind's decode kernel up to DecodeMaxN(w) tokens and its tiled
  // kernel above, inside the registry rows' [min_n, max_n]. The bound depends on the layout and the
  // target: N:M with m = 2n permutes X windows (cheap per token) and never switches before other
  // N:M, which gather X; dense bf16 rows not before groups of rows (V:N:M, BSR); bit-mask rows not
  // later when sparser. On AVX-512 the window N:M decode runs 4 tokens a pass and stays ahead up
  // to 16 tokens, and CSR rows go tiled from 3 tokens (narrow 4-token tiles), before the groups
  // (with them on AMD Zen 4, whose gathers make the groups' decode slow).
  const Case cases[] = {
      {FormatKind::kNM, "2:4", DType::kF32},                                           // 0
      {FormatKind::kNM, "4:8", DType::kBF16},                                          // 1
      {FormatKind::kNM, "1:4", DType::kF32},                                           // 2
      {FormatKind::kCsr, "unstructured:0.9", DType::kF32, CsrLayout::kColumns},   // 3
      {FormatKind::kVNM, "vnm:16:2:4", DType::kF32},                                   // 4
      {FormatKind::kBsr, "block:16x16:0.7", DType::kBF16},                             // 5
      {FormatKind::kDense, "dense", DType::kBF16},                                     // 6
      {FormatKind::kCsr, "unstructured:0.5", DType::kF32, CsrLayout::kBitmask},   // 7
      {FormatKind::kCsr, "unstructured:0.75", DType::kF32, CsrLayout::kBitmask},  // 8
  };
  std::vector<Built> built;
  for (const Case& c : cases) built.push_back(Build(c, 64, 128, 77));
  int targets_run = 0;
  ForEachTarget([&](const std::string& target) {
    ++targets_run;
    int64_t max_n[std::size(cases)];
    for (size_t i = 0; i < std::size(cases); ++i) {
      const PackedWeight& w = built[i].packed;
      max_n[i] = cpu::DecodeMaxN(w, Cfg());
      EXPECT_GE(max_n[i], 1) << target << " " << Name(cases[i]);
      for (int64_t n = 1; n <= 40; ++n) {
        const std::string what = target + " " + Name(cases[i]) + " n=" + std::to_string(n);
        const cpu::KernelRow& k = cpu::ChooseKernel(w, n, Cfg());
        EXPECT_TRUE(cpu::Declines(k, w, n, Cfg()).empty()) << what;
        const std::string name = k.name;
        EXPECT_EQ(k.mode, n <= max_n[i] ? cpu::KernelMode::kDecode : cpu::KernelMode::kTiled)
            << what << " " << name;
        EXPECT_TRUE(n >= k.min_n && n <= k.max_n) << what << " " << name;
      }
    }
    EXPECT_EQ(max_n[0], max_n[1]) << target;
    EXPECT_GE(max_n[0], max_n[2]) << target;
    EXPECT_EQ(max_n[4], max_n[5]) << target;
    EXPECT_GE(max_n[6], max_n[4]) << target;
    EXPECT_GE(max_n[7], max_n[8]) << target;
    if (target == "AVX3" || target == "AVX3_DL") {
      EXPECT_EQ(max_n[0], 16) << target;
      if (Cfg().cpu.amd_family_19h()) {  // Zen 4: the groups go tiled with CSR rows, from 3 tokens
        EXPECT_EQ(max_n[4], cpu::kZen4GroupsDecodeMaxN) << target;
        EXPECT_EQ(max_n[3], max_n[4]) << target;
      } else {
        EXPECT_LT(max_n[3], max_n[4]) << target;
      }
    }
  });
  EXPECT_GE(targets_run, 2);
}

// AVX2's 4x3 row-group tiles are chosen for groups of 4 rows from 48 tokens, and the tile width
// the kernel runs (3 vectors) is the one the row names; groups of 2 rows and the other targets
// keep the generic rows, whose tiles by n never have 3 vectors.
TEST(SpmmTest, Avx2RowGroupTilesOfFourFrom48Tokens) {
  const Case cases[] = {{FormatKind::kVNM, "vnm:16:2:4", DType::kF32},
                        {FormatKind::kBsr, "block:16x16:0.7", DType::kBF16},
                        {FormatKind::kDense, "dense", DType::kBF16},
                        {FormatKind::kBsr, "block:2x3:0.5", DType::kF32}};
  int targets_run = 0;
  ForEachTarget([&](const std::string& target) {
    ++targets_run;
    const bool avx2 = Cfg().target == HWY_AVX2;
    for (const Case& c : cases) {
      const Built b = Build(c, 64, 128, 91);
      const int g = b.packed.row_groups().g;
      for (int64_t n : {47, 48, 512}) {
        const cpu::KernelRow& row = cpu::ChooseKernel(b.packed, n, Cfg());
        const std::string name = row.name;
        const bool want = avx2 && g == 4 && n >= 48;
        EXPECT_EQ(name.find("_tiled_4x3__avx2") != std::string::npos, want)
            << target << " " << Name(c) << " n=" << n << ": " << name;
        const int64_t nt = cpu::TileTokens(row, b.packed, n, Cfg());
        if (want) {
          EXPECT_EQ(nt, 24) << target << " " << Name(c);
        } else if (row.mode == cpu::KernelMode::kTiled) {
          EXPECT_NE(nt, 3 * cpu::LanesAt(Cfg())) << target << " " << Name(c) << " n=" << n;
        }
      }
    }
  });
  EXPECT_GE(targets_run, 2);
}

// Three LinearWeights of cases c[i], rows[i] x cols[i], seeded seed + i, and their values
// densified.
void BuildLinears(const Case (&c)[3], const int64_t* rows, const int64_t* cols, uint64_t seed,
                  const char* what, std::vector<LinearWeight>* lw,
                  std::vector<std::vector<float>>* dense) {
  for (int i = 0; i < 3; ++i) {
    auto p = Pattern::Parse(c[i].pattern);
    ASSERT_TRUE(p.ok());
    std::vector<float> w = testing_cpu::PatternWeights(*p, rows[i], cols[i], seed + i);
    auto sm = Encode(w, rows[i], cols[i], c[i].format, *p, c[i].dtype);
    ASSERT_TRUE(sm.ok()) << what << ": " << sm.status().ToString();
    dense->push_back(testing_cpu::Densify(*sm));
    auto l = LinearWeight::FromMatrix(std::move(sm).value(), "w", Cfg());
    ASSERT_TRUE(l.ok()) << what << ": " << l.status().ToString();
    lw->push_back(std::move(l).value());
  }
}

// ForwardShared (q/k/v, gate/up: one parallel call for weights that read the same X) must give
// each output the bits of its own Forward, whether the jobs fuse (decode kernels of one kind;
// row-tiled N:M / bit-mask kernels, one X^T) or fall back to one call each (dense f32,
// CSR rows at tiled n, mixed decode kinds), for any thread count; one output
// is also checked against the double reference so that both sides cannot be wrong together.
TEST(LinearWeightTest, ForwardSharedGivesEachOutputItsOwnForwardBits) {
  const int64_t k = 80;
  const int64_t rows[3] = {96, 24, 24};  // a wide q and two narrow k/v, as in grouped attention
  struct Group {
    const char* what;
    Case c[3];
  };
  const Group groups[] = {
      {"bitmask bf16", {{FormatKind::kCsr, "unstructured:0.5", DType::kBF16},
                        {FormatKind::kCsr, "unstructured:0.5", DType::kBF16},
                        {FormatKind::kCsr, "unstructured:0.5", DType::kBF16}}},
      {"2:4 f32", {{FormatKind::kNM, "2:4", DType::kF32}, {FormatKind::kNM, "2:4", DType::kF32},
                   {FormatKind::kNM, "2:4", DType::kF32}}},
      {"dense bf16", {{FormatKind::kDense, "dense", DType::kBF16}, {FormatKind::kDense, "dense", DType::kBF16},
                      {FormatKind::kDense, "dense", DType::kBF16}}},
      {"csr columns", {{FormatKind::kCsr, "unstructured:0.9", DType::kF32},
                       {FormatKind::kCsr, "unstructured:0.9", DType::kF32},
                       {FormatKind::kCsr, "unstructured:0.9", DType::kF32}}},
      {"dense f32", {{FormatKind::kDense, "dense", DType::kF32}, {FormatKind::kDense, "dense", DType::kF32},
                     {FormatKind::kDense, "dense", DType::kF32}}},
      {"mixed", {{FormatKind::kCsr, "unstructured:0.5", DType::kBF16}, {FormatKind::kNM, "2:4", DType::kBF16},
                 {FormatKind::kNM, "4:8", DType::kF32}}},
  };
  ThreadPool p1(1), p2(2), p3(3);
  for (const Group& g : groups) {
    std::vector<LinearWeight> lw;
    std::vector<std::vector<float>> dense;
    const int64_t cols[3] = {k, k, k};
    ASSERT_NO_FATAL_FAILURE(BuildLinears(g.c, rows, cols, 20, g.what, &lw, &dense));
    for (int64_t n : {1, 3, 12, 40, 300}) {
      const std::vector<float> x = RandomVector(n * k, 30 + n);
      const std::vector<float> res = RandomVector(n * rows[1], 40 + n);
      Epilogue ep[3];
      ep[0].act = Activation::kSilu;
      ep[1].residual = res.data();
      std::vector<double> want, abs_sum;
      testing_cpu::ReferenceForward(dense[1], rows[1], k, x.data(), n, k, ep[1], want, abs_sum);
      for (ThreadPool* pool : {&p1, &p2, &p3}) {
        // Each output's own Forward on the same pool (sparq's kernels give the same bits for any
        // thread count, but the dense f32 path is OpenBLAS, whose sgemm need not).
        std::vector<float> own[3];
        for (int i = 0; i < 3; ++i) {
          own[i].assign(n * rows[i], 0.0f);
          lw[i].Forward(x.data(), n, 0, own[i].data(), 0, ep[i], pool);
        }
        ExpectClose(want, abs_sum, own[1].data(), n, rows[1], rows[1], k, g.what);
        std::vector<float> got[3];
        std::vector<LinearWeight::Output> outs;
        for (int i = 0; i < 3; ++i) {
          got[i].assign(n * rows[i], kGuard);
          outs.push_back({&lw[i], got[i].data(), ep[i]});
        }
        LinearWeight::ForwardShared(x.data(), n, outs, pool);
        for (int i = 0; i < 3; ++i) {
          EXPECT_EQ(0, std::memcmp(own[i].data(), got[i].data(), own[i].size() * 4))
              << g.what << " output " << i << " n=" << n << " threads=" << pool->num_threads();
        }
      }
    }
  }
}

// ForwardSwiGlu (a Llama MLP in one call: gate and up into down's X^T tiles, never transposed
// back to rows) must give the bits of the three products run separately, with and without a
// column permutation on down's input and a separate input for up, on every compiled target and
// for 1-3 threads; it must
// decline, writing nothing, where its kernels do not run (dense, CSR rows, few tokens).
// The separate products are also checked against a double reference of the whole MLP, so that
// both sides cannot be wrong together.
TEST(LinearWeightTest, ForwardSwiGluGivesTheSeparateProductsBits) {
  const int64_t d = 80, ff = 104;  // down has d rows and ff columns; gate/up ff rows, d columns
  struct Group {
    const char* what;
    Case c[3];  // gate, up, down
    bool fuses;
  };
  const Group groups[] = {
      {"2:4 f32",
       {{FormatKind::kNM, "2:4", DType::kF32},
        {FormatKind::kNM, "2:4", DType::kF32},
        {FormatKind::kNM, "2:4", DType::kF32}},
       true},
      {"2:4 bf16",
       {{FormatKind::kNM, "2:4", DType::kBF16},
        {FormatKind::kNM, "2:4", DType::kBF16},
        {FormatKind::kNM, "2:4", DType::kBF16}},
       true},
      {"bitmask bf16",
       {{FormatKind::kCsr, "unstructured:0.5", DType::kBF16},
        {FormatKind::kCsr, "unstructured:0.5", DType::kBF16},
        {FormatKind::kCsr, "unstructured:0.5", DType::kBF16}},
       true},
      {"mixed",
       {{FormatKind::kNM, "2:4", DType::kBF16},
        {FormatKind::kCsr, "unstructured:0.5", DType::kF32},
        {FormatKind::kNM, "4:8", DType::kF32}},
       true},
      {"dense f32 down",
       {{FormatKind::kNM, "2:4", DType::kF32},
        {FormatKind::kNM, "2:4", DType::kF32},
        {FormatKind::kDense, "dense", DType::kF32}},
       false},
      {"csr columns",
       {{FormatKind::kCsr, "unstructured:0.9", DType::kF32},
        {FormatKind::kCsr, "unstructured:0.9", DType::kF32},
        {FormatKind::kCsr, "unstructured:0.9", DType::kF32}},
       false},
  };
  const int64_t rows[3] = {ff, ff, d}, cols[3] = {d, d, ff};
  // A permutation of down's input columns (as channel permutation stores it): down reads
  // intermediate column perm[j] as its column j.
  std::vector<int32_t> perm(ff), down_row(ff);
  for (int64_t j = 0; j < ff; ++j) perm[j] = static_cast<int32_t>((j * 37 + 11) % ff);
  for (int64_t j = 0; j < ff; ++j) down_row[perm[j]] = static_cast<int32_t>(j);
  ThreadPool p1(1), p2(2), p3(3);
  for (const Group& g : groups) {
    std::vector<LinearWeight> lw;
    std::vector<std::vector<float>> dense;
    ASSERT_NO_FATAL_FAILURE(BuildLinears(g.c, rows, cols, 50, g.what, &lw, &dense));
    const int targets = ForEachTarget([&](const std::string& target) {
      for (int64_t n : {1, 12, 17, 40, 129, 300}) {
        const std::vector<float> x = RandomVector(n * d, 60 + n);
        const std::vector<float> res = RandomVector(n * d, 70 + n);
        // up's own input (gate and up stored with different column permutations read X gathered
        // two ways) in variant 2; down's permutation in variants 1 and 2.
        const std::vector<float> other = RandomVector(n * d, 80 + n);
        for (int variant = 0; variant < 3; ++variant) {
          const bool permuted = variant >= 1, own_up = variant == 2;
          const std::vector<float>& xu = own_up ? other : x;
          const std::string what = std::string(g.what) + " on " + target +
                                   " n=" + std::to_string(n) + (permuted ? " permuted" : "") +
                                   (own_up ? " own up input" : "");
          // Double reference: res + (silu(x Wg^T) * (x Wu^T)) gathered by perm, times Wd^T.
          std::vector<double> act(n * ff), want(n * d), abs_sum(n * d);
          for (int64_t t = 0; t < n; ++t) {
            for (int64_t r = 0; r < ff; ++r) {
              double sg = 0, su = 0;
              for (int64_t c = 0; c < d; ++c) {
                sg += double(dense[0][r * d + c]) * x[t * d + c];
                su += double(dense[1][r * d + c]) * xu[t * d + c];
              }
              act[t * ff + r] = sg / (1.0 + std::exp(-sg)) * su;
            }
            for (int64_t r = 0; r < d; ++r) {
              double sum = res[t * d + r], abs = std::fabs(res[t * d + r]);
              for (int64_t j = 0; j < ff; ++j) {
                const double a = act[t * ff + (permuted ? perm[j] : j)];
                sum += double(dense[2][r * ff + j]) * a;
                abs += std::fabs(double(dense[2][r * ff + j]) * a);
              }
              want[t * d + r] = sum;
              abs_sum[t * d + r] = abs;
            }
          }
          for (ThreadPool* pool : {&p1, &p2, &p3}) {
            // The separate products, as the model runs them without fusion.
            Epilogue silu, residual;
            silu.act = Activation::kSilu;
            residual.residual = res.data();
            std::vector<float> gate(n * ff), up(n * ff), act_in(n * ff), sep(n * d);
            lw[0].Forward(x.data(), n, 0, gate.data(), 0, silu, pool);
            lw[1].Forward(xu.data(), n, 0, up.data(), 0, Epilogue{}, pool);
            for (int64_t t = 0; t < n; ++t) {
              for (int64_t j = 0; j < ff; ++j) {
                const int64_t src = t * ff + (permuted ? perm[j] : j);
                act_in[t * ff + j] = gate[src] * up[src];
              }
            }
            lw[2].Forward(act_in.data(), n, 0, sep.data(), 0, residual, pool);
            // SiLU through the vector Exp (4 ulp) on values up to ~|k|: a few more ulps of slack
            // than the kernels' own 2 (k + 4) eps bound.
            ExpectClose(want, abs_sum, sep.data(), n, d, d, 4 * ff, what + " separate");
            std::vector<float> got(n * d + 16, kGuard);
            const bool fused = LinearWeight::ForwardSwiGlu(
                lw[0], lw[1], lw[2], x.data(), own_up ? xu.data() : nullptr, n,
                permuted ? down_row.data() : nullptr, res.data(), got.data(), pool);
            // Fused where all three run their tiled kernels (n above their DecodeMaxN).
            bool tiled = true;
            for (const LinearWeight& l : lw)
              tiled = tiled && l.kernel_name(n).find("_tiled") != std::string::npos;
            const bool expect = g.fuses && tiled;
            ASSERT_EQ(fused, expect) << what;
            EXPECT_EQ(LinearWeight::SwiGluFuses(lw[0], lw[1], lw[2], n), expect) << what;
            for (size_t i = fused ? n * d : 0; i < got.size(); ++i) {
              ASSERT_EQ(got[i], kGuard) << what << ": wrote y[" << i << "]";
            }
            if (!fused) continue;
            EXPECT_EQ(0, std::memcmp(sep.data(), got.data(), sep.size() * 4))
                << what << " threads=" << pool->num_threads();
          }
        }
      }
    });
    EXPECT_GE(targets, 2) << g.what;
  }
}

TEST(LinearWeightTest, MalformedInputsAreErrorsNamingThePart) {
  CsrMatrix csr;
  csr.rows = 2;
  csr.cols = 4;
  csr.row_ptr = Tensor::Alloc(DType::kI64, {3});
  csr.row_ptr.mutable_data_as<int64_t>()[1] = 1;
  csr.row_ptr.mutable_data_as<int64_t>()[2] = 2;
  csr.col_idx = Tensor::Alloc(DType::kU16, {2});
  csr.col_idx.mutable_data_as<uint16_t>()[1] = 9;  // >= cols
  csr.values = Tensor::Alloc(DType::kF32, {2});
  auto r = LinearWeight::FromMatrix(csr, "layer.w", Cfg());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("layer.w.col_idx[1]"), std::string::npos) << r.status().message();

  csr.col_idx.mutable_data_as<uint16_t>()[1] = 1;
  csr.row_ptr.mutable_data_as<int64_t>()[1] = 5;  // beyond nnz
  r = LinearWeight::FromMatrix(csr, "layer.w", Cfg());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("row_ptr"), std::string::npos) << r.status().message();

  NmMatrix nm;
  nm.rows = 1;
  nm.cols = 4;
  nm.n = 2;
  nm.m = 4;
  nm.values = Tensor::Alloc(DType::kF32, {1, 2});
  nm.meta = Tensor::Alloc(DType::kU8, {1, 1});
  nm.meta.mutable_data_as<uint8_t>()[0] = 0x05;  // indices 1, 1: not ascending
  auto q = LinearWeight::FromMatrix(nm, "nm.w", Cfg());
  ASSERT_FALSE(q.ok());
  EXPECT_NE(q.status().message().find("nm.w.meta"), std::string::npos) << q.status().message();

  nm.meta = Tensor::Alloc(DType::kU8, {1, 3});  // wrong size
  q = LinearWeight::FromMatrix(nm, "nm.w", Cfg());
  ASSERT_FALSE(q.ok());

  BsrMatrix bsr;
  bsr.rows = 4;
  bsr.cols = 4;
  bsr.bh = 2;
  bsr.bw = 2;
  bsr.row_ptr = Tensor::Alloc(DType::kI64, {3});
  bsr.row_ptr.mutable_data_as<int64_t>()[1] = 1;
  bsr.row_ptr.mutable_data_as<int64_t>()[2] = 1;
  bsr.col_idx = Tensor::Alloc(DType::kU32, {1});
  bsr.col_idx.mutable_data_as<uint32_t>()[0] = 2;  // >= 2 block columns
  bsr.values = Tensor::Alloc(DType::kF32, {1, 2, 2});
  auto b = LinearWeight::FromMatrix(bsr, "bsr.w", Cfg());
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("bsr.w.col_idx[0]"), std::string::npos) << b.status().message();
}

TEST(LinearWeightTest, CsrWithU32IndicesBeyond65536Columns) {
  const int64_t m = 3, k = 70000;
  std::vector<float> w = testing_cpu::PatternWeights(Pattern::Unstructured(0.999), m, k, 8);
  auto s = CsrMatrix::FromDense(w, m, k, DType::kF32);
  ASSERT_TRUE(s.ok());
  ASSERT_EQ(s->col_idx.dtype(), DType::kU32);
  auto lw = LinearWeight::FromMatrix(std::move(s).value(), "weight", Cfg());
  ASSERT_TRUE(lw.ok());
  for (int64_t n : {1, 4}) {
    const std::vector<float> x = RandomVector(n * k, 9);
    std::vector<float> y(n * m);
    lw->Forward(x.data(), n, y.data(), nullptr);
    std::vector<double> want, abs_sum;
    testing_cpu::ReferenceForward(w, m, k, x.data(), n, k, Epilogue{}, want, abs_sum);
    ExpectClose(want, abs_sum, y.data(), n, m, m, k, "csr u32");
  }
  // Both registry kernels on every target, through the token tiles of each width (narrow 4 and 8,
  // one and two vectors).
  auto cs = CsrMatrix::FromDense(w, m, k, DType::kF32);
  ASSERT_TRUE(cs.ok());
  Built b;
  b.dense = w;
  auto pw = cpu::Pack(SparseMatrix(std::move(cs).value()), "w");
  ASSERT_TRUE(pw.ok()) << pw.status().ToString();
  b.packed = std::move(pw).value();
  ASSERT_EQ(b.packed.kind(), cpu::PackedKind::kRowGroups);
  ASSERT_FALSE(b.packed.row_groups().idx16);
  const int targets = ForEachTarget([&](const std::string& target) {
    int rows_run = 0;
    for (const auto& kern : cpu::KernelTable()) {
      if (!cpu::Declines(kern, b.packed, 0, Cfg(), true).empty()) continue;
      ++rows_run;
      for (int64_t n : {1, 3, 5, 12, 17}) {
        RunAndCheck(kern, b, m, k, n, Epilogue{}, nullptr,
                    target + " " + kern.name + " csr u32 n=" + std::to_string(n));
      }
    }
    EXPECT_GE(rows_run, 2) << target << ": the decode and the tiled row should both run";
  });
  EXPECT_GE(targets, 2);
}

TEST(LinearWeightTest, GroupsWithU32IndicesBeyond65536Columns) {
  // Shared-column groups of 2 and 4 rows (BSR 2x2, 4x4) with u32 column indices, through both
  // registry kernels at n = 1, 2, 5 (the decode on AVX-512: 16 / g columns per vector from one
  // gather).
  const int64_t m = 8, k = 70000;
  for (const char* pat : {"block:4x4:0.99", "block:2x2:0.99"}) {
    auto p = Pattern::Parse(pat);
    ASSERT_TRUE(p.ok());
    std::vector<float> w = testing_cpu::PatternWeights(*p, m, k, 12);
    auto s = Encode(w, m, k, FormatKind::kBsr, *p, DType::kF32);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    Built b;
    b.dense = testing_cpu::Densify(*s);
    auto pw = cpu::Pack(*s, "w");
    ASSERT_TRUE(pw.ok()) << pw.status().ToString();
    b.packed = std::move(pw).value();
    ASSERT_FALSE(b.packed.row_groups().idx16) << pat;
    ASSERT_GE(b.packed.row_groups().g, 2) << pat;
    const int targets = ForEachTarget([&](const std::string& target) {
      int rows_run = 0;
      for (const auto& kern : cpu::KernelTable()) {
        if (!cpu::Declines(kern, b.packed, 0, Cfg(), true).empty()) continue;
        ++rows_run;
        for (int64_t n : {1, 2, 5}) {
          RunAndCheck(kern, b, m, k, n, Epilogue{}, nullptr,
                      target + " " + pat + " " + kern.name + " n=" + std::to_string(n));
        }
      }
      EXPECT_GE(rows_run, 2) << target << " " << pat << ": the decode and the tiled row should both run";
    });
    EXPECT_GE(targets, 2) << pat;
  }
}

}  // namespace
}  // namespace sparq
