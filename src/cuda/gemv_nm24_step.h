// One lane's step of gemv_nm24_bf16_warp (src/cuda/gemv_nm24_bf16.cu): 16 columns of one row of a
// 2:4 bf16 W in sparq's stored layout against up to 16 tokens. Shared by the kernel and a host
// test (tests/cuda/gemv_nm24_step_test.cc), which runs this very code for all 32 lanes on the CPU,
// so the layout arithmetic is checked where no GPU is.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define SPARQ_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define SPARQ_HOST_DEVICE inline
#endif

namespace sparq::cuda {

inline constexpr int kGemvNm24StepCols = 16;  // 8 kept bf16 (16 bytes) + 16 bits of metadata

SPARQ_HOST_DEVICE float F32FromWord(uint32_t w) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(w);
#else
  float f;
  std::memcpy(&f, &w, sizeof(f));
  return f;
#endif
}
// bf16 is the top half of an f32: the low or high half-word of a 32-bit word as f32.
SPARQ_HOST_DEVICE float Bf16Lo(uint32_t w) { return F32FromWord(w << 16); }
SPARQ_HOST_DEVICE float Bf16Hi(uint32_t w) { return F32FromWord(w & 0xFFFF0000u); }

// Activation i (0..3) of a group of four bf16 loaded as two words.
SPARQ_HOST_DEVICE float PickBf16(uint32_t lo, uint32_t hi, uint32_t i) {
  const uint32_t w = i < 2 ? lo : hi;
  return (i & 1) ? Bf16Hi(w) : Bf16Lo(w);
}

// w[0..3]: the step's 8 kept values as loaded (value 2q in the low half of w[q], 2q + 1 in the
// high half: little-endian bf16 pairs); meta: the step's 4 nibbles, group q in bits [4q, 4q + 4),
// first kept index in the low 2 bits. load_x4(t, c, &lo, &hi) loads activations c..c+3 of token
// t (two words). acc[t] += sum over the 8 kept values of w * x, in f32 FMA.
template <int N, typename LoadX4>
SPARQ_HOST_DEVICE void GemvNm24Step(const uint32_t w[4], uint32_t meta, int64_t col0,
                                    const LoadX4& load_x4, float acc[N]) {
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int q = 0; q < 4; ++q) {
    const uint32_t i0 = (meta >> (4 * q)) & 3, i1 = (meta >> (4 * q + 2)) & 3;
    const float w0 = Bf16Lo(w[q]), w1 = Bf16Hi(w[q]);
    const int64_t col = col0 + 4 * q;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int t = 0; t < N; ++t) {
      uint32_t lo, hi;
      load_x4(t, col, &lo, &hi);
      acc[t] = fmaf(w0, PickBf16(lo, hi, i0), acc[t]);
      acc[t] = fmaf(w1, PickBf16(lo, hi, i1), acc[t]);
    }
  }
}

}  // namespace sparq::cuda
