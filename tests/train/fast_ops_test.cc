// The training fast path's ops (src/train/fast_ops.h) against the reference ops of
// sparq/train_ops.h (plain loops, long sums in double), and bit for bit against themselves on
// pools of 1, 2 and 3 threads and none. Shapes sweep past the tile grids: the linear products'
// (BLAS tiles of 256 x 64 / 128 x 512 / 128 x 192 outputs), the attention's 64-row blocks and the
// per-row ops' 16-row blocks, with partial tiles on every edge.
//
// Tolerances (eps = 2^-24, the f32 unit roundoff):
//   - a product of length K summed in f32, in whatever order BLAS picks, errs by at most
//     gamma_K sum_i |a_i b_i| with gamma_K ~ 1.01 K eps (Higham, Accuracy and Stability of
//     Numerical Algorithms, 3.1), and sum_i |a_i b_i| <= K max|a| max|b|; the reference (double
//     sums) adds one final f32 rounding, eps |y|. An accumulating dW rounds its += on both sides:
//       tol = eps (1.01 K^2 max|a| max|b| + 2 max|dW0|).
//     The conventions' eps K max|a| max|b| is the typical (random-sign) size, sqrt(K)-ish below
//     this worst case; the tests print the measured error beside the bound.
//   - RMSNorm (forward, and the backward's dx), SwiGLU and RoPE run the reference's row math on
//     blocks of rows: compared bit for bit.
//   - attention and the losses: derived at their tests.
#include "src/train/fast_ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "sparq/kernel_config.h"
#include "sparq/sddmm.h"
#include "sparq/thread_pool.h"
#include "sparq/train_ops.h"
#include "tests/train/train_testutil.h"

namespace sparq::train {
namespace {

using testing::RandomNormal;
using testing::Seeded;

constexpr double kEps = 5.960464477539063e-08;  // 2^-24

double MaxAbs(std::span<const float> v) {
  double m = 0.0;
  for (const float x : v) m = std::max(m, std::abs(static_cast<double>(x)));
  return m;
}

double MaxDiff(std::span<const float> a, std::span<const float> b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0.0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    m = std::max(m, std::abs(static_cast<double>(a[i]) - b[i]));
  }
  return m;
}

bool SameBits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Runs fn(pool) with no pool and with pools of 1, 2 and 3 threads; every output must have the
// same bits as the first run's.
void ExpectSameForAnyPool(const char* what,
                          const std::function<std::vector<float>(ThreadPool*)>& fn) {
  const std::vector<float> first = fn(nullptr);
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    EXPECT_TRUE(SameBits(fn(&pool), first)) << what << " differs with " << threads << " threads";
  }
}

// Worst-case f32 error of K-term products (header comment), plus the final roundings.
double ProductTol(int64_t kk, double max_a, double max_b, double max_acc = 0.0) {
  const auto k = static_cast<double>(kk);
  return kEps * (1.01 * k * k * max_a * max_b + 2.0 * max_acc) + 1e-30;
}

struct LinearShape {
  int64_t n, k, m;
};
// Tiny; one tile; past every tile edge (NT 256 x 64, NN 128 x 512, TN 128 x 192); K = 1.
constexpr LinearShape kLinearShapes[] = {{5, 16, 24},    {1, 7, 3}, {64, 64, 64}, {257, 129, 193},
                                         {130, 513, 65}, {3, 1, 5}, {0, 4, 6}};

