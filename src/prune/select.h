// Internal helpers of src/prune (not part of the public API).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "sparq/prune.h"

namespace sparq::prune_internal {

// llround(f * after) - llround(f * before): how many of the candidates in (before, after] to prune
// so that every prefix, and the whole, prunes exactly llround(f * count).
int64_t CumulativeCount(double f, int64_t before, int64_t after);

// Clears keep[i * keep_stride] for the `nprune` lowest of s[0..n); ties: the higher index is pruned
// first (the lower index is kept). Deterministic.
void PruneLowest(const float* s, int64_t n, int64_t nprune, uint8_t* keep, int64_t keep_stride,
                 std::vector<float>* scratch);

// keep[0..len) = 1 for the nkeep highest of s[0..len) (ties: lower index), 0 elsewhere.
void KeepTopInGroup(const float* s, int64_t len, int64_t nkeep, uint8_t* keep);

// SparseGPT on W (in place) with H; fills the SparseGPT-specific report fields.
Status SparseGpt(std::span<float> w, int64_t m, int64_t k, std::span<const double> h,
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
