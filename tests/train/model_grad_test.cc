// Gradient tests of the whole-block and whole-model backward (sparq/train_model.h) on a tiny
// random GQA config: every tensor's gradient against central differences of the independent f64
// forward (llama64_testutil.h) on a random sample of its entries; the training forward's logits
// against LlamaModel::Forward (the inference runtime) on the same weights; masked slots get
// exactly zero gradient at their pruned positions; error paths name the tensor.
//
// Tolerance of the model gradients (kModelGradTol): train_testutil.h's budget for one op chain
// (3e-5: ~10 f32 roundings of stored intermediates, each amplified ~10x by cancellation, times
// sqrt(K) ~ 4) covers one block; the path from the loss to the first block's weights crosses the
// head (logits, dlogits, dxf, the output RMSNorm), two blocks and the residual sums, ~3x as many
// stored roundings, with sqrt(K) ~ 5 for K up to 24: 30 * 10 * 5 * 6e-8 ~ 1e-4. The FD side uses
// h = 1e-4 on the f64 forward: truncation h^2 |f'''| / 6 ~ 2e-9 even for |f'''| ~ 1e3, and the
// rounding of the loss eps64 |L| / h ~ 1e-11: negligible. The error is relative to the largest
// sampled component (train_testutil.h MaxRelErr); the test prints each tensor's measured error.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "sparq/format.h"
#include "sparq/linear.h"
#include "sparq/model.h"
#include "sparq/tensor.h"
#include "sparq/tokenizer.h"
#include "sparq/train_model.h"
#include "sparq/train_ops.h"
#include "tests/train/llama64_testutil.h"
#include "tests/train/tiny_model_testutil.h"
#include "tests/train/train_testutil.h"

