// Bit-mask rows (layout kMask): decode expands the kept values in registers to dense 16-column
// vectors against contiguous X; tiled turns each k block's bits into X^T offsets.
#if defined(SPARQ_CPU_MASK_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SPARQ_CPU_MASK_INL_H_
#undef SPARQ_CPU_MASK_INL_H_
#else
#define SPARQ_CPU_MASK_INL_H_
#endif

#include "src/cpu/simd-inl.h"
#include "src/cpu/prefetch-inl.h"
#include "src/cpu/tiled-inl.h"

HWY_BEFORE_NAMESPACE();
namespace sparq::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;


// Decode, bit mask. Expands the first popcount(bits) lanes of v to the lanes whose bit is set
// (lane j <- bit j of `bits`, which holds one bit per lane); the other lanes are zero. AVX-512 has
// an expand instruction; AVX2 permutes by a 256-entry table (ExpandTable8) and clears the lanes of
// clear bits by the table's sign bits; other targets go lane by lane.
HWY_INLINE hn::Vec<DF> ExpandLanes(hn::Vec<DF> v, uint32_t bits, const int32_t* lut) {
  const DF df;
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  (void)lut;
  return hn::Vec<DF>{_mm512_maskz_expand_ps(static_cast<__mmask16>(bits), v.raw)};
#elif HWY_TARGET == HWY_AVX2
  const __m256i idx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lut + bits * 8));
  const __m256 p = _mm256_permutevar8x32_ps(v.raw, idx);
  return hn::Vec<DF>{_mm256_blendv_ps(p, _mm256_setzero_ps(), _mm256_castsi256_ps(idx))};
#else
  (void)lut;
  alignas(64) float in[64], lanes[64];
  hn::Store(v, df, in);
  size_t i = 0;
  for (size_t j = 0; j < hn::Lanes(df); ++j) lanes[j] = (bits >> j) & 1 ? in[i++] : 0.0f;
  return hn::Load(df, lanes);
#endif
}
// The first popcount(bits) values at vp (f32 or bf16), expanded as ExpandLanes.
template <bool kBf16>
HWY_INLINE hn::Vec<DF> ExpandValues(const uint8_t* vp, uint32_t bits, const int32_t* lut) {
  return ExpandLanes(LoadValues<kBf16>(DF(), vp), bits, lut);
}

// Prefetch positions of the bit-mask decode. Rows of up to 2 KiB (SmolLM2's: 576-1536 columns) keep
// the linear kDecodePrefetchBytes ahead of each row, which reaches the next block of rows. In
// longer rows that lands in the rows being read (as in the N:M decode), so there each of the R
// streams (rows q, q + R, q + 2R, ...) is prefetched kNmStreamPrefetchBytes ahead; rows differ in
// length, so the position in a row is the chunk's share of an average row (exact row starts,
// approximate offsets). (measurements: docs/kernels.md)
template <bool kPerStream>
class MaskStreamPrefetch {
 public:
  // vbits: bits per stored value (32, 16, 8 or 4).
  MaskStreamPrefetch(const MaskWeight& w, int64_t r, int R, int64_t vbits, int64_t chunks_per_step)
      : w_(w),
        base_(static_cast<const uint8_t*>(w.values.data())),
        r_(r),
        R_(R),
        vbits_(vbits),
        step_(chunks_per_step) {
    if constexpr (kPerStream) {
      const int64_t chunks = std::max<int64_t>(1, w.chunks);
      const int64_t avg_row = w.row_ptr.back() * vbits_ / 8 / std::max<int64_t>(1, w.rows);
      chunk_bytes_ = std::max<int64_t>(1, avg_row / chunks);
      const int64_t ahead = std::max<int64_t>(1, kNmStreamPrefetchBytes / chunk_bytes_);
      pf_rows_ = ahead / chunks;
      pf_chunk_ = ahead % chunks;
    }
  }
  HWY_INLINE void Fetch(int q, const uint8_t* vp) const {
    if constexpr (kPerStream) {
      const int64_t row = std::min(w_.rows - 1, r_ + q + R_ * pf_rows_);
      PrefetchFar(base_ + w_.row_ptr[row] * vbits_ / 8 + pf_chunk_ * chunk_bytes_);
    } else {
      PrefetchFar(vp + kDecodePrefetchBytes);
    }
  }
  HWY_INLINE void Next() {
    if constexpr (kPerStream) {
      pf_chunk_ += step_;
      while (pf_chunk_ >= w_.chunks) {
        pf_chunk_ -= w_.chunks;
        ++pf_rows_;
      }
    }
  }

