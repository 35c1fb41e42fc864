// Gradient tests of the per-row ops (RMSNorm, SwiGLU, linear, RoPE, embedding): each f32
// backward against central differences of an independent f64 forward (train_testutil.h derives
// the tolerance), and one test per error path.
#include <gtest/gtest.h>

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
using testing::Project;
using testing::RandomNormal;
using testing::Seeded;
using testing::ToDouble;
using Vec = std::vector<double>;

// ---- f64 forwards --------------------------------------------------------------------------

Vec RmsNorm64(const Vec& x, const Vec& g, int64_t n, int64_t d, double eps) {
  Vec y(x.size());
  for (int64_t r = 0; r < n; ++r) {
    double ms = 0.0;
    for (int64_t i = 0; i < d; ++i) ms += x[r * d + i] * x[r * d + i] / d;
    for (int64_t i = 0; i < d; ++i) y[r * d + i] = x[r * d + i] / std::sqrt(ms + eps) * g[i];
  }
  return y;
}

Vec Swiglu64(const Vec& a, const Vec& b) {
  Vec y(a.size());
  for (size_t i = 0; i < a.size(); ++i) y[i] = a[i] / (1.0 + std::exp(-a[i])) * b[i];
  return y;
}

Vec Linear64(const Vec& x, const Vec& w, int64_t n, int64_t k, int64_t m) {
  Vec y(static_cast<size_t>(n * m), 0.0);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < k; ++c) y[t * m + r] += x[t * k + c] * w[r * k + c];
  return y;
}

// Pairs (2i, 2i+1) of each head rotate by (pos0 + row) * theta^(-2i/rope_dim).
Vec Rope64(const Vec& x, const RopeShape& s) {
  Vec y = x;
  for (int64_t r = 0; r < s.n; ++r)
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t i = 0; i < s.rope_dim / 2; ++i) {
        const double a = (s.pos0 + r) * std::pow(s.theta, -2.0 * i / s.rope_dim);
        const size_t p = (r * s.heads + h) * s.hd + 2 * i;
        y[p] = x[p] * std::cos(a) - x[p + 1] * std::sin(a);
        y[p + 1] = x[p] * std::sin(a) + x[p + 1] * std::cos(a);
      }
  return y;
}

// ---- gradient tests ------------------------------------------------------------------------

TEST(TrainOps, RmsNormBackward) {
  auto gen = Seeded(101);
  const int64_t n = 3, d = 16;
  const double eps = 1e-5;
  auto x = RandomNormal(&gen, n * d), g = RandomNormal(&gen, d), r = RandomNormal(&gen, n * d);
  std::vector<float> y(n * d), dx(n * d), dg(d, 0.0f);
  ASSERT_TRUE(RmsNormForward(x, g, n, d, eps, y).ok());
  EXPECT_NEAR(y[5], RmsNorm64(ToDouble(x), ToDouble(g), n, d, eps)[5], 1e-5);
  ASSERT_TRUE(RmsNormBackward(x, g, r, n, d, eps, dx, dg).ok());
  const Vec xd = ToDouble(x), gd = ToDouble(g);
  ExpectGradNear("RmsNorm dx", dx,
                 FdGrad([&](const Vec& v) { return Project(RmsNorm64(v, gd, n, d, eps), r); }, xd));
  ExpectGradNear("RmsNorm dg", dg,
                 FdGrad([&](const Vec& v) { return Project(RmsNorm64(xd, v, n, d, eps), r); }, gd));
}

TEST(TrainOps, SwigluBackward) {
  auto gen = Seeded(102);
  const size_t count = 40;
  auto a = RandomNormal(&gen, count, 2.0f), b = RandomNormal(&gen, count);
  auto r = RandomNormal(&gen, count);
  std::vector<float> y(count), da(count), db(count);
  ASSERT_TRUE(SwigluForward(a, b, y).ok());
  ASSERT_TRUE(SwigluBackward(a, b, r, da, db).ok());
  const Vec ad = ToDouble(a), bd = ToDouble(b);
  ExpectGradNear("Swiglu da", da,
                 FdGrad([&](const Vec& v) { return Project(Swiglu64(v, bd), r); }, ad));
  ExpectGradNear("Swiglu db", db,
                 FdGrad([&](const Vec& v) { return Project(Swiglu64(ad, v), r); }, bd));
}

