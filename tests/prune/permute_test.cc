// Channel permutations: clustered large weights, brute force on tiny layers, X W^T invariance,
// Prune(..., permute) returning W' in the original column order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "prune/prune_testutil.h"
#include "sparq/prune.h"

namespace sparq {
namespace {

// A layer whose large weights sit in adjacent columns: columns 0..15 of every row are 10x larger,
// so each 2:4 group among them must drop two large weights unless the columns are spread out.
testing::Problem ClusteredProblem(int64_t m, int64_t k) {
  testing::Problem pr = testing::MakeProblem(m, k, 4 * k, 31);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < 16; ++j) pr.w[i * k + j] *= 10.0f;
  }
  return pr;
}

TEST(Permute, ClusteredLargeWeightsKeepMoreSaliencyAndLessError) {
  testing::Problem pr = ClusteredProblem(32, 64);
  std::vector<float> sal(pr.w.size());
  for (size_t i = 0; i < sal.size(); ++i) sal[i] = std::abs(pr.w[i]);
  PermuteOptions po;
  po.max_rounds = 50;
  po.time_budget_s = 60;
  auto res = FindPermutation(Pattern::NM(2, 4), sal, pr.m, pr.k, po);
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  ASSERT_TRUE(ValidatePermutation(res->perm, pr.k, "perm").ok());
  std::printf("kept saliency: identity %.3f, permuted %.3f (%lld rounds)\n", res->kept_identity,
              res->kept_permuted, static_cast<long long>(res->rounds));
  EXPECT_GT(res->kept_permuted, 1.15 * res->kept_identity);
  EXPECT_NEAR(res->kept_identity, KeptSaliency(Pattern::NM(2, 4), sal, pr.m, pr.k), 1e-3);
  EXPECT_NEAR(res->kept_permuted, KeptSaliency(Pattern::NM(2, 4), sal, pr.m, pr.k, res->perm), 1e-3);
  // Same search again: same permutation.
  auto again = FindPermutation(Pattern::NM(2, 4), sal, pr.m, pr.k, po);
  EXPECT_EQ(again->perm, res->perm);

  for (PruneMethod method : {PruneMethod::kMagnitude, PruneMethod::kWanda, PruneMethod::kSparseGpt}) {
    std::vector<float> plain = pr.w, perm = pr.w;
    PruneOptions opt;
    opt.method = method;
    auto r0 = Prune(plain, pr.m, pr.k, pr.h, Pattern::NM(2, 4), opt);
    opt.permute = true;
    opt.permute_max_rounds = 50;
    auto r1 = Prune(perm, pr.m, pr.k, pr.h, Pattern::NM(2, 4), opt);
    ASSERT_TRUE(r0.ok() && r1.ok());
    ASSERT_EQ(r1->permutation.size(), static_cast<size_t>(pr.k));
    std::printf("%s 2:4: error %.5f, with permutation %.5f\n", r0->method.c_str(), r0->rel_error,
                r1->rel_error);
    EXPECT_LT(r1->rel_error, 0.9 * r0->rel_error) << r0->method;
    // W' comes back in the original column order: W'[:, perm] is 2:4, W' itself need not be.
    std::vector<float> wperm(perm.size());
    PermuteColumns(perm, wperm, pr.m, pr.k, r1->permutation);
    EXPECT_EQ(testing::CheckPattern(Pattern::NM(2, 4), wperm, pr.m, pr.k), "");
    EXPECT_NEAR(r1->rel_error, testing::DirectError(pr, perm), 1e-6 * r1->rel_error);
  }
}

TEST(Permute, WorkBoundStopsAtTheSamePointEveryTime) {
  // The work bound replaces the clock for reproducible checkpoints: with no time budget the search
  // stops after the same number of evaluated swaps on every run, with the same permutation, and
  // a larger bound keeps at least as much saliency (the search only takes improving swaps).
  testing::Problem pr = ClusteredProblem(32, 256);
  std::vector<float> sal(pr.w.size());
  for (size_t i = 0; i < sal.size(); ++i) sal[i] = std::abs(pr.w[i]);
  PermuteOptions po;
  po.time_budget_s = 0;  // no clock
  auto full = FindPermutation(Pattern::NM(2, 4), sal, pr.m, pr.k, po);
  ASSERT_TRUE(full.ok()) << full.status().ToString();
  EXPECT_FALSE(full->hit_work_bound);
  EXPECT_FALSE(full->hit_time_budget);
  ASSERT_GT(full->evals, 64);
  // Work = swaps x row blocks scored; for 2:4 every one of the 32 rows is its own block.
  const int64_t rows = pr.m, max_swaps = full->evals / 4;
  po.max_work = max_swaps * rows;
  auto a = FindPermutation(Pattern::NM(2, 4), sal, pr.m, pr.k, po);
  auto b = FindPermutation(Pattern::NM(2, 4), sal, pr.m, pr.k, po);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(a->hit_work_bound);
  EXPECT_LE(a->evals, max_swaps);
  EXPECT_GT(a->evals, max_swaps - 16);  // stops within one pair of groups (M x M swaps)
  EXPECT_EQ(a->perm, b->perm);
  EXPECT_EQ(a->evals, b->evals);
  EXPECT_GE(a->kept_permuted, a->kept_identity);
  EXPECT_GE(full->kept_permuted, a->kept_permuted);
  EXPECT_NEAR(a->kept_permuted, KeptSaliency(Pattern::NM(2, 4), sal, pr.m, pr.k, a->perm),
              1e-3 * a->kept_permuted);
  // Through Prune(): the report carries the count and the early stop.
  std::vector<float> w = pr.w;
  PruneOptions opt;
  opt.method = PruneMethod::kWanda;
  opt.permute = true;
  opt.permute_time_budget_s = 0;
  opt.permute_max_work = po.max_work;
  auto rep = Prune(w, pr.m, pr.k, pr.h, Pattern::NM(2, 4), opt);
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  EXPECT_TRUE(rep->permute_stopped_early);
  EXPECT_GT(rep->permute_evals, 0);
  EXPECT_LE(rep->permute_evals, max_swaps);
}

