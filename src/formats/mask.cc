// ComputeMask / ApplyMask / MagnitudePrune: keep the highest scores per group, block, row or
// tensor. One ordering everywhere: a beats b iff score(a) > score(b), or the scores are equal and
// a has the lower flat index (for rows / columns / blocks: the lower row, column or block index).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "sparq/checked.h"
#include "sparq/pattern.h"

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
void SelectTopContiguous(const float* s, int64_t n, int64_t keep, uint8_t* out,
                         std::vector<float>* scratch) {
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
                   std::greater<float>());
  const float t = (*scratch)[keep - 1];
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

// Indices of the `keep` best units by (sum desc, index asc); returns a 0/1 vector over units.
std::vector<uint8_t> SelectTopUnits(const std::vector<double>& sums, int64_t keep) {
  const int64_t n = static_cast<int64_t>(sums.size());
  std::vector<uint8_t> kept(n, 0);
  if (keep >= n) {
    std::fill(kept.begin(), kept.end(), uint8_t{1});
    return kept;
  }
  if (keep <= 0) return kept;
  std::vector<int64_t> idx(n);
  std::iota(idx.begin(), idx.end(), int64_t{0});
  auto better = [&](int64_t a, int64_t b) {
    return sums[a] > sums[b] || (sums[a] == sums[b] && a < b);
  };
  std::nth_element(idx.begin(), idx.begin() + (keep - 1), idx.end(), better);
  for (int64_t i = 0; i < keep; ++i) kept[idx[i]] = 1;
  return kept;
}

// Keeps the `keep` best of the r scores s[0..r) (r <= 16): rank = number of elements that beat
// the element; keep the ones with rank < keep. O(r^2) but r is at most 16.
inline uint32_t SelectInGroup(const float* s, int r, int keep) {
  uint32_t bits = 0;
  for (int i = 0; i < r; ++i) {
    int rank = 0;
    for (int j = 0; j < r; ++j) rank += (s[j] > s[i]) | ((s[j] == s[i]) & (j < i));
    bits |= static_cast<uint32_t>(rank < keep) << i;
  }
  return bits;
}

Status CheckScores(std::span<const float> scores, int64_t m, int64_t k, const std::string& what) {
  if (m < 0 || k < 0) {
    return InvalidInput(what + ": negative shape " + std::to_string(m) + " x " +
                        std::to_string(k));
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
                          (std::isnan(scores[i]) ? "NaN" : "infinite") +
                          "; scores must be finite");
    }
  }
  return Status::Ok();
}

void MaskNM(const float* s, int64_t m, int64_t k, int n, int gm, uint8_t* mask) {
  const int64_t groups = CeilDiv(k, gm);
  for (int64_t i = 0; i < m; ++i) {
    const float* row = s + i * k;
    uint8_t* mrow = mask + i * k;
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t c0 = g * gm;
      const int r = static_cast<int>(std::min<int64_t>(gm, k - c0));
      const uint32_t bits = SelectInGroup(row + c0, r, std::min(n, r));
      for (int j = 0; j < r; ++j) mrow[c0 + j] = (bits >> j) & 1u;
    }
  }
}

void MaskVNM(const float* s, int64_t m, int64_t k, int v, int n, int gm, uint8_t* mask) {
  const int64_t groups = CeilDiv(k, gm);
  std::vector<double> colsum(k);
  for (int64_t r0 = 0; r0 < m; r0 += v) {
    const int64_t r1 = std::min<int64_t>(m, r0 + v);
    std::fill(colsum.begin(), colsum.end(), 0.0);
    for (int64_t i = r0; i < r1; ++i) {
      for (int64_t j = 0; j < k; ++j) colsum[j] += s[i * k + j];
    }
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t c0 = g * gm;
      const int r = static_cast<int>(std::min<int64_t>(gm, k - c0));
      const int keep = std::min(n, r);
      uint32_t bits = 0;
      for (int a = 0; a < r; ++a) {
        int rank = 0;
        for (int b = 0; b < r; ++b) {
          rank += static_cast<int>(colsum[c0 + b] > colsum[c0 + a]) |
                  (static_cast<int>(colsum[c0 + b] == colsum[c0 + a]) & static_cast<int>(b < a));
        }
        bits |= static_cast<uint32_t>(rank < keep) << a;
      }
      for (int64_t i = r0; i < r1; ++i) {
        for (int j = 0; j < r; ++j) mask[i * k + c0 + j] = (bits >> j) & 1u;
      }
    }
  }
}

void MaskBlocks(const float* s, int64_t m, int64_t k, int bh, int bw, double fraction,
                uint8_t* mask) {
  const int64_t brows = CeilDiv(m, bh), bcols = CeilDiv(k, bw);
  std::vector<double> sums(static_cast<size_t>(brows * bcols), 0.0);
  for (int64_t i = 0; i < m; ++i) {
    double* srow = sums.data() + (i / bh) * bcols;
    for (int64_t j = 0; j < k; ++j) srow[j / bw] += s[i * k + j];
  }
  const std::vector<uint8_t> kept = SelectTopUnits(sums, KeptCount(fraction, brows * bcols));
  for (int64_t i = 0; i < m; ++i) {
    const uint8_t* krow = kept.data() + (i / bh) * bcols;
    for (int64_t j = 0; j < k; ++j) mask[i * k + j] = krow[j / bw];
  }
}

}  // namespace

Result<std::vector<uint8_t>> ComputeMask(const Pattern& p, std::span<const float> scores,
                                         int64_t m, int64_t k, const std::string& what) {
  Status pst = p.Validate();
  if (!pst.ok()) return pst.WithContext(what + ": pattern " + p.ToString());
  SPARQ_RETURN_IF_ERROR(CheckScores(scores, m, k, what));
  const int64_t total = m * k;
  std::vector<uint8_t> mask(static_cast<size_t>(total), 1);
  const float* s = scores.data();
  std::vector<float> scratch;
  switch (p.kind) {
    case PatternKind::kDense:
      break;
    case PatternKind::kUnstructured:
      if (p.per_row) {
        const int64_t keep = KeptCount(p.fraction, k);
        for (int64_t i = 0; i < m; ++i) {
          SelectTopContiguous(s + i * k, k, keep, mask.data() + i * k, &scratch);
        }
      } else {
        SelectTopContiguous(s, total, KeptCount(p.fraction, total), mask.data(), &scratch);
      }
      break;
    case PatternKind::kRows: {
      std::vector<double> sums(m, 0.0);
      for (int64_t i = 0; i < m; ++i) {
        double acc = 0;
        for (int64_t j = 0; j < k; ++j) acc += s[i * k + j];
        sums[i] = acc;
      }
      const std::vector<uint8_t> kept = SelectTopUnits(sums, KeptCount(p.fraction, m));
      for (int64_t i = 0; i < m; ++i) std::fill_n(mask.data() + i * k, k, kept[i]);
      break;
    }
    case PatternKind::kCols: {
      std::vector<double> sums(k, 0.0);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < k; ++j) sums[j] += s[i * k + j];
      }
      const std::vector<uint8_t> kept = SelectTopUnits(sums, KeptCount(p.fraction, k));
      for (int64_t i = 0; i < m; ++i) std::copy(kept.begin(), kept.end(), mask.data() + i * k);
      break;
    }
    case PatternKind::kNM:
      MaskNM(s, m, k, p.n, p.m, mask.data());
      break;
    case PatternKind::kBlock:
      MaskBlocks(s, m, k, p.bh, p.bw, p.fraction, mask.data());
      break;
    case PatternKind::kVNM:
      MaskVNM(s, m, k, p.v, p.n, p.m, mask.data());
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
