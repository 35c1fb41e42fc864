// Dense int8 / int4 decode with X rounded to int8 (KernelMode::kDecodeInt8X, KernelConfig::
// int8_activations): llama.cpp's integer path on sparq's dense quantized bytes (DenseQuantWeight:
// the GGUF's Q8_0 / Q4_0 / Q4_1 layers as stored, `quantize`'s dense int4 / int8 and the int4 /
// int8 head), on AVX-512 VNNI + VBMI (HWY_AVX3_DL) and on AVX2 (vpmaddubsw + vpmaddwd, steps
// of 32 columns: the AVX2 section below). X is rounded per block of 32 columns as the
// 2:4 int8-X rows do (nm_x8-inl.h); per 64 columns and row one vpdpbusd gives 16 exact int32 sums
// of code x x. The int4 codes' nibble order (per chunk of 16: codes 0-7 low, 8-15 high) is
// undone on X once per token (a byte permute of the rounded X), not per weight. int8 codes use
// llama.cpp's sign trick (|q| unsigned, x negated where q < 0). The codes' offsets (the int4 min,
// -8 for symmetric int4) multiply the row-independent sum of X over each group, computed once per
// token. Bound per output (tests/cpu/dense_quant_test.cc): sum over columns of |w| * s_b / 2 plus
// f32 rounding of the per-step epilogue.
#if defined(SPARQ_CPU_DENSE_X8_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SPARQ_CPU_DENSE_X8_INL_H_
#undef SPARQ_CPU_DENSE_X8_INL_H_
#else
#define SPARQ_CPU_DENSE_X8_INL_H_
#endif

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <type_traits>

#include "src/cpu/kernel_entry.h"
#include "src/cpu/prefetch-inl.h"
#include "src/cpu/simd-inl.h"
#include "src/cpu/tasks.h"

