// Quantized bit-mask kernels (layout kMask with int8 / int4 codes, MaskWeight::spec): each chunk's
// kept codes are loaded compact, dequantized with their group's scale (and min) by the N:M rows'
// DequantLanes, then expanded to the chunk's 16 columns with zeros in the pruned lanes
// (ExpandLanes), so a min never reaches a pruned weight. Decode multiplies the expanded vector
// with contiguous X; tiled dequantizes a row's k block into the f32 buffer the f32 mask body reads.
#if defined(SPARQ_CPU_MASK_QUANT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SPARQ_CPU_MASK_QUANT_INL_H_
#undef SPARQ_CPU_MASK_QUANT_INL_H_
#else
#define SPARQ_CPU_MASK_QUANT_INL_H_
#endif

#include "src/cpu/mask-inl.h"
#include "src/cpu/nm-inl.h"
#include "src/cpu/prefetch-inl.h"
#include "src/cpu/simd-inl.h"
#include "src/cpu/tasks.h"

HWY_BEFORE_NAMESPACE();
namespace sparq::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// An f16 group parameter as f32 (F16C on AVX2 and AVX-512, where Highway's targets include it).
HWY_INLINE float F16Lane(uint16_t h) {
#if HWY_TARGET <= HWY_AVX2
  return _cvtsh_ss(h);
#else
  return F16ToF32(h);
#endif
}

// Codes [s, s + L) of a quantized mask's values (MaskWeight::values) as i32 lanes. int4 codes lie
// two to a byte in value order (CsrMatrix's), so a run may start in a byte's high nibble: 16
// nibbles from nibble s are the 64 bits from bit 4s, one funnel shift of two loads. Each byte is
// then doubled (pshufb), widened, and its lanes shifted by 0 or 4.
HWY_INLINE uint64_t MaskNibbleWord(const uint8_t* base, int64_t s) {
  const uint8_t* p = base + (s >> 1);
  uint64_t lo;
  std::memcpy(&lo, p, 8);
  const unsigned sh = static_cast<unsigned>(s & 1) * 4;
  // sh = 0: (hi << 1) << 63 is 0; sh = 4: hi's low nibble lands in the top nibble.
  return (lo >> sh) | ((uint64_t{p[8]} << 1) << (63 - sh));
}
// The first L nibbles of u as i32 lanes.
HWY_INLINE hn::Vec<DI> NibbleLanes(uint64_t u) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  const __m128i dup = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  const __m512i w =
      _mm512_cvtepu8_epi32(_mm_shuffle_epi8(_mm_cvtsi64_si128(static_cast<long long>(u)), dup));
  const __m512i shift = _mm512_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4);
  return hn::Vec<DI>{_mm512_and_si512(_mm512_srlv_epi32(w, shift), _mm512_set1_epi32(0x0F))};
#elif HWY_TARGET == HWY_AVX2
  const __m128i dup = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  const __m256i w = _mm256_cvtepu8_epi32(
      _mm_shuffle_epi8(_mm_cvtsi32_si128(static_cast<int>(static_cast<uint32_t>(u))), dup));
  const __m256i shift = _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4);
  return hn::Vec<DI>{_mm256_and_si256(_mm256_srlv_epi32(w, shift), _mm256_set1_epi32(0x0F))};
#else
  const DI di;
  alignas(64) int32_t c[hn::MaxLanes(DI())];
  for (size_t l = 0; l < hn::Lanes(di); ++l) c[l] = static_cast<int32_t>((u >> (4 * l)) & 0x0F);
  return hn::Load(di, c);
#endif
}
template <int kV>
HWY_INLINE hn::Vec<DI> MaskCodes(const uint8_t* base, int64_t s) {
  if constexpr (kV == kValI8) {
    const hn::Rebind<int8_t, DF> d8;
    return hn::PromoteTo(DI(), hn::LoadU(d8, reinterpret_cast<const int8_t*>(base) + s));
  } else {
    return NibbleLanes(MaskNibbleWord(base, s));
  }
}