namespace sparq::train {
namespace {

using testing::ExpectGradNear;
using testing::Model64;
using testing::RandomNormal;
using testing::Seeded;
using testing::TinyConfig;
using testing::Tensors;
using testing::TensorRef;
using testing::Vec64;

constexpr double kModelGradTol = 1e-4;
constexpr double kModelFdStep = 1e-4;
constexpr int kSamplesPerTensor = 12;


struct Problem {
  LlamaConfig c = TinyConfig();
  ModelWeights w;
  std::vector<int32_t> tokens = {3, 7, 3, 0, 10, 5};  // 5 positions; 3 twice: scatter-add
  std::vector<float> teacher;
};

Problem MakeProblem(uint64_t seed) {
  auto gen = Seeded(seed);
  Problem p;
  p.w = testing::TinyWeights(p.c, &gen);
  p.teacher = RandomNormal(&gen, (p.tokens.size() - 1) * p.c.n_vocab, 2.0f);
  return p;
}

TEST(TrainModel, EveryTensorGradientMatchesFiniteDifferences) {
  Problem p = MakeProblem(401);
  const LossSpec spec{.ce_weight = 1.0, .kl_weight = 0.5, .tau = 2.0, .teacher_logits = p.teacher};
  ModelWeights grads = ZerosLike(p.w);
  LossResult r;
  ASSERT_TRUE(ModelLossAndGrad(p.c, p.w, {}, p.tokens, spec, &r, &grads).ok());

  Model64 m = testing::ToModel64(p.w);
  auto loss64 = [&]() { return testing::Loss64(p.c, m, p.tokens, 1.0, 0.5, 2.0, p.teacher); };
  const double l64 = loss64();
  std::printf("  loss f32 %.9f (ce %.6f, kl %.6f), f64 %.9f\n", r.loss, r.ce, r.kl, l64);
  // The loss is a mean of O(1) terms computed from f32 logits: ~1e-6 of it is the f32 forward.
  EXPECT_NEAR(r.loss, l64, 1e-5 * std::max(1.0, l64));
  EXPECT_GT(r.kl, 0.0);

  std::mt19937_64 pick(402);
  testing::ExpectFdGradients(Tensors(&m, grads), loss64, kModelFdStep, kSamplesPerTensor,
                             kModelGradTol, &pick);
}

// The block alone: dx from BlockBackward against FD of the f64 block, loss = sum(y * r).
TEST(TrainModel, BlockInputGradientMatchesFiniteDifferences) {
  Problem p = MakeProblem(403);
  auto gen = Seeded(404);
  const int64_t n = 5, d = p.c.n_embd;
  auto x = RandomNormal(&gen, n * d), r = RandomNormal(&gen, n * d);
  std::vector<float> y(n * d), dx(n * d, 7.0f);  // 7: dx is written, not added
  BlockActivations acts;
  ASSERT_TRUE(BlockForward(p.c, p.w.blocks[1], 1, x, n, y, &acts).ok());
  BlockWeights g = ZerosLike(p.w.blocks[1]);
  ASSERT_TRUE(BlockBackward(p.c, p.w.blocks[1], 1, nullptr, acts, r, dx, &g).ok());
  const Model64 m = testing::ToModel64(p.w);
  const Vec64 y64 = testing::Block64Forward(p.c, m.blocks[1], testing::To64(x), n);
  double err = 0.0;
  for (size_t i = 0; i < y.size(); ++i) err = std::max(err, std::abs(y[i] - y64[i]));
  std::printf("  block forward max abs err %.3g\n", err);
  EXPECT_LT(err, 1e-5);  // O(1) outputs, ~10 f32 roundings deep
  const Vec64 fd = testing::FdGrad(
      [&](const Vec64& v) {
        return testing::Project(testing::Block64Forward(p.c, m.blocks[1], v, n), r);
      },
      testing::To64(x), kModelFdStep);
  ExpectGradNear("block dx", dx, fd);
}

// The training forward and the inference runtime compute the same logits on the same weights.
TEST(TrainModel, LogitsMatchLlamaModelForward) {
  Problem p = MakeProblem(405);
  const LlamaConfig& c = p.c;
  const LlamaModel model = testing::TinyLlamaModel(c, p.w);  // every slot dense f32
  // n = 5 >= 4 runs the runtime's batched (prompt) attention; n = 3 its decode path.
  for (int64_t n : {5, 3}) {
    const std::span<const int32_t> ids(p.tokens.data(), static_cast<size_t>(n));
    auto cache = KvCache::Create(c, n);
    ASSERT_TRUE(cache.ok());
    std::vector<float> want(n * c.n_vocab), got(n * c.n_vocab);
    ASSERT_TRUE(model.Forward(ids, &*cache, want.data(), true, nullptr).ok());
    ASSERT_TRUE(ModelLogits(c, p.w, ids, got).ok());
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < got.size(); ++i) {
      num = std::max(num, std::abs(double(got[i]) - want[i]));
      den = std::max(den, std::abs(double(want[i])));
    }
    // Both are f32 forwards that round differently (sgemm vs double sums, fused epilogues): a
    // few eps32 * sqrt(K) per op over ~25 ops in a row: ~25 * 5 * 6e-8 ~ 8e-6 of the logits.
    std::printf("  n %lld: logits vs LlamaModel max rel err %.3g (tol 1e-5)\n",
                static_cast<long long>(n), num / den);
    EXPECT_LE(num / den, 1e-5);
    if (n != 5) continue;
    // The training loss equals cross-entropy on the runtime's logits (targets: the next tokens).
    double want_loss = 0.0;
    ASSERT_TRUE(
        CrossEntropy(want, std::span(p.tokens).subspan(1), n, c.n_vocab, &want_loss, {}).ok());
    LossResult r;
    ASSERT_TRUE(ModelLossAndGrad(c, p.w, {}, p.tokens, LossSpec{}, &r, nullptr).ok());
    std::printf("  loss %.9f vs %.9f on LlamaModel's logits\n", r.loss, want_loss);
    EXPECT_NEAR(r.loss, want_loss, 1e-5 * want_loss);
  }
}

// Masked slots: pruned positions of every slot's gradient stay exactly 0, kept positions equal
// the dense backward's gradient there bit for bit (the same sums in the same order).
TEST(TrainModel, MaskedWeightsGetExactlyZeroGradient) {
  Problem p = MakeProblem(406);
  std::vector<BlockMasks> masks(p.c.n_layer);
  for (int64_t l = 0; l < p.c.n_layer; ++l) {
    for (int s = 0; s < kNumSlots; ++s) {
      std::vector<float>& w = p.w.blocks[l].linear[s];
      for (int64_t i = static_cast<int64_t>(w.size()) - 1; i >= 0; --i) {  // 2:4-like, reversed
        if (i % 4 == 0 || i % 4 == 3) {
          masks[l].kept[s].push_back(i);
        } else {
          w[i] = 0.0f;  // pruned weights are 0 in W
        }
      }
    }
  }
  const LossSpec spec{.ce_weight = 1.0, .kl_weight = 1.0, .tau = 1.0, .teacher_logits = p.teacher};
  ModelWeights gm = ZerosLike(p.w), gd = ZerosLike(p.w);
  LossResult rm, rd;
  ASSERT_TRUE(ModelLossAndGrad(p.c, p.w, masks, p.tokens, spec, &rm, &gm).ok());
  ASSERT_TRUE(ModelLossAndGrad(p.c, p.w, {}, p.tokens, spec, &rd, &gd).ok());
  EXPECT_EQ(rm.loss, rd.loss);
  EXPECT_EQ(gm.token_embd, gd.token_embd);
  EXPECT_EQ(gm.output_norm, gd.output_norm);
  int64_t pruned = 0, pruned_dense_nonzero = 0;
  for (int64_t l = 0; l < p.c.n_layer; ++l) {
    EXPECT_EQ(gm.blocks[l].attn_norm, gd.blocks[l].attn_norm);
    EXPECT_EQ(gm.blocks[l].ffn_norm, gd.blocks[l].ffn_norm);
    for (int s = 0; s < kNumSlots; ++s) {
      const std::vector<float>& a = gm.blocks[l].linear[s];
      const std::vector<float>& b = gd.blocks[l].linear[s];
      for (size_t i = 0; i < a.size(); ++i) {
        if (i % 4 == 0 || i % 4 == 3) {
          EXPECT_EQ(a[i], b[i]) << "blk." << l << " slot " << s << " kept " << i;
        } else {
          ++pruned;
          pruned_dense_nonzero += b[i] != 0.0f;
          EXPECT_EQ(std::bit_cast<uint32_t>(a[i]), 0u) << "blk." << l << " slot " << s << " " << i;
        }
      }
    }
  }
  std::printf("  %lld pruned weights: all exactly +0 (dense dW nonzero at %lld of them)\n",
              static_cast<long long>(pruned), static_cast<long long>(pruned_dense_nonzero));
  // The mask, not the data, keeps them at 0. (Dense dW is exactly 0 at some pruned positions too:
  // the mask prunes whole columns of W_down and W_o, so half the rows of dW_gate / dW_up / dW_v
  // see a zero dY.)
  EXPECT_GT(pruned_dense_nonzero, pruned / 2);
}

// ---- error paths: kInvalidInput naming the tensor -------------------------------------------

void ExpectInvalid(const Status& st, const char* needle) {
  EXPECT_EQ(st.code(), StatusCode::kInvalidInput) << st.ToString();
  EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
}

TEST(TrainModel, Errors) {
  Problem p = MakeProblem(407);
  const LossSpec ce;
  LossResult r;
  ModelWeights g = ZerosLike(p.w);
  {
    ModelWeights bad = p.w;
    bad.blocks[1].at(LinearSlot::kUp).pop_back();
    ExpectInvalid(ModelLossAndGrad(p.c, bad, {}, p.tokens, ce, &r, &g), "blk.1.ffn_up.weight");
    std::vector<float> logits(p.c.n_vocab);
    ExpectInvalid(ModelLogits(p.c, bad, std::span(p.tokens).first(1), logits),
                  "blk.1.ffn_up.weight");
  }
  ModelWeights short_grads = ZerosLike(p.w);
  short_grads.output_norm.resize(3);
  ExpectInvalid(ModelLossAndGrad(p.c, p.w, {}, p.tokens, ce, &r, &short_grads),
                "gradient: output_norm.weight");
  std::vector<BlockMasks> masks(p.c.n_layer);
  masks[0].at(LinearSlot::kK) = {0, 128};  // attn_k is [8, 16]: 128 is one past
  ExpectInvalid(ModelLossAndGrad(p.c, p.w, masks, p.tokens, ce, &r, &g),
                "blk.0.attn_k.weight: kept[1] = 128");
  masks[0].at(LinearSlot::kK) = {5, 5};
  ExpectInvalid(ModelLossAndGrad(p.c, p.w, masks, p.tokens, ce, &r, &g), "listed twice");
  masks.pop_back();
  ExpectInvalid(ModelLossAndGrad(p.c, p.w, masks, p.tokens, ce, &r, &g), "1 block masks");
  const std::vector<int32_t> out_of_range = {1, 11}, one = {1};
  ExpectInvalid(ModelLossAndGrad(p.c, p.w, {}, out_of_range, ce, &r, &g), "tokens[1] = 11");
  ExpectInvalid(ModelLossAndGrad(p.c, p.w, {}, one, ce, &r, &g), "at least 2 tokens");
  LossSpec kl{.ce_weight = 1.0, .kl_weight = 1.0, .tau = 1.0, .teacher_logits = {}};
  ExpectInvalid(ModelLossAndGrad(p.c, p.w, {}, p.tokens, kl, &r, &g), "teacher_logits");
  kl.teacher_logits = p.teacher;
  kl.kl_weight = -1.0;
  ExpectInvalid(ModelLossAndGrad(p.c, p.w, {}, p.tokens, kl, &r, &g), "loss weights");
  BlockActivations acts;
  std::vector<float> x(10 * p.c.n_embd), y(9 * p.c.n_embd);
  ExpectInvalid(BlockForward(p.c, p.w.blocks[0], 0, x, 10, y, &acts), "BlockForward: y");
}

}  // namespace
}  // namespace sparq::train