HWY_BEFORE_NAMESPACE();
namespace sparq::cpu::HWY_NAMESPACE {

#if HWY_TARGET == HWY_AVX3_DL
// As nm_x8-inl.h: Highway 1.0.3's AVX3_DL target string lacks avx512vnni.
#define SPARQ_DX8_ATTR __attribute__((target(HWY_TARGET_STR ",avx512vnni")))

// One token's rounded X: per step of 64 columns 64 code-order bytes (xq), 16 dpbusd lane scales
// (sx), and per group the f32 sum of its X as rounded (gsum, padded with zeros to 16 groups).
struct DenseX8Token {
  const int8_t* xq;
  const float* sx;
  const float* gsum;
};

inline int64_t DenseX8GroupsPad(int64_t groups) { return (groups + 15) / 16 * 16; }
inline int64_t DenseX8TokenFloats(int64_t steps, int64_t groups) {
  return steps * 32 + DenseX8GroupsPad(groups);  // 64 bytes + 16 lane scales per step
}

// Rounds n tokens of xpad (k_pad floats each, zero past the row's columns; k_pad a multiple of 16)
// into buf. kI4: the bytes in the int4 codes' order, whose 16 dpbusd lanes read x blocks
// 0,0,0,0,1,1,1,1,0,0,0,0,1,1,1,1; else column order (lanes 0-7 block 0, 8-15 block 1).
template <bool kI4>
SPARQ_DX8_ATTR inline void RoundDenseX8(const float* xpad, int64_t k_pad, int64_t n,
                                        int64_t steps, int64_t groups, int group_shift,
                                        float* buf) {
  // Byte p of a step's 64 codes is column (p mod 32) / 8 * 16 + p mod 8 (+ 8 for p >= 32).
  alignas(64) static constexpr uint8_t kPerm[64] = {
      0,  1,  2,  3,  4,  5,  6,  7,  16, 17, 18, 19, 20, 21, 22, 23,
      32, 33, 34, 35, 36, 37, 38, 39, 48, 49, 50, 51, 52, 53, 54, 55,
      8,  9,  10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31,
      40, 41, 42, 43, 44, 45, 46, 47, 56, 57, 58, 59, 60, 61, 62, 63};
  const int64_t tok_floats = DenseX8TokenFloats(steps, groups);
  for (int64_t t = 0; t < n; ++t) {
    const float* x = xpad + t * k_pad;
    float* base = buf + t * tok_floats;
    int8_t* xq = reinterpret_cast<int8_t*>(base);
    float* sx = base + steps * 16;
    float* gsum = sx + steps * 16;
    for (int64_t g = 0; g < DenseX8GroupsPad(groups); ++g) gsum[g] = 0.0f;
    for (int64_t s = 0; s < steps; ++s) {
      __m128i q8[4];
      float sb[2];
      for (int b = 0; b < 2; ++b) {
        const int64_t c0 = s * 64 + b * 32;
        const int64_t left = k_pad - c0;  // a multiple of 16
        if (left <= 0) {
          q8[2 * b] = q8[2 * b + 1] = _mm_setzero_si128();
          sb[b] = 0.0f;
          continue;
        }
        const __m512 v0 = _mm512_loadu_ps(x + c0);
        const __m512 v1 = left >= 32 ? _mm512_loadu_ps(x + c0 + 16) : _mm512_setzero_ps();
        const float amax =
            _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        // NaN / inf in the block: NaN scale, so y is NaN as the f32 rows' would be (max drops
        // NaN operands).
        const bool nan = (_mm512_cmp_ps_mask(v0, v0, _CMP_UNORD_Q) |
                          _mm512_cmp_ps_mask(v1, v1, _CMP_UNORD_Q)) != 0;
        const float sc = std::isfinite(amax) && !nan ? amax / 127.0f : NAN;
        const float inv = amax > 0.0f && std::isfinite(amax) ? 127.0f / amax : 0.0f;
        const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
        const __m512i i0 = _mm512_cvtps_epi32(
            _mm512_min_ps(hi, _mm512_max_ps(lo, _mm512_mul_ps(v0, _mm512_set1_ps(inv)))));
        const __m512i i1 = _mm512_cvtps_epi32(
            _mm512_min_ps(hi, _mm512_max_ps(lo, _mm512_mul_ps(v1, _mm512_set1_ps(inv)))));
        q8[2 * b] = _mm512_cvtsepi32_epi8(i0);
        q8[2 * b + 1] = _mm512_cvtsepi32_epi8(i1);
        // The block's sum as rounded, exact in int32 and in f32 (|sum| <= 32 * 127).
        const int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
        gsum[c0 >> group_shift] += sc * static_cast<float>(sum);
        sb[b] = sc;
      }
      __m512i v = _mm512_inserti64x2(_mm512_castsi128_si512(q8[0]), q8[1], 1);
      v = _mm512_inserti64x2(v, q8[2], 2);
      v = _mm512_inserti64x2(v, q8[3], 3);
      if constexpr (kI4) v = _mm512_permutexvar_epi8(_mm512_load_si512(kPerm), v);
      _mm512_storeu_si512(xq + s * 64, v);
      const __m512 l0 = _mm512_set1_ps(sb[0]), l1 = _mm512_set1_ps(sb[1]);
      // kI4: lanes 4-7 and 12-15 read block 1; else lanes 8-15.
      _mm512_storeu_ps(sx + s * 16, _mm512_mask_blend_ps(kI4 ? 0xF0F0 : 0xFF00, l0, l1));
    }
  }
}

// Rows [r, r + R) against one token into out[0..R).
template <int kV, int R>
SPARQ_DX8_ATTR HWY_INLINE void DenseX8Rows(const DenseQuantWeight& w, const DenseX8Token& xt,
                                           int64_t steps, int64_t r, float* out) {
  constexpr bool kI4 = kV != kValI8;
  const int64_t rb = w.row_bytes();
  const uint8_t* codes = w.codes.data_as<uint8_t>() + r * rb;
  const int64_t gpr = w.groups_per_row;
  const float* scales = w.scales.data() + r * gpr;
  const float* mins = kV == kValI4 ? w.mins.data() + r * gpr : nullptr;
  const int gshift = w.group_shift;
  const __m512i nib = _mm512_set1_epi8(0x0F);
  __m512 acc[R];
  for (int q = 0; q < R; ++q) acc[q] = _mm512_setzero_ps();
  const int64_t step_bytes = kI4 ? 32 : 64;
  const int64_t full = rb / step_bytes;  // whole steps; the last may be short (k_pad % 64)
  // Groups of 32: the two blocks of a step have their own scales (lanes as RoundDenseX8 lays
  // the blocks out); 64 and more: one per step.
  const __m512i pair_idx = kI4 ? _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1)
                               : _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  // The far prefetch of the f32-X decode rows (prefetch-inl.h): 1.4-2x on one thread with the
  // rows from DRAM on an AMD Zen 5 (docs/measurements/zen5-int4-issue27-targets-2026-12-06.md).
  RowStreamAhead pf(rb);
  for (int64_t s = 0; s < steps; ++s) {
    const __m512i xv = _mm512_loadu_si512(xt.xq + s * 64);
    const __m512 sxv = _mm512_loadu_ps(xt.sx + s * 16);
    for (int q = 0; q < R; ++q) PrefetchFar(codes + pf.Row(q, R) * rb + pf.off);
    pf.Advance(step_bytes);
    for (int q = 0; q < R; ++q) {
      const uint8_t* cq = codes + q * rb + s * step_bytes;
      const float* sq = scales + q * gpr;
      __m512i dot;
      if constexpr (kI4) {
        __m256i c32;
        if (s < full) {
          c32 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(cq));
        } else {  // the short last step: 16 or 32 or 48 columns of codes
          c32 = _mm256_maskz_loadu_epi8(static_cast<__mmask32>((uint64_t{1} << (rb - s * 32)) - 1), cq);
        }
        const __m512i cb = _mm512_broadcast_i64x4(c32);
        const __m512i cw = _mm512_and_si512(_mm512_mask_srli_epi16(cb, 0xFFFF0000u, cb, 4), nib);
        dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), cw, xv);
      } else {
        const __m512i c64 =
            s < full ? _mm512_loadu_si512(cq)
                     : _mm512_maskz_loadu_epi8((uint64_t{1} << (rb - s * 64)) - 1, cq);
        // |q| * (x with q's sign): dpbusd wants its first operand unsigned (q = -128 is not a
        // code: quant.h's int8 codes are symmetric, -127..127).
        const __m512i xs = _mm512_mask_sub_epi8(xv, _mm512_movepi8_mask(c64),
                                                _mm512_setzero_si512(), xv);
        dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(c64), xs);
      }
      __m512 scv;
      if (gshift == 5) {
        // A short last step may have no second block (and the row no group for it).
        const __m128 pair = 2 * s + 1 < gpr
                                ? _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(sq + 2 * s)))
                                : _mm_load_ss(sq + 2 * s);
        scv = _mm512_permutexvar_ps(pair_idx, _mm512_castps128_ps512(pair));
      } else {
        scv = _mm512_set1_ps(sq[(s * 64) >> gshift]);
      }
      acc[q] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(sxv, scv), acc[q]);
    }
  }
  // The codes' offsets: int4 with a min adds min * (sum of x over the group); symmetric int4's
  // codes are q - 8.
  if constexpr (kV != kValI8) {
    for (int q = 0; q < R; ++q) {
      __m512 off = _mm512_setzero_ps();
      for (int64_t g = 0; g < gpr; g += 16) {
        const __mmask16 m = gpr - g >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (gpr - g)) - 1);
        const __m512 sv = _mm512_loadu_ps(xt.gsum + g);
        const __m512 mv = kV == kValI4 ? _mm512_maskz_loadu_ps(m, mins + q * gpr + g)
                                       : _mm512_maskz_loadu_ps(m, scales + q * gpr + g);
        off = _mm512_fmadd_ps(mv, sv, off);
      }
      if constexpr (kV == kValI4Sym) off = _mm512_mul_ps(off, _mm512_set1_ps(-8.0f));
      acc[q] = _mm512_add_ps(acc[q], off);
    }
  }
  for (int q = 0; q < R; ++q) out[q] = _mm512_reduce_add_ps(acc[q]);
}

