// 2:4 int4 decode with X rounded to int8 (KernelMode::kDecodeInt8X, KernelConfig::
// int8_activations): llama.cpp's integer path for sparq's 2:4 bytes, on AVX-512 VNNI + VBMI
// (HWY_AVX3_DL). X is rounded per block of 32 columns (one f32 scale each, amax / 127); per 64
// kept weights (128 columns, 4 chunks) and row, the 2-bit indices become byte indices
// (vpmultishiftqb), vpermt2b selects the 64 int8 x of the kept weights from the 128 columns, and
// two vpdpbusd give exact int32 sums of q * x and of x (the latter for the group's min). About 2x
// the f32 decode row on the same bytes (docs/measurements/xeon-int4-vnni-decode-prototype-
// 2026-12-05.md); the rounding of X costs ~0.5% relative error per product on Gaussian inputs,
// which is why it is opt-in. Bound per output (tests/cpu/quant_nm_test.cc): sum over kept weights
// of |w| * s_b / 2 plus f32 rounding of the per-group epilogue.
#if defined(SPARQ_CPU_NM_X8_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SPARQ_CPU_NM_X8_INL_H_
#undef SPARQ_CPU_NM_X8_INL_H_
#else
#define SPARQ_CPU_NM_X8_INL_H_
#endif

#include <cmath>
#include <cstdint>
#include <cstdlib>

#include "src/cpu/dense_x8-inl.h"  // the AVX2 rows round X as the dense ones do
#include "src/cpu/kernel_entry.h"
#include "src/cpu/simd-inl.h"
#include "src/cpu/tasks.h"

HWY_BEFORE_NAMESPACE();
namespace sparq::cpu::HWY_NAMESPACE {

#if HWY_TARGET == HWY_AVX3_DL
// Highway 1.0.3's AVX3_DL target string names "avxvnni" (VEX) instead of "avx512vnni", though its
// runtime check for the target is AVX512-VNNI's CPUID bit: these functions add it.
#define SPARQ_X8_ATTR __attribute__((target(HWY_TARGET_STR ",avx512vnni")))

// One token's X rounded for the kernel: xq[s * 128 + c] (int8, zero beyond the row's columns up to
// whole steps of 128) and per step the 16 dpbusd lanes' block scales: lane l of step s sums 4
// bytes of chunk 4s + ((l & 7) >> 1), i.e. of x block 4s + ((l & 7) >> 1).
struct X8Token {
  const int8_t* xq;
  const float* sx;  // [steps][16]
};

// Rounds n tokens of xpad (k_pad floats each, zero beyond the row) into buf: per token steps * 128
// bytes of codes, then steps * 16 floats of lane scales.
SPARQ_X8_ATTR inline void RoundX8(const float* xpad, int64_t k_pad, int64_t n, int64_t steps, float* buf) {
  const int64_t tok_floats = steps * 32 + steps * 16;
  for (int64_t t = 0; t < n; ++t) {
    const float* x = xpad + t * k_pad;
    float* base = buf + t * tok_floats;
    int8_t* xq = reinterpret_cast<int8_t*>(base);
    float* sx = base + steps * 32;
    for (int64_t b = 0; b < steps * 4; ++b) {
      const int64_t c0 = b * 32;
      if (c0 >= k_pad) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(xq + c0), _mm256_setzero_si256());
        sx[(b / 4) * 16 + 2 * (b % 4)] = sx[(b / 4) * 16 + 2 * (b % 4) + 1] = 0.0f;
        sx[(b / 4) * 16 + 8 + 2 * (b % 4)] = sx[(b / 4) * 16 + 9 + 2 * (b % 4)] = 0.0f;
        continue;
      }
      // k_pad is a multiple of 32 (whole 2:4 chunks): the block is whole.
      const __m512 v0 = _mm512_loadu_ps(x + c0), v1 = _mm512_loadu_ps(x + c0 + 16);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
      // A NaN or infinite x makes the block's scale NaN, so y is NaN as the f32 rows' would be
      // (max drops NaN operands: they are looked for on their own).
      const bool nan = (_mm512_cmp_ps_mask(v0, v0, _CMP_UNORD_Q) |
                        _mm512_cmp_ps_mask(v1, v1, _CMP_UNORD_Q)) != 0;
      const float s = std::isfinite(amax) && !nan ? amax / 127.0f : NAN;
      const float inv = amax > 0.0f && std::isfinite(amax) ? 127.0f / amax : 0.0f;
      // Round to nearest even, clamped (x * inv may exceed 127 by an ulp).
      const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
      const __m512i q0 = _mm512_cvtps_epi32(
          _mm512_min_ps(hi, _mm512_max_ps(lo, _mm512_mul_ps(v0, _mm512_set1_ps(inv)))));
      const __m512i q1 = _mm512_cvtps_epi32(
          _mm512_min_ps(hi, _mm512_max_ps(lo, _mm512_mul_ps(v1, _mm512_set1_ps(inv)))));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(xq + c0), _mm512_cvtsepi32_epi8(q0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(xq + c0 + 16), _mm512_cvtsepi32_epi8(q1));
      float* lanes = sx + (b / 4) * 16;
      lanes[2 * (b % 4)] = lanes[2 * (b % 4) + 1] = s;
      lanes[8 + 2 * (b % 4)] = lanes[9 + 2 * (b % 4)] = s;
    }
  }
}

