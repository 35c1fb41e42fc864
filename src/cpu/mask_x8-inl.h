// Bit-mask int4 decode with X rounded to int8 (KernelMode::kDecodeInt8X, KernelConfig::
// int8_activations), on AVX-512 VNNI + VBMI2 (the AVX3_DL section) and on AVX2, where the f32-X mask rows spread each chunk's codes to its lanes
// through a 16-lane table permute per 8 columns and ran at a quarter of the dense int4 row's
// speed (docs/measurements/xeon-int8-activations-avx2-2026-12-06.md). Per 32 columns (two
// chunks, one X block) and row: each chunk's codes are read compact (MaskNibbleWord: 16 nibbles
// from the row's next code) and widened to bytes; a pshufb control from a 256-entry table per 8
// mask bits (a kept column's rank among the kept, 0x80 where pruned) spreads them to their
// columns with zeros in the pruned ones, and spreads ones the same way; vpmaddubsw + vpmaddwd give
// exact int32 sums of q * x and of x over the kept columns (the latter for the min, or symmetric
// int4's -8). X is rounded as the dense AVX2 rows round it (RoundDenseX8Avx2: column order, one
// scale per 32 columns). Bound per output (tests/cpu/mask_quant_test.cc): sum over kept weights
// of |w| * s_b / 2 plus f32 rounding of the per-step epilogue.
#if defined(SPARQ_CPU_MASK_X8_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SPARQ_CPU_MASK_X8_INL_H_
#undef SPARQ_CPU_MASK_X8_INL_H_
#else
#define SPARQ_CPU_MASK_X8_INL_H_
#endif

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "src/cpu/dense_x8-inl.h"  // RoundDenseX8Avx2, HSum8
#include "src/cpu/kernel_entry.h"
#include "src/cpu/mask_quant-inl.h"  // MaskNibbleWord, F16Lane

