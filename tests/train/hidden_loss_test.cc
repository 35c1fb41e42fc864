// SquareHead (LossSpec::hidden_weight, Kurtic et al. 2023): the hidden-state distillation term of
// ModelLossAndGrad on the tiny random GQA model, against an independent f64 forward
// (llama64_testutil.h) that chains the blocks and sums the normalized MSE of each block's output
// itself. Checked: the gradient of every tensor against central differences (CE and KL weights 0,
// so only the new term is in it) on the reference and the fast path; the loss value; the teacher
// side (ModelLogitsAndHidden); a student equal to its teacher gets exactly 0; errors name what is
// wrong; the weight round-trips through the train state.
//
// Tolerances. Gradient: model_grad_test.cc's kModelGradTol = 1e-4 (30 stored f32 roundings x 10
// cancellation x sqrt(K) ~ 5 x 6e-8) bounds this path too: SquareHead's gradient enters at each
// block's output and crosses at most the two blocks and the embedding's scatter, never the head,
// and its own factor 2 (h - t) / sum t^2 is formed in double from the f32 outputs (one rounding).
// The teacher here is an independent random model, so h - t is O(1) and no cancellation
// amplifies the f32 error of h. Loss value: each block output is an f32 forward ~10 roundings deep
// (abs err < 1e-5 on O(1) values, BlockInputGradientMatchesFiniteDifferences); sum (h - t)^2 over
// n d terms of O(1) moves by at most 2 |h - t| 1e-5 per term, so relatively by ~2e-5 / O(1):
// 1e-4 relative covers it with margin (the test prints the measured error).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "sparq/thread_pool.h"
#include "sparq/train_loop.h"
#include "sparq/train_model.h"
#include "sparq/train_ops.h"
#include "tests/train/llama64_testutil.h"
#include "tests/train/tiny_model_testutil.h"
#include "tests/train/train_testutil.h"