TEST(TrainOps, LinearBackward) {
  auto gen = Seeded(103);
  const int64_t n = 5, k = 7, m = 6;
  auto x = RandomNormal(&gen, n * k), w = RandomNormal(&gen, m * k), r = RandomNormal(&gen, n * m);
  std::vector<float> y(n * m), dx(n * k), dw(m * k, 0.0f);
  ASSERT_TRUE(LinearForward(x, w, n, k, m, y).ok());
  ASSERT_TRUE(LinearBackwardInput(r, w, n, k, m, dx).ok());
  ASSERT_TRUE(LinearBackwardWeight(r, x, n, k, m, dw).ok());
  const Vec xd = ToDouble(x), wd = ToDouble(w);
  ExpectGradNear("Linear dX", dx,
                 FdGrad([&](const Vec& v) { return Project(Linear64(v, wd, n, k, m), r); }, xd));
  const Vec fd_w = FdGrad([&](const Vec& v) { return Project(Linear64(xd, v, n, k, m), r); }, wd);
  ExpectGradNear("Linear dW", dw, fd_w);
  // Masked SDDMM: a 2:4-like mask (kept = every position whose index mod 4 is 0 or 3), listed in
  // reverse order, accumulating onto 1.0: equals the dense dW there, + 1.
  std::vector<int64_t> kept;
  for (int64_t i = m * k - 1; i >= 0; --i) {
    if (i % 4 == 0 || i % 4 == 3) kept.push_back(i);
  }
  std::vector<float> dw_kept(kept.size(), 1.0f);
  ASSERT_TRUE(LinearBackwardWeightMasked(r, x, n, k, m, kept, dw_kept).ok());
  Vec want(kept.size());
  std::vector<float> got(kept.size());
  for (size_t i = 0; i < kept.size(); ++i) {
    want[i] = fd_w[kept[i]];
    got[i] = dw_kept[i] - 1.0f;
    EXPECT_NEAR(dw_kept[i], dw[kept[i]] + 1.0f, 1e-5f) << i;
  }
  ExpectGradNear("Linear dW masked", got, want);
}

TEST(TrainOps, RopeBackward) {
  auto gen = Seeded(104);
  // rope_dim < hd: dims 6, 7 of each head pass through.
  const RopeShape s{.n = 4, .heads = 2, .hd = 8, .rope_dim = 6, .pos0 = 3, .theta = 10000.0};
  const size_t count = s.n * s.heads * s.hd;
  auto x = RandomNormal(&gen, count), r = RandomNormal(&gen, count);
  std::vector<float> y(count), dx(count);
  ASSERT_TRUE(RopeForward(x, s, y).ok());
  const Vec y64 = Rope64(ToDouble(x), s);
  for (size_t i = 0; i < count; ++i) EXPECT_NEAR(y[i], y64[i], 1e-5) << i;
  EXPECT_EQ(y[6], x[6]);  // pass-through dim
  ASSERT_TRUE(RopeBackward(r, s, dx).ok());
  ExpectGradNear("Rope dx", dx,
                 FdGrad([&](const Vec& v) { return Project(Rope64(v, s), r); }, ToDouble(x)));
}

