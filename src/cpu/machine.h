// Measured machine limits (for `sparq bench machine` and the kernel benchmark's ratios).
#pragma once

#include <cstdint>

namespace sparq::cpu {

// Best of 3 runs of an FMA-only loop on `threads` threads (GFLOP/s, f32, 2 flops per FMA lane).
double MeasurePeakFmaGflops(int threads);

// The FMA loop's chains: chain i starts at FmaChainStart(i) and steps a <- a * kFmaMul + kFmaAdd.
inline constexpr float kFmaMul = 0.999999f;
inline constexpr float kFmaAdd = 1e-7f;
constexpr float FmaChainStart(int i) { return 1.0f + 0.0625f * static_cast<float>(i); }
// One run of the loop on this thread (best dispatched target): the sum over chains of one lane's
// final value; *flops = what it counted, *chains = how many chains it ran.
double FmaLoop(int64_t iters, int64_t* flops, int* chains);
// Best of 5 sums over `bytes` (split across `threads` threads) in GB/s.
double MeasureReadGbps(int threads, int64_t bytes);

}  // namespace sparq::cpu

#include <string>

namespace sparq::cpu {

// The kernel family OpenBLAS chose at load time ("SkylakeX", "Haswell", "Prescott", ...).
std::string BlasCoreName();
// When OpenBLAS fell back to pre-AVX2 kernels on a CPU that has AVX2 or AVX-512 (a model number
// too new for its table) and OPENBLAS_CORETYPE is unset: the family to force ("SkylakeX" or
// "Haswell"); otherwise nullptr. OpenBLAS reads the variable only when it loads, so a program has
// to set it and restart itself (the `sparq` command line does) or be started with it.
const char* SuggestedOpenBlasCore();

}  // namespace sparq::cpu
