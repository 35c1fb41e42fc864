// HessianAccumulator, ReconstructionError, ValidateHessian and the masks the pruning methods use
// (ComputeMask, with Wanda's row-wise option) against plain references.
#include <cblas.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "prune/prune_testutil.h"
#include "sparq/prune.h"

namespace sparq {
namespace {

// Wanda's selection: per-layer unstructured counts compared within rows.
const MaskOptions kRowWise{.row_wise = true};

TEST(Hessian, StreamedChunksMatchDirectSum) {
  testing::Problem pr = testing::MakeProblem(4, 70, 333, 21);
  HessianAccumulator acc(pr.k), acc2(pr.k);
  ThreadPool pool(2);
  int64_t r0 = 0;
  for (int64_t rows : {1, 0, 100, 32, 200}) {
    ASSERT_TRUE(acc.Add(pr.x.data() + r0 * pr.k, rows, pr.k, &pool).ok());
    r0 += rows;
  }
  ASSERT_EQ(r0, pr.n);
  ASSERT_TRUE(acc2.Add(pr.x.data(), pr.n, pr.k).ok());
  EXPECT_EQ(acc.num_samples(), pr.n);
  const auto h = acc.Hessian(), h2 = acc2.Hessian();
  for (int64_t i = 0; i < pr.k * pr.k; ++i) {
    // Double sums of 333 products of f32 values: relative 1e-12 is loose for the reassociation.
    EXPECT_NEAR(h[i], pr.h[i], 1e-12 * (std::abs(pr.h[i]) + pr.h[(i / pr.k) * (pr.k + 1)]));
    EXPECT_NEAR(h2[i], pr.h[i], 1e-12 * (std::abs(pr.h[i]) + pr.h[(i / pr.k) * (pr.k + 1)]));
    EXPECT_EQ(h[i], h[(i % pr.k) * pr.k + i / pr.k]);  // exactly symmetric
  }
  const auto norms = acc.ColumnNorms();
  const auto norms_h = ColumnNormsFromHessian(h, pr.k, pr.n);
  for (int64_t j = 0; j < pr.k; ++j) {
    double s = 0;
    for (int64_t t = 0; t < pr.n; ++t) s += static_cast<double>(pr.x[t * pr.k + j]) * pr.x[t * pr.k + j];
    EXPECT_NEAR(norms[j], std::sqrt(s), 1e-12 * std::sqrt(s));
    EXPECT_NEAR(norms_h[j], std::sqrt(s), 1e-9 * std::sqrt(s));
  }
}

// H is accumulated with the same bits for any pool size and OpenBLAS thread count: OpenBLAS's
// threaded dsyrk gives other bits than its serial one on its SkylakeX kernels at k = 100 and 257
// (k not a multiple of its tile). Also across the k values where our tile grid has a partial
// tile (257, 520 = 2 x 256 + 8) and one tile (100). The error report likewise (dgemm with H).
TEST(Hessian, SameBitsForAnyPoolAndOpenBlasThreads) {
  ThreadPool pool(2);
  for (int64_t k : {100, 257, 520}) {
    testing::Problem pr = testing::MakeProblem(8, k, 300, 31);  // 300 rows: panels of 256 + 44
    std::vector<std::vector<double>> hs;
    std::vector<double> errs;
    std::vector<float> wp = pr.w;
    for (size_t i = 0; i < wp.size(); i += 3) wp[i] = 0.0f;
    for (int blas : {1, 2}) {
      for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
        openblas_set_num_threads(blas);
        HessianAccumulator acc(k);
        ASSERT_TRUE(acc.Add(pr.x.data(), pr.n, k, p).ok());
        hs.push_back(acc.Hessian());
        errs.push_back(ReconstructionError(pr.w, wp, pr.m, k, hs.back(), p));
      }
    }
    openblas_set_num_threads(2);
    for (size_t i = 1; i < hs.size(); ++i) {
      EXPECT_EQ(0, std::memcmp(hs[0].data(), hs[i].data(), hs[0].size() * 8)) << k << " run " << i;
      EXPECT_EQ(0, std::memcmp(&errs[0], &errs[i], 8)) << k << " run " << i;
    }
  }
}

TEST(Hessian, RejectsBadInputs) {
  HessianAccumulator acc(3);
  std::vector<float> x = {1, 2, 3, 4, NAN, 6};
  Status st = acc.Add(x.data(), 2, 3, nullptr, "X.npy");
  EXPECT_EQ(st.code(), StatusCode::kInvalidInput);
  EXPECT_NE(st.message().find("X.npy: non-finite value at row 1, column 1"), std::string::npos)
      << st.message();
  EXPECT_FALSE(acc.Add(x.data(), 1, 4).ok());
  x[4] = INFINITY;
  EXPECT_FALSE(acc.Add(x.data(), 2, 3).ok());

  std::vector<double> h = {2, 1, 1, 2};
  EXPECT_TRUE(ValidateHessian(h, 2).ok());
  EXPECT_NE(ValidateHessian(std::vector<double>{2, 1, 1.5, 2}, 2).message().find("not symmetric at (0, 1)"),
            std::string::npos);
  EXPECT_NE(ValidateHessian(std::vector<double>{-1, 0, 0, 2}, 2).message().find("not positive semi-definite"),
            std::string::npos);
  EXPECT_NE(ValidateHessian(std::vector<double>{1, 3, 3, 1}, 2).message().find("not positive semi-definite"),
            std::string::npos);
  EXPECT_NE(ValidateHessian(std::vector<double>{1, NAN, NAN, 1}, 2).message().find("non-finite"), std::string::npos);
  EXPECT_FALSE(ValidateHessian(std::vector<double>{1, 0, 0}, 2).ok());
}

TEST(Hessian, ReconstructionErrorMatchesOutputsFromX) {
  testing::Problem pr = testing::MakeProblem(300, 90, 256, 2);  // 300 rows: two dgemm panels
  std::vector<float> wp = pr.w;
  for (size_t i = 0; i < wp.size(); i += 3) wp[i] = 0.0f;
  for (size_t i = 1; i < wp.size(); i += 7) wp[i] *= 1.5f;
  const double direct = testing::DirectError(pr, wp);
  const double from_h = ReconstructionError(pr.w, wp, pr.m, pr.k, pr.h);
  EXPECT_NEAR(from_h, direct, 1e-10 * direct);
  EXPECT_EQ(ReconstructionError(pr.w, pr.w, pr.m, pr.k, pr.h), 0.0);
}

// ComputeMask keeps exactly the top scores (compared with a full sort) and breaks ties toward the
// lower index.
TEST(PruneMask, KeepsTopScoresAndBreaksTiesByIndex) {
  const int64_t m = 7, k = 13;
  std::vector<float> s(m * k);
  for (int64_t i = 0; i < m * k; ++i) s[i] = static_cast<float>((i * 37) % 11);  // many ties
  auto mask = ComputeMask(Pattern::Unstructured(0.4), s, m, k, "w");
  ASSERT_TRUE(mask.ok());
  std::vector<int64_t> order(m * k);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return s[a] > s[b]; });
  const int64_t keep = m * k - std::llround(0.4 * m * k);
  for (int64_t r = 0; r < m * k; ++r) EXPECT_EQ((*mask)[order[r]], r < keep ? 1 : 0) << r;
  // Row-wise (Wanda): total exact, each row within one of f * k.
  auto rw = ComputeMask(Pattern::Unstructured(0.4), s, m, k, "w", kRowWise);
  ASSERT_TRUE(rw.ok());
  EXPECT_EQ(std::count(rw->begin(), rw->end(), 0), std::llround(0.4 * m * k));
  for (int64_t i = 0; i < m; ++i) {
    const auto z = std::count(rw->begin() + i * k, rw->begin() + (i + 1) * k, 0);
    EXPECT_LE(std::abs(z - 0.4 * k), 1.0);
  }
  // All-equal scores in a 2:4 group: the first two are kept.
  std::vector<float> eq(8, 1.0f);
  auto nm = ComputeMask(Pattern::NM(2, 4), eq, 1, 8, "w");
  ASSERT_TRUE(nm.ok());
  EXPECT_EQ(*nm, (std::vector<uint8_t>{1, 1, 0, 0, 1, 1, 0, 0}));
}