TEST(FastOps, LinearProductsMatchTheReference) {
  auto gen = Seeded(2801);
  ThreadPool pool(2);
  for (const auto& [n, k, m] : kLinearShapes) {
    const auto x = RandomNormal(&gen, n * k), w = RandomNormal(&gen, m * k, 0.5f);
    const auto dy = RandomNormal(&gen, n * m, 0.3f), dw0 = RandomNormal(&gen, m * k);
    std::vector<float> y_ref(n * m), y(n * m, 9.0f), dx_ref(n * k), dx(n * k, 9.0f);
    ASSERT_TRUE(LinearForward(x, w, n, k, m, y_ref).ok());
    ASSERT_TRUE(fast::LinearForward(x, w, n, k, m, y, &pool).ok());
    const double ey = MaxDiff(y, y_ref), ty = ProductTol(k, MaxAbs(x), MaxAbs(w));
    ASSERT_TRUE(LinearBackwardInput(dy, w, n, k, m, dx_ref).ok());
    ASSERT_TRUE(fast::LinearBackwardInput(dy, w, n, k, m, dx, &pool).ok());
    const double ex = MaxDiff(dx, dx_ref), tx = ProductTol(m, MaxAbs(dy), MaxAbs(w));
    std::vector<float> dw_ref = dw0, dw = dw0;
    ASSERT_TRUE(LinearBackwardWeight(dy, x, n, k, m, dw_ref).ok());
    ASSERT_TRUE(fast::LinearBackwardWeight(dy, x, n, k, m, dw, &pool).ok());
    const double ew = MaxDiff(dw, dw_ref), tw = ProductTol(n, MaxAbs(dy), MaxAbs(x), MaxAbs(dw0));
    std::printf("  n %lld k %lld m %lld: Y err %.3g (tol %.3g), dX %.3g (%.3g), dW %.3g (%.3g)\n",
                static_cast<long long>(n), static_cast<long long>(k), static_cast<long long>(m), ey,
                ty, ex, tx, ew, tw);
    EXPECT_LE(ey, ty);
    EXPECT_LE(ex, tx);
    EXPECT_LE(ew, tw);
  }
}

TEST(FastOps, MaskedWeightGradientMatchesTheReferenceAtTheKeptEntries) {
  auto gen = Seeded(2802);
  ThreadPool pool(3);
  for (const auto& [n, k, m] : kLinearShapes) {
    const auto x = RandomNormal(&gen, n * k), dy = RandomNormal(&gen, n * m);
    for (const double keep : {0.0, 0.5, 1.0}) {
      std::vector<int64_t> kept;
      for (int64_t i = 0; i < m * k; ++i) {
        if (std::uniform_real_distribution<double>(0, 1)(gen) < keep) kept.push_back(i);
      }
      std::shuffle(kept.begin(), kept.end(), gen);  // any order
      const auto d0 = RandomNormal(&gen, kept.size());
      std::vector<float> ref = d0, got = d0;
      ASSERT_TRUE(LinearBackwardWeightMasked(dy, x, n, k, m, kept, ref).ok());
      ASSERT_TRUE(fast::LinearBackwardWeightMasked(dy, x, n, k, m, kept, got, &pool).ok());
      EXPECT_LE(MaxDiff(got, ref), ProductTol(n, MaxAbs(dy), MaxAbs(x), MaxAbs(d0)));
    }
  }
  // Sparse masks in row-major order take the SDDMM (at most 20% kept): the same check, and the
  // same bits for any pool size.
  auto expect_sddmm = [&](int64_t n, int64_t k, int64_t m, const std::vector<float>& dy,
                          const std::vector<float>& x, const std::vector<int64_t>& kept) {
    const auto d0 = RandomNormal(&gen, kept.size());
    std::vector<float> ref = d0, got = d0, one = d0;
    ASSERT_TRUE(LinearBackwardWeightMasked(dy, x, n, k, m, kept, ref).ok());
    ASSERT_TRUE(fast::LinearBackwardWeightMasked(dy, x, n, k, m, kept, got, &pool).ok());
    EXPECT_LE(MaxDiff(got, ref), ProductTol(n, MaxAbs(dy), MaxAbs(x), MaxAbs(d0)));
    ThreadPool single(1);
    ASSERT_TRUE(fast::LinearBackwardWeightMasked(dy, x, n, k, m, kept, one, &single).ok());
    EXPECT_EQ(one, got);
  };
  for (const auto& [n, k, m] : kLinearShapes) {
    const auto x = RandomNormal(&gen, n * k), dy = RandomNormal(&gen, n * m);
    for (const double keep : {0.02, 0.1, 0.2}) {
      std::vector<int64_t> kept;
      for (int64_t i = 0; i < m * k; ++i) {
        if (std::uniform_real_distribution<double>(0, 1)(gen) < keep) kept.push_back(i);
      }
      expect_sddmm(n, k, m, dy, x, kept);
    }
  }
  // 2:4 masks in row-major order on shapes that fill the vectors take the windowed SDDMM (every
  // row keeps 2 of every 4 columns): the same check and the same bits for any pool size.
  for (const auto& [n, k, m] : {LinearShape{64, 64, 64}, LinearShape{37, 192, 48}}) {
    const auto x = RandomNormal(&gen, n * k), dy = RandomNormal(&gen, n * m);
    std::vector<int64_t> kept;
    for (int64_t i = 0; i < m * k; i += 4) {
      int a = std::uniform_int_distribution<int>(0, 3)(gen), b = std::uniform_int_distribution<int>(0, 2)(gen);
      b += b >= a;
      kept.push_back(i + std::min(a, b));
      kept.push_back(i + std::max(a, b));
    }
    EXPECT_TRUE(cpu::MaskedWeightGradWindowed(k, m, kept, KernelConfig::FromMachine().value()))
        << "n " << n << " k " << k << " m " << m;
    expect_sddmm(n, k, m, dy, x, kept);
  }
  // An index outside W is refused, naming it.
  const std::vector<float> x(6), dy(4);
  std::vector<int64_t> bad = {0, 6};
  std::vector<float> out(2);
  const Status st = fast::LinearBackwardWeightMasked(dy, x, 2, 3, 2, bad, out, &pool);
  EXPECT_EQ(st.code(), StatusCode::kInvalidInput);
  EXPECT_NE(st.message().find("kept[1] = 6"), std::string::npos) << st.message();
}

