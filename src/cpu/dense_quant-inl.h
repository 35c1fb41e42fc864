// Dense quantized kernels (layout kDenseQuant, spmm_packed.h): int8 / int4 codes of every column
// dequantized in registers with the expressions of sparq/quant.h. Decode (few tokens) streams the
// codes once against contiguous X; tiled (many tokens) dequantizes each chunk of 16 columns into
// the offsets / values block of the N:M tiled kernel and runs its FMA loop (NmComputeRows).
#if defined(SPARQ_CPU_DENSE_QUANT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SPARQ_CPU_DENSE_QUANT_INL_H_
#undef SPARQ_CPU_DENSE_QUANT_INL_H_
#else
#define SPARQ_CPU_DENSE_QUANT_INL_H_
#endif

#include "src/cpu/nm-inl.h"
#include "src/cpu/prefetch-inl.h"
#include "src/cpu/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace sparq::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Columns [c, c + L) of a row (c a multiple of L; a vector lies in one chunk and one group) as
// f32: codes at `row`, the row's scales (and mins) at sc (mn). Same expressions as Dequantize.
template <int kV>
HWY_INLINE hn::Vec<DF> DqValues(const uint8_t* row, const float* sc, const float* mn, int shift,
                                int64_t c) {
  const DF df;
  const auto scale = hn::Set(df, sc[c >> shift]);
  hn::Vec<DF> min = hn::Zero(df);
  if constexpr (kV == kValI4) min = hn::Set(df, mn[c >> shift]);
  if constexpr (kV == kValI8) {
    const hn::Rebind<int8_t, DF> d8;
    const auto q = hn::PromoteTo(DI(), hn::LoadU(d8, reinterpret_cast<const int8_t*>(row) + c));
    return DequantLanes<kV>(q, scale, min);
  } else {
    return DequantLanes<kV>(Nibbles(row + c / kDqChunk * (kDqChunk / 2), c % kDqChunk), scale, min);
  }
}

