// Register transposes: X -> X^T tiles before a tiled call, scratch -> Y after it.
#if defined(SPARQ_CPU_TRANSPOSE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SPARQ_CPU_TRANSPOSE_INL_H_
#undef SPARQ_CPU_TRANSPOSE_INL_H_
#else
#define SPARQ_CPU_TRANSPOSE_INL_H_
#endif

#include "src/cpu/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace sparq::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// dst[j * ldd + i] = src[i * lds + j] for i < rows, j < cols: the X -> X^T tiles before a tiled
// call and the scratch -> Y write after it. Register transposes of 16x16 (AVX-512) or 8x8 (AVX2)
// blocks, scalar at the edges and on the other targets. The scalar loops were 40% of a 99% CSR
// call at n = 512 (4096x4096, one thread, CPU-time profile).
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
inline constexpr int64_t kTransposeBlock = 16;
template <bool kStream>
HWY_INLINE void TransposeSquare(const float* src, int64_t lds, float* dst, int64_t ldd) {
  __m512 r[16], t[16], u[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * lds);
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);      // per 128-bit lane L: a4L b4L a4L+1 b4L+1
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);  // a4L+2 b4L+2 a4L+3 b4L+3
  }
  for (int k = 0; k < 16; k += 4) {  // u[k + m], lane L: column 4L + m of rows k..k+3
    const __m512d t0 = _mm512_castps_pd(t[k]), t1 = _mm512_castps_pd(t[k + 1]);
    const __m512d t2 = _mm512_castps_pd(t[k + 2]), t3 = _mm512_castps_pd(t[k + 3]);
    u[k] = _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2));
    u[k + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2));
    u[k + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3));
    u[k + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3));
  }
  for (int m = 0; m < 4; ++m) {  // column 4L + m = lane L of u[m], u[4 + m], u[8 + m], u[12 + m]
    const __m512 x0 = _mm512_shuffle_f32x4(u[m], u[4 + m], 0x44);
    const __m512 x1 = _mm512_shuffle_f32x4(u[m], u[4 + m], 0xEE);
    const __m512 y0 = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], 0x44);
    const __m512 y1 = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], 0xEE);
    const __m512 o[4] = {_mm512_shuffle_f32x4(x0, y0, 0x88), _mm512_shuffle_f32x4(x0, y0, 0xDD),
                         _mm512_shuffle_f32x4(x1, y1, 0x88), _mm512_shuffle_f32x4(x1, y1, 0xDD)};
    for (int q = 0; q < 4; ++q) {
      if constexpr (kStream) {
        _mm512_stream_ps(dst + (4 * q + m) * ldd, o[q]);
      } else {
        _mm512_storeu_ps(dst + (4 * q + m) * ldd, o[q]);
      }
    }
  }
}
#elif HWY_TARGET == HWY_AVX2
inline constexpr int64_t kTransposeBlock = 8;
template <bool kStream>  // ignored: an 8x8 square writes half lines
HWY_INLINE void TransposeSquare(const float* src, int64_t lds, float* dst, int64_t ldd) {
  __m256 r[8], t[8], u[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * lds);
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int k = 0; k < 8; k += 4) {
    u[k] = _mm256_shuffle_ps(t[k], t[k + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[k + 1] = _mm256_shuffle_ps(t[k], t[k + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[k + 2] = _mm256_shuffle_ps(t[k + 1], t[k + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[k + 3] = _mm256_shuffle_ps(t[k + 1], t[k + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int m = 0; m < 4; ++m) {
    _mm256_storeu_ps(dst + m * ldd, _mm256_permute2f128_ps(u[m], u[4 + m], 0x20));
    _mm256_storeu_ps(dst + (4 + m) * ldd, _mm256_permute2f128_ps(u[m], u[4 + m], 0x31));
  }
}
#else
inline constexpr int64_t kTransposeBlock = 0;
template <bool kStream>
HWY_INLINE void TransposeSquare(const float*, int64_t, float*, int64_t) {}
#endif

template <bool kStream = false>
inline void TransposeBlock(const float* src, int64_t lds, int64_t rows, int64_t cols, float* dst,
                           int64_t ldd) {
  constexpr int64_t B = kTransposeBlock;
  int64_t i0 = 0;
  if constexpr (B > 0) {
    for (; i0 + B <= rows; i0 += B) {
      int64_t j0 = 0;
      for (; j0 + B <= cols; j0 += B) {
        TransposeSquare<kStream>(src + i0 * lds + j0, lds, dst + j0 * ldd + i0, ldd);
      }
      for (int64_t j = j0; j < cols; ++j) {
        for (int64_t i = i0; i < i0 + B; ++i) dst[j * ldd + i] = src[i * lds + j];
      }
    }
  }
  for (int64_t j = 0; j < cols; ++j) {
    for (int64_t i = i0; i < rows; ++i) dst[j * ldd + i] = src[i * lds + j];
  }
}

}  // namespace sparq::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // SPARQ_CPU_TRANSPOSE_INL_H_
