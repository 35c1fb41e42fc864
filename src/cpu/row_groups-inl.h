// Row groups (layout kRowGroups, g = 2 or 4 rows sharing one column list: V:N:M slabs, BSR block rows,
// dense bf16 with implicit columns): one load of X, or of an X^T row, feeds the g rows.
#if defined(SPARQ_CPU_ROW_GROUPS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SPARQ_CPU_ROW_GROUPS_INL_H_
#undef SPARQ_CPU_ROW_GROUPS_INL_H_
#else
#define SPARQ_CPU_ROW_GROUPS_INL_H_
#endif

#include "src/cpu/simd-inl.h"
#include "src/cpu/prefetch-inl.h"
#include "src/cpu/tiled-inl.h"
#include "src/cpu/csr-inl.h"
#include "src/cpu/nm-inl.h"  // Nibbles, DequantLanes (the quantized row groups)

HWY_BEFORE_NAMESPACE();
namespace sparq::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Decode, dense bf16 (g = 4, implicit columns): values [c][4 rows] against xrep[t][c*4 + q] =
// x[t][c]: contiguous loads on both sides; lane i of the accumulator belongs to row i % 4.
template <bool kBf16>
HWY_NOINLINE void DenseBf16DecodeImpl(const RowGroupWeight& w, const float* xrep, int64_t n,
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
// x[i0..i3] in lanes 0-3, 4-7, 8-11, 12-15: one broadcast load each, merged under a mask. For a
// group of 4 rows this beats a 4-lane gather and its permute (Zen 5, V:8:2:4 4096 x 4096 int4,
// one token: 2.1 -> 0.85 ms).
// The columns are the four indices at c (u16 or u32).
template <bool kIdx16>
HWY_INLINE __m512 BroadcastColumns4(const float* xt, const void* c) {
  const auto* c16 = static_cast<const uint16_t*>(c);
  const auto* c32 = static_cast<const uint32_t*>(c);
  auto at = [&](int j) -> int64_t { return kIdx16 ? c16[j] : c32[j]; };
  __m512 v = _mm512_set1_ps(xt[at(0)]);
  v = _mm512_mask_broadcastss_ps(v, 0x00F0, _mm_load_ss(xt + at(1)));
  v = _mm512_mask_broadcastss_ps(v, 0x0F00, _mm_load_ss(xt + at(2)));
  return _mm512_mask_broadcastss_ps(v, 0xF000, _mm_load_ss(xt + at(3)));
}

// Columns [p0, p) of a group of G rows (2 or 4) for one token, 16 / G columns per vector: the
// values of those columns are 16 contiguous floats ([col][row]), and X comes from four broadcast
// loads (G = 4: BroadcastColumns4) or one 8-lane gather spread to 2 lanes each by a permute
// (G = 2). s[q] += row q's sum; returns p (the columns after it are left to the G-lane loop). Per
// 16 products one value load and one FMA, where the G-lane loop spends 16 / G column loads,
// broadcasts and FMAs (V:16:2:4 4096x4096 n = 1: docs/kernels.md). The broadcasts replaced a
// 4-lane gather and its permute (Zen 5, V:8:2:4 4096 x 4096, one thread, one token: f32 1.85 ->
// 1.35 ms, bf16 1.56 -> 0.84; 4 tokens f32 6.6 -> 3.0).
// vals and cols hold column p0's values and index (position p at p - p0).
template <int G, bool kBf16, bool kIdx16>
HWY_INLINE int64_t GroupDecodeWide(const uint8_t* vals0, const void* cols0, int64_t p0, int64_t p1,
                                   const float* xt, float* s) {
  static_assert(G == 2 || G == 4);
  constexpr int64_t C = 16 / G;
  const DF df;
  const size_t vb = kBf16 ? 2 : 4;
  const uint8_t* vals = vals0;  // relative: column p0 + i at i
  const uint16_t* c16 = kIdx16 ? static_cast<const uint16_t*>(cols0) : nullptr;
  const uint32_t* c32 = kIdx16 ? nullptr : static_cast<const uint32_t*>(cols0);
  const __m512i rep = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
  auto xvec = [&](int64_t q) -> __m512 {
    if constexpr (G == 4) {
      return BroadcastColumns4<kIdx16>(
          xt, kIdx16 ? static_cast<const void*>(c16 + q) : static_cast<const void*>(c32 + q));
    } else {
      const __m256i idx =
          kIdx16 ? _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c16 + q)))
                 : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c32 + q));
      return _mm512_permutexvar_ps(rep, _mm512_castps256_ps512(_mm256_i32gather_ps(xt, idx, 4)));
    }
  };
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  const int64_t len = p1 - p0;
  int64_t i = 0;
  for (; i + 2 * C <= len; i += 2 * C) {
    // bf16: into L1 (PrefetchFar measured slower here: 4096x4096 V:16:2:4 one thread 1.74-1.76
    // -> 2.09-2.10 ms; f32 2.96-3.82 -> 2.28-2.54).
    if constexpr (kBf16) {
      hwy::Prefetch(vals + i * G * vb + kPrefetchBytes);
    } else {
      PrefetchFar(vals + i * G * vb + kPrefetchBytes);
    }
    acc0 = _mm512_fmadd_ps(LoadValues<kBf16>(df, vals + i * G * vb).raw, xvec(i), acc0);
    acc1 = _mm512_fmadd_ps(LoadValues<kBf16>(df, vals + (i + C) * G * vb).raw, xvec(i + C), acc1);
  }
  for (; i + C <= len; i += C) {
    acc0 = _mm512_fmadd_ps(LoadValues<kBf16>(df, vals + i * G * vb).raw, xvec(i), acc0);
  }
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, _mm512_add_ps(acc0, acc1));
  for (int l = 0; l < 16; ++l) s[l % G] += lanes[l];
  return p0 + i;
}
#endif

