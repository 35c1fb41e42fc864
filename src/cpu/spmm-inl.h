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
#include <hwy/highway.h>

#include <algorithm>
#include <cstring>

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
  NmLaneTables(int n, int m, int bits) {
    for (int j = 0; j < kNmChunk; ++j) {
      base[j] = (j / n) * m;
      shift[j] = static_cast<uint32_t>((bits * j) % 32);
      word1[j] = (bits * j) >= 32 ? ~0u : 0u;
    }
  }
};

// Columns of lanes [p*L, p*L+L) of a chunk whose first column is `chunk_col`.
template <int kBits>
HWY_INLINE hn::Vec<DI> NmColumns(const uint32_t* words, const NmLaneTables& t, size_t p,
                                 int32_t chunk_col) {
  const DU du;
  const DI di;
  const size_t L = hn::Lanes(du);
  auto w = hn::Set(du, words[0]);
  if constexpr (kBits == 4) {
    const auto sel = hn::Load(du, t.word1 + p * L);
    w = hn::IfThenElse(hn::RebindMask(du, hn::Ne(sel, hn::Zero(du))), hn::Set(du, words[1]), w);
  }
  const auto idx = hn::And(hn::Shr(w, hn::Load(du, t.shift + p * L)),
                           hn::Set(du, (1u << kBits) - 1));
  return hn::Add(hn::Add(hn::Set(di, chunk_col), hn::Load(di, t.base + p * L)),
                 hn::BitCast(di, idx));
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

// Bytes ahead of the current position that the decode kernels prefetch in each weight stream
// (several streams in flight hide this VM's memory latency better than the hardware prefetcher).
inline constexpr int kPrefetchBytes = 1024;

// Decode, N:M: raw[t][r - r0] = sum over kept weights of row r times xpad[t] (k_pad floats, zero
// beyond cols). R rows run in lockstep (R weight streams, and one X window serves all R rows).
// kPerm (m == 2n, L % n == 0): the L kept values of a vector come from a window of 2L columns,
// so X is loaded as two vectors and permuted by the decoded positions (one vpermt2ps on AVX-512)
// instead of gathered; otherwise X is gathered.
template <int kBits, bool kBf16, bool kPerm, int R>
HWY_INLINE void NmDecodeRows(const NmWeight& w, const NmLaneTables& tab, const float* xpad,
                             int64_t n, int64_t r, int64_t r0, int64_t r1, float* raw) {
  const DF df;
  const size_t L = hn::Lanes(df);
  const size_t per_chunk = kNmChunk / L;
  const int32_t chunk_cols = (kNmChunk / w.n) * w.m;
  const int words = w.words_per_chunk();
  const size_t vb = kBf16 ? 2 : 4;
  const int64_t row_vals = w.chunks * kNmChunk;
  const uint8_t* vals = static_cast<const uint8_t*>(w.values.data()) + r * row_vals * vb;
  const uint32_t* meta = w.meta.data_as<uint32_t>() + r * w.chunks * words;
  for (int64_t t = 0; t < n; ++t) {
    const float* x = xpad + t * w.k_pad;
    auto acc0 = hn::Zero(df), acc1 = hn::Zero(df), acc2 = hn::Zero(df), acc3 = hn::Zero(df);
    for (int64_t c = 0; c < w.chunks; ++c) {
      const int32_t col0 = static_cast<int32_t>(c * chunk_cols);
      for (int q = 0; q < R; ++q) {
        hwy::Prefetch(vals + (q * row_vals + c * kNmChunk) * vb + kPrefetchBytes);
      }
      for (size_t p = 0; p < per_chunk; ++p) {
        hn::Vec<DF> xlo, xhi;
        int32_t wcol = col0;
        if constexpr (kPerm) {
          wcol = col0 + static_cast<int32_t>(2 * p * L);
          xlo = hn::LoadU(df, x + wcol);
          xhi = hn::LoadU(df, x + wcol + L);
        }
#define SPARQ_NM_ROW(q)                                                                       \
  if constexpr (R > q) {                                                                      \
    const auto cols = NmColumns<kBits>(meta + (q * w.chunks + c) * words, tab, p,             \
                                       kPerm ? col0 - wcol : col0);                           \
    const auto v = LoadValues<kBf16>(df, vals + (q * row_vals + c * kNmChunk + p * L) * vb);  \
    const auto xv = kPerm ? Permute2(df, xlo, xhi, cols) : hn::GatherIndex(df, x, cols);      \
    acc##q = hn::MulAdd(v, xv, acc##q);                                                       \
  }
        SPARQ_NM_ROW(0)
        SPARQ_NM_ROW(1)
        SPARQ_NM_ROW(2)
        SPARQ_NM_ROW(3)
#undef SPARQ_NM_ROW
      }
    }
    float* out = raw + t * (r1 - r0) + (r - r0);
    out[0] = hn::GetLane(hn::SumOfLanes(df, acc0));
    if constexpr (R > 1) out[1] = hn::GetLane(hn::SumOfLanes(df, acc1));
    if constexpr (R > 2) out[2] = hn::GetLane(hn::SumOfLanes(df, acc2));
    if constexpr (R > 3) out[3] = hn::GetLane(hn::SumOfLanes(df, acc3));
  }
}

template <int kBits, bool kBf16, bool kPerm>
HWY_NOINLINE void NmDecodeImpl(const NmWeight& w, const float* xpad, int64_t n, int64_t r0,
                               int64_t r1, float* raw) {
  const NmLaneTables tab(w.n, w.m, w.bits);
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) NmDecodeRows<kBits, kBf16, kPerm, 4>(w, tab, xpad, n, r, r0, r1, raw);
  for (; r < r1; ++r) NmDecodeRows<kBits, kBf16, kPerm, 1>(w, tab, xpad, n, r, r0, r1, raw);
}

