// The training fast path end to end (TrainExec::fast, sparq/train_model.h): the whole model's loss
// and every gradient against the reference path on the tiny configs of the gradient tests, with
// 2:4 masks (pruned gradients exactly 0 on both paths); the same bits for pools of 1, 2 and 3
// threads and none, on a config large enough that every tile grid and row block has several
// tiles; and the training loop on the fast path giving the same weights for any pool, and a
// stopped-and-resumed run (on another pool size) ending bit for bit where an uninterrupted run
// does (what `finetune --resume` relies on).
//
// Tolerance of fast vs reference (kFastTol, relative to each tensor's largest reference
// component): each f32 product of length K errs by at most 1.01 K eps of the sum of its terms'
// magnitudes (fast_ops_test.cc), the terms' scale being the output's: relative K eps, with
// K <= 24 in the tiny config (n_ff; vocab 11, d 16, 5 tokens). A gradient of the first block's
// weights crosses ~30 such products and stored roundings (two blocks of ~12 ops, the head, its
// norm, the loss), each amplified at most ~10x by cancellation (model_grad_test.cc's budget):
// 30 * 10 * 1.01 * 24 * 6e-8 ~ 4.4e-4. The reference's own f32 roundings (~1e-6 relative) fit
// well inside. The test prints the measured error of each tensor (typically ~1e-6).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "sparq/thread_pool.h"
#include "sparq/train_loop.h"
#include "sparq/train_model.h"
#include "tests/train/tiny_model_testutil.h"
#include "tests/train/train_testutil.h"

