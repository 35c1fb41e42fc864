// What the from-scratch trainers (the MLP of sparq/train_mlp.h, the Llama of sparq/train_lm.h)
// share: a portable normal draw and the 2:4 mask of a run of weights.
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>
#include <random>

namespace sparq::train {

// A standard normal from two uniforms (Box-Muller), the same on every standard library (the
// distributions of <random> are implementation-defined; the engine is not).
inline double Normal(std::mt19937_64& rng) {
  const double u1 = (static_cast<double>(rng() >> 11) + 0.5) * 0x1.0p-53;
  const double u2 = static_cast<double>(rng() >> 11) * 0x1.0p-53;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

// The 2:4 mask of one row: the 2 largest |w| of each group of 4 (ties: the lower index). Branch
// free: entry i is kept when fewer than 2 entries outrank it (j outranks i when |w_j| > |w_i|, or
// |w_j| == |w_i| and j < i), so the compiler can vectorize across groups.
inline void MaskRow2of4(const float* __restrict w, int64_t cols, uint8_t* __restrict m) {
  for (int64_t g = 0; g < cols; g += 4) {
    const float a[4] = {std::fabs(w[g]), std::fabs(w[g + 1]), std::fabs(w[g + 2]),
                        std::fabs(w[g + 3])};
    for (int i = 0; i < 4; ++i) {
      int above = 0;
      for (int j = 0; j < 4; ++j) above += j < i ? (a[j] >= a[i]) : (j > i && a[j] > a[i]);
      m[g + i] = above < 2 ? 1 : 0;
    }
  }
}

// MaskRow2of4 of w[0, count) (count a multiple of 4, groups from w[0]) into mask, and
// weff[i] = mask[i] ? w[i] : 0, vectorized (sparse24_simd.cc): the same bytes and values as the
// scalar loops on every target.
void MaskAndApply2of4(const float* w, int64_t count, uint8_t* mask, float* weff);
// SGD with momentum over count entries, as PyTorch's with SR-STE's decay on pruned entries:
// v = mu * v + (kept ? g : g + lambda * w); w -= lr * v; weff (unless null) = kept ? w : 0;
// kept = mask[i] != 0, every entry when mask is null. Vectorized with the scalar loop's bits.
void SgdMomentumRun(const float* g, const uint8_t* mask, int64_t count, float mu, float lr,
                    float lambda, float* v, float* w, float* weff);
// The Highway target MaskAndApply2of4 and SgdMomentumRun dispatch to now (for the tests).
const char* MaskAndApply2of4Target();

}  // namespace sparq::train
