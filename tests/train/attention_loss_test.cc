// Gradient tests of causal grouped-query attention and of the two losses (cross-entropy, KL at
// a temperature) against central differences of independent f64 forwards (tolerance:
// train_testutil.h), and their error paths.
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
using testing::Project;
using testing::RandomNormal;
using testing::Seeded;
using testing::ToDouble;
using Vec = std::vector<double>;

// out[i, h] = sum_{j <= i} softmax_j(q[i, h] . k[j, h / group] / sqrt(hd)) v[j, h / group].
Vec Attention64(const Vec& q, const Vec& k, const Vec& v, const AttentionShape& s) {
  const int64_t group = s.n_head / s.n_kv, qd = s.n_head * s.hd, kvd = s.n_kv * s.hd;
  Vec out(q.size(), 0.0);
  for (int64_t h = 0; h < s.n_head; ++h) {
    const int64_t g = h / group;
    for (int64_t i = 0; i < s.t; ++i) {
      Vec w(i + 1);
      double z = 0.0;
      for (int64_t j = 0; j <= i; ++j) {
        double dot = 0.0;
        for (int64_t e = 0; e < s.hd; ++e)
          dot += q[i * qd + h * s.hd + e] * k[j * kvd + g * s.hd + e];
        w[j] = std::exp(dot / std::sqrt(static_cast<double>(s.hd)));
        z += w[j];
      }
      for (int64_t j = 0; j <= i; ++j)
        for (int64_t e = 0; e < s.hd; ++e)
          out[i * qd + h * s.hd + e] += w[j] / z * v[j * kvd + g * s.hd + e];
    }
  }
  return out;
}

double LogSumExp64(const double* z, int64_t n) {
  double mx = *std::max_element(z, z + n), s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(z[i] - mx);
  return mx + std::log(s);
}

double CrossEntropy64(const Vec& logits, const std::vector<int32_t>& targets, int64_t vocab) {
  const auto n = static_cast<int64_t>(targets.size());
  double l = 0.0;
  for (int64_t t = 0; t < n; ++t) {
    l += LogSumExp64(&logits[t * vocab], vocab) - logits[t * vocab + targets[t]];
  }
  return l / n;
}

double Kl64(const Vec& teacher, const Vec& student, int64_t n, int64_t vocab, double tau) {
  double l = 0.0;
  for (int64_t t = 0; t < n; ++t) {
    Vec a(vocab), b(vocab);
    for (int64_t v = 0; v < vocab; ++v) {
      a[v] = teacher[t * vocab + v] / tau;
      b[v] = student[t * vocab + v] / tau;
    }
    const double la = LogSumExp64(a.data(), vocab), lb = LogSumExp64(b.data(), vocab);
    for (int64_t v = 0; v < vocab; ++v) l += std::exp(a[v] - la) * ((a[v] - la) - (b[v] - lb));
  }
  return l / n;
}

void CheckAttention(const AttentionShape& s, uint64_t seed) {
  auto gen = Seeded(seed);
  const size_t qn = s.t * s.n_head * s.hd, kvn = s.t * s.n_kv * s.hd;
  auto q = RandomNormal(&gen, qn), k = RandomNormal(&gen, kvn), v = RandomNormal(&gen, kvn);
  auto r = RandomNormal(&gen, qn);
  std::vector<float> out(qn), dq(qn), dk(kvn, 7.0f), dv(kvn, 7.0f);  // 7: written, not added
  ASSERT_TRUE(AttentionForward(q, k, v, s, out).ok());
  const Vec qd = ToDouble(q), kd = ToDouble(k), vd = ToDouble(v);
  const Vec out64 = Attention64(qd, kd, vd, s);
  for (size_t i = 0; i < qn; ++i) EXPECT_NEAR(out[i], out64[i], 1e-5) << i;
  ASSERT_TRUE(AttentionBackward(q, k, v, r, s, dq, dk, dv).ok());
  ExpectGradNear("Attention dq", dq,
                 FdGrad([&](const Vec& x) { return Project(Attention64(x, kd, vd, s), r); }, qd));
  ExpectGradNear("Attention dk", dk,
                 FdGrad([&](const Vec& x) { return Project(Attention64(qd, x, vd, s), r); }, kd));
  ExpectGradNear("Attention dv", dv,
                 FdGrad([&](const Vec& x) { return Project(Attention64(qd, kd, x, s), r); }, vd));
}

TEST(TrainOps, AttentionBackwardOneHead) {
  CheckAttention({.t = 6, .n_head = 1, .n_kv = 1, .hd = 8}, 201);
}

// Four query heads on two KV heads (SmolLM2's 9 on 3 in small): dk, dv sum over each group.
TEST(TrainOps, AttentionBackwardGroupedQuery) {
  CheckAttention({.t = 5, .n_head = 4, .n_kv = 2, .hd = 4}, 202);
}