// Rows [u0, u1) against n tokens into raw[t][row - u0]; 4 rows share each step's X, and all n
// tokens run on a block of rows while its codes are in L1.
// X rounded for the rows (x8_out: Int8XFloatsPerToken floats per token hold the token's
// DenseX8TokenFloats: about k_pad / 2 + groups + 32).
template <int kV>
SPARQ_DX8_ATTR inline void DenseX8Round(const DenseQuantWeight& w, const float* x, int64_t n,
                                        float* out) {
  RoundDenseX8<kV != kValI8>(x, w.k_pad, n, (w.k_pad + 63) / 64, w.groups_per_row,
                             w.group_shift, out);
}

template <int kV>
SPARQ_DX8_ATTR HWY_NOINLINE void DenseX8Decode(const DenseQuantWeight& w, const float* x8,
                                               int64_t n, int64_t u0, int64_t u1, float* raw) {
  const int64_t steps = (w.k_pad + 63) / 64;
  const int64_t tok_floats = DenseX8TokenFloats(steps, w.groups_per_row);
  const float* buf = x8;  // rounded once per product by RunDecodeJobs (x8_out)
  const int64_t rows = u1 - u0;
  float y[4];
  for (int64_t r = u0; r < u1; r += 4) {
    const int R = static_cast<int>(std::min<int64_t>(4, u1 - r));
    for (int64_t t = 0; t < n; ++t) {
      const float* tb = buf + t * tok_floats;
      const DenseX8Token xt{reinterpret_cast<const int8_t*>(tb), tb + steps * 16, tb + steps * 32};
      if (R == 4) {
        DenseX8Rows<kV, 4>(w, xt, steps, r, y);
      } else if (R == 3) {
        DenseX8Rows<kV, 3>(w, xt, steps, r, y);
      } else if (R == 2) {
        DenseX8Rows<kV, 2>(w, xt, steps, r, y);
      } else {
        DenseX8Rows<kV, 1>(w, xt, steps, r, y);
      }
      for (int q = 0; q < R; ++q) raw[t * rows + (r - u0) + q] = y[q];
    }
  }
}
#undef SPARQ_DX8_ATTR
#elif HWY_TARGET == HWY_AVX2
// AVX2 (Zen 3 and other CPUs without AVX-512): llama.cpp's AVX2 integer dot product, vpmaddubsw
// (u8 code x s8 x, pairs summed to int16: at most 2 * 127 * 127, no saturation) then vpmaddwd by
// ones to int32; steps of 32 columns, one X block each.

