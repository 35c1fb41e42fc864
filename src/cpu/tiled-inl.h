// The accumulator block of the tiled kernels (G rows x NV vectors of one token tile, spelled out:
// no vectors in arrays) and the one- or two-row loop over kept weights that CSR and bit-mask rows
// share.
#if defined(SPARQ_CPU_TILED_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SPARQ_CPU_TILED_INL_H_
#undef SPARQ_CPU_TILED_INL_H_
#else
#define SPARQ_CPU_TILED_INL_H_
#endif

#include "src/cpu/simd-inl.h"
#include "src/cpu/tiled_acc.h"

HWY_BEFORE_NAMESPACE();
namespace sparq::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

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

}  // namespace sparq::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // SPARQ_CPU_TILED_INL_H_