// Rows [r, r + R) against one token: raw[row - r0] = y. kSym: int4 without a min (value (q - 8) *
// scale: the min is -8 * scale, exact in f32).
template <bool kSym, int R>
SPARQ_X8_ATTR HWY_INLINE void NmX8Rows(const NmWeight& w, const X8Token& xt, int64_t steps, int64_t r,
                         float* out) {
  const int64_t row_bytes = w.chunks * (kNmChunk / 2);
  const uint8_t* codes = static_cast<const uint8_t*>(w.values.data()) + r * row_bytes;
  const uint32_t* meta = w.meta.data_as<uint32_t>() + r * w.chunks;
  const float* scales = w.scales.data() + r * w.groups_per_row;
  const float* mins = kSym ? nullptr : w.mins.data() + r * w.groups_per_row;
  // Qword Q of the spread index words holds chunk (Q mod 4)'s word; byte p's 8 bits start at its
  // kept value j(p)'s index (j = p mod 8, + 8 for the upper 32 bytes: the high nibbles).
  const __m512i spread = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 0, 0, 1, 1, 2, 2, 3, 3);
  const __m512i ctrl = _mm512_set_epi64(0x1E1C1A1816141210LL, 0x1E1C1A1816141210LL,
                                        0x1E1C1A1816141210LL, 0x1E1C1A1816141210LL,
                                        0x0E0C0A0806040200LL, 0x0E0C0A0806040200LL,
                                        0x0E0C0A0806040200LL, 0x0E0C0A0806040200LL);
  // base[p]: the first of the 4 columns of byte p's kept value within the step's 128 columns:
  // chunk (p mod 32) / 8 * 32 + (j(p) / 2) * 4.
  alignas(64) static constexpr uint8_t kBase[64] = {
      0,  0,  4,  4,  8,  8,  12,  12,  32, 32, 36, 36, 40,  40,  44,  44,
      64, 64, 68, 68, 72, 72, 76,  76,  96, 96, 100, 100, 104, 104, 108, 108,
      16, 16, 20, 20, 24, 24, 28,  28,  48, 48, 52, 52, 56,  56,  60,  60,
      80, 80, 84, 84, 88, 88, 92,  92,  112, 112, 116, 116, 120, 120, 124, 124};
  const __m512i base = _mm512_load_si512(kBase);
  const __m512i three = _mm512_set1_epi8(3), nib = _mm512_set1_epi8(0x0F);
  const __m512i ones = _mm512_set1_epi8(1);
  __m512 acc[R];
  for (int q = 0; q < R; ++q) acc[q] = _mm512_setzero_ps();
  const int64_t full = w.chunks / 4;
  const int gshift = w.group_shift - 6;  // steps per group: 1 << gshift (groups of >= 64)
  // The far prefetch of the codes and the meta, as DenseX8Rows (the meta row is half the codes').
  const int64_t meta_bytes = w.chunks * 4;
  const uint8_t* meta_b = reinterpret_cast<const uint8_t*>(meta);
  RowStreamAhead pf(row_bytes);
  for (int64_t s = 0; s < steps; ++s) {
    const __m512i xlo = _mm512_loadu_si512(xt.xq + s * 128);
    const __m512i xhi = _mm512_loadu_si512(xt.xq + s * 128 + 64);
    const __m512 sxv = _mm512_loadu_ps(xt.sx + s * 16);
    const int64_t g = s >> gshift;
    for (int q = 0; q < R; ++q) {
      PrefetchFar(codes + pf.Row(q, R) * row_bytes + pf.off);
      PrefetchFar(meta_b + pf.Row(q, R) * meta_bytes + pf.off / 2);
    }
    pf.Advance(32);
    for (int q = 0; q < R; ++q) {
      const uint8_t* cq = codes + q * row_bytes + s * 32;
      const uint32_t* mq = meta + q * w.chunks + s * 4;
      __m256i c32;
      __m128i m16;
      if (s < full) {
        c32 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(cq));
        m16 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(mq));
      } else {  // the row's last, short step: chunks beyond the row read as code 0, index 0
        const int rem = static_cast<int>(w.chunks - s * 4);
        c32 = _mm256_maskz_loadu_epi8(static_cast<__mmask32>((uint64_t{1} << (8 * rem)) - 1), cq);
        m16 = _mm_maskz_loadu_epi32(static_cast<__mmask8>((1u << rem) - 1), mq);
      }
      const __m512i words = _mm512_permutexvar_epi32(spread, _mm512_castsi128_si512(m16));
      const __m512i bits = _mm512_multishift_epi64_epi8(ctrl, words);
      const __m512i idx = _mm512_ternarylogic_epi32(bits, three, base, 0xEA);  // (a & b) | c
      const __m512i xsel = _mm512_permutex2var_epi8(xlo, idx, xhi);
      // Both halves hold the 32 code bytes; the upper half's words shift by 4: byte p < 32 is the
      // low nibble of code byte p, byte p >= 32 the high nibble of code byte p - 32.
      const __m512i cb = _mm512_broadcast_i64x4(c32);
      const __m512i cw = _mm512_and_si512(_mm512_mask_srli_epi16(cb, 0xFFFF0000u, cb, 4), nib);
      const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), cw, xsel);
      const __m512i sum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, xsel);
      const float sc = scales[q * w.groups_per_row + g];
      const float mn = kSym ? -8.0f * sc : mins[q * w.groups_per_row + g];
      const __m512 t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_set1_ps(sc),
                                       _mm512_mul_ps(_mm512_cvtepi32_ps(sum), _mm512_set1_ps(mn)));
      acc[q] = _mm512_fmadd_ps(t, sxv, acc[q]);
    }
  }
  for (int q = 0; q < R; ++q) out[q] = _mm512_reduce_add_ps(acc[q]);
}

