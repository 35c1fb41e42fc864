// Synthetic calibration problems (prune room): correlated inputs and random weights for tests,
// benchmarks and `sparq prune-layer-synth`. Deterministic for a seed on every machine and
// for any thread count (own Box-Muller over splitmix64, independent of the standard library; the
// one matrix product runs on a fixed tile grid). Thread-safe: no shared state.
#pragma once

#include <cstdint>
#include <vector>

namespace sparq {

// Correlated inputs X[n, k] (row-major) with a few large-variance "outlier" features, as LLM
// activations have: X = (0.3 Z_k + Z_r Q) S, Z_k [n, k] and Z_r [n, r] i.i.d. N(0, 1), Q [r, k]
// N(0, 1/r) with r = max(4, k / 16) shared factors, S diagonal with log-normal column scales
// exp(N(0, 0.25)) and max(1, k / 100) outlier columns scaled by `outlier_scale`.
std::vector<float> SyntheticInputs(int64_t n, int64_t k, uint64_t seed, double outlier_scale = 20.0);
// W[m, k] (row-major) i.i.d. N(0, 1/k).
std::vector<float> SyntheticWeights(int64_t m, int64_t k, uint64_t seed);

}  // namespace sparq
