// Dense int8 / int4 decode with X rounded to int8 (KernelMode::kDecodeInt8X, KernelConfig::
// int8_activations): llama.cpp's integer path on sparq's dense quantized bytes (DenseQuantWeight:
// the GGUF's Q8_0 / Q4_0 / Q4_1 layers as stored, `quantize`'s dense int4 / int8 and the int4 /
// int8 head), on AVX-512 VNNI + VBMI (HWY_AVX3_DL). X is rounded per block of 32 columns as the
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

#include "src/cpu/kernel_entry.h"
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
  for (int64_t s = 0; s < steps; ++s) {
    const __m512i xv = _mm512_loadu_si512(xt.xq + s * 64);
    const __m512 sxv = _mm512_loadu_ps(xt.sx + s * 16);
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
template <int kV>
SPARQ_DX8_ATTR HWY_NOINLINE void DenseX8Decode(const DenseQuantWeight& w, const float* x,
                                               int64_t n, int64_t u0, int64_t u1, float* raw) {
  const int64_t steps = (w.k_pad + 63) / 64;
  const int64_t tok_floats = DenseX8TokenFloats(steps, w.groups_per_row);
  float* buf = ThreadBuffer(kInt8XSlot, static_cast<size_t>(n * tok_floats));
  RoundDenseX8<kV != kValI8>(x, w.k_pad, n, steps, w.groups_per_row, w.group_shift, buf);
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
#endif  // HWY_TARGET == HWY_AVX3_DL

// The row's body: rows [u0, u1) of a dense int8 / int4 weight, n tokens of the staged X.
template <int kV>
struct DenseX8DecodeBody {
  static void Run(const KernelCall& c) {
#if HWY_TARGET == HWY_AVX3_DL
    DenseX8Decode<kV>(c.w->dense_quant(), c.x, c.n, c.u0, c.u1, c.raw);
#else
    (void)c;
    std::abort();  // the rows run on AVX3_DL only (their range in table_rows.h)
#endif
  }
};

}  // namespace sparq::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // SPARQ_CPU_DENSE_X8_INL_H_ toggle
