// The masked weight gradient of a linear layer whose mask is fixed (sparse fine-tuning): only the
// kept weights' dot products (a sampled dense-dense product, SDDMM), not the dense dY^T X.
#pragma once

#include <cstdint>
#include <span>

#include "sparq/kernel_config.h"
#include "sparq/status.h"
#include "sparq/thread_pool.h"

namespace sparq::cpu {

// dw_kept[i] += sum_{t < n} dy[t * m + r_i] * x[t * k + c_i] for kept[i] = r_i * k + c_i, with
// kept strictly ascending (row-major order: what a mask's flat positions give). dy is [n, m], x
// [n, k]. Each sum runs over token tiles in order and within a tile in a fixed tree, so the bits
// do not depend on pool's threads (they differ from a dense product's by f32 rounding). Errors:
// sizes, or a position outside [0, m * k) or out of order, naming which. pool may be null.
Status MaskedWeightGrad(std::span<const float> dy, std::span<const float> x, int64_t n, int64_t k,
                        int64_t m, std::span<const int64_t> kept, std::span<float> dw_kept,
                        ThreadPool* pool, const KernelConfig& cfg);

// Whether MaskedWeightGrad takes its windowed form for this mask under cfg's target: m and k
// multiples of the target's f32 lanes L, and every row keeping exactly S = 1, 2, 4 or 8 weights in
// every window of L columns (N:M masks with m dividing L: 2:4, 1:4, 4:8, ...). That form is
// measured at about the dense dW's time at 2:4 and 1.9x faster at 1:4 (docs/kernels.md).
bool MaskedWeightGradWindowed(int64_t k, int64_t m, std::span<const int64_t> kept,
                              const KernelConfig& cfg);

}  // namespace sparq::cpu
