// The epilogue every kernel applies to its raw sums: bias, activation, residual.
#if defined(SPARQ_CPU_EPILOGUE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SPARQ_CPU_EPILOGUE_INL_H_
#undef SPARQ_CPU_EPILOGUE_INL_H_
#else
#define SPARQ_CPU_EPILOGUE_INL_H_
#endif

#include "src/cpu/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace sparq::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

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

}  // namespace sparq::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // SPARQ_CPU_EPILOGUE_INL_H_
