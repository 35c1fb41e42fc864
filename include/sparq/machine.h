// Measured machine limits (for `sparq bench machine` and the kernel benchmark's ratios).
#pragma once

#include <cstdint>

#include "sparq/kernel_config.h"

namespace sparq::cpu {

// The Measure* limits run on the target of `cfg` (its vectors), as the kernels they bound do: under
// `--max-isa AVX2` an AVX-512 host's limits are those of its AVX2 code.
// Best of 3 runs of an FMA-only loop on `threads` threads (GFLOP/s, f32, 2 flops per FMA lane).
double MeasurePeakFmaGflops(int threads, const KernelConfig& cfg);

// The FMA loop's chains: chain i starts at FmaChainStart(i) and steps a <- a * kFmaMul + kFmaAdd.
inline constexpr float kFmaMul = 0.999999f;
inline constexpr float kFmaAdd = 1e-7f;
constexpr float FmaChainStart(int i) { return 1.0f + 0.0625f * static_cast<float>(i); }
// One run of the loop on this thread, on cfg's target: the sum over chains of one lane's final
// value; *flops = what it counted, *chains = how many chains it ran.
double FmaLoop(int64_t iters, int64_t* flops, int* chains, const KernelConfig& cfg);
// Best of 3 runs of the FMA loop with one fresh L1 load per FMA (GFLOP/s, f32): the ceiling of a
// kernel whose every FMA needs its own load. On this project's AVX-512 host it measured about 70%
// of MeasurePeakFmaGflops (175 of 245 GFLOP/s on one thread, 2026-12-01): vector loads, not
// FMAs, are then the limit.
double MeasureLoadFmaGflops(int threads, const KernelConfig& cfg);
// Its buffer: kLoadFmaBlocks blocks of one vector per chain (16 KiB with 16 chains of 16 lanes).
inline constexpr int kLoadFmaBlocks = 16;
// Every lane of block b's vector for chain j.
constexpr float LoadFmaValue(int b, int j) {
  return 1e-6f * static_cast<float>(1 + (b * 3 + j) % 5);
}
// One run of that loop on this thread: chain j steps a <- LoadFmaValue(i % kLoadFmaBlocks, j) *
// kFmaMul + a from FmaChainStart(j); returns the sum over chains of lane 0, *flops and *chains as
// FmaLoop.
double LoadFmaLoop(int64_t iters, int64_t* flops, int* chains, const KernelConfig& cfg);
// Best of 5 sums over `bytes` (split across `threads` threads) in GB/s.
double MeasureReadGbps(int threads, int64_t bytes, const KernelConfig& cfg);

}  // namespace sparq::cpu

#include <string>

namespace sparq::cpu {

// The kernel family OpenBLAS chose at load time ("SkylakeX", "Haswell", "Prescott", ...).
std::string BlasCoreName();
// When OpenBLAS fell back to pre-AVX2 kernels on a CPU that has AVX2 or AVX-512 (a model number
// too new for its table) and the user did not choose the family (user_chose: the application saw
// OPENBLAS_CORETYPE set): the family to force ("SkylakeX" or "Haswell"); otherwise nullptr.
// OpenBLAS reads the variable only when it loads, so a program has to set it and restart itself
// (the `sparq` command line does) or be started with it.
const char* SuggestedOpenBlasCore(bool user_chose = false);

}  // namespace sparq::cpu
