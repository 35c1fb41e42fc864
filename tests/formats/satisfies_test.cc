#include <gtest/gtest.h>

#include <limits>
#include <vector>

#include "formats/formats_testutil.h"
#include "sparq/pattern.h"

namespace sparq {
namespace {

using testing_formats::RandomMatrix;

TEST(Satisfies, NMGroupsAndTail) {
  // 2 x 6, groups of 4 along k, tail of 2.
  std::vector<float> w = {1, 0, 2, 0, 3, 4,  //
                          0, 0, 0, 5, 6, 0};
  EXPECT_TRUE(Satisfies(Pattern::NM(2, 4), w, 2, 6));
  EXPECT_FALSE(Satisfies(Pattern::NM(1, 4), w, 2, 6));  // row 0 group 0 has 2
  w[1] = 7;                                              // row 0 group 0 now has 3
  EXPECT_FALSE(Satisfies(Pattern::NM(2, 4), w, 2, 6));
  EXPECT_TRUE(Satisfies(Pattern::NM(3, 4), w, 2, 6));
  // The tail group (r = 2) allows min(n, r) = 2.
  EXPECT_TRUE(Satisfies(Pattern::NM(3, 4), std::vector<float>{0, 0, 0, 0, 1, 1}, 1, 6));
  EXPECT_FALSE(Satisfies(Pattern::NM(1, 4), std::vector<float>{0, 0, 0, 0, 1, 1}, 1, 6));
  // -0 and NaN: -0 is zero, NaN is not.
  EXPECT_TRUE(Satisfies(Pattern::NM(1, 2), std::vector<float>{-0.0f, 1}, 1, 2));
  EXPECT_FALSE(Satisfies(Pattern::NM(1, 2),
                         std::vector<float>{std::numeric_limits<float>::quiet_NaN(), 1}, 1, 2));
}

TEST(Satisfies, VNMNeedsSharedColumns) {
  const std::vector<float> shared = {1, 0, 2, 0,  //
                                     3, 0, 4, 0,  //
                                     0, 5, 0, 6};
  EXPECT_TRUE(Satisfies(Pattern::VNM(2, 2, 4), shared, 3, 4));
  EXPECT_FALSE(Satisfies(Pattern::VNM(4, 2, 4), shared, 3, 4));  // one slab of 3 rows: 4 cols
  EXPECT_TRUE(Satisfies(Pattern::NM(2, 4), shared, 3, 4));
}

TEST(Satisfies, FractionPatterns) {
  std::vector<float> w = RandomMatrix(10, 10, 1, 0.0);
  for (int i = 0; i < 30; ++i) w[i * 3] = 0;  // 30 zeros, 3 per row
  EXPECT_TRUE(Satisfies(Pattern::Unstructured(0.3), w, 10, 10));
  EXPECT_TRUE(Satisfies(Pattern::Unstructured(0.305), w, 10, 10));  // floor(30.5) = 30
  EXPECT_FALSE(Satisfies(Pattern::Unstructured(0.31), w, 10, 10));
  EXPECT_FALSE(Satisfies(Pattern::Unstructured(0.3, true), w, 10, 10));  // rows 0..9 uneven
  EXPECT_TRUE(Satisfies(Pattern::Dense(), w, 10, 10));

  std::vector<float> rows = RandomMatrix(10, 8, 2, 0.0);
  for (int j = 0; j < 8; ++j) rows[2 * 8 + j] = rows[5 * 8 + j] = rows[7 * 8 + j] = 0;
  EXPECT_TRUE(Satisfies(Pattern::Rows(0.3), rows, 10, 8));
  EXPECT_FALSE(Satisfies(Pattern::Rows(0.4), rows, 10, 8));
  EXPECT_FALSE(Satisfies(Pattern::Cols(0.2), rows, 10, 8));  // needs floor(1.6) = 1 zero column
  // Scattered zeros do not make whole rows.
  std::vector<float> scattered = RandomMatrix(10, 8, 3, 0.0);
  for (int i = 0; i < 10; ++i) scattered[i * 8 + i % 8] = 0;
  EXPECT_FALSE(Satisfies(Pattern::Rows(0.1), scattered, 10, 8));
  EXPECT_TRUE(Satisfies(Pattern::Unstructured(0.1), scattered, 10, 8));

  std::vector<float> cols = RandomMatrix(6, 10, 4, 0.0);
  for (int i = 0; i < 6; ++i) cols[i * 10 + 1] = cols[i * 10 + 9] = 0;
  EXPECT_TRUE(Satisfies(Pattern::Cols(0.2), cols, 6, 10));
  EXPECT_FALSE(Satisfies(Pattern::Cols(0.3), cols, 6, 10));
}

TEST(Satisfies, Blocks) {
  // 4 x 6 in 2x3 blocks (4 blocks); zero block (1, 0), plus a lone zero in block (0, 0).
  std::vector<float> w = RandomMatrix(4, 6, 5, 0.0);
  for (int i = 2; i < 4; ++i) {
    for (int j = 0; j < 3; ++j) w[i * 6 + j] = 0;
  }
  w[0] = 0;
  EXPECT_TRUE(Satisfies(Pattern::Block(2, 3, 0.25), w, 4, 6));
  EXPECT_FALSE(Satisfies(Pattern::Block(2, 3, 0.5), w, 4, 6));
  // In 3x2 blocks only the edge block rows 3, cols 0..1 is zero: 1 of 6, fraction 0.5 needs 3.
  EXPECT_TRUE(Satisfies(Pattern::Block(3, 2, 1.0 / 6), w, 4, 6));
  EXPECT_FALSE(Satisfies(Pattern::Block(3, 2, 0.5), w, 4, 6));
  // Edge blocks are partial: 5 x 7 in 4x4 blocks, the zero edge block (1, 1) is 1 x 3.
  std::vector<float> e = RandomMatrix(5, 7, 6, 0.0);
  for (int j = 4; j < 7; ++j) e[4 * 7 + j] = 0;
  EXPECT_TRUE(Satisfies(Pattern::Block(4, 4, 0.25), e, 5, 7));
}

TEST(Satisfies, BadShapeOrPatternIsFalse) {
  std::vector<float> w(6, 0.0f);
  EXPECT_FALSE(Satisfies(Pattern::Dense(), w, 2, 4));
  EXPECT_FALSE(Satisfies(Pattern::NM(4, 2), w, 2, 3));
  EXPECT_FALSE(Satisfies(Pattern::Dense(), w, -2, -3));
}

TEST(FinestPattern, NamesWhatWasApplied) {
  const int64_t m = 64, k = 96;
  auto pruned = [&](const Pattern& p, uint64_t seed) {
    std::vector<float> w = RandomMatrix(m, k, seed, 0.0);
    EXPECT_TRUE(MagnitudePrune(p, w, m, k).ok());
    return w;
  };
  EXPECT_EQ(FinestPattern(RandomMatrix(m, k, 1, 0.0), m, k), Pattern::Dense());
  EXPECT_EQ(FinestPattern(std::vector<float>(m * k, 0.0f), m, k), Pattern::Unstructured(1.0));
  for (const Pattern& p : {Pattern::NM(2, 4), Pattern::NM(1, 4), Pattern::NM(4, 8),
                           Pattern::NM(1, 8), Pattern::NM(2, 16), Pattern::NM(8, 16)}) {
    EXPECT_EQ(FinestPattern(pruned(p, 2), m, k), p) << p.ToString();
  }
  for (const Pattern& p : {Pattern::VNM(8, 2, 4), Pattern::VNM(16, 2, 4), Pattern::VNM(2, 1, 4),
                           Pattern::VNM(64, 4, 8)}) {
    EXPECT_EQ(FinestPattern(pruned(p, 3), m, k), p) << p.ToString();
  }
  EXPECT_EQ(FinestPattern(pruned(Pattern::Rows(0.25), 4), m, k), Pattern::Rows(0.25));
  EXPECT_EQ(FinestPattern(pruned(Pattern::Cols(0.5), 5), m, k), Pattern::Cols(0.5));
  // 16x16 blocks, 3 of 24 zero, placed so that no 32x32 / 64x64 block is wholly zero.
  std::vector<float> b = RandomMatrix(m, k, 6, 0.0);
  for (auto [br, bc] : {std::pair{0, 0}, {1, 3}, {3, 5}}) {
    for (int i = br * 16; i < br * 16 + 16; ++i) {
      for (int j = bc * 16; j < bc * 16 + 16; ++j) b[i * k + j] = 0;
    }
  }
  EXPECT_EQ(FinestPattern(b, m, k), Pattern::Block(16, 16, 3.0 / 24));
  const Pattern u = FinestPattern(pruned(Pattern::Unstructured(0.7), 7), m, k);
  EXPECT_EQ(u.kind, PatternKind::kUnstructured);
  EXPECT_NEAR(u.fraction, 0.7, 1.0 / (m * k));
  // A single column holds no full N:M group: its zeros are whole rows.
  EXPECT_EQ(FinestPattern(std::vector<float>{1, 0, 2, 0, 3, 0, 4, 0}, 8, 1), Pattern::Rows(0.5));
  // What FinestPattern reports, the tensor satisfies.
  for (uint64_t seed = 10; seed < 14; ++seed) {
    const std::vector<float> w = pruned(Pattern::Unstructured(0.5, true), seed);
    EXPECT_TRUE(Satisfies(FinestPattern(w, m, k), w, m, k));
  }
}

}  // namespace
}  // namespace sparq
