// The per-entry AdamW update (src/train/adamw.cc's inner loop), vectorized with Highway's dynamic
// dispatch. Every lane does the scalar loop's exact operations in its order (f32 -> f64, mul, add,
// sub, div, sqrt, f64 -> f32; no fused multiply-add: the file builds with -ffp-contract=off), so
// every target gives the same bits as the scalar loop.
#pragma once

#include <cstdint>

namespace sparq::train {

// The step's constants: gi = g * clip; m = b1 * m + one_b1 * gi; v = b2 * v + one_b2 * gi * gi;
// p = p * decay - lr * (m / bc1) / (sqrt(v / bc2) + eps).
struct AdamWUpdateArgs {
  double clip, b1, one_b1, b2, one_b2, bc1, bc2, decay, lr, eps;
};

// n trainable entries: entry i has moments m[i], v[i] and sits at p[at], g[at] with at = kept[i]
// (kept ascending, or null: at = i).
void AdamWUpdate(const AdamWUpdateArgs& a, const float* g, float* p, const int64_t* kept, float* m,
                 float* v, int64_t n);
// The Highway target AdamWUpdate dispatches to now (for the tests).
const char* AdamWUpdateTarget();

}  // namespace sparq::train
