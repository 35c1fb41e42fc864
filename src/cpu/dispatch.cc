// The kernel table (table.h) and dispatch: ChooseKernel walks the rows in order and takes the
// first that serves the weight; ExplainKernel says why the earlier ones declined.
#include <hwy/targets.h>

#include <cmath>
#include <string>

#include "src/cpu/kernel_entry.h"
#include "src/cpu/runners.h"
#include "src/cpu/spmm.h"
#include "src/cpu/table.h"

namespace sparq::cpu {

// Every variant: ROW(name, layout, dtype, mode, tile, best target, worst target, min n, max n, run).
// A row for one target sits above the generic row it replaces there (the __avx2 rows: the 2:4
// decode's in-lane window permute, NmWindow; RowTileWidth gives the row kernels 64-token tiles of
// one row x 8 vectors on AVX2 from 64 tokens; TiledNv gives 4-row groups 3 vectors from 48
// tokens, kGroupTile4x3).
// Decode rows come before the tiled rows of their layout: a weight runs decode up to its
// DecodeMaxN (which differs by target), tiled above. min_n / max_n span every target's limits.
// The N:M rows of one value type (f32, bf16, and the quantized i8 / i4: the f32 bodies with the
// values dequantized in registers for decode, into the decoded block for tiled).
#define SPARQ_NM_ROWS(ROW, dt, DT) \
  ROW(dt##_nm24_decode_4xT__avx2, kNm24, DT, kDecode, "4xT",                                       \
      HWY_AVX2, HWY_AVX2, 0, 16, RunDecode)                                                        \
  ROW(dt##_nm_window_decode_4xT, kNmWindow, DT, kDecode, "4xT",                                    \
      HWY_AVX3_DL, HWY_SCALAR, 0, 16, RunDecode)                                                   \
  ROW(dt##_nm_gather_decode_4xT, kNmGather, DT, kDecode, "4xT",                                    \
      HWY_AVX3_DL, HWY_SCALAR, 0, 16, RunDecode)                                                   \
  ROW(dt##_nm_window_tiled_1x8__avx2, kNmWindow, DT, kTiled, "1x8",                                \
      HWY_AVX2, HWY_AVX2, 64, INT64_MAX, RunRowTiled)                                              \
  ROW(dt##_nm_gather_tiled_1x8__avx2, kNmGather, DT, kTiled, "1x8",                                \
      HWY_AVX2, HWY_AVX2, 64, INT64_MAX, RunRowTiled)                                              \
  ROW(dt##_nm_window_tiled_4xNV, kNmWindow, DT, kTiled, "4xNV",                                    \
      HWY_AVX3_DL, HWY_SCALAR, 2, INT64_MAX, RunRowTiled)                                          \
  ROW(dt##_nm_gather_tiled_4xNV, kNmGather, DT, kTiled, "4xNV",                                    \
      HWY_AVX3_DL, HWY_SCALAR, 2, INT64_MAX, RunRowTiled)
#define SPARQ_KERNEL_ROWS(ROW)                                                                      \
  ROW(f32_dense_blas, kDenseF32, kF32, kBlas, "sgemv/sgemm", HWY_AVX3_DL, HWY_SCALAR, 0, INT64_MAX,      \
      RunDenseBlas)                                                                                 \
  SPARQ_NM_ROWS(ROW, f32, kF32)                                                                    \
  SPARQ_NM_ROWS(ROW, bf16, kBF16)                                                                  \
  SPARQ_NM_ROWS(ROW, i8, kI8)                                                                      \
  SPARQ_NM_ROWS(ROW, i4, kI4)                                                                      \
  ROW(f32_csr_decode_1x1, kCsr, kF32, kDecode, "1x1", HWY_AVX3_DL, HWY_SCALAR, 0, 16, RunDecode)         \
  ROW(bf16_csr_decode_1x1, kCsr, kBF16, kDecode, "1x1", HWY_AVX3_DL, HWY_SCALAR, 0, 16, RunDecode)       \
  ROW(f32_csr_tiled_2xNV, kCsr, kF32, kTiled, "2xNV", HWY_AVX3_DL, HWY_SCALAR, 2, INT64_MAX, RunScgTiled) \
  ROW(bf16_csr_tiled_2xNV, kCsr, kBF16, kTiled, "2xNV", HWY_AVX3_DL, HWY_SCALAR, 2, INT64_MAX,           \
      RunScgTiled)                                                                                  \
  ROW(f32_rowgroups_decode_Gx1, kRowGroups, kF32, kDecode, "Gx1", HWY_AVX3_DL, HWY_SCALAR, 0, 16,        \
      RunDecode)                                                                                    \
  ROW(bf16_rowgroups_decode_Gx1, kRowGroups, kBF16, kDecode, "Gx1", HWY_AVX3_DL, HWY_SCALAR, 0, 16,      \
      RunDecode)                                                                                    \
  ROW(f32_rowgroups_tiled_4x3__avx2, kRowGroups4, kF32, kTiled, "4x3", HWY_AVX2, HWY_AVX2, 48,     \
      INT64_MAX, RunScgTiled)                                                                       \
  ROW(bf16_rowgroups_tiled_4x3__avx2, kRowGroups4, kBF16, kTiled, "4x3", HWY_AVX2, HWY_AVX2, 48,   \
      INT64_MAX, RunScgTiled)                                                                       \
  ROW(f32_rowgroups_tiled_GxNV, kRowGroups, kF32, kTiled, "GxNV", HWY_AVX3_DL, HWY_SCALAR, 2, INT64_MAX, \
      RunScgTiled)                                                                                  \
  ROW(bf16_rowgroups_tiled_GxNV, kRowGroups, kBF16, kTiled, "GxNV", HWY_AVX3_DL, HWY_SCALAR, 2,          \
      INT64_MAX, RunScgTiled)                                                                       \
  ROW(bf16_dense_decode_4x1, kDenseBf16, kBF16, kDecode, "4x1", HWY_AVX3_DL, HWY_SCALAR, 0, 16,          \
      RunDecode)                                                                                    \
  ROW(bf16_dense_tiled_4x3__avx2, kDenseBf16, kBF16, kTiled, "4x3", HWY_AVX2, HWY_AVX2, 48,       \
      INT64_MAX, RunScgTiled)                                                                       \
  ROW(bf16_dense_tiled_4xNV, kDenseBf16, kBF16, kTiled, "4xNV", HWY_AVX3_DL, HWY_SCALAR, 2, INT64_MAX,   \
      RunScgTiled)                                                                                  \
  ROW(f32_mask_decode_4xT, kMask, kF32, kDecode, "4xT", HWY_AVX3_DL, HWY_SCALAR, 0, 16, RunDecode)       \
  ROW(bf16_mask_decode_4xT, kMask, kBF16, kDecode, "4xT", HWY_AVX3_DL, HWY_SCALAR, 0, 16, RunDecode)     \
  ROW(f32_mask_tiled_1x8__avx2, kMask, kF32, kTiled, "1x8", HWY_AVX2, HWY_AVX2, 64, INT64_MAX,   \
      RunRowTiled)                                                                                  \
  ROW(bf16_mask_tiled_1x8__avx2, kMask, kBF16, kTiled, "1x8", HWY_AVX2, HWY_AVX2, 64, INT64_MAX, \
      RunRowTiled)                                                                                  \
  ROW(f32_mask_tiled_2xNV, kMask, kF32, kTiled, "2xNV", HWY_AVX3_DL, HWY_SCALAR, 2, INT64_MAX,           \
      RunRowTiled)                                                                                  \
  ROW(bf16_mask_tiled_2xNV, kMask, kBF16, kTiled, "2xNV", HWY_AVX3_DL, HWY_SCALAR, 2, INT64_MAX,         \
      RunRowTiled)

const std::vector<KernelRow>& KernelTable() {
#define SPARQ_ROW(name, layout, dtype, mode, tile, best, worst, min_n, max_n, run)            \
  KernelRow{#name, KernelLayout::layout, DType::dtype, KernelMode::mode, tile, best, worst, \
            min_n, max_n, run},
  static const std::vector<KernelRow> kRows = {SPARQ_KERNEL_ROWS(SPARQ_ROW)};
#undef SPARQ_ROW
  return kRows;
}

const char* LayoutName(KernelLayout layout) {
  switch (layout) {
    case KernelLayout::kDenseF32: return "dense f32";
    case KernelLayout::kNmWindow: return "N:M with m = 2n";
    case KernelLayout::kNm24: return "2:4";
    case KernelLayout::kNmGather: return "N:M";
    case KernelLayout::kCsr: return "CSR rows";
    case KernelLayout::kRowGroups: return "row groups";
    case KernelLayout::kRowGroups4: return "row groups of 4";
    case KernelLayout::kDenseBf16: return "dense bf16";
    case KernelLayout::kMask: return "bit mask";
  }
  return "?";
}

KernelLayout LayoutOf(const PackedWeight& w) {
  switch (w.kind) {
    case PackedKind::kDenseF32: return KernelLayout::kDenseF32;
    case PackedKind::kNm:
      if (w.nm.n == 2 && w.nm.m == 4) return KernelLayout::kNm24;
      return w.nm.m == 2 * w.nm.n ? KernelLayout::kNmWindow : KernelLayout::kNmGather;
    case PackedKind::kScg:
      if (w.scg.implicit_cols) return KernelLayout::kDenseBf16;
      if (w.scg.g == 1) return KernelLayout::kCsr;
      return w.scg.g == 4 ? KernelLayout::kRowGroups4 : KernelLayout::kRowGroups;
    case PackedKind::kMask: return KernelLayout::kMask;
  }
  return KernelLayout::kDenseF32;
}

bool LayoutServes(KernelLayout row, KernelLayout w) {
  return row == w || (row == KernelLayout::kNmWindow && w == KernelLayout::kNm24) ||
         (row == KernelLayout::kRowGroups && w == KernelLayout::kRowGroups4);
}

namespace {
DType ValueDType(const PackedWeight& w) {
  switch (w.kind) {
    case PackedKind::kDenseF32: return DType::kF32;
    case PackedKind::kNm: return w.nm.value_dtype;
    case PackedKind::kScg: return w.scg.value_dtype;
    case PackedKind::kMask: return w.mask.value_dtype;
  }
  return DType::kF32;
}
std::string TargetName(int64_t t) { return hwy::TargetName(t); }
}  // namespace

int64_t DecodeMaxN(const PackedWeight& w, const KernelConfig& cfg) {
  const DecodeLimits b = DecodeLimitsAt(cfg);
  switch (LayoutOf(w)) {
    case KernelLayout::kNmWindow:
    case KernelLayout::kNm24: return b.nm_window;
    case KernelLayout::kNmGather: return b.nm_gather;
    case KernelLayout::kCsr: return b.csr;
    case KernelLayout::kRowGroups:
    case KernelLayout::kRowGroups4: return b.groups;
    case KernelLayout::kDenseBf16: return b.dense_bf16;
    case KernelLayout::kMask:  // denser than 40%, or sparser
      return 10 * w.stored >= 4 * w.rows * w.cols ? b.mask : b.sparse_mask;
    case KernelLayout::kDenseF32: break;
  }
  return 0;
}

std::string Declines(const KernelRow& row, const PackedWeight& w, int64_t n,
                     const KernelConfig& cfg, bool any_n) {
  const KernelLayout layout = LayoutOf(w);
  if (!LayoutServes(row.layout, layout)) {
    return std::string("serves ") + LayoutName(row.layout) + ", the weight is " + LayoutName(layout);
  }
  if (row.dtype != ValueDType(w)) {
    return "serves " + std::string(DTypeName(row.dtype)) + " values, the weight's are " +
           std::string(DTypeName(ValueDType(w)));
  }
  if (cfg.target < row.best || cfg.target > row.worst) {
    return "runs on " + TargetName(row.worst) + " to " + TargetName(row.best) + ", not " +
           cfg.target_name();
  }
  if (any_n) return {};
  if (n < row.min_n || n > row.max_n) {
    return "serves n in [" + std::to_string(row.min_n) + ", " +
           (row.max_n == INT64_MAX ? std::string("inf") : std::to_string(row.max_n)) + "], not " +
           std::to_string(n);
  }
  if (row.mode != KernelMode::kBlas) {
    const int64_t limit = DecodeMaxN(w, cfg);
    if (row.mode == KernelMode::kDecode && n > limit) {
      return "decode runs up to n = " + std::to_string(limit) + " for this layout on " +
             cfg.target_name() + " (tiled above)";
    }
    if (row.mode == KernelMode::kTiled && n <= limit) {
      return "tiled runs from n = " + std::to_string(limit + 1) + " for this layout on " +
             cfg.target_name() + " (decode below)";
    }
  }
  return {};
}

KernelChoice ExplainKernel(const PackedWeight& w, int64_t n, const KernelConfig& cfg) {
  KernelChoice out;
  for (const KernelRow& row : KernelTable()) {
    std::string why = Declines(row, w, n, cfg);
    if (why.empty()) {
      out.chosen = &row;
      return out;
    }
    // Rows of other layouts decline by construction: only the weight's own family is news.
    if (LayoutServes(row.layout, LayoutOf(w)) || LayoutServes(LayoutOf(w), row.layout)) {
      out.declined.emplace_back(&row, std::move(why));
    }
  }
  return out;
}

// Declines(...).empty() without building strings: every product call dispatches through here.
const KernelRow& ChooseKernel(const PackedWeight& w, int64_t n, const KernelConfig& cfg) {
  const KernelLayout layout = LayoutOf(w);
  const DType dtype = ValueDType(w);
  const int64_t limit = DecodeMaxN(w, cfg);
  for (const KernelRow& row : KernelTable()) {
    if (!LayoutServes(row.layout, layout) || row.dtype != dtype || cfg.target < row.best ||
        cfg.target > row.worst || n < row.min_n || n > row.max_n) {
      continue;
    }
    if ((row.mode == KernelMode::kDecode && n > limit) ||
        (row.mode == KernelMode::kTiled && n <= limit)) {
      continue;
    }
    return row;
  }
  // Unreachable for a packed weight: every layout has rows for every target and n.
  return KernelTable().front();
}

}  // namespace sparq::cpu
