// SIMD bodies of the sparse x dense kernels (see spmm.h for the operation and spmm_packed.h for
// the layouts). Included once per Highway target by spmm.cc; everything here is inlined into the
// per-target task functions at the bottom.
//
// Two regimes:
//  - decode (few tokens): memory bound, so the compressed weights are streamed exactly once and
//    expanded in registers: N:M indices are decoded with a per-lane variable shift of one u32 and
//    X is gathered by them ("load as sparse, compute as dense"); CSR gathers X by its u16/u32
//    indices; bf16 values are widened by a 16-bit shift.
//  - tiled (many tokens): compute bound. X is transposed once per call into tiles xt[c][NT] of NT
//    tokens (NT = NV vectors), and each kept weight w at (r, c) does y[r, tile] += w * xt[c, :]:
//    one broadcast, NV loads and NV FMAs, i.e. exactly the FMAs of the kept weights at full vector
//    width. Rows that share columns (BSR block rows, V:N:M slabs, dense bf16) share the xt loads
//    across G rows (G * NV accumulators). Loops: task rows (weights stay in L2 across token
//    tiles) > token tile > k block (the xt slice of one k block fits L1) > rows.
#if defined(SPARQ_CPU_SPMM_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SPARQ_CPU_SPMM_INL_H_
#undef SPARQ_CPU_SPMM_INL_H_
#else
#define SPARQ_CPU_SPMM_INL_H_
#endif

#include <hwy/cache_control.h>
#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "src/cpu/spmm.h"
#include "src/cpu/spmm_packed.h"

HWY_BEFORE_NAMESPACE();
namespace sparq::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using DI = hn::RebindToSigned<DF>;
using DU = hn::RebindToUnsigned<DF>;

// Accumulators per tile row: AVX-512 has 32 registers, the others 16 (or emulated).
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
inline constexpr int kMaxAcc = 16;
#else
inline constexpr int kMaxAcc = 8;
#endif

// Loads L values (f32, or bf16 widened by a 16-bit shift) as f32.
template <bool kBf16, class D>
HWY_INLINE hn::Vec<D> LoadValues(D df, const void* p) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if constexpr (kBf16 && hn::MaxLanes(D()) == 16) {
    // One word permute (port 5) puts bf16 j into the upper half of lane j and zeroes the lower
    // half, where PromoteTo + ShiftLeft took two vector ops (ports 5 and 0): the 2:4 bf16 decode
    // loop spends 5 instead of 6 vector ops per row and 16 weights (docs/kernels.md).
    (void)df;
    const __m512i idx = _mm512_set_epi16(15, 0, 14, 0, 13, 0, 12, 0, 11, 0, 10, 0, 9, 0, 8, 0, 7, 0,
                                         6, 0, 5, 0, 4, 0, 3, 0, 2, 0, 1, 0, 0, 0);
    const __m512i raw = _mm512_castsi256_si512(
        _mm256_loadu_si256(static_cast<const __m256i*>(p)));
    return hn::Vec<D>{_mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(0xAAAAAAAAu, idx, raw))};
  }
#endif
  if constexpr (kBf16) {
    const hn::Rebind<uint16_t, D> d16;
    const hn::RebindToUnsigned<D> du;
    const auto u = hn::PromoteTo(du, hn::LoadU(d16, static_cast<const uint16_t*>(p)));
    return hn::BitCast(df, hn::ShiftLeft<16>(u));
  } else {
    return hn::LoadU(df, static_cast<const float*>(p));
  }
}

template <bool kBf16>
HWY_INLINE float ScalarValue(const void* p, int64_t i) {
  if constexpr (kBf16) {
    return BF16ToF32(static_cast<const uint16_t*>(p)[i]);
  } else {
    return static_cast<const float*>(p)[i];
  }
}

// Per-lane constants of an N:M chunk: lane j of the chunk sits in group j / n (column base
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

// ---------------------------------------------------------------------------------------------
// Two-table permutation: lane j gets (idx[j] < L ? lo : hi)[idx[j] % L], idx in [0, 2L).
HWY_INLINE hn::Vec<DF> Permute2(DF d, hn::Vec<DF> lo, hn::Vec<DF> hi, hn::Vec<DI> idx) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  (void)d;
  return hn::Vec<DF>{_mm512_permutex2var_ps(lo.raw, idx.raw, hi.raw)};
#else
  const DI di;
  const int32_t L = static_cast<int32_t>(hn::Lanes(d));
  const auto lane = hn::IndicesFromVec(d, hn::And(idx, hn::Set(di, L - 1)));
  const auto use_hi = hn::RebindMask(d, hn::Ne(hn::And(idx, hn::Set(di, L)), hn::Zero(di)));
  return hn::IfThenElse(use_hi, hn::TableLookupLanes(hi, lane), hn::TableLookupLanes(lo, lane));
#endif
}

// Bytes ahead of the current position that the kernels prefetch in each weight stream (several
// streams in flight hide this VM's memory latency better than the hardware prefetcher).
inline constexpr int kPrefetchBytes = 1024;

// The far weight-stream prefetch of the decode kernels (N:M, bit mask, dense bf16, f32 V:N:M /
// BSR): into L2 (prefetcht1; hwy::Prefetch is prefetcht0, into L1). Those lines are not read for
// hundreds of cycles, and on AMD Zen 4 (32 KiB L1) the L1 prefetches presumably held the fill
// buffers that the demand loads wait for (no hardware counters on that VM). Measured there (n = 1, interleaved rounds, ms, L1 -> L2): 2:4 f32
// 4096x4096 one thread 1.86-1.98 -> 1.46-1.60, two 0.85-0.92 -> 0.69-0.76; 11008x4096 2:4 f32
// 6.5-6.7 -> 4.6-5.0, bf16 2.9-3.4 -> 2.5-2.6; dense bf16 7.0-7.1 -> 6.2-6.3; SmolLM2 (bench
// model, two threads) 2:4 bf16 decode 78-84 -> 119-121 tok/s, 50% bf16 (bit mask, one thread)
// 64-65 -> 70-71. CSR rows (gathers) and bf16 V:N:M / BSR stay on prefetcht0 (within noise /
// slower with this).
HWY_INLINE void PrefetchFar(const void* p) { __builtin_prefetch(p, 0, 2); }
// The decode kernels of N:M and bit-mask rows run R = 4 rows in lockstep, and the rows' values are
// contiguous, so 1 KiB ahead of each row's stream stayed inside the 4 rows being read (a 576-column
// bf16 row at 50% is 576 bytes): nothing of the next rows was requested before the kernel reached
// them. 6 KiB reaches the next block of rows. Measured on SmolLM2's 210 linears at 50% bf16 (bit
// mask) and 2:4 bf16, weights cold in DRAM, interleaved A/B: 1 thread 15.4 -> 10.8 ms (mask) and
// 15.5 -> 11.3 ms (2:4); 2 threads 10.2 -> 8.4 and 9.3 -> 7.8 ms. 12 KiB was no better, and worse
// with 2 threads. Dense bf16 rows (one stream, the output head) gain less and peak at 3 KiB:
// 23.7 -> 19.7 ms (1 thread), 15.2 -> 13.9 ms (2 threads).
inline constexpr int kDecodePrefetchBytes = 6144;
inline constexpr int kDensePrefetchBytes = 3072;
// The N:M decode's prefetch runs kDecodePrefetchBytes / 4 ahead in each of its 4 streams, a
// stream being one slot of the 4-row blocks (rows q, q + 4, q + 8, ... back to back). For
// SmolLM2's short rows that is about the 6 KiB ahead above (the next block of rows); in a long
// row 6 KiB ahead of row q was row q + 1, which the kernel was already reading (a 4096-column 2:4
// bf16 row is 4 KiB), so only one row in four had anything fetched ahead. Measured (one call at
// n = 1, weights flushed from the caches before each of 41 calls, medians of two rounds, ms, old
// -> new): 11008x4096 2:4 bf16 5.2 -> 4.4 (1 thread), 2.9 -> 2.3 (2 threads); f32 9.2 -> 8.2,
// 4.7 -> 4.2; 4096x4096 bf16 2.8 -> 1.9, 1.3 -> 1.1; f32 2 threads 2.5 -> 1.9; weights in L3
// (no flush), 11008x4096 f32 1 thread 4.6 -> 4.1. 3 KiB per stream was no better, 6 KiB worse.
inline constexpr int64_t kNmStreamPrefetchBytes = kDecodePrefetchBytes / 4;