// Decode, g = 2 or 4 rows sharing explicit columns (BSR, V:N:M): per column, a g-lane vector of
// values times a broadcast of x[col] (on AVX-512, 16 / g columns per vector first:
// GroupDecodeWide).
template <int G, bool kBf16>
HWY_NOINLINE void RowGroupDecodeImpl(const RowGroupWeight& w, const float* x, int64_t ldx, int64_t n,
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
        const uint8_t* v0 = vals + p0 * G * static_cast<int64_t>(vb);
        p = w.idx16 ? GroupDecodeWide<G, kBf16, true>(v0, w.col_idx.data_as<uint16_t>() + p0, p0,
                                                      p1, xt, wide)
                    : GroupDecodeWide<G, kBf16, false>(v0, w.col_idx.data_as<uint32_t>() + p0, p0,
                                                       p1, xt, wide);
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

// One group of G rows sharing columns; columns [p0, p1) (all < the k block's end).
template <int G, int NV, bool kBf16>
HWY_INLINE void RowGroupTile(const RowGroupWeight& w, int64_t p0, int64_t p1, const float* xt,
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
    if constexpr (G == 4 && NV == 3) {  // AVX2's 4x3 rows (12 accumulators of 16 registers)
      // Each row's broadcast just before its FMAs: with the four broadcasts first (the loop
      // below) GCC keeps them all live and spills three of the 12 accumulators.
      for (int64_t p = p0; p < p1; ++p) {
        const float* xp = xt + col(p) * NT;
        const auto x0 = hn::LoadU(df, xp);
        const auto x1 = hn::LoadU(df, xp + L);
        const auto x2 = hn::LoadU(df, xp + 2 * L);
        auto row = [&](int q, auto& b0, auto& b1, auto& b2) HWY_ATTR {
          const auto wq = hn::Set(df, ScalarValue<kBf16>(vals, p * G + q));
          b0 = hn::MulAdd(wq, x0, b0);
          b1 = hn::MulAdd(wq, x1, b1);
          b2 = hn::MulAdd(wq, x2, b2);
        };
        row(0, a00, a01, a02);
        row(1, a10, a11, a12);
        row(2, a20, a21, a22);
        row(3, a30, a31, a32);
      }
      return;
    }
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
HWY_NOINLINE void RowGroupTiledImpl(const RowGroupWeight& w, int64_t g0, int64_t g1, const float* xt,
                               const RowGroupBlock& blk, float* scratch, const XtNext& next) {
  const int64_t NT = NV * static_cast<int64_t>(hn::Lanes(DF()));
  const bool first = blk.first;
  int64_t gi = g0;
  XtSlicePrefetcher pf(next, G == 1 && 2 * NV <= kMaxAcc ? (g1 - g0 + 1) / 2 : g1 - g0);
  RowGroupPrefetcher wpf(w, blk, g0, g1, w.g, kBf16 ? 2 : 4);
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
    RowGroupTile<G, NV, kBf16>(w, blk.pb[gi - g0], blk.pe[gi - g0], xt, scr, first);
  }
}

// ---- Quantized row groups (V:N:M, BSR with int8 / int4 codes; RowGroupWeight::spec) ----------
// A segment (RowGroupWeight::qseg_*) holds at most one quantization group of each row: up to 128
// columns of 4 rows.
inline constexpr int64_t kMaxSegValues = 128 * 4;

// Segment i's values, [column][row in group] f32, into buf (kMaxSegValues + one vector): its codes
// dequantized with the expressions of sparq/quant.h (DequantLanes), each lane by its row's scale
// and min; the codes past the segment (padding to 16) give values nobody reads.
template <int G, int kV>
HWY_INLINE void DequantSegment(const RowGroupWeight& w, int64_t i, float* buf) {
  const DF df;
  const DI di;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  const int64_t len = (w.qseg_end[i] - w.qseg_begin[i]) * G;
  // Lane l of the vector at value e is row (e + l) % G: per-lane scales from an offset into a
  // repeating pattern (e % G is 0 unless a vector is narrower than a group of rows).
  alignas(64) float sc[hn::MaxLanes(DF()) + G], mn[hn::MaxLanes(DF()) + G];
  for (int64_t l = 0; l < L + G; ++l) {
    sc[l] = w.qscale[static_cast<size_t>(i * G + l % G)];
    mn[l] = w.qmin[static_cast<size_t>(i * G + l % G)];
  }
  const uint8_t* base = w.values.data_as<uint8_t>();
  for (int64_t e = 0; e < len; e += L) {
    const auto scale = hn::LoadU(df, sc + e % G);
    const auto min = hn::LoadU(df, mn + e % G);
    const int64_t a = w.qseg_code[i] + e;  // a multiple of L: within one 16-code chunk
    if constexpr (kV == kValI8) {
      const hn::Rebind<int8_t, DF> d8;
      const auto q = hn::PromoteTo(di, hn::LoadU(d8, reinterpret_cast<const int8_t*>(base) + a));
      hn::StoreU(DequantLanes<kV>(q, scale, min), df, buf + e);
    } else {
      const auto q = Nibbles(base + a / kNmChunk * (kNmChunk / 2), a % kNmChunk);
      hn::StoreU(DequantLanes<kV>(q, scale, min), df, buf + e);
    }
  }
}

// s[q] += sum over positions [p0, p1) of vals[p - p0][q] * xt[col(p)] (one token; vals f32).
template <int G>
HWY_INLINE void SegmentSums(const RowGroupWeight& w, const float* vals, int64_t p0, int64_t p1,
                            const float* xt, float* s) {
  const hn::CappedTag<float, G> dg;
  int64_t p = p0;
  if (hn::Lanes(dg) == G) {
    float wide[G] = {};
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
    const auto* v0 = reinterpret_cast<const uint8_t*>(vals);
    p = w.idx16 ? GroupDecodeWide<G, false, true>(v0, w.col_idx.data_as<uint16_t>() + p0, p0, p1,
                                                  xt, wide)
                : GroupDecodeWide<G, false, false>(v0, w.col_idx.data_as<uint32_t>() + p0, p0, p1,
                                                   xt, wide);
#endif
    auto acc = hn::Zero(dg);
    for (; p < p1; ++p)
      acc = hn::MulAdd(hn::LoadU(dg, vals + (p - p0) * G), hn::Set(dg, xt[w.Col(p)]), acc);
    float part[G];
    hn::StoreU(acc, dg, part);
    for (int q = 0; q < G; ++q) s[q] += wide[q] + part[q];
  } else {
    for (; p < p1; ++p) {
      for (int q = 0; q < G; ++q) s[q] += vals[(p - p0) * G + q] * xt[w.Col(p)];
    }
  }
}

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
// AVX-512 decode of group gi for T (1, 2 or 4) tokens x + t * ldx: GroupDecodeWide's loop (16 / G
// columns per vector, X spread to G lanes each) with each vector's 16 codes dequantized in
// registers (DequantLanes: the dequantized weight's values) once for the T tokens, so no value
// goes through memory. Lane l is row l % G, so a segment's scales and mins are one repeated
// G-lane pattern; the segments of the group share the accumulators, reduced once per token at the
// end (s[t][q] = row q's sum). A segment's last vector gathers only its own columns (masked: the
// lanes past it multiply 0, and the index load stops at the segment's end). Not inlined into the
// caller: inlined, the three token counts' loops shared its registers and the 4-token one ran
// 1.5-1.8x slower. Before (each segment dequantized into an L1 buffer, then reloaded, its sums
// reduced per segment, each token alone; Zen 5, V:8:2:4 4096 x 4096 int4, one thread): 2.1-2.3 ms
// one token, 7.6 ms four; now 0.88 and 1.74 (docs/measurements/zen5-rowgroup-decode-2026-12-07.md).
template <int G, int kV, bool kIdx16, int T>
HWY_NOINLINE void QuantGroupDecodeWide(const RowGroupWeight& w, int64_t gi, const float* x,
                                       int64_t ldx, float (*s)[G]) {
  static_assert(G == 2 || G == 4);
  static_assert(T == 1 || T == 2 || T == 4);
  constexpr int64_t C = 16 / G;
  const __m512i rep = G == 4 ? _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0)
                             : _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
  const uint8_t* base = w.values.data_as<uint8_t>();
  const uint16_t* c16 = kIdx16 ? w.col_idx.data_as<uint16_t>() : nullptr;
  const uint32_t* c32 = kIdx16 ? nullptr : w.col_idx.data_as<uint32_t>();
  // The C column indices at position p (the first `live` of them; the others read as column 0).
  auto indices = [&](int64_t p, int live) -> __m256i {
    const __mmask8 m = static_cast<__mmask8>((1u << live) - 1u);
    if constexpr (G == 4) {
      return _mm256_castsi128_si256(kIdx16 ? _mm_cvtepu16_epi32(_mm_maskz_loadu_epi16(m, c16 + p))
                                           : _mm_maskz_loadu_epi32(m, c32 + p));
    } else {
      return kIdx16 ? _mm256_cvtepu16_epi32(_mm_maskz_loadu_epi16(m, c16 + p))
                    : _mm256_maskz_loadu_epi32(m, c32 + p);
    }
  };
  // X of token row xt at those columns, each spread to its G lanes (0 past `live`).
  auto gather = [&](const float* xt, __m256i idx, int live) -> __m512 {
    if constexpr (G == 4) {
      const __m128i i4 = _mm256_castsi256_si128(idx);
      const __m128 g =
          live == C ? _mm_i32gather_ps(xt, i4, 4)
                    : _mm_mmask_i32gather_ps(_mm_setzero_ps(),
                                             static_cast<__mmask8>((1u << live) - 1u), i4, xt, 4);
      return _mm512_permutexvar_ps(rep, _mm512_castps128_ps512(g));
    } else {
      const __m256 g = live == C ? _mm256_i32gather_ps(xt, idx, 4)
                                 : _mm256_mmask_i32gather_ps(
                                       _mm256_setzero_ps(),
                                       static_cast<__mmask8>((1u << live) - 1u), idx, xt, 4);
      return _mm512_permutexvar_ps(rep, _mm512_castps256_ps512(g));
    }
  };
  // The 16 values of a segment's vector j (codes from value index a = its first code).
  auto values = [&](int64_t a, __m512 scale, __m512 min) -> __m512 {
    if constexpr (kV == kValI8) {
      const __m512i q =
          _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(base + a)));
      return DequantLanes<kV>(hn::Vec<DI>{q}, hn::Vec<DF>{scale}, hn::Vec<DF>{min}).raw;
    } else {
      return DequantLanes<kV>(Nibbles(base + a / 2, 0), hn::Vec<DF>{scale}, hn::Vec<DF>{min}).raw;
    }
  };
  const float* x0 = x;
  const float* x1 = T > 1 ? x + ldx : x;
  const float* x2 = T > 2 ? x + 2 * ldx : x;
  const float* x3 = T > 2 ? x + 3 * ldx : x;
  // Two chains per token (vectors alternate between a_t and b_t), the same for any T: a token's
  // sums do not depend on how many tokens run beside it.
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
  for (int64_t i = w.qseg_ptr[gi]; i < w.qseg_ptr[gi + 1]; ++i) {
    __m512 scale, min = _mm512_setzero_ps();
    const size_t sq = static_cast<size_t>(i * G);
    if constexpr (G == 4) {
      scale = _mm512_broadcast_f32x4(_mm_loadu_ps(&w.qscale[sq]));
      if constexpr (kV == kValI4) min = _mm512_broadcast_f32x4(_mm_loadu_ps(&w.qmin[sq]));
    } else {
      double pair;  // the two rows' f32 scales (mins) as one 64-bit lane pattern
      std::memcpy(&pair, &w.qscale[sq], 8);
      scale = _mm512_castpd_ps(_mm512_set1_pd(pair));
      if constexpr (kV == kValI4) {
        std::memcpy(&pair, &w.qmin[sq], 8);
        min = _mm512_castpd_ps(_mm512_set1_pd(pair));
      }
    }
    const int64_t p1 = w.qseg_end[i];
    int64_t p = w.qseg_begin[i];
    int64_t a = w.qseg_code[i];
    hwy::Prefetch(base + (kV == kValI8 ? a : a / 2) + kPrefetchBytes);
    // Each token's FMA of v with its X vector xv(token row) into chain a or b.
    auto fmas = [&](__m512 v, bool second, auto&& xv) {
      if (second) {
        b0 = _mm512_fmadd_ps(v, xv(x0), b0);
        if constexpr (T > 1) b1 = _mm512_fmadd_ps(v, xv(x1), b1);
        if constexpr (T > 2) {
          b2 = _mm512_fmadd_ps(v, xv(x2), b2);
          b3 = _mm512_fmadd_ps(v, xv(x3), b3);
        }
      } else {
        a0 = _mm512_fmadd_ps(v, xv(x0), a0);
        if constexpr (T > 1) a1 = _mm512_fmadd_ps(v, xv(x1), a1);
        if constexpr (T > 2) {
          a2 = _mm512_fmadd_ps(v, xv(x2), a2);
          a3 = _mm512_fmadd_ps(v, xv(x3), a3);
        }
      }
    };
    // One vector of C columns (`live` of them in the segment): its values once, then each
    // token's X and FMA (4 whole columns: broadcast loads, BroadcastColumns4; else a gather).
    auto step = [&](int live, bool second) {
      const __m512 v = values(a, scale, min);
      if (G == 4 && live == C) {
        const void* cp =
            kIdx16 ? static_cast<const void*>(c16 + p) : static_cast<const void*>(c32 + p);
        fmas(v, second, [&](const float* xt) { return BroadcastColumns4<kIdx16>(xt, cp); });
      } else {
        const __m256i idx = indices(p, live);
        fmas(v, second, [&](const float* xt) { return gather(xt, idx, live); });
      }
      p += C;
      a += 16;
    };
    for (; p + 2 * C <= p1;) {
      step(C, false);
      step(C, true);
    }
    if (p + C <= p1) step(C, false);
    if (p < p1) step(static_cast<int>(p1 - p), true);
  }
  auto reduce = [&](__m512 acc, float* out) {
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, acc);
    for (int l = 0; l < 16; ++l) out[l % G] += lanes[l];
  };
  reduce(_mm512_add_ps(a0, b0), s[0]);
  if constexpr (T > 1) reduce(_mm512_add_ps(a1, b1), s[1]);
  if constexpr (T > 2) {
    reduce(_mm512_add_ps(a2, b2), s[2]);
    reduce(_mm512_add_ps(a3, b3), s[3]);
  }
}
#endif