TEST(Permute, ApplyingThePermutationToWAndXLeavesOutputsUnchanged) {
  // Small integers: every product and sum is exact in f32, so the check is exact.
  const int64_t m = 6, k = 12, n = 5;
  std::vector<float> w(m * k), x(n * k);
  for (int64_t i = 0; i < m * k; ++i) w[i] = static_cast<float>((i * 7) % 9 - 4);
  for (int64_t i = 0; i < n * k; ++i) x[i] = static_cast<float>((i * 5) % 7 - 3);
  std::vector<float> sal(w.size());
  for (size_t i = 0; i < w.size(); ++i) sal[i] = std::abs(w[i]);
  auto res = FindPermutation(Pattern::NM(2, 4), sal, m, k);
  ASSERT_TRUE(res.ok());
  std::vector<float> wp(w.size()), xp(x.size()), back(w.size());
  PermuteColumns(w, wp, m, k, res->perm);
  PermuteColumns(x, xp, n, k, res->perm);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = 0; i < m; ++i) {
      float y = 0, yp = 0;
      for (int64_t j = 0; j < k; ++j) {
        y += x[t * k + j] * w[i * k + j];
        yp += xp[t * k + j] * wp[i * k + j];
      }
      EXPECT_EQ(y, yp);
    }
  }
  UnpermuteColumns(wp, back, m, k, res->perm);
  EXPECT_EQ(back, w);
}

TEST(Permute, NearOptimalOnTinyLayersByBruteForce) {
  const int64_t m = 5, k = 8;
  testing::Problem pr = testing::MakeProblem(m, k, 1, 77);
  std::vector<float> sal(pr.w.size());
  for (size_t i = 0; i < sal.size(); ++i) sal[i] = std::abs(pr.w[i]);
  std::vector<int32_t> perm(k);
  std::iota(perm.begin(), perm.end(), 0);
  double best = 0;
  do {
    best = std::max(best, KeptSaliency(Pattern::NM(2, 4), sal, m, k, perm));
  } while (std::next_permutation(perm.begin(), perm.end()));
  auto res = FindPermutation(Pattern::NM(2, 4), sal, m, k);
  ASSERT_TRUE(res.ok());
  std::printf("tiny 2:4: identity %.4f, search %.4f, optimum %.4f\n", res->kept_identity,
              res->kept_permuted, best);
  EXPECT_GE(res->kept_permuted, 0.98 * best);
  EXPECT_GE(res->kept_permuted, res->kept_identity);
}

TEST(Permute, VnmAndTailGroups) {
  testing::Problem pr = ClusteredProblem(32, 70);  // 70 = 17 groups of 4 + a tail of 2
  std::vector<float> sal(pr.w.size());
  for (size_t i = 0; i < sal.size(); ++i) sal[i] = std::abs(pr.w[i]);
  for (const Pattern& p : {Pattern::VNM(8, 2, 4), Pattern::NM(2, 4), Pattern::NM(4, 8)}) {
    auto res = FindPermutation(p, sal, pr.m, pr.k);
    ASSERT_TRUE(res.ok()) << p.ToString();
    EXPECT_GT(res->kept_permuted, 1.1 * res->kept_identity) << p.ToString();
    std::vector<float> w = pr.w;
    PruneOptions opt;
    opt.permute = true;
    auto rep = Prune(w, pr.m, pr.k, pr.h, p, opt);
    ASSERT_TRUE(rep.ok()) << rep.status().ToString();
    std::vector<float> wperm(w.size());
    PermuteColumns(w, wperm, pr.m, pr.k, rep->permutation);
    EXPECT_EQ(testing::CheckPattern(p, wperm, pr.m, pr.k), "") << p.ToString();
  }
}

TEST(Permute, RejectsWhatItCannotDo) {
  std::vector<float> sal(16, 1.0f);
  EXPECT_FALSE(FindPermutation(Pattern::Unstructured(0.5), sal, 4, 4).ok());
  EXPECT_FALSE(FindPermutation(Pattern::NM(2, 4), sal, 4, 3).ok());
  sal[3] = -1;
  EXPECT_FALSE(FindPermutation(Pattern::NM(2, 4), sal, 4, 4).ok());
  EXPECT_FALSE(ValidatePermutation(std::vector<int32_t>{0, 0, 1}, 3, "p").ok());
  EXPECT_FALSE(ValidatePermutation(std::vector<int32_t>{0, 3, 1}, 3, "p").ok());
  EXPECT_FALSE(ValidatePermutation(std::vector<int32_t>{0, 1}, 3, "p").ok());
  std::vector<float> w(16, 1.0f);
  PruneOptions opt;
  opt.method = PruneMethod::kMagnitude;
  opt.permute = true;
  auto r = Prune(w, 4, 4, {}, Pattern::Rows(0.5), opt);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("N:M"), std::string::npos);
}

}  // namespace
}  // namespace sparq
