// Synthetic calibration problems for tests, benchmarks and `sparq prune-layer-synth` (internal).
#pragma once

#include <cstdint>
#include <vector>

namespace sparq::prune_internal {

// Correlated inputs X[n, k] = Z L with a few large-variance "outlier" features, as LLM activations
// have: X = (0.3 Z_k + Z_r Q) S, Z_k [n, k] and Z_r [n, r] i.i.d. N(0, 1), Q [r, k] N(0, 1/r) with
// r = max(4, k / 16) shared factors, S diagonal with log-normal column scales exp(N(0, 0.25)) and
// max(1, k / 100) outlier columns scaled by `outlier_scale`. Deterministic for a seed (own
// Box-Muller over splitmix64, independent of the standard library).
std::vector<float> SyntheticInputs(int64_t n, int64_t k, uint64_t seed, double outlier_scale = 20.0);
// W[m, k] i.i.d. N(0, 1/k).
std::vector<float> SyntheticWeights(int64_t m, int64_t k, uint64_t seed);
// Standard normal samples (Box-Muller on splitmix64).
class Gaussian {
 public:
  explicit Gaussian(uint64_t seed) : state_(seed) {}
  double Next();
  uint64_t NextU64();

 private:
  uint64_t state_;
  bool have_ = false;
  double spare_ = 0;
};

}  // namespace sparq::prune_internal
