// Masks against an independent brute-force selection: for every unit (tensor, row, group, block,
// slab-group), sort all candidates by (score desc, index asc) and keep the first `keep`.
// Integer-valued scores make ties frequent (so the tie rule is exercised) and block / column sums
// exact in double (so summation order cannot matter).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "formats/formats_testutil.h"
#include "sparq/pattern.h"

namespace sparq {
namespace {

using testing_formats::IntegerScores;
using testing_formats::RandomMatrix;

// Keeps the `keep` best of the candidates (unit ids with their scores); returns kept ids.
std::vector<int64_t> BruteTop(std::vector<std::pair<double, int64_t>> cand, int64_t keep) {
  std::sort(cand.begin(), cand.end(), [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  });
  std::vector<int64_t> out;
  for (int64_t i = 0; i < keep && i < static_cast<int64_t>(cand.size()); ++i) {
    out.push_back(cand[i].second);
  }
  return out;
}

int64_t Kept(double f, int64_t count) { return count - std::llround(f * count); }

std::vector<uint8_t> BruteMask(const Pattern& p, const std::vector<float>& s, int64_t m,
                               int64_t k) {
  std::vector<uint8_t> mask(m * k, 0);
  auto at = [&](int64_t i, int64_t j) { return static_cast<double>(s[i * k + j]); };
  switch (p.kind) {
    case PatternKind::kDense:
      std::fill(mask.begin(), mask.end(), 1);
      break;
    case PatternKind::kUnstructured:
      if (p.per_row) {
        for (int64_t i = 0; i < m; ++i) {
          std::vector<std::pair<double, int64_t>> c;
          for (int64_t j = 0; j < k; ++j) c.push_back({at(i, j), j});
          for (int64_t j : BruteTop(c, Kept(p.fraction, k))) mask[i * k + j] = 1;
        }
      } else {
        std::vector<std::pair<double, int64_t>> c;
        for (int64_t x = 0; x < m * k; ++x) c.push_back({s[x], x});
        for (int64_t x : BruteTop(c, Kept(p.fraction, m * k))) mask[x] = 1;
      }
      break;
    case PatternKind::kRows: {
      std::vector<std::pair<double, int64_t>> c;
      for (int64_t i = 0; i < m; ++i) {
        double sum = 0;
        for (int64_t j = 0; j < k; ++j) sum += at(i, j);
        c.push_back({sum, i});
      }
      for (int64_t i : BruteTop(c, Kept(p.fraction, m))) {
        for (int64_t j = 0; j < k; ++j) mask[i * k + j] = 1;
      }
      break;
    }
    case PatternKind::kCols: {
      std::vector<std::pair<double, int64_t>> c;
      for (int64_t j = 0; j < k; ++j) {
        double sum = 0;
        for (int64_t i = 0; i < m; ++i) sum += at(i, j);
        c.push_back({sum, j});
      }
      for (int64_t j : BruteTop(c, Kept(p.fraction, k))) {
        for (int64_t i = 0; i < m; ++i) mask[i * k + j] = 1;
      }
      break;
    }
    case PatternKind::kNM:
    case PatternKind::kVNM: {
      const int64_t v = p.kind == PatternKind::kVNM ? p.v : 1;
      for (int64_t r0 = 0; r0 < m; r0 += v) {
        const int64_t r1 = std::min(m, r0 + v);
        for (int64_t c0 = 0; c0 < k; c0 += p.m) {
          const int64_t c1 = std::min(k, c0 + p.m);
          std::vector<std::pair<double, int64_t>> c;
          for (int64_t j = c0; j < c1; ++j) {
            double sum = 0;
            for (int64_t i = r0; i < r1; ++i) sum += at(i, j);
            c.push_back({sum, j});
          }
          for (int64_t j : BruteTop(c, std::min<int64_t>(p.n, c1 - c0))) {
            for (int64_t i = r0; i < r1; ++i) mask[i * k + j] = 1;
          }
        }
      }
      break;
    }
    case PatternKind::kBlock: {
      const int64_t bc = (k + p.bw - 1) / p.bw, br = (m + p.bh - 1) / p.bh;
      std::vector<std::pair<double, int64_t>> c;
      for (int64_t b = 0; b < br * bc; ++b) {
        double sum = 0;
        for (int64_t i = (b / bc) * p.bh; i < std::min(m, (b / bc + 1) * p.bh); ++i) {
          for (int64_t j = (b % bc) * p.bw; j < std::min(k, (b % bc + 1) * p.bw); ++j) {
            sum += at(i, j);
          }
        }
        c.push_back({sum, b});
      }
      for (int64_t b : BruteTop(c, Kept(p.fraction, br * bc))) {
        for (int64_t i = (b / bc) * p.bh; i < std::min(m, (b / bc + 1) * p.bh); ++i) {
          for (int64_t j = (b % bc) * p.bw; j < std::min(k, (b % bc + 1) * p.bw); ++j) {
            mask[i * k + j] = 1;
          }
        }
      }
      break;
    }
  }
  return mask;
}

const Pattern kPatterns[] = {
    Pattern::Dense(),          Pattern::Unstructured(0.5),     Pattern::Unstructured(0.9),
    Pattern::Unstructured(0.0), Pattern::Unstructured(1.0),    Pattern::Unstructured(0.7, true),
    Pattern::Rows(0.3),        Pattern::Cols(0.3),             Pattern::Rows(1.0),
    Pattern::NM(2, 4),         Pattern::NM(1, 4),              Pattern::NM(4, 8),
    Pattern::NM(3, 7),         Pattern::NM(1, 16),             Pattern::NM(15, 16),
    Pattern::Block(4, 4, 0.5), Pattern::Block(16, 16, 0.9),    Pattern::Block(1, 8, 0.6),
    Pattern::Block(3, 5, 0.5), Pattern::VNM(2, 2, 4),          Pattern::VNM(8, 2, 4),
    Pattern::VNM(4, 3, 8),     Pattern::VNM(64, 1, 4),
};

struct Shape {
  int64_t m, k;
};
const Shape kShapes[] = {{1, 1}, {1, 7}, {7, 1}, {5, 9}, {16, 16}, {17, 33}, {9, 30}, {0, 5},
                         {5, 0}, {0, 0}};

TEST(ComputeMask, MatchesBruteForceWithTies) {
  uint64_t seed = 1;
  for (const Pattern& p : kPatterns) {
    for (const Shape& sh : kShapes) {
      for (int levels : {3, 1000}) {
        SCOPED_TRACE(p.ToString() + " " + std::to_string(sh.m) + "x" + std::to_string(sh.k) +
                     " levels=" + std::to_string(levels) + " seed=" + std::to_string(seed));
        const std::vector<float> s = IntegerScores(sh.m, sh.k, seed++, levels);
        auto mask = ComputeMask(p, s, sh.m, sh.k, "t");
        ASSERT_TRUE(mask.ok()) << mask.status().ToString();
        const std::vector<uint8_t> want = BruteMask(p, s, sh.m, sh.k);
        ASSERT_EQ(*mask, want);
      }
    }
  }
}

TEST(ComputeMask, ExactCountsAndInvariantsOnFloatScores) {
  const int64_t m = 40, k = 70;
  std::vector<float> w = RandomMatrix(m, k, 7, 0.0);
  for (float& x : w) x = std::fabs(x);
  for (const Pattern& p : kPatterns) {
    SCOPED_TRACE(p.ToString());
    auto mask = ComputeMask(p, w, m, k, "t");
    ASSERT_TRUE(mask.ok());
    ASSERT_EQ(*mask, BruteMask(p, w, m, k));
    std::vector<float> pruned = w;
    ApplyMask(pruned, *mask);
    EXPECT_TRUE(Satisfies(p, pruned, m, k));
    const int64_t kept = std::count(mask->begin(), mask->end(), uint8_t{1});
    if (p.kind == PatternKind::kUnstructured && !p.per_row) {
      EXPECT_EQ(kept, Kept(p.fraction, m * k));
    }
    if (p.kind == PatternKind::kNM) {
      // Every full group keeps exactly n; the tail (70 % m) keeps min(n, r).
      const int64_t full = k / p.m, r = k % p.m;
      EXPECT_EQ(kept, m * (full * p.n + std::min<int64_t>(p.n, r)));
    }
    if (p.kind == PatternKind::kRows) {
      EXPECT_EQ(kept, Kept(p.fraction, m) * k);
    }
    if (p.kind == PatternKind::kCols) {
      EXPECT_EQ(kept, Kept(p.fraction, k) * m);
    }
  }
}

TEST(ComputeMask, TiesKeepTheLowerIndex) {
  const std::vector<float> s(8, 1.0f);
  EXPECT_EQ(*ComputeMask(Pattern::NM(2, 4), s, 1, 8),
            (std::vector<uint8_t>{1, 1, 0, 0, 1, 1, 0, 0}));
  EXPECT_EQ(*ComputeMask(Pattern::Unstructured(0.75), s, 2, 4),
            (std::vector<uint8_t>{1, 1, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(*ComputeMask(Pattern::Rows(0.5), s, 2, 4),
            (std::vector<uint8_t>{1, 1, 1, 1, 0, 0, 0, 0}));
  // -0 and +0 are equal scores: the index decides.
  const std::vector<float> z = {-0.0f, 0.0f, 0.0f, -0.0f};
  EXPECT_EQ(*ComputeMask(Pattern::NM(2, 4), z, 1, 4), (std::vector<uint8_t>{1, 1, 0, 0}));
  // Same call twice: same mask.
  const std::vector<float> r = IntegerScores(33, 65, 3, 4);
  for (const Pattern& p : kPatterns) {
    EXPECT_EQ(*ComputeMask(p, r, 33, 65), *ComputeMask(p, r, 33, 65)) << p.ToString();
  }
}

TEST(ComputeMask, NonFiniteScoresNameTheTensorAndPosition) {
  std::vector<float> s(12, 1.0f);
  s[7] = std::numeric_limits<float>::quiet_NaN();
  auto r = ComputeMask(Pattern::NM(2, 4), s, 3, 4, "blk.0.ffn_up");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidInput);
  EXPECT_NE(r.status().message().find("blk.0.ffn_up"), std::string::npos);
  EXPECT_NE(r.status().message().find("row 1, col 3"), std::string::npos);
  EXPECT_NE(r.status().message().find("NaN"), std::string::npos);
  s[7] = -std::numeric_limits<float>::infinity();
  r = ComputeMask(Pattern::Unstructured(0.5), s, 3, 4, "w");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("infinite"), std::string::npos);
}

TEST(ComputeMask, BadShapeOrPattern) {
  std::vector<float> s(12, 1.0f);
  auto r = ComputeMask(Pattern::NM(2, 4), s, 3, 5, "w");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("12 scores for a 3 x 5"), std::string::npos);
  r = ComputeMask(Pattern::NM(4, 2), s, 3, 4, "w");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("w: pattern 4:2"), std::string::npos);
  EXPECT_FALSE(ComputeMask(Pattern::Dense(), s, -3, -4, "w").ok());
}

TEST(MagnitudePrune, PrunesSmallestMagnitudes) {
  std::vector<float> w = {0.1f, -3.0f, 2.0f, -0.5f, 4.0f, 0.0f, -1.0f, 0.2f};
  ASSERT_TRUE(MagnitudePrune(Pattern::NM(2, 4), w, 1, 8).ok());
  EXPECT_EQ(w, (std::vector<float>{0.0f, -3.0f, 2.0f, 0.0f, 4.0f, 0.0f, -1.0f, 0.0f}));
  std::vector<float> bad = {1.0f, std::numeric_limits<float>::quiet_NaN()};
  EXPECT_FALSE(MagnitudePrune(Pattern::NM(1, 2), bad, 1, 2, "x").ok());
}

TEST(ComputeMask, LargeUnstructuredKeepsExactCount) {
  const int64_t m = 300, k = 1000;
  std::vector<float> s = IntegerScores(m, k, 11, 50);  // heavy ties across the threshold
  auto mask = ComputeMask(Pattern::Unstructured(0.9), s, m, k);
  ASSERT_TRUE(mask.ok());
  EXPECT_EQ(std::count(mask->begin(), mask->end(), uint8_t{1}), 30000);
  ASSERT_EQ(*mask, BruteMask(Pattern::Unstructured(0.9), s, m, k));
}

}  // namespace
}  // namespace sparq
