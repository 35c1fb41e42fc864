// Every kernel of the registry against the densified double reference, on every compiled Highway
// target: shape sweeps around the tile sizes, all formats and value types, misaligned pointers,
// guard bytes, the tiled loop orders and k blocks.
#include "src/cpu/spmm.h"

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
#include "tests/cpu/spmm_cases_testutil.h"
#include "tests/cpu/spmm_testutil.h"

namespace sparq {
namespace {

using cpu::SpmmArgs;
using testing_cpu::AllCases;
using testing_cpu::Build;
using testing_cpu::Built;
using testing_cpu::Case;
using testing_cpu::Cfg;
using testing_cpu::ForEachTarget;
using testing_cpu::kGuard;
using testing_cpu::Name;
using testing_cpu::RandomVector;
using testing_cpu::RunAndCheck;
using testing_cpu::RunPlain;
using testing_cpu::RunReference;

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
          if (b.packed.kind() == cpu::PackedKind::kRowGroups &&
              !b.packed.row_groups().implicit_cols) {
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
          const cpu::KernelRow reference{"reference",
                                         cpu::LayoutOf(b.packed),
                                         cpu::ValueKind::kF32,
                                         cpu::KernelMode::kBlas,
                                         "",
                                         0,
                                         0,
                                         0,
                                         0,
                                         RunReference,
                                         0,
                                         nullptr};
          RunAndCheck(reference, b, m, k, 3, Epilogue{}, nullptr,
                      target + " " + Name(c) + " reference");
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
    std::printf(
        "[ coverage ] %-8s %zu cases, %lld kernel calls, %zu rows, %.1f s:", tr.name.c_str(),
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
      for (const Case& c :
           {Case{FormatKind::kBsr, "block:2x2:0.5", dt},
            Case{FormatKind::kBsr, "block:2x3:0.5", dt}, Case{FormatKind::kVNM, "vnm:2:2:4", dt}}) {
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
      EXPECT_TRUE(tr.rows.at(Name(w.c)).count(w.row))
          << tr.name << " " << Name(w.c) << ": " << w.row << " did not run";
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
            if (!cpu::Declines(kern, b.packed, 0, Cfg(), true).empty() ||
                kern.mode == cpu::KernelMode::kBlas)
              continue;
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
  for (const Case& c :
       {Case{FormatKind::kVNM, "vnm:16:2:4", DType::kF32},
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
        for (auto order : {TiledOrder::kAuto, TiledOrder::kTaskOuter, TiledOrder::kTileOuter}) {
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
  for (const Case& c :
       {Case{FormatKind::kNM, "2:4", DType::kF32}, Case{FormatKind::kNM, "2:4", DType::kBF16},
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
        for (int64_t bytes :
             {int64_t{8} << 10, int64_t{16} << 10, int64_t{32} << 10, int64_t{64} << 10}) {
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

}  // namespace
}  // namespace sparq
