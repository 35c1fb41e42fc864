// ComputeMask / ApplyMask / MagnitudePrune and the selection primitives under them: the one
// mask-selection implementation of sparq (magnitude, Wanda and, per column block, SparseGPT use
// it). One ordering everywhere: a beats b iff score(a) > score(b), or the scores are equal and a
// has the lower flat index (for rows / columns / blocks: the lower row, column or block index).
// Unit scores (rows, columns, blocks, V:N:M column slabs) are summed and compared in double.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "sparq/checked.h"
#include "sparq/pattern.h"
#include "sparq/thread_pool.h"

namespace sparq {
namespace {

// Number kept out of `count` candidates when a fraction f is pruned: count - llround(f * count).
int64_t KeptCount(double fraction, int64_t count) {
  const int64_t pruned = std::llround(fraction * static_cast<double>(count));
  return std::clamp<int64_t>(count - pruned, 0, count);
}

// Marks the `keep` highest of s[0..n) in out[0..n) (1 = keep). O(n) with nth_element on a copy:
// the keep-th largest value t is found, everything above t is kept, and of the values equal to t
// the lowest indices are kept until `keep` is reached.
template <typename T>
void KeepTopImpl(const T* s, int64_t n, int64_t keep, uint8_t* out, std::vector<T>* scratch) {
  if (keep >= n) {
    std::fill(out, out + n, uint8_t{1});
    return;
  }
  if (keep <= 0) {
    std::fill(out, out + n, uint8_t{0});
    return;
  }
  scratch->assign(s, s + n);
  std::nth_element(scratch->begin(), scratch->begin() + (keep - 1), scratch->end(),
                   std::greater<T>());
  const T t = (*scratch)[keep - 1];
  int64_t above = 0;
  for (int64_t i = 0; i < n; ++i) above += s[i] > t;
  int64_t equal_left = keep - above;
  for (int64_t i = 0; i < n; ++i) {
    uint8_t k = 0;
    if (s[i] > t) {
      k = 1;
    } else if (s[i] == t && equal_left > 0) {
      k = 1;
      --equal_left;
    }
    out[i] = k;
  }
}

// Keeps the `keep` best of the r scores s[0..r) (r <= 16): rank = number of elements that beat
// the element; keep the ones with rank < keep. O(r^2) but r is at most 16.
template <typename T>
uint32_t KeepTopInGroupImpl(const T* s, int r, int keep) {
  uint32_t bits = 0;
  for (int i = 0; i < r; ++i) {
    int rank = 0;
    for (int j = 0; j < r; ++j) {
      rank += static_cast<int>(s[j] > s[i]) |
              (static_cast<int>(s[j] == s[i]) & static_cast<int>(j < i));
    }
    bits |= static_cast<uint32_t>(rank < keep) << i;
  }
  return bits;
}

// fn(i) for i in [0, n): on the pool when there is one (each i writes its own rows of the mask).
void ForEach(int64_t n, ThreadPool* pool, const std::function<void(int64_t)>& fn) {
  if (pool && n > 1) {
    pool->ParallelFor(n, [&](int64_t i, int) { fn(i); });
  } else {
    for (int64_t i = 0; i < n; ++i) fn(i);
  }
}

Status CheckScores(std::span<const float> scores, int64_t m, int64_t k, const std::string& what) {
  if (m < 0 || k < 0) {
    return InvalidInput(what + ": negative shape " + std::to_string(m) + " x " + std::to_string(k));
  }
  SPARQ_ASSIGN_OR_RETURN(uint64_t total, CheckedNumel({m, k}, what));
  if (scores.size() != total) {
    return InvalidInput(what + ": " + std::to_string(scores.size()) + " scores for a " +
                        std::to_string(m) + " x " + std::to_string(k) + " tensor");
  }
  for (uint64_t i = 0; i < total; ++i) {
    if (!std::isfinite(scores[i])) {
      return InvalidInput(what + ": score at (row " + std::to_string(i / k) + ", col " +
                          std::to_string(i % k) + ") is " +
                          (std::isnan(scores[i]) ? "NaN" : "infinite") + "; scores must be finite");
    }
  }
  return Status::Ok();
}

void MaskNM(const float* s, int64_t m, int64_t k, int n, int gm, ThreadPool* pool, uint8_t* mask) {
  const int64_t groups = CeilDiv(k, gm);
  ForEach(m, pool, [&](int64_t i) {
    const float* row = s + i * k;
    uint8_t* mrow = mask + i * k;
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t c0 = g * gm;
      const int r = static_cast<int>(std::min<int64_t>(gm, k - c0));
      const uint32_t bits = KeepTopInGroupImpl(row + c0, r, std::min(n, r));
      for (int j = 0; j < r; ++j) mrow[c0 + j] = (bits >> j) & 1u;
    }
  });
}

void MaskVNM(const float* s, int64_t m, int64_t k, int v, int n, int gm, ThreadPool* pool,
             uint8_t* mask) {
  const int64_t groups = CeilDiv(k, gm);
  ForEach(CeilDiv(m, v), pool, [&](int64_t slab) {
    const int64_t r0 = slab * v, r1 = std::min<int64_t>(m, r0 + v);
    std::vector<double> colsum(static_cast<size_t>(k), 0.0);
    for (int64_t i = r0; i < r1; ++i) {
      for (int64_t j = 0; j < k; ++j) colsum[j] += s[i * k + j];
    }
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t c0 = g * gm;
      const int r = static_cast<int>(std::min<int64_t>(gm, k - c0));
      const uint32_t bits = KeepTopInGroupImpl(colsum.data() + c0, r, std::min(n, r));
      for (int64_t i = r0; i < r1; ++i) {
        for (int j = 0; j < r; ++j) mask[i * k + c0 + j] = (bits >> j) & 1u;
      }
    }
  });
}