namespace sparq::train {
namespace {

using testing::RandomNormal;
using testing::Seeded;
using testing::TinyConfig;
using testing::TinyWeights;

constexpr double kFastTol = 4.4e-4;

// Every tensor of a model, named, in one walk.
template <class W, class Fn>
void ForEachTensor(W& w, Fn fn) {
  fn("token_embd", w.token_embd);
  fn("output_norm", w.output_norm);
  for (size_t l = 0; l < w.blocks.size(); ++l) {
    const std::string blk = "blk." + std::to_string(l) + ".";
    fn(blk + "attn_norm", w.blocks[l].attn_norm);
    fn(blk + "ffn_norm", w.blocks[l].ffn_norm);
    for (int s = 0; s < kNumSlots; ++s) {
      fn(blk + std::string(SlotName(static_cast<LinearSlot>(s))), w.blocks[l].linear[s]);
    }
  }
}

std::vector<const std::vector<float>*> Tensors(const ModelWeights& w) {
  std::vector<const std::vector<float>*> t;
  ForEachTensor(w, [&](const std::string&, const std::vector<float>& v) { t.push_back(&v); });
  return t;
}

void ExpectSameBits(const ModelWeights& a, const ModelWeights& b, const std::string& what) {
  const auto ta = Tensors(a), tb = Tensors(b);
  ASSERT_EQ(ta.size(), tb.size());
  for (size_t i = 0; i < ta.size(); ++i) {
    ASSERT_EQ(ta[i]->size(), tb[i]->size());
    EXPECT_EQ(std::memcmp(ta[i]->data(), tb[i]->data(), ta[i]->size() * sizeof(float)), 0)
        << what << ": tensor " << i;
  }
}

// 2:4 masks on the slots of block 0 (block 1 dense: both kinds of dW), pruned weights zeroed.
std::vector<BlockMasks> MaskBlock0(const LlamaConfig& c, ModelWeights* w) {
  std::vector<BlockMasks> masks(c.n_layer);
  for (int s = 0; s < kNumSlots; ++s) {
    const auto [m, k] = SlotShape(c, static_cast<LinearSlot>(s));
    masks[0].kept[s] = testing::Prune24(&w->blocks[0].linear[s], m, k);
  }
  return masks;
}

// A config with several tiles on every grid at 100 tokens: vocab 300 (5 head column tiles of 64,
// 3 row tiles of its dW), 2 attention row blocks, 7 RMSNorm row blocks, 25 loss blocks.
LlamaConfig SmallConfig() {
  LlamaConfig c = TinyConfig();
  c.n_vocab = 300;
  c.n_embd = 64;
  c.n_head = 4;
  c.n_head_kv = 2;
  c.n_ff = 200;
  c.n_ctx_train = 256;
  c.rope_dim = 16;
  return c;
}

// SmallConfig's weights drawn from `seed`, block 0 under 2:4 masks, then `count` random tokens
// (the generator goes on to the tests' teacher draws).
struct MaskedSmallModel {
  MaskedSmallModel(uint64_t seed, size_t count)
      : gen(Seeded(seed)), w(TinyWeights(c, &gen)), masks(MaskBlock0(c, &w)), tokens(count) {
    for (auto& t : tokens) t = static_cast<int32_t>(gen() % c.n_vocab);
  }
  const LlamaConfig c = SmallConfig();
  decltype(Seeded(0)) gen;
  ModelWeights w;
  std::vector<BlockMasks> masks;
  std::vector<int32_t> tokens;
};

struct PathRun {
  LossResult r;
  ModelWeights g;
};

PathRun LossAndGrad(const LlamaConfig& c, const ModelWeights& w, std::span<const BlockMasks> masks,
                    std::span<const int32_t> tokens, const LossSpec& spec, const TrainExec& exec) {
  PathRun run;
  run.g = ZerosLike(w);
  const Status st = ModelLossAndGrad(c, w, masks, tokens, spec, &run.r, &run.g, exec);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return run;
}

TEST(FastPath, LossAndEveryGradientMatchTheReference) {
  const LlamaConfig c = TinyConfig();
  auto gen = Seeded(2811);
  ModelWeights w = TinyWeights(c, &gen);
  const std::vector<BlockMasks> masks = MaskBlock0(c, &w);
  const std::vector<int32_t> tokens = {3, 7, 3, 0, 10, 5};  // 3 twice: the scatter-add
  const auto teacher = RandomNormal(&gen, (tokens.size() - 1) * c.n_vocab, 2.0f);
  const LossSpec spec{.ce_weight = 1.0, .kl_weight = 0.5, .tau = 2.0, .teacher_logits = teacher};
  ThreadPool pool(2);
  const PathRun ref = LossAndGrad(c, w, masks, tokens, spec, {});
  const PathRun fast = LossAndGrad(c, w, masks, tokens, spec, {.fast = true, .pool = &pool});
  std::printf("  loss ref %.9f fast %.9f (ce %.9f / %.9f, kl %.9f / %.9f)\n", ref.r.loss,
              fast.r.loss, ref.r.ce, fast.r.ce, ref.r.kl, fast.r.kl);
  EXPECT_NEAR(fast.r.loss, ref.r.loss, kFastTol * std::max(1.0, ref.r.loss));
  EXPECT_NEAR(fast.r.kl, ref.r.kl, kFastTol * std::max(1.0, ref.r.kl));
  const auto tr = Tensors(ref.g), tf = Tensors(fast.g);
  size_t i = 0;
  ForEachTensor(ref.g, [&](const std::string& name, const std::vector<float>&) {
    const std::vector<double> want(tr[i]->begin(), tr[i]->end());
    testing::ExpectGradNear(name.c_str(), *tf[i], want, kFastTol);
    ++i;
  });
  // The pruned positions of block 0's gradients: exactly 0 on the fast path too.
  for (int s = 0; s < kNumSlots; ++s) {
    std::vector<bool> kept(fast.g.blocks[0].linear[s].size(), false);
    for (const int64_t k : masks[0].kept[s]) kept[k] = true;
    for (size_t j = 0; j < kept.size(); ++j) {
      if (!kept[j]) {
        ASSERT_EQ(fast.g.blocks[0].linear[s][j], 0.0f) << "slot " << s << " " << j;
      }
    }
  }
  // The logits alone.
  std::vector<float> lr(5 * c.n_vocab), lf(5 * c.n_vocab);
  ASSERT_TRUE(ModelLogits(c, w, std::span(tokens).first(5), lr).ok());
  ASSERT_TRUE(
      ModelLogits(c, w, std::span(tokens).first(5), lf, {.fast = true, .pool = &pool}).ok());
  testing::ExpectGradNear("logits", lf, std::vector<double>(lr.begin(), lr.end()), kFastTol);
}

TEST(FastPath, TheSameBitsForAnyPoolSize) {
  MaskedSmallModel m(2812, 101);
  auto& [c, gen, w, masks, tokens] = m;
  const auto teacher = RandomNormal(&gen, 100 * c.n_vocab, 2.0f);
  const LossSpec spec{.ce_weight = 0.3, .kl_weight = 1.0, .tau = 1.0, .teacher_logits = teacher};
  TrainTimers timers;
  const PathRun first = LossAndGrad(c, w, masks, tokens, spec, {.fast = true, .timers = &timers});
  EXPECT_GT(timers.forward, 0.0);
  EXPECT_GT(timers.backward, 0.0);
  for (const int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    const PathRun again = LossAndGrad(c, w, masks, tokens, spec, {.fast = true, .pool = &pool});
    EXPECT_EQ(std::memcmp(&again.r, &first.r, sizeof(LossResult)), 0) << threads << " threads";
    ExpectSameBits(again.g, first.g, std::to_string(threads) + " threads");
  }
  // The reference agrees to f32 rounding here too (K up to 300: a looser bound, 300 / 24 x).
  const PathRun ref = LossAndGrad(c, w, masks, tokens, spec, {});
  const auto tr = Tensors(ref.g), tf = Tensors(first.g);
  for (size_t i = 0; i < tr.size(); ++i) {
    const double err =
        testing::MaxRelErr(*tf[i], std::vector<double>(tr[i]->begin(), tr[i]->end()));
    EXPECT_LE(err, kFastTol * 300 / 24) << "tensor " << i;
  }
}

// TrainExec::activations: every block's activations kept from the forward, no recompute in the
// backward; the loss and every gradient the same bits as with the recompute, on the fast path
// (2 threads) and the reference, with 2:4 masks, KL and SquareHead's per-block term; twice on one
// workspace (reused: a shorter window's call in between).
TEST(FastPath, KeptActivationsGiveTheRecomputesBits) {
  MaskedSmallModel m(2813, 65);
  auto& [c, gen, w, masks, tokens] = m;
  const int64_t n = 64;
  const auto teacher = RandomNormal(&gen, n * c.n_vocab, 2.0f);
  const auto hidden = RandomNormal(&gen, c.n_layer * n * c.n_embd, 1.0f);
  const LossSpec spec{.ce_weight = 0.3, .kl_weight = 1.0, .tau = 1.0, .teacher_logits = teacher,
                      .hidden_weight = 0.5, .teacher_hidden = hidden};
  ThreadPool pool(2);
  for (const bool fast : {true, false}) {
    const std::string path = fast ? "fast" : "reference";
    TrainTimers t_re, t_keep;
    const PathRun re =
        LossAndGrad(c, w, masks, tokens, spec, {.fast = fast, .pool = &pool, .timers = &t_re});
    std::vector<BlockActivations> ws;
    const TrainExec keep_exec{
        .fast = fast, .pool = &pool, .timers = &t_keep, .activations = &ws};
    const PathRun keep = LossAndGrad(c, w, masks, tokens, spec, keep_exec);
    EXPECT_GT(re.r.hidden, 0.0);
    EXPECT_EQ(ws.size(), static_cast<size_t>(c.n_layer));
    EXPECT_EQ(std::memcmp(&keep.r, &re.r, sizeof(LossResult)), 0) << path;
    ExpectSameBits(keep.g, re.g, path + ": kept vs recomputed");
    EXPECT_GT(t_re.recompute, 0.0) << path;
    EXPECT_EQ(t_keep.recompute, 0.0) << path;
    const std::span<const int32_t> short_window = std::span(tokens).first(17);
    const LossSpec ce_only{};
    (void)LossAndGrad(c, w, masks, short_window, ce_only, keep_exec);
    const PathRun again = LossAndGrad(c, w, masks, tokens, spec, keep_exec);
    EXPECT_EQ(std::memcmp(&again.r, &re.r, sizeof(LossResult)), 0) << path;
    ExpectSameBits(again.g, re.g, path + ": the workspace reused");
  }
}

TrainOptions LoopOptions() {
  TrainOptions o;
  o.schedule = {/*peak=*/5e-3, /*warmup_steps=*/2, /*total_steps=*/8, /*min_ratio=*/0.1};
  o.adamw.weight_decay = 0.01;
  o.seq_len = 40;
  o.accum = 2;
  o.seed = 0x28;
  return o;
}

TEST(FastPath, TrainLoopGivesTheSameWeightsForAnyPoolAndResumesBitForBit) {
  const LlamaConfig c = SmallConfig();
  auto gen = Seeded(2813);
  ModelWeights w0 = TinyWeights(c, &gen);
  const std::vector<BlockMasks> masks = MaskBlock0(c, &w0);
  std::vector<int32_t> data(400);
  for (auto& t : data) t = static_cast<int32_t>(gen() % c.n_vocab);
  ThreadPool one(1), three(3);
  auto full = NewTrainState(c, w0, masks, LoopOptions());
  ASSERT_TRUE(full.ok()) << full.status().ToString();
  TrainLoopOptions lo;
  lo.exec = {.fast = true, .pool = &one};
  ASSERT_TRUE(TrainLoop(&*full, data, lo).ok());
  EXPECT_EQ(full->step(), 8);

  auto other = NewTrainState(c, w0, masks, LoopOptions());
  ASSERT_TRUE(other.ok());
  lo.exec.pool = &three;
  ASSERT_TRUE(TrainLoop(&*other, data, lo).ok());
  ExpectSameBits(other->weights, full->weights, "3 threads vs 1");

  // Stop at 3 with 3 threads, save, load, finish with 2: the uninterrupted run's bits.
  const std::string path = ::testing::TempDir() + "/sparq_fastpath_resume.safetensors";
  auto first = NewTrainState(c, w0, masks, LoopOptions());
  ASSERT_TRUE(first.ok());
  lo.stop_at = 3;
  lo.checkpoint_path = path;
  ASSERT_TRUE(TrainLoop(&*first, data, lo).ok());
  auto loaded = LoadTrainState(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  ThreadPool two(2);
  TrainLoopOptions rest;
  rest.exec = {.fast = true, .pool = &two};
  ASSERT_TRUE(TrainLoop(&*loaded, data, rest).ok());
  EXPECT_EQ(loaded->step(), 8);
  ExpectSameBits(loaded->weights, full->weights, "resumed vs uninterrupted");
  std::remove(path.c_str());
}

}  // namespace
}  // namespace sparq::train