// Whether int4 codes dequantize through a 16-entry table (the group's 16 values, DequantLanes of
// 0..15 once per group) with one permute (vpermps reads an index's low 4 bits), instead of a
// convert and an FMA per vector: AVX-512, where the vector ALUs are two ports and the convert,
// the FMA and the mask's expand contend for them.
template <int kV>
inline constexpr bool kMaskI4Table =
    kV != kValI8 && (HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL);

// Values [s, s + L) as f32, in the group of scale / min (table: its 16 values, kMaskI4Table).
template <int kV>
HWY_INLINE hn::Vec<DF> MaskDequant(const uint8_t* base, int64_t s, hn::Vec<DF> scale,
                                   hn::Vec<DF> min, hn::Vec<DF> table) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if constexpr (kMaskI4Table<kV>) {
#if HWY_TARGET == HWY_AVX3_DL
    // Lane j takes byte (j + s % 2) / 2 of the 16 bytes from byte s / 2 (one vpermb, in place of
    // MaskCodes' scalar funnel shift and three shuffles), shifted by 4 where its nibble is high.
    alignas(64) static constexpr uint8_t kIdx[2][64] = {
        {0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 3, 0, 0, 0,
         4, 0, 0, 0, 4, 0, 0, 0, 5, 0, 0, 0, 5, 0, 0, 0, 6, 0, 0, 0, 6, 0, 0, 0, 7, 0, 0, 0, 7, 0, 0, 0},
        {0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 3, 0, 0, 0, 4, 0, 0, 0,
         4, 0, 0, 0, 5, 0, 0, 0, 5, 0, 0, 0, 6, 0, 0, 0, 6, 0, 0, 0, 7, 0, 0, 0, 7, 0, 0, 0, 8, 0, 0, 0}};
    alignas(64) static constexpr int32_t kShift[2][16] = {
        {0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4}, {4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0}};
    const int par = static_cast<int>(s & 1);
    const __m512i bytes = _mm512_castsi128_si512(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(base + (s >> 1))));
    const __m512i w = _mm512_permutexvar_epi8(_mm512_load_si512(kIdx[par]), bytes);
    const __m512i q = _mm512_srlv_epi32(w, _mm512_load_si512(kShift[par]));
#else
    const __m512i q = MaskCodes<kV>(base, s).raw;
#endif
    (void)scale;
    (void)min;
    return hn::Vec<DF>{_mm512_permutexvar_ps(q, table.raw)};
  }
#endif
  (void)table;
  return DequantLanes<kV>(MaskCodes<kV>(base, s), scale, min);
}

// ExpandLanes of v by the mask word at bitp (bits: its lanes' bits). AVX-512 loads the mask
// register from memory: a kmovw from a general register would take the vector port that the
// expand and the code permutes already fill.
HWY_INLINE hn::Vec<DF> ExpandAt(hn::Vec<DF> v, const uint16_t* bitp, uint32_t bits,
                                const int32_t* lut) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  (void)bits;
  (void)lut;
  return hn::Vec<DF>{
      _mm512_maskz_expand_ps(_load_mask16(reinterpret_cast<__mmask16*>(const_cast<uint16_t*>(bitp))), v.raw)};
#else
  (void)bitp;
  return ExpandLanes(v, bits, lut);
#endif
}

