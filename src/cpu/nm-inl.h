// N:M kernels (layout kNm, spmm_packed.h): decode (few tokens; indices decoded in registers, X
// gathered or permuted from a 2L-column window) and tiled (many tokens; rows against X^T tiles).
#if defined(SPARQ_CPU_NM_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SPARQ_CPU_NM_INL_H_
#undef SPARQ_CPU_NM_INL_H_
#else
#define SPARQ_CPU_NM_INL_H_
#endif

#include "src/cpu/simd-inl.h"
#include "src/cpu/prefetch-inl.h"
#include "src/cpu/tiled-inl.h"

HWY_BEFORE_NAMESPACE();
namespace sparq::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// (j / n) * m) and its index occupies bits [b*j, b*j+b) of word (b*j)/32.
struct NmLaneTables {
  alignas(64) int32_t base[kNmChunk];
  alignas(64) uint32_t shift[kNmChunk];
  alignas(64) uint32_t word1[kNmChunk];  // all-ones where the lane reads the second word
  // Decode with a two-table permute (m = 2n, n divides L): lane j's index into the 2L columns
  // that start at its lane group's first column (2L * (j / L)). A multiple of m, so the index
  // is pbase | idx (one ternary-logic op with the mask) instead of (idx & mask) + base.
  alignas(64) int32_t pbase[kNmChunk];
  NmLaneTables(int n, int m, int bits) {
    const int L = static_cast<int>(hn::Lanes(DF()));
    for (int j = 0; j < kNmChunk; ++j) {
      base[j] = (j / n) * m;
      pbase[j] = base[j] - 2 * L * (j / L);
      shift[j] = static_cast<uint32_t>((bits * j) % 32);
      word1[j] = (bits * j) >= 32 ? ~0u : 0u;
    }
  }
};

// The metadata word that holds each lane's index, for lanes [p*L, p*L+L) of a chunk, shifted so
// that the index sits in the low kBits (the bits above it are the next lanes').
template <int kBits>
HWY_INLINE hn::Vec<DU> NmShiftedWords(const uint32_t* words, const NmLaneTables& t, size_t p) {
  const DU du;
  const size_t L = hn::Lanes(du);
  auto w = hn::Set(du, words[0]);
  if constexpr (kBits == 4) {
    const auto sel = hn::Load(du, t.word1 + p * L);
    w = hn::IfThenElse(hn::RebindMask(du, hn::Ne(sel, hn::Zero(du))), hn::Set(du, words[1]), w);
  }
  return hn::Shr(w, hn::Load(du, t.shift + p * L));
}

// Columns of lanes [p*L, p*L+L) of a chunk whose first column is `chunk_col`.
template <int kBits>
HWY_INLINE hn::Vec<DI> NmColumns(const uint32_t* words, const NmLaneTables& t, size_t p,
                                 int32_t chunk_col) {
  const DU du;
  const DI di;
  const size_t L = hn::Lanes(du);
  const auto idx = hn::And(NmShiftedWords<kBits>(words, t, p), hn::Set(du, (1u << kBits) - 1));
  return hn::Add(hn::Add(hn::Set(di, chunk_col), hn::Load(di, t.base + p * L)),
                 hn::BitCast(di, idx));
}

// As NmColumns, for the permute decode (m = 2n): lane indices into the lane group's 2L columns.
template <int kBits>
HWY_INLINE hn::Vec<DI> NmPermIndices(const uint32_t* words, const NmLaneTables& t, size_t p) {
  const DU du;
  const DI di;
  const size_t L = hn::Lanes(du);
  return hn::BitCast(di, hn::OrAnd(hn::BitCast(du, hn::Load(di, t.pbase + p * L)),
                                   NmShiftedWords<kBits>(words, t, p),
                                   hn::Set(du, (1u << kBits) - 1)));
}