// Decode, N:M: raw[t][r - r0] = sum over kept weights of row r times xpad[t] (k_pad floats, zero
// beyond cols). R rows run in lockstep (R weight streams, and one X window serves all R rows), over
// T tokens [t0, t0 + T) at once (each row's decoded positions and values serve all T tokens).
// kPerm (m == 2n, L % n == 0): the L kept values of a vector come from a window of 2L columns,
// so X is loaded as two vectors and permuted by the decoded positions (one vpermt2ps on AVX-512)
// instead of gathered; otherwise X is gathered. Each (row, token) sum runs in the same order
// whatever T is, so the token blocking changes no bits.
template <int kBits, bool kBf16, bool kPerm, int R, int T>
HWY_INLINE void NmDecodeRows(const NmWeight& w, const NmLaneTables& tab, const float* xpad,
                             int64_t t0, int64_t r, int64_t r0, int64_t r1, float* raw) {
  static_assert(R >= 1 && R <= 4 && T >= 1 && T <= 4);
  const DF df;
  const size_t L = hn::Lanes(df);
  const size_t per_chunk = kNmChunk / L;
  const int32_t chunk_cols = (kNmChunk / w.n) * w.m;
  const int words = w.words_per_chunk();
  const size_t vb = kBf16 ? 2 : 4;
  const int64_t row_vals = w.chunks * kNmChunk;
  const uint8_t* vals = static_cast<const uint8_t*>(w.values.data()) + r * row_vals * vb;
  const uint32_t* meta = w.meta.data_as<uint32_t>() + r * w.chunks * words;
  const int64_t row_bytes = row_vals * static_cast<int64_t>(vb);
  const int64_t chunk_bytes = kNmChunk * static_cast<int64_t>(vb);
  const float* x0 = xpad + t0 * w.k_pad;
  const float* x1 = x0 + (T > 1 ? w.k_pad : 0);
  const float* x2 = x0 + (T > 2 ? 2 * w.k_pad : 0);
  const float* x3 = x0 + (T > 3 ? 3 * w.k_pad : 0);
  // a<q><t>: row q, token t.
  auto a00 = hn::Zero(df), a01 = hn::Zero(df), a02 = hn::Zero(df), a03 = hn::Zero(df);
  auto a10 = hn::Zero(df), a11 = hn::Zero(df), a12 = hn::Zero(df), a13 = hn::Zero(df);
  auto a20 = hn::Zero(df), a21 = hn::Zero(df), a22 = hn::Zero(df), a23 = hn::Zero(df);
  auto a30 = hn::Zero(df), a31 = hn::Zero(df), a32 = hn::Zero(df), a33 = hn::Zero(df);
  // The prefetch position in each stream (kNmStreamPrefetchBytes): pf_rows blocks of R rows
  // ahead, pf_off bytes into the row.
  int64_t pf_rows = kNmStreamPrefetchBytes / row_bytes, pf_off = kNmStreamPrefetchBytes % row_bytes;
  for (int64_t c = 0; c < w.chunks; ++c) {
    const int32_t col0 = static_cast<int32_t>(c * chunk_cols);
    for (int q = 0; q < R; ++q) PrefetchFar(vals + (q + R * pf_rows) * row_bytes + pf_off);
    pf_off += chunk_bytes;
    if (pf_off >= row_bytes) {
      pf_off -= row_bytes;
      ++pf_rows;
    }
    for (size_t p = 0; p < per_chunk; ++p) {
      hn::Vec<DF> xlo0, xhi0, xlo1, xhi1, xlo2, xhi2, xlo3, xhi3;
      if constexpr (kPerm) {
        const int32_t wcol = col0 + static_cast<int32_t>(2 * p * L);
#define SPARQ_NM_WINDOW(t)                   \
  if constexpr (T > t) {                     \
    xlo##t = hn::LoadU(df, x##t + wcol);     \
    xhi##t = hn::LoadU(df, x##t + wcol + L); \
  }
        SPARQ_NM_WINDOW(0)
        SPARQ_NM_WINDOW(1)
        SPARQ_NM_WINDOW(2)
        SPARQ_NM_WINDOW(3)
#undef SPARQ_NM_WINDOW
      }
#define SPARQ_NM_TOKEN(q, t)                                                                      \
  if constexpr (T > t) {                                                                          \
    const auto xv = kPerm ? Permute2(df, xlo##t, xhi##t, cols) : hn::GatherIndex(df, x##t, cols); \
    a##q##t = hn::MulAdd(v, xv, a##q##t);                                                         \
  }
#define SPARQ_NM_ROW(q)                                                                          \
  if constexpr (R > q) {                                                                         \
    const auto cols = kPerm ? NmPermIndices<kBits>(meta + (q * w.chunks + c) * words, tab, p)    \
                            : NmColumns<kBits>(meta + (q * w.chunks + c) * words, tab, p, col0); \
    const auto v = LoadValues<kBf16>(df, vals + (q * row_vals + c * kNmChunk + p * L) * vb);     \
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

template <int kBits, bool kBf16, bool kPerm, int R>
HWY_INLINE void NmDecodeRowTokens(const NmWeight& w, const NmLaneTables& tab, const float* xpad,
                                  int64_t n, int64_t r, int64_t r0, int64_t r1, float* raw) {
  constexpr int T = kNmDecodeTokens;
  int64_t t = 0;
  for (; t + T <= n; t += T)
    NmDecodeRows<kBits, kBf16, kPerm, R, T>(w, tab, xpad, t, r, r0, r1, raw);
  if constexpr (T > 2) {
    for (; t + 2 <= n; t += 2)
      NmDecodeRows<kBits, kBf16, kPerm, R, 2>(w, tab, xpad, t, r, r0, r1, raw);
  }
  for (; t < n; ++t) NmDecodeRows<kBits, kBf16, kPerm, R, 1>(w, tab, xpad, t, r, r0, r1, raw);
}

template <int kBits, bool kBf16, bool kPerm>
HWY_NOINLINE void NmDecodeImpl(const NmWeight& w, const float* xpad, int64_t n, int64_t r0,
                               int64_t r1, float* raw) {
  const NmLaneTables tab(w.n, w.m, w.bits);
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4)
    NmDecodeRowTokens<kBits, kBf16, kPerm, 4>(w, tab, xpad, n, r, r0, r1, raw);
  for (; r < r1; ++r) NmDecodeRowTokens<kBits, kBf16, kPerm, 1>(w, tab, xpad, n, r, r0, r1, raw);
}

// Column indices col_idx[p, p + L) as i32 lanes.
template <bool kIdx16>
HWY_INLINE hn::Vec<DI> ColumnVector(const ScgWeight& w, int64_t p) {
  if constexpr (kIdx16) {
    const hn::Rebind<uint16_t, DF> d16;
    return hn::BitCast(DI(), hn::PromoteTo(DU(), hn::LoadU(d16, w.col_idx.data_as<uint16_t>() + p)));
  } else {
    return hn::BitCast(DI(), hn::LoadU(DU(), w.col_idx.data_as<uint32_t>() + p));
  }
}

// Decode, shared-column groups. g = 1 with explicit columns: gather X by the column indices.
template <bool kIdx16, bool kBf16>
HWY_NOINLINE void ScgDecodeG1Impl(const ScgWeight& w, const float* x, int64_t ldx, int64_t n,
                                  int64_t g0, int64_t g1, float* raw) {
  const DF df;
  const size_t L = hn::Lanes(df);
  const int64_t rows = w.group_row[g1] - w.group_row[g0];
  const void* values = w.values.data();
  for (int64_t gi = g0; gi < g1; ++gi) {
    const int64_t p0 = w.group_ptr[gi], p1 = w.group_ptr[gi + 1];
    const int64_t r = w.group_row[gi] - w.group_row[g0];
    for (int64_t t = 0; t < n; ++t) {
      const float* xt = x + t * ldx;
      auto acc0 = hn::Zero(df);
      auto acc1 = hn::Zero(df);
      int64_t p = p0;
      for (; p + static_cast<int64_t>(2 * L) <= p1; p += 2 * L) {
        hwy::Prefetch(static_cast<const uint8_t*>(values) + p * (kBf16 ? 2 : 4) + kPrefetchBytes);
        hwy::Prefetch(static_cast<const uint8_t*>(w.col_idx.data()) + p * (kIdx16 ? 2 : 4) +
                      kPrefetchBytes);
        const auto c0 = ColumnVector<kIdx16>(w, p);
        const auto c1 = ColumnVector<kIdx16>(w, p + static_cast<int64_t>(L));
        const size_t vb = kBf16 ? 2 : 4;
        const uint8_t* vp = static_cast<const uint8_t*>(values) + p * vb;
        acc0 = hn::MulAdd(LoadValues<kBf16>(df, vp), hn::GatherIndex(df, xt, c0), acc0);
        acc1 = hn::MulAdd(LoadValues<kBf16>(df, vp + L * vb), hn::GatherIndex(df, xt, c1), acc1);
      }
      // Tail (fewer than 2L kept weights left): one more whole vector if L are left, then the
      // last L weights of the row as one vector whose lanes already summed are zeroed on the X
      // side (0 * x could be NaN for an infinite x; x zeroed cannot). The row's own entries only,
      // so nothing is read past the arrays. A scalar tail here was a serial chain of up to 2L - 1
      // FMAs per row (~410 kept per 4096-column row at 90%); the vector tail measured 0-15% faster
      // on those rows (docs/kernels.md).
      if (p + static_cast<int64_t>(L) <= p1) {
        const uint8_t* vp = static_cast<const uint8_t*>(values) + p * (kBf16 ? 2 : 4);
        acc0 = hn::MulAdd(LoadValues<kBf16>(df, vp), hn::GatherIndex(df, xt, ColumnVector<kIdx16>(w, p)),
                          acc0);
        p += static_cast<int64_t>(L);
      }
      if (p < p1 && p1 - p0 >= static_cast<int64_t>(L)) {
        const int64_t q = p1 - static_cast<int64_t>(L);
        const auto fresh = hn::Not(hn::FirstN(df, static_cast<size_t>(p - q)));
        const uint8_t* vp = static_cast<const uint8_t*>(values) + q * (kBf16 ? 2 : 4);
        const auto xg = hn::IfThenElseZero(fresh, hn::GatherIndex(df, xt, ColumnVector<kIdx16>(w, q)));
        acc1 = hn::MulAdd(LoadValues<kBf16>(df, vp), xg, acc1);
        p = p1;
      }
      float s = hn::GetLane(hn::SumOfLanes(df, hn::Add(acc0, acc1)));
      for (; p < p1; ++p) s += ScalarValue<kBf16>(values, p) * xt[w.Col(p)];
      raw[t * rows + r] = s;
    }
  }
}

// Decode, dense bf16 (g = 4, implicit columns): values [c][4 rows] against xrep[t][c*4 + q] =
// x[t][c]: contiguous loads on both sides; lane i of the accumulator belongs to row i % 4.
template <bool kBf16>
HWY_NOINLINE void ScgDecodeDenseImpl(const ScgWeight& w, const float* xrep, int64_t n,
                                     int64_t g0, int64_t g1, float* raw) {
  const DF df;
  const size_t L = hn::Lanes(df);
  const int64_t len = w.cols * 4;
  const int64_t rows = w.group_row[g1] - w.group_row[g0];
  const size_t vb = kBf16 ? 2 : 4;
  alignas(64) float lanes[64];
  for (int64_t gi = g0; gi < g1; ++gi) {
    const uint8_t* vals = static_cast<const uint8_t*>(w.values.data()) + w.group_ptr[gi] * 4 * vb;
    const int64_t nrows = w.group_row[gi + 1] - w.group_row[gi];
    const int64_t r = w.group_row[gi] - w.group_row[g0];
    for (int64_t t = 0; t < n; ++t) {
      const float* xr = xrep + t * len;
      auto acc0 = hn::Zero(df);
      auto acc1 = hn::Zero(df);
      int64_t p = 0;
      float s[4] = {0, 0, 0, 0};
      if (L % 4 == 0) {  // lane i of a vector starting at p (a multiple of 4) is row i % 4
        for (; p + static_cast<int64_t>(2 * L) <= len; p += 2 * L) {
          PrefetchFar(vals + p * vb + kDensePrefetchBytes);
          acc0 = hn::MulAdd(LoadValues<kBf16>(df, vals + p * vb), hn::LoadU(df, xr + p), acc0);
          acc1 = hn::MulAdd(LoadValues<kBf16>(df, vals + (p + L) * vb), hn::LoadU(df, xr + p + L),
                            acc1);
        }
        hn::Store(hn::Add(acc0, acc1), df, lanes);
        for (size_t i = 0; i < L; ++i) s[i % 4] += lanes[i];
      }
      for (; p < len; ++p) s[p % 4] += ScalarValue<kBf16>(vals, p) * xr[p];
      for (int q = 0; q < nrows; ++q) raw[t * rows + r + q] = s[q];
    }
  }
}

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
// Columns [p0, p) of a group of G rows (2 or 4) for one token, 16 / G columns per vector: the
// values of those columns are 16 contiguous floats ([col][row]), and X comes from one gather of
// the 16 / G columns spread to G lanes each by a permute. s[q] += row q's sum; returns p (the
// columns after it are left to the G-lane loop). Per 16 products: one value load, one index load,
// a 4- or 8-lane gather, one permute and one FMA, where the G-lane loop spends 16 / G column
// loads, broadcasts and FMAs (V:16:2:4 4096x4096 n = 1: docs/kernels.md).
template <int G, bool kBf16, bool kIdx16>
HWY_INLINE int64_t GroupDecodeWide(const ScgWeight& w, int64_t p0, int64_t p1, const float* xt,
                                   float* s) {
  static_assert(G == 2 || G == 4);
  constexpr int64_t C = 16 / G;
  const DF df;
  const uint8_t* vals = static_cast<const uint8_t*>(w.values.data());
  const size_t vb = kBf16 ? 2 : 4;
  const uint16_t* c16 = kIdx16 ? w.col_idx.data_as<uint16_t>() : nullptr;
  const uint32_t* c32 = kIdx16 ? nullptr : w.col_idx.data_as<uint32_t>();
  const __m512i rep = G == 4 ? _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0)
                             : _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
  auto xvec = [&](int64_t q) -> __m512 {
    if constexpr (G == 4) {
      const __m128i idx =
          kIdx16 ? _mm_cvtepu16_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(c16 + q)))
                 : _mm_loadu_si128(reinterpret_cast<const __m128i*>(c32 + q));
      return _mm512_permutexvar_ps(rep, _mm512_castps128_ps512(_mm_i32gather_ps(xt, idx, 4)));
    } else {
      const __m256i idx =
          kIdx16 ? _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c16 + q)))
                 : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c32 + q));
      return _mm512_permutexvar_ps(rep, _mm512_castps256_ps512(_mm256_i32gather_ps(xt, idx, 4)));
    }
  };
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int64_t p = p0;
  for (; p + 2 * C <= p1; p += 2 * C) {
    // bf16: into L1 (PrefetchFar measured slower here: 4096x4096 V:16:2:4 one thread 1.74-1.76
    // -> 2.09-2.10 ms; f32 2.96-3.82 -> 2.28-2.54).
    if constexpr (kBf16) {
      hwy::Prefetch(vals + p * G * vb + kPrefetchBytes);
    } else {
      PrefetchFar(vals + p * G * vb + kPrefetchBytes);
    }
    acc0 = _mm512_fmadd_ps(LoadValues<kBf16>(df, vals + p * G * vb).raw, xvec(p), acc0);
    acc1 = _mm512_fmadd_ps(LoadValues<kBf16>(df, vals + (p + C) * G * vb).raw, xvec(p + C), acc1);
  }
  for (; p + C <= p1; p += C) {
    acc0 = _mm512_fmadd_ps(LoadValues<kBf16>(df, vals + p * G * vb).raw, xvec(p), acc0);
  }
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, _mm512_add_ps(acc0, acc1));
  for (int i = 0; i < 16; ++i) s[i % G] += lanes[i];
  return p;
}
#endif