 private:
  const MaskWeight& w_;
  const uint8_t* base_;
  int64_t r_, R_, vbits_, step_;
  int64_t chunk_bytes_ = 1, pf_rows_ = 0, pf_chunk_ = 0;
};
// Whether a weight's rows are long enough for the per-stream prefetch (average row over 2 KiB).
inline bool MaskPerStreamPrefetch(const MaskWeight& w, int64_t vbits) {
  return w.row_ptr.back() * vbits / 8 > w.rows * (kDecodePrefetchBytes / 3);
}

// R rows in lockstep (one load of X serves R rows) times T tokens (one expansion serves T
// tokens), tokens [t0, t0 + T) of xpad (rows of k_pad floats, zero beyond cols).
template <bool kBf16, int R, int T, bool kStream>
HWY_INLINE void MaskDecodeRows(const MaskWeight& w, const int32_t* lut, const float* xpad,
                               int64_t t0, int64_t r, int64_t r0, int64_t r1, float* raw) {
  const DF df;
  const size_t L = hn::Lanes(df);
  const size_t parts = kMaskChunk / L;
  const uint32_t part_mask = (1u << L) - 1;  // L <= 16
  const size_t vb = kBf16 ? 2 : 4;
  const int64_t kp = w.k_pad();
  const uint8_t* base = static_cast<const uint8_t*>(w.values.data());
  const uint16_t* bits = w.bits.data_as<uint16_t>() + r * w.chunks;
  const uint8_t* vp0 = base + w.row_ptr[r] * vb;
  const uint8_t* vp1 = R > 1 ? base + w.row_ptr[r + (R > 1)] * vb : vp0;
  const uint8_t* vp2 = R > 2 ? base + w.row_ptr[r + 2 * (R > 2)] * vb : vp0;
  const uint8_t* vp3 = R > 3 ? base + w.row_ptr[r + 3 * (R > 3)] * vb : vp0;
  const float* x = xpad + t0 * kp;
  auto a00 = hn::Zero(df), a01 = hn::Zero(df), a02 = hn::Zero(df), a03 = hn::Zero(df);
  auto a10 = hn::Zero(df), a11 = hn::Zero(df), a12 = hn::Zero(df), a13 = hn::Zero(df);
  auto a20 = hn::Zero(df), a21 = hn::Zero(df), a22 = hn::Zero(df), a23 = hn::Zero(df);
  auto a30 = hn::Zero(df), a31 = hn::Zero(df), a32 = hn::Zero(df), a33 = hn::Zero(df);
  MaskStreamPrefetch<kStream> pf(w, r, R, 8 * static_cast<int64_t>(vb), 1);
  for (int64_t c = 0; c < w.chunks; ++c) {
    uint32_t b0 = bits[c], b1 = 0, b2 = 0, b3 = 0;
    pf.Fetch(0, vp0);
    if constexpr (R > 1) {
      b1 = bits[w.chunks + c];
      pf.Fetch(1, vp1);
    }
    if constexpr (R > 2) {
      b2 = bits[2 * w.chunks + c];
      pf.Fetch(2, vp2);
    }
    if constexpr (R > 3) {
      b3 = bits[3 * w.chunks + c];
      pf.Fetch(3, vp3);
    }
    pf.Next();
    for (size_t p = 0; p < parts; ++p) {
      const float* xc = x + c * kMaskChunk + p * L;
      const auto x0 = hn::Load(df, xc);
      const auto x1 = T > 1 ? hn::Load(df, xc + kp * (T > 1)) : x0;
      const auto x2 = T > 2 ? hn::Load(df, xc + 2 * kp * (T > 2)) : x0;
      const auto x3 = T > 3 ? hn::Load(df, xc + 3 * kp * (T > 3)) : x0;
      const unsigned shift = static_cast<unsigned>(p * L);
#define SPARQ_MASK_ROW(q)                                                      \
  if constexpr (R > q) {                                                       \
    const uint32_t bq = (b##q >> shift) & part_mask;                           \
    const auto v = ExpandValues<kBf16>(vp##q, bq, lut);                        \
    vp##q += hwy::PopCount(bq) * vb;                                           \
    a##q##0 = hn::MulAdd(v, x0, a##q##0);                                      \
    if constexpr (T > 1) a##q##1 = hn::MulAdd(v, x1, a##q##1);                 \
    if constexpr (T > 2) a##q##2 = hn::MulAdd(v, x2, a##q##2);                 \
    if constexpr (T > 3) a##q##3 = hn::MulAdd(v, x3, a##q##3);                 \
  }
      SPARQ_MASK_ROW(0)
      SPARQ_MASK_ROW(1)
      SPARQ_MASK_ROW(2)
      SPARQ_MASK_ROW(3)
#undef SPARQ_MASK_ROW
    }
  }
  const int64_t rows = r1 - r0;
  float* out = raw + t0 * rows + (r - r0);
#define SPARQ_MASK_OUT(q, t) \
  if constexpr (R > q && T > t) out[t * rows + q] = hn::GetLane(hn::SumOfLanes(df, a##q##t))
#define SPARQ_MASK_OUT_ROW(q) \
  SPARQ_MASK_OUT(q, 0); SPARQ_MASK_OUT(q, 1); SPARQ_MASK_OUT(q, 2); SPARQ_MASK_OUT(q, 3)
  SPARQ_MASK_OUT_ROW(0);
  SPARQ_MASK_OUT_ROW(1);
  SPARQ_MASK_OUT_ROW(2);
  SPARQ_MASK_OUT_ROW(3);
#undef SPARQ_MASK_OUT_ROW
#undef SPARQ_MASK_OUT
}

#if HWY_TARGET == HWY_AVX3_DL
// bf16 values with AVX-512 VBMI2: 32 columns (two mask words) per step. One vpexpandw places 32
// bf16 values; a shift and an and make f32 of the even and the odd columns in place (no cross-lane
// widening, which shares port 5 with the expand); X is split into even and odd columns by two
// permutes that serve all R rows. (measurements: docs/kernels.md)
template <int R, int T, bool kStream>
HWY_INLINE void MaskDecodeRowsBf16Vbmi2(const MaskWeight& w, const float* xpad, int64_t t0,
                                        int64_t r, int64_t r0, int64_t r1, float* raw) {
  const int64_t kp = w.k_pad();
  const uint16_t* base = w.values.data_as<uint16_t>();
  const uint16_t* bits = w.bits.data_as<uint16_t>() + r * w.chunks;
  const uint16_t* vp0 = base + w.row_ptr[r];
  const uint16_t* vp1 = R > 1 ? base + w.row_ptr[r + (R > 1)] : vp0;
  const uint16_t* vp2 = R > 2 ? base + w.row_ptr[r + 2 * (R > 2)] : vp0;
  const uint16_t* vp3 = R > 3 ? base + w.row_ptr[r + 3 * (R > 3)] : vp0;
  const float* x = xpad + t0 * kp;
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  __m512 a00 = _mm512_setzero_ps(), a01 = a00, a02 = a00, a03 = a00;
  __m512 a10 = a00, a11 = a00, a12 = a00, a13 = a00;
  __m512 a20 = a00, a21 = a00, a22 = a00, a23 = a00;
  __m512 a30 = a00, a31 = a00, a32 = a00, a33 = a00;
  int64_t c = 0;
  MaskStreamPrefetch<kStream> pf(w, r, R, 16, 2);
  for (; c + 2 <= w.chunks; c += 2) {
    __m512 xe0, xo0, xe1 = _mm512_setzero_ps(), xo1 = xe1, xe2 = xe1, xo2 = xe1, xe3 = xe1, xo3 = xe1;
#define SPARQ_X_SPLIT(t)                                                        \
  if constexpr (T > t) {                                                        \
    const float* xc = x + t * kp + c * kMaskChunk;                              \
    const __m512 lo = _mm512_load_ps(xc), hi = _mm512_load_ps(xc + kMaskChunk); \
    xe##t = _mm512_permutex2var_ps(lo, even, hi);                               \
    xo##t = _mm512_permutex2var_ps(lo, odd, hi);                                \
  }
    SPARQ_X_SPLIT(0)
    SPARQ_X_SPLIT(1)
    SPARQ_X_SPLIT(2)
    SPARQ_X_SPLIT(3)
#undef SPARQ_X_SPLIT
#define SPARQ_BF16_ROW(q)                                                                       \
  if constexpr (R > q) {                                                                        \
    pf.Fetch(q, reinterpret_cast<const uint8_t*>(vp##q));                                       \
    const uint32_t m = bits[q * w.chunks + c] | (uint32_t{bits[q * w.chunks + c + 1]} << 16);   \
    const __m512i v = _mm512_maskz_expand_epi16(m, _mm512_loadu_si512(vp##q));                  \
    vp##q += hwy::PopCount(m);                                                                  \
    const __m512 ve = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));                            \
    const __m512 vo = _mm512_castsi512_ps(_mm512_and_si512(v, high));                           \
    a##q##0 = _mm512_fmadd_ps(vo, xo0, _mm512_fmadd_ps(ve, xe0, a##q##0));                      \
    if constexpr (T > 1) a##q##1 = _mm512_fmadd_ps(vo, xo1, _mm512_fmadd_ps(ve, xe1, a##q##1)); \
    if constexpr (T > 2) a##q##2 = _mm512_fmadd_ps(vo, xo2, _mm512_fmadd_ps(ve, xe2, a##q##2)); \
    if constexpr (T > 3) a##q##3 = _mm512_fmadd_ps(vo, xo3, _mm512_fmadd_ps(ve, xe3, a##q##3)); \
  }
    SPARQ_BF16_ROW(0)
    SPARQ_BF16_ROW(1)
    SPARQ_BF16_ROW(2)
    SPARQ_BF16_ROW(3)
#undef SPARQ_BF16_ROW
    pf.Next();
  }
  if (c < w.chunks) {  // odd chunk count: the last 16 columns as the plain path does them
    const float* xc = x + c * kMaskChunk;
    const __m512 x0 = _mm512_load_ps(xc);
    const __m512 x1 = T > 1 ? _mm512_load_ps(xc + kp * (T > 1)) : x0;
    const __m512 x2 = T > 2 ? _mm512_load_ps(xc + 2 * kp * (T > 2)) : x0;
    const __m512 x3 = T > 3 ? _mm512_load_ps(xc + 3 * kp * (T > 3)) : x0;
#define SPARQ_BF16_LAST(q)                                                                   \
  if constexpr (R > q) {                                                                     \
    const __m512 v = ExpandValues<true>(reinterpret_cast<const uint8_t*>(vp##q),             \
                                        bits[q * w.chunks + c], nullptr).raw;                \
    a##q##0 = _mm512_fmadd_ps(v, x0, a##q##0);                                               \
    if constexpr (T > 1) a##q##1 = _mm512_fmadd_ps(v, x1, a##q##1);                          \
    if constexpr (T > 2) a##q##2 = _mm512_fmadd_ps(v, x2, a##q##2);                          \
    if constexpr (T > 3) a##q##3 = _mm512_fmadd_ps(v, x3, a##q##3);                          \
  }
    SPARQ_BF16_LAST(0)
    SPARQ_BF16_LAST(1)
    SPARQ_BF16_LAST(2)
    SPARQ_BF16_LAST(3)
#undef SPARQ_BF16_LAST
  }
  const int64_t rows = r1 - r0;
  float* out = raw + t0 * rows + (r - r0);
#define SPARQ_MASK_OUT(q, t) \
  if constexpr (R > q && T > t) out[t * rows + q] = _mm512_reduce_add_ps(a##q##t)
#define SPARQ_MASK_OUT_ROW(q) \
  SPARQ_MASK_OUT(q, 0); SPARQ_MASK_OUT(q, 1); SPARQ_MASK_OUT(q, 2); SPARQ_MASK_OUT(q, 3)
  SPARQ_MASK_OUT_ROW(0);
  SPARQ_MASK_OUT_ROW(1);
  SPARQ_MASK_OUT_ROW(2);
  SPARQ_MASK_OUT_ROW(3);
#undef SPARQ_MASK_OUT_ROW
#undef SPARQ_MASK_OUT
}
#endif  // HWY_TARGET == HWY_AVX3_DL

template <bool kBf16, int T, bool kStream>
HWY_INLINE void MaskDecodeTokensPf(const MaskWeight& w, const int32_t* lut, const float* xpad,
                                   int64_t t0, int64_t r0, int64_t r1, float* raw) {
  constexpr int R = 4 * T <= kMaxAcc ? 4 : 2;  // R * T accumulators
  int64_t r = r0;
#if HWY_TARGET == HWY_AVX3_DL
  if constexpr (kBf16) {
    for (; r + R <= r1; r += R) MaskDecodeRowsBf16Vbmi2<R, T, kStream>(w, xpad, t0, r, r0, r1, raw);
    for (; r < r1; ++r) MaskDecodeRowsBf16Vbmi2<1, T, kStream>(w, xpad, t0, r, r0, r1, raw);
    return;
  }
#endif
  for (; r + R <= r1; r += R)
    MaskDecodeRows<kBf16, R, T, kStream>(w, lut, xpad, t0, r, r0, r1, raw);
  for (; r < r1; ++r) MaskDecodeRows<kBf16, 1, T, kStream>(w, lut, xpad, t0, r, r0, r1, raw);
}
template <bool kBf16, int T>
HWY_INLINE void MaskDecodeTokens(const MaskWeight& w, const int32_t* lut, const float* xpad,
                                 int64_t t0, int64_t r0, int64_t r1, float* raw) {
  if (MaskPerStreamPrefetch(w, kBf16 ? 16 : 32)) {
    MaskDecodeTokensPf<kBf16, T, true>(w, lut, xpad, t0, r0, r1, raw);
  } else {
    MaskDecodeTokensPf<kBf16, T, false>(w, lut, xpad, t0, r0, r1, raw);
  }
}

template <bool kBf16>
HWY_NOINLINE void MaskDecodeImpl(const MaskWeight& w, const float* xpad, int64_t n, int64_t r0,
                                 int64_t r1, float* raw) {
  const int32_t* lut = ExpandTable8();
  int64_t t = 0;
  for (; t + 4 <= n; t += 4) MaskDecodeTokens<kBf16, 4>(w, lut, xpad, t, r0, r1, raw);
  for (; t + 2 <= n; t += 2) MaskDecodeTokens<kBf16, 2>(w, lut, xpad, t, r0, r1, raw);
  for (; t < n; ++t) MaskDecodeTokens<kBf16, 1>(w, lut, xpad, t, r0, r1, raw);
}


// Tiled, bit mask: offsets into X^T (column * NT) of the kept weights of chunks [c0, c1) of one
// row, written to off (room for (c1 - c0) * 16 + 16 entries); returns how many.
HWY_INLINE int64_t MaskOffsets(const uint16_t* bits, int64_t c0, int64_t c1, int32_t nt,
                               int32_t* off) {
  int64_t cnt = 0;
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  const __m512i lane_off = _mm512_mullo_epi32(
      _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(nt));
  for (int64_t c = c0; c < c1; ++c) {
    const uint32_t b = bits[c];
    const __m512i o = _mm512_add_epi32(lane_off, _mm512_set1_epi32(static_cast<int32_t>(c * kMaskChunk * nt)));
    _mm512_storeu_si512(off + cnt, _mm512_maskz_compress_epi32(static_cast<__mmask16>(b), o));
    cnt += static_cast<int64_t>(hwy::PopCount(b));
  }
#elif HWY_TARGET == HWY_AVX2
  // 8 columns at a time through a 256-entry compress table (no vpcompressd on AVX2): a table
  // load, an add and a multiply per 8 columns instead of a scalar step per kept weight.
  const int32_t* lut = CompressTable8();
  const __m256i vnt = _mm256_set1_epi32(nt);
  for (int64_t c = c0; c < c1; ++c) {
    const uint32_t b = bits[c];
    const __m256i base = _mm256_set1_epi32(static_cast<int32_t>(c * kMaskChunk));
    const uint32_t lo = b & 0xffu, hi = b >> 8;
    const __m256i i0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lut + lo * 8));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(off + cnt),
                        _mm256_mullo_epi32(_mm256_add_epi32(i0, base), vnt));
    cnt += static_cast<int64_t>(hwy::PopCount(lo));
    const __m256i i1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lut + hi * 8));
    _mm256_storeu_si256(
        reinterpret_cast<__m256i*>(off + cnt),
        _mm256_mullo_epi32(_mm256_add_epi32(i1, _mm256_add_epi32(base, _mm256_set1_epi32(8))), vnt));
    cnt += static_cast<int64_t>(hwy::PopCount(hi));
  }
#else
  for (int64_t c = c0; c < c1; ++c) {
    uint32_t b = bits[c];
    while (b != 0) {
      const int32_t j = static_cast<int32_t>(hwy::Num0BitsBelowLS1Bit_Nonzero32(b));
      off[cnt++] = (static_cast<int32_t>(c * kMaskChunk) + j) * nt;
      b &= b - 1;
    }
  }
#endif
  return cnt;
}

// The stored f32 / bf16 values of a bit-mask weight, as MaskTiledImpl reads them: Row gives row
// r's values of chunks [c0, c1) from value p on (slot: which of two rows in flight); At and Bytes
// locate them for prefetching.
template <bool kBf16>
struct MaskStoredValues {
  const uint8_t* vals;
  const void* Row(int64_t /*r*/, int64_t p, int64_t /*c0*/, int64_t /*c1*/, int /*slot*/) const {
    return vals + p * (kBf16 ? 2 : 4);
  }
  const uint8_t* At(int64_t p) const { return vals + p * (kBf16 ? 2 : 4); }
  int64_t Bytes(int64_t count) const { return count * (kBf16 ? 2 : 4); }
};

// Rows [r0, r1) over chunks [c0, c1); cursor[r - r0]: the row's first value of this k block
// (reset at c0 == 0, advanced here); off: room for 4 * ((c1 - c0) * 16 + 16) offsets. vals: the
// values (MaskStoredValues, or quantized ones dequantized per row: kBf16 is then false).
template <int NV, bool kBf16, class Vals>
HWY_NOINLINE void MaskTiledImpl(const MaskWeight& w, const Vals& vals, int64_t r0, int64_t r1,
                                const float* xt, int64_t c0, int64_t c1, int64_t* cursor,
                                int32_t* off, float* scratch, const XtNext& next) {
  const int32_t NT = static_cast<int32_t>(NV * hn::Lanes(DF()));
  const bool first = c0 == 0;
  XtSlicePrefetcher pf(next, 2 * NV <= kMaxAcc ? (r1 - r0 + 1) / 2 : r1 - r0);
  const uint16_t* bits = w.bits.data_as<uint16_t>();
  const int64_t per_row = (c1 - c0) * kMaskChunk + kMaskChunk;
  if (first) {
    for (int64_t r = r0; r < r1; ++r) cursor[r - r0] = w.row_ptr[r];
  }
  int64_t r = r0;
  if constexpr (2 * NV <= kMaxAcc) {
    // Software-pipelined as the N:M rows: the next pair's offsets are decoded before this pair's
    // FMAs (two sets of two rows' offsets, `cur` and cur ^ 1).
    int32_t* offs[2][2] = {{off, off + per_row}, {off + 2 * per_row, off + 3 * per_row}};
    int64_t cnt[2][2] = {{0, 0}, {0, 0}};
    auto decode = [&](int64_t rr, int set) {
      cnt[set][0] = MaskOffsets(bits + rr * w.chunks, c0, c1, NT, offs[set][0]);
      cnt[set][1] = MaskOffsets(bits + (rr + 1) * w.chunks, c0, c1, NT, offs[set][1]);
    };
    int cur = 0;
    if (r + 1 < r1) decode(r, 0);
    for (; r + 1 < r1; r += 2) {
      pf.Step();
      if (r + 3 < r1) decode(r + 2, cur ^ 1);
      const int32_t* o0 = offs[cur][0];
      const int32_t* o1 = offs[cur][1];
      const int64_t n0 = cnt[cur][0], n1 = cnt[cur][1];
      PairTiledRows<2, NV, kBf16>([o0](int64_t i) { return o0[i]; },
                                  vals.Row(r, cursor[r - r0], c0, c1, 0), n0,
                                  [o1](int64_t i) { return o1[i]; },
                                  vals.Row(r + 1, cursor[r + 1 - r0], c0, c1, 1), n1, xt,
                                  scratch + (r - r0) * NT, first);
      cursor[r - r0] += n0;
      cursor[r + 1 - r0] += n1;
      cur ^= 1;
    }
  }
  if constexpr (2 * NV > kMaxAcc) {
    // One row at a time (AVX2's 8-vector tiles), pipelined the same way: the next row's offsets
    // are decoded before this row's FMAs.
    int32_t* offs[2] = {off, off + per_row};
    int64_t cnt[2] = {0, 0};
    int cur = 0;
    if (r < r1) cnt[0] = MaskOffsets(bits + r * w.chunks, c0, c1, NT, offs[0]);
    // This k block's values and bits of the row kRowAhead rows on: rows lie in other pages, out
    // of the hardware prefetchers' reach (as in NmTiledImpl).
    constexpr int64_t kRowAhead = 4;
    const int64_t vlen = vals.Bytes((c1 - c0) * kMaskChunk);
    for (; r < r1; ++r) {
      pf.Step();
      if (r + kRowAhead < r1) {
        const int64_t p0 = first ? w.row_ptr[r + kRowAhead] : cursor[r + kRowAhead - r0];
        const uint8_t* v = vals.At(p0);
        for (int64_t b = 0; b < vlen / 2 + 64; b += 64) hwy::Prefetch(v + b);
        hwy::Prefetch(bits + (r + kRowAhead) * w.chunks + c0);
      }
      if (r + 1 < r1) cnt[cur ^ 1] = MaskOffsets(bits + (r + 1) * w.chunks, c0, c1, NT, offs[cur ^ 1]);
      const int32_t* o0 = offs[cur];
      auto at = [o0](int64_t i) { return o0[i]; };
      PairTiledRows<1, NV, kBf16>(at, vals.Row(r, cursor[r - r0], c0, c1, 0), cnt[cur], at,
                                  nullptr, 0, xt, scratch + (r - r0) * NT, first);
      cursor[r - r0] += cnt[cur];
      cur ^= 1;
    }
  }
  for (; r < r1; ++r) {
    pf.Step();
    const int64_t n0 = MaskOffsets(bits + r * w.chunks, c0, c1, NT, off);
    auto at = [off](int64_t i) { return off[i]; };
    PairTiledRows<1, NV, kBf16>(at, vals.Row(r, cursor[r - r0], c0, c1, 0), n0, at, nullptr, 0,
                                xt, scratch + (r - r0) * NT, first);
    cursor[r - r0] += n0;
  }
}

}  // namespace sparq::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // SPARQ_CPU_MASK_INL_H_
