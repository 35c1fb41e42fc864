// Per-layer sparsity allocation: explicit lists, and OWL (Yin et al. 2024, "Outlier Weighed
// Layerwise Sparsity"): layers with more outlier Wanda scores keep more weights.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "sparq/prune.h"

namespace sparq {
namespace {

Result<double> ParseFraction(std::string_view s, const std::string& what) {
  std::string str(s);
  char* end = nullptr;
  const double v = std::strtod(str.c_str(), &end);
  if (str.empty() || end != str.c_str() + str.size() || !(v >= 0.0 && v <= 1.0)) {
    return InvalidInput(what + ": '" + str + "' is not a sparsity in [0, 1]");
  }
  return v;
}

}  // namespace

Result<std::vector<double>> ParseSparsityList(std::string_view spec, int64_t num_layers) {
  std::vector<double> out;
  size_t start = 0;
  while (start <= spec.size()) {
    const size_t comma = spec.find(',', start);
    const std::string_view item =
        spec.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    SPARQ_ASSIGN_OR_RETURN(double v, ParseFraction(item, "sparsity list item " +
                                                             std::to_string(out.size())));
    out.push_back(v);
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  if (out.size() == 1 && num_layers > 1) out.assign(static_cast<size_t>(num_layers), out[0]);
  if (static_cast<int64_t>(out.size()) != num_layers) {
    return InvalidInput("sparsity list has " + std::to_string(out.size()) + " entries for " +
                        std::to_string(num_layers) + " layers");
  }
  return out;
}

double OutlierRatio(std::span<const float> w, int64_t m, int64_t k,
                    std::span<const double> col_norms, double threshold) {
  if (m * k == 0) return 0.0;
  double mean = 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < k; ++j) mean += std::abs(static_cast<double>(w[i * k + j])) * col_norms[j];
  }
  mean /= static_cast<double>(m * k);
  int64_t count = 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < k; ++j) {
      count += std::abs(static_cast<double>(w[i * k + j])) * col_norms[j] > threshold * mean;
    }
  }
  return static_cast<double>(count) / static_cast<double>(m * k);
}

Result<std::vector<double>> OwlSparsities(std::span<const double> outlier_ratios,
                                          std::span<const int64_t> numel, double target,
                                          double lambda) {
  const size_t n = outlier_ratios.size();
  if (numel.size() != n) return InvalidInput("OWL: one parameter count per layer is needed");
  if (!(target >= 0.0 && target <= 1.0)) return InvalidInput("OWL: target sparsity not in [0, 1]");
  if (!(lambda >= 0.0 && lambda <= 0.5)) return InvalidInput("OWL: lambda not in [0, 0.5]");
  if (n == 0) return std::vector<double>{};
  double total = 0;
  for (size_t l = 0; l < n; ++l) {
    if (numel[l] <= 0 || !std::isfinite(outlier_ratios[l])) {
      return InvalidInput("OWL: layer " + std::to_string(l) + " has no parameters or a bad ratio");
    }
    total += static_cast<double>(numel[l]);
  }
  const auto [lo, hi] = std::minmax_element(outlier_ratios.begin(), outlier_ratios.end());
  std::vector<double> norm(n, 0.0);
  if (*hi > *lo) {
    for (size_t l = 0; l < n; ++l) norm[l] = (outlier_ratios[l] - *lo) / (*hi - *lo) * 2 * lambda;
  }
  // density_l(c) = clamp(c + norm_l, 0, 1) is monotone in c: bisect for the weighted mean density
  // 1 - target.
  auto mean_density = [&](double c) {
    double s = 0;
    for (size_t l = 0; l < n; ++l) s += std::clamp(c + norm[l], 0.0, 1.0) * numel[l];
    return s / total;
  };
  double a = -1.0 - 2 * lambda, b = 1.0;
  for (int it = 0; it < 200; ++it) {
    const double c = 0.5 * (a + b);
    (mean_density(c) < 1.0 - target ? a : b) = c;
  }
  std::vector<double> out(n);
  for (size_t l = 0; l < n; ++l) out[l] = 1.0 - std::clamp(0.5 * (a + b) + norm[l], 0.0, 1.0);
  return out;
}

}  // namespace sparq
