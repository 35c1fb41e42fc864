// MLP training (sparq/train_mlp.h): the backward against finite differences in double, the 2:4
// mask's invariant, SR-STE's decay, determinism across thread counts, option errors.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "sparq/train_mlp.h"
#include "src/train/sparse24.h"
#include "tests/cpu/spmm_testutil.h"

namespace sparq::train {
namespace {

struct Batch {
  std::vector<float> x;
  std::vector<uint8_t> y;
  int64_t n = 0;
};

Batch MakeBatch(const std::vector<int64_t>& sizes, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Batch b;
  b.n = n;
  b.x.resize(n * sizes.front());
  for (float& v : b.x) v = u(rng);
  for (int64_t i = 0; i < n; ++i) b.y.push_back(static_cast<uint8_t>(rng() % sizes.back()));
  return b;
}

// The mean cross-entropy in double, from the effective weights (as doubles) and biases.
double LossRef(const std::vector<int64_t>& sizes, const std::vector<std::vector<double>>& w,
               const std::vector<std::vector<double>>& b, const Batch& batch) {
  double loss = 0.0;
  const int layers = static_cast<int>(w.size());
  for (int64_t i = 0; i < batch.n; ++i) {
    std::vector<double> a(batch.x.begin() + i * sizes[0], batch.x.begin() + (i + 1) * sizes[0]);
    for (int l = 0; l < layers; ++l) {
      std::vector<double> z(sizes[l + 1]);
      for (int64_t o = 0; o < sizes[l + 1]; ++o) {
        double s = b[l][o];
        for (int64_t k = 0; k < sizes[l]; ++k) s += w[l][o * sizes[l] + k] * a[k];
        z[o] = l + 1 < layers ? std::max(s, 0.0) : s;
      }
      a = z;
    }
    double mx = a[0], sum = 0.0;
    for (double v : a) mx = std::max(mx, v);
    for (double v : a) sum += std::exp(v - mx);
    loss += std::log(sum) + mx - a[batch.y[i]];
  }
  return loss / static_cast<double>(batch.n);
}

// Central differences in double of LossRef against every weight and bias entry (of the effective
// weights: the straight-through gradient of a 2:4 layer is the dense one of W_eff, pruned entries
// included), compared with Mlp::LossAndGrad in f32.
void CheckGradients(MlpOptions opt) {
  opt.srste = 0.0;
  auto m = Mlp::Create(opt);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  // Biases away from 0 so that the bias gradients are exercised through nonzero paths too.
  for (int l = 0; l < m->num_layers(); ++l) {
    for (size_t j = 0; j < m->bias(l).size(); ++j) m->bias(l)[j] = 0.1f * static_cast<float>(j % 3);
  }
  const Batch batch = MakeBatch(opt.sizes, 5, 7);
  ThreadPool pool(2);
  std::vector<std::vector<float>> dw, db;
  const double loss = m->LossAndGrad(batch.x.data(), batch.y.data(), batch.n, &dw, &db, &pool);
  std::vector<std::vector<double>> w, b;
  int64_t k_max = 0;
  for (int l = 0; l < m->num_layers(); ++l) {
    w.emplace_back(m->effective_weight(l).begin(), m->effective_weight(l).end());
    b.emplace_back(m->bias(l).begin(), m->bias(l).end());
    k_max = std::max({k_max, opt.sizes[l], batch.n});
  }
  EXPECT_NEAR(loss, LossRef(opt.sizes, w, b, batch), 1e-5);
  // Tolerance: every f32 quantity of the backward is a chain of L = 3 layers of sums of at most
  // k_max products, each sum off by at most k_max * eps32 times the sum of its terms' magnitudes
  // (Higham's gamma_k), and the forward's activations carry the same error into it; the terms
  // here are O(1) (inputs in [-1, 1], He weights, softmax probabilities), so |error| <=
  // 2 * L * k_max * eps32 * C with C a few units: take C = 8. The central difference in double with
  // h = 1e-6 is off by O(h^2 |f'''|) + O(eps64 / h) ~ 1e-10, far below.
  const double eps32 = std::numeric_limits<float>::epsilon();
  const double tol = 2.0 * m->num_layers() * static_cast<double>(k_max) * eps32 * 8.0;
  const double h = 1e-6;
  double worst = 0.0;
  for (int l = 0; l < m->num_layers(); ++l) {
    for (auto* which : {&w, &b}) {
      auto& p = (*which)[l];
      const auto& g = which == &w ? dw[l] : db[l];
      ASSERT_EQ(g.size(), p.size());
      for (size_t i = 0; i < p.size(); ++i) {
        const double keep = p[i];
        p[i] = keep + h;
        const double up = LossRef(opt.sizes, w, b, batch);
        p[i] = keep - h;
        const double down = LossRef(opt.sizes, w, b, batch);
        p[i] = keep;
        const double fd = (up - down) / (2.0 * h);
        worst = std::max(worst, std::fabs(fd - g[i]));
        EXPECT_NEAR(g[i], fd, tol) << "layer " << l << (which == &w ? " weight " : " bias ") << i;
      }
    }
  }
  std::printf("worst |analytic - finite difference| %.3g (tolerance %.3g)\n", worst, tol);
}

TEST(MlpTest, DenseBackwardMatchesFiniteDifferences) {
  MlpOptions opt;
  opt.sizes = {6, 5, 4, 3};
  opt.seed = 11;
  CheckGradients(opt);
}

TEST(MlpTest, SparseBackwardIsTheStraightThroughGradient) {
  MlpOptions opt;
  opt.sizes = {8, 8, 4, 3};
  opt.pattern = MlpPattern::k2of4;
  opt.seed = 12;
  CheckGradients(opt);
}

// Every group of 4 consecutive inputs of a sparse layer's row holds at most 2 nonzeros of the
// effective weights, and they are the 2 largest |w| of the master weights; the last layer is dense.
void ExpectMaskHolds(const Mlp& m) {
  for (int l = 0; l < m.num_layers(); ++l) {
    const int64_t in = m.options().sizes[l];
    const auto& we = m.effective_weight(l);
    const auto& w = m.weight(l);
    if (!m.sparse(l)) {
      EXPECT_EQ(l, m.num_layers() - 1);
      EXPECT_EQ(we, w);
      continue;
    }
    for (size_t g = 0; g < we.size(); g += 4) {
      int nonzero = 0, kept = 0;
      for (int i = 0; i < 4; ++i) {
        nonzero += we[g + i] != 0.0f;
        kept += m.mask(l)[g + i];
        EXPECT_EQ(we[g + i], m.mask(l)[g + i] ? w[g + i] : 0.0f);
      }
      EXPECT_LE(nonzero, 2) << "layer " << l << " group at " << g;
      EXPECT_EQ(kept, 2);
      ASSERT_EQ(in % 4, 0);
    }
  }
}

TEST(MlpTest, TwoOfFourMaskHoldsAndFollowsTheMasterWeights) {
  MlpOptions opt;
  opt.sizes = {16, 12, 8, 3};
  opt.pattern = MlpPattern::k2of4;
  opt.seed = 3;
  opt.lr = 0.1;
  auto m = Mlp::Create(opt);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ExpectMaskHolds(*m);
  const Batch batch = MakeBatch(opt.sizes, 8, 5);
  ThreadPool pool(1);
  for (int s = 0; s < 10; ++s) {
    m->Step(batch.x.data(), batch.y.data(), batch.n, opt.lr, &pool);
    ExpectMaskHolds(*m);
  }
  // The mask is recomputed from the master weights: the kept pair is each group's 2 largest |w|.
  m->UpdateMasks();
  const auto& w = m->weight(0);
  for (size_t g = 0; g < w.size(); g += 4) {
    float kept_min = INFINITY, pruned_max = 0.0f;
    for (int i = 0; i < 4; ++i) {
      if (m->mask(0)[g + i]) {
        kept_min = std::min(kept_min, std::fabs(w[g + i]));
      } else {
        pruned_max = std::max(pruned_max, std::fabs(w[g + i]));
      }
    }
    EXPECT_GE(kept_min, pruned_max);
  }
}

// The vector mask of 2:4 groups against the scalar loops, on every target: lengths around every
// target's vector of groups, with ties in |w| (a value and its negation, repeats), zeros of both
// signs, infinities and NaNs (which never outrank: every comparison with one is false).
TEST(MlpTest, VectorTwoOfFourMaskIsTheScalarOnesOnEveryTarget) {
  int64_t cases = 0;
  const int targets = testing_cpu::ForEachTarget([&](const std::string& target) {
    ASSERT_EQ(std::string(MaskAndApply2of4Target()), target);
    std::mt19937_64 rng(31);
    std::normal_distribution<float> nd;
    for (const int64_t groups : {0, 1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 33, 100}) {
      SCOPED_TRACE(target + ", " + std::to_string(groups) + " groups");
      const int64_t count = 4 * groups;
      std::vector<float> w(count);
      for (float& v : w) v = nd(rng);
      for (int64_t i = 0; i < count; ++i) {
        switch (rng() % 8) {
          case 0:
            w[i] = i % 4 ? -w[i - 1] : w[i];
            break;  // a tie with the entry before
          case 1:
            w[i] = i % 4 ? w[i - 1] : w[i];
            break;
          case 2:
            w[i] = (rng() & 1) ? 0.0f : -0.0f;
            break;
          case 3:
            w[i] = (rng() % 3 == 0)
                       ? std::numeric_limits<float>::quiet_NaN()
                       : ((rng() & 1) ? 1.0f : -1.0f) * std::numeric_limits<float>::infinity();
            break;
          default:
            break;
        }
      }
      std::vector<uint8_t> mask(count, 7), want_mask(count, 7);
      std::vector<float> weff(count, 5.0f), want(count);
      MaskAndApply2of4(w.data(), count, mask.data(), weff.data());
      MaskRow2of4(w.data(), count, want_mask.data());
      for (int64_t i = 0; i < count; ++i) want[i] = want_mask[i] ? w[i] : 0.0f;
      EXPECT_EQ(mask, want_mask);
      EXPECT_EQ(0, count == 0 ? 0 : std::memcmp(weff.data(), want.data(), count * sizeof(float)));
      ++cases;
    }
  });
  std::printf("  %d targets, %lld lengths each: the scalar loops' bytes\n", targets,
              static_cast<long long>(cases / std::max(targets, 1)));
  EXPECT_GE(targets, 2);
}

// The vector SGD-momentum update (SR-STE's decay on pruned entries, W_eff) against the scalar
// loop, on every target: every entry's v, w and W_eff bit for bit, dense (no mask) and masked,
// lengths around every target's vector. v and w start where mu * v and g nearly cancel, so that
// a fused multiply-add (or a reordered sum) changes the f32 result.
TEST(MlpTest, VectorMomentumUpdateIsTheScalarLoopOnEveryTarget) {
  const float mu = 0.9f, lr = 0.05f, lambda = 2e-4f;
  const int targets = testing_cpu::ForEachTarget([&](const std::string& target) {
    std::mt19937_64 rng(32);
    std::normal_distribution<float> nd;
    for (const int64_t count : {0, 1, 3, 4, 5, 15, 16, 17, 31, 33, 100, 1001}) {
      for (const bool masked : {false, true}) {
        SCOPED_TRACE(target + ", " + std::to_string(count) + (masked ? " masked" : " dense"));
        std::vector<float> g(count), v(count), w(count);
        std::vector<uint8_t> mask(count);
        for (int64_t i = 0; i < count; ++i) {
          g[i] = nd(rng);
          v[i] = -g[i] / mu * (1.0f + 1e-6f * nd(rng));
          w[i] = nd(rng);
          mask[i] = static_cast<uint8_t>(rng() % 2 ? 1 + rng() % 3 : 0);  // any nonzero keeps
        }
        std::vector<float> v_ref = v, w_ref = w, weff(count, 5.0f), weff_ref(count);
        for (int64_t i = 0; i < count; ++i) {
          const bool kept = !masked || mask[i] != 0;
          v_ref[i] = mu * v_ref[i] + (kept ? g[i] : g[i] + lambda * w_ref[i]);
          w_ref[i] -= lr * v_ref[i];
          weff_ref[i] = kept ? w_ref[i] : 0.0f;
        }
        SgdMomentumRun(g.data(), masked ? mask.data() : nullptr, count, mu, lr, lambda, v.data(),
                       w.data(), weff.data());
        auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
          return a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
        };
        EXPECT_TRUE(same(v, v_ref));
        EXPECT_TRUE(same(w, w_ref));
        EXPECT_TRUE(same(weff, weff_ref));
      }
    }
  });
  EXPECT_GE(targets, 2);
}

// Step makes the masks of the next step in its update pass when they are due: after such a step
// the masks are MaskRow2of4 of the weights it wrote, and a run whose every step starts by
// recomputing them (weight() marks them stale) is the same run bit for bit; between due steps
// the masks stay.
TEST(MlpTest, StepMakesTheDueMasksFromTheWeightsItWrote) {
  for (const int64_t every : {1, 3}) {
    SCOPED_TRACE("mask_every " + std::to_string(every));
    MlpOptions opt;
    opt.sizes = {32, 24, 16, 5};
    opt.pattern = MlpPattern::k2of4;
    opt.seed = 21;
    opt.mask_every = every;
    auto fused = Mlp::Create(opt);
    auto fresh = Mlp::Create(opt);
    ASSERT_TRUE(fused.ok() && fresh.ok());
    const Batch batch = MakeBatch(opt.sizes, 12, 4);
    ThreadPool pool(2);
    for (int64_t t = 1; t <= 7; ++t) {
      const std::vector<uint8_t> before = fused->mask(0);
      fresh->weight(0);  // stale: the step recomputes due masks at its start, as before
      EXPECT_EQ(fused->Step(batch.x.data(), batch.y.data(), batch.n, 0.05, &pool),
                fresh->Step(batch.x.data(), batch.y.data(), batch.n, 0.05, &pool));
      const Mlp& a = *fused;
      for (int l = 0; l < a.num_layers(); ++l) {
        EXPECT_EQ(a.weight(l), std::as_const(*fresh).weight(l)) << "layer " << l << ", step " << t;
      }
      for (int l = 0; l < 2; ++l) {
        const std::vector<float>& w = a.weight(l);
        if (t % every == 0) {
          std::vector<uint8_t> want(w.size());
          MaskRow2of4(w.data(), static_cast<int64_t>(w.size()), want.data());
          EXPECT_EQ(a.mask(l), want) << "layer " << l << ", step " << t;
        } else if (l == 0) {
          EXPECT_EQ(a.mask(0), before) << "step " << t;
        }
      }
      ExpectMaskHolds(a);
    }
  }
}

TEST(MlpTest, SrsteAddsLambdaTimesThePrunedWeights) {
  MlpOptions opt;
  opt.sizes = {8, 8, 4, 3};
  opt.pattern = MlpPattern::k2of4;
  opt.seed = 4;
  opt.srste = 0.0;
  auto a = Mlp::Create(opt);
  opt.srste = 0.25;
  auto b = Mlp::Create(opt);
  ASSERT_TRUE(a.ok() && b.ok());
  const Batch batch = MakeBatch(opt.sizes, 4, 9);
  std::vector<std::vector<float>> dwa, dba, dwb, dbb;
  a->LossAndGrad(batch.x.data(), batch.y.data(), batch.n, &dwa, &dba, nullptr);
  b->LossAndGrad(batch.x.data(), batch.y.data(), batch.n, &dwb, &dbb, nullptr);
  for (int l = 0; l < 2; ++l) {
    for (size_t i = 0; i < dwa[l].size(); ++i) {
      const float want = b->mask(l)[i] ? dwa[l][i] : dwa[l][i] + 0.25f * b->weight(l)[i];
      EXPECT_EQ(dwb[l][i], want) << "layer " << l << " entry " << i;
    }
  }
  EXPECT_EQ(dwa[2], dwb[2]);  // the dense last layer has no decay
}

double PrunedMagnitude(Mlp& m) {
  double s = 0.0;
  for (int l = 0; l < m.num_layers(); ++l) {
    if (!m.sparse(l)) continue;
    for (size_t i = 0; i < m.weight(l).size(); ++i) {
      if (!m.mask(l)[i]) s += std::fabs(m.weight(l)[i]);
    }
  }
  return s;
}

TEST(MlpTest, SrsteShrinksPrunedMasterWeights) {
  MlpOptions opt;
  opt.sizes = {16, 16, 8, 4};
  opt.pattern = MlpPattern::k2of4;
  opt.seed = 5;
  opt.lr = 0.05;
  opt.srste = 0.0;
  auto plain = Mlp::Create(opt);
  opt.srste = 0.5;
  auto decayed = Mlp::Create(opt);
  ASSERT_TRUE(plain.ok() && decayed.ok());
  const double before = PrunedMagnitude(*decayed);
  const Batch batch = MakeBatch(opt.sizes, 16, 6);
  for (int s = 0; s < 30; ++s) {
    plain->Step(batch.x.data(), batch.y.data(), batch.n, opt.lr, nullptr);
    decayed->Step(batch.x.data(), batch.y.data(), batch.n, opt.lr, nullptr);
  }
  plain->UpdateMasks();
  decayed->UpdateMasks();
  EXPECT_LT(PrunedMagnitude(*decayed), 0.9 * PrunedMagnitude(*plain));
  EXPECT_LT(PrunedMagnitude(*decayed), before);
}

TEST(MlpTest, StepsAreBitwiseTheSameForAnyThreadCount) {
  MlpOptions opt;
  opt.sizes = {64, 96, 40, 10};
  opt.pattern = MlpPattern::k2of4;
  opt.seed = 8;
  auto a = Mlp::Create(opt);
  auto b = Mlp::Create(opt);
  ASSERT_TRUE(a.ok() && b.ok());
  const Batch batch = MakeBatch(opt.sizes, 33, 2);
  ThreadPool one(1), three(3);
  for (int s = 0; s < 3; ++s) {
    EXPECT_EQ(a->Step(batch.x.data(), batch.y.data(), batch.n, 0.05, &one),
              b->Step(batch.x.data(), batch.y.data(), batch.n, 0.05, &three));
  }
  for (int l = 0; l < a->num_layers(); ++l) EXPECT_EQ(a->weight(l), b->weight(l));
}

TEST(MlpTest, RejectsBadOptionsNamingTheFlag) {
  MlpOptions opt;
  opt.mask_every = 0;
  auto r = Mlp::Create(opt);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("--mask-every"), std::string::npos);
  opt = MlpOptions();
  opt.srste = -1.0;
  EXPECT_NE(Mlp::Create(opt).status().message().find("--srste"), std::string::npos);
  opt = MlpOptions();
  opt.sizes = {6, 5, 3};
  opt.pattern = MlpPattern::k2of4;
  EXPECT_NE(Mlp::Create(opt).status().message().find("not a multiple of 4"), std::string::npos);
  MnistTrainOptions t;
  t.batch = 0;
  EXPECT_NE(TrainFashionMnist(t, nullptr).status().message().find("--batch"), std::string::npos);
}

}  // namespace
}  // namespace sparq::train
