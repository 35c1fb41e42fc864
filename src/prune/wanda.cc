// Wanda (Sun et al. 2024): score |W_ij| * ||X_j||_2, compared within each output row (per-layer
// unstructured targets are spread over rows by cumulative rounding), within N:M groups and within
// blocks. ||X_j||_2 comes from diag(H) (any positive scale gives the same masks).
#include <cmath>

#include "src/prune/prune_internal.h"

namespace sparq::prune_internal {

std::vector<float> WandaScores(std::span<const float> w, int64_t m, int64_t k,
                               std::span<const double> h) {
  std::vector<double> norms = ColumnNormsFromHessian(h, k);
  std::vector<float> s(w.size());
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < k; ++j) {
      s[i * k + j] = static_cast<float>(std::abs(static_cast<double>(w[i * k + j])) * norms[j]);
    }
  }
  return s;
}

}  // namespace sparq::prune_internal