TEST(PruneMask, EveryPatternOnOddShapes) {
  for (auto [m, k] : {std::pair<int64_t, int64_t>{17, 23}, {16, 8}, {33, 130}}) {
    testing::Problem pr = testing::MakeProblem(m, k, 4, 1);
    std::vector<float> s(pr.w.size());
    for (size_t i = 0; i < s.size(); ++i) s[i] = std::abs(pr.w[i]);
    for (const Pattern& p : testing::AllPatterns()) {
      if (!CheckPatternFits(p, m, k, "w").ok()) continue;
      auto mask = ComputeMask(p, s, m, k, "w");
      ASSERT_TRUE(mask.ok()) << p.ToString();
      std::vector<float> w = pr.w;
      for (size_t i = 0; i < w.size(); ++i) w[i] *= (*mask)[i];
      EXPECT_EQ(testing::CheckPattern(p, w, m, k), "") << p.ToString() << " " << m << "x" << k;
      EXPECT_TRUE(Satisfies(p, w, m, k)) << p.ToString() << " " << m << "x" << k;
    }
  }
  // Dense keeps everything; fraction 0 and 1.
  std::vector<float> s(12, 1.0f);
  auto dense = ComputeMask(Pattern::Dense(), s, 3, 4, "w");
  EXPECT_EQ(std::count(dense->begin(), dense->end(), 1), 12);
  auto all = ComputeMask(Pattern::Unstructured(1.0), s, 3, 4, "w");
  EXPECT_EQ(std::count(all->begin(), all->end(), 0), 12);
  auto none = ComputeMask(Pattern::Unstructured(0.0), s, 3, 4, "w", kRowWise);
  EXPECT_EQ(std::count(none->begin(), none->end(), 0), 0);
}

TEST(MagnitudeGlobal, OneThresholdOverAllLayers) {
  std::vector<float> a = {1, -2, 3, -4, 5, 6}, b = {0.5f, 7, -8, 2, 2};
  std::vector<LayerRef> layers = {{a, "a"}, {b, "b"}};
  ASSERT_TRUE(MagnitudePruneGlobal(layers, 5.0 / 11).ok());
  // Sorted |w|: 0.5 1 2 2 2(b) 3 ... : prune 0.5, 1, and three 2s (a's -2, b's two 2s).
  EXPECT_EQ(a, (std::vector<float>{0, 0, 3, -4, 5, 6}));
  EXPECT_EQ(b, (std::vector<float>{0, 7, -8, 0, 0}));
  std::vector<float> c = {1, 1, 1, 1};
  std::vector<LayerRef> l2 = {{c, "c"}};
  ASSERT_TRUE(MagnitudePruneGlobal(l2, 0.5).ok());
  EXPECT_EQ(c, (std::vector<float>{1, 1, 0, 0}));  // ties: lower index kept
  c[0] = NAN;
  EXPECT_FALSE(MagnitudePruneGlobal(l2, 0.5).ok());
  EXPECT_FALSE(MagnitudePruneGlobal(l2, 1.5).ok());
}

}  // namespace
}  // namespace sparq