// Decode, shared-column groups. g = 1 with explicit columns: gather X by the column indices.
template <bool kIdx16, bool kBf16>
HWY_NOINLINE void ScgDecodeG1Impl(const ScgWeight& w, const float* x, int64_t ldx, int64_t n,
                                  int64_t g0, int64_t g1, float* raw) {
  const DF df;
  const DI di;
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
        hn::Vec<DI> c0, c1;
        if constexpr (kIdx16) {
          const hn::Rebind<uint16_t, DF> d16;
          const uint16_t* ci = w.col_idx.data_as<uint16_t>() + p;
          c0 = hn::BitCast(di, hn::PromoteTo(DU(), hn::LoadU(d16, ci)));
          c1 = hn::BitCast(di, hn::PromoteTo(DU(), hn::LoadU(d16, ci + L)));
        } else {
          const uint32_t* ci = w.col_idx.data_as<uint32_t>() + p;
          c0 = hn::BitCast(di, hn::LoadU(DU(), ci));
          c1 = hn::BitCast(di, hn::LoadU(DU(), ci + L));
        }
        const size_t vb = kBf16 ? 2 : 4;
        const uint8_t* vp = static_cast<const uint8_t*>(values) + p * vb;
        acc0 = hn::MulAdd(LoadValues<kBf16>(df, vp), hn::GatherIndex(df, xt, c0), acc0);
        acc1 = hn::MulAdd(LoadValues<kBf16>(df, vp + L * vb), hn::GatherIndex(df, xt, c1), acc1);
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
          hwy::Prefetch(vals + p * vb + kPrefetchBytes);
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

// Decode, g = 2 or 4 rows sharing explicit columns (BSR, V:N:M): per column, a g-lane vector of
// values times a broadcast of x[col].
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
        auto acc0 = hn::Zero(dg);
        auto acc1 = hn::Zero(dg);
        int64_t p = p0;
        for (; p + 1 < p1; p += 2) {
          acc0 = hn::MulAdd(LoadValues<kBf16>(dg, vals + p * G * vb), hn::Set(dg, xt[w.Col(p)]), acc0);
          acc1 = hn::MulAdd(LoadValues<kBf16>(dg, vals + (p + 1) * G * vb),
                            hn::Set(dg, xt[w.Col(p + 1)]), acc1);
        }
        if (p < p1) {
          acc0 = hn::MulAdd(LoadValues<kBf16>(dg, vals + p * G * vb), hn::Set(dg, xt[w.Col(p)]), acc0);
        }
        hn::StoreU(hn::Add(acc0, acc1), dg, s);
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

// R (1, 2 or 4) rows of N:M over chunks [c0, c1); scr points at the first row's NT partial sums
// (the next rows' follow). R rows give R * NV independent FMA chains: two FMA ports with 4-cycle
// latency need 8 chains to stay busy.
template <int kBits, bool kBf16, int NV, int R>
HWY_INLINE void NmTiledRows(const NmWeight& w, const NmLaneTables& tab, int64_t r, int64_t c0,
                            int64_t c1, const float* xt, float* scr, bool first) {
  const DF df;
  const DI di;
  constexpr int G = R;
  const size_t L = hn::Lanes(df);
  const int NT = static_cast<int>(NV * L);
  const size_t per_chunk = kNmChunk / L;
  const int32_t chunk_cols = (kNmChunk / w.n) * w.m;
  const int words = w.words_per_chunk();
  const size_t vb = kBf16 ? 2 : 4;
  const int64_t row_vals = w.chunks * kNmChunk;
  const uint8_t* vals = static_cast<const uint8_t*>(w.values.data()) + r * row_vals * vb;
  const uint32_t* meta = w.meta.data_as<uint32_t>() + r * w.chunks * words;
  alignas(64) int32_t off[4 * kNmChunk];
  alignas(64) float wv[4 * kNmChunk];
  SPARQ_ACC_ROW(0);
  SPARQ_ACC_ROW(1);
  SPARQ_ACC_ROW(2);
  SPARQ_ACC_ROW(3);
  SPARQ_FOR_QV(SPARQ_ACC_LOAD);
  for (int64_t c = c0; c < c1; ++c) {
    for (int q = 0; q < R; ++q) {
      hwy::Prefetch(vals + (q * row_vals + c * kNmChunk) * vb + kPrefetchBytes);
      for (size_t p = 0; p < per_chunk; ++p) {
        const auto cols = NmColumns<kBits>(meta + (q * w.chunks + c) * words, tab, p,
                                           static_cast<int32_t>(c * chunk_cols));
        hn::Store(hn::Mul(cols, hn::Set(di, NT)), di, off + q * kNmChunk + p * L);
        hn::Store(LoadValues<kBf16>(df, vals + (q * row_vals + c * kNmChunk + p * L) * vb), df,
                  wv + q * kNmChunk + p * L);
      }
    }
    for (int j = 0; j < kNmChunk; ++j) {
#define SPARQ_NM_TILED_ROW(q)                                                  \
  if constexpr (R > q) {                                                       \
    const float* xp = xt + off[q * kNmChunk + j];                              \
    const auto wq = hn::Set(df, wv[q * kNmChunk + j]);                         \
    a##q##0 = hn::MulAdd(wq, hn::LoadU(df, xp), a##q##0);                      \
    if constexpr (NV > 1) a##q##1 = hn::MulAdd(wq, hn::LoadU(df, xp + L), a##q##1);     \
    if constexpr (NV > 2) a##q##2 = hn::MulAdd(wq, hn::LoadU(df, xp + 2 * L), a##q##2); \
    if constexpr (NV > 3) a##q##3 = hn::MulAdd(wq, hn::LoadU(df, xp + 3 * L), a##q##3); \
  }
      SPARQ_NM_TILED_ROW(0)
      SPARQ_NM_TILED_ROW(1)
      SPARQ_NM_TILED_ROW(2)
      SPARQ_NM_TILED_ROW(3)
#undef SPARQ_NM_TILED_ROW
    }
  }
  SPARQ_FOR_QV(SPARQ_ACC_STORE);
}

// Two CSR rows (g = 1 groups) at once, columns [pa0, pa1) and [pb0, pb1): the common length runs
// with 2 * NV chains, the longer row's rest alone.
template <int NV, bool kBf16>
HWY_INLINE void CsrTiledPair(const ScgWeight& w, int64_t pa0, int64_t pa1, int64_t pb0,
                             int64_t pb1, const float* xt, float* scr, bool first) {
  const DF df;
  constexpr int G = 2;
  const size_t L = hn::Lanes(df);
  const int64_t NT = NV * static_cast<int64_t>(L);
  const void* vals = w.values.data();
  SPARQ_ACC_ROW(0);
  SPARQ_ACC_ROW(1);
  SPARQ_FOR_V(SPARQ_ACC_LOAD, 0);
  SPARQ_FOR_V(SPARQ_ACC_LOAD, 1);
  const int64_t common = std::min(pa1 - pa0, pb1 - pb0);
  for (int64_t i = 0; i < common; ++i) {
    const float* xa = xt + w.Col(pa0 + i) * NT;
    const float* xb = xt + w.Col(pb0 + i) * NT;
    const auto w0 = hn::Set(df, ScalarValue<kBf16>(vals, pa0 + i));
    const auto w1 = hn::Set(df, ScalarValue<kBf16>(vals, pb0 + i));
    a00 = hn::MulAdd(w0, hn::LoadU(df, xa), a00);
    a10 = hn::MulAdd(w1, hn::LoadU(df, xb), a10);
    if constexpr (NV > 1) a01 = hn::MulAdd(w0, hn::LoadU(df, xa + L), a01);
    if constexpr (NV > 1) a11 = hn::MulAdd(w1, hn::LoadU(df, xb + L), a11);
    if constexpr (NV > 2) a02 = hn::MulAdd(w0, hn::LoadU(df, xa + 2 * L), a02);
    if constexpr (NV > 2) a12 = hn::MulAdd(w1, hn::LoadU(df, xb + 2 * L), a12);
    if constexpr (NV > 3) a03 = hn::MulAdd(w0, hn::LoadU(df, xa + 3 * L), a03);
    if constexpr (NV > 3) a13 = hn::MulAdd(w1, hn::LoadU(df, xb + 3 * L), a13);
  }
  for (int64_t p = pa0 + common; p < pa1; ++p) {
    const float* xa = xt + w.Col(p) * NT;
    const auto w0 = hn::Set(df, ScalarValue<kBf16>(vals, p));
    a00 = hn::MulAdd(w0, hn::LoadU(df, xa), a00);
    if constexpr (NV > 1) a01 = hn::MulAdd(w0, hn::LoadU(df, xa + L), a01);
    if constexpr (NV > 2) a02 = hn::MulAdd(w0, hn::LoadU(df, xa + 2 * L), a02);
    if constexpr (NV > 3) a03 = hn::MulAdd(w0, hn::LoadU(df, xa + 3 * L), a03);
  }
  for (int64_t p = pb0 + common; p < pb1; ++p) {
    const float* xb = xt + w.Col(p) * NT;
    const auto w1 = hn::Set(df, ScalarValue<kBf16>(vals, p));
    a10 = hn::MulAdd(w1, hn::LoadU(df, xb), a10);
    if constexpr (NV > 1) a11 = hn::MulAdd(w1, hn::LoadU(df, xb + L), a11);
    if constexpr (NV > 2) a12 = hn::MulAdd(w1, hn::LoadU(df, xb + 2 * L), a12);
    if constexpr (NV > 3) a13 = hn::MulAdd(w1, hn::LoadU(df, xb + 3 * L), a13);
  }
  SPARQ_FOR_V(SPARQ_ACC_STORE, 0);
  SPARQ_FOR_V(SPARQ_ACC_STORE, 1);
}

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
  for (int64_t p = p0; p < p1; ++p) {
    const float* xp = xt + w.Col(p) * NT;
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
  SPARQ_FOR_QV(SPARQ_ACC_STORE);
}

// Columns [p0, p1) of group gi inside k block [kc0, kc1): advance a cursor (columns ascending).
HWY_INLINE void ScgBlockRange(const ScgWeight& w, int64_t gi, int64_t kc0, int64_t kc1,
                              int64_t& cur, int64_t& p0, int64_t& p1) {
  if (w.implicit_cols) {
    p0 = w.group_ptr[gi] + kc0;
    p1 = w.group_ptr[gi] + kc1;
    return;
  }
  if (kc0 == 0) cur = w.group_ptr[gi];
  p0 = cur;
  p1 = p0;
  const int64_t end = w.group_ptr[gi + 1];
  while (p1 < end && w.Col(p1) < kc1) ++p1;
  cur = p1;
}

template <int G, int NV, bool kBf16>
HWY_NOINLINE void ScgTiledImpl(const ScgWeight& w, int64_t g0, int64_t g1, const float* xt,
                               int64_t kc0, int64_t kc1, int64_t* cursor, float* scratch) {
  const int64_t NT = NV * static_cast<int64_t>(hn::Lanes(DF()));
  const bool first = kc0 == 0;
  int64_t gi = g0;
  if constexpr (G == 1 && 2 * NV <= kMaxAcc) {
    for (; gi + 1 < g1; gi += 2) {
      int64_t pa0, pa1, pb0, pb1;
      ScgBlockRange(w, gi, kc0, kc1, cursor[gi - g0], pa0, pa1);
      ScgBlockRange(w, gi + 1, kc0, kc1, cursor[gi + 1 - g0], pb0, pb1);
      CsrTiledPair<NV, kBf16>(w, pa0, pa1, pb0, pb1, xt, scratch + (gi - g0) * NT, first);
    }
  }
  for (; gi < g1; ++gi) {
    float* scr = scratch + (gi - g0) * G * NT;  // [group][G][NT]: padded rows stay inside
    int64_t p0, p1;
    ScgBlockRange(w, gi, kc0, kc1, cursor[gi - g0], p0, p1);
    ScgTiledGroup<G, NV, kBf16>(w, p0, p1, xt, scr, first);
  }
}

template <int kBits, bool kBf16, int NV>
HWY_NOINLINE void NmTiledImpl(const NmWeight& w, int64_t r0, int64_t r1, const float* xt,
                              int64_t c0, int64_t c1, float* scratch) {
  const int64_t NT = NV * static_cast<int64_t>(hn::Lanes(DF()));
  const NmLaneTables tab(w.n, w.m, w.bits);
  int64_t r = r0;
  constexpr int kRows = 4 * NV <= kMaxAcc ? 4 : 2;  // 8..16 chains
  if constexpr (kRows * NV <= kMaxAcc) {
    for (; r + kRows <= r1; r += kRows) {
      NmTiledRows<kBits, kBf16, NV, kRows>(w, tab, r, c0, c1, xt, scratch + (r - r0) * NT, c0 == 0);
    }
  }
  for (; r < r1; ++r) {
    NmTiledRows<kBits, kBf16, NV, 1>(w, tab, r, c0, c1, xt, scratch + (r - r0) * NT, c0 == 0);
  }
}

#undef SPARQ_ACC_ROW
#undef SPARQ_ACC_LOAD
#undef SPARQ_ACC_STORE
#undef SPARQ_ACC_FMA
#undef SPARQ_FOR_V
#undef SPARQ_FOR_QV

// ---------------------------------------------------------------------------------------------
// Per-target entry points (dispatched from spmm.cc).

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

template <int G, int NV>
HWY_INLINE void ScgTiledGN(const ScgWeight& w, int64_t g0, int64_t g1, const float* xt,
                           int64_t kc0, int64_t kc1, int64_t* cursor, float* scratch) {
  if constexpr (G * NV <= kMaxAcc || NV == 1) {
    if (w.value_dtype == DType::kBF16) {
      ScgTiledImpl<G, NV, true>(w, g0, g1, xt, kc0, kc1, cursor, scratch);
    } else {
      ScgTiledImpl<G, NV, false>(w, g0, g1, xt, kc0, kc1, cursor, scratch);
    }
  }
}

template <int G>
HWY_INLINE void ScgTiledG(const ScgWeight& w, int nv, int64_t g0, int64_t g1, const float* xt,
                          int64_t kc0, int64_t kc1, int64_t* cursor, float* scratch) {
  if (nv == 1) {
    ScgTiledGN<G, 1>(w, g0, g1, xt, kc0, kc1, cursor, scratch);
  } else if (nv == 2) {
    ScgTiledGN<G, 2>(w, g0, g1, xt, kc0, kc1, cursor, scratch);
  } else {
    ScgTiledGN<G, 4>(w, g0, g1, xt, kc0, kc1, cursor, scratch);
  }
}

// nt: the tile width TileWidth(w.g, n) the caller built X^T with.
inline void ScgTiled(const ScgWeight& w, int64_t nt, int64_t g0, int64_t g1, const float* xt,
                     int64_t kc0, int64_t kc1, int64_t* cursor, float* scratch) {
  const int nv = static_cast<int>(nt / static_cast<int64_t>(hn::Lanes(DF())));
  if (w.g == 1) {
    ScgTiledG<1>(w, nv, g0, g1, xt, kc0, kc1, cursor, scratch);
  } else if (w.g == 2) {
    ScgTiledG<2>(w, nv, g0, g1, xt, kc0, kc1, cursor, scratch);
  } else {
    ScgTiledG<4>(w, nv, g0, g1, xt, kc0, kc1, cursor, scratch);
  }
}

template <int NV>
HWY_INLINE void NmTiledN(const NmWeight& w, int64_t r0, int64_t r1, const float* xt, int64_t c0,
                         int64_t c1, float* scratch) {
  const bool bf = w.value_dtype == DType::kBF16;
  if (w.bits == 2) {
    bf ? NmTiledImpl<2, true, NV>(w, r0, r1, xt, c0, c1, scratch)
       : NmTiledImpl<2, false, NV>(w, r0, r1, xt, c0, c1, scratch);
  } else {
    bf ? NmTiledImpl<4, true, NV>(w, r0, r1, xt, c0, c1, scratch)
       : NmTiledImpl<4, false, NV>(w, r0, r1, xt, c0, c1, scratch);
  }
}

inline void NmTiled(const NmWeight& w, int64_t nt, int64_t r0, int64_t r1, const float* xt,
                    int64_t c0, int64_t c1, float* scratch) {
  const int64_t nv = nt / static_cast<int64_t>(hn::Lanes(DF()));
  if (nv == 1) {
    NmTiledN<1>(w, r0, r1, xt, c0, c1, scratch);
  } else if (nv == 2) {
    NmTiledN<2>(w, r0, r1, xt, c0, c1, scratch);
  } else {
    NmTiledN<std::min(4, kMaxAcc)>(w, r0, r1, xt, c0, c1, scratch);
  }
}

}  // namespace sparq::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // SPARQ_CPU_SPMM_INL_H_