void MaskBlocks(const float* s, int64_t m, int64_t k, int bh, int bw, double fraction,
                uint8_t* mask) {
  const int64_t brows = CeilDiv(m, bh), bcols = CeilDiv(k, bw);
  std::vector<double> sums(static_cast<size_t>(brows * bcols), 0.0), scratch;
  for (int64_t i = 0; i < m; ++i) {
    double* srow = sums.data() + (i / bh) * bcols;
    for (int64_t j = 0; j < k; ++j) srow[j / bw] += s[i * k + j];
  }
  std::vector<uint8_t> kept(sums.size());
  KeepTopImpl(sums.data(), brows * bcols, KeptCount(fraction, brows * bcols), kept.data(),
              &scratch);
  for (int64_t i = 0; i < m; ++i) {
    const uint8_t* krow = kept.data() + (i / bh) * bcols;
    for (int64_t j = 0; j < k; ++j) mask[i * k + j] = krow[j / bw];
  }
}

}  // namespace

int64_t CumulativeCount(double fraction, int64_t before, int64_t after) {
  return std::llround(fraction * static_cast<double>(after)) -
         std::llround(fraction * static_cast<double>(before));
}

void KeepTop(const float* s, int64_t n, int64_t keep, uint8_t* out, std::vector<float>* scratch) {
  KeepTopImpl(s, n, keep, out, scratch);
}

uint32_t KeepTopInGroup(const float* s, int len, int keep) {
  return KeepTopInGroupImpl(s, len, keep);
}

Result<std::vector<uint8_t>> ComputeMask(const Pattern& p, std::span<const float> scores, int64_t m,
                                         int64_t k, const std::string& what,
                                         const MaskOptions& opt) {
  Status pst = p.Validate();
  if (!pst.ok()) return pst.WithContext(what + ": pattern " + p.ToString());
  SPARQ_RETURN_IF_ERROR(CheckScores(scores, m, k, what));
  const int64_t total = m * k;
  std::vector<uint8_t> mask(static_cast<size_t>(total), 1);
  const float* s = scores.data();
  switch (p.kind) {
    case PatternKind::kDense:
      break;
    case PatternKind::kUnstructured:
      if (p.per_row || opt.row_wise) {
        // Row i keeps k minus its share of the prunes: the same count in every row (per_row), or
        // the tensor's count spread by cumulative rounding (row_wise) so that the total is exact.
        ForEach(m, opt.pool, [&](int64_t i) {
          std::vector<float> scratch;
          const int64_t pruned = p.per_row ? k - KeptCount(p.fraction, k)
                                           : CumulativeCount(p.fraction, i * k, (i + 1) * k);
          KeepTopImpl(s + i * k, k, k - pruned, mask.data() + i * k, &scratch);
        });
      } else {
        std::vector<float> scratch;
        KeepTopImpl(s, total, KeptCount(p.fraction, total), mask.data(), &scratch);
      }
      break;
    case PatternKind::kRows: {
      std::vector<double> sums(static_cast<size_t>(m), 0.0), scratch;
      for (int64_t i = 0; i < m; ++i) {
        double acc = 0;
        for (int64_t j = 0; j < k; ++j) acc += s[i * k + j];
        sums[i] = acc;
      }
      std::vector<uint8_t> kept(static_cast<size_t>(m));
      KeepTopImpl(sums.data(), m, KeptCount(p.fraction, m), kept.data(), &scratch);
      for (int64_t i = 0; i < m; ++i) std::fill_n(mask.data() + i * k, k, kept[i]);
      break;
    }
    case PatternKind::kCols: {
      std::vector<double> sums(static_cast<size_t>(k), 0.0), scratch;
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < k; ++j) sums[j] += s[i * k + j];
      }
      std::vector<uint8_t> kept(static_cast<size_t>(k));
      KeepTopImpl(sums.data(), k, KeptCount(p.fraction, k), kept.data(), &scratch);
      for (int64_t i = 0; i < m; ++i) std::copy(kept.begin(), kept.end(), mask.data() + i * k);
      break;
    }
    case PatternKind::kNM:
      MaskNM(s, m, k, p.n, p.m, opt.pool, mask.data());
      break;
    case PatternKind::kBlock:
      MaskBlocks(s, m, k, p.bh, p.bw, p.fraction, mask.data());
      break;
    case PatternKind::kVNM:
      MaskVNM(s, m, k, p.v, p.n, p.m, opt.pool, mask.data());
      break;
  }
  return mask;
}

void ApplyMask(std::span<float> w, std::span<const uint8_t> mask) {
  const size_t n = std::min(w.size(), mask.size());
  for (size_t i = 0; i < n; ++i) {
    if (!mask[i]) w[i] = 0.0f;
  }
}

Status MagnitudePrune(const Pattern& p, std::span<float> w, int64_t m, int64_t k,
                      const std::string& what) {
  std::vector<float> scores(w.size());
  for (size_t i = 0; i < w.size(); ++i) scores[i] = std::fabs(w[i]);
  SPARQ_ASSIGN_OR_RETURN(std::vector<uint8_t> mask, ComputeMask(p, scores, m, k, what));
  ApplyMask(w, mask);
  return Status::Ok();
}

}  // namespace sparq
