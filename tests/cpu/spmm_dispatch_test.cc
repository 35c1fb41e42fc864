// Which row dispatch picks: decode up to a layout's DecodeMaxN, tiled above, per target.
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

using cpu::PackedWeight;
using testing_cpu::Build;
using testing_cpu::Built;
using testing_cpu::Case;
using testing_cpu::Cfg;
using testing_cpu::ForEachTarget;
using testing_cpu::Name;

TEST(SpmmTest, DispatchSwitchesFromDecodeToTiledByLayout) {
  // Each sparse weight runs its kind's decode kernel up to DecodeMaxN(w) tokens and its tiled
  // kernel above, inside the registry rows' [min_n, max_n]. The bound depends on the layout and the
  // target: N:M with m = 2n permutes X windows (cheap per token) and never switches before other
  // N:M, which gather X; dense bf16 rows not before groups of rows (V:N:M, BSR); bit-mask rows not
  // later when sparser. On AVX-512 the window N:M decode runs 4 tokens a pass and stays ahead up
  // to 16 tokens, and CSR rows go tiled from 3 tokens (narrow 4-token tiles), before the groups
  // (with them on AMD Zen 4, whose gathers make the groups' decode slow).
  const Case cases[] = {
      {FormatKind::kNM, "2:4", DType::kF32},                                      // 0
      {FormatKind::kNM, "4:8", DType::kBF16},                                     // 1
      {FormatKind::kNM, "1:4", DType::kF32},                                      // 2
      {FormatKind::kCsr, "unstructured:0.9", DType::kF32, CsrLayout::kColumns},   // 3
      {FormatKind::kVNM, "vnm:16:2:4", DType::kF32},                              // 4
      {FormatKind::kBsr, "block:16x16:0.7", DType::kBF16},                        // 5
      {FormatKind::kDense, "dense", DType::kBF16},                                // 6
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

// ForwardShared (q/k/v, gate/up: one parallel call for weights that read the same X) must give
// each output the bits of its own Forward, whether the jobs fuse (decode kernels of one kind;
// row-tiled N:M / bit-mask kernels, one X^T) or fall back to one call each (dense f32,
// CSR rows at tiled n, mixed decode kinds), for any thread count; one output
// is also checked against the double reference so that both sides cannot be wrong together.

}  // namespace
}  // namespace sparq
