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

#include "sparq/dtype.h"
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

// A vector of an f16 cache's lanes widened to f32 (F16C from AVX2 up; the older targets'
// Highway conversion maps f16 NaN to a finite value, so they widen lane by lane through
// F16ToF32). KvValue: one value, for the scalar tails.
template <class D>
HWY_INLINE hn::Vec<D> LoadKv(D df, const uint16_t* p) {
#if HWY_TARGET <= HWY_AVX2
  const hn::Rebind<hwy::float16_t, D> dh;
  return hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p)));
#else
  HWY_ALIGN float lanes[64 / sizeof(float)];
  for (size_t i = 0; i < hn::Lanes(df); ++i) lanes[i] = F16ToF32(p[i]);
  return hn::Load(df, lanes);
#endif
}
HWY_INLINE float KvValue(uint16_t h) { return F16ToF32(h); }
// a * b + c in one lane (the tails), fused wherever the vector part is.
HWY_INLINE float MulAdd1(float a, float b, float c) {
  const hn::CappedTag<float, 1> d1;
  return hn::GetLane(hn::MulAdd(hn::Set(d1, a), hn::Set(d1, b), hn::Set(d1, c)));
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

// An f16 cache's decode attention for NH query heads sharing one KV head (q_h = q + h * hd) over
// keys [0, len) of a key range starting on a tile: K in tiles of kKvTile positions, each
// [hd][kKvTile] (kt: the range's first tile; tile_stride halves from tile to tile), V in rows of
// hd (v). Each K and V vector is widened once for the NH heads, and the scores of a tile come
// out in one vector per head, with no sum across lanes: the row-major body's per-key horizontal
// sums were most of decode attention's instructions.
template <int NH>
void AttendTilesF16(const float* q, const uint16_t* kt, int64_t tile_stride, const uint16_t* v,
                    int64_t len, int64_t hd, float scale, float* scores, int64_t score_stride,
                    AttendPartial* parts) {
  static_assert(HWY_MAX_BYTES / sizeof(float) <= kKvTile, "a tile holds whole vectors");
  const hn::ScalableTag<float> df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  const int64_t tiles = (len + kKvTile - 1) / kKvTile;
  // Scores: per tile and vector of its lanes, 4 chains per head over the head's dimension.
  for (int64_t t = 0; t < tiles; ++t) {
    const uint16_t* tile = kt + t * tile_stride;
    for (int64_t c = 0; c < kKvTile; c += L) {
      hn::Vec<decltype(df)> acc[NH][4];
      for (int h = 0; h < NH; ++h) {
        for (int u = 0; u < 4; ++u) acc[h][u] = hn::Zero(df);
      }
      int64_t e = 0;
      for (; e + 4 <= hd; e += 4) {
        for (int u = 0; u < 4; ++u) {
          const auto kv = LoadKv(df, tile + (e + u) * kKvTile + c);
          for (int h = 0; h < NH; ++h) {
            acc[h][u] = hn::MulAdd(hn::Set(df, q[h * hd + e + u]), kv, acc[h][u]);
          }
        }
      }
      for (; e < hd; ++e) {
        const auto kv = LoadKv(df, tile + e * kKvTile + c);
        for (int h = 0; h < NH; ++h) acc[h][0] = hn::MulAdd(hn::Set(df, q[h * hd + e]), kv, acc[h][0]);
      }
      for (int h = 0; h < NH; ++h) {
        const auto sum = hn::Add(hn::Add(acc[h][0], acc[h][1]), hn::Add(acc[h][2], acc[h][3]));
        hn::StoreU(hn::Mul(sum, hn::Set(df, scale)), df, scores + h * score_stride + t * kKvTile + c);
      }
    }
  }
  for (int h = 0; h < NH; ++h) {
    float* sc = scores + h * score_stride;
    float mx = -INFINITY;
    for (int64_t j = 0; j < len; ++j) mx = std::max(mx, sc[j]);
    parts[h].sum = ExpMinusMaxSum(df, sc, len, mx);
    parts[h].max = mx;
  }
  // out_h = sum_j e_hj v_j: each V vector widened once for the NH heads, up to kVecs vectors of
  // the head at a time per head in registers.
  constexpr int64_t kVecs = HWY_MAX_BYTES >= 64 ? 4 : 2;
  const int64_t hv = hd / L * L;
  int64_t e = 0;
  while (e < hv) {
    const int64_t nv = std::min<int64_t>(kVecs, (hv - e) / L);
    hn::Vec<decltype(df)> o[NH][kVecs];
    for (int h = 0; h < NH; ++h) {
      for (int64_t u = 0; u < kVecs; ++u) o[h][u] = hn::Zero(df);
    }
    for (int64_t j = 0; j < len; ++j) {
      const uint16_t* vj = v + j * hd + e;
      hn::Vec<decltype(df)> vv[kVecs];
      for (int64_t u = 0; u < kVecs; ++u) vv[u] = u < nv ? LoadKv(df, vj + u * L) : hn::Zero(df);
      for (int h = 0; h < NH; ++h) {
        const auto pv = hn::Set(df, scores[h * score_stride + j]);
        for (int64_t u = 0; u < kVecs; ++u) {
          if (u < nv) o[h][u] = hn::MulAdd(pv, vv[u], o[h][u]);
        }
      }
    }
    for (int h = 0; h < NH; ++h) {
      for (int64_t u = 0; u < nv; ++u) hn::StoreU(o[h][u], df, parts[h].out + e + u * L);
    }
    e += nv * L;
  }
  for (; e < hd; ++e) {
    for (int h = 0; h < NH; ++h) {
      float acc = 0.0f;
      for (int64_t j = 0; j < len; ++j) {
        acc = MulAdd1(scores[h * score_stride + j], KvValue(v[j * hd + e]), acc);
      }
      parts[h].out[e] = acc;
    }
  }
}

void AttendTilesF16T(const float* q, int64_t heads, const uint16_t* kt, int64_t tile_stride,
                     const uint16_t* v, int64_t len, int64_t hd, float scale, float* scores,
                     int64_t score_stride, AttendPartial* parts) {
  for (int64_t h0 = 0; h0 < heads;) {
    const int64_t nh = std::min<int64_t>(4, heads - h0);
    const float* qh = q + h0 * hd;
    float* sh = scores + h0 * score_stride;
    if (nh == 4) {
      AttendTilesF16<4>(qh, kt, tile_stride, v, len, hd, scale, sh, score_stride, parts + h0);
    } else if (nh == 3) {
      AttendTilesF16<3>(qh, kt, tile_stride, v, len, hd, scale, sh, score_stride, parts + h0);
    } else if (nh == 2) {
      AttendTilesF16<2>(qh, kt, tile_stride, v, len, hd, scale, sh, score_stride, parts + h0);
    } else {
      AttendTilesF16<1>(qh, kt, tile_stride, v, len, hd, scale, sh, score_stride, parts + h0);
    }
    h0 += nh;
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

// f16's largest finite value: StoreF16T saturates there instead of rounding to infinity.
constexpr float kF16Max = 65504.0f;

// out[i] = x[i] as f16 bits: nearest even, saturated at +-kF16Max, NaN kept. F16C (AVX2 and up)
// converts in vectors; the older targets, whose Highway conversion truncates, per value through
// F32ToF16, the same rounding: every target stores the same bits.
void StoreF16T(const float* x, int64_t n, uint16_t* out) {
  int64_t i = 0;
#if HWY_TARGET <= HWY_AVX2
  const hn::ScalableTag<float> df;
  const hn::Rebind<hwy::float16_t, decltype(df)> dh;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  const auto lim = hn::Set(df, kF16Max);
  for (; i + L <= n; i += L) {
    const auto v = hn::LoadU(df, x + i);
    // |v| > max is false for NaN, which passes through.
    const auto sat = hn::IfThenElse(hn::Gt(hn::Abs(v), lim), hn::CopySign(lim, v), v);
    hn::StoreU(hn::DemoteTo(dh, sat), dh, reinterpret_cast<hwy::float16_t*>(out + i));
  }
#endif
  for (; i < n; ++i) {
    const float v = x[i];
    out[i] = F32ToF16(std::fabs(v) > kF16Max ? std::copysign(kF16Max, v) : v);
  }
}

// out[i] = x[i] widened to f32 (exact), as attention reads an f16 cache.
void LoadF16T(const uint16_t* x, int64_t n, float* out) {
  const hn::ScalableTag<float> df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  for (; i + L <= n; i += L) hn::StoreU(LoadKv(df, x + i), df, out + i);
  for (; i < n; ++i) out[i] = KvValue(x[i]);
}

// The target this copy was compiled for (AttentionTarget).
int64_t CompiledTargetT() { return HWY_TARGET; }

}  // namespace sparq::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace sparq::cpu {
HWY_EXPORT(AttendPartialT);
HWY_EXPORT(AttendTilesF16T);
HWY_EXPORT(SoftmaxRowT);
HWY_EXPORT(CompiledTargetT);
HWY_EXPORT(StoreF16T);
HWY_EXPORT(LoadF16T);

void StoreF16(const KernelConfig& cfg, const float* x, int64_t n, uint16_t* out) {
  if (n > 0) HWY_DISPATCH_TABLE(StoreF16T)[cfg.dispatch_index](x, n, out);
}

void LoadF16(const KernelConfig& cfg, const uint16_t* x, int64_t n, float* out) {
  if (n > 0) HWY_DISPATCH_TABLE(LoadF16T)[cfg.dispatch_index](x, n, out);
}

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

void AttendTilesF16(const KernelConfig& cfg, const float* q, int64_t heads, const uint16_t* kt,
                    int64_t tile_stride, const uint16_t* v, int64_t len, int64_t hd, float scale,
                    float* scores, int64_t score_stride, AttendPartial* parts) {
  if (len <= 0) {
    for (int64_t h = 0; h < heads; ++h) {
      AttendRange(cfg, q + h * hd, static_cast<const float*>(nullptr), nullptr, 0, hd, hd, scale,
                  scores, &parts[h]);
    }
    return;
  }
  HWY_DISPATCH_TABLE(AttendTilesF16T)[cfg.dispatch_index](q, heads, kt, tile_stride, v, len, hd,
                                                          scale, scores, score_stride, parts);
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