// Decode: raw[t][r - r0] += W[r, :] . xpad[t] for R rows in lockstep x T tokens [t0, t0 + T), as
// MaskDecodeRows. The loop runs by group (each row's scale and min converted once per group), then
// by chunk of the group.
template <int kV, int R, int T, bool kStream>
HWY_INLINE void MaskQuantDecodeRows(const MaskWeight& w, const int32_t* lut, const float* xpad,
                                    int64_t t0, int64_t r, int64_t r0, int64_t r1, float* raw) {
  const DF df;
  const size_t L = hn::Lanes(df);
  const size_t parts = kMaskChunk / L;
  const uint32_t part_mask = (1u << L) - 1;  // L <= 16
  const int64_t kp = w.k_pad();
  const uint8_t* base = w.values.data_as<uint8_t>();
  const uint16_t* bits = w.bits.data_as<uint16_t>() + r * w.chunks;
  const int np = w.params_per_group();
  const int64_t pstride = w.groups_per_row * np;
  const uint16_t* prm = w.params.data() + r * pstride;
  const int64_t per_group = int64_t{1} << (w.group_shift - 4);  // chunks per group
  static_assert(kMaskChunk == 16, "per_group counts chunks of 16 columns");
  constexpr bool kWordCodes = kV != kValI8 && !kMaskI4Table<kV>;
  int64_t s0 = w.row_ptr[r];
  int64_t s1 = R > 1 ? w.row_ptr[r + (R > 1)] : s0;
  int64_t s2 = R > 2 ? w.row_ptr[r + 2 * (R > 2)] : s0;
  int64_t s3 = R > 3 ? w.row_ptr[r + 3 * (R > 3)] : s0;
  const float* x = xpad + t0 * kp;
  auto a00 = hn::Zero(df), a01 = hn::Zero(df), a02 = hn::Zero(df), a03 = hn::Zero(df);
  auto a10 = hn::Zero(df), a11 = hn::Zero(df), a12 = hn::Zero(df), a13 = hn::Zero(df);
  auto a20 = hn::Zero(df), a21 = hn::Zero(df), a22 = hn::Zero(df), a23 = hn::Zero(df);
  auto a30 = hn::Zero(df), a31 = hn::Zero(df), a32 = hn::Zero(df), a33 = hn::Zero(df);
  // A chunk holds a few code bytes (4 at half kept int4): one prefetch per row every kPfChunks
  // chunks, where the f32 rows' one per chunk would cost more than the codes' decode.
  constexpr int64_t kPfChunks = 8;
  MaskStreamPrefetch<kStream> pf(w, r, R, kValBits<kV>, kPfChunks);
  for (int64_t g = 0; g * per_group < w.chunks; ++g) {
    hn::Vec<DF> sc0 = hn::Zero(df), sc1 = sc0, sc2 = sc0, sc3 = sc0;
    hn::Vec<DF> mn0 = sc0, mn1 = sc0, mn2 = sc0, mn3 = sc0;
    hn::Vec<DF> tb0 = sc0, tb1 = sc0, tb2 = sc0, tb3 = sc0;
#define SPARQ_MQ_PARAMS(q)                                                          \
  if constexpr (R > q) {                                                            \
    const uint16_t* pq = prm + q * pstride + g * np;                                \
    sc##q = hn::Set(df, F16Lane(pq[0]));                                            \
    if constexpr (kV == kValI4) mn##q = hn::Set(df, F16Lane(pq[1]));                \
    if constexpr (kMaskI4Table<kV>) tb##q = DequantLanes<kV>(hn::Iota(DI(), 0), sc##q, mn##q); \
  }
    SPARQ_MQ_PARAMS(0)
    SPARQ_MQ_PARAMS(1)
    SPARQ_MQ_PARAMS(2)
    SPARQ_MQ_PARAMS(3)
#undef SPARQ_MQ_PARAMS
    const int64_t c_end = std::min(w.chunks, (g + 1) * per_group);
    for (int64_t c = g * per_group; c < c_end; ++c) {
      uint32_t b0 = bits[c], b1 = 0, b2 = 0, b3 = 0;
      if constexpr (R > 1) b1 = bits[w.chunks + c];
      if constexpr (R > 2) b2 = bits[2 * w.chunks + c];
      if constexpr (R > 3) b3 = bits[3 * w.chunks + c];
      if (c % kPfChunks == 0) {
        pf.Fetch(0, base + ValByte<kV>(s0));
        if constexpr (R > 1) pf.Fetch(1, base + ValByte<kV>(s1));
        if constexpr (R > 2) pf.Fetch(2, base + ValByte<kV>(s2));
        if constexpr (R > 3) pf.Fetch(3, base + ValByte<kV>(s3));
        pf.Next();
      }
      // Targets of fewer than 16 lanes: the chunk's 16 nibbles read once (MaskNibbleWord) and
      // shifted by each part's kept count, instead of a funnel shift per part.
      uint64_t uw0 = 0, uw1 = 0, uw2 = 0, uw3 = 0;
      if constexpr (kWordCodes) {
        uw0 = MaskNibbleWord(base, s0);
        if constexpr (R > 1) uw1 = MaskNibbleWord(base, s1);
        if constexpr (R > 2) uw2 = MaskNibbleWord(base, s2);
        if constexpr (R > 3) uw3 = MaskNibbleWord(base, s3);
      }
      for (size_t p = 0; p < parts; ++p) {
        const float* xc = x + c * kMaskChunk + p * L;
        const auto x0 = hn::Load(df, xc);
        const auto x1 = T > 1 ? hn::Load(df, xc + kp * (T > 1)) : x0;
        const auto x2 = T > 2 ? hn::Load(df, xc + 2 * kp * (T > 2)) : x0;
        const auto x3 = T > 3 ? hn::Load(df, xc + 3 * kp * (T > 3)) : x0;
        const unsigned shift = static_cast<unsigned>(p * L);
#define SPARQ_MQ_ROW(q)                                                                        \
  if constexpr (R > q) {                                                                       \
    const uint32_t bq = (b##q >> shift) & part_mask;                                           \
    const auto dq = kWordCodes ? DequantLanes<kV>(NibbleLanes(uw##q), sc##q, mn##q)           \
                               : MaskDequant<kV>(base, s##q, sc##q, mn##q, tb##q);            \
    const auto v = ExpandAt(dq, bits + q * w.chunks + c, bq, lut);                             \
    s##q += hwy::PopCount(bq);                                                                 \
    if constexpr (kWordCodes) uw##q >>= 4 * hwy::PopCount(bq);                                 \
    a##q##0 = hn::MulAdd(v, x0, a##q##0);                                                      \
    if constexpr (T > 1) a##q##1 = hn::MulAdd(v, x1, a##q##1);                                 \
    if constexpr (T > 2) a##q##2 = hn::MulAdd(v, x2, a##q##2);                                 \
    if constexpr (T > 3) a##q##3 = hn::MulAdd(v, x3, a##q##3);                                 \
  }
        SPARQ_MQ_ROW(0)
        SPARQ_MQ_ROW(1)
        SPARQ_MQ_ROW(2)
        SPARQ_MQ_ROW(3)
#undef SPARQ_MQ_ROW
      }
    }
  }
  const int64_t rows = r1 - r0;
  float* out = raw + t0 * rows + (r - r0);
#define SPARQ_MQ_OUT(q, t) \
  if constexpr (R > q && T > t) out[t * rows + q] = hn::GetLane(hn::SumOfLanes(df, a##q##t))
#define SPARQ_MQ_OUT_ROW(q) \
  SPARQ_MQ_OUT(q, 0); SPARQ_MQ_OUT(q, 1); SPARQ_MQ_OUT(q, 2); SPARQ_MQ_OUT(q, 3)
  SPARQ_MQ_OUT_ROW(0);
  SPARQ_MQ_OUT_ROW(1);
  SPARQ_MQ_OUT_ROW(2);
  SPARQ_MQ_OUT_ROW(3);
#undef SPARQ_MQ_OUT_ROW
#undef SPARQ_MQ_OUT
}

#if HWY_TARGET == HWY_AVX3_DL
// int4 decode by blocks of 64 columns (AVX3_DL, groups of >= 64 columns: a block lies in one
// group). Per row and block: one 64-byte load of the codes from nibble s, one vpermb (qword q
// takes code bytes 4q..4q+7) and one vpmultishiftqb (byte b of qword q takes the nibble at bit
// 4 (b + s % 2)) put the block's kept codes one to a byte; one vpexpandb (VBMI2) spreads them to
// the 64 columns under the block's u64 of mask bits, code 16 where pruned; then 4 x (vpsrld,
// vpermt2ps from the group's 16 values and 16 zeros, FMA). X is read permuted per block
// (MaskPermuteX: vector j holds columns 4i + j), so the expanded bytes need no shuffle to reach
// their dword lanes. Against the per-chunk path (vpermb, vpsrlvd, vpermps, vexpandps, popcount
// and parity tables per 16 columns): 15 vector ops and one popcount per 64 columns instead of
// 20 and four (docs/measurements/xeon-mask-int4-decode-2026-12-05.md). Lane i sums columns 4i..4i+3
// of each block: the same products and roundings per lane count as the f32 mask row, in another
// order (not its bits; the test bounds it).
inline constexpr int64_t kMaskBlock = 64;
struct MaskBlockIdx {
  alignas(64) uint8_t win[64];
  alignas(64) uint8_t ctl[2][64];
};
inline constexpr MaskBlockIdx kMaskBlockIdx = [] {
  MaskBlockIdx t{};
  for (int q = 0; q < 8; ++q) {
    for (int b = 0; b < 8; ++b) {
      t.win[q * 8 + b] = static_cast<uint8_t>(4 * q + b);
      t.ctl[0][q * 8 + b] = static_cast<uint8_t>(4 * b);
      t.ctl[1][q * 8 + b] = static_cast<uint8_t>(4 * (b + 1));
    }
  }
  return t;
}();
template <int kV>
HWY_INLINE bool MaskI4Blocks(const MaskWeight& w) {
  return kV != kValI8 && w.group_shift >= 6 && w.chunks >= kMaskBlock / kMaskChunk;
}
// xpad's n rows (k_pad floats) into xp, each whole block of 64 columns as 4 vectors of columns
// 4i + j (j = 0..3), the chunks after the last whole block as they are.
HWY_INLINE void MaskPermuteX(const float* xpad, int64_t n, int64_t kp, float* xp) {
  const int64_t full = kp / kMaskBlock * kMaskBlock;
  for (int64_t t = 0; t < n; ++t) {
    const float* src = xpad + t * kp;
    float* dst = xp + t * kp;
    for (int64_t b = 0; b < full; b += kMaskBlock) {
      for (int j = 0; j < 4; ++j) {
        for (int i = 0; i < 16; ++i) dst[b + 16 * j + i] = src[b + 4 * i + j];
      }
    }
    std::memcpy(dst + full, src + full, static_cast<size_t>(kp - full) * sizeof(float));
  }
}

// MaskQuantDecodeRows over blocks of 64 columns (xp: MaskPermuteX's), then the chunks after the
// last whole block as MaskQuantDecodeRows runs them.
template <int kV, int R, int T, bool kStream>
HWY_INLINE void MaskQuantDecodeBlocks(
    const MaskWeight& w, const float* xp, int64_t t0, int64_t r, int64_t r0, int64_t r1,
    float* raw) {
  const DF df;
  const int64_t kp = w.k_pad();
  const uint8_t* base = w.values.data_as<uint8_t>();
  const uint16_t* bits = w.bits.data_as<uint16_t>() + r * w.chunks;
  const int np = w.params_per_group();
  const int64_t pstride = w.groups_per_row * np;
  const uint16_t* prm = w.params.data() + r * pstride;
  constexpr int64_t kCpb = kMaskBlock / kMaskChunk;             // chunks per block
  const int64_t blocks = w.chunks / kCpb;
  const int64_t bpg = int64_t{1} << (w.group_shift - 6);       // blocks per group
  int64_t s0 = w.row_ptr[r];
  int64_t s1 = R > 1 ? w.row_ptr[r + (R > 1)] : s0;
  int64_t s2 = R > 2 ? w.row_ptr[r + 2 * (R > 2)] : s0;
  int64_t s3 = R > 3 ? w.row_ptr[r + 3 * (R > 3)] : s0;
  const float* x = xp + t0 * kp;
  __m512 a00 = _mm512_setzero_ps(), a01 = a00, a02 = a00, a03 = a00;
  __m512 a10 = a00, a11 = a00, a12 = a00, a13 = a00;
  __m512 a20 = a00, a21 = a00, a22 = a00, a23 = a00;
  __m512 a30 = a00, a31 = a00, a32 = a00, a33 = a00;
  const __m512i win = _mm512_load_si512(kMaskBlockIdx.win);
  const __m512i fill = _mm512_set1_epi8(16), low4 = _mm512_set1_epi8(0x0F);
  const __m512 zero = _mm512_setzero_ps();
  MaskStreamPrefetch<kStream> pf(w, r, R, kValBits<kV>, 2 * kCpb);
  __m512 tb0 = zero, tb1 = zero, tb2 = zero, tb3 = zero;
  for (int64_t b = 0; b < blocks; ++b) {
    if (b % bpg == 0) {
      const int64_t g = b / bpg;
#define SPARQ_MQB_PARAMS(q)                                                              \
  if constexpr (R > q) {                                                                 \
    const uint16_t* pq = prm + q * pstride + g * np;                                     \
    const auto sc = hn::Set(df, F16Lane(pq[0]));                                         \
    const auto mn = kV == kValI4 ? hn::Set(df, F16Lane(pq[1])) : hn::Zero(df);           \
    tb##q = DequantLanes<kV>(hn::Iota(DI(), 0), sc, mn).raw;                             \
  }
      SPARQ_MQB_PARAMS(0)
      SPARQ_MQB_PARAMS(1)
      SPARQ_MQB_PARAMS(2)
      SPARQ_MQB_PARAMS(3)
#undef SPARQ_MQB_PARAMS
    }
    if (b % 2 == 0) {
      pf.Fetch(0, base + (s0 >> 1));
      if constexpr (R > 1) pf.Fetch(1, base + (s1 >> 1));
      if constexpr (R > 2) pf.Fetch(2, base + (s2 >> 1));
      if constexpr (R > 3) pf.Fetch(3, base + (s3 >> 1));
      pf.Next();
    }
    // X is read by each FMA (a memory operand): 4 T vectors kept for R rows would leave too few
    // of the 32 registers for R T accumulators at T = 4.
    const float* xb = x + b * kMaskBlock;
#define SPARQ_MQB_FMA(q, t, j, v) \
  if constexpr (T > t) a##q##t = _mm512_fmadd_ps(v, _mm512_load_ps(xb + t * kp + 16 * j), a##q##t);
#define SPARQ_MQB_J(q, j, e)                                                       \
  {                                                                                \
    const __m512 v = _mm512_permutex2var_ps(tb##q, e, zero);                       \
    SPARQ_MQB_FMA(q, 0, j, v) SPARQ_MQB_FMA(q, 1, j, v) SPARQ_MQB_FMA(q, 2, j, v)  \
    SPARQ_MQB_FMA(q, 3, j, v)                                                      \
  }
#define SPARQ_MQB_ROW(q)                                                                        \
  if constexpr (R > q) {                                                                        \
    const uint16_t* bq = bits + q * w.chunks + b * kCpb;                                        \
    uint64_t mq;                                                                                \
    std::memcpy(&mq, bq, 8);                                                                    \
    const __m512i cb = _mm512_loadu_si512(base + (s##q >> 1));                                  \
    const __m512i ctl = _mm512_load_si512(kMaskBlockIdx.ctl[s##q & 1]);                         \
    const __m512i codes =                                                                       \
        _mm512_and_si512(_mm512_multishift_epi64_epi8(ctl, _mm512_permutexvar_epi8(win, cb)), low4); \
    const __m512i e = _mm512_mask_expand_epi8(                                                  \
        fill, _cvtu64_mask64(mq), codes);  /* bq is u16-aligned: no __mmask64 load */            \
    s##q += static_cast<int64_t>(hwy::PopCount(mq));                                            \
    SPARQ_MQB_J(q, 0, e)                                                                        \
    SPARQ_MQB_J(q, 1, _mm512_srli_epi32(e, 8))                                                  \
    SPARQ_MQB_J(q, 2, _mm512_srli_epi32(e, 16))                                                 \
    SPARQ_MQB_J(q, 3, _mm512_srli_epi32(e, 24))                                                 \
  }
    SPARQ_MQB_ROW(0)
    SPARQ_MQB_ROW(1)
    SPARQ_MQB_ROW(2)
    SPARQ_MQB_ROW(3)
#undef SPARQ_MQB_ROW
#undef SPARQ_MQB_J
#undef SPARQ_MQB_FMA
  }
  // The chunks after the last whole block (k_pad not a multiple of 64), unpermuted in xp.
  for (int64_t c = blocks * kCpb; c < w.chunks; ++c) {
    const int64_t g = (c * kMaskChunk) >> w.group_shift;
    const float* xc = x + c * kMaskChunk;
#define SPARQ_MQB_TAIL(q)                                                                      \
  if constexpr (R > q) {                                                                       \
    const uint16_t* pq = prm + q * pstride + g * np;                                           \
    const auto sc = hn::Set(df, F16Lane(pq[0]));                                               \
    const auto mn = kV == kValI4 ? hn::Set(df, F16Lane(pq[1])) : hn::Zero(df);                 \
    const auto tb = DequantLanes<kV>(hn::Iota(DI(), 0), sc, mn);                               \
    const uint16_t* bq = bits + q * w.chunks + c;                                              \
    const __m512 v = ExpandAt(MaskDequant<kV>(base, s##q, sc, mn, tb), bq, *bq, nullptr).raw;  \
    s##q += hwy::PopCount(*bq);                                                                \
    a##q##0 = _mm512_fmadd_ps(v, _mm512_load_ps(xc), a##q##0);                                 \
    if constexpr (T > 1) a##q##1 = _mm512_fmadd_ps(v, _mm512_load_ps(xc + kp), a##q##1);       \
    if constexpr (T > 2) a##q##2 = _mm512_fmadd_ps(v, _mm512_load_ps(xc + 2 * kp), a##q##2);   \
    if constexpr (T > 3) a##q##3 = _mm512_fmadd_ps(v, _mm512_load_ps(xc + 3 * kp), a##q##3);   \
  }
    SPARQ_MQB_TAIL(0)
    SPARQ_MQB_TAIL(1)
    SPARQ_MQB_TAIL(2)
    SPARQ_MQB_TAIL(3)
#undef SPARQ_MQB_TAIL
  }
  const int64_t rows = r1 - r0;
  float* out = raw + t0 * rows + (r - r0);
#define SPARQ_MQB_OUT(q, t) \
  if constexpr (R > q && T > t) out[t * rows + q] = _mm512_reduce_add_ps(a##q##t)
#define SPARQ_MQB_OUT_ROW(q) \
  SPARQ_MQB_OUT(q, 0); SPARQ_MQB_OUT(q, 1); SPARQ_MQB_OUT(q, 2); SPARQ_MQB_OUT(q, 3)
  SPARQ_MQB_OUT_ROW(0);
  SPARQ_MQB_OUT_ROW(1);
  SPARQ_MQB_OUT_ROW(2);
  SPARQ_MQB_OUT_ROW(3);
#undef SPARQ_MQB_OUT_ROW
#undef SPARQ_MQB_OUT
}
#endif  // HWY_TARGET == HWY_AVX3_DL

template <int kV, int T, bool kStream>
HWY_INLINE void MaskQuantDecodeTokensPf(const MaskWeight& w, const int32_t* lut, const float* xpad,
                                        int64_t t0, int64_t r0, int64_t r1, float* raw) {
  constexpr int R = 4 * T <= kMaxAcc ? 4 : 2;  // R * T accumulators
  int64_t r = r0;
#if HWY_TARGET == HWY_AVX3_DL
  if (MaskI4Blocks<kV>(w)) {  // xpad: MaskPermuteX's
    for (; r + R <= r1; r += R) MaskQuantDecodeBlocks<kV, R, T, kStream>(w, xpad, t0, r, r0, r1, raw);
    for (; r < r1; ++r) MaskQuantDecodeBlocks<kV, 1, T, kStream>(w, xpad, t0, r, r0, r1, raw);
    return;
  }
#endif
  for (; r + R <= r1; r += R) MaskQuantDecodeRows<kV, R, T, kStream>(w, lut, xpad, t0, r, r0, r1, raw);
  for (; r < r1; ++r) MaskQuantDecodeRows<kV, 1, T, kStream>(w, lut, xpad, t0, r, r0, r1, raw);
}

template <int kV>
HWY_NOINLINE void MaskQuantDecodeImpl(const MaskWeight& w, const float* xpad, int64_t n,
                                      int64_t r0, int64_t r1, float* raw) {
  const int32_t* lut = ExpandTable8();
#if HWY_TARGET == HWY_AVX3_DL
  if (MaskI4Blocks<kV>(w)) {  // this task's copy of X, permuted per block (MaskQuantDecodeBlocks)
    float* xp = ThreadBuffer(kMaskPermutedXSlot, static_cast<size_t>(n * w.k_pad()));
    MaskPermuteX(xpad, n, w.k_pad(), xp);
    xpad = xp;
  }
#endif
  auto tokens = [&](auto tt, int64_t t) {
    constexpr int T = decltype(tt)::value;
    if (MaskPerStreamPrefetch(w, kValBits<kV>)) {
      MaskQuantDecodeTokensPf<kV, T, true>(w, lut, xpad, t, r0, r1, raw);
    } else {
      MaskQuantDecodeTokensPf<kV, T, false>(w, lut, xpad, t, r0, r1, raw);
    }
  };
  int64_t t = 0;
  for (; t + 4 <= n; t += 4) tokens(std::integral_constant<int, 4>(), t);
  for (; t + 2 <= n; t += 2) tokens(std::integral_constant<int, 2>(), t);
  for (; t < n; ++t) tokens(std::integral_constant<int, 1>(), t);
}

// Tiled: a quantized mask's values as MaskTiledImpl reads them (MaskStoredValues' interface): row
// r's kept values of chunks [c0, c1) from value p on, dequantized into buf (two rows in flight, per_row
// floats each: (c1 - c0) * 16 + 16, as the offsets, since each chunk stores whole vectors).
template <int kV>
struct MaskQuantValues {
  const MaskWeight& w;
  float* buf;
  int64_t per_row;
  const void* Row(int64_t r, int64_t p, int64_t c0, int64_t c1, int slot) const {
    const DF df;
    const int64_t L = static_cast<int64_t>(hn::Lanes(df));
    const uint8_t* base = w.values.data_as<uint8_t>();
    const uint16_t* bits = w.bits.data_as<uint16_t>() + r * w.chunks;
    const uint16_t* prm = w.params.data() + r * w.groups_per_row * w.params_per_group();
    float* out = buf + slot * per_row;
    int64_t at = 0;
    // A group's scale, min and code table are set up once for its chunks (4 at g64), not per
    // chunk: per token tile this loop runs again, and its set-up cost more than the stores.
    int64_t group = -1;
    hn::Vec<DF> scale = hn::Zero(df), min = hn::Zero(df), table = hn::Zero(df);
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t cnt = static_cast<int64_t>(hwy::PopCount(bits[c]));
      if (const int64_t g = c * kMaskChunk >> w.group_shift; g != group) {
        group = g;
        const uint16_t* pg = prm + g * w.params_per_group();
        scale = hn::Set(df, F16Lane(pg[0]));
        if constexpr (kV == kValI4) min = hn::Set(df, F16Lane(pg[1]));
        table = min;
        if constexpr (kMaskI4Table<kV>) table = DequantLanes<kV>(hn::Iota(DI(), 0), scale, min);
      }
      for (int64_t j = 0; j < cnt; j += L) {
        hn::StoreU(MaskDequant<kV>(base, p + j, scale, min, table), df, out + at + j);
      }
      at += cnt;
      p += cnt;
    }
    return out;
  }
  const uint8_t* At(int64_t p) const { return w.values.data_as<uint8_t>() + ValByte<kV>(p & ~int64_t{1}); }
  int64_t Bytes(int64_t count) const { return ValByte<kV>(count); }
};

}  // namespace sparq::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // SPARQ_CPU_MASK_QUANT_INL_H_