// Decode: raw[t][r - r0] = sum over columns of W[r, c] * xpad[t][c] (k_pad floats, zero past
// cols), R rows x T tokens in lockstep (each dequantized vector serves T tokens, each X vector R
// rows). Every (row, token) sum runs lane-wise over k then reduces, whatever R and T: the blocking
// changes no bits.
template <int kV, int R, int T>
HWY_INLINE void DqDecodeRows(const DenseQuantWeight& w, const float* xpad, int64_t t0, int64_t r,
                             int64_t r0, int64_t r1, float* raw) {
  static_assert(R >= 1 && R <= 4 && T >= 1 && T <= 4);
  const DF df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  const int64_t rb = w.row_bytes();
  const uint8_t* codes = w.codes.data_as<uint8_t>() + r * rb;
  const float* sc = w.scales.data() + r * w.groups_per_row;
  const float* mn = w.values.has_min() ? w.mins.data() + r * w.groups_per_row : nullptr;
  const int64_t gpr = w.groups_per_row;
  const float* x0 = xpad + t0 * w.k_pad;
  const float* x1 = x0 + (T > 1 ? w.k_pad : 0);
  const float* x2 = x0 + (T > 2 ? 2 * w.k_pad : 0);
  const float* x3 = x0 + (T > 3 ? 3 * w.k_pad : 0);
  auto a00 = hn::Zero(df), a01 = hn::Zero(df), a02 = hn::Zero(df), a03 = hn::Zero(df);
  auto a10 = hn::Zero(df), a11 = hn::Zero(df), a12 = hn::Zero(df), a13 = hn::Zero(df);
  auto a20 = hn::Zero(df), a21 = hn::Zero(df), a22 = hn::Zero(df), a23 = hn::Zero(df);
  auto a30 = hn::Zero(df), a31 = hn::Zero(df), a32 = hn::Zero(df), a33 = hn::Zero(df);
  for (int64_t c = 0; c < w.k_pad; c += L) {
    // One cache line ahead per row stream every 64 code bytes (the R streams lie a row apart, in
    // other pages, so the hardware prefetchers start each late).
    if (c % 64 == 0) {
      for (int q = 0; q < R; ++q) PrefetchFar(codes + q * rb + (kV == kValI8 ? c : c / 2) + 512);
    }
    hn::Vec<DF> xv0, xv1, xv2, xv3;
    if constexpr (T > 0) xv0 = hn::LoadU(df, x0 + c);
    if constexpr (T > 1) xv1 = hn::LoadU(df, x1 + c);
    if constexpr (T > 2) xv2 = hn::LoadU(df, x2 + c);
    if constexpr (T > 3) xv3 = hn::LoadU(df, x3 + c);
#define SPARQ_DQ_TOKEN(q, t) \
  if constexpr (T > t) a##q##t = hn::MulAdd(v, xv##t, a##q##t);
#define SPARQ_DQ_ROW(q)                                                                            \
  if constexpr (R > q) {                                                                           \
    const auto v =                                                                                 \
        DqValues<kV>(codes + q * rb, sc + q * gpr, mn ? mn + q * gpr : nullptr, w.group_shift, c); \
    SPARQ_DQ_TOKEN(q, 0)                                                                           \
    SPARQ_DQ_TOKEN(q, 1)                                                                           \
    SPARQ_DQ_TOKEN(q, 2)                                                                           \
    SPARQ_DQ_TOKEN(q, 3)                                                                           \
  }
    SPARQ_DQ_ROW(0)
    SPARQ_DQ_ROW(1)
    SPARQ_DQ_ROW(2)
    SPARQ_DQ_ROW(3)
#undef SPARQ_DQ_ROW
#undef SPARQ_DQ_TOKEN
  }
  float* out = raw + t0 * (r1 - r0) + (r - r0);
#define SPARQ_DQ_OUT(q, t) \
  if constexpr (R > q && T > t) out[t * (r1 - r0) + q] = hn::GetLane(hn::SumOfLanes(df, a##q##t))
#define SPARQ_DQ_OUT_ROW(q) \
  SPARQ_DQ_OUT(q, 0);       \
  SPARQ_DQ_OUT(q, 1);       \
  SPARQ_DQ_OUT(q, 2);       \
  SPARQ_DQ_OUT(q, 3)
  SPARQ_DQ_OUT_ROW(0);
  SPARQ_DQ_OUT_ROW(1);
  SPARQ_DQ_OUT_ROW(2);
  SPARQ_DQ_OUT_ROW(3);
#undef SPARQ_DQ_OUT_ROW
#undef SPARQ_DQ_OUT
}

template <int kV, int R>
HWY_INLINE void DqDecodeRowTokens(const DenseQuantWeight& w, const float* xpad, int64_t n,
                                  int64_t r, int64_t r0, int64_t r1, float* raw) {
  constexpr int T = kNmDecodeTokens;
  int64_t t = 0;
  for (; t + T <= n; t += T) DqDecodeRows<kV, R, T>(w, xpad, t, r, r0, r1, raw);
  if constexpr (T > 2) {
    for (; t + 2 <= n; t += 2) DqDecodeRows<kV, R, 2>(w, xpad, t, r, r0, r1, raw);
  }
  for (; t < n; ++t) DqDecodeRows<kV, R, 1>(w, xpad, t, r, r0, r1, raw);
}

template <int kV>
HWY_NOINLINE void DqDecodeImpl(const DenseQuantWeight& w, const float* xpad, int64_t n, int64_t r0,
                               int64_t r1, float* raw) {
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) DqDecodeRowTokens<kV, 4>(w, xpad, n, r, r0, r1, raw);
  for (; r < r1; ++r) DqDecodeRowTokens<kV, 1>(w, xpad, n, r, r0, r1, raw);
}

// Chunk c of R rows dequantized into the N:M tiled block (NmDecoded<R, 1>): X^T offsets
// (column * NT: every row reads the same columns) and values.
template <int kV, int R>
HWY_INLINE void DqDecodeChunk(const DenseQuantWeight& w, int64_t r, int64_t c, int32_t nt,
                              NmDecoded<R, 1>& d) {
  const DF df;
  const DI di;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  const int64_t rb = w.row_bytes(), gpr = w.groups_per_row;
  const uint8_t* codes = w.codes.data_as<uint8_t>() + r * rb;
  const float* sc = w.scales.data() + r * gpr;
  const float* mn = w.values.has_min() ? w.mins.data() + r * gpr : nullptr;
  for (int64_t p = 0; p < kDqChunk; p += L) {
    const int64_t col = c * kDqChunk + p;
    const auto off =
        hn::Mul(hn::Add(hn::Iota(di, 0), hn::Set(di, static_cast<int32_t>(col))), hn::Set(di, nt));
    for (int q = 0; q < R; ++q) {
      hn::Store(off, di, d.off + q * kNmChunk + p);
      hn::Store(DqValues<kV>(codes + q * rb, sc + q * gpr, mn ? mn + q * gpr : nullptr,
                             w.group_shift, col),
                df, d.wv + q * kNmChunk + p);
    }
  }
}

// Rows [r0, r1) dequantized into out [row - r0][k_pad], the values every other row multiplies: the
// sgemm rows' panel (which reads the first cols of each row: a padded zero code with a min is
// the min, not 0).
template <int kV>
HWY_NOINLINE void DqDequantRows(const DenseQuantWeight& w, int64_t r0, int64_t r1, float* out) {
  const DF df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  const int64_t rb = w.row_bytes(), gpr = w.groups_per_row;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* codes = w.codes.data_as<uint8_t>() + r * rb;
    const float* sc = w.scales.data() + r * gpr;
    const float* mn = w.values.has_min() ? w.mins.data() + r * gpr : nullptr;
    float* o = out + (r - r0) * w.k_pad;
    for (int64_t c = 0; c < w.k_pad; c += L) {
      hn::StoreU(DqValues<kV>(codes, sc, mn, w.group_shift, c), df, o + c);
    }
  }
}