// One token's rounded X: per step 32 code-order bytes, then per step the block's scale (padded to
// 8), then per group the f32 sum of its X as rounded (padded to 8 groups).
struct DenseX8Avx2Token {
  const int8_t* xq;
  const float* sx;
  const float* gsum;
};
inline int64_t Pad8(int64_t v) { return (v + 7) / 8 * 8; }
inline int64_t DenseX8Avx2TokenFloats(int64_t steps, int64_t groups) {
  return steps * 8 + Pad8(steps) + Pad8(groups);
}

inline float HMax8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}
inline float HSum8(__m256 v) {
  __m128 m = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_add_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_add_ss(m, _mm_movehdup_ps(m)));
}

// As RoundDenseX8, per block of 32 columns. kI4: the int4 codes' order (a row's 16 code bytes give
// columns 0-7, 16-23 in their low nibbles and 8-15, 24-31 in the high): the middle two 8-byte
// quarters of the block swap.
template <bool kI4>
inline void RoundDenseX8Avx2(const float* xpad, int64_t k_pad, int64_t n, int64_t steps,
                             int64_t groups, int group_shift, float* buf) {
  const int64_t tok_floats = DenseX8Avx2TokenFloats(steps, groups);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t t = 0; t < n; ++t) {
    const float* x = xpad + t * k_pad;
    float* base = buf + t * tok_floats;
    int8_t* xq = reinterpret_cast<int8_t*>(base);
    float* sx = base + steps * 8;
    float* gsum = sx + Pad8(steps);
    for (int64_t g = 0; g < Pad8(groups); ++g) gsum[g] = 0.0f;
    for (int64_t s = 0; s < steps; ++s) {
      const int64_t c0 = s * 32;
      // Columns at and past k_pad (a multiple of 8) read as 0: a dense row's last block may hold
      // 16 columns, and the 2:4 rows (nm_x8-inl.h) round whole steps of 64 columns.
      const int64_t left = k_pad - c0;
      __m256 v[4];
      for (int j = 0; j < 4; ++j) {
        v[j] = 8 * j < left ? _mm256_loadu_ps(x + c0 + 8 * j) : _mm256_setzero_ps();
      }
      const __m256 a = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v[0], abs_mask),
                                                   _mm256_and_ps(v[1], abs_mask)),
                                     _mm256_max_ps(_mm256_and_ps(v[2], abs_mask),
                                                   _mm256_and_ps(v[3], abs_mask)));
      const float amax = HMax8(a);
      bool nan = false;
      for (int j = 0; j < 4; ++j) nan |= _mm256_movemask_ps(_mm256_cmp_ps(v[j], v[j], _CMP_UNORD_Q)) != 0;
      // NaN / inf in the block: NaN scale, so y is NaN as the f32 rows' would be.
      const float sc = std::isfinite(amax) && !nan ? amax / 127.0f : NAN;
      const float inv = amax > 0.0f && std::isfinite(amax) ? 127.0f / amax : 0.0f;
      __m256i q[4];
      for (int j = 0; j < 4; ++j) {
        q[j] = _mm256_cvtps_epi32(
            _mm256_min_ps(hi, _mm256_max_ps(lo, _mm256_mul_ps(v[j], _mm256_set1_ps(inv)))));
      }
      // The block's sum as rounded (exact: |sum| <= 32 * 127; kept in f32, since a NaN block's
      // lanes hold INT_MIN and their sum no int: its NaN scale makes the product NaN anyway).
      const __m256i s32 = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
      const float sum = HSum8(_mm256_cvtepi32_ps(s32));
      // packs interleave the 128-bit lanes; the dword permute restores column order.
      __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
      b = _mm256_permutevar8x32_epi32(b, order);
      if constexpr (kI4) b = _mm256_permute4x64_epi64(b, 0xD8);  // quarters 0, 2, 1, 3
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(xq + c0), b);
      sx[s] = sc;
      gsum[c0 >> group_shift] += sc * sum;
    }
  }
}

