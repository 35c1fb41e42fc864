// Calibration statistics: H = X^T X / N accumulated in double, Wanda's column norms, the
// Hessian's validation and the reconstruction error computed from H alone.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "sparq/prune.h"
#include "src/core/blas_tiles.h"

namespace sparq {
namespace {

// Rows of X converted to double per dsyrk call: bounds the scratch (256 x k doubles = 8 MiB for
// k = 4096) while keeping the dsyrk's inner dimension large enough to run near peak.
constexpr int64_t kHessianPanelRows = 256;
// Rows of W per dgemm panel in ReconstructionError: 2 x 256 rows of dW and W against H (enough
// rows that each pass over H does ~128 flops per byte of H read).
constexpr int64_t kErrorPanelRows = 256;

}  // namespace

HessianAccumulator::HessianAccumulator(int64_t k)
    : k_(k < 0 ? 0 : k), sum_(static_cast<size_t>(k_ * k_), 0.0) {}

Status HessianAccumulator::Add(const float* x, int64_t rows, int64_t k, ThreadPool* pool,
                               const std::string& what) {
  if (k != k_) {
    return InvalidInput(what + ": has " + std::to_string(k) + " columns, the accumulator expects " +
                        std::to_string(k_));
  }
  if (rows < 0) return InvalidInput(what + ": negative row count");
  if (rows == 0 || k_ == 0) return Status::Ok();
  const int64_t panel = std::min(rows, kHessianPanelRows);
  scratch_.resize(static_cast<size_t>(panel * k_));
  for (int64_t r0 = 0; r0 < rows; r0 += panel) {
    const int64_t nr = std::min(panel, rows - r0);
    // Convert (and check) rows in parallel; each task owns whole rows of the scratch.
    std::vector<int64_t> bad(static_cast<size_t>(nr), -1);
    auto convert = [&](int64_t r, int) {
      const float* src = x + (r0 + r) * k_;
      double* dst = scratch_.data() + r * k_;
      for (int64_t j = 0; j < k_; ++j) {
        if (!std::isfinite(src[j]) && bad[r] < 0) bad[r] = j;
        dst[j] = src[j];
      }
    };
    if (pool) {
      pool->ParallelFor(nr, convert);
    } else {
      for (int64_t r = 0; r < nr; ++r) convert(r, 0);
    }
    for (int64_t r = 0; r < nr; ++r) {
      if (bad[r] >= 0) {
        return InvalidInput(what + ": non-finite value at row " + std::to_string(n_ + r0 + r) +
                            ", column " + std::to_string(bad[r]));
      }
    }
    blas::SyrkUpperTransTiled(k_, nr, scratch_.data(), k_, sum_.data(), k_, pool);
  }
  n_ += rows;
  return Status::Ok();
}

std::vector<double> HessianAccumulator::Hessian() const {
  std::vector<double> h(sum_.size(), 0.0);
  if (n_ == 0) return h;
  const double inv = 1.0 / static_cast<double>(n_);
  for (int64_t i = 0; i < k_; ++i) {
    for (int64_t j = i; j < k_; ++j) {
      const double v = sum_[i * k_ + j] * inv;
      h[i * k_ + j] = v;
      h[j * k_ + i] = v;
    }
  }
  return h;
}

std::vector<double> HessianAccumulator::ColumnNorms() const {
  std::vector<double> norms(static_cast<size_t>(k_));
  for (int64_t j = 0; j < k_; ++j) norms[j] = std::sqrt(std::max(sum_[j * k_ + j], 0.0));
  return norms;
}

std::vector<double> ColumnNormsFromHessian(std::span<const double> h, int64_t k,
                                           int64_t num_samples) {
  std::vector<double> norms(static_cast<size_t>(k));
  const double n = static_cast<double>(std::max<int64_t>(num_samples, 1));
  for (int64_t j = 0; j < k; ++j) norms[j] = std::sqrt(std::max(h[j * k + j], 0.0) * n);
  return norms;
}

Status ValidateHessian(std::span<const double> h, int64_t k, const std::string& what) {
  if (k < 0 || static_cast<uint64_t>(h.size()) != static_cast<uint64_t>(k) * static_cast<uint64_t>(k)) {
    return InvalidInput(what + ": expected " + std::to_string(k) + " x " + std::to_string(k) +
                        " values, got " + std::to_string(h.size()));
  }
  for (int64_t i = 0; i < k; ++i) {
    for (int64_t j = 0; j < k; ++j) {
      if (!std::isfinite(h[i * k + j])) {
        return InvalidInput(what + ": non-finite value at (" + std::to_string(i) + ", " +
                            std::to_string(j) + ")");
      }
    }
  }
  for (int64_t i = 0; i < k; ++i) {
    if (h[i * k + i] < 0) {
      return InvalidInput(what + ": not positive semi-definite: diagonal (" + std::to_string(i) +
                          ", " + std::to_string(i) + ") = " + std::to_string(h[i * k + i]) + " < 0");
    }
  }
  for (int64_t i = 0; i < k; ++i) {
    for (int64_t j = i + 1; j < k; ++j) {
      const double a = h[i * k + j], b = h[j * k + i];
      const double scale = std::sqrt(h[i * k + i] * h[j * k + j]);
      if (std::abs(a - b) > 1e-6 * std::max({std::abs(a), std::abs(b), scale, 1e-300})) {
        return InvalidInput(what + ": not symmetric at (" + std::to_string(i) + ", " +
                            std::to_string(j) + "): " + std::to_string(a) + " vs " +
                            std::to_string(b));
      }
      // A PSD matrix has |H_ij| <= sqrt(H_ii H_jj) (2x2 principal minors are >= 0).
      if (std::abs(a) > scale * (1 + 1e-6) + 1e-300) {
        return InvalidInput(what + ": not positive semi-definite: |H(" + std::to_string(i) + ", " +
                            std::to_string(j) + ")| exceeds sqrt(H_ii H_jj)");
      }
    }
  }
  return Status::Ok();
}

double ReconstructionError(std::span<const float> w, std::span<const float> w_pruned, int64_t m,
                           int64_t k, std::span<const double> h, ThreadPool* pool) {
  if (m == 0 || k == 0) return 0.0;
  // Panel rows 0..p-1 hold dW, rows p..2p-1 hold W; T = panel * H (a fixed tile grid, see
  // blas_tiles.h); row-wise dots summed in double in a fixed order: independent of threads.
  const int64_t p = std::min(m, kErrorPanelRows);
  std::vector<double> a(static_cast<size_t>(2 * p * k)), t(static_cast<size_t>(2 * p * k));
  double num = 0.0, den = 0.0;
  for (int64_t r0 = 0; r0 < m; r0 += p) {
    const int64_t nr = std::min(p, m - r0);
    for (int64_t r = 0; r < nr; ++r) {
      const float* wr = w.data() + (r0 + r) * k;
      const float* qr = w_pruned.data() + (r0 + r) * k;
      double* d = a.data() + r * k;
      double* o = a.data() + (nr + r) * k;
      for (int64_t j = 0; j < k; ++j) {
        d[j] = static_cast<double>(wr[j]) - static_cast<double>(qr[j]);
        o[j] = wr[j];
      }
    }
    blas::DgemmTiled(2 * nr, k, k, 1.0, a.data(), k, h.data(), k, 0.0, t.data(), k, pool);
    for (int64_t r = 0; r < nr; ++r) {
      double sn = 0.0, sd = 0.0;
      const double* d = a.data() + r * k;
      const double* td = t.data() + r * k;
      const double* o = a.data() + (nr + r) * k;
      const double* to = t.data() + (nr + r) * k;
      for (int64_t j = 0; j < k; ++j) {
        sn += d[j] * td[j];
        sd += o[j] * to[j];
      }
      num += sn;
      den += sd;
    }
  }
  if (den <= 0.0) return num <= 0.0 ? 0.0 : INFINITY;
  return std::max(num, 0.0) / den;
}

}  // namespace sparq