TEST(FastOps, RowOpsMatchTheReference) {
  auto gen = Seeded(2803);
  ThreadPool pool(3);
  for (const int64_t n : {1, 15, 16, 17, 50}) {
    const int64_t d = 24, heads = 3, hd = 8;
    const auto x = RandomNormal(&gen, n * d), g = RandomNormal(&gen, d);
    const auto dy = RandomNormal(&gen, n * d), dg0 = RandomNormal(&gen, d);
    std::vector<float> y_ref(n * d), y(n * d);
    ASSERT_TRUE(RmsNormForward(x, g, n, d, 1e-5, y_ref).ok());
    ASSERT_TRUE(fast::RmsNormForward(x, g, n, d, 1e-5, y, &pool).ok());
    EXPECT_TRUE(SameBits(y, y_ref)) << "RMSNorm forward, n " << n;
    // The backward: the same row math; dg's double sum is only reassociated (per 16-row block),
    // so dx is exact and dg within a few f32 roundings of its magnitude.
    std::vector<float> dx_ref(n * d), dx(n * d), dg_ref = dg0, dg = dg0;
    ASSERT_TRUE(RmsNormBackward(x, g, dy, n, d, 1e-5, dx_ref, dg_ref).ok());
    ASSERT_TRUE(fast::RmsNormBackward(x, g, dy, n, d, 1e-5, dx, dg, &pool).ok());
    EXPECT_TRUE(SameBits(dx, dx_ref)) << "RMSNorm backward, n " << n;
    EXPECT_LE(MaxDiff(dg, dg_ref), 2 * kEps * MaxAbs(dg_ref));
    // SwiGLU and RoPE: the reference on blocks, bit for bit.
    std::vector<float> s_ref(n * d), s(n * d), da_ref(n * d), da(n * d), db_ref(n * d), db(n * d);
    ASSERT_TRUE(SwigluForward(x, dy, s_ref).ok());
    ASSERT_TRUE(fast::SwigluForward(x, dy, s, &pool).ok());
    ASSERT_TRUE(SwigluBackward(x, dy, dy, da_ref, db_ref).ok());
    ASSERT_TRUE(fast::SwigluBackward(x, dy, dy, da, db, &pool).ok());
    EXPECT_TRUE(SameBits(s, s_ref) && SameBits(da, da_ref) && SameBits(db, db_ref));
    const RopeShape rs{.n = n, .heads = heads, .hd = hd, .rope_dim = 6, .pos0 = 3, .theta = 1e4};
    std::vector<float> r_ref(n * d), r(n * d);
    ASSERT_TRUE(RopeForward(x, rs, r_ref).ok());
    ASSERT_TRUE(fast::RopeForward(x, rs, r, &pool).ok());
    EXPECT_TRUE(SameBits(r, r_ref)) << "RoPE forward, n " << n;
    ASSERT_TRUE(RopeBackward(x, rs, r_ref).ok());
    ASSERT_TRUE(fast::RopeBackward(x, rs, r, &pool).ok());
    EXPECT_TRUE(SameBits(r, r_ref)) << "RoPE backward, n " << n;
  }
  // The reference's checks hold on the fast path (rope_dim odd, even with no rows).
  const RopeShape bad{.n = 0, .heads = 1, .hd = 8, .rope_dim = 5, .pos0 = 0, .theta = 1e4};
  EXPECT_EQ(fast::RopeForward({}, bad, {}, nullptr).code(), StatusCode::kInvalidInput);
  std::vector<float> small(3);
  EXPECT_EQ(fast::RmsNormForward(small, small, 2, 3, 1e-5, small, nullptr).code(),
            StatusCode::kInvalidInput);
}

