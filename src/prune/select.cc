// Keep-mask selection from scores for every pattern (shared by magnitude, Wanda and, per column
// block, SparseGPT), and the checks that a pattern fits a shape.
#include "src/prune/select.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "sparq/prune.h"

namespace sparq {
namespace prune_internal {

int64_t CumulativeCount(double f, int64_t before, int64_t after) {
  return std::llround(f * static_cast<double>(after)) - std::llround(f * static_cast<double>(before));
}

void PruneLowest(const float* s, int64_t n, int64_t nprune, uint8_t* keep, int64_t keep_stride,
                 std::vector<float>* scratch) {
  if (nprune <= 0) return;
  if (nprune >= n) {
    for (int64_t i = 0; i < n; ++i) keep[i * keep_stride] = 0;
    return;
  }
  // Threshold t = the nprune-th smallest score; prune everything below t, then the elements equal
  // to t from the highest index down (so the lower index is kept on ties).
  scratch->assign(s, s + n);
  std::nth_element(scratch->begin(), scratch->begin() + (nprune - 1), scratch->end());
  const float t = (*scratch)[nprune - 1];
  int64_t below = 0;
  for (int64_t i = 0; i < n; ++i) below += s[i] < t;
  int64_t ties = nprune - below;
  for (int64_t i = 0; i < n; ++i) {
    if (s[i] < t) keep[i * keep_stride] = 0;
  }
  for (int64_t i = n - 1; i >= 0 && ties > 0; --i) {
    if (s[i] == t) {
      keep[i * keep_stride] = 0;
      --ties;
    }
  }
}

void KeepTopInGroup(const float* s, int64_t len, int64_t nkeep, uint8_t* keep) {
  // Small groups (M <= 16): selection by repeated max; ties -> lower index kept.
  for (int64_t i = 0; i < len; ++i) keep[i] = 0;
  for (int64_t c = 0; c < std::min(nkeep, len); ++c) {
    int64_t best = -1;
    for (int64_t i = 0; i < len; ++i) {
      if (!keep[i] && (best < 0 || s[i] > s[best])) best = i;
    }
    keep[best] = 1;
  }
}

}  // namespace prune_internal

using prune_internal::CumulativeCount;
using prune_internal::KeepTopInGroup;
using prune_internal::PruneLowest;

Status CheckPatternFits(const Pattern& p, int64_t m, int64_t k, const std::string& what) {
  SPARQ_RETURN_IF_ERROR(p.Validate().WithContext(what));
  if (m < 0 || k < 0) return InvalidInput(what + ": negative shape");
  if (p.kind == PatternKind::kNM || p.kind == PatternKind::kVNM) {
    if (k < p.m) {
      return InvalidInput(what + ": pattern " + p.ToString() + " needs at least " +
                          std::to_string(p.m) + " columns, the weight has " + std::to_string(k));
    }
  }
  if (p.kind == PatternKind::kVNM && m < p.v) {
    return InvalidInput(what + ": pattern " + p.ToString() + " needs at least " +
                        std::to_string(p.v) + " rows, the weight has " + std::to_string(m));
  }
  if (p.kind == PatternKind::kBlock && (p.bh > m || p.bw > k)) {
    return InvalidInput(what + ": block " + std::to_string(p.bh) + "x" + std::to_string(p.bw) +
                        " is larger than the weight (" + std::to_string(m) + " x " +
                        std::to_string(k) + ")");
  }
  return Status::Ok();
}

Result<std::vector<uint8_t>> SelectMask(const Pattern& p, std::span<const float> scores, int64_t m,
                                        int64_t k, bool row_wise, ThreadPool* pool,
                                        const std::string& what) {
  SPARQ_RETURN_IF_ERROR(CheckPatternFits(p, m, k, what));
  if (static_cast<uint64_t>(scores.size()) != static_cast<uint64_t>(m) * static_cast<uint64_t>(k)) {
    return InvalidInput(what + ": score count does not match the shape");
  }
  for (size_t i = 0; i < scores.size(); ++i) {
    if (!std::isfinite(scores[i])) {
      return InvalidInput(what + ": non-finite score at (" + std::to_string(i / k) + ", " +
                          std::to_string(i % k) + ")");
    }
  }
  std::vector<uint8_t> keep(scores.size(), 1);
  const float* s = scores.data();
  auto for_rows = [&](int64_t n, const std::function<void(int64_t)>& fn) {
    if (pool && n > 1) {
      pool->ParallelFor(n, [&](int64_t i, int) { fn(i); });
    } else {
      for (int64_t i = 0; i < n; ++i) fn(i);
    }
  };
  switch (p.kind) {
    case PatternKind::kDense:
      break;
    case PatternKind::kUnstructured: {
      if (p.per_row || row_wise) {
        for_rows(m, [&](int64_t i) {
          std::vector<float> scratch;
          const int64_t n = p.per_row ? std::llround(p.fraction * static_cast<double>(k))
                                      : CumulativeCount(p.fraction, i * k, (i + 1) * k);
          PruneLowest(s + i * k, k, n, keep.data() + i * k, 1, &scratch);
        });
      } else {
        std::vector<float> scratch;
        PruneLowest(s, m * k, std::llround(p.fraction * static_cast<double>(m * k)), keep.data(), 1,
                    &scratch);
      }
      break;
    }
    case PatternKind::kRows: {
      std::vector<float> rs(static_cast<size_t>(m)), scratch;
      for (int64_t i = 0; i < m; ++i) {
        double acc = 0;
        for (int64_t j = 0; j < k; ++j) acc += s[i * k + j];
        rs[i] = static_cast<float>(acc);
      }
      std::vector<uint8_t> rk(static_cast<size_t>(m), 1);
      PruneLowest(rs.data(), m, std::llround(p.fraction * static_cast<double>(m)), rk.data(), 1,
                  &scratch);
      for (int64_t i = 0; i < m; ++i) {
        if (!rk[i]) std::fill(keep.begin() + i * k, keep.begin() + (i + 1) * k, 0);
      }
      break;
    }
    case PatternKind::kCols: {
      std::vector<double> acc(static_cast<size_t>(k), 0.0);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < k; ++j) acc[j] += s[i * k + j];
      }
      std::vector<float> cs(acc.begin(), acc.end()), scratch;
      std::vector<uint8_t> ck(static_cast<size_t>(k), 1);
      PruneLowest(cs.data(), k, std::llround(p.fraction * static_cast<double>(k)), ck.data(), 1,
                  &scratch);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < k; ++j) keep[i * k + j] = ck[j];
      }
      break;
    }
    case PatternKind::kNM:
    case PatternKind::kVNM: {
      const int64_t v = p.kind == PatternKind::kVNM ? p.v : 1;
      const int64_t nrb = (m + v - 1) / v;
      for_rows(nrb, [&](int64_t rb) {
        const int64_t r0 = rb * v, r1 = std::min(m, r0 + v);
        float gs[16];
        uint8_t gk[16];
        for (int64_t g0 = 0; g0 < k; g0 += p.m) {
          const int64_t len = std::min<int64_t>(p.m, k - g0);
          for (int64_t j = 0; j < len; ++j) {
            double acc = 0;
            for (int64_t r = r0; r < r1; ++r) acc += s[r * k + g0 + j];
            gs[j] = static_cast<float>(acc);
          }
          KeepTopInGroup(gs, len, p.n, gk);
          for (int64_t r = r0; r < r1; ++r) {
            for (int64_t j = 0; j < len; ++j) keep[r * k + g0 + j] = gk[j];
          }
        }
      });
      break;
    }
    case PatternKind::kBlock: {
      const int64_t nbr = (m + p.bh - 1) / p.bh, nbc = (k + p.bw - 1) / p.bw;
      std::vector<float> bs(static_cast<size_t>(nbr * nbc)), scratch;
      for (int64_t bi = 0; bi < nbr; ++bi) {
        for (int64_t bj = 0; bj < nbc; ++bj) {
          double acc = 0;
          for (int64_t i = bi * p.bh; i < std::min(m, (bi + 1) * p.bh); ++i) {
            for (int64_t j = bj * p.bw; j < std::min(k, (bj + 1) * p.bw); ++j) acc += s[i * k + j];
          }
          bs[bi * nbc + bj] = static_cast<float>(acc);
        }
      }
      std::vector<uint8_t> bk(bs.size(), 1);
      PruneLowest(bs.data(), nbr * nbc, std::llround(p.fraction * static_cast<double>(nbr * nbc)),
                  bk.data(), 1, &scratch);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < k; ++j) keep[i * k + j] = bk[(i / p.bh) * nbc + j / p.bw];
      }
      break;
    }
  }
  return keep;
}

}  // namespace sparq