// The X window of a permute decode at column wcol: two vectors covering [wcol, wcol + 2L).
// kHalves (2:4 on AVX2, L = 8): lanes 2g and 2g + 1 read columns [4g, 4g + 4), so the window is
// cut as lo = [x0..3 | x8..11], hi = [x4..7 | x12..15]; each lane's four candidates then sit in
// its own 128-bit half of lo (lanes 0, 1, 4, 5) or hi (2, 3, 6, 7), and NmPermute needs only
// in-lane vpermilps, which read an index's low 2 bits (no mask, no base: NmShiftedWords as it is),
// and an immediate blend, where Permute2 takes NmPermIndices' base and mask, two cross-lane vpermps
// and a variable blend.
template <bool kHalves>
HWY_INLINE void NmWindow(const float* x, int32_t wcol, hn::Vec<DF>& lo, hn::Vec<DF>& hi) {
#if HWY_TARGET == HWY_AVX2
  if constexpr (kHalves) {
    lo = hn::Vec<DF>{_mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(x + wcol)),
                                          _mm_loadu_ps(x + wcol + 8), 1)};
    hi = hn::Vec<DF>{_mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(x + wcol + 4)),
                                          _mm_loadu_ps(x + wcol + 12), 1)};
    return;
  }
#endif
  static_assert(!kHalves || HWY_TARGET == HWY_AVX2, "the halves window is AVX2's");
  const DF df;
  lo = hn::LoadU(df, x + wcol);
  hi = hn::LoadU(df, x + wcol + hn::Lanes(df));
}

// Lane j of the window (lo, hi) that its decoded index selects (NmPermIndices / NmShiftedWords).
template <bool kHalves>
HWY_INLINE hn::Vec<DF> NmPermute(hn::Vec<DF> lo, hn::Vec<DF> hi, hn::Vec<DI> idx) {
#if HWY_TARGET == HWY_AVX2
  if constexpr (kHalves) {
    return hn::Vec<DF>{_mm256_blend_ps(_mm256_permutevar_ps(lo.raw, idx.raw),
                                       _mm256_permutevar_ps(hi.raw, idx.raw), 0xCC)};
  }
#endif
  return Permute2(DF(), lo, hi, idx);
}


// Value kinds of the N:M kernels (ValueKind, as template arguments), and their bits.
inline constexpr int kValF32 = static_cast<int>(ValueKind::kF32);
inline constexpr int kValBf16 = static_cast<int>(ValueKind::kBf16);
inline constexpr int kValI8 = static_cast<int>(ValueKind::kI8);
inline constexpr int kValI4Sym = static_cast<int>(ValueKind::kI4Sym);
inline constexpr int kValI4 = static_cast<int>(ValueKind::kI4);
template <int kV>
inline constexpr int64_t kValBits = kV == kValF32 ? 32 : kV == kValBf16 ? 16 : kV == kValI8 ? 8 : 4;
// Byte offset of value index i (kValBits<kV> * i / 8; i even for 4-bit values).
template <int kV>
HWY_INLINE int64_t ValByte(int64_t i) { return i * kValBits<kV> / 8; }

// 4-bit codes of lanes [j, j + L) of a chunk (j a multiple of L) whose 8 bytes start at p (byte b:
// value b in the low nibble, b + 8 in the high one), as i32 lanes 0..15.
HWY_INLINE hn::Vec<DI> Nibbles(const uint8_t* p, int64_t j) {
  const DI di;
  const size_t L = hn::Lanes(di);
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if (L == 16) {
    // The 8 bytes in both 64-bit halves of 16 bytes, widened: lanes 0-7 shift by 0, 8-15 by 4.
    uint64_t bytes;
    std::memcpy(&bytes, p, 8);
    const __m128i b = _mm_set1_epi64x(static_cast<long long>(bytes));
    const __m512i w = _mm512_cvtepu8_epi32(b);
    const __m512i sh = _mm512_set_epi32(4, 4, 4, 4, 4, 4, 4, 4, 0, 0, 0, 0, 0, 0, 0, 0);
    return hn::Vec<DI>{_mm512_and_si512(_mm512_srlv_epi32(w, sh), _mm512_set1_epi32(0x0F))};
  }
#endif
#if HWY_TARGET <= HWY_AVX2
  if (L == 8) {
    // Lanes [0, 8) are the low nibbles of the 8 bytes, [8, 16) the high ones.
    const hn::Rebind<uint8_t, DF> d8;
    const auto w = hn::BitCast(di, hn::PromoteTo(hn::RebindToUnsigned<DF>(), hn::LoadU(d8, p)));
    return hn::And(j == 0 ? w : hn::ShiftRight<4>(w), hn::Set(di, 0x0F));
  }
#endif
  alignas(64) int32_t c[hn::MaxLanes(DF())];
  for (size_t l = 0; l < L; ++l) {
    const int64_t e = j + static_cast<int64_t>(l);
    c[l] = (p[e % (kNmChunk / 2)] >> (e >= kNmChunk / 2 ? 4 : 0)) & 0x0F;
  }
  return hn::Load(di, c);
}