// Tiled: rows [r0, r1) over chunks [c0, c1) of X^T tile xt (NV vectors), partial sums in scratch
// [row][NT] (started from zero at c0 == 0). Rows run 4, 2 or 1 at a time as the N:M tiled rows.
template <int kV, int NV>
HWY_NOINLINE void DqTiledImpl(const DenseQuantWeight& w, int64_t r0, int64_t r1, const float* xt,
                              int64_t c0, int64_t c1, float* scratch, const XtNext& next) {
  const int32_t NT = static_cast<int32_t>(NV * hn::Lanes(DF()));
  constexpr int kRows = 4 * NV <= kMaxAcc ? 4 : 2 * NV <= kMaxAcc ? 2 : 1;
  XtSlicePrefetcher pf(next, (r1 - r0 + kRows - 1) / kRows);
  auto rows = [&](auto rr, int64_t r) {
    constexpr int R = decltype(rr)::value;
    NmDecoded<R, 1> d;
    NmComputeRows<NV, R>(
        c1 - c0,
        [&](int64_t c) {
          DqDecodeChunk<kV, R>(w, r, c0 + c, NT, d);
          return std::pair<const int32_t*, const float*>(d.off, d.wv);
        },
        xt, scratch + (r - r0) * NT, c0 == 0);
  };
  int64_t r = r0;
  for (; r + kRows <= r1; r += kRows) {
    pf.Step();
    rows(std::integral_constant<int, kRows>(), r);
  }
  for (; r < r1; ++r) {
    pf.Step();
    rows(std::integral_constant<int, 1>(), r);
  }
}

}  // namespace sparq::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // SPARQ_CPU_DENSE_QUANT_INL_H_
