// Satisfies / FinestPattern: which structure does a tensor already have?
//
// "Zero" here is the value 0 (either sign); NaN counts as nonzero. For fraction patterns the
// required number of zeros (or zero rows / columns / blocks) out of c candidates is
// floor(f * c), i.e. a tensor pruned with llround(f * c) or floor(f * c) both pass ("within one
// element of rounding").
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include "sparq/checked.h"
#include "sparq/pattern.h"

namespace sparq {
namespace {

int64_t RequiredZeros(double fraction, int64_t count) {
  // The epsilon absorbs f*c landing a hair below an integer (0.3 * 10 = 2.9999999999999996).
  return static_cast<int64_t>(std::floor(fraction * static_cast<double>(count) + 1e-9));
}

bool ShapeOk(std::span<const float> w, int64_t m, int64_t k) {
  if (m < 0 || k < 0) return false;
  auto total = CheckedNumel({m, k}, "w");
  return total.ok() && *total == w.size();
}

// Every group of gm along k (tail: r = k % gm elements) has at most min(n, r) nonzeros; with
// v > 1 the union over each slab of v rows counts.
bool SatisfiesVNM(const float* w, int64_t m, int64_t k, int v, int n, int gm) {
  for (int64_t r0 = 0; r0 < m; r0 += v) {
    const int64_t r1 = std::min<int64_t>(m, r0 + v);
    for (int64_t c0 = 0; c0 < k; c0 += gm) {
      const int r = static_cast<int>(std::min<int64_t>(gm, k - c0));
      uint32_t used = 0;
      for (int64_t i = r0; i < r1; ++i) {
        const float* g = w + i * k + c0;
        for (int j = 0; j < r; ++j) used |= static_cast<uint32_t>(g[j] != 0.0f) << j;
      }
      if (std::popcount(used) > std::min(n, r)) return false;
    }
  }
  return true;
}

bool SatisfiesNM(const float* w, int64_t m, int64_t k, int n, int gm) {
  for (int64_t i = 0; i < m; ++i) {
    const float* row = w + i * k;
    for (int64_t c0 = 0; c0 < k; c0 += gm) {
      const int r = static_cast<int>(std::min<int64_t>(gm, k - c0));
      int nz = 0;
      for (int j = 0; j < r; ++j) nz += row[c0 + j] != 0.0f;
      if (nz > n) return false;  // nz <= r always, so min(n, r) is implied
    }
  }
  return true;
}

bool RowIsZero(const float* row, int64_t k) {
  for (int64_t j = 0; j < k; ++j) {
    if (row[j] != 0.0f) return false;
  }
  return true;
}

int64_t CountZeroRows(const float* w, int64_t m, int64_t k) {
  int64_t z = 0;
  for (int64_t i = 0; i < m; ++i) z += RowIsZero(w + i * k, k);
  return z;
}

// Column j is zero iff no row has a nonzero there.
std::vector<uint8_t> NonzeroColumns(const float* w, int64_t m, int64_t k) {
  std::vector<uint8_t> nz(k, 0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < k; ++j) nz[j] |= w[i * k + j] != 0.0f;
  }
  return nz;
}

// Number of all-zero blocks of bh x bw (edge blocks partial). If `strict`, returns -1 as soon as
// a zero is found inside a block that is not all zero (the zeros do not come in whole blocks).
int64_t CountZeroBlocks(const float* w, int64_t m, int64_t k, int bh, int bw, bool strict) {
  int64_t zero_blocks = 0;
  for (int64_t r0 = 0; r0 < m; r0 += bh) {
    const int64_t r1 = std::min<int64_t>(m, r0 + bh);
    for (int64_t c0 = 0; c0 < k; c0 += bw) {
      const int64_t c1 = std::min<int64_t>(k, c0 + bw);
      int64_t nz = 0;
      for (int64_t i = r0; i < r1; ++i) {
        for (int64_t j = c0; j < c1; ++j) nz += w[i * k + j] != 0.0f;
      }
      if (nz == 0) {
        ++zero_blocks;
      } else if (strict && nz != (r1 - r0) * (c1 - c0)) {
        return -1;
      }
    }
  }
  return zero_blocks;
}

}  // namespace