// Codes q of one group as f32 with the expressions of sparq/quant.h's Dequantize (min: int4 with a
// min only), so every quantized kernel gives the dequantized weight's exact values.
template <int kV>
HWY_INLINE hn::Vec<DF> DequantLanes(hn::Vec<DI> q, hn::Vec<DF> scale, hn::Vec<DF> min) {
  const DF df;
  if constexpr (kV == kValI8) {
    (void)min;
    return hn::Mul(hn::ConvertTo(df, q), scale);
  } else if constexpr (kV == kValI4Sym) {
    (void)min;
    return hn::Mul(hn::ConvertTo(df, hn::Sub(q, hn::Set(DI(), 8))), scale);
  } else {
    return hn::MulAdd(hn::ConvertTo(df, q), scale, min);
  }
}

// Values [i, i + L) of row r (i a multiple of L inside one chunk) as f32: loaded, or dequantized
// by the group's scale (and min) with the expressions of sparq/quant.h (same bits as the
// dequantized weight).
template <int kV>
HWY_INLINE hn::Vec<DF> NmValues(const NmWeight& w, int64_t r, int64_t i) {
  const DF df;
  const uint8_t* base = static_cast<const uint8_t*>(w.values.data());
  const int64_t e = r * w.chunks * kNmChunk + i;
  if constexpr (kV == kValF32 || kV == kValBf16) {
    return LoadValues<kV == kValBf16>(df, base + ValByte<kV>(e));
  } else {
    const int64_t g = r * w.groups_per_row + (i >> w.group_shift);
    const auto scale = hn::Set(df, w.scales[static_cast<size_t>(g)]);
    hn::Vec<DF> min = hn::Zero(df);
    if constexpr (kV == kValI4) min = hn::Set(df, w.mins[static_cast<size_t>(g)]);
    if constexpr (kV == kValI8) {
      const hn::Rebind<int8_t, DF> d8;
      const auto q = hn::PromoteTo(DI(), hn::LoadU(d8, reinterpret_cast<const int8_t*>(base) + e));
      return DequantLanes<kV>(q, scale, min);
    } else {
      return DequantLanes<kV>(Nibbles(base + (e - e % kNmChunk) / 2, e % kNmChunk), scale, min);
    }
  }
}

