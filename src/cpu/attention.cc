// Decode attention over a KV cache, vectorized with Highway (the model's own code is built for
// baseline x86-64, where these loops ran scalar: 17% of a 2-thread decode at 512 tokens of
// context). Sums run in a fixed order, independent of the thread count.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/cpu/attention.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

#include <algorithm>
#include <cmath>

#include "src/cpu/attention.h"

HWY_BEFORE_NAMESPACE();
namespace sparq::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// s[j] = exp(s[j] - mx) for j < len, through Highway's Exp (max error 1 ulp) with a scalar tail;
// returns the sum, accumulated in vector lanes. Shared by decode attention and the prompt softmax.
template <class D>
HWY_INLINE double ExpMinusMaxSum(D df, float* s, int64_t len, float mx) {
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  const auto vmx = hn::Set(df, mx);
  auto vsum = hn::Zero(df);
  int64_t j = 0;
  for (; j + L <= len; j += L) {
    const auto ev = hn::Exp(df, hn::Sub(hn::LoadU(df, s + j), vmx));
    hn::StoreU(ev, df, s + j);
    vsum = hn::Add(vsum, ev);
  }
  double sum = hn::GetLane(hn::SumOfLanes(df, vsum));
  for (; j < len; ++j) {
    s[j] = std::exp(s[j] - mx);
    sum += s[j];
  }
  return sum;
}

void AttendPartialT(const float* q, const float* k, const float* v, int64_t len, int64_t stride,
                    int64_t hd, float scale, float* scores, AttendPartial* part) {
  const hn::ScalableTag<float> df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  const int64_t hv = hd / L * L;  // vector part of a head
  float mx = -INFINITY;
  for (int64_t j = 0; j < len; ++j) {
    const float* kj = k + j * stride;
    auto acc0 = hn::Zero(df), acc1 = hn::Zero(df);
    int64_t e = 0;
    for (; e + 2 * L <= hv; e += 2 * L) {
      acc0 = hn::MulAdd(hn::LoadU(df, q + e), hn::LoadU(df, kj + e), acc0);
      acc1 = hn::MulAdd(hn::LoadU(df, q + e + L), hn::LoadU(df, kj + e + L), acc1);
    }
    if (e < hv) acc0 = hn::MulAdd(hn::LoadU(df, q + e), hn::LoadU(df, kj + e), acc0);
    float s = hn::GetLane(hn::SumOfLanes(df, hn::Add(acc0, acc1)));
    for (e = hv; e < hd; ++e) s += q[e] * kj[e];
    scores[j] = s * scale;
    mx = std::max(mx, scores[j]);
  }
  // exp(s - max) in vectors (libm's expf per score was 2% of a whole decode at 512 tokens of
  // context).
  const double sum = ExpMinusMaxSum(df, scores, len, mx);
  part->max = mx;
  part->sum = sum;
  float* out = part->out;
  // out = sum_j e_j v_j, up to 4 vectors of the head at a time held in registers across j (a
  // load-add-store of out per j would chain every j through store forwarding).
  int64_t e = 0;
  while (e < hv) {
    const int64_t nv = std::min<int64_t>(4, (hv - e) / L);
    auto o0 = hn::Zero(df), o1 = hn::Zero(df), o2 = hn::Zero(df), o3 = hn::Zero(df);
    for (int64_t j = 0; j < len; ++j) {
      const float* vj = v + j * stride + e;
      const auto pv = hn::Set(df, scores[j]);
      o0 = hn::MulAdd(pv, hn::LoadU(df, vj), o0);
      if (nv > 1) o1 = hn::MulAdd(pv, hn::LoadU(df, vj + L), o1);
      if (nv > 2) o2 = hn::MulAdd(pv, hn::LoadU(df, vj + 2 * L), o2);
      if (nv > 3) o3 = hn::MulAdd(pv, hn::LoadU(df, vj + 3 * L), o3);
    }
    hn::StoreU(o0, df, out + e);
    if (nv > 1) hn::StoreU(o1, df, out + e + L);
    if (nv > 2) hn::StoreU(o2, df, out + e + 2 * L);
    if (nv > 3) hn::StoreU(o3, df, out + e + 3 * L);
    e += nv * L;
  }
  for (; e < hd; ++e) {
    float acc = 0.0f;
    for (int64_t j = 0; j < len; ++j) acc += scores[j] * v[j * stride + e];
    out[e] = acc;
  }
}

// In-place softmax of s[0, len): the prefill attention's rows, exp through Highway's Exp as above
// (libm's expf per score was 2.6% of a 512-token prefill of SmolLM2 2:4, one thread).
void SoftmaxRowT(float* s, int64_t len) {
  const hn::ScalableTag<float> df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  auto vmax = hn::Set(df, s[0]);
  int64_t j = 0;
  for (; j + L <= len; j += L) vmax = hn::Max(vmax, hn::LoadU(df, s + j));
  float mx = hn::GetLane(hn::MaxOfLanes(df, vmax));
  for (; j < len; ++j) mx = std::max(mx, s[j]);
  const double sum = ExpMinusMaxSum(df, s, len, mx);
  const auto inv = hn::Set(df, static_cast<float>(1.0 / sum));
  for (j = 0; j + L <= len; j += L) hn::StoreU(hn::Mul(hn::LoadU(df, s + j), inv), df, s + j);
  for (; j < len; ++j) s[j] *= hn::GetLane(inv);
}

// The target this copy was compiled for (AttentionTarget).
int64_t CompiledTargetT() { return HWY_TARGET; }

}  // namespace sparq::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace sparq::cpu {
HWY_EXPORT(AttendPartialT);
HWY_EXPORT(SoftmaxRowT);
HWY_EXPORT(CompiledTargetT);

void SoftmaxRow(const KernelConfig& cfg, float* s, int64_t len) {
  if (len > 0) HWY_DISPATCH_TABLE(SoftmaxRowT)[cfg.dispatch_index](s, len);
}

int64_t AttentionTarget(const KernelConfig& cfg) {
  return HWY_DISPATCH_TABLE(CompiledTargetT)[cfg.dispatch_index]();
}

void AttendRange(const KernelConfig& cfg, const float* q, const float* k, const float* v,
                 int64_t len, int64_t stride, int64_t hd, float scale, float* scores,
                 AttendPartial* part) {
  if (len <= 0) {
    part->max = -INFINITY;
    part->sum = 0.0;
    std::fill(part->out, part->out + hd, 0.0f);
    return;
  }
  HWY_DISPATCH_TABLE(AttendPartialT)[cfg.dispatch_index](q, k, v, len, stride, hd, scale, scores,
                                                         part);
}

void MergeAttend(const AttendPartial* parts, int64_t count, int64_t hd, float* out) {
  float mx = -INFINITY;
  for (int64_t s = 0; s < count; ++s) mx = std::max(mx, parts[s].max);
  double sum = 0.0;
  std::fill(out, out + hd, 0.0f);
  for (int64_t s = 0; s < count; ++s) {
    if (parts[s].sum == 0.0) continue;
    const double w = std::exp(static_cast<double>(parts[s].max) - mx);
    sum += parts[s].sum * w;
    const float wf = static_cast<float>(w);
    for (int64_t e = 0; e < hd; ++e) out[e] += wf * parts[s].out[e];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t e = 0; e < hd; ++e) out[e] *= inv;
}
}  // namespace sparq::cpu
#endif  // HWY_ONCE