namespace sparq::train {
namespace {

using testing::ExpectGradNear;
using testing::Model64;
using testing::Seeded;
using testing::TinyConfig;
using testing::Tensors;
using testing::TensorRef;
using testing::Vec64;

constexpr double kModelGradTol = 1e-4;  // derivation above (as model_grad_test.cc)
constexpr double kModelFdStep = 1e-4;   // model_grad_test.cc: truncation and rounding negligible
constexpr double kLossRelTol = 1e-4;    // derivation above
constexpr int kSamplesPerTensor = 12;
constexpr double kHiddenWeight = 0.7;  // not 1, so that a dropped weight shows

struct Problem {
  LlamaConfig c = TinyConfig();
  ModelWeights w;        // the student
  ModelWeights teacher;  // an independent random model of the same shape
  std::vector<int32_t> tokens = {3, 7, 3, 0, 10, 5};  // 5 positions; 3 twice: scatter-add
  std::vector<float> teacher_hidden;                  // [n_layer, n, d]
  int64_t n() const { return static_cast<int64_t>(tokens.size()) - 1; }
  std::span<const int32_t> inputs() const { return std::span(tokens).first(n()); }
};

Problem MakeProblem(uint64_t seed) {
  auto gen = Seeded(seed);
  Problem p;
  p.w = testing::TinyWeights(p.c, &gen);
  p.teacher = testing::TinyWeights(p.c, &gen);
  p.teacher_hidden.resize(p.c.n_layer * p.n() * p.c.n_embd);
  EXPECT_TRUE(ModelLogitsAndHidden(p.c, p.teacher, p.inputs(), {}, p.teacher_hidden).ok());
  return p;
}

// The f64 block outputs [n_layer][n, d] of ids: the embedding, then the blocks one by one.
std::vector<Vec64> BlockOutputs64(const LlamaConfig& c, const Model64& m,
                                  std::span<const int32_t> ids) {
  const auto n = static_cast<int64_t>(ids.size());
  const int64_t d = c.n_embd;
  Vec64 x(static_cast<size_t>(n * d));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < d; ++i) x[t * d + i] = m.embd[ids[t] * d + i];
  std::vector<Vec64> out;
  for (const testing::Block64& b : m.blocks) {
    x = testing::Block64Forward(c, b, x, n);
    out.push_back(x);
  }
  return out;
}

// SquareHead in f64, from the definition: sum over blocks of mean_rows ||h - t||^2 / mean_rows
// ||t||^2 (the row means written out, not cancelled, to stay apart from NormalizedMse's sums).
double SquareHead64(const LlamaConfig& c, const Model64& m, std::span<const int32_t> ids,
                    std::span<const float> teacher_hidden) {
  const auto n = static_cast<int64_t>(ids.size());
  const int64_t d = c.n_embd;
  const std::vector<Vec64> h = BlockOutputs64(c, m, ids);
  double total = 0.0;
  for (int64_t l = 0; l < c.n_layer; ++l) {
    double num = 0.0, den = 0.0;
    for (int64_t t = 0; t < n; ++t) {
      double row_diff = 0.0, row_teacher = 0.0;
      for (int64_t i = 0; i < d; ++i) {
        const double tv = teacher_hidden[(l * n + t) * d + i];
        row_diff += (h[l][t * d + i] - tv) * (h[l][t * d + i] - tv);
        row_teacher += tv * tv;
      }
      num += row_diff / n;
      den += row_teacher / n;
    }
    total += num / den;
  }
  return total;
}


LossSpec HiddenOnly(const Problem& p) {
  return LossSpec{.ce_weight = 0.0,
                  .kl_weight = 0.0,
                  .tau = 1.0,
                  .teacher_logits = {},
                  .hidden_weight = kHiddenWeight,
                  .teacher_hidden = p.teacher_hidden};
}

void CheckGradient(const TrainExec& exec, const char* path) {
  std::printf(" %s path\n", path);
  Problem p = MakeProblem(501);
  ModelWeights grads = ZerosLike(p.w);
  LossResult r;
  ASSERT_TRUE(ModelLossAndGrad(p.c, p.w, {}, p.tokens, HiddenOnly(p), &r, &grads, exec).ok());
  Model64 m = testing::ToModel64(p.w);
  auto loss64 = [&]() {
    return kHiddenWeight * SquareHead64(p.c, m, p.inputs(), p.teacher_hidden);
  };
  std::printf("  loss f32 %.9f, f64 %.9f\n", r.loss, loss64());
  EXPECT_GT(r.hidden, 0.1);  // independent models: far apart

  std::mt19937_64 pick(502);
  testing::ExpectFdGradients(Tensors(&m, grads), loss64, kModelFdStep, kSamplesPerTensor,
                             kModelGradTol, &pick);
  // The head is not on SquareHead's path (CE and KL weigh 0): the output norm gets exactly 0.
  for (float g : grads.output_norm) EXPECT_EQ(g, 0.0f);
}

TEST(SquareHead, GradientMatchesFiniteDifferencesOnTheReferencePath) {
  CheckGradient(TrainExec{}, "reference");
}

TEST(SquareHead, GradientMatchesFiniteDifferencesOnTheFastPath) {
  ThreadPool pool(2);
  CheckGradient(TrainExec{.fast = true, .pool = &pool}, "fast");
}

TEST(SquareHead, LossMatchesAnIndependentF64Computation) {
  Problem p = MakeProblem(503);
  const Model64 m = testing::ToModel64(p.w);
  const double want = SquareHead64(p.c, m, p.inputs(), p.teacher_hidden);
  for (const bool fast : {false, true}) {
    LossResult r;
    ASSERT_TRUE(ModelLossAndGrad(p.c, p.w, {}, p.tokens, HiddenOnly(p), &r, nullptr,
                                 TrainExec{.fast = fast})
                    .ok());
    const double err = std::abs(r.hidden - want) / want;
    std::printf("  %s: hidden %.9f, f64 %.9f, rel err %.3g (tol %.1g)\n",
                fast ? "fast" : "reference", r.hidden, want, err, kLossRelTol);
    EXPECT_LE(err, kLossRelTol);
    EXPECT_EQ(r.loss, kHiddenWeight * r.hidden);  // CE and KL weigh 0 (+0.0 added)
    EXPECT_EQ(r.kl, 0.0);
  }
  // With every term on, the loss is their weighted sum.
  auto gen = Seeded(504);
  const std::vector<float> teacher_logits = testing::RandomNormal(&gen, p.n() * p.c.n_vocab, 2.0f);
  LossSpec all = HiddenOnly(p);
  all.ce_weight = 0.3;
  all.kl_weight = 0.5;
  all.teacher_logits = teacher_logits;
  LossResult r;
  ASSERT_TRUE(ModelLossAndGrad(p.c, p.w, {}, p.tokens, all, &r, nullptr).ok());
  EXPECT_DOUBLE_EQ(r.loss, 0.3 * r.ce + 0.5 * r.kl + kHiddenWeight * r.hidden);
  EXPECT_LE(std::abs(r.hidden - want) / want, kLossRelTol);
}

// The teacher side: ModelLogitsAndHidden's hidden are the f64 chain's block outputs, its logits
// are ModelLogits' bit for bit, and an empty logits span skips the head.
TEST(SquareHead, ModelLogitsAndHiddenWritesEveryBlockOutput) {
  Problem p = MakeProblem(505);
  const int64_t n = p.n(), d = p.c.n_embd;
  const std::vector<Vec64> want = BlockOutputs64(p.c, testing::ToModel64(p.teacher), p.inputs());
  double err = 0.0;
  for (int64_t l = 0; l < p.c.n_layer; ++l)
    for (int64_t i = 0; i < n * d; ++i)
      err = std::max(err, std::abs(p.teacher_hidden[l * n * d + i] - want[l][i]));
  std::printf("  block outputs vs f64 max abs err %.3g\n", err);
  EXPECT_LT(err, 1e-5);  // O(1) outputs, ~10 f32 roundings per block
  for (const bool fast : {false, true}) {
    std::vector<float> logits(n * p.c.n_vocab), again(n * p.c.n_vocab);
    std::vector<float> hidden(p.teacher_hidden.size());
    const TrainExec exec{.fast = fast};
    ASSERT_TRUE(ModelLogitsAndHidden(p.c, p.teacher, p.inputs(), logits, hidden, exec).ok());
    ASSERT_TRUE(ModelLogits(p.c, p.teacher, p.inputs(), again, exec).ok());
    EXPECT_EQ(logits, again);
    if (!fast) {
      EXPECT_EQ(hidden, p.teacher_hidden);
    }
  }
  std::vector<float> short_hidden(p.teacher_hidden.size() - 1);
  const Status st = ModelLogitsAndHidden(p.c, p.teacher, p.inputs(), {}, short_hidden);
  EXPECT_EQ(st.code(), StatusCode::kInvalidInput);
  EXPECT_NE(st.message().find("hidden"), std::string::npos) << st.ToString();
}

// A student equal to its teacher: every block output matches bit for bit (the same forward), so
// the term and its gradient are exactly 0. An off-by-one pairing of blocks would not be.
TEST(SquareHead, AStudentEqualToItsTeacherGetsExactlyZero) {
  Problem p = MakeProblem(506);
  for (const bool fast : {false, true}) {
    const TrainExec exec{.fast = fast};
    std::vector<float> hidden(p.teacher_hidden.size());
    ASSERT_TRUE(ModelLogitsAndHidden(p.c, p.w, p.inputs(), {}, hidden, exec).ok());
    LossSpec spec = HiddenOnly(p);
    spec.teacher_hidden = hidden;
    ModelWeights grads = ZerosLike(p.w);
    LossResult r;
    ASSERT_TRUE(ModelLossAndGrad(p.c, p.w, {}, p.tokens, spec, &r, &grads, exec).ok());
    EXPECT_EQ(r.hidden, 0.0);
    for (float g : grads.token_embd) ASSERT_EQ(g, 0.0f);
    for (const BlockWeights& b : grads.blocks)
      for (const std::vector<float>& s : b.linear)
        for (float g : s) ASSERT_EQ(g, 0.0f);
  }
}

void ExpectInvalid(const Status& st, const char* needle) {
  EXPECT_EQ(st.code(), StatusCode::kInvalidInput) << st.ToString();
  EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
}

TEST(SquareHead, Errors) {
  Problem p = MakeProblem(507);
  ModelWeights g = ZerosLike(p.w);
  LossResult r;
  LossSpec spec = HiddenOnly(p);
  spec.teacher_hidden = std::span(p.teacher_hidden).first(p.teacher_hidden.size() - 1);
  ExpectInvalid(ModelLossAndGrad(p.c, p.w, {}, p.tokens, spec, &r, &g), "teacher_hidden");
  for (const double bad :
       {-1.0, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    spec = HiddenOnly(p);
    spec.hidden_weight = bad;
    ExpectInvalid(ModelLossAndGrad(p.c, p.w, {}, p.tokens, spec, &r, &g), "loss weights");
  }
  // A teacher block output of all zeros has no scale to normalize by.
  std::vector<float> zero_block = p.teacher_hidden;
  const int64_t nd = p.n() * p.c.n_embd;
  std::fill(zero_block.begin() + nd, zero_block.begin() + 2 * nd, 0.0f);
  spec = HiddenOnly(p);
  spec.teacher_hidden = zero_block;
  ExpectInvalid(ModelLossAndGrad(p.c, p.w, {}, p.tokens, spec, &r, &g),
                "blk.1 output vs teacher_hidden");
  // TrainOptions: a negative weight is refused naming it; hidden alone is a loss.
  TrainOptions o;
  o.hidden_weight = -0.5;
  ExpectInvalid(o.Validate(p.c), "hidden_weight");
  o.hidden_weight = 1.0;
  o.ce_weight = 0.0;
  EXPECT_TRUE(o.Validate(p.c).ok());
}

// NormalizedMse on a hand-computed case: s = (1, 2), t = (0, 2): sum (s - t)^2 = 1, sum t^2 = 4.
TEST(SquareHead, NormalizedMseByHand) {
  const std::vector<float> s = {1.0f, 2.0f}, t = {0.0f, 2.0f};
  std::vector<float> ds(2);
  double loss = 0.0;
  ASSERT_TRUE(NormalizedMse(s, t, 3.0, &loss, ds).ok());
  EXPECT_EQ(loss, 0.25);
  EXPECT_EQ(ds[0], 1.5f);  // 3 * 2 * (1 - 0) / 4
  EXPECT_EQ(ds[1], 0.0f);
  ExpectInvalid(NormalizedMse(s, std::vector<float>{1.0f}, 1.0, &loss, {}), "NormalizedMse");
  ExpectInvalid(NormalizedMse(s, std::vector<float>{0.0f, 0.0f}, 1.0, &loss, {}), "sum of squares");
}

// TrainLoop: a SquareHead run needs the teacher_hidden callback (refused by name without it, the
// state untouched), and with it trains: the teacher is called once per window, without logits
// when the KL weighs 0, and the loss falls towards the (independent) teacher's block outputs.
TEST(SquareHead, TrainLoopNeedsTeacherHiddenAndTrainsWithIt) {
  Problem p = MakeProblem(509);
  TrainOptions o;
  o.schedule = {.peak = 1e-2, .warmup_steps = 0, .total_steps = 4, .min_ratio = 1.0};
  o.seq_len = 4;
  o.accum = 2;
  o.ce_weight = 0.0;
  o.hidden_weight = 1.0;
  auto s = NewTrainState(p.c, p.w, {}, o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  const std::vector<int32_t> stream = {1, 4, 2, 8, 5, 7, 3, 0, 9, 6, 10, 2, 4, 1};
  TrainLoopOptions lo;
  ExpectInvalid(TrainLoop(&*s, stream, lo), "teacher_hidden");
  EXPECT_EQ(s->step(), 0);
  EXPECT_EQ(s->data_tokens, 0);
  int calls = 0;
  lo.teacher_hidden = [&](std::span<const int32_t> in, std::span<float> logits,
                          std::span<float> hidden) {
    ++calls;
    EXPECT_TRUE(logits.empty());  // kl_weight 0: no logits asked for
    return ModelLogitsAndHidden(p.c, p.teacher, in, logits, hidden);
  };
  std::vector<double> losses;
  lo.progress = [&](const TrainProgress& tp) { losses.push_back(tp.loss); };
  ASSERT_TRUE(TrainLoop(&*s, stream, lo).ok());
  EXPECT_EQ(calls, 4 * 2);
  ASSERT_EQ(losses.size(), 4u);
  std::printf("  SquareHead loss %.4f -> %.4f\n", losses.front(), losses.back());
  EXPECT_LT(losses.back(), losses.front());
}

// The weight is part of the saved run: it round-trips through the state file.
TEST(SquareHead, TheWeightRoundTripsThroughTheTrainState) {
  Problem p = MakeProblem(508);
  TrainOptions o;
  o.schedule.total_steps = 2;
  o.seq_len = 4;
  o.kl_weight = 1.0;
  o.hidden_weight = 0.25;
  auto s = NewTrainState(p.c, p.w, {}, o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  const std::string path =
      ::testing::TempDir() + "/sparq_squarehead_" + std::to_string(::getpid()) + ".state";
  ASSERT_TRUE(SaveTrainState(path, *s).ok());
  auto back = LoadTrainState(path);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->options.hidden_weight, 0.25);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace sparq::train