HWY_BEFORE_NAMESPACE();
namespace sparq::cpu::HWY_NAMESPACE {

#if HWY_TARGET == HWY_AVX2
// Per 8 mask bits b: byte j of idx[b] is column j's rank among the kept columns, 0x80 if pruned.
struct MaskSpreadTable {
  uint64_t idx[256];
};
inline constexpr MaskSpreadTable kMaskSpread = [] {
  MaskSpreadTable t{};
  for (int b = 0; b < 256; ++b) {
    uint64_t v = 0;
    int rank = 0;
    for (int j = 0; j < 8; ++j) v |= ((b >> j) & 1 ? uint64_t(rank++) : uint64_t{0x80}) << (8 * j);
    t.idx[b] = v;
  }
  return t;
}();

// The pshufb control of one chunk (16 columns, mask bits b): the high 8 columns' ranks follow
// the low 8's kept count (bytewise add: ranks stay below 16, 0x80 below 0x90).
HWY_INLINE __m128i MaskSpreadIdx(uint32_t b) {
  const uint32_t lo = b & 0xFF, hi = b >> 8;
  const uint64_t add = uint64_t(hwy::PopCount(lo)) * 0x0101010101010101ULL;
  return _mm_set_epi64x(static_cast<long long>(kMaskSpread.idx[hi] + add),
                        static_cast<long long>(kMaskSpread.idx[lo]));
}

// 16 int4 codes from code s of the row's stream, one per byte in order.
HWY_INLINE __m128i MaskCodeBytes(const uint8_t* base, int64_t s) {
  const __m128i v = _mm_cvtsi64_si128(static_cast<long long>(MaskNibbleWord(base, s)));
  const __m128i nib = _mm_set1_epi8(0x0F);
  return _mm_unpacklo_epi8(_mm_and_si128(v, nib), _mm_and_si128(_mm_srli_epi16(v, 4), nib));
}

// Rows [r, r + R) against one token (xq: steps * 32 bytes; sx: one scale per step).
template <bool kSym, int R>
HWY_INLINE void MaskX8Avx2Rows(const MaskWeight& w, const int8_t* xq, const float* sx,
                               int64_t steps, int64_t r, float* out) {
  const uint8_t* base = w.values.data_as<uint8_t>();
  const uint16_t* bits = w.bits.data_as<uint16_t>() + r * w.chunks;
  const int np = w.params_per_group();
  const int64_t pstride = w.groups_per_row * np;
  const uint16_t* prm = w.params.data() + r * pstride;
  const int gshift = w.group_shift - 5;  // steps per group (groups are 32, 64 or 128 columns)
  int64_t s[R];
  for (int q = 0; q < R; ++q) s[q] = w.row_ptr[r + q];
  const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
  __m256 acc[R];
  for (int q = 0; q < R; ++q) acc[q] = _mm256_setzero_ps();
  for (int64_t st = 0; st < steps; ++st) {
    const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + st * 32));
    const float sxs = sx[st];
    const int64_t g = st >> gshift;
    const int64_t c0 = 2 * st;
    const bool two = c0 + 1 < w.chunks;  // an odd chunk count's last step has one
    for (int q = 0; q < R; ++q) {
      const uint32_t b0 = bits[q * w.chunks + c0];
      const uint32_t b1 = two ? bits[q * w.chunks + c0 + 1] : 0u;
      const __m128i code0 = MaskCodeBytes(base, s[q]);
      s[q] += hwy::PopCount(b0);
      const __m128i code1 = MaskCodeBytes(base, s[q]);  // (within kMaskQuantTail at the end)
      s[q] += hwy::PopCount(b1);
      const __m256i idx = _mm256_set_m128i(MaskSpreadIdx(b1), MaskSpreadIdx(b0));
      const __m256i codes = _mm256_shuffle_epi8(_mm256_set_m128i(code1, code0), idx);
      const __m256i kept = _mm256_shuffle_epi8(ones8, idx);
      const __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(codes, xv), ones16);
      const __m256i sum = _mm256_madd_epi16(_mm256_maddubs_epi16(kept, xv), ones16);
      const uint16_t* pq = prm + q * pstride + g * np;
      const __m256 sc = _mm256_set1_ps(F16Lane(pq[0]) * sxs);
      if constexpr (kSym) {  // (q - 8) summed exactly in int32: |dot - 8 sum| <= 32 * 8 * 127
        acc[q] = _mm256_fmadd_ps(
            _mm256_cvtepi32_ps(_mm256_sub_epi32(dot, _mm256_slli_epi32(sum, 3))), sc, acc[q]);
      } else {
        const __m256 mn = _mm256_set1_ps(F16Lane(pq[1]) * sxs);
        acc[q] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), sc,
                                 _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), mn, acc[q]));
      }
    }
  }
  for (int q = 0; q < R; ++q) out[q] = HSum8(acc[q]);
}

template <bool kSym>
HWY_NOINLINE void MaskX8Avx2Decode(const MaskWeight& w, const float* x8, int64_t n, int64_t u0,
                                   int64_t u1, float* raw) {
  const int64_t steps = (w.chunks + 1) / 2;
  const int64_t tok_floats = DenseX8Avx2TokenFloats(steps, 1);
  const int64_t rows = u1 - u0;
  float y[4];
  for (int64_t r = u0; r < u1; r += 4) {
    const int R = static_cast<int>(std::min<int64_t>(4, u1 - r));
    for (int64_t t = 0; t < n; ++t) {
      const float* tb = x8 + t * tok_floats;  // rounded once per product by RunDecodeJobs
      const int8_t* xq = reinterpret_cast<const int8_t*>(tb);
      const float* sx = tb + steps * 8;
      if (R == 4) {
        MaskX8Avx2Rows<kSym, 4>(w, xq, sx, steps, r, y);
      } else if (R == 3) {
        MaskX8Avx2Rows<kSym, 3>(w, xq, sx, steps, r, y);
      } else if (R == 2) {
        MaskX8Avx2Rows<kSym, 2>(w, xq, sx, steps, r, y);
      } else {
        MaskX8Avx2Rows<kSym, 1>(w, xq, sx, steps, r, y);
      }
      for (int q = 0; q < R; ++q) raw[t * rows + (r - u0) + q] = y[q];
    }
  }
}
#elif HWY_TARGET == HWY_AVX3_DL
// As nm_x8-inl.h: Highway 1.0.3's AVX3_DL target string lacks avx512vnni.
#define SPARQ_MX8_ATTR __attribute__((target(HWY_TARGET_STR ",avx512vnni")))

