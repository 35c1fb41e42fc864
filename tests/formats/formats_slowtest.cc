// Full-size checks (label `slow`): masks, FinestPattern and encodings on an 11008 x 4096 layer
// (a Llama-7B MLP weight). Prints the time of each step; the bounds are loose (a shared 2-core
// machine) and only catch an accidental O(n log n) -> O(n^2) or a per-element allocation.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>

#include "formats/formats_testutil.h"
#include "sparq/format.h"
#include "sparq/pattern.h"

namespace sparq {
namespace {

constexpr int64_t kRows = 11008, kCols = 4096;

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST(FormatsLarge, MaskFinestPatternEncodeOnLlama7bMlp) {
  const std::vector<float> w = testing_formats::RandomMatrix(kRows, kCols, 42, 0.0);
  std::vector<float> scores(w.size());
  for (size_t i = 0; i < w.size(); ++i) scores[i] = std::fabs(w[i]);
  {
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(FinestPattern(w, kRows, kCols), Pattern::Dense());
    std::printf("FinestPattern dense: %.3f s\n", Seconds(t0));
  }
  for (const Pattern& p :
       {Pattern::NM(2, 4), Pattern::NM(4, 8), Pattern::Unstructured(0.9),
        Pattern::Unstructured(0.5, true), Pattern::Block(16, 16, 0.5), Pattern::VNM(16, 2, 4),
        Pattern::Rows(0.3), Pattern::Cols(0.3)}) {
    SCOPED_TRACE(p.ToString());
    auto t0 = std::chrono::steady_clock::now();
    auto mask = ComputeMask(p, scores, kRows, kCols, "large");
    const double mask_s = Seconds(t0);
    ASSERT_TRUE(mask.ok());
    std::vector<float> pruned = w;
    ApplyMask(pruned, *mask);
    t0 = std::chrono::steady_clock::now();
    EXPECT_TRUE(Satisfies(p, pruned, kRows, kCols));
    const double sat_s = Seconds(t0);
    t0 = std::chrono::steady_clock::now();
    const Pattern finest = FinestPattern(pruned, kRows, kCols);
    const double finest_s = Seconds(t0);
    EXPECT_TRUE(Satisfies(finest, pruned, kRows, kCols)) << finest.ToString();
    if (p.kind == PatternKind::kNM || p.kind == PatternKind::kVNM || p.kind == PatternKind::kBlock) {
      EXPECT_EQ(finest, p) << finest.ToString();
    }
    if (p.kind == PatternKind::kRows || p.kind == PatternKind::kCols) {
      // The measured fraction: llround(0.3 * count) / count.
      EXPECT_EQ(finest.kind, p.kind) << finest.ToString();
      EXPECT_NEAR(finest.fraction, p.fraction, 1.0 / 4096) << finest.ToString();
    }
    t0 = std::chrono::steady_clock::now();
    auto enc = Encode(pruned, kRows, kCols, PickFormat(p), p, DType::kBF16);
    const double enc_s = Seconds(t0);
    ASSERT_TRUE(enc.ok());
    t0 = std::chrono::steady_clock::now();
    EXPECT_TRUE(Validate(*enc, "large").ok());
    const double val_s = Seconds(t0);
    t0 = std::chrono::steady_clock::now();
    EXPECT_TRUE(testing_formats::BitEqual(ToDense(*enc),
                                          testing_formats::RoundThrough(DType::kBF16, pruned),
                                          kRows, kCols));
    std::printf("%-22s mask %.3f s  satisfies %.3f s  finest %.3f s (%s)  encode %.3f s  "
                "validate %.3f s  decode+compare %.3f s\n",
                p.ToString().c_str(), mask_s, sat_s, finest_s, finest.ToString().c_str(), enc_s,
                val_s, Seconds(t0));
    EXPECT_LT(mask_s, 20.0);
    EXPECT_LT(finest_s, 10.0);
  }
}

}  // namespace
}  // namespace sparq