// Decode, g = 2 or 4 rows sharing explicit columns (BSR, V:N:M): per column, a g-lane vector of
// values times a broadcast of x[col] (on AVX-512, 16 / g columns per vector first:
// GroupDecodeWide).
template <int G, bool kBf16>
HWY_NOINLINE void ScgDecodeGroupImpl(const ScgWeight& w, const float* x, int64_t ldx, int64_t n,
                                     int64_t g0, int64_t g1, float* raw) {
  const hn::CappedTag<float, G> dg;
  const int64_t rows = w.group_row[g1] - w.group_row[g0];
  const size_t vb = kBf16 ? 2 : 4;
  float s[G];
  for (int64_t gi = g0; gi < g1; ++gi) {
    const int64_t p0 = w.group_ptr[gi], p1 = w.group_ptr[gi + 1];
    const int64_t nrows = w.group_row[gi + 1] - w.group_row[gi];
    const int64_t r = w.group_row[gi] - w.group_row[g0];
    const uint8_t* vals = static_cast<const uint8_t*>(w.values.data());
    for (int64_t t = 0; t < n; ++t) {
      const float* xt = x + t * ldx;
      if (hn::Lanes(dg) == G) {
        float wide[G] = {};
        int64_t p = p0;
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
        p = w.idx16 ? GroupDecodeWide<G, kBf16, true>(w, p0, p1, xt, wide)
                    : GroupDecodeWide<G, kBf16, false>(w, p0, p1, xt, wide);
#endif
        auto acc0 = hn::Zero(dg);
        auto acc1 = hn::Zero(dg);
        for (; p + 1 < p1; p += 2) {
          acc0 = hn::MulAdd(LoadValues<kBf16>(dg, vals + p * G * vb), hn::Set(dg, xt[w.Col(p)]), acc0);
          acc1 = hn::MulAdd(LoadValues<kBf16>(dg, vals + (p + 1) * G * vb),
                            hn::Set(dg, xt[w.Col(p + 1)]), acc1);
        }
        if (p < p1) {
          acc0 = hn::MulAdd(LoadValues<kBf16>(dg, vals + p * G * vb), hn::Set(dg, xt[w.Col(p)]), acc0);
        }
        hn::StoreU(hn::Add(acc0, acc1), dg, s);
        for (int q = 0; q < G; ++q) s[q] += wide[q];
      } else {
        for (int q = 0; q < G; ++q) s[q] = 0;
        for (int64_t p = p0; p < p1; ++p) {
          for (int q = 0; q < G; ++q) s[q] += ScalarValue<kBf16>(vals, p * G + q) * xt[w.Col(p)];
        }
      }
      for (int q = 0; q < nrows; ++q) raw[t * rows + r + q] = s[q];
    }
  }
}

// Decode, bit mask. Expands the first popcount(bits) values at vp (f32 or bf16) to the lanes whose
// bit is set (lane j <- bit j of `bits`, which holds one bit per lane); the other lanes are zero.
// AVX-512 has an expand instruction; AVX2 permutes by a 256-entry table (ExpandTable8) and clears
// the lanes of clear bits by the table's sign bits; other targets go lane by lane.
template <bool kBf16>
HWY_INLINE hn::Vec<DF> ExpandValues(const uint8_t* vp, uint32_t bits, const int32_t* lut) {
  const DF df;
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  (void)lut;
  return hn::Vec<DF>{_mm512_maskz_expand_ps(static_cast<__mmask16>(bits), LoadValues<kBf16>(df, vp).raw)};
#elif HWY_TARGET == HWY_AVX2
  const __m256i idx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lut + bits * 8));
  const __m256 v = _mm256_permutevar8x32_ps(LoadValues<kBf16>(df, vp).raw, idx);
  return hn::Vec<DF>{_mm256_blendv_ps(v, _mm256_setzero_ps(), _mm256_castsi256_ps(idx))};
#else
  (void)lut;
  alignas(64) float lanes[64];
  size_t i = 0;
  for (size_t j = 0; j < hn::Lanes(df); ++j) {
    lanes[j] = (bits >> j) & 1 ? ScalarValue<kBf16>(vp, static_cast<int64_t>(i++)) : 0.0f;
  }
  return hn::Load(df, lanes);
#endif
}