// Rows [u0, u1) against n tokens into raw[t][row - u0]; 4 rows share each step's X, and all n
// tokens run on a block of rows while it is in L1.
template <bool kSym>
SPARQ_X8_ATTR HWY_NOINLINE void NmX8Decode(const NmWeight& w, const float* x8,
                                           int64_t n, int64_t u0, int64_t u1, float* raw) {
  const int64_t steps = (w.chunks + 3) / 4;
  const int64_t tok_floats = steps * 48;
  const float* buf = x8;  // rounded once per product by RunDecodeJobs (x8_out)
  const int64_t rows = u1 - u0;
  float y[4];
  for (int64_t r = u0; r < u1; r += 4) {
    const int R = static_cast<int>(std::min<int64_t>(4, u1 - r));
    for (int64_t t = 0; t < n; ++t) {
      const X8Token xt{reinterpret_cast<const int8_t*>(buf + t * tok_floats),
                       buf + t * tok_floats + steps * 32};
      if (R == 4) {
        NmX8Rows<kSym, 4>(w, xt, steps, r, y);
      } else if (R == 3) {
        NmX8Rows<kSym, 3>(w, xt, steps, r, y);
      } else if (R == 2) {
        NmX8Rows<kSym, 2>(w, xt, steps, r, y);
      } else {
        NmX8Rows<kSym, 1>(w, xt, steps, r, y);
      }
      for (int q = 0; q < R; ++q) raw[t * rows + (r - u0) + q] = y[q];
    }
  }
}
#undef SPARQ_X8_ATTR
#elif HWY_TARGET == HWY_AVX2
// AVX2 (no vpmultishiftqb / vpermt2b / VNNI): per step of 64 columns (2 chunks, 32 kept weights)
// and row, the 2-bit indices become byte indices by a nibble split and two vpshufb; vpshufb then
// selects the kept weights' int8 x within each 16-column quarter (a lane's 16 kept weights come
// from two quarters: two selections OR-ed), and vpmaddubsw + vpmaddwd give exact int32 sums of
// q * x and of x. X is rounded as the dense AVX2 rows round it (RoundDenseX8Avx2, column order,
// one scale per block of 32 columns), over whole steps of 64 columns.