// Decode, N:M: raw[t][r - r0] = sum over kept weights of row r times xpad[t] (k_pad floats, zero
// beyond cols). R rows run in lockstep (R weight streams, and one X window serves all R rows), over
// T tokens [t0, t0 + T) at once (each row's decoded positions and values serve all T tokens).
// kPerm (m == 2n, L % n == 0): the L kept values of a vector come from a window of 2L columns,
// so X is loaded as two vectors and permuted by the decoded positions (one vpermt2ps on AVX-512)
// instead of gathered; otherwise X is gathered. kHalves: the 2:4 window of AVX2 (NmWindow). Each
// (row, token) sum runs in the same order whatever T is, so the token blocking changes no bits;
// kHalves selects the same X lanes as Permute2, so it changes none either.
template <int kBits, int kV, bool kPerm, bool kHalves, int R, int T>
HWY_INLINE void NmDecodeRows(const NmWeight& w, const NmLaneTables& tab, const float* xpad,
                             int64_t t0, int64_t r, int64_t r0, int64_t r1, float* raw) {
  static_assert(R >= 1 && R <= 4 && T >= 1 && T <= 4);
  const DF df;
  const size_t L = hn::Lanes(df);
  const size_t per_chunk = kNmChunk / L;
  const int32_t chunk_cols = (kNmChunk / w.n) * w.m;
  const int words = w.words_per_chunk();
  const int64_t row_vals = w.chunks * kNmChunk;
  const int64_t row_bytes = ValByte<kV>(row_vals);
  const uint8_t* vals = static_cast<const uint8_t*>(w.values.data()) + r * row_bytes;
  const uint32_t* meta = w.meta.data_as<uint32_t>() + r * w.chunks * words;
  const int64_t chunk_bytes = ValByte<kV>(kNmChunk);
  const float* x0 = xpad + t0 * w.k_pad;
  const float* x1 = x0 + (T > 1 ? w.k_pad : 0);
  const float* x2 = x0 + (T > 2 ? 2 * w.k_pad : 0);
  const float* x3 = x0 + (T > 3 ? 3 * w.k_pad : 0);
  // a<q><t>: row q, token t.
  auto a00 = hn::Zero(df), a01 = hn::Zero(df), a02 = hn::Zero(df), a03 = hn::Zero(df);
  auto a10 = hn::Zero(df), a11 = hn::Zero(df), a12 = hn::Zero(df), a13 = hn::Zero(df);
  auto a20 = hn::Zero(df), a21 = hn::Zero(df), a22 = hn::Zero(df), a23 = hn::Zero(df);
  auto a30 = hn::Zero(df), a31 = hn::Zero(df), a32 = hn::Zero(df), a33 = hn::Zero(df);
  RowStreamAhead pf(row_bytes);
  for (int64_t c = 0; c < w.chunks; ++c) {
    const int32_t col0 = static_cast<int32_t>(c * chunk_cols);
    for (int q = 0; q < R; ++q) PrefetchFar(vals + pf.Row(q, R) * row_bytes + pf.off);
    pf.Advance(chunk_bytes);
    for (size_t p = 0; p < per_chunk; ++p) {
      hn::Vec<DF> xlo0, xhi0, xlo1, xhi1, xlo2, xhi2, xlo3, xhi3;
      if constexpr (kPerm) {
        const int32_t wcol = col0 + static_cast<int32_t>(2 * p * L);
#define SPARQ_NM_WINDOW(t) \
  if constexpr (T > t) NmWindow<kHalves>(x##t, wcol, xlo##t, xhi##t);
        SPARQ_NM_WINDOW(0)
        SPARQ_NM_WINDOW(1)
        SPARQ_NM_WINDOW(2)
        SPARQ_NM_WINDOW(3)
#undef SPARQ_NM_WINDOW
      }
#define SPARQ_NM_TOKEN(q, t)                                                                      \
  if constexpr (T > t) {                                                                          \
    const auto xv = kPerm ? NmPermute<kHalves>(xlo##t, xhi##t, cols)                               \
                          : hn::GatherIndex(df, x##t, cols);                                      \
    a##q##t = hn::MulAdd(v, xv, a##q##t);                                                         \
  }
#define SPARQ_NM_ROW(q)                                                                          \
  if constexpr (R > q) {                                                                         \
    const uint32_t* qw = meta + (q * w.chunks + c) * words;                                      \
    const auto cols = kHalves ? hn::BitCast(DI(), NmShiftedWords<kBits>(qw, tab, p))              \
                      : kPerm ? NmPermIndices<kBits>(qw, tab, p)                                 \
                              : NmColumns<kBits>(qw, tab, p, col0);                              \
    const auto v = NmValues<kV>(w, r + q, c * kNmChunk + static_cast<int64_t>(p * L));           \
    SPARQ_NM_TOKEN(q, 0)                                                                         \
    SPARQ_NM_TOKEN(q, 1)                                                                         \
    SPARQ_NM_TOKEN(q, 2)                                                                         \
    SPARQ_NM_TOKEN(q, 3)                                                                         \
  }
      SPARQ_NM_ROW(0)
      SPARQ_NM_ROW(1)
      SPARQ_NM_ROW(2)
      SPARQ_NM_ROW(3)
#undef SPARQ_NM_ROW
#undef SPARQ_NM_TOKEN
    }
  }
  float* out = raw + t0 * (r1 - r0) + (r - r0);
#define SPARQ_NM_OUT(q, t) \
  if constexpr (R > q && T > t) out[t * (r1 - r0) + q] = hn::GetLane(hn::SumOfLanes(df, a##q##t))
#define SPARQ_NM_OUT_ROW(q) \
  SPARQ_NM_OUT(q, 0);       \
  SPARQ_NM_OUT(q, 1);       \
  SPARQ_NM_OUT(q, 2);       \
  SPARQ_NM_OUT(q, 3)
  SPARQ_NM_OUT_ROW(0);
  SPARQ_NM_OUT_ROW(1);
  SPARQ_NM_OUT_ROW(2);
  SPARQ_NM_OUT_ROW(3);
#undef SPARQ_NM_OUT_ROW
#undef SPARQ_NM_OUT
}

// Tokens per pass of the N:M decode: R * T accumulators, plus T two-vector X windows.
inline constexpr int kNmDecodeTokens = kMaxAcc >= 16 ? 4 : 2;

template <int kBits, int kV, bool kPerm, bool kHalves, int R>
HWY_INLINE void NmDecodeRowTokens(const NmWeight& w, const NmLaneTables& tab, const float* xpad,
                                  int64_t n, int64_t r, int64_t r0, int64_t r1, float* raw) {
  constexpr int T = kNmDecodeTokens;
  int64_t t = 0;
  for (; t + T <= n; t += T)
    NmDecodeRows<kBits, kV, kPerm, kHalves, R, T>(w, tab, xpad, t, r, r0, r1, raw);
  if constexpr (T > 2) {
    for (; t + 2 <= n; t += 2)
      NmDecodeRows<kBits, kV, kPerm, kHalves, R, 2>(w, tab, xpad, t, r, r0, r1, raw);
  }
  for (; t < n; ++t) {
    NmDecodeRows<kBits, kV, kPerm, kHalves, R, 1>(w, tab, xpad, t, r, r0, r1, raw);
  }
}

template <int kBits, int kV, bool kPerm, bool kHalves>
HWY_NOINLINE void NmDecodeImpl(const NmWeight& w, const float* xpad, int64_t n, int64_t r0,
                               int64_t r1, float* raw) {
  const NmLaneTables tab(w.n, w.m, w.bits);
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4)
    NmDecodeRowTokens<kBits, kV, kPerm, kHalves, 4>(w, tab, xpad, n, r, r0, r1, raw);
  for (; r < r1; ++r) {
    NmDecodeRowTokens<kBits, kV, kPerm, kHalves, 1>(w, tab, xpad, n, r, r0, r1, raw);
  }
}


// Decoded chunks of R rows: for chunk c - c0, row q, kept weight j, the X^T offset (column * NT)
// and the value (f32), [chunk][row][j].
template <int R, int kChunks>
struct NmDecoded {
  alignas(64) int32_t off[kChunks * R * kNmChunk];
  alignas(64) float wv[kChunks * R * kNmChunk];
};

// Decodes chunks [c0, c1) (at most kChunks) of rows r..r+R-1 into d.
template <int kBits, int kV, int R, int kChunks>
HWY_INLINE void NmDecodeBlock(const NmWeight& w, const NmLaneTables& tab, int64_t r, int64_t c0,
                             int64_t c1, int32_t nt, NmDecoded<R, kChunks>& d) {
  const DF df;
  const DI di;
  const size_t L = hn::Lanes(df);
  const size_t per_chunk = kNmChunk / L;
  const int32_t chunk_cols = (kNmChunk / w.n) * w.m;
  const int words = w.words_per_chunk();
  const int64_t row_vals = w.chunks * kNmChunk;
  const uint8_t* vals = static_cast<const uint8_t*>(w.values.data()) + ValByte<kV>(r * row_vals);
  const uint32_t* meta = w.meta.data_as<uint32_t>() + r * w.chunks * words;
  for (int64_t c = c0; c < c1; ++c) {
    const int64_t at = (c - c0) * R * kNmChunk;
    for (int q = 0; q < R; ++q) {
      hwy::Prefetch(vals + ValByte<kV>(q * row_vals + c * kNmChunk) + kPrefetchBytes);
      for (size_t p = 0; p < per_chunk; ++p) {
        const auto cols = NmColumns<kBits>(meta + (q * w.chunks + c) * words, tab, p,
                                           static_cast<int32_t>(c * chunk_cols));
        hn::Store(hn::Mul(cols, hn::Set(di, nt)), di, d.off + at + q * kNmChunk + p * L);
        hn::Store(NmValues<kV>(w, r + q, c * kNmChunk + static_cast<int64_t>(p * L)), df,
                  d.wv + at + q * kNmChunk + p * L);
      }
    }
  }
}

// R (1, 2 or 4) rows of N:M over `chunks` chunks; chunk(c) returns the decoded offsets and values
// of chunk c ([row][j], R * kNmChunk each, as NmDecoded). scr points at the first row's NT partial
// sums (the next rows' follow). R rows give R * NV independent FMA chains: two FMA ports with
// 4-cycle latency need 8 chains to stay busy.
template <int NV, int R, class ChunkFn>
HWY_INLINE void NmComputeRows(int64_t chunks, const ChunkFn& chunk, const float* xt, float* scr,
                              bool first) {
  const DF df;
  constexpr int G = R;
  const size_t L = hn::Lanes(df);
  const int NT = static_cast<int>(NV * L);
  SPARQ_ACC_ROW8(0);
  SPARQ_ACC_ROW8(1);
  SPARQ_ACC_ROW8(2);
  SPARQ_ACC_ROW8(3);
  SPARQ_FOR_QV8(SPARQ_ACC_LOAD);
  for (int64_t c = 0; c < chunks; ++c) {
    const auto [off, wv] = chunk(c);
    for (int j = 0; j < kNmChunk; ++j) {
#define SPARQ_NM_TILED_ROW(q)                                                  \
  if constexpr (R > q) {                                                       \
    const float* xp = xt + off[q * kNmChunk + j];                              \
    const auto wq = hn::Set(df, wv[q * kNmChunk + j]);                         \
    a##q##0 = hn::MulAdd(wq, hn::LoadU(df, xp), a##q##0);                      \
    if constexpr (NV > 1) a##q##1 = hn::MulAdd(wq, hn::LoadU(df, xp + L), a##q##1);     \
    if constexpr (NV > 2) a##q##2 = hn::MulAdd(wq, hn::LoadU(df, xp + 2 * L), a##q##2); \
    if constexpr (NV > 3) a##q##3 = hn::MulAdd(wq, hn::LoadU(df, xp + 3 * L), a##q##3); \
    if constexpr (NV > 4) a##q##4 = hn::MulAdd(wq, hn::LoadU(df, xp + 4 * L), a##q##4); \
    if constexpr (NV > 5) a##q##5 = hn::MulAdd(wq, hn::LoadU(df, xp + 5 * L), a##q##5); \
    if constexpr (NV > 6) a##q##6 = hn::MulAdd(wq, hn::LoadU(df, xp + 6 * L), a##q##6); \
    if constexpr (NV > 7) a##q##7 = hn::MulAdd(wq, hn::LoadU(df, xp + 7 * L), a##q##7); \
  }
      SPARQ_NM_TILED_ROW(0)
      SPARQ_NM_TILED_ROW(1)
      SPARQ_NM_TILED_ROW(2)
      SPARQ_NM_TILED_ROW(3)
#undef SPARQ_NM_TILED_ROW
    }
  }
  SPARQ_FOR_QV8(SPARQ_ACC_STORE);
}

// R rows over chunks [c0, c1), each chunk decoded just before its FMAs (any number of chunks: the
// one-tile whole-k runs).
template <int kBits, int kV, int NV, int R>
HWY_INLINE void NmTiledRows(const NmWeight& w, const NmLaneTables& tab, int64_t r, int64_t c0,
                            int64_t c1, const float* xt, float* scr, bool first) {
  const int32_t NT = static_cast<int32_t>(NV * hn::Lanes(DF()));
  NmDecoded<R, 1> d;
  NmComputeRows<NV, R>(
      c1 - c0,
      [&](int64_t c) {
        NmDecodeBlock<kBits, kV, R, 1>(w, tab, r, c0 + c, c0 + c + 1, NT, d);
        return std::pair<const int32_t*, const float*>(d.off, d.wv);
      },
      xt, scr, first);
}


template <int kBits, int kV, int NV>
HWY_NOINLINE void NmTiledImpl(const NmWeight& w, int64_t r0, int64_t r1, const float* xt,
                              int64_t c0, int64_t c1, float* scratch, const XtNext& next) {
  const int64_t NT = NV * static_cast<int64_t>(hn::Lanes(DF()));
  const NmLaneTables tab(w.n, w.m, w.bits);
  int64_t r = r0;
  // 8..16 chains: 4 or 2 rows; one row where NV vectors fill the accumulators (AVX2's 1x8 rows).
  constexpr int kRows = 4 * NV <= kMaxAcc ? 4 : 2 * NV <= kMaxAcc ? 2 : 1;
  XtSlicePrefetcher pf(next, (r1 - r0 + kRows - 1) / kRows);
  constexpr int kPipeChunks = 2;
  if constexpr (kRows * NV <= kMaxAcc) {
    if (c1 - c0 <= kPipeChunks) {
      // Software-pipelined: the next row block's chunks are decoded before this block's FMAs, so
      // that the decode's chain (index words -> offsets -> stores the FMA loop reloads) overlaps
      // them instead of stalling the start of every block.
      NmDecoded<kRows, kPipeChunks> buf[2];
      int cur = 0;
      const int32_t nt = static_cast<int32_t>(NT);
      // AVX2's one-row tiles: this k block's weights of the row kRowAhead rows on. Rows lie a
      // whole row of values apart (8 KiB at 4096 2:4 f32), so each step is in another 4 KiB page
      // and the hardware prefetchers, which stay within a page, fetch none of it; where a task's
      // weights do not stay in L2 (512 KiB on Zen 3) every row waited for its lines.
      constexpr int64_t kRowAhead = 4;
      const uint8_t* vbase = static_cast<const uint8_t*>(w.values.data());
      const uint8_t* mbase = static_cast<const uint8_t*>(w.meta.data());
      const int64_t wpc = w.words_per_chunk();
      const int64_t vrow = ValByte<kV>(w.chunks * kNmChunk), vlen = ValByte<kV>((c1 - c0) * kNmChunk);
      auto fetch_row = [&](int64_t rr) {
        if (kRows != 1 || rr >= r1) return;
        const uint8_t* v = vbase + rr * vrow + ValByte<kV>(c0 * kNmChunk);
        for (int64_t b = 0; b < vlen; b += 64) hwy::Prefetch(v + b);
        hwy::Prefetch(mbase + (rr * w.chunks + c0) * wpc * 4);
      };
      if (r + kRows <= r1) {
        NmDecodeBlock<kBits, kV, kRows, kPipeChunks>(w, tab, r, c0, c1, nt, buf[0]);
      }
      for (; r + kRows <= r1; r += kRows) {
        pf.Step();
        fetch_row(r + kRowAhead);
        if (r + 2 * kRows <= r1) {
          NmDecodeBlock<kBits, kV, kRows, kPipeChunks>(w, tab, r + kRows, c0, c1, nt,
                                                         buf[cur ^ 1]);
        }
        const NmDecoded<kRows, kPipeChunks>& d = buf[cur];
        NmComputeRows<NV, kRows>(
            c1 - c0,
            [&d](int64_t c) {
              return std::pair<const int32_t*, const float*>(d.off + c * kRows * kNmChunk,
                                                             d.wv + c * kRows * kNmChunk);
            },
            xt, scratch + (r - r0) * NT, c0 == 0);
        cur ^= 1;
      }
    }
    for (; r + kRows <= r1; r += kRows) {
      pf.Step();
      NmTiledRows<kBits, kV, NV, kRows>(w, tab, r, c0, c1, xt, scratch + (r - r0) * NT, c0 == 0);
    }
  }
  for (; r < r1; ++r) {
    pf.Step();
    NmTiledRows<kBits, kV, NV, 1>(w, tab, r, c0, c1, xt, scratch + (r - r0) * NT, c0 == 0);
  }
}

}  // namespace sparq::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // SPARQ_CPU_NM_INL_H_
