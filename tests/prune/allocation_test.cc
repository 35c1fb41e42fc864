// Per-layer sparsity lists, OWL allocation and the cubic schedule.
#include <gtest/gtest.h>

#include <cmath>

#include "sparq/prune.h"

namespace sparq {
namespace {

TEST(Allocation, ParsesSparsityLists) {
  EXPECT_EQ(*ParseSparsityList("0.5", 3), (std::vector<double>{0.5, 0.5, 0.5}));
  EXPECT_EQ(*ParseSparsityList("0.1,0.2,1", 3), (std::vector<double>{0.1, 0.2, 1.0}));
  EXPECT_FALSE(ParseSparsityList("0.1,0.2", 3).ok());
  EXPECT_FALSE(ParseSparsityList("0.1,x,0.3", 3).ok());
  EXPECT_FALSE(ParseSparsityList("1.5", 1).ok());
  EXPECT_FALSE(ParseSparsityList("", 1).ok());
  EXPECT_FALSE(ParseSparsityList("0.1,,0.2", 3).ok());
}

TEST(Allocation, OwlGivesOutlierLayersLessSparsityAndMeetsTheBudget) {
  const std::vector<double> ratios = {0.01, 0.05, 0.02, 0.10};
  const std::vector<int64_t> numel = {100, 200, 300, 400};
  auto s = OwlSparsities(ratios, numel, 0.7, 0.08);
  ASSERT_TRUE(s.ok());
  double weighted = 0;
  for (size_t l = 0; l < s->size(); ++l) weighted += (*s)[l] * numel[l];
  EXPECT_NEAR(weighted / 1000, 0.7, 1e-9);
  EXPECT_GT((*s)[0], (*s)[2]);
  EXPECT_GT((*s)[2], (*s)[1]);
  EXPECT_GT((*s)[1], (*s)[3]);
  // Spread is 2 * lambda between the least and the most outlier-heavy layer.
  EXPECT_NEAR((*s)[0] - (*s)[3], 0.16, 1e-9);
  // Clamping near the ends keeps the budget.
  auto hi = OwlSparsities(ratios, numel, 0.98, 0.08);
  ASSERT_TRUE(hi.ok());
  weighted = 0;
  for (size_t l = 0; l < hi->size(); ++l) {
    EXPECT_LE((*hi)[l], 1.0);
    weighted += (*hi)[l] * numel[l];
  }
  EXPECT_NEAR(weighted / 1000, 0.98, 1e-9);
  EXPECT_FALSE(OwlSparsities(ratios, std::vector<int64_t>{1, 2}, 0.5).ok());
  EXPECT_FALSE(OwlSparsities(ratios, numel, 1.5).ok());
}

TEST(Allocation, OutlierRatioCountsLargeWandaScores) {
  // 1 x 10 layer: nine scores of 1 and one of 100: mean 10.9, threshold 5 -> one outlier.
  std::vector<float> w(10, 1.0f);
  w[3] = 100.0f;
  std::vector<double> norms(10, 1.0);
  EXPECT_DOUBLE_EQ(OutlierRatio(w, 1, 10, norms, 5.0), 0.1);
  EXPECT_DOUBLE_EQ(OutlierRatio(w, 1, 10, norms, 50.0), 0.0);
}

TEST(Schedule, CubicZhuGupta) {
  CubicSchedule s;
  s.initial_sparsity = 0.0;
  s.final_sparsity = 0.8;
  s.start_step = 100;
  s.num_updates = 4;
  s.frequency = 10;
  ASSERT_TRUE(s.Validate().ok());
  EXPECT_EQ(s.At(0), 0.0);
  EXPECT_EQ(s.At(100), 0.0);
  EXPECT_NEAR(s.At(110), 0.8 - 0.8 * std::pow(0.75, 3), 1e-12);
  EXPECT_NEAR(s.At(119), s.At(110), 0.0);  // held between updates
  EXPECT_NEAR(s.At(120), 0.8 - 0.8 * 0.125, 1e-12);
  EXPECT_EQ(s.At(140), 0.8);
  EXPECT_EQ(s.At(100000), 0.8);
  for (int64_t t = 100; t < 150; ++t) EXPECT_LE(s.At(t), s.At(t + 1));
  EXPECT_TRUE(s.IsUpdateStep(100));
  EXPECT_TRUE(s.IsUpdateStep(140));
  EXPECT_FALSE(s.IsUpdateStep(105));
  EXPECT_FALSE(s.IsUpdateStep(150));
  s.frequency = 0;
  EXPECT_FALSE(s.Validate().ok());
}

}  // namespace
}  // namespace sparq