// Attention, t past the 64-row blocks, compared relative to each output's largest reference
// component (worst-case bounds through the softmax Jacobian are too loose to catch a bug, so this
// one uses the conventions' typical size): every f32 product or sum on the way has at most
// K = max(t, hd) terms and errs by ~K eps relative to its output's scale; the backward chains ~6
// of them (S = QK^T, the softmax, dP = dO V^T, dS = P (dP - P.dP), then dQ / dK / dV), each error
// amplified at most ~10x by cancellation (dP - P.dP subtracts terms of the result's size, as in
// train_testutil.h's budget): tol = 6 * 10 * K * eps (5.4e-4 at t = 150).
TEST(FastOps, AttentionMatchesTheReference) {
  auto gen = Seeded(2804);
  ThreadPool pool(2);
  // Queries at 40x: peaky rows, most scores far below the row's maximum (exp underflows to 0).
  for (const auto& [t, q_scale] : {std::pair<int64_t, float>{1, 1.0f},
                                   {5, 1.0f},
                                   {64, 1.0f},
                                   {65, 1.0f},
                                   {150, 1.0f},
                                   {150, 40.0f}}) {
    const AttentionShape s{.t = t, .n_head = 4, .n_kv = 2, .hd = 8};
    const int64_t qd = s.n_head * s.hd, kvd = s.n_kv * s.hd;
    const auto q = RandomNormal(&gen, t * qd, q_scale), k = RandomNormal(&gen, t * kvd);
    const auto v = RandomNormal(&gen, t * kvd), dout = RandomNormal(&gen, t * qd);
    std::vector<float> o_ref(t * qd), o(t * qd);
    ASSERT_TRUE(AttentionForward(q, k, v, s, o_ref).ok());
    ASSERT_TRUE(fast::AttentionForward(q, k, v, s, o, &pool).ok());
    std::vector<float> dq_ref(t * qd), dq(t * qd), dk_ref(t * kvd), dk(t * kvd);
    std::vector<float> dv_ref(t * kvd), dv(t * kvd);
    ASSERT_TRUE(AttentionBackward(q, k, v, dout, s, dq_ref, dk_ref, dv_ref).ok());
    ASSERT_TRUE(fast::AttentionBackward(q, k, v, dout, s, dq, dk, dv, &pool).ok());
    const double tol = 6 * 10 * static_cast<double>(std::max(t, s.hd)) * kEps;
    auto rel = [](const std::vector<float>& got, const std::vector<float>& want) {
      return testing::MaxRelErr(got, std::vector<double>(want.begin(), want.end()));
    };
    const double eo = rel(o, o_ref), eq = rel(dq, dq_ref), ek = rel(dk, dk_ref);
    const double ev = rel(dv, dv_ref);
    std::printf("  t %lld, q x%g: rel err out %.3g, dq %.3g, dk %.3g, dv %.3g (tol %.3g)\n",
                static_cast<long long>(t), q_scale, eo, eq, ek, ev, tol);
    EXPECT_LE(eo, tol);
    EXPECT_LE(eq, tol);
    EXPECT_LE(ek, tol);
    EXPECT_LE(ev, tol);
  }
}