// Rows [r, r + R) against one token into out[0..R).
template <int kV, int R>
HWY_INLINE void DenseX8Avx2Rows(const DenseQuantWeight& w, const DenseX8Avx2Token& xt,
                                int64_t steps, int64_t r, float* out) {
  constexpr bool kI4 = kV != kValI8;
  const int64_t rb = w.row_bytes();
  const uint8_t* codes = w.codes.data_as<uint8_t>() + r * rb;
  const int64_t gpr = w.groups_per_row;
  const float* scales = w.scales.data() + r * gpr;
  const float* mins = kV == kValI4 ? w.mins.data() + r * gpr : nullptr;
  const int gshift = w.group_shift;
  const __m128i nib = _mm_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[R];
  for (int q = 0; q < R; ++q) acc[q] = _mm256_setzero_ps();
  const int64_t step_bytes = kI4 ? 16 : 32;
  const int64_t full = rb / step_bytes;  // the last step may hold 16 columns (k_pad % 32)
  for (int64_t s = 0; s < steps; ++s) {
    const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xt.xq + s * 32));
    const float sxs = xt.sx[s];
    const int64_t g = (s * 32) >> gshift;
    for (int q = 0; q < R; ++q) {
      const uint8_t* cq = codes + q * rb + s * step_bytes;
      __m256i d16;
      if constexpr (kI4) {
        const __m128i c16 = s < full ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(cq))
                                     : _mm_loadl_epi64(reinterpret_cast<const __m128i*>(cq));
        const __m256i cw = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(c16, 4), nib),
                                            _mm_and_si128(c16, nib));
        d16 = _mm256_maddubs_epi16(cw, xv);
      } else {
        const __m256i c32 =
            s < full ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(cq))
                     : _mm256_set_m128i(_mm_setzero_si128(),
                                        _mm_loadu_si128(reinterpret_cast<const __m128i*>(cq)));
        // |q| * (x with q's sign): vpmaddubsw wants its first operand unsigned.
        d16 = _mm256_maddubs_epi16(_mm256_abs_epi8(c32), _mm256_sign_epi8(xv, c32));
      }
      const __m256 f = _mm256_set1_ps(sxs * scales[q * gpr + g]);
      acc[q] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(d16, ones)), f, acc[q]);
    }
  }
  if constexpr (kV != kValI8) {  // the codes' offsets, as DenseX8Rows
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int q = 0; q < R; ++q) {
      __m256 off = _mm256_setzero_ps();
      for (int64_t g = 0; g < gpr; g += 8) {
        const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(gpr - g)), iota);
        const __m256 mv = _mm256_maskload_ps(kV == kValI4 ? mins + q * gpr + g : scales + q * gpr + g, m);
        off = _mm256_fmadd_ps(mv, _mm256_loadu_ps(xt.gsum + g), off);
      }
      if constexpr (kV == kValI4Sym) off = _mm256_mul_ps(off, _mm256_set1_ps(-8.0f));
      acc[q] = _mm256_add_ps(acc[q], off);
    }
  }
  for (int q = 0; q < R; ++q) out[q] = HSum8(acc[q]);
}

