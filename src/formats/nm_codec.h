// Internal: the N:M / V:N:M encoding shared by NmMatrix (slabs of one row) and VnmMatrix.
//
// Layout (format.h): values [rows, groups * n]; meta [slabs, meta_row_bytes], each slab's stream
// holding groups * n indices of `bits` bits, LSB-first. A slab of v rows shares one index set per
// group. Position choice per group: every column that is nonzero in some row of the slab; then, up
// to n, columns holding -0 (so its sign survives the round trip), then the lowest other columns,
// and, only in a tail group with fewer than n real columns, positions in the padding.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <string>

#include "sparq/checked.h"
#include "sparq/format.h"
#include "sparq/status.h"
#include "src/formats/format_util.h"

namespace sparq::formats_internal {

struct NmLayout {
  int64_t rows = 0, cols = 0;
  int v = 1, n = 0, m = 0;
  int64_t groups = 0, slabs = 0;
  int bits = 1;
  int64_t meta_row_bytes = 0;
  int64_t values_row() const { return groups * n; }
};

inline NmLayout MakeNmLayout(int64_t rows, int64_t cols, int v, int n, int m) {
  NmLayout l;
  l.rows = rows;
  l.cols = cols;
  l.v = v;
  l.n = n;
  l.m = m;
  l.groups = CeilDiv(cols, m);
  l.slabs = CeilDiv(rows, v);
  l.bits = IndexBitsFor(m);
  l.meta_row_bytes = CeilDiv(l.groups * n * l.bits, 8);
  return l;
}

// Describes slab s for messages: "row 3" (v = 1) or "slab 2 (rows 16..23)".
inline std::string SlabText(const NmLayout& l, int64_t s) {
  if (l.v == 1) return "row " + std::to_string(s);
  const int64_t r0 = s * l.v, r1 = std::min(l.rows, r0 + l.v) - 1;
  return "slab " + std::to_string(s) + " (rows " + std::to_string(r0) + ".." + std::to_string(r1) +
         ")";
}

inline std::string GroupText(const NmLayout& l, int64_t g) {
  const int64_t c0 = g * l.m, c1 = std::min(l.cols, c0 + l.m) - 1;
  return "group " + std::to_string(g) + " (columns " + std::to_string(c0) + ".." +
         std::to_string(c1) + ")";
}

// Lowest `count` set bits of `candidates` added to `sel` until popcount(sel) == n.
inline uint32_t FillSelection(uint32_t sel, uint32_t candidates, int n) {
  candidates &= ~sel;
  while (std::popcount(sel) < n && candidates) {
    const uint32_t low = candidates & (~candidates + 1);
    sel |= low;
    candidates ^= low;
  }
  return sel;
}

template <typename C>
Status EncodeNm(const float* w, const NmLayout& l, typename C::Storage* values, uint8_t* meta,
                const std::string& what) {
  using S = typename C::Storage;
  const int64_t vrow = l.values_row();
  for (int64_t s = 0; s < l.slabs; ++s) {
    const int64_t r0 = s * l.v, r1 = std::min(l.rows, r0 + l.v);
    uint8_t* mrow = meta + s * l.meta_row_bytes;
    for (int64_t g = 0; g < l.groups; ++g) {
      const int64_t c0 = g * l.m;
      const int r = static_cast<int>(std::min<int64_t>(l.m, l.cols - c0));
      uint32_t nonzero = 0, negzero = 0;
      for (int64_t i = r0; i < r1; ++i) {
        const float* src = w + i * l.cols + c0;
        for (int j = 0; j < r; ++j) {
          const uint32_t b = C::Bits(C::Enc(src[j]));
          nonzero |= static_cast<uint32_t>((b & ~C::kSignBit) != 0) << j;
          negzero |= static_cast<uint32_t>(b == C::kSignBit) << j;
        }
      }
      if (std::popcount(nonzero) > l.n) {
        return InvalidInput(what + ": " + SlabText(l, s) + ", " + GroupText(l, g) + " has " +
                            std::to_string(std::popcount(nonzero)) +
                            (l.v == 1 ? " nonzeros" : " columns with nonzeros") + "; " +
                            (l.v == 1 ? "" : std::to_string(l.v) + ":") + std::to_string(l.n) +
                            ":" + std::to_string(l.m) + " allows at most " +
                            std::to_string(l.n));
      }
      const uint32_t real = (r == 32 ? ~0u : ((1u << r) - 1u));
      const uint32_t all = (1u << l.m) - 1u;
      uint32_t sel = FillSelection(nonzero, negzero, l.n);
      sel = FillSelection(sel, real, l.n);
      sel = FillSelection(sel, all & ~real, l.n);
      int j = 0;
      for (uint32_t rest = sel; rest; rest &= rest - 1, ++j) {
        const int pos = std::countr_zero(rest);
        WriteBits(mrow, (g * l.n + j) * l.bits, l.bits, static_cast<uint32_t>(pos));
        for (int64_t i = r0; i < r1; ++i) {
          values[i * vrow + g * l.n + j] = pos < r ? C::Enc(w[i * l.cols + c0 + pos]) : S{};
        }
      }
    }
  }
  return Status::Ok();
}

// Writes the stored values into dense f32 `out` [rows, cols] (zero-filled by the caller).
// Illegal or padding indices are skipped, so this never writes out of range.
template <typename C>
void DecodeNm(const typename C::Storage* values, const uint8_t* meta, const NmLayout& l,
              float* out) {
  const int64_t vrow = l.values_row();
  int idx[16];
  for (int64_t s = 0; s < l.slabs; ++s) {
    const int64_t r0 = s * l.v, r1 = std::min(l.rows, r0 + l.v);
    const uint8_t* mrow = meta + s * l.meta_row_bytes;
    for (int64_t g = 0; g < l.groups; ++g) {
      const int64_t c0 = g * l.m;
      for (int j = 0; j < l.n; ++j) {
        idx[j] = static_cast<int>(ReadBits(mrow, (g * l.n + j) * l.bits, l.bits));
      }
      for (int64_t i = r0; i < r1; ++i) {
        const auto* v = values + i * vrow + g * l.n;
        float* d = out + i * l.cols;
        for (int j = 0; j < l.n; ++j) {
          const int64_t c = c0 + idx[j];
          if (idx[j] < l.m && c < l.cols) d[c] = C::Dec(v[j]);
        }
      }
    }
  }
}

// A byte of a meta stream whose groups fill whole bytes (n * bits = 1, 2, 4 or 8) is legal iff
// each of its groups' indices are < m and strictly ascending: one table lookup per byte instead
// of a ReadBits per index (this check runs on every load, over every kept weight of a model).
struct NmByteTable {
  bool usable = false;
  int groups_per_byte = 0;
  std::array<bool, 256> ok{};
  explicit NmByteTable(const NmLayout& l) {
    const int group_bits = l.n * l.bits;
    if (group_bits > 8 || 8 % group_bits != 0) return;
    usable = true;
    groups_per_byte = 8 / group_bits;
    for (int b = 0; b < 256; ++b) {
      const uint8_t byte = static_cast<uint8_t>(b);
      bool good = true;
      for (int k = 0; k < groups_per_byte * l.n && good; ++k) {
        const int idx = static_cast<int>(ReadBits(&byte, int64_t{k} * l.bits, l.bits));
        const int prev = k % l.n == 0 ? -1 : static_cast<int>(ReadBits(&byte, int64_t{k - 1} * l.bits, l.bits));
        good = idx < l.m && idx > prev;
      }
      ok[b] = good;
    }
  }
};

// Checks every index: legal (< m), strictly ascending in its group, and inside the matrix unless
// the tail group has fewer than n real columns, in which case a padding index must hold +0 in
// every row of the slab (values == nullptr: quantized codes, whose padding slots stand for
// nothing, so only the tail rule applies). `name` is the tensor name.
template <typename C>
Status ValidateNmIndices(const typename C::Storage* values, const uint8_t* meta,
                         const NmLayout& l, const std::string& name) {
  const int64_t vrow = l.values_row();
  const NmByteTable table(l);
  // Groups wholly inside the matrix, in whole bytes of the stream: checked by the table.
  const int64_t table_bytes =
      table.usable ? std::min<int64_t>(l.cols / l.m, l.groups) / table.groups_per_byte : 0;
  for (int64_t s = 0; s < l.slabs; ++s) {
    const int64_t r0 = s * l.v, r1 = std::min(l.rows, r0 + l.v);
    const uint8_t* mrow = meta + s * l.meta_row_bytes;
    int64_t checked = 0;  // bytes found legal; the first bad one is reported by the loop below
    while (checked < table_bytes && table.ok[mrow[checked]]) ++checked;
    for (int64_t g = checked * table.groups_per_byte; g < l.groups; ++g) {
      const int64_t c0 = g * l.m;
      const int r = static_cast<int>(std::min<int64_t>(l.m, l.cols - c0));
      int prev = -1;
      for (int j = 0; j < l.n; ++j) {
        const int idx = static_cast<int>(ReadBits(mrow, (g * l.n + j) * l.bits, l.bits));
        const bool illegal = idx >= l.m;
        const bool unordered = idx <= prev;
        bool bad_pad = false;
        if (!illegal && idx >= r) {
          bad_pad = r >= l.n;  // a tail with n or more real columns never needs the padding
          for (int64_t i = r0; i < r1 && !bad_pad && values != nullptr; ++i) {
            bad_pad = C::Bits(values[i * vrow + g * l.n + j]) != 0;
          }
        }
        if (!illegal && !unordered && !bad_pad) {
          prev = idx;
          continue;
        }
        const std::string where = name + ".meta: " + SlabText(l, s) + ", " + GroupText(l, g) +
                                  ", index " + std::to_string(j) + " = " + std::to_string(idx);
        if (illegal) {
          return InvalidInput(where + ": illegal for m = " + std::to_string(l.m) +
                              " (indices must be < m)");
        }
        if (unordered) {
          return InvalidInput(where + (idx == prev ? ": duplicate index in the group"
                                                   : ": indices not ascending (previous " +
                                                         std::to_string(prev) + ")"));
        }
        return InvalidInput(where + ": points into the padded tail beyond cols = " +
                            std::to_string(l.cols) +
                            (r >= l.n ? " (the tail group has enough real columns)"
                                      : " with a nonzero value"));
      }
    }
  }
  return Status::Ok();
}

// Shape and dtype checks shared by NmMatrix / VnmMatrix::Validate. Returns the layout.
inline Status ValidateNmParts(const Tensor& values, const Tensor& meta, const NmLayout& l,
                              const std::string& name) {
  SPARQ_RETURN_IF_ERROR(CheckPart(values, name + ".values",
                                  {DType::kF32, DType::kBF16, DType::kF16},
                                  {l.rows, l.values_row()}));
  return CheckPart(meta, name + ".meta", {DType::kU8}, {l.slabs, l.meta_row_bytes});
}

// The parts of a quantized NmMatrix / VnmMatrix (nm_quant.cc): spec, codes (dtype, shape, range),
// f16 scales (finite, >= 0) and mins (finite; present exactly for int4 with a min), meta's shape.
Status ValidateQuantParts(const NmMatrix& s, const std::string& name);
Status ValidateQuantParts(const VnmMatrix& s, const std::string& name);

inline Status ValidateNmParams(int v, int n, int m, const std::string& name) {
  if (m < 2 || m > 16 || n < 1 || n >= m) {
    return InvalidInput(name + ": N:M = " + std::to_string(n) + ":" + std::to_string(m) +
                        " is outside 1 <= N < M <= 16");
  }
  if (v < 1 || v > 64) {
    return InvalidInput(name + ": V = " + std::to_string(v) + " is outside 1..64");
  }
  return Status::Ok();
}

}  // namespace sparq::formats_internal