// Rows [r, r + R) against one token (xq: steps * 64 bytes; sx: one scale per 32 columns).
template <bool kSym, int R>
HWY_INLINE void NmX8Avx2Rows(const NmWeight& w, const int8_t* xq, const float* sx, int64_t steps,
                             int64_t r, float* out) {
  const int64_t row_bytes = w.chunks * (kNmChunk / 2);
  const uint8_t* codes = static_cast<const uint8_t*>(w.values.data()) + r * row_bytes;
  const uint32_t* meta = w.meta.data_as<uint32_t>() + r * w.chunks;
  const float* scales = w.scales.data() + r * w.groups_per_row;
  const float* mins = kSym ? nullptr : w.mins.data() + r * w.groups_per_row;
  // Output byte p of lane L holds kept value j = p mod 8 (+ 8 in lane 1) of chunk p / 8, the
  // order of the unpacked codes (low nibbles in lane 0, high in lane 1). kDup: the nibble of the
  // index bytes (group g of 4 columns is nibble g, chunk 1's from 8) holding its index; kSel:
  // its two bits (the group's first kept value in the low two, the second in the high two);
  // kField maps the masked nibble (i or 4 i) to i.
  const __m256i dup = _mm256_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 8, 8, 9, 9, 10, 10, 11, 11,  //
                                       4, 4, 5, 5, 6, 6, 7, 7, 12, 12, 13, 13, 14, 14, 15, 15);
  const __m256i sel = _mm256_set1_epi16(0x0C03);
  const __m256i field = _mm256_setr_epi8(0, 1, 2, 3, 1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0,  //
                                         0, 1, 2, 3, 1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0);
  // The column of the kept value's group within its quarter; 0x80 zeroes the other source's half.
  const __m256i base_a = _mm256_setr_epi8(0, 0, 4, 4, 8, 8, 12, 12, -128, -128, -128, -128, -128,
                                          -128, -128, -128, 0, 0, 4, 4, 8, 8, 12, 12, -128, -128,
                                          -128, -128, -128, -128, -128, -128);
  const __m256i base_b = _mm256_permute4x64_epi64(base_a, 0xB1);  // the halves of each lane swap
  const __m128i nib = _mm_set1_epi8(0x0F);
  const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
  __m256 acc[R];
  for (int q = 0; q < R; ++q) acc[q] = _mm256_setzero_ps();
  const int64_t full = w.chunks / 2;
  const int gshift = w.group_shift - 5;  // steps per group: 1 << gshift (groups of >= 64)
  for (int64_t s = 0; s < steps; ++s) {
    // x quarters: a = columns 0-15 | 16-31 (chunk 0), b = 32-47 | 48-63 (chunk 1).
    const __m256i xa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + s * 64));
    const __m256i xb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + s * 64 + 32));
    // The 8 int32 sums' x blocks: 0, 0, 1, 1 in each lane.
    const __m128i s01 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sx + 2 * s));
    const __m256 sxv = _mm256_permute_ps(
        _mm256_castpd_ps(_mm256_broadcastsd_pd(_mm_castsi128_pd(s01))), 0x50);
    const int64_t g = s >> gshift;
    for (int q = 0; q < R; ++q) {
      const uint8_t* cq = codes + q * row_bytes + s * 16;
      const uint32_t* mq = meta + q * w.chunks + s * 2;
      __m128i c16, m8;
      if (s < full) {
        c16 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(cq));
        m8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(mq));
      } else {  // an odd chunk count's last step: chunk 1 reads as code 0, index 0 (x 0 there)
        c16 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(cq));
        m8 = _mm_cvtsi32_si128(static_cast<int>(mq[0]));
      }
      const __m128i nibs = _mm_unpacklo_epi8(_mm_and_si128(m8, nib),
                                             _mm_and_si128(_mm_srli_epi16(m8, 4), nib));
      const __m256i pick = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(nibs), dup);
      const __m256i f = _mm256_shuffle_epi8(field, _mm256_and_si256(pick, sel));
      const __m256i xs = _mm256_or_si256(_mm256_shuffle_epi8(xa, _mm256_add_epi8(f, base_a)),
                                         _mm256_shuffle_epi8(xb, _mm256_add_epi8(f, base_b)));
      const __m256i cw = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(c16, 4), nib),
                                          _mm_and_si128(c16, nib));
      const __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(cw, xs), ones16);
      const __m256i sum = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, xs), ones16);
      const float sc = scales[q * w.groups_per_row + g];
      __m256 t;
      if constexpr (kSym) {  // (q - 8) summed exactly in int32: |dot - 8 sum| <= 32 * 8 * 127
        t = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(dot, _mm256_slli_epi32(sum, 3))),
                          _mm256_set1_ps(sc));
      } else {
        t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(sc),
                            _mm256_mul_ps(_mm256_cvtepi32_ps(sum),
                                          _mm256_set1_ps(mins[q * w.groups_per_row + g])));
      }
      acc[q] = _mm256_fmadd_ps(t, sxv, acc[q]);
    }
  }
  for (int q = 0; q < R; ++q) out[q] = HSum8(acc[q]);
}