// As DenseX8Round (about k_pad / 4 + k_pad / 16 + 24 floats per token).
template <int kV>
inline void DenseX8Round(const DenseQuantWeight& w, const float* x, int64_t n, float* out) {
  RoundDenseX8Avx2<kV != kValI8>(x, w.k_pad, n, (w.k_pad + 31) / 32, w.groups_per_row,
                                 w.group_shift, out);
}

// The AVX2 int8-X rows' driver (dense here, 2:4 in nm_x8-inl.h): rows [u0, u1) in blocks of 4
// against n tokens into raw[t][row - u0]; rows_fn(std::integral_constant<int, R>, r, t, y)
// writes the R rows' outputs for token t to y. All n tokens run on a block of rows while it is
// in L1. (The AVX3_DL bodies keep their own: they carry a target attribute this lacks.)
template <class RowsFn>
HWY_INLINE void X8Avx2RowBlocks(int64_t n, int64_t u0, int64_t u1, float* raw,
                                const RowsFn& rows_fn) {
  const int64_t rows = u1 - u0;
  float y[4];
  for (int64_t r = u0; r < u1; r += 4) {
    const int R = static_cast<int>(std::min<int64_t>(4, u1 - r));
    for (int64_t t = 0; t < n; ++t) {
      if (R == 4) {
        rows_fn(std::integral_constant<int, 4>(), r, t, y);
      } else if (R == 3) {
        rows_fn(std::integral_constant<int, 3>(), r, t, y);
      } else if (R == 2) {
        rows_fn(std::integral_constant<int, 2>(), r, t, y);
      } else {
        rows_fn(std::integral_constant<int, 1>(), r, t, y);
      }
      for (int q = 0; q < R; ++q) raw[t * rows + (r - u0) + q] = y[q];
    }
  }
}

template <int kV>
HWY_NOINLINE void DenseX8Avx2Decode(const DenseQuantWeight& w, const float* x8,
                                    int64_t n, int64_t u0, int64_t u1, float* raw) {
  const int64_t steps = (w.k_pad + 31) / 32;
  const int64_t tok_floats = DenseX8Avx2TokenFloats(steps, w.groups_per_row);
  // x8: rounded once per product by RunDecodeJobs (x8_out)
  X8Avx2RowBlocks(n, u0, u1, raw, [&](auto rc, int64_t r, int64_t t, float* y) {
    const float* tb = x8 + t * tok_floats;
    const DenseX8Avx2Token xt{reinterpret_cast<const int8_t*>(tb), tb + steps * 8,
                              tb + steps * 8 + Pad8(steps)};
    DenseX8Avx2Rows<kV, decltype(rc)::value>(w, xt, steps, r, y);
  });
}
#endif  // HWY_TARGET == HWY_AVX3_DL / HWY_AVX2

// The row's body: rows [u0, u1) of a dense int8 / int4 weight, n tokens of the staged X.
template <int kV>
struct DenseX8DecodeBody {
  static void Run(const KernelCall& c) {
#if HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_AVX2
    if (c.x8_out != nullptr) {
      DenseX8Round<kV>(c.w->dense_quant(), c.x, c.n, c.x8_out);
      return;
    }
#endif
#if HWY_TARGET == HWY_AVX3_DL
    DenseX8Decode<kV>(c.w->dense_quant(), c.x8, c.n, c.u0, c.u1, c.raw);
#elif HWY_TARGET == HWY_AVX2
    DenseX8Avx2Decode<kV>(c.w->dense_quant(), c.x8, c.n, c.u0, c.u1, c.raw);
#else
    (void)c;
    std::abort();  // the rows run on AVX3_DL and AVX2 only (their ranges in table_rows.h)
#endif
  }
};

}  // namespace sparq::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // SPARQ_CPU_DENSE_X8_INL_H_ toggle
