// Internal helpers of src/prune (not part of the public API).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "sparq/prune.h"

namespace sparq::prune_internal {

// SparseGPT on W (in place) with H; fills the SparseGPT-specific report fields.
Status SparseGpt(std::span<float> w, int64_t m, int64_t k, std::span<const double> h,
                 const Pattern& p, const PruneOptions& opt, PruneReport* report);

// SparseGPT with opt.act_order (PruneOptions): static groups fitted, columns swept in order of
// decreasing H_jj, W returned in its original column order.
Status SparseGptActOrder(std::span<float> w, int64_t m, int64_t k, std::span<const double> h,
                         const Pattern& p, const PruneOptions& opt, PruneReport* report);

// Upper Cholesky factor U of (H + lambda I)^-1 (Hinv = U^T U), in double, k x k row-major.
// Returns false if H + lambda I is not positive definite.
bool InverseCholeskyUpper(std::span<const double> h, int64_t k, double lambda,
                          std::vector<double>* u);

// Applies the quantizer (round to nearest, no feedback) to the kept weights; FitGroup per group.
void QuantizeKept(std::span<float> w, std::span<const uint8_t> keep, int64_t m, int64_t k,
                  Quantizer* q, ThreadPool* pool);

}  // namespace sparq::prune_internal

namespace sparq::prune_internal {
std::vector<float> MagnitudeScores(std::span<const float> w);
std::vector<float> WandaScores(std::span<const float> w, int64_t m, int64_t k,
                               std::span<const double> h);
}  // namespace sparq::prune_internal