// X of one token as RoundDenseX8Avx2 lays it out for steps * 2 blocks and one group.
inline int64_t NmX8Avx2TokenFloats(int64_t steps) { return DenseX8Avx2TokenFloats(2 * steps, 1); }

template <bool kSym>
HWY_NOINLINE void NmX8Avx2Decode(const NmWeight& w, const float* x8, int64_t n, int64_t u0,
                                 int64_t u1, float* raw) {
  const int64_t steps = (w.chunks + 1) / 2;
  const int64_t tok_floats = NmX8Avx2TokenFloats(steps);
  X8Avx2RowBlocks(n, u0, u1, raw, [&](auto rc, int64_t r, int64_t t, float* y) {
    const float* tb = x8 + t * tok_floats;  // rounded once per product by RunDecodeJobs
    NmX8Avx2Rows<kSym, decltype(rc)::value>(w, reinterpret_cast<const int8_t*>(tb),
                                            tb + steps * 16, steps, r, y);
  });
}
#endif  // HWY_TARGET == HWY_AVX3_DL / HWY_AVX2

// The row's body: rows [u0, u1) of a 2:4 int4 weight (groups of >= 64 kept values: Declines), n
// tokens of the staged X.
template <int kV>
struct NmX8DecodeBody {
  static void Run(const KernelCall& c) {
#if HWY_TARGET == HWY_AVX3_DL
    const NmWeight& w = c.w->nm();
    if (c.x8_out != nullptr) {  // steps * 48 <= Int8XFloatsPerToken(k_pad) floats per token
      RoundX8(c.x, w.k_pad, c.n, (w.chunks + 3) / 4, c.x8_out);
      return;
    }
    NmX8Decode<kV == kValI4Sym>(w, c.x8, c.n, c.u0, c.u1, c.raw);
#elif HWY_TARGET == HWY_AVX2
    const NmWeight& w = c.w->nm();
    if (c.x8_out != nullptr) {  // about k_pad * 9 / 32 + 24 <= Int8XFloatsPerToken(k_pad) floats
      // One group (its sum of X is not used: the 2:4 rows sum x over the kept columns per row).
      RoundDenseX8Avx2<false>(c.x, w.k_pad, c.n, 2 * ((w.chunks + 1) / 2), 1, 31, c.x8_out);
      return;
    }
    NmX8Avx2Decode<kV == kValI4Sym>(w, c.x8, c.n, c.u0, c.u1, c.raw);
#else
    (void)c;
    std::abort();  // the rows run on AVX3_DL and AVX2 only (their ranges in table_rows.h)
#endif
  }
};

}  // namespace sparq::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // SPARQ_CPU_NM_X8_INL_H_ toggle