// Losses. Per row: f32 logits z (exact inputs), f32 exponentials (1 ulp each: the sum errs by
// ~(V + 2) eps relative), so logsumexp errs by ~(V + 2) eps, the row's CE term by that plus f32
// rounding of z / tau; the mean over rows keeps the bound: |dL| <= (V + 4) eps (1 + max|z| / tau).
// Gradients: softmax entries err by ~(V + 4) eps relative to themselves, divided by n (or tau n):
// |dgrad| <= (V + 4) eps / n (1 / tau for KL, x2 for its two distributions).
TEST(FastOps, LossesMatchTheReference) {
  auto gen = Seeded(2805);
  ThreadPool pool(3);
  for (const auto& [n, vocab] : {std::pair<int64_t, int64_t>{1, 11}, {9, 300}, {13, 4000}}) {
    const auto zs = RandomNormal(&gen, n * vocab, 3.0f), zt = RandomNormal(&gen, n * vocab, 3.0f);
    std::vector<int32_t> targets(n);
    for (auto& x : targets) x = static_cast<int32_t>(gen() % vocab);
    const double v = static_cast<double>(vocab), nn = static_cast<double>(n);
    double l_ref = 0, l = 0;
    std::vector<float> g_ref(n * vocab), g(n * vocab);
    ASSERT_TRUE(CrossEntropy(zs, targets, n, vocab, &l_ref, g_ref).ok());
    ASSERT_TRUE(fast::CrossEntropy(zs, targets, n, vocab, &l, g, &pool).ok());
    EXPECT_NEAR(l, l_ref, (v + 4) * kEps * (1 + MaxAbs(zs)));
    EXPECT_LE(MaxDiff(g, g_ref), (v + 4) * kEps / nn);
    double l_only = 0;
    ASSERT_TRUE(fast::CrossEntropy(zs, targets, n, vocab, &l_only, {}, &pool).ok());
    EXPECT_EQ(l_only, l);
    for (const double tau : {1.0, 2.5}) {
      ASSERT_TRUE(KlDivergence(zt, zs, n, vocab, tau, &l_ref, g_ref).ok());
      ASSERT_TRUE(fast::KlDivergence(zt, zs, n, vocab, tau, &l, g, &pool).ok());
      std::printf("  n %lld V %lld tau %.1f: KL %.9f vs %.9f, grad err %.3g\n",
                  static_cast<long long>(n), static_cast<long long>(vocab), tau, l, l_ref,
                  MaxDiff(g, g_ref));
      EXPECT_NEAR(l, l_ref, 2 * (v + 4) * kEps * (1 + 2 * MaxAbs(zs) / tau));
      EXPECT_LE(MaxDiff(g, g_ref), 2 * (v + 4) * kEps / (nn * tau));
      ASSERT_TRUE(fast::KlDivergence(zt, zs, n, vocab, tau, &l_only, {}, &pool).ok());
      EXPECT_EQ(l_only, l);
    }
  }
  double l = 0;
  std::vector<float> z(6);
  const std::vector<int32_t> bad = {0, 3};
  EXPECT_EQ(fast::CrossEntropy(z, bad, 2, 3, &l, {}, nullptr).code(), StatusCode::kInvalidInput);
  EXPECT_EQ(fast::KlDivergence(z, z, 2, 3, 0.0, &l, {}, nullptr).code(), StatusCode::kInvalidInput);
}