TEST(TrainOps, CrossEntropyBackward) {
  auto gen = Seeded(203);
  const int64_t n = 4, vocab = 11;
  auto logits = RandomNormal(&gen, n * vocab, 3.0f);
  const std::vector<int32_t> targets = {3, 0, 10, 3};
  std::vector<float> d(n * vocab);
  double loss = 0.0;
  ASSERT_TRUE(CrossEntropy(logits, targets, n, vocab, &loss, d).ok());
  const Vec ld = ToDouble(logits);
  EXPECT_NEAR(loss, CrossEntropy64(ld, targets, vocab), 1e-12);
  ExpectGradNear("CrossEntropy dlogits", d,
                 FdGrad([&](const Vec& x) { return CrossEntropy64(x, targets, vocab); }, ld));
  double loss_only = 0.0;
  ASSERT_TRUE(CrossEntropy(logits, targets, n, vocab, &loss_only, {}).ok());
  EXPECT_EQ(loss_only, loss);
}

TEST(TrainOps, KlDivergenceBackward) {
  auto gen = Seeded(204);
  const int64_t n = 3, vocab = 9;
  auto teacher = RandomNormal(&gen, n * vocab, 3.0f), student = RandomNormal(&gen, n * vocab, 3.0f);
  const Vec td = ToDouble(teacher), sd = ToDouble(student);
  for (double tau : {1.0, 2.0}) {
    std::printf(" tau %.1f\n", tau);
    std::vector<float> d(n * vocab);
    double loss = 0.0;
    ASSERT_TRUE(KlDivergence(teacher, student, n, vocab, tau, &loss, d).ok());
    EXPECT_NEAR(loss, Kl64(td, sd, n, vocab, tau), 1e-12);
    EXPECT_GT(loss, 0.0);
    ExpectGradNear("KL dstudent", d,
                   FdGrad([&](const Vec& x) { return Kl64(td, x, n, vocab, tau); }, sd));
  }
  double self = 1.0;  // KL(p || p) = 0, gradient 0
  std::vector<float> d(n * vocab, 1.0f);
  ASSERT_TRUE(KlDivergence(teacher, teacher, n, vocab, 2.0, &self, d).ok());
  EXPECT_NEAR(self, 0.0, 1e-15);
  for (float x : d) EXPECT_EQ(x, 0.0f);
}

// ---- error paths ------------------------------------------------------------------------------

void ExpectInvalid(const Status& st, const char* needle) {
  EXPECT_EQ(st.code(), StatusCode::kInvalidInput) << st.ToString();
  EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
}

TEST(TrainOps, ErrorsAttention) {
  const AttentionShape s{.t = 2, .n_head = 4, .n_kv = 2, .hd = 2};
  std::vector<float> q(16), kv(8), bad(7);
  ExpectInvalid(AttentionForward(q, bad, kv, s, q), "AttentionForward: k");
  ExpectInvalid(AttentionForward(q, kv, kv, s, bad), "AttentionForward: out");
  ExpectInvalid(AttentionBackward(q, kv, kv, q, s, q, kv, bad), "AttentionBackward: dv");
  ExpectInvalid(AttentionBackward(q, kv, kv, bad, s, q, kv, kv), "AttentionBackward: dout");
  const AttentionShape uneven{.t = 2, .n_head = 3, .n_kv = 2, .hd = 2};
  ExpectInvalid(AttentionForward(q, kv, kv, uneven, q), "multiple of n_kv");
}

TEST(TrainOps, ErrorsLosses) {
  std::vector<float> logits(6), d(6), bad(5);
  double loss = 0.0;
  const std::vector<int32_t> targets = {0, 2}, out_of_range = {0, 3}, short_targets = {0};
  ExpectInvalid(CrossEntropy(logits, out_of_range, 2, 3, &loss, d), "targets[1] = 3");
  ExpectInvalid(CrossEntropy(logits, short_targets, 2, 3, &loss, d), "CrossEntropy: targets");
  ExpectInvalid(CrossEntropy(bad, targets, 2, 3, &loss, d), "CrossEntropy: logits");
  ExpectInvalid(CrossEntropy(logits, targets, 2, 3, &loss, bad), "CrossEntropy: dlogits");
  ExpectInvalid(CrossEntropy({}, {}, 0, 3, &loss, {}), "n > 0");
  ExpectInvalid(KlDivergence(logits, bad, 2, 3, 1.0, &loss, d), "KlDivergence: student");
  ExpectInvalid(KlDivergence(logits, logits, 2, 3, 0.0, &loss, d), "temperature");
  ExpectInvalid(KlDivergence(logits, logits, 2, 3, NAN, &loss, d), "temperature");
}

}  // namespace
}  // namespace sparq::train