bool Satisfies(const Pattern& p, std::span<const float> w, int64_t m, int64_t k) {
  if (!p.Validate().ok() || !ShapeOk(w, m, k)) return false;
  const float* d = w.data();
  const int64_t total = m * k;
  switch (p.kind) {
    case PatternKind::kDense:
      return true;
    case PatternKind::kUnstructured:
      if (p.per_row) {
        const int64_t need = RequiredZeros(p.fraction, k);
        for (int64_t i = 0; i < m; ++i) {
          int64_t z = 0;
          for (int64_t j = 0; j < k; ++j) z += d[i * k + j] == 0.0f;
          if (z < need) return false;
        }
        return true;
      } else {
        int64_t z = 0;
        for (int64_t i = 0; i < total; ++i) z += d[i] == 0.0f;
        return z >= RequiredZeros(p.fraction, total);
      }
    case PatternKind::kRows:
      return CountZeroRows(d, m, k) >= RequiredZeros(p.fraction, m);
    case PatternKind::kCols: {
      const std::vector<uint8_t> nz = NonzeroColumns(d, m, k);
      const int64_t zero_cols = std::count(nz.begin(), nz.end(), uint8_t{0});
      return zero_cols >= RequiredZeros(p.fraction, k);
    }
    case PatternKind::kNM:
      return SatisfiesNM(d, m, k, p.n, p.m);
    case PatternKind::kBlock: {
      const int64_t nblocks = CeilDiv(m, p.bh) * CeilDiv(k, p.bw);
      return CountZeroBlocks(d, m, k, p.bh, p.bw, false) >= RequiredZeros(p.fraction, nblocks);
    }
    case PatternKind::kVNM:
      return SatisfiesVNM(d, m, k, p.v, p.n, p.m);
  }
  return false;
}

Pattern FinestPattern(std::span<const float> w, int64_t m, int64_t k) {
  if (!ShapeOk(w, m, k)) return Pattern::Dense();
  const float* d = w.data();
  const int64_t total = m * k;
  int64_t zeros = 0;
  for (int64_t i = 0; i < total; ++i) zeros += d[i] == 0.0f;
  if (zeros == 0) return Pattern::Dense();
  if (zeros == total) return Pattern::Unstructured(1.0);

  // N:M candidates from the most to the least constrained: by density n/m, and at equal density
  // the smaller m (1:4 implies 2:8). Each check stops at the first violating group.
  struct NM {
    int n, m;
  };
  static const NM kCandidates[] = {{1, 16}, {1, 8}, {2, 16}, {1, 4}, {2, 8}, {4, 16},
                                   {1, 2},  {2, 4}, {4, 8},  {8, 16}};
  for (const NM& c : kCandidates) {
    // Without one full group (k < M) every tensor would pass: not informative.
    if (k < c.m || !SatisfiesNM(d, m, k, c.n, c.m)) continue;
    // V:N:M with the same n:m is finer still; take the largest V that holds.
    for (int v = 64; v >= 2; v /= 2) {
      if (v <= m && SatisfiesVNM(d, m, k, v, c.n, c.m)) return Pattern::VNM(v, c.n, c.m);
    }
    return Pattern::NM(c.n, c.m);
  }

  // Whole zero rows / columns / blocks, when every zero of the tensor lies in one of them.
  const int64_t zero_rows = CountZeroRows(d, m, k);
  if (zero_rows > 0 && zero_rows * k == zeros) {
    return Pattern::Rows(static_cast<double>(zero_rows) / static_cast<double>(m));
  }
  {
    const std::vector<uint8_t> nz = NonzeroColumns(d, m, k);
    const int64_t zero_cols = std::count(nz.begin(), nz.end(), uint8_t{0});
    if (zero_cols > 0 && zero_cols * m == zeros) {
      return Pattern::Cols(static_cast<double>(zero_cols) / static_cast<double>(k));
    }
  }
  struct Shape {
    int bh, bw;
  };
  // Largest area first (a 32x32-block tensor is also 16x16-block).
  static const Shape kBlocks[] = {{64, 64}, {32, 32}, {16, 16}, {8, 8}, {1, 16},
                                  {16, 1},  {4, 4},   {1, 8},   {8, 1}, {1, 4},
                                  {4, 1}};
  for (const Shape& b : kBlocks) {
    if (b.bh > m || b.bw > k) continue;
    const int64_t zb = CountZeroBlocks(d, m, k, b.bh, b.bw, true);
    if (zb > 0) {
      const int64_t nblocks = CeilDiv(m, b.bh) * CeilDiv(k, b.bw);
      return Pattern::Block(b.bh, b.bw, static_cast<double>(zb) / static_cast<double>(nblocks));
    }
  }
  return Pattern::Unstructured(static_cast<double>(zeros) / static_cast<double>(total));
}

}  // namespace sparq
