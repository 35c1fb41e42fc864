// The kernel table (table.h) and dispatch: ChooseKernel walks the rows in order and takes the
// first that serves the weight; ExplainKernel says why the earlier ones declined.
#include <hwy/targets.h>

#include <cmath>
#include <string>

#include "src/cpu/kernel_entry.h"
#include "src/cpu/runners.h"
#include "src/cpu/spmm.h"
#include "src/cpu/table.h"
#include "src/cpu/table_rows.h"

namespace sparq::cpu {

const std::vector<KernelRow>& KernelTable() {
#define SPARQ_ROW(name, layout, values, mode, tile, best, worst, min_n, max_n, run, nv, body) \
  KernelRow{#name, KernelLayout::layout, ValueKind::k##values, KernelMode::mode, tile, best,    \
            worst, min_n, max_n, run, nv, nullptr},
  static const std::vector<KernelRow> kRows = [] {
    std::vector<KernelRow> rows = {SPARQ_KERNEL_ROWS(SPARQ_ROW)};
    const KernelBody* const* bodies = RowBodies();
    for (size_t i = 0; i < rows.size(); ++i) rows[i].bodies = bodies[i];
    return rows;
  }();
#undef SPARQ_ROW
  return kRows;
}

const char* LayoutName(KernelLayout layout) {
  switch (layout) {
    case KernelLayout::kDenseF32: return "dense f32";
    case KernelLayout::kNmM4: return "N:M with m <= 4";
    case KernelLayout::kNmWindowM4: return "N:M with m = 2n <= 4";
    case KernelLayout::kNm24: return "2:4";
    case KernelLayout::kNmM16: return "N:M with 4 < m <= 16";
    case KernelLayout::kNmWindowM16: return "N:M with m = 2n > 4";
    case KernelLayout::kCsr: return "CSR rows";
    case KernelLayout::kRowGroups: return "row groups";
    case KernelLayout::kRowGroups4: return "row groups of 4";
    case KernelLayout::kDenseBf16: return "dense bf16";
    case KernelLayout::kMask: return "bit mask";
    case KernelLayout::kDenseQuant: return "dense quantized";
  }
  return "?";
}

KernelLayout LayoutOf(const PackedWeight& w) {
  return std::visit(
      Overloaded{
          [](const DenseF32Weight&) { return KernelLayout::kDenseF32; },
          [](const NmWeight& nm) {
            if (nm.n == 2 && nm.m == 4) return KernelLayout::kNm24;
            const bool window = nm.m == 2 * nm.n;
            if (nm.bits == 2) return window ? KernelLayout::kNmWindowM4 : KernelLayout::kNmM4;
            return window ? KernelLayout::kNmWindowM16 : KernelLayout::kNmM16;
          },
          [](const RowGroupWeight& s) {
            if (s.implicit_cols) return KernelLayout::kDenseBf16;
            if (s.g == 1) return KernelLayout::kCsr;
            return s.g == 4 ? KernelLayout::kRowGroups4 : KernelLayout::kRowGroups;
          },
          [](const MaskWeight&) { return KernelLayout::kMask; },
          [](const DenseQuantWeight&) { return KernelLayout::kDenseQuant; },
      },
      w.layout);
}

namespace {
// The layout a layout is a case of (itself where none).
KernelLayout Wider(KernelLayout l) {
  switch (l) {
    case KernelLayout::kNm24: return KernelLayout::kNmWindowM4;
    case KernelLayout::kNmWindowM4: return KernelLayout::kNmM4;
    case KernelLayout::kNmWindowM16: return KernelLayout::kNmM16;
    case KernelLayout::kRowGroups4: return KernelLayout::kRowGroups;
    default: return l;
  }
}
// Rows whose body permutes windows of X (NmWindow / Permute2): n must divide the lanes.
bool WindowRow(KernelLayout l) {
  return l == KernelLayout::kNm24 || l == KernelLayout::kNmWindowM4 ||
         l == KernelLayout::kNmWindowM16;
}
std::string TargetName(int64_t t) { return hwy::TargetName(t); }
}  // namespace

bool LayoutServes(KernelLayout row, KernelLayout w) {
  for (;;) {
    if (row == w) return true;
    const KernelLayout up = Wider(w);
    if (up == w) return false;
    w = up;
  }
}

const char* ValueKindName(ValueKind v) {
  switch (v) {
    case ValueKind::kF32: return "f32";
    case ValueKind::kBf16: return "bf16";
    case ValueKind::kI8: return "int8";
    case ValueKind::kI4Sym: return "symmetric int4";
    case ValueKind::kI4: return "int4 with a min";
  }
  return "?";
}

ValueKind ValueKindOf(const PackedWeight& w) {
  auto of_float = [](DType dt) { return dt == DType::kBF16 ? ValueKind::kBf16 : ValueKind::kF32; };
  return std::visit(Overloaded{
                        [](const DenseF32Weight&) { return ValueKind::kF32; },
                        [](const NmWeight& nm) { return ValueKindOf(nm.spec); },
                        [&](const RowGroupWeight& s) {
                          return s.quantized() ? ValueKindOf(s.spec) : of_float(s.value_dtype);
                        },
                        [&](const MaskWeight& m) {
                          return m.quantized() ? ValueKindOf(m.spec) : of_float(m.value_dtype);
                        },
                        [](const DenseQuantWeight& d) { return ValueKindOf(d.values); },
                    },
                    w.layout);
}

ValueKind ValueKindOf(const ValueSpec& spec) {
  switch (spec.dtype) {
    case DType::kBF16: return ValueKind::kBf16;
    case DType::kI8: return ValueKind::kI8;
    case DType::kI4: return spec.has_min() ? ValueKind::kI4 : ValueKind::kI4Sym;
    default: return ValueKind::kF32;
  }
}

int64_t TileTokens(const KernelRow& row, const PackedWeight& w, int64_t n,
                   const KernelConfig& cfg) {
  if (row.tile_nv > 0) return row.tile_nv * LanesAt(cfg);
  if (row.tile_nv < 0) return -row.tile_nv;
  return w.kind() == PackedKind::kRowGroups ? TileWidthAt(cfg, w.row_groups().g, n) : RowTileWidthAt(cfg, n);
}

int64_t DecodeMaxN(const PackedWeight& w, const KernelConfig& cfg) {
  const DecodeLimits b = DecodeLimitsAt(cfg);
  switch (LayoutOf(w)) {
    case KernelLayout::kNm24:
    case KernelLayout::kNmWindowM4:
    case KernelLayout::kNmWindowM16: return b.nm_window;
    case KernelLayout::kNmM4:
    case KernelLayout::kNmM16: return b.nm_gather;
    case KernelLayout::kCsr: return b.csr;
    case KernelLayout::kRowGroups:
    case KernelLayout::kRowGroups4:
      return w.row_groups().quantized() ? b.groups_quant : b.groups;
    case KernelLayout::kDenseBf16: return b.dense_bf16;
    case KernelLayout::kMask:  // denser than 40%, or sparser
      return 10 * w.stored >= 4 * w.rows * w.cols ? b.mask : b.sparse_mask;
    case KernelLayout::kDenseQuant: return b.dense_quant;
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
  if (row.values != ValueKindOf(w)) {
    return "serves " + std::string(ValueKindName(row.values)) + " values, the weight's are " +
           std::string(ValueKindName(ValueKindOf(w)));
  }
  if (cfg.target < row.best || cfg.target > row.worst) {
    return "runs on " + TargetName(row.worst) + " to " + TargetName(row.best) + ", not " +
           cfg.target_name();
  }
  if (WindowRow(row.layout) && LanesAt(cfg) % w.nm().n != 0) {
    return "its window permute needs n = " + std::to_string(w.nm().n) + " to divide the " +
           std::to_string(LanesAt(cfg)) + " lanes of " + cfg.target_name();
  }
  if (row.mode == KernelMode::kDecodeInt8X) {
    if (!cfg.int8_activations) return "rounds X to int8: off (--activations f32)";
    if (w.kind() == PackedKind::kNm && w.nm().group_shift < 6) {
      // The AVX2 rows' step is 32 kept values; they keep the AVX-512 rows' rule (one dispatch
      // rule per layout; groups of 32 kept values are rare: 2:4 defaults to g64).
      return "its step (64 kept values on AVX-512) needs groups of 64 or more, the weight's are " +
             std::to_string(1 << w.nm().group_shift);
    }
  }
  if (any_n) return {};
  if (n < row.min_n || n > row.max_n) {
    return "serves n in [" + std::to_string(row.min_n) + ", " +
           (row.max_n == INT64_MAX ? std::string("inf") : std::to_string(row.max_n)) + "], not " +
           std::to_string(n);
  }
  if (row.mode != KernelMode::kBlas) {
    const int64_t limit = DecodeMaxN(w, cfg);
    if (DecodeMode(row.mode) && n > limit) {
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
  const ValueKind values = ValueKindOf(w);
  const int64_t limit = DecodeMaxN(w, cfg);
  const bool window = w.kind() == PackedKind::kNm && LanesAt(cfg) % w.nm().n == 0;
  for (const KernelRow& row : KernelTable()) {
    if (!LayoutServes(row.layout, layout) || row.values != values || cfg.target < row.best ||
        cfg.target > row.worst || n < row.min_n || n > row.max_n ||
        (WindowRow(row.layout) && !window)) {
      continue;
    }
    if (row.mode == KernelMode::kDecodeInt8X &&
        (!cfg.int8_activations || (w.kind() == PackedKind::kNm && w.nm().group_shift < 6))) {
      continue;
    }
    if ((DecodeMode(row.mode) && n > limit) ||
        (row.mode == KernelMode::kTiled && n <= limit)) {
      continue;
    }
    return row;
  }
  // Unreachable for a packed weight: every layout has rows for every target and n.
  return KernelTable().front();
}

}  // namespace sparq::cpu
