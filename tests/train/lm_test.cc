// A small Llama from scratch (sparq/train_lm.h): the 2:4 mask rule, the initial weights, the
// evaluation perplexity against a double log-softmax of the reference logits, training that
// learns a repeating stream dense and 2:4 (exactly half the slot weights zero, the same bits for
// 1 and 2 threads), SR-STE pulling the pruned masters toward 0, and bad options named.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "sparq/train_lm.h"
#include "tests/train/tiny_model_testutil.h"

namespace sparq::train {
namespace {

using testing::TinyConfig;

// A stream the tiny model can learn: a period-7 cycle over 11 ids.
std::vector<int32_t> Cycle(int64_t n, int offset) {
  std::vector<int32_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>((3 * (i + offset)) % 7 + 2);
  return t;
}

LmTrainOptions Small(bool sparse) {
  LmTrainOptions o;
  o.config = TinyConfig();
  o.sparse24 = sparse;
  o.steps = 60;
  o.seq_len = 16;
  o.batch = 2;
  o.lr = 1e-2;
  o.seed = 3;
  return o;
}

TEST(TrainLm, Mask2of4KeepsTheTwoLargestOfEachFourTiesToTheLowerIndex) {
  const std::vector<float> w = {1, -3, 2, 0.5f, 0, 0, 0, 0, -1, 1, -1, 1, 5, 0, 0, -5};
  const std::vector<uint8_t> want = {0, 1, 1, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 0, 0, 1};
  EXPECT_EQ(Mask2of4(w, 2, 8), want);
}

TEST(TrainLm, InitialWeightsFollowTheSeedAndTheScheme) {
  LlamaConfig c = TinyConfig();
  c.n_embd = 64;
  c.n_ff = 128;
  c.n_vocab = 500;
  c.n_layer = 2;
  const ModelWeights a = InitLmWeights(c, 7), b = InitLmWeights(c, 7), d = InitLmWeights(c, 8);
  EXPECT_EQ(a.token_embd, b.token_embd);
  EXPECT_NE(a.token_embd, d.token_embd);
  auto sd = [](const std::vector<float>& v) {
    double s = 0;
    for (float x : v) s += double{x} * x;
    return std::sqrt(s / static_cast<double>(v.size()));
  };
  // 8192 draws: the sample sd is within ~1% of the true one; 5% leaves room.
  EXPECT_NEAR(sd(a.blocks[0].at(LinearSlot::kGate)), 0.02, 0.001);
  EXPECT_NEAR(sd(a.blocks[0].at(LinearSlot::kDown)), 0.02 / std::sqrt(4.0), 0.0005);
  EXPECT_NEAR(sd(a.token_embd), 0.02, 0.001);
  for (float g : a.blocks[1].ffn_norm) ASSERT_EQ(g, 1.0f);
}

// exp(mean CE) of the windows, from the reference logits and a double log-softmax.
TEST(TrainLm, PerplexityIsTheMeanCrossEntropyOfTheWindows) {
  const LlamaConfig c = TinyConfig();
  const ModelWeights w = InitLmWeights(c, 5);
  const std::vector<int32_t> t = Cycle(50, 1);
  const int64_t len = 16;
  double sum = 0;
  int64_t count = 0;
  for (int64_t at = 0; at + len + 1 <= 50; at += len) {
    std::vector<float> logits(len * c.n_vocab);
    ASSERT_TRUE(ModelLogits(c, w, std::span(t).subspan(at, len), logits).ok());
    for (int64_t p = 0; p < len; ++p) {
      double mx = -1e300, z = 0;
      for (int64_t v = 0; v < c.n_vocab; ++v) mx = std::max(mx, double{logits[p * c.n_vocab + v]});
      for (int64_t v = 0; v < c.n_vocab; ++v) z += std::exp(logits[p * c.n_vocab + v] - mx);
      sum += mx + std::log(z) - logits[p * c.n_vocab + t[at + p + 1]];
      ++count;
    }
  }
  ThreadPool pool(2);
  int64_t positions = 0;
  auto ppl = LmPerplexity(c, w, t, len, &pool, &positions);
  ASSERT_TRUE(ppl.ok()) << ppl.status().ToString();
  EXPECT_EQ(positions, 48);
  EXPECT_EQ(count, 48);
  // f32 logits of O(1) through f32 softmax sums of 11 terms: 1e-5 relative is ~100 ulp of room.
  EXPECT_NEAR(*ppl, std::exp(sum / count), 1e-5 * *ppl);
}

TEST(TrainLm, DenseAnd2of4LearnARepeatingStreamWithTheSameBitsForAnyPool) {
  const std::vector<int32_t> train = Cycle(400, 0), eval = Cycle(100, 5);
  for (bool sparse : {false, true}) {
    SCOPED_TRACE(sparse ? "2:4" : "dense");
    LmTrainOptions o = Small(sparse);
    o.eval_every = 20;
    ThreadPool one(1), two(2);
    auto a = TrainLm(o, train, eval, &one);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    auto b = TrainLm(o, train, eval, &two);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    std::printf("  %s: eval perplexity %.3f (curve %.3f, %.3f, %.3f), zeros %.3f\n",
                sparse ? "2:4" : "dense", a->eval_perplexity, a->curve[0].second,
                a->curve[1].second, a->curve[2].second, a->zero_fraction);
    ASSERT_EQ(a->curve.size(), 3u);
    EXPECT_EQ(a->eval_perplexity, b->eval_perplexity);
    EXPECT_EQ(a->masters.token_embd, b->masters.token_embd);
    // A uniform guess over 11 ids is 11; the cycle is deterministic given the last token.
    EXPECT_LT(a->eval_perplexity, 2.0);
    EXPECT_EQ(a->zero_fraction, sparse ? 0.5 : 0.0);
  }
}

// Pruned masters' share of the slots' squared norm at the end: SR-STE pulls it down.
TEST(TrainLm, SrsteShrinksThePrunedMasters) {
  const std::vector<int32_t> train = Cycle(400, 0), eval = Cycle(100, 5);
  auto pruned_share = [](const LlamaConfig& c, const ModelWeights& w) {
    double pruned = 0, all = 0;
    for (const BlockWeights& b : w.blocks)
      for (int s = 0; s < kNumSlots; ++s) {
        const auto [m, k] = SlotShape(c, static_cast<LinearSlot>(s));
        const std::vector<uint8_t> mask = Mask2of4(b.linear[s], m, k);
        for (size_t i = 0; i < mask.size(); ++i) {
          const double x = double{b.linear[s][i]} * b.linear[s][i];
          all += x;
          pruned += mask[i] ? 0 : x;
        }
      }
    return pruned / all;
  };
  ThreadPool pool(1);
  LmTrainOptions o = Small(true);
  auto plain = TrainLm(o, train, eval, &pool);
  o.srste = 20.0;  // lr * srste = 0.2 per step at the peak
  auto decayed = TrainLm(o, train, eval, &pool);
  ASSERT_TRUE(plain.ok() && decayed.ok());
  const double p0 = pruned_share(o.config, plain->masters);
  const double p1 = pruned_share(o.config, decayed->masters);
  std::printf("  pruned share of the masters' squared norm: %.4f without SR-STE, %.4f with\n", p0,
              p1);
  EXPECT_LT(p1, 0.5 * p0);
}

TEST(TrainLm, BadOptionsAreNamed) {
  const std::vector<int32_t> train = Cycle(400, 0), eval = Cycle(100, 5);
  ThreadPool pool(1);
  LmTrainOptions o = Small(true);
  o.config.n_ff = 26;  // ffn_down's input
  auto r = TrainLm(o, train, eval, &pool);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("ffn_down has 26"), std::string::npos) << r.status().ToString();
  o = Small(false);
  o.srste = -1;
  r = TrainLm(o, train, eval, &pool);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("--srste"), std::string::npos) << r.status().ToString();
  o = Small(false);
  r = TrainLm(o, train, std::vector<int32_t>(10, 2), &pool);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("evaluation text holds 10 tokens"), std::string::npos)
      << r.status().ToString();
  std::vector<int32_t> bad = train;
  bad[7] = 11;
  r = TrainLm(o, bad, eval, &pool);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("training token 7 is 11"), std::string::npos) << r.status().ToString();
}

}  // namespace
}  // namespace sparq::train