// Decode: on AVX-512 each vector of codes dequantized in registers for up to 4 tokens
// (QuantGroupDecodeWide); elsewhere each segment dequantized once into an L1 buffer, then its
// products for the n tokens.
template <int G, int kV>
HWY_NOINLINE void RowGroupQuantDecodeImpl(const RowGroupWeight& w, const float* x, int64_t ldx,
                                          int64_t n, int64_t g0, int64_t g1, float* raw) {
  const int64_t rows = w.group_row[g1] - w.group_row[g0];
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  for (int64_t gi = g0; gi < g1; ++gi) {
    const int64_t nrows = w.group_row[gi + 1] - w.group_row[gi];
    const int64_t r = w.group_row[gi] - w.group_row[g0];
    for (int64_t t = 0; t < n;) {
      float s[4][G] = {};
      const float* xt = x + t * ldx;
      const int T = n - t >= 4 ? 4 : n - t >= 2 ? 2 : 1;
      if (T == 4) {
        w.idx16 ? QuantGroupDecodeWide<G, kV, true, 4>(w, gi, xt, ldx, s)
                : QuantGroupDecodeWide<G, kV, false, 4>(w, gi, xt, ldx, s);
      } else if (T == 2) {
        w.idx16 ? QuantGroupDecodeWide<G, kV, true, 2>(w, gi, xt, ldx, s)
                : QuantGroupDecodeWide<G, kV, false, 2>(w, gi, xt, ldx, s);
      } else {
        w.idx16 ? QuantGroupDecodeWide<G, kV, true, 1>(w, gi, xt, ldx, s)
                : QuantGroupDecodeWide<G, kV, false, 1>(w, gi, xt, ldx, s);
      }
      for (int tt = 0; tt < T; ++tt) {
        for (int q = 0; q < nrows; ++q) raw[(t + tt) * rows + r + q] = s[tt][q];
      }
      t += T;
    }
  }
#else
  alignas(64) float buf[kMaxSegValues + 64];
  constexpr int64_t kMaxN = 16;
  float s[kMaxN][G];
  for (int64_t gi = g0; gi < g1; ++gi) {
    const int64_t nrows = w.group_row[gi + 1] - w.group_row[gi];
    const int64_t r = w.group_row[gi] - w.group_row[g0];
    for (int64_t t0 = 0; t0 < n; t0 += kMaxN) {
      const int64_t nt = std::min(kMaxN, n - t0);
      for (int64_t t = 0; t < nt; ++t) {
        for (int q = 0; q < G; ++q) s[t][q] = 0.0f;
      }
      for (int64_t i = w.qseg_ptr[gi]; i < w.qseg_ptr[gi + 1]; ++i) {
        DequantSegment<G, kV>(w, i, buf);
        for (int64_t t = 0; t < nt; ++t) {
          SegmentSums<G>(w, buf, w.qseg_begin[i], w.qseg_end[i], x + (t0 + t) * ldx, s[t]);
        }
      }
      for (int64_t t = 0; t < nt; ++t) {
        for (int q = 0; q < nrows; ++q) raw[(t0 + t) * rows + r + q] = s[t][q];
      }
    }
  }
#endif
}

// Groups [g0, g1) as f32 row-group values ([column][row], as an f32 RowGroupWeight holds them) at
// out + position * G: the tiled rows' f32 twin of the codes (RunRowGroupQuantTiled).
template <int G, int kV>
HWY_NOINLINE void RowGroupDequantImpl(const RowGroupWeight& w, int64_t g0, int64_t g1, float* out) {
  alignas(64) float buf[kMaxSegValues + 64];
  for (int64_t i = w.qseg_ptr[g0]; i < w.qseg_ptr[g1]; ++i) {
    DequantSegment<G, kV>(w, i, buf);
    std::memcpy(out + w.qseg_begin[i] * G, buf,
                static_cast<size_t>((w.qseg_end[i] - w.qseg_begin[i]) * G) * sizeof(float));
  }
}

}  // namespace sparq::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // SPARQ_CPU_ROW_GROUPS_INL_H_
