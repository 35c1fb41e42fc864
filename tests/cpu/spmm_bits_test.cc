// Bitwise invariance: every row serving a case, forced in turn on every compiled target, gives the
// same bits for 1, 2 and 3 threads and repeated calls; tile widths and k blocks move no bits.
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
#include "tests/cpu/spmm_cases_testutil.h"
#include "tests/cpu/spmm_testutil.h"

namespace sparq {
namespace {

using cpu::SpmmArgs;
using testing_cpu::Build;
using testing_cpu::Built;
using testing_cpu::Case;
using testing_cpu::Cfg;
using testing_cpu::ForEachTarget;
using testing_cpu::Name;
using testing_cpu::RandomVector;

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
    const bool in_range = std::any_of(targets.begin(), targets.end(),
                                      [&](int64_t t) { return t >= kern.best && t <= kern.worst; });
    if (in_range) {
      EXPECT_TRUE(all_rows.count(name)) << name << " never ran";
    }
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
  for (const Shape& sh :
       {Shape{300, 700, 8}, Shape{300, 700, 300}, Shape{512, 1000, 100}, Shape{2048, 512, 1}}) {
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

}  // namespace
}  // namespace sparq
