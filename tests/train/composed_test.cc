// A composed gradient check: a tiny one-block chain built only from the train ops,
//   tokens -> embedding E -> RMSNorm g -> (Wg, Wu) -> SwiGLU -> Wo -> cross-entropy,
// backpropagated by hand through the f32 backward entries; the gradient of every parameter
// matches central differences of an independent f64 forward of the whole chain (tolerance:
// train_testutil.h; the chain stores ~5 f32 intermediates in a row, within its budget).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "sparq/train_ops.h"
#include "tests/train/train_testutil.h"

namespace sparq::train {
namespace {

using testing::ExpectGradNear;
using testing::FdGrad;
using testing::RandomNormal;
using testing::ToDouble;
using Vec = std::vector<double>;

constexpr int64_t kVocab = 10, kD = 8, kFf = 12;
constexpr double kEps = 1e-5;

struct Params64 {
  Vec e, g, wg, wu, wo;  // [V, d], [d], [f, d], [f, d], [V, f]
};

// The chain's loss in f64, written from the math (no train op is called).
double ChainLoss64(const Params64& p, const std::vector<int32_t>& tokens,
                   const std::vector<int32_t>& targets) {
  const auto n = static_cast<int64_t>(tokens.size());
  double loss = 0.0;
  for (int64_t t = 0; t < n; ++t) {
    const double* x = &p.e[tokens[t] * kD];
    double ms = 0.0;
    for (int64_t i = 0; i < kD; ++i) ms += x[i] * x[i] / kD;
    Vec h(kD), z(kFf), logits(kVocab, 0.0);
    for (int64_t i = 0; i < kD; ++i) h[i] = x[i] / std::sqrt(ms + kEps) * p.g[i];
    for (int64_t f = 0; f < kFf; ++f) {
      double a = 0.0, b = 0.0;
      for (int64_t i = 0; i < kD; ++i) {
        a += p.wg[f * kD + i] * h[i];
        b += p.wu[f * kD + i] * h[i];
      }
      z[f] = a / (1.0 + std::exp(-a)) * b;
    }
    for (int64_t v = 0; v < kVocab; ++v)
      for (int64_t f = 0; f < kFf; ++f) logits[v] += p.wo[v * kFf + f] * z[f];
    const double mx = *std::max_element(logits.begin(), logits.end());
    double s = 0.0;
    for (double l : logits) s += std::exp(l - mx);
    loss += mx + std::log(s) - logits[targets[t]];
  }
  return loss / n;
}

TEST(TrainOps, ComposedBlockGradients) {
  const uint64_t seed = 301;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 gen(seed);
  const std::vector<int32_t> tokens = {4, 1, 4, 9, 0}, targets = {1, 4, 9, 0, 7};
  const auto n = static_cast<int64_t>(tokens.size());
  auto e = RandomNormal(&gen, kVocab * kD);
  auto g = RandomNormal(&gen, kD, 0.3f);
  for (float& x : g) x += 1.0f;  // gains near 1, as trained RMSNorm gains are
  auto wg = RandomNormal(&gen, kFf * kD, 0.5f), wu = RandomNormal(&gen, kFf * kD, 0.5f);
  auto wo = RandomNormal(&gen, kVocab * kFf, 0.5f);

  // Forward, keeping every op's input for the backward.
  std::vector<float> x(n * kD), h(n * kD), a(n * kFf), b(n * kFf), z(n * kFf), logits(n * kVocab);
  ASSERT_TRUE(EmbeddingForward(e, tokens, kVocab, kD, x).ok());
  ASSERT_TRUE(RmsNormForward(x, g, n, kD, kEps, h).ok());
  ASSERT_TRUE(LinearForward(h, wg, n, kD, kFf, a).ok());
  ASSERT_TRUE(LinearForward(h, wu, n, kD, kFf, b).ok());
  ASSERT_TRUE(SwigluForward(a, b, z).ok());
  ASSERT_TRUE(LinearForward(z, wo, n, kFf, kVocab, logits).ok());
  double loss = 0.0;
  std::vector<float> dlogits(n * kVocab);
  ASSERT_TRUE(CrossEntropy(logits, targets, n, kVocab, &loss, dlogits).ok());

  const Params64 p{ToDouble(e), ToDouble(g), ToDouble(wg), ToDouble(wu), ToDouble(wo)};
  const double loss64 = ChainLoss64(p, tokens, targets);
  std::printf("  loss f32 chain %.9f, f64 %.9f\n", loss, loss64);
  EXPECT_NEAR(loss, loss64, 1e-5 * std::max(1.0, loss64));

  // Backward.
  std::vector<float> dwo(wo.size(), 0.0f), dz(n * kFf), da(n * kFf), db(n * kFf);
  std::vector<float> dwg(wg.size(), 0.0f), dwu(wu.size(), 0.0f), dh(n * kD), dh_up(n * kD);
  std::vector<float> dx(n * kD), dg(kD, 0.0f), de(e.size(), 0.0f);
  ASSERT_TRUE(LinearBackwardWeight(dlogits, z, n, kFf, kVocab, dwo).ok());
  ASSERT_TRUE(LinearBackwardInput(dlogits, wo, n, kFf, kVocab, dz).ok());
  ASSERT_TRUE(SwigluBackward(a, b, dz, da, db).ok());
  ASSERT_TRUE(LinearBackwardWeight(da, h, n, kD, kFf, dwg).ok());
  ASSERT_TRUE(LinearBackwardWeight(db, h, n, kD, kFf, dwu).ok());
  ASSERT_TRUE(LinearBackwardInput(da, wg, n, kD, kFf, dh).ok());
  ASSERT_TRUE(LinearBackwardInput(db, wu, n, kD, kFf, dh_up).ok());
  for (size_t i = 0; i < dh.size(); ++i) dh[i] += dh_up[i];  // h feeds both gate and up
  ASSERT_TRUE(RmsNormBackward(x, g, dh, n, kD, kEps, dx, dg).ok());
  ASSERT_TRUE(EmbeddingBackward(dx, tokens, kVocab, kD, de).ok());

  // Each parameter against FD of the f64 chain, the others held.
  auto fd = [&](Vec Params64::*field) {
    return FdGrad(
        [&](const Vec& v) {
          Params64 q = p;
          q.*field = v;
          return ChainLoss64(q, tokens, targets);
        },
        p.*field);
  };
  ExpectGradNear("chain dE", de, fd(&Params64::e));
  ExpectGradNear("chain dg", dg, fd(&Params64::g));
  const Vec fd_wg = fd(&Params64::wg);
  ExpectGradNear("chain dWgate", dwg, fd_wg);
  ExpectGradNear("chain dWup", dwu, fd(&Params64::wu));
  ExpectGradNear("chain dWout", dwo, fd(&Params64::wo));

  // The fixed-mask form for Wgate: kept = one in three weights.
  std::vector<int64_t> kept;
  for (int64_t i = 0; i < kFf * kD; i += 3) kept.push_back(i);
  std::vector<float> dwg_kept(kept.size(), 0.0f);
  ASSERT_TRUE(LinearBackwardWeightMasked(da, h, n, kD, kFf, kept, dwg_kept).ok());
  Vec want(kept.size());
  for (size_t i = 0; i < kept.size(); ++i) want[i] = fd_wg[kept[i]];
  ExpectGradNear("chain dWgate masked", dwg_kept, want);
}

}  // namespace
}  // namespace sparq::train
