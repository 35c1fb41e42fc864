// MaskAndApply2of4 and SgdMomentumRun (src/train/sparse24.h) on Highway's best target, built
// with -ffp-contract=off: each lane multiplies and adds as the scalar loops do (no FMA), so every
// target gives their bits. The mask: each 128-bit block of f32 lanes is one group of 4; the
// group's other three |w| come from in-block rotations, each lane counts those that outrank it
// by MaskRow2of4's rule and keeps itself below 2. The scalar rule ran ~5 ns a weight here (GCC
// -O2 leaves its comparisons scalar): a sixth of a Fashion-MNIST 2:4 run's time.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/train/sparse24_simd.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <cstdint>

#include "src/train/sparse24.h"

HWY_BEFORE_NAMESPACE();
namespace sparq::train::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

void MaskAndApply2of4T(const float* HWY_RESTRICT w, int64_t count, uint8_t* HWY_RESTRICT mask,
                       float* HWY_RESTRICT weff) {
  int64_t i = 0;
#if HWY_TARGET != HWY_SCALAR  // one lane: no groups in a vector
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<uint8_t, decltype(df)> d8;
  const auto L = static_cast<int64_t>(hn::Lanes(df));
  // Position p of each lane in its group; the rotation by s brings lane (p + s) % 4 to p, which
  // lies before p exactly when p >= 4 - s (then a tie outranks: the lower index wins).
  const auto pos = hn::And(hn::Iota(di, 0), hn::Set(di, 3));
  const auto before1 = hn::RebindMask(df, hn::Gt(pos, hn::Set(di, 2)));
  const auto before2 = hn::RebindMask(df, hn::Gt(pos, hn::Set(di, 1)));
  const auto before3 = hn::RebindMask(df, hn::Gt(pos, hn::Set(di, 0)));
  const auto one = hn::Set(di, 1);
  auto outranks = [&](auto other, auto a, auto before) {
    return hn::Or(hn::And(before, hn::Ge(other, a)), hn::AndNot(before, hn::Gt(other, a)));
  };
  for (; i + L <= count; i += L) {
    const auto v = hn::LoadU(df, w + i);
    const auto a = hn::Abs(v);
    // 0 / 1 per outranking neighbour, summed.
    auto above =
        hn::IfThenElseZero(hn::RebindMask(di, outranks(hn::Shuffle0321(a), a, before1)), one);
    above = hn::Add(above, hn::IfThenElseZero(
                               hn::RebindMask(di, outranks(hn::Shuffle1032(a), a, before2)), one));
    above = hn::Add(above, hn::IfThenElseZero(
                               hn::RebindMask(di, outranks(hn::Shuffle2103(a), a, before3)), one));
    const auto keep = hn::Gt(hn::Set(di, 2), above);
    hn::StoreU(hn::IfThenElseZero(hn::RebindMask(df, keep), v), df, weff + i);
    hn::StoreU(hn::DemoteTo(d8, hn::IfThenElseZero(keep, one)), d8, mask + i);
  }
#endif
  // The rest (fewer than a vector's groups), as the scalar reference.
  MaskRow2of4(w + i, count - i, mask + i);
  for (; i < count; ++i) weff[i] = mask[i] ? w[i] : 0.0f;
}

void SgdMomentumRunT(const float* HWY_RESTRICT g, const uint8_t* HWY_RESTRICT mask, int64_t count,
                     float mu, float lr, float lambda, float* HWY_RESTRICT v, float* HWY_RESTRICT w,
                     float* HWY_RESTRICT weff) {
  int64_t i = 0;
#if HWY_TARGET != HWY_SCALAR
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<uint8_t, decltype(df)> d8;
  const auto L = static_cast<int64_t>(hn::Lanes(df));
  const auto vmu = hn::Set(df, mu), vlr = hn::Set(df, lr), vlambda = hn::Set(df, lambda);
  for (; i + L <= count; i += L) {
    const auto gi = hn::LoadU(df, g + i);
    auto wi = hn::LoadU(df, w + i);
    auto x = gi;
    auto keep = hn::FirstN(df, static_cast<size_t>(L));  // every lane (dense)
    if (mask != nullptr) {
      keep = hn::RebindMask(df, hn::Ne(hn::PromoteTo(di, hn::LoadU(d8, mask + i)), hn::Zero(di)));
      x = hn::IfThenElse(keep, gi, hn::Add(gi, hn::Mul(vlambda, wi)));
    }
    const auto vi = hn::Add(hn::Mul(vmu, hn::LoadU(df, v + i)), x);
    wi = hn::Sub(wi, hn::Mul(vlr, vi));
    hn::StoreU(vi, df, v + i);
    hn::StoreU(wi, df, w + i);
    if (weff != nullptr) hn::StoreU(hn::IfThenElseZero(keep, wi), df, weff + i);
  }
#endif
  for (; i < count; ++i) {
    const bool kept = mask == nullptr || mask[i] != 0;
    v[i] = mu * v[i] + (kept ? g[i] : g[i] + lambda * w[i]);
    w[i] -= lr * v[i];
    if (weff != nullptr) weff[i] = kept ? w[i] : 0.0f;
  }
}

const char* MaskAndApply2of4TargetT() { return hwy::TargetName(HWY_TARGET); }

}  // namespace sparq::train::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace sparq::train {

HWY_EXPORT(MaskAndApply2of4T);
HWY_EXPORT(MaskAndApply2of4TargetT);
HWY_EXPORT(SgdMomentumRunT);

void MaskAndApply2of4(const float* w, int64_t count, uint8_t* mask, float* weff) {
  HWY_DYNAMIC_DISPATCH(MaskAndApply2of4T)(w, count, mask, weff);
}

void SgdMomentumRun(const float* g, const uint8_t* mask, int64_t count, float mu, float lr,
                    float lambda, float* v, float* w, float* weff) {
  HWY_DYNAMIC_DISPATCH(SgdMomentumRunT)(g, mask, count, mu, lr, lambda, v, w, weff);
}

const char* MaskAndApply2of4Target() { return HWY_DYNAMIC_DISPATCH(MaskAndApply2of4TargetT)(); }

}  // namespace sparq::train
#endif