TEST(TrainOps, EmbeddingBackward) {
  auto gen = Seeded(105);
  const int64_t vocab = 6, d = 4;
  const std::vector<int32_t> tokens = {2, 5, 2, 0};  // 2 twice: scatter-add
  const auto n = static_cast<int64_t>(tokens.size());
  auto e = RandomNormal(&gen, vocab * d), r = RandomNormal(&gen, n * d);
  std::vector<float> x(n * d), de(vocab * d, 0.0f);
  ASSERT_TRUE(EmbeddingForward(e, tokens, vocab, d, x).ok());
  EXPECT_EQ(x[2 * d + 1], e[2 * d + 1]);
  ASSERT_TRUE(EmbeddingBackward(r, tokens, vocab, d, de).ok());
  ExpectGradNear("Embedding dE", de,
                 FdGrad(
                     [&](const Vec& v) {
                       double l = 0.0;
                       for (int64_t t = 0; t < n; ++t)
                         for (int64_t i = 0; i < d; ++i) l += v[tokens[t] * d + i] * r[t * d + i];
                       return l;
                     },
                     ToDouble(e)));
  EXPECT_EQ(de[1 * d], 0.0f);  // token 1 unseen
}

// ---- error paths: a wrong shape or id is kInvalidInput naming the op and operand -------------

void ExpectInvalid(const Status& st, const char* needle) {
  EXPECT_EQ(st.code(), StatusCode::kInvalidInput) << st.ToString();
  EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
}

TEST(TrainOps, ErrorsRmsNormAndSwiglu) {
  std::vector<float> x(12), g(4), y(12), small(11);
  ExpectInvalid(RmsNormForward(x, small, 3, 4, 1e-5, y), "RmsNormForward: g");
  ExpectInvalid(RmsNormBackward(x, g, small, 3, 4, 1e-5, y, g), "RmsNormBackward: dy");
  ExpectInvalid(RmsNormForward(x, g, -3, 4, 1e-5, y), "RmsNormForward: x");
  ExpectInvalid(SwigluForward(x, small, y), "SwigluForward: b");
  ExpectInvalid(SwigluBackward(x, x, x, y, small), "SwigluBackward: db");
}

TEST(TrainOps, ErrorsLinear) {
  std::vector<float> x(6), w(12), y(8), dx(6), dw(12), bad(5);
  ExpectInvalid(LinearForward(x, bad, 2, 3, 4, y), "LinearForward: w");
  ExpectInvalid(LinearBackwardInput(y, w, 2, 3, 4, bad), "LinearBackwardInput: dx");
  ExpectInvalid(LinearBackwardWeight(y, x, 2, 3, 4, bad), "LinearBackwardWeight: dw");
  std::vector<int64_t> kept = {0, 12};  // 12 is one past W[4, 3]
  std::vector<float> out(2);
  ExpectInvalid(LinearBackwardWeightMasked(y, x, 2, 3, 4, kept, out), "kept[1] = 12");
  ExpectInvalid(LinearBackwardWeightMasked(y, x, 2, 3, 4, kept, bad), "dw_kept");
}

TEST(TrainOps, ErrorsRopeAndEmbedding) {
  std::vector<float> x(16), y(16), bad(15);
  RopeShape s{.n = 2, .heads = 1, .hd = 8, .rope_dim = 8, .pos0 = 0, .theta = 10000.0};
  ExpectInvalid(RopeForward(bad, s, y), "RopeForward: x");
  ExpectInvalid(RopeBackward(x, s, bad), "RopeBackward: output");
  s.rope_dim = 5;
  ExpectInvalid(RopeForward(x, s, y), "rope_dim 5");
  const std::vector<int32_t> tokens = {1, 4};
  std::vector<float> table(8), e(4);  // vocab 4, d 2
  ExpectInvalid(EmbeddingForward(table, tokens, 4, 2, e), "tokens[1] = 4");
  const std::vector<int32_t> neg = {-1, 0};
  ExpectInvalid(EmbeddingBackward(e, neg, 4, 2, table), "tokens[0] = -1");
  ExpectInvalid(EmbeddingBackward(bad, tokens, 4, 2, table), "EmbeddingBackward: dx");
}

}  // namespace
}  // namespace sparq::train