// Prefetch positions of the bit-mask decode. Rows of up to 2 KiB (SmolLM2's: 576-1536 columns)
// keep the linear kDecodePrefetchBytes ahead of each row, which reaches the next block of rows.
// In longer rows that lands in the rows being read (as in the N:M decode), so there each of the
// R streams (rows q, q + R, q + 2R, ...) is prefetched kNmStreamPrefetchBytes ahead; rows differ
// in length, so the position in a row is the chunk's share of an average row (exact row starts,
// approximate offsets). Measured (n = 1, 50%, caches flushed before each of 31 calls, two rounds,
// ms, linear -> per stream, this code): 4096x4096 bf16 2.0-2.2 -> 1.7 (1 thread), 1.2 -> 1.0 (2
// threads), f32 3.0-3.3 -> 2.8-2.9, 1.7 -> 1.6; 11008x4096 bf16 5.3-5.5 -> 4.6, 2.9-3.0 ->
// 2.5-2.7, f32 8.0-8.4 -> 8.3-8.4 (1 thread), 4.3-4.7 -> 4.0-4.2. On SmolLM2's short rows the
// per-stream form cost 12% of the 50% bf16 decode (2 threads, 97-102 -> 85-89 tok/s: a row_ptr
// load and address arithmetic per chunk and row), hence the threshold, decided once per call
// (kPerStream), so that short rows run the linear prefetch's code as before (`sparq bench model`,
// 2 threads, three rounds: 95.8 / 94.2 / 95.8 -> 97.8 / 99.2 / 91.9 tok/s).
template <bool kPerStream>
class MaskStreamPrefetch {
 public:
  MaskStreamPrefetch(const MaskWeight& w, int64_t r, int R, size_t vb, int64_t chunks_per_step)
      : w_(w),
        base_(static_cast<const uint8_t*>(w.values.data())),
        r_(r),
        R_(R),
        vb_(static_cast<int64_t>(vb)),
        step_(chunks_per_step) {
    if constexpr (kPerStream) {
      const int64_t chunks = std::max<int64_t>(1, w.chunks);
      const int64_t avg_row = w.row_ptr.back() * vb_ / std::max<int64_t>(1, w.rows);
      chunk_bytes_ = std::max<int64_t>(1, avg_row / chunks);
      const int64_t ahead = std::max<int64_t>(1, kNmStreamPrefetchBytes / chunk_bytes_);
      pf_rows_ = ahead / chunks;
      pf_chunk_ = ahead % chunks;
    }
  }
  HWY_INLINE void Fetch(int q, const uint8_t* vp) const {
    if constexpr (kPerStream) {
      const int64_t row = std::min(w_.rows - 1, r_ + q + R_ * pf_rows_);
      PrefetchFar(base_ + w_.row_ptr[row] * vb_ + pf_chunk_ * chunk_bytes_);
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
  int64_t r_, R_, vb_, step_;
  int64_t chunk_bytes_ = 1, pf_rows_ = 0, pf_chunk_ = 0;
};
// Whether a weight's rows are long enough for the per-stream prefetch (average row over 2 KiB).
inline bool MaskPerStreamPrefetch(const MaskWeight& w, int64_t vb) {
  return w.row_ptr.back() * vb > w.rows * (kDecodePrefetchBytes / 3);
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
  MaskStreamPrefetch<kStream> pf(w, r, R, vb, 1);
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
// bf16 values; a shift and an and make f32 of the even and the odd columns in place (no
// cross-lane widening, which shares port 5 with the expand); X is split into even and odd
// columns by two permutes that serve all R rows. Measured on the plain AVX-512 path: port 5
// (kmov, vpmovzxwd, vexpandps per 16 columns) bounds it at ~3 columns per cycle.
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
  MaskStreamPrefetch<kStream> pf(w, r, R, 2, 2);
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
  if (MaskPerStreamPrefetch(w, kBf16 ? 2 : 4)) {
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

// ---------------------------------------------------------------------------------------------
// Tiled kernels. xt: [k_rows][NT] for one tile of NT tokens; scratch: [task rows][NT] partial
// sums (first k block starts from zero).

// Accumulators a<q><v> for G rows x NV vectors, spelled out (no vectors in arrays).
#define SPARQ_ACC_ROW(q) \
  auto a##q##0 = hn::Zero(df), a##q##1 = hn::Zero(df), a##q##2 = hn::Zero(df), a##q##3 = hn::Zero(df)
#define SPARQ_ACC_LOAD(q, v)                                            \
  if constexpr (G > q && NV > v) {                                      \
    if (!first) a##q##v = hn::LoadU(df, scr + (q) * NT + (v) * L);       \
  }
#define SPARQ_ACC_STORE(q, v) \
  if constexpr (G > q && NV > v) hn::StoreU(a##q##v, df, scr + (q) * NT + (v) * L)
#define SPARQ_ACC_FMA(q, v) \
  if constexpr (G > q && NV > v) a##q##v = hn::MulAdd(w##q, x##v, a##q##v)
#define SPARQ_FOR_V(M, q) M(q, 0); M(q, 1); M(q, 2); M(q, 3)
#define SPARQ_FOR_QV(M) SPARQ_FOR_V(M, 0); SPARQ_FOR_V(M, 1); SPARQ_FOR_V(M, 2); SPARQ_FOR_V(M, 3)
// Up to 8 vectors per row (the N:M tiled rows on AVX-512, 2 rows x 8 vectors).
#define SPARQ_ACC_ROW8(q)                                                                        \
  SPARQ_ACC_ROW(q);                                                                              \
  auto a##q##4 = hn::Zero(df), a##q##5 = hn::Zero(df), a##q##6 = hn::Zero(df), a##q##7 = hn::Zero(df)
#define SPARQ_FOR_V8(M, q) SPARQ_FOR_V(M, q); M(q, 4); M(q, 5); M(q, 6); M(q, 7)
#define SPARQ_FOR_QV8(M) SPARQ_FOR_V8(M, 0); SPARQ_FOR_V8(M, 1); SPARQ_FOR_V8(M, 2); SPARQ_FOR_V8(M, 3)

// Decoded chunks of R rows: for chunk c - c0, row q, kept weight j, the X^T offset (column * NT)
// and the value (f32), [chunk][row][j].
template <int R, int kChunks>
struct NmDecoded {
  alignas(64) int32_t off[kChunks * R * kNmChunk];
  alignas(64) float wv[kChunks * R * kNmChunk];
};

// Decodes chunks [c0, c1) (at most kChunks) of rows r..r+R-1 into d.
template <int kBits, bool kBf16, int R, int kChunks>
HWY_INLINE void NmDecodeRows(const NmWeight& w, const NmLaneTables& tab, int64_t r, int64_t c0,
                             int64_t c1, int32_t nt, NmDecoded<R, kChunks>& d) {
  const DF df;
  const DI di;
  const size_t L = hn::Lanes(df);
  const size_t per_chunk = kNmChunk / L;
  const int32_t chunk_cols = (kNmChunk / w.n) * w.m;
  const int words = w.words_per_chunk();
  const size_t vb = kBf16 ? 2 : 4;
  const int64_t row_vals = w.chunks * kNmChunk;
  const uint8_t* vals = static_cast<const uint8_t*>(w.values.data()) + r * row_vals * vb;
  const uint32_t* meta = w.meta.data_as<uint32_t>() + r * w.chunks * words;
  for (int64_t c = c0; c < c1; ++c) {
    const int64_t at = (c - c0) * R * kNmChunk;
    for (int q = 0; q < R; ++q) {
      hwy::Prefetch(vals + (q * row_vals + c * kNmChunk) * vb + kPrefetchBytes);
      for (size_t p = 0; p < per_chunk; ++p) {
        const auto cols = NmColumns<kBits>(meta + (q * w.chunks + c) * words, tab, p,
                                           static_cast<int32_t>(c * chunk_cols));
        hn::Store(hn::Mul(cols, hn::Set(di, nt)), di, d.off + at + q * kNmChunk + p * L);
        hn::Store(LoadValues<kBf16>(df, vals + (q * row_vals + c * kNmChunk + p * L) * vb), df,
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
template <int kBits, bool kBf16, int NV, int R>
HWY_INLINE void NmTiledRows(const NmWeight& w, const NmLaneTables& tab, int64_t r, int64_t c0,
                            int64_t c1, const float* xt, float* scr, bool first) {
  const int32_t NT = static_cast<int32_t>(NV * hn::Lanes(DF()));
  NmDecoded<R, 1> d;
  NmComputeRows<NV, R>(
      c1 - c0,
      [&](int64_t c) {
        NmDecodeRows<kBits, kBf16, R, 1>(w, tab, r, c0 + c, c0 + c + 1, NT, d);
        return std::pair<const int32_t*, const float*>(d.off, d.wv);
      },
      xt, scr, first);
}

// G (1 or 2) rows: kept weight i of row q has its X^T row at xt + off_q(i) and its value at
// vals_q[i]. The common length runs with G * NV chains, the longer row's rest alone. CSR rows
// (column indices) and bit-mask rows (offsets decoded per k block) share it.
template <int G, int NV, bool kBf16, class Off0, class Off1>
HWY_INLINE void PairTiledRows(Off0 off0, const void* vals0, int64_t cnt0, Off1 off1,
                              const void* vals1, int64_t cnt1, const float* xt, float* scr,
                              bool first) {
  const DF df;
  const size_t L = hn::Lanes(df);
  const int64_t NT = NV * static_cast<int64_t>(L);
  SPARQ_ACC_ROW8(0);
  SPARQ_ACC_ROW8(1);
  SPARQ_FOR_V8(SPARQ_ACC_LOAD, 0);
  SPARQ_FOR_V8(SPARQ_ACC_LOAD, 1);
  const int64_t common = G > 1 ? std::min(cnt0, cnt1) : 0;
  for (int64_t i = 0; i < common; ++i) {
    const float* xa = xt + off0(i);
    const float* xb = xt + off1(i);
    const auto w0 = hn::Set(df, ScalarValue<kBf16>(vals0, i));
    const auto w1 = hn::Set(df, ScalarValue<kBf16>(vals1, i));
    a00 = hn::MulAdd(w0, hn::LoadU(df, xa), a00);
    a10 = hn::MulAdd(w1, hn::LoadU(df, xb), a10);
    if constexpr (NV > 1) a01 = hn::MulAdd(w0, hn::LoadU(df, xa + L), a01);
    if constexpr (NV > 1) a11 = hn::MulAdd(w1, hn::LoadU(df, xb + L), a11);
    if constexpr (NV > 2) a02 = hn::MulAdd(w0, hn::LoadU(df, xa + 2 * L), a02);
    if constexpr (NV > 2) a12 = hn::MulAdd(w1, hn::LoadU(df, xb + 2 * L), a12);
    if constexpr (NV > 3) a03 = hn::MulAdd(w0, hn::LoadU(df, xa + 3 * L), a03);
    if constexpr (NV > 3) a13 = hn::MulAdd(w1, hn::LoadU(df, xb + 3 * L), a13);
    if constexpr (NV > 4) a04 = hn::MulAdd(w0, hn::LoadU(df, xa + 4 * L), a04);
    if constexpr (NV > 4) a14 = hn::MulAdd(w1, hn::LoadU(df, xb + 4 * L), a14);
    if constexpr (NV > 5) a05 = hn::MulAdd(w0, hn::LoadU(df, xa + 5 * L), a05);
    if constexpr (NV > 5) a15 = hn::MulAdd(w1, hn::LoadU(df, xb + 5 * L), a15);
    if constexpr (NV > 6) a06 = hn::MulAdd(w0, hn::LoadU(df, xa + 6 * L), a06);
    if constexpr (NV > 6) a16 = hn::MulAdd(w1, hn::LoadU(df, xb + 6 * L), a16);
    if constexpr (NV > 7) a07 = hn::MulAdd(w0, hn::LoadU(df, xa + 7 * L), a07);
    if constexpr (NV > 7) a17 = hn::MulAdd(w1, hn::LoadU(df, xb + 7 * L), a17);
  }
  // The longer row's remaining weights, one row at a time.
  auto tail = [&](auto off, const void* vals, int64_t cnt, auto& b0, auto& b1, auto& b2, auto& b3,
                  auto& b4, auto& b5, auto& b6, auto& b7) {
    for (int64_t i = common; i < cnt; ++i) {
      const float* xr = xt + off(i);
      const auto wv = hn::Set(df, ScalarValue<kBf16>(vals, i));
      b0 = hn::MulAdd(wv, hn::LoadU(df, xr), b0);
      if constexpr (NV > 1) b1 = hn::MulAdd(wv, hn::LoadU(df, xr + L), b1);
      if constexpr (NV > 2) b2 = hn::MulAdd(wv, hn::LoadU(df, xr + 2 * L), b2);
      if constexpr (NV > 3) b3 = hn::MulAdd(wv, hn::LoadU(df, xr + 3 * L), b3);
      if constexpr (NV > 4) b4 = hn::MulAdd(wv, hn::LoadU(df, xr + 4 * L), b4);
      if constexpr (NV > 5) b5 = hn::MulAdd(wv, hn::LoadU(df, xr + 5 * L), b5);
      if constexpr (NV > 6) b6 = hn::MulAdd(wv, hn::LoadU(df, xr + 6 * L), b6);
      if constexpr (NV > 7) b7 = hn::MulAdd(wv, hn::LoadU(df, xr + 7 * L), b7);
    }
  };
  tail(off0, vals0, cnt0, a00, a01, a02, a03, a04, a05, a06, a07);
  if constexpr (G > 1) tail(off1, vals1, cnt1, a10, a11, a12, a13, a14, a15, a16, a17);
  SPARQ_FOR_V8(SPARQ_ACC_STORE, 0);
  SPARQ_FOR_V8(SPARQ_ACC_STORE, 1);
}

// Two CSR rows (g = 1 groups) at once, columns [pa0, pa1) and [pb0, pb1).
template <int NV, bool kBf16>
HWY_INLINE void CsrTiledPair(const ScgWeight& w, int64_t pa0, int64_t pa1, int64_t pb0,
                             int64_t pb1, const float* xt, float* scr, bool first) {
  const int64_t NT = NV * static_cast<int64_t>(hn::Lanes(DF()));
  const uint8_t* vals = static_cast<const uint8_t*>(w.values.data());
  const size_t vb = kBf16 ? 2 : 4;
  if (w.idx16 && !w.implicit_cols) {
    // u16 indices read directly: through w.Col the compiler re-checked the index type (and
    // reloaded the index pointer) for every kept weight.
    const uint16_t* ca = w.col_idx.data_as<uint16_t>() + pa0;
    const uint16_t* cb = w.col_idx.data_as<uint16_t>() + pb0;
    PairTiledRows<2, NV, kBf16>([ca, NT](int64_t i) { return int64_t{ca[i]} * NT; },
                                vals + pa0 * vb, pa1 - pa0,
                                [cb, NT](int64_t i) { return int64_t{cb[i]} * NT; },
                                vals + pb0 * vb, pb1 - pb0, xt, scr, first);
    return;
  }
  PairTiledRows<2, NV, kBf16>([&](int64_t i) { return w.Col(pa0 + i) * NT; }, vals + pa0 * vb,
                              pa1 - pa0, [&](int64_t i) { return w.Col(pb0 + i) * NT; },
                              vals + pb0 * vb, pb1 - pb0, xt, scr, first);
}

// Prefetches the next k block's X^T slice (`next`, whole cache lines) during the last row groups
// of this one's `steps`, at least 4 lines per group. The slice is read in a data-dependent column
// order, so the hardware prefetchers do not fetch it ahead, and with few rows per pass (SmolLM2's
// 576x1536 layers) its first touch from L3 is a large part of the pass. When to use it:
// NextXtSlice in spmm.cc.
class XtSlicePrefetcher {
 public:
  XtSlicePrefetcher(const XtNext& next, int64_t steps)
      : p_(static_cast<const uint8_t*>(static_cast<const void*>(next.xt))),
        end_(p_ == nullptr ? nullptr : p_ + next.bytes) {
    const int64_t lines = next.bytes / 64;
    if (p_ == nullptr || steps <= 0 || lines <= 0) return;
    per_step_ = std::max<int64_t>(4, (lines + steps - 1) / steps);
    start_ = steps - (lines + per_step_ - 1) / per_step_;
  }
  HWY_INLINE void Step() {
    if (step_++ < start_) return;
    for (int64_t i = 0; i < per_step_ && p_ < end_; ++i, p_ += 64) hwy::Prefetch(p_);
  }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
  int64_t per_step_ = 0;
  int64_t start_ = 0;
  int64_t step_ = 0;
};

// Prefetches a group's values and column indices in one k block (ScgTiledImpl, one group ahead).
// A group's run in a k block is short (hundreds of bytes) and the next group's starts far away
// (this group's other k blocks lie between), so the hardware prefetchers do not fetch it ahead;
// where a task's weights do not stay in L2 across the token tiles (11008x4096 V:N:M, 1.4 MB per
// task), each run came from L3 on demand. Measured (n = 512, sparq ms, old -> new, two interleaved
// rounds): V:16:2:4 11008x4096 one thread 216-217 -> 172-176, two threads 111-124 -> 94; V:32:2:4
// 11008x4096 233-234 -> 182-187; V:16:2:4 4096x11008 187-192 -> 165-177; 4096x4096 V:N:M and
// BSR 16x16 / 32x32 90% within noise or up to 8% faster. Only for groups of 2 or more rows: CSR
// rows (one row per group, short runs) went 5-15% slower with it (99% 4096x4096, 95% 4096x11008);
// except CsrNarrowImpl's single pass over weights beyond L2 (kCsrStreamAhead).
class ScgRunPrefetcher {
 public:
  ScgRunPrefetcher(const ScgWeight& w, const ScgBlock& blk, int64_t g0, int64_t g1, int g,
                   size_t vb)
      : vals_(static_cast<const uint8_t*>(w.values.data())),
        idx_(w.implicit_cols ? nullptr : static_cast<const uint8_t*>(w.col_idx.data())),
        pb_(blk.pb),
        pe_(blk.pe),
        g0_(g0),
        g1_(g1),
        vbytes_(vb * static_cast<size_t>(g)),
        ibytes_(w.idx16 ? 2 : 4) {}
  HWY_INLINE void Fetch(int64_t gi) const {
    if (gi >= g1_) return;
    const int64_t p0 = pb_[gi - g0_], p1 = pe_[gi - g0_];
    if (p1 <= p0) return;
    Lines(vals_ + static_cast<size_t>(p0) * vbytes_, static_cast<size_t>(p1 - p0) * vbytes_);
    if (idx_ != nullptr) {
      Lines(idx_ + static_cast<size_t>(p0) * ibytes_, static_cast<size_t>(p1 - p0) * ibytes_);
    }
  }

 private:
  static HWY_INLINE void Lines(const uint8_t* p, size_t bytes) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{63};
    const uintptr_t e = reinterpret_cast<uintptr_t>(p) + bytes;
    for (uintptr_t l = a; l < e; l += 64) hwy::Prefetch(reinterpret_cast<const void*>(l));
  }
  const uint8_t* vals_;
  const uint8_t* idx_;
  const int64_t* pb_;
  const int64_t* pe_;
  int64_t g0_, g1_;
  size_t vbytes_, ibytes_;
};

// Rows ahead whose weights CsrNarrowImpl prefetches in a pass over the whole k (blk.stream,
// weights beyond L2): they are read once per call there, from DRAM or L3 (a model reads each
// layer once per token), and a kept weight costs too few cycles for the hardware prefetchers to
// keep up. Measured (one thread, an OpenBLAS call before each sample, ms): 4096x4096 90% n = 4
// 1.82-1.94 without, 1.37-1.44 with 2-8 rows ahead, 1.49-1.55 at 16, 1.63-1.68 at 32; 4 ahead,
// three rounds: 11008x4096 90% n = 4 4.47-5.11 -> 3.82-3.90; 99% (1-3 MB) within noise;
// SmolLM2's 576x1536 90% (0.5 MB, in L2) 0.048-0.050 -> 0.051-0.054, hence only for weights
// larger than L2. In the full-vector pairs (n = 9-32) it was not faster with two threads.
inline constexpr int64_t kCsrStreamAhead = 4;

// One group of G rows sharing columns; columns [p0, p1) (all < the k block's end).
template <int G, int NV, bool kBf16>
HWY_INLINE void ScgTiledGroup(const ScgWeight& w, int64_t p0, int64_t p1, const float* xt,
                              float* scr, bool first) {
  const DF df;
  const size_t L = hn::Lanes(df);
  const int64_t NT = NV * static_cast<int64_t>(L);
  const void* vals = w.values.data();
  SPARQ_ACC_ROW(0);
  SPARQ_ACC_ROW(1);
  SPARQ_ACC_ROW(2);
  SPARQ_ACC_ROW(3);
  SPARQ_FOR_QV(SPARQ_ACC_LOAD);
  // The loop once per index type (w.Col's checks are not hoisted out of it by the compiler).
  auto run = [&](auto col) HWY_ATTR {
    for (int64_t p = p0; p < p1; ++p) {
      const float* xp = xt + col(p) * NT;
      const auto x0 = hn::LoadU(df, xp);
      const auto x1 = NV > 1 ? hn::LoadU(df, xp + L) : x0;
      const auto x2 = NV > 2 ? hn::LoadU(df, xp + 2 * L) : x0;
      const auto x3 = NV > 3 ? hn::LoadU(df, xp + 3 * L) : x0;
      const auto w0 = hn::Set(df, ScalarValue<kBf16>(vals, p * G));
      const auto w1 = G > 1 ? hn::Set(df, ScalarValue<kBf16>(vals, p * G + (G > 1))) : w0;
      const auto w2 = G > 2 ? hn::Set(df, ScalarValue<kBf16>(vals, p * G + 2 * (G > 2))) : w0;
      const auto w3 = G > 3 ? hn::Set(df, ScalarValue<kBf16>(vals, p * G + 3 * (G > 3))) : w0;
      SPARQ_FOR_QV(SPARQ_ACC_FMA);
    }
  };
  if (w.implicit_cols) {
    // [p0, p1) lies in one group's run of all columns: consecutive columns, no division.
    const int64_t base = p0 % w.cols - p0;
    run([base](int64_t p) { return base + p; });
  } else if (w.idx16) {
    const uint16_t* ci = w.col_idx.data_as<uint16_t>();
    run([ci](int64_t p) { return int64_t{ci[p]}; });
  } else {
    const uint32_t* ci = w.col_idx.data_as<uint32_t>();
    run([ci](int64_t p) { return int64_t{ci[p]}; });
  }
  SPARQ_FOR_QV(SPARQ_ACC_STORE);
}

// Groups [g0, g1) over k block blk (the column ranges are found once per call by the caller,
// not rescanned in every token tile).
template <int G, int NV, bool kBf16>
HWY_NOINLINE void ScgTiledImpl(const ScgWeight& w, int64_t g0, int64_t g1, const float* xt,
                               const ScgBlock& blk, float* scratch, const XtNext& next) {
  const int64_t NT = NV * static_cast<int64_t>(hn::Lanes(DF()));
  const bool first = blk.first;
  int64_t gi = g0;
  XtSlicePrefetcher pf(next, G == 1 && 2 * NV <= kMaxAcc ? (g1 - g0 + 1) / 2 : g1 - g0);
  ScgRunPrefetcher wpf(w, blk, g0, g1, w.g, kBf16 ? 2 : 4);
  if constexpr (G == 1 && 2 * NV <= kMaxAcc) {
    for (; gi + 1 < g1; gi += 2) {
      pf.Step();
      CsrTiledPair<NV, kBf16>(w, blk.pb[gi - g0], blk.pe[gi - g0], blk.pb[gi + 1 - g0],
                              blk.pe[gi + 1 - g0], xt, scratch + (gi - g0) * NT, first);
    }
  }
  for (; gi < g1; ++gi) {
    pf.Step();
    if constexpr (G > 1) wpf.Fetch(gi + 1);
    float* scr = scratch + (gi - g0) * G * NT;  // [group][G][NT]: padded rows stay inside
    ScgTiledGroup<G, NV, kBf16>(w, blk.pb[gi - g0], blk.pe[gi - g0], xt, scr, first);
  }
}

// CSR rows (g = 1, explicit columns) on a token tile narrower than one vector: kNt (4 or 8) tokens
// in a 128- / 256-bit vector, for n <= kNt on targets with wider vectors (NarrowCsrWidth). At n = 4
// the 16-token tile read a whole 64-byte line of X^T per kept weight and its X^T (k x 16 floats,
// 256 KiB at k = 4096) sat in L2; with 4 tokens a kept weight reads 16 bytes and X^T (64 KiB) is
// mostly in L1. Two rows at a time, each with two partial sums (kept weight i into sum i % 2,
// whatever the other row's length, so a row's bits do not depend on its partner): four FMA chains
// where the pairs of ScgTiledImpl have two. The same kernel on one full 16-token vector (n = 9-16
// on AVX-512) was no faster than those pairs with two threads (interleaved builds, three rounds:
// 1536x576 90% n = 16 0.079 -> 0.083-0.086 ms, 4096x4096 90% n = 12 0.86-0.90 -> 0.91-1.06), so
// it runs the narrow tiles only.
template <size_t kNt, bool kBf16, class Col>
HWY_INLINE void CsrNarrowPair(Col col, int64_t pa0, int64_t pa1, int64_t pb0, int64_t pb1,
                              const void* vals, const float* xt, float* scr, bool two, bool first) {
  const hn::CappedTag<float, kNt> d;
  constexpr int64_t NT = static_cast<int64_t>(kNt);
  auto a0 = first ? hn::Zero(d) : hn::LoadU(d, scr);
  auto b0 = first || !two ? hn::Zero(d) : hn::LoadU(d, scr + NT);
  auto a1 = hn::Zero(d), b1 = hn::Zero(d);
  const int64_t na = pa1 - pa0, nb = two ? pb1 - pb0 : 0;
  const int64_t common = std::min(na, nb) & ~int64_t{1};
  int64_t i = 0;
  for (; i < common; i += 2) {
    const auto xa0 = hn::LoadU(d, xt + col(pa0 + i) * NT);
    const auto xb0 = hn::LoadU(d, xt + col(pb0 + i) * NT);
    const auto xa1 = hn::LoadU(d, xt + col(pa0 + i + 1) * NT);
    const auto xb1 = hn::LoadU(d, xt + col(pb0 + i + 1) * NT);
    a0 = hn::MulAdd(hn::Set(d, ScalarValue<kBf16>(vals, pa0 + i)), xa0, a0);
    b0 = hn::MulAdd(hn::Set(d, ScalarValue<kBf16>(vals, pb0 + i)), xb0, b0);
    a1 = hn::MulAdd(hn::Set(d, ScalarValue<kBf16>(vals, pa0 + i + 1)), xa1, a1);
    b1 = hn::MulAdd(hn::Set(d, ScalarValue<kBf16>(vals, pb0 + i + 1)), xb1, b1);
  }
  // Each row's rest alone, still kept weight i into sum i % 2.
  auto tail = [&](int64_t p0, int64_t cnt, auto& s0, auto& s1) {
    int64_t j = common;
    for (; j + 2 <= cnt; j += 2) {
      const auto x0 = hn::LoadU(d, xt + col(p0 + j) * NT);
      const auto x1 = hn::LoadU(d, xt + col(p0 + j + 1) * NT);
      s0 = hn::MulAdd(hn::Set(d, ScalarValue<kBf16>(vals, p0 + j)), x0, s0);
      s1 = hn::MulAdd(hn::Set(d, ScalarValue<kBf16>(vals, p0 + j + 1)), x1, s1);
    }
    if (j < cnt) {
      s0 = hn::MulAdd(hn::Set(d, ScalarValue<kBf16>(vals, p0 + j)),
                      hn::LoadU(d, xt + col(p0 + j) * NT), s0);
    }
  };
  tail(pa0, na, a0, a1);
  hn::StoreU(hn::Add(a0, a1), d, scr);
  if (two) {
    tail(pb0, nb, b0, b1);
    hn::StoreU(hn::Add(b0, b1), d, scr + NT);
  }
}

// Rows (groups of 1) [g0, g1) over k block blk, X^T tiles of kNt tokens.
template <size_t kNt, bool kBf16>
HWY_NOINLINE void CsrNarrowImpl(const ScgWeight& w, int64_t g0, int64_t g1, const float* xt,
                                const ScgBlock& blk, float* scratch, const XtNext& next) {
  constexpr int64_t NT = static_cast<int64_t>(kNt);
  const void* vals = w.values.data();
  XtSlicePrefetcher pf(next, (g1 - g0 + 1) / 2);
  ScgRunPrefetcher wpf(w, blk, g0, g1, 1, kBf16 ? 2 : 4);
  auto run = [&](auto col) HWY_ATTR {
    for (int64_t gi = g0; gi < g1; gi += 2) {
      pf.Step();
      if (blk.stream) {
        wpf.Fetch(gi + kCsrStreamAhead);
        wpf.Fetch(gi + kCsrStreamAhead + 1);
      }
      const bool two = gi + 1 < g1;
      const int64_t j = gi - g0;
      CsrNarrowPair<kNt, kBf16>(col, blk.pb[j], blk.pe[j], two ? blk.pb[j + 1] : 0,
                                two ? blk.pe[j + 1] : 0, vals, xt, scratch + j * NT, two,
                                blk.first);
    }
  };
  if (w.idx16) {
    const uint16_t* ci = w.col_idx.data_as<uint16_t>();
    run([ci](int64_t p) { return int64_t{ci[p]}; });
  } else {
    const uint32_t* ci = w.col_idx.data_as<uint32_t>();
    run([ci](int64_t p) { return int64_t{ci[p]}; });
  }
}

// The narrow CSR tile width for n tokens: 4 or 8 where that is under one vector and covers n
// (AVX2: n <= 4; AVX-512: n <= 8), else 0 (the full-vector tiles).
inline int64_t NarrowCsrWidth(int64_t n) {
  const int64_t L = static_cast<int64_t>(hn::Lanes(DF()));
  if (n <= 4 && L > 4) return 4;
  if (n <= 8 && L > 8) return 8;
  return 0;
}

template <int kBits, bool kBf16, int NV>
HWY_NOINLINE void NmTiledImpl(const NmWeight& w, int64_t r0, int64_t r1, const float* xt,
                              int64_t c0, int64_t c1, float* scratch, const XtNext& next) {
  const int64_t NT = NV * static_cast<int64_t>(hn::Lanes(DF()));
  const NmLaneTables tab(w.n, w.m, w.bits);
  int64_t r = r0;
  constexpr int kRows = 4 * NV <= kMaxAcc ? 4 : 2;  // 8..16 chains
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
      if (r + kRows <= r1) {
        NmDecodeRows<kBits, kBf16, kRows, kPipeChunks>(w, tab, r, c0, c1, nt, buf[0]);
      }
      for (; r + kRows <= r1; r += kRows) {
        pf.Step();
        if (r + 2 * kRows <= r1) {
          NmDecodeRows<kBits, kBf16, kRows, kPipeChunks>(w, tab, r + kRows, c0, c1, nt,
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
      NmTiledRows<kBits, kBf16, NV, kRows>(w, tab, r, c0, c1, xt, scratch + (r - r0) * NT, c0 == 0);
    }
  }
  for (; r < r1; ++r) {
    pf.Step();
    NmTiledRows<kBits, kBf16, NV, 1>(w, tab, r, c0, c1, xt, scratch + (r - r0) * NT, c0 == 0);
  }
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

// Rows [r0, r1) over chunks [c0, c1); cursor[r - r0]: the row's first value of this k block
// (reset at c0 == 0, advanced here); off: room for 4 * ((c1 - c0) * 16 + 16) offsets.
template <int NV, bool kBf16>
HWY_NOINLINE void MaskTiledImpl(const MaskWeight& w, int64_t r0, int64_t r1, const float* xt,
                                int64_t c0, int64_t c1, int64_t* cursor, int32_t* off,
                                float* scratch, const XtNext& next) {
  const int32_t NT = static_cast<int32_t>(NV * hn::Lanes(DF()));
  const bool first = c0 == 0;
  XtSlicePrefetcher pf(next, 2 * NV <= kMaxAcc ? (r1 - r0 + 1) / 2 : r1 - r0);
  const size_t vb = kBf16 ? 2 : 4;
  const uint8_t* vals = static_cast<const uint8_t*>(w.values.data());
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
      PairTiledRows<2, NV, kBf16>([o0](int64_t i) { return o0[i]; }, vals + cursor[r - r0] * vb, n0,
                                  [o1](int64_t i) { return o1[i]; }, vals + cursor[r + 1 - r0] * vb,
                                  n1, xt, scratch + (r - r0) * NT, first);
      cursor[r - r0] += n0;
      cursor[r + 1 - r0] += n1;
      cur ^= 1;
    }
  }
  for (; r < r1; ++r) {
    pf.Step();
    const int64_t n0 = MaskOffsets(bits + r * w.chunks, c0, c1, NT, off);
    auto at = [off](int64_t i) { return off[i]; };
    PairTiledRows<1, NV, kBf16>(at, vals + cursor[r - r0] * vb, n0, at, nullptr, 0, xt,
                                scratch + (r - r0) * NT, first);
    cursor[r - r0] += n0;
  }
}

#undef SPARQ_ACC_ROW
#undef SPARQ_ACC_LOAD
#undef SPARQ_ACC_STORE
#undef SPARQ_ACC_FMA
#undef SPARQ_FOR_V
#undef SPARQ_FOR_QV
#undef SPARQ_ACC_ROW8
#undef SPARQ_FOR_V8
#undef SPARQ_FOR_QV8

// ---------------------------------------------------------------------------------------------
// Epilogue of y[r0, r1) of token t's output row (y points at Y[t, 0]): bias, activation, residual,
// in that order. Every element goes through the same vector code (a tail shorter than a vector
// through a padded copy), so an element's bits do not depend on where a task's rows start and
// results stay independent of the thread count. SiLU is v * sigmoid(v) with sigmoid from
// Highway's Exp of -|v| (max error 1 ulp; Exp is undefined above +104, so exp(-v) itself would not
// do for v < -104). libm's expf per element was 6.5% of a 512-token prefill (SmolLM2, 2:4, one
// thread, CPU-time profile), and the scalar loop around it another 5%. GELU (erf) stays scalar.
template <bool kBias, bool kRes, int kAct>  // kAct: 0 none, 1 ReLU, 2 SiLU
HWY_INLINE void EpilogueVector(float* y, const float* bias, const float* res) {
  const DF df;
  auto v = hn::LoadU(df, y);
  if constexpr (kBias) v = hn::Add(v, hn::LoadU(df, bias));
  if constexpr (kAct == 1) {
    const auto zero = hn::Zero(df);
    v = hn::IfThenElse(hn::Gt(v, zero), v, zero);  // NaN -> 0, as v > 0 ? v : 0
  } else if constexpr (kAct == 2) {
    const auto one = hn::Set(df, 1.0f);
    // exp(-|v|) in [0, 1]; NaN lanes take exp(0) instead (the product below stays NaN): Highway's
    // Exp converts its argument to int32, undefined for NaN (UBSan on the EMU128 target).
    const auto e = hn::Exp(df, hn::IfThenZeroElse(hn::IsNaN(v), hn::Neg(hn::Abs(v))));
    const auto num = hn::IfThenElse(hn::Ge(v, hn::Zero(df)), one, e);
    v = hn::Mul(v, hn::Div(num, hn::Add(one, e)));
  }
  if constexpr (kRes) v = hn::Add(v, hn::LoadU(df, res));
  hn::StoreU(v, df, y);
}

template <bool kBias, bool kRes, int kAct>
HWY_INLINE void EpilogueSpan(float* y, const float* bias, const float* res, int64_t r0,
                             int64_t r1) {
  const int64_t L = static_cast<int64_t>(hn::Lanes(DF()));
  int64_t r = r0;
  for (; r + L <= r1; r += L) {
    EpilogueVector<kBias, kRes, kAct>(y + r, kBias ? bias + r : nullptr, kRes ? res + r : nullptr);
  }
  if (r < r1) {
    alignas(64) float yb[hn::MaxLanes(DF())] = {}, bb[hn::MaxLanes(DF())] = {},
                      rb[hn::MaxLanes(DF())] = {};
    const size_t cnt = static_cast<size_t>(r1 - r) * sizeof(float);
    std::memcpy(yb, y + r, cnt);
    if constexpr (kBias) std::memcpy(bb, bias + r, cnt);
    if constexpr (kRes) std::memcpy(rb, res + r, cnt);
    EpilogueVector<kBias, kRes, kAct>(yb, bb, rb);
    std::memcpy(y + r, yb, cnt);
  }
}

// EpilogueSpan on y[t][r0, r1) of tokens t in [t0, t1) (y points at Y[0, 0], rows ldy apart, the
// residual's ldr apart): one call per token tile of a tiled kernel instead of one dispatched call
// per token and task (SmolLM2's 32-row tasks wrote 2 vectors per call): the residual epilogue
// went from 2.8% to 1.7% of the CPU-time samples of a 512-token 2:4 prefill (2 threads, `perf
// record -e cpu-clock`). The same vector code per element, so the same bits.
template <bool kBias, bool kRes, int kAct>
HWY_NOINLINE void EpilogueBlockImpl(float* y, int64_t ldy, const float* bias, const float* res,
                                    int64_t ldr, int64_t t0, int64_t t1, int64_t r0, int64_t r1) {
  for (int64_t t = t0; t < t1; ++t) {
    EpilogueSpan<kBias, kRes, kAct>(y + t * ldy, bias, kRes ? res + t * ldr : nullptr, r0, r1);
  }
}

template <int kAct>
HWY_INLINE void EpilogueBlockAct(float* y, int64_t ldy, const float* bias, const float* res,
                                 int64_t ldr, int64_t t0, int64_t t1, int64_t r0, int64_t r1) {
  if (bias) {
    res ? EpilogueBlockImpl<true, true, kAct>(y, ldy, bias, res, ldr, t0, t1, r0, r1)
        : EpilogueBlockImpl<true, false, kAct>(y, ldy, bias, res, ldr, t0, t1, r0, r1);
  } else {
    res ? EpilogueBlockImpl<false, true, kAct>(y, ldy, bias, res, ldr, t0, t1, r0, r1)
        : EpilogueBlockImpl<false, false, kAct>(y, ldy, bias, res, ldr, t0, t1, r0, r1);
  }
}

// The epilogue of tokens [t0, t1) of Y (y = Y[0, 0], rows ldy apart), rows [r0, r1).
inline void EpilogueBlock(float* y, int64_t ldy, int64_t t0, int64_t t1, int64_t r0, int64_t r1,
                          int64_t m, const Epilogue& ep) {
  const int64_t ldr = ep.ld_residual ? ep.ld_residual : m;
  switch (ep.act) {
    case Activation::kNone:
      EpilogueBlockAct<0>(y, ldy, ep.bias, ep.residual, ldr, t0, t1, r0, r1);
      break;
    case Activation::kRelu:
      EpilogueBlockAct<1>(y, ldy, ep.bias, ep.residual, ldr, t0, t1, r0, r1);
      break;
    case Activation::kSilu:
      EpilogueBlockAct<2>(y, ldy, ep.bias, ep.residual, ldr, t0, t1, r0, r1);
      break;
    case Activation::kGelu:
      if (ep.bias) EpilogueBlockAct<0>(y, ldy, ep.bias, nullptr, ldr, t0, t1, r0, r1);
      for (int64_t t = t0; t < t1; ++t) {
        float* yt = y + t * ldy;
        for (int64_t r = r0; r < r1; ++r) {
          yt[r] = 0.5f * yt[r] * (1.0f + std::erf(yt[r] * 0.70710678118654752f));
        }
      }
      if (ep.residual) EpilogueBlockAct<0>(y, ldy, nullptr, ep.residual, ldr, t0, t1, r0, r1);
      break;
  }
}

// The same for token t alone (y points at Y[t, 0]).
inline void EpilogueRow(float* y, int64_t t, int64_t r0, int64_t r1, int64_t m,
                        const Epilogue& ep) {
  EpilogueBlock(y, 0, t, t + 1, r0, r1, m, ep);
}

// ---------------------------------------------------------------------------------------------
// Per-target entry points (dispatched from spmm.cc).

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

// Vectors per token tile for a group of g rows and n tokens: as few as cover n (1, 2 or 4), at
// most what the registers hold (g * NV accumulators).
inline int TiledNv(int g, int64_t n) {
  const int64_t L = static_cast<int64_t>(hn::Lanes(DF()));
  const int max_nv = std::max(1, std::min(4, kMaxAcc / g));
  const int need = n <= L ? 1 : n <= 2 * L ? 2 : 4;
  return std::min(need, max_nv);
}
inline int64_t TileWidth(int g, int64_t n) {
  return TiledNv(g, n) * static_cast<int64_t>(hn::Lanes(DF()));
}

// Token tiles of the row kernels (N:M, and bit-mask rows, which run as pairs of rows). On AVX-512
// (16 lanes, 16 accumulators) any 1 to 8 vectors: one tile of ceil(n / 16) vectors up to 128
// tokens; beyond, the width of 4..8 vectors with the least padded work, counting each kept
// weight's offset load and broadcast as two more loads beside its NV loads and FMAs (so 8
// vectors at equal padding: 8 FMAs per offset and broadcast instead of 4). 128-token tiles
// measured (n = 512, one thread, medians of interleaved runs of the OpenBLAS / sparq time ratio,
// against 64-token tiles): 2:4 f32 (6 runs) 576x576 0.90 -> 0.99, 576x1536 0.87 -> 0.90,
// 4096x4096 1.01 -> 1.04, 1536x576 0.96 -> 0.97; 50% bit mask (4 runs, a loaded host) 576x576
// f32 0.88 -> 0.96, bf16 0.90 -> 1.00, the other SmolLM2 shapes within +-0.02. Widths of 3, 5, 6
// and 7 vectors remove the padding of token counts between the powers of two (n = 48 computed
// 64 tokens, n = 96 computed 128): docs/kernels.md. Other targets: 1, 2 or 4 vectors.
inline int64_t RowTileWidth(int64_t n) {
  const int64_t L = static_cast<int64_t>(hn::Lanes(DF()));
  if (!(kMaxAcc >= 16 && L == 16)) return TileWidth(1, n);
  if (n <= 8 * L) return std::max<int64_t>(1, (n + L - 1) / L) * L;
  int64_t best_nv = 8, best_cost = INT64_MAX;
  for (int64_t nv = 8; nv >= 4; --nv) {
    const int64_t cost = (n + nv * L - 1) / (nv * L) * (nv + 2);
    if (cost < best_cost) {
      best_cost = cost;
      best_nv = nv;
    }
  }
  return best_nv * L;
}

// The row kernels' vector counts: 1, 2, 4 everywhere; 3 and 5..8 where 16 accumulators fit two
// rows of them (AVX-512; elsewhere RowTileWidth never asks for them and they map to 4, so that
// they are not compiled). Calls fn(std::integral_constant<int, NV>()).
template <int NV>
using RowNv = std::integral_constant<int, kMaxAcc >= 16 || NV <= 2 ? NV : std::min(4, kMaxAcc)>;
template <class Fn>
HWY_INLINE void WithRowNv(int64_t nv, Fn&& fn) {
  switch (nv) {
    case 1:
      return fn(RowNv<1>());
    case 2:
      return fn(RowNv<2>());
    case 3:
      return fn(RowNv<3>());
    case 5:
      return fn(RowNv<5>());
    case 6:
      return fn(RowNv<6>());
    case 7:
      return fn(RowNv<7>());
    case 8:
      return fn(RowNv<8>());
    default:
      return fn(RowNv<4>());
  }
}

inline void NmDecode(const NmWeight& w, const float* xpad, int64_t n, int64_t r0, int64_t r1,
                     float* raw) {
  const bool bf = w.value_dtype == DType::kBF16;
  const bool perm = w.m == 2 * w.n && hn::Lanes(DF()) % w.n == 0;
  if (w.bits == 2) {
    if (perm) {
      bf ? NmDecodeImpl<2, true, true>(w, xpad, n, r0, r1, raw)
         : NmDecodeImpl<2, false, true>(w, xpad, n, r0, r1, raw);
    } else {
      bf ? NmDecodeImpl<2, true, false>(w, xpad, n, r0, r1, raw)
         : NmDecodeImpl<2, false, false>(w, xpad, n, r0, r1, raw);
    }
  } else if (perm) {
    bf ? NmDecodeImpl<4, true, true>(w, xpad, n, r0, r1, raw)
       : NmDecodeImpl<4, false, true>(w, xpad, n, r0, r1, raw);
  } else {
    bf ? NmDecodeImpl<4, true, false>(w, xpad, n, r0, r1, raw)
       : NmDecodeImpl<4, false, false>(w, xpad, n, r0, r1, raw);
  }
}

inline void ScgDecode(const ScgWeight& w, const float* x, int64_t ldx, int64_t n, int64_t g0,
                      int64_t g1, float* raw) {
  const bool bf = w.value_dtype == DType::kBF16;
  if (w.implicit_cols) {
    bf ? ScgDecodeDenseImpl<true>(w, x, n, g0, g1, raw) : ScgDecodeDenseImpl<false>(w, x, n, g0, g1, raw);
  } else if (w.g == 1) {
    if (w.idx16) {
      bf ? ScgDecodeG1Impl<true, true>(w, x, ldx, n, g0, g1, raw)
         : ScgDecodeG1Impl<true, false>(w, x, ldx, n, g0, g1, raw);
    } else {
      bf ? ScgDecodeG1Impl<false, true>(w, x, ldx, n, g0, g1, raw)
         : ScgDecodeG1Impl<false, false>(w, x, ldx, n, g0, g1, raw);
    }
  } else if (w.g == 2) {
    bf ? ScgDecodeGroupImpl<2, true>(w, x, ldx, n, g0, g1, raw)
       : ScgDecodeGroupImpl<2, false>(w, x, ldx, n, g0, g1, raw);
  } else {
    bf ? ScgDecodeGroupImpl<4, true>(w, x, ldx, n, g0, g1, raw)
       : ScgDecodeGroupImpl<4, false>(w, x, ldx, n, g0, g1, raw);
  }
}

inline void MaskDecode(const MaskWeight& w, const float* xpad, int64_t n, int64_t r0, int64_t r1,
                       float* raw) {
  w.value_dtype == DType::kBF16 ? MaskDecodeImpl<true>(w, xpad, n, r0, r1, raw)
                                : MaskDecodeImpl<false>(w, xpad, n, r0, r1, raw);
}

template <int NV>
HWY_INLINE void MaskTiledN(const MaskWeight& w, int64_t r0, int64_t r1, const float* xt,
                           int64_t c0, int64_t c1, int64_t* cursor, int32_t* off, float* scratch,
                           const XtNext& next) {
  if (w.value_dtype == DType::kBF16) {
    MaskTiledImpl<NV, true>(w, r0, r1, xt, c0, c1, cursor, off, scratch, next);
  } else {
    MaskTiledImpl<NV, false>(w, r0, r1, xt, c0, c1, cursor, off, scratch, next);
  }
}

// nt: the tile width TileWidth(1, n) the caller built X^T with.
inline void MaskTiled(const MaskWeight& w, int64_t nt, int64_t r0, int64_t r1, const float* xt,
                      int64_t c0, int64_t c1, int64_t* cursor, int32_t* off, float* scratch,
                      const XtNext& next) {
  WithRowNv(nt / static_cast<int64_t>(hn::Lanes(DF())), [&](auto nv) {
    MaskTiledN<decltype(nv)::value>(w, r0, r1, xt, c0, c1, cursor, off, scratch, next);
  });
}

template <int G, int NV>
HWY_INLINE void ScgTiledGN(const ScgWeight& w, int64_t g0, int64_t g1, const float* xt,
                           const ScgBlock& blk, float* scratch, const XtNext& next) {
  if constexpr (G * NV <= kMaxAcc || NV == 1) {
    if (w.value_dtype == DType::kBF16) {
      ScgTiledImpl<G, NV, true>(w, g0, g1, xt, blk, scratch, next);
    } else {
      ScgTiledImpl<G, NV, false>(w, g0, g1, xt, blk, scratch, next);
    }
  }
}

template <int G>
HWY_INLINE void ScgTiledG(const ScgWeight& w, int nv, int64_t g0, int64_t g1, const float* xt,
                          const ScgBlock& blk, float* scratch, const XtNext& next) {
  if (nv == 1) {
    ScgTiledGN<G, 1>(w, g0, g1, xt, blk, scratch, next);
  } else if (nv == 2) {
    ScgTiledGN<G, 2>(w, g0, g1, xt, blk, scratch, next);
  } else {
    ScgTiledGN<G, 4>(w, g0, g1, xt, blk, scratch, next);
  }
}

// nt: the tile width TileWidth(w.g, n) the caller built X^T with.
inline void ScgTiled(const ScgWeight& w, int64_t nt, int64_t g0, int64_t g1, const float* xt,
                     const ScgBlock& blk, float* scratch, const XtNext& next) {
  const int nv = static_cast<int>(nt / static_cast<int64_t>(hn::Lanes(DF())));
  if (nv == 0) {  // a narrow CSR tile (NarrowCsrWidth)
    const bool bf = w.value_dtype == DType::kBF16;
    if (nt == 4) {
      bf ? CsrNarrowImpl<4, true>(w, g0, g1, xt, blk, scratch, next)
         : CsrNarrowImpl<4, false>(w, g0, g1, xt, blk, scratch, next);
    } else {
      bf ? CsrNarrowImpl<8, true>(w, g0, g1, xt, blk, scratch, next)
         : CsrNarrowImpl<8, false>(w, g0, g1, xt, blk, scratch, next);
    }
    return;
  }
  if (w.g == 1) {
    ScgTiledG<1>(w, nv, g0, g1, xt, blk, scratch, next);
  } else if (w.g == 2) {
    ScgTiledG<2>(w, nv, g0, g1, xt, blk, scratch, next);
  } else {
    ScgTiledG<4>(w, nv, g0, g1, xt, blk, scratch, next);
  }
}

template <int NV>
HWY_INLINE void NmTiledN(const NmWeight& w, int64_t r0, int64_t r1, const float* xt, int64_t c0,
                         int64_t c1, float* scratch, const XtNext& next) {
  const bool bf = w.value_dtype == DType::kBF16;
  if (w.bits == 2) {
    bf ? NmTiledImpl<2, true, NV>(w, r0, r1, xt, c0, c1, scratch, next)
       : NmTiledImpl<2, false, NV>(w, r0, r1, xt, c0, c1, scratch, next);
  } else {
    bf ? NmTiledImpl<4, true, NV>(w, r0, r1, xt, c0, c1, scratch, next)
       : NmTiledImpl<4, false, NV>(w, r0, r1, xt, c0, c1, scratch, next);
  }
}

inline void NmTiled(const NmWeight& w, int64_t nt, int64_t r0, int64_t r1, const float* xt,
                    int64_t c0, int64_t c1, float* scratch, const XtNext& next) {
  WithRowNv(nt / static_cast<int64_t>(hn::Lanes(DF())),
            [&](auto nv) { NmTiledN<decltype(nv)::value>(w, r0, r1, xt, c0, c1, scratch, next); });
}

}  // namespace sparq::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // SPARQ_CPU_SPMM_INL_H_
