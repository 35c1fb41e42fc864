// CSR rows (layout kRowGroups with groups of one row and explicit columns): decode gathers X by the
// column indices; tiled runs two rows at a time against X^T, or narrow tiles for n <= 8.
#if defined(SPARQ_CPU_CSR_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SPARQ_CPU_CSR_INL_H_
#undef SPARQ_CPU_CSR_INL_H_
#else
#define SPARQ_CPU_CSR_INL_H_
#endif

#include "src/cpu/simd-inl.h"
#include "src/cpu/prefetch-inl.h"
#include "src/cpu/tiled-inl.h"

HWY_BEFORE_NAMESPACE();
namespace sparq::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Column indices col_idx[p, p + L) as i32 lanes.
template <bool kIdx16>
HWY_INLINE hn::Vec<DI> ColumnVector(const RowGroupWeight& w, int64_t p) {
  if constexpr (kIdx16) {
    const hn::Rebind<uint16_t, DF> d16;
    return hn::BitCast(DI(), hn::PromoteTo(DU(), hn::LoadU(d16, w.col_idx.data_as<uint16_t>() + p)));
  } else {
    return hn::BitCast(DI(), hn::LoadU(DU(), w.col_idx.data_as<uint32_t>() + p));
  }
}

// Decode, row groups. g = 1 with explicit columns: gather X by the column indices.
template <bool kIdx16, bool kBf16>
HWY_NOINLINE void CsrDecodeImpl(const RowGroupWeight& w, const float* x, int64_t ldx, int64_t n,
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

// Two CSR rows (g = 1 groups) at once, columns [pa0, pa1) and [pb0, pb1).
template <int NV, bool kBf16>
HWY_INLINE void CsrTiledPair(const RowGroupWeight& w, int64_t pa0, int64_t pa1, int64_t pb0,
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

// CSR rows (g = 1, explicit columns) on a token tile narrower than one vector: kNt (4 or 8) tokens
// in a 128- / 256-bit vector, for n <= kNt on targets with wider vectors (the *_csr_tiled_2x4tok
// and 2x8tok rows: n <= 4 on AVX2 and AVX-512, n <= 8 on AVX-512). At n = 4
// the 16-token tile read a whole 64-byte line of X^T per kept weight and its X^T (k x 16 floats,
// 256 KiB at k = 4096) sat in L2; with 4 tokens a kept weight reads 16 bytes and X^T (64 KiB) is
// mostly in L1. Two rows at a time, each with two partial sums (kept weight i into sum i % 2,
// whatever the other row's length, so a row's bits do not depend on its partner): four FMA chains
// where the pairs of RowGroupTiledImpl have two. The same kernel on one full 16-token vector (n = 9-16
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
HWY_NOINLINE void CsrNarrowImpl(const RowGroupWeight& w, int64_t g0, int64_t g1, const float* xt,
                                const RowGroupBlock& blk, float* scratch, const XtNext& next) {
  constexpr int64_t NT = static_cast<int64_t>(kNt);
  const void* vals = w.values.data();
  XtSlicePrefetcher pf(next, (g1 - g0 + 1) / 2);
  RowGroupPrefetcher wpf(w, blk, g0, g1, 1, kBf16 ? 2 : 4);
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

}  // namespace sparq::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // SPARQ_CPU_CSR_INL_H_
