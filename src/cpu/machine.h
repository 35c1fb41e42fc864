// Measured machine limits (for `sparq bench machine` and the kernel benchmark's ratios).
#pragma once

#include <cstdint>

namespace sparq::cpu {

// Best of 3 runs of an FMA-only loop on `threads` threads (GFLOP/s, f32, 2 flops per FMA lane).
double MeasurePeakFmaGflops(int threads);
// Best of 5 sums over `bytes` (split across `threads` threads) in GB/s.
double MeasureReadGbps(int threads, int64_t bytes);

}  // namespace sparq::cpu
