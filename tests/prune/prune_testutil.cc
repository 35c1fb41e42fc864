#include "prune/prune_testutil.h"

#include <cmath>
#include <set>

#include "sparq/synthetic.h"

namespace sparq::testing {

Problem MakeProblem(int64_t m, int64_t k, int64_t n, uint64_t seed) {
  Problem pr;
  pr.m = m;
  pr.k = k;
  pr.n = n;
  pr.w = SyntheticWeights(m, k, seed);
  pr.x = SyntheticInputs(n, k, seed);
  pr.h.assign(static_cast<size_t>(k * k), 0.0);
  for (int64_t t = 0; t < n; ++t) {
    const float* xr = pr.x.data() + t * k;
    for (int64_t i = 0; i < k; ++i) {
      for (int64_t j = 0; j < k; ++j) pr.h[i * k + j] += static_cast<double>(xr[i]) * xr[j];
    }
  }
  for (double& v : pr.h) v /= static_cast<double>(n);
  return pr;
}

std::string CheckPattern(const Pattern& p, const std::vector<float>& w, int64_t m, int64_t k) {
  auto nz = [&](int64_t i, int64_t j) { return w[i * k + j] != 0.0f; };
  auto count_zeros = [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    int64_t z = 0;
    for (int64_t i = r0; i < r1; ++i) {
      for (int64_t j = c0; j < c1; ++j) z += !nz(i, j);
    }
    return z;
  };
  switch (p.kind) {
    case PatternKind::kDense:
      return "";
    case PatternKind::kUnstructured: {
      if (p.per_row) {
        for (int64_t i = 0; i < m; ++i) {
          const int64_t z = count_zeros(i, i + 1, 0, k);
          if (z != std::llround(p.fraction * k)) {
            return "row " + std::to_string(i) + " has " + std::to_string(z) + " zeros";
          }
        }
        return "";
      }
      const int64_t z = count_zeros(0, m, 0, k);
      return z == std::llround(p.fraction * m * k) ? "" : "layer has " + std::to_string(z) + " zeros";
    }
    case PatternKind::kNM:
    case PatternKind::kVNM: {
      const int64_t v = p.kind == PatternKind::kVNM ? p.v : 1;
      for (int64_t r0 = 0; r0 < m; r0 += v) {
        for (int64_t g = 0; g < k; g += p.m) {
          const int64_t len = std::min<int64_t>(p.m, k - g);
          std::set<int64_t> cols;
          for (int64_t i = r0; i < std::min(m, r0 + v); ++i) {
            int64_t row_nz = 0;
            for (int64_t j = g; j < g + len; ++j) {
              if (nz(i, j)) {
                cols.insert(j);
                ++row_nz;
              }
            }
            if (row_nz != std::min<int64_t>(p.n, len)) {
              return "row " + std::to_string(i) + " group at " + std::to_string(g) + " has " +
                     std::to_string(row_nz) + " nonzeros";
            }
          }
          if (static_cast<int64_t>(cols.size()) > std::min<int64_t>(p.n, len)) {
            return "row block " + std::to_string(r0) + " group at " + std::to_string(g) +
                   " uses " + std::to_string(cols.size()) + " columns";
          }
        }
      }
      return "";
    }
    case PatternKind::kBlock: {
      int64_t zero_blocks = 0, blocks = 0;
      for (int64_t i = 0; i < m; i += p.bh) {
        for (int64_t j = 0; j < k; j += p.bw) {
          const int64_t i1 = std::min(m, i + p.bh), j1 = std::min(k, j + p.bw);
          const int64_t z = count_zeros(i, i1, j, j1);
          ++blocks;
          if (z == (i1 - i) * (j1 - j)) {
            ++zero_blocks;
          } else if (z != 0) {
            return "block at (" + std::to_string(i) + ", " + std::to_string(j) + ") partly zero";
          }
        }
      }
      return zero_blocks == std::llround(p.fraction * blocks)
                 ? ""
                 : std::to_string(zero_blocks) + " of " + std::to_string(blocks) + " blocks zero";
    }
    case PatternKind::kRows: {
      int64_t zr = 0;
      for (int64_t i = 0; i < m; ++i) {
        const int64_t z = count_zeros(i, i + 1, 0, k);
        if (z == k) ++zr;
        else if (z) return "row " + std::to_string(i) + " partly zero";
      }
      return zr == std::llround(p.fraction * m) ? "" : std::to_string(zr) + " zero rows";
    }
    case PatternKind::kCols: {
      int64_t zc = 0;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t z = count_zeros(0, m, j, j + 1);
        if (z == m) ++zc;
        else if (z) return "column " + std::to_string(j) + " partly zero";
      }
      return zc == std::llround(p.fraction * k) ? "" : std::to_string(zc) + " zero columns";
    }
  }
  return "unknown pattern";
}

double DirectError(const Problem& pr, const std::vector<float>& wp) {
  double num = 0, den = 0;
  for (int64_t t = 0; t < pr.n; ++t) {
    const float* xr = pr.x.data() + t * pr.k;
    for (int64_t i = 0; i < pr.m; ++i) {
      double y = 0, yp = 0;
      for (int64_t j = 0; j < pr.k; ++j) {
        y += static_cast<double>(xr[j]) * pr.w[i * pr.k + j];
        yp += static_cast<double>(xr[j]) * wp[i * pr.k + j];
      }
      num += (y - yp) * (y - yp);
      den += y * y;
    }
  }
  return num / den;
}

std::vector<Pattern> AllPatterns() {
  return {Pattern::NM(2, 4),           Pattern::NM(4, 8),         Pattern::NM(1, 4),
          Pattern::Unstructured(0.5),  Pattern::Unstructured(0.5, true),
          Pattern::Block(8, 8, 0.5),   Pattern::Block(1, 4, 0.5), Pattern::VNM(4, 2, 4),
          Pattern::Rows(0.3),          Pattern::Cols(0.3)};
}

}  // namespace sparq::testing