// AVX-512 VNNI + VBMI2, per block of 64 columns and row: the block's codes one to a byte from the
// row's next code (one 64-byte load, vpermb + vpmultishiftqb, as MaskQuantDecodeBlocks), vpexpandb
// under the block's 64 mask bits (zeros where pruned), and two vpdpbusd: q * x and, with the mask
// as bytes of 1, x over the kept columns. X as the dense AVX3_DL rows round it (RoundDenseX8:
// column order; lanes 0-7 read block 0, 8-15 block 1). Against the f32-X block decode it leaves
// out the four table permutes (vpermt2ps) per block, the port they shared with the expand.
template <bool kSym, int R>
SPARQ_MX8_ATTR HWY_INLINE void MaskX8Avx3Rows(const MaskWeight& w, const int8_t* xq,
                                              const float* sx, int64_t steps, int64_t r,
                                              float* out) {
  const uint8_t* base = w.values.data_as<uint8_t>();
  const uint16_t* bits = w.bits.data_as<uint16_t>() + r * w.chunks;
  const int np = w.params_per_group();
  const int64_t pstride = w.groups_per_row * np;
  const uint16_t* prm = w.params.data() + r * pstride;
  const int gs = w.group_shift;  // 32, 64 or 128 columns: a block spans one or two groups
  int64_t s[R];
  for (int q = 0; q < R; ++q) s[q] = w.row_ptr[r + q];
  const __m512i win = _mm512_load_si512(kMaskBlockIdx.win);
  const __m512i low4 = _mm512_set1_epi8(0x0F), ones8 = _mm512_set1_epi8(1);
  __m512 acc[R];
  for (int q = 0; q < R; ++q) acc[q] = _mm512_setzero_ps();
  for (int64_t b = 0; b < steps; ++b) {
    const __m512i xv = _mm512_loadu_si512(xq + b * 64);
    const __m512 sxv = _mm512_loadu_ps(sx + b * 16);
    const int64_t left = w.chunks - b * 4;  // chunks in this block (the last may have 1-3)
    // Columns 32-63 of a short last block may lie past the row's last group (its lanes sum 0).
    const int64_t g0 = (b * 64) >> gs, g1 = std::min((b * 64 + 32) >> gs, w.groups_per_row - 1);
    for (int q = 0; q < R; ++q) {
      uint64_t mq = 0;  // the block's mask bits; a short last block reads only its chunks
      std::memcpy(&mq, bits + q * w.chunks + b * 4, left >= 4 ? 8 : static_cast<size_t>(2 * left));
      const __m512i cb = _mm512_loadu_si512(base + (s[q] >> 1));  // (kMaskQuantTail)
      const __m512i ctl = _mm512_load_si512(kMaskBlockIdx.ctl[s[q] & 1]);
      const __m512i codes =
          _mm512_and_si512(_mm512_multishift_epi64_epi8(ctl, _mm512_permutexvar_epi8(win, cb)), low4);
      s[q] += static_cast<int64_t>(hwy::PopCount(mq));
      const __mmask64 k = _cvtu64_mask64(mq);
      const __m512i e = _mm512_maskz_expand_epi8(k, codes);
      const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), e, xv);
      const __m512i sum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_maskz_mov_epi8(k, ones8), xv);
      const uint16_t* p0 = prm + q * pstride + g0 * np;
      const uint16_t* p1 = prm + q * pstride + g1 * np;
      // Lanes 0-7 are columns 0-31 (group g0), 8-15 columns 32-63 (g1; the same group from 64).
      const __m512 sc = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(F16Lane(p0[0])),
                                             _mm512_set1_ps(F16Lane(p1[0])));
      __m512 t;
      if constexpr (kSym) {  // (q - 8) summed exactly in int32
        t = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(dot, _mm512_slli_epi32(sum, 3))), sc);
      } else {
        const __m512 mn = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(F16Lane(p0[1])),
                                               _mm512_set1_ps(F16Lane(p1[1])));
        t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), sc, _mm512_mul_ps(_mm512_cvtepi32_ps(sum), mn));
      }
      acc[q] = _mm512_fmadd_ps(t, sxv, acc[q]);
    }
  }
  for (int q = 0; q < R; ++q) out[q] = _mm512_reduce_add_ps(acc[q]);
}