TEST(FastOps, EveryOpGivesTheSameBitsForAnyPoolSize) {
  auto gen = Seeded(2806);
  const int64_t n = 150, k = 200, m = 300, vocab = 500;
  const auto x = RandomNormal(&gen, n * k), w = RandomNormal(&gen, m * k);
  const auto dy = RandomNormal(&gen, n * m), g = RandomNormal(&gen, k);
  const auto dxk = RandomNormal(&gen, n * k);
  std::vector<int64_t> kept(m * k / 2);
  for (size_t i = 0; i < kept.size(); ++i) kept[i] = static_cast<int64_t>(2 * i + (i % 3 == 0));
  ExpectSameForAnyPool("linear", [&](ThreadPool* p) {
    std::vector<float> y(n * m), dx(n * k), dw(m * k, 1.0f), dk(kept.size(), 0.5f);
    EXPECT_TRUE(fast::LinearForward(x, w, n, k, m, y, p).ok());
    EXPECT_TRUE(fast::LinearBackwardInput(dy, w, n, k, m, dx, p).ok());
    EXPECT_TRUE(fast::LinearBackwardWeight(dy, x, n, k, m, dw, p).ok());
    EXPECT_TRUE(fast::LinearBackwardWeightMasked(dy, x, n, k, m, kept, dk, p).ok());
    y.insert(y.end(), dx.begin(), dx.end());
    y.insert(y.end(), dw.begin(), dw.end());
    y.insert(y.end(), dk.begin(), dk.end());
    return y;
  });
  ExpectSameForAnyPool("rmsnorm", [&](ThreadPool* p) {
    std::vector<float> y(n * k), dx(n * k), dg(k, 0.25f);
    EXPECT_TRUE(fast::RmsNormForward(x, g, n, k, 1e-5, y, p).ok());
    EXPECT_TRUE(fast::RmsNormBackward(x, g, dxk, n, k, 1e-5, dx, dg, p).ok());
    y.insert(y.end(), dx.begin(), dx.end());
    y.insert(y.end(), dg.begin(), dg.end());
    return y;
  });
  const AttentionShape s{.t = n, .n_head = 4, .n_kv = 2, .hd = 25};  // qd 100, kvd 50
  const auto q = RandomNormal(&gen, n * 100), kk = RandomNormal(&gen, n * 50);
  const auto v = RandomNormal(&gen, n * 50), dout = RandomNormal(&gen, n * 100);
  ExpectSameForAnyPool("attention", [&](ThreadPool* p) {
    std::vector<float> o(n * 100), dq(n * 100), dk(n * 50), dv(n * 50);
    EXPECT_TRUE(fast::AttentionForward(q, kk, v, s, o, p).ok());
    EXPECT_TRUE(fast::AttentionBackward(q, kk, v, dout, s, dq, dk, dv, p).ok());
    for (auto* t : {&dq, &dk, &dv}) o.insert(o.end(), t->begin(), t->end());
    return o;
  });
  const auto zs = RandomNormal(&gen, n * vocab, 2.0f), zt = RandomNormal(&gen, n * vocab, 2.0f);
  std::vector<int32_t> targets(n);
  for (auto& t : targets) t = static_cast<int32_t>(gen() % vocab);
  ExpectSameForAnyPool("losses", [&](ThreadPool* p) {
    std::vector<float> g1(n * vocab), g2(n * vocab);
    double l1 = 0, l2 = 0;
    EXPECT_TRUE(fast::CrossEntropy(zs, targets, n, vocab, &l1, g1, p).ok());
    EXPECT_TRUE(fast::KlDivergence(zt, zs, n, vocab, 2.0, &l2, g2, p).ok());
    g1.insert(g1.end(), g2.begin(), g2.end());
    g1.push_back(static_cast<float>(l1));
    g1.push_back(static_cast<float>(l1 - static_cast<float>(l1)));  // the double's low bits
    g1.push_back(static_cast<float>(l2));
    g1.push_back(static_cast<float>(l2 - static_cast<float>(l2)));
    return g1;
  });
}

}  // namespace
}  // namespace sparq::train