template <bool kSym>
SPARQ_MX8_ATTR HWY_NOINLINE void MaskX8Avx3Decode(const MaskWeight& w, const float* x8, int64_t n,
                                                  int64_t u0, int64_t u1, float* raw) {
  const int64_t steps = (w.chunks + 3) / 4;
  const int64_t tok_floats = DenseX8TokenFloats(steps, 1);
  const int64_t rows = u1 - u0;
  float y[4];
  for (int64_t r = u0; r < u1; r += 4) {
    const int R = static_cast<int>(std::min<int64_t>(4, u1 - r));
    for (int64_t t = 0; t < n; ++t) {
      const float* tb = x8 + t * tok_floats;  // rounded once per product by RunDecodeJobs
      const int8_t* xq = reinterpret_cast<const int8_t*>(tb);
      const float* sx = tb + steps * 16;
      if (R == 4) {
        MaskX8Avx3Rows<kSym, 4>(w, xq, sx, steps, r, y);
      } else if (R == 3) {
        MaskX8Avx3Rows<kSym, 3>(w, xq, sx, steps, r, y);
      } else if (R == 2) {
        MaskX8Avx3Rows<kSym, 2>(w, xq, sx, steps, r, y);
      } else {
        MaskX8Avx3Rows<kSym, 1>(w, xq, sx, steps, r, y);
      }
      for (int q = 0; q < R; ++q) raw[t * rows + (r - u0) + q] = y[q];
    }
  }
}
#undef SPARQ_MX8_ATTR
#endif  // HWY_TARGET == HWY_AVX2 / HWY_AVX3_DL

// The row's body: rows [u0, u1) of a bit-mask int4 weight, n tokens of the staged X.
template <int kV>
struct MaskX8DecodeBody {
  static void Run(const KernelCall& c) {
#if HWY_TARGET == HWY_AVX2
    const MaskWeight& w = c.w->mask();
    const int64_t steps = (w.chunks + 1) / 2;
    if (c.x8_out != nullptr) {  // about k_pad * 9 / 32 + 24 <= Int8XFloatsPerToken(k_pad) floats
      // One group (its sum of X is not used: the mask rows sum x over the kept columns per row).
      RoundDenseX8Avx2<false>(c.x, w.k_pad(), c.n, steps, 1, 31, c.x8_out);
      return;
    }
    MaskX8Avx2Decode<kV == kValI4Sym>(w, c.x8, c.n, c.u0, c.u1, c.raw);
#elif HWY_TARGET == HWY_AVX3_DL
    const MaskWeight& w = c.w->mask();
    const int64_t steps = (w.chunks + 3) / 4;
    if (c.x8_out != nullptr) {  // steps * 32 + 16 <= Int8XFloatsPerToken(k_pad) floats
      RoundDenseX8<false>(c.x, w.k_pad(), c.n, steps, 1, 31, c.x8_out);
      return;
    }
    MaskX8Avx3Decode<kV == kValI4Sym>(w, c.x8, c.n, c.u0, c.u1, c.raw);
#else
    (void)c;
    std::abort();  // the rows run on AVX3_DL and AVX2 only (their ranges in table_rows.h)
#endif
  }
};

}  // namespace sparq::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // SPARQ_CPU_MASK_X8_INL_H_ toggle
