// The training loop (sparq/train_loop.h): the schedule against its closed form at the edges; the
// data order is a pure function of (seed, step, micro-batch) and covers the stream; accumulation
// over two sequences against the mean of their separate gradients; the state file round-trips
// bit for bit, resumes to the same weights bit for bit as an uninterrupted run, keeps the masks,
// and a truncated / corrupted / mismatched file stops with an error naming the file and field;
// the loop lowers the tiny model's loss.
#include "sparq/train_loop.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <numbers>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "sparq/safetensors.h"
#include "sparq/train_model.h"
#include "sparq/train_optim.h"
#include "tests/train/tiny_model_testutil.h"
#include "tests/train/train_testutil.h"

namespace sparq::train {
namespace {

using testing::MaxRelErr;
using testing::Prune24;
using testing::Seeded;
using testing::TinyConfig;
using testing::TinyWeights;

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/sparq_trainloop_" + std::to_string(::getpid()) + "_" + name;
}

std::vector<uint8_t> ReadBytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}
void WriteBytes(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

// 2:4 masks on every slot (pruned weights zeroed in *w).
std::vector<BlockMasks> Mask24(const LlamaConfig& c, ModelWeights* w) {
  std::vector<BlockMasks> masks(c.n_layer);
  for (int64_t l = 0; l < c.n_layer; ++l)
    for (int s = 0; s < kNumSlots; ++s) {
      const auto [m, k] = SlotShape(c, static_cast<LinearSlot>(s));
      masks[l].kept[s] = Prune24(&w->blocks[l].linear[s], m, k);
    }
  return masks;
}

// A learnable stream: mostly the bigram t -> (3 t + 1) mod V, with a random token 1 time in 8.
std::vector<int32_t> Stream(const LlamaConfig& c, int64_t len, std::mt19937_64* gen) {
  std::vector<int32_t> t(len);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(c.n_vocab) - 1);
  t[0] = tok(*gen);
  for (int64_t i = 1; i < len; ++i) {
    t[i] = (*gen)() % 8 == 0 ? tok(*gen) : static_cast<int32_t>((3 * t[i - 1] + 1) % c.n_vocab);
  }
  return t;
}

TrainOptions SmallOptions() {
  TrainOptions o;
  o.schedule = {/*peak=*/5e-3, /*warmup_steps=*/3, /*total_steps=*/12, /*min_ratio=*/0.1};
  o.adamw.weight_decay = 0.01;
  o.adamw.max_grad_norm = 1.0;
  o.seq_len = 8;
  o.accum = 2;
  o.seed = 0x5eed;
  return o;
}

// Every tensor of a and b bitwise equal (memcmp: -0 vs 0 and NaN payloads count).
void ExpectSameBits(const ModelWeights& a, const ModelWeights& b) {
  auto same = [](const std::vector<float>& x, const std::vector<float>& y, const std::string& n) {
    ASSERT_EQ(x.size(), y.size()) << n;
    EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)), 0) << n;
  };
  same(a.token_embd, b.token_embd, "token_embd");
  same(a.output_norm, b.output_norm, "output_norm");
  ASSERT_EQ(a.blocks.size(), b.blocks.size());
  for (size_t l = 0; l < a.blocks.size(); ++l) {
    same(a.blocks[l].attn_norm, b.blocks[l].attn_norm, "attn_norm");
    same(a.blocks[l].ffn_norm, b.blocks[l].ffn_norm, "ffn_norm");
    for (int s = 0; s < kNumSlots; ++s)
      same(a.blocks[l].linear[s], b.blocks[l].linear[s], "slot " + std::to_string(s));
  }
}

void ExpectSameOptim(const AdamWState& a, const AdamWState& b) {
  EXPECT_EQ(a.steps, b.steps);
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t j = 0; j < a.tensors.size(); ++j) {
    EXPECT_EQ(a.tensors[j].name, b.tensors[j].name);
    EXPECT_EQ(a.tensors[j].m, b.tensors[j].m) << a.tensors[j].name;
    EXPECT_EQ(a.tensors[j].v, b.tensors[j].v) << a.tensors[j].name;
  }
}

void ExpectPrunedZero(const TrainState& s) {
  for (size_t l = 0; l < s.masks.size(); ++l)
    for (int k = 0; k < kNumSlots; ++k) {
      std::vector<bool> kept(s.weights.blocks[l].linear[k].size(), false);
      for (int64_t i : s.masks[l].kept[k]) kept[i] = true;
      for (size_t i = 0; i < kept.size(); ++i)
        if (!kept[i]) {
          ASSERT_EQ(s.weights.blocks[l].linear[k][i], 0.0f) << l << " " << k << " " << i;
        }
    }
}

TEST(TrainLoop, LrScheduleClosedFormAtTheEdges) {
  const LrSchedule s{/*peak=*/2e-3, /*warmup_steps=*/10, /*total_steps=*/110, /*min_ratio=*/0.1};
  ASSERT_TRUE(s.Validate().ok());
  EXPECT_DOUBLE_EQ(s.lr(0), 2e-4);                       // (0 + 1) / 10 of peak
  EXPECT_DOUBLE_EQ(s.lr(4), 1e-3);                       // (4 + 1) / 10
  EXPECT_DOUBLE_EQ(s.lr(9), 2e-3);                       // the warmup's last step reaches peak
  EXPECT_DOUBLE_EQ(s.lr(10), 2e-3);                      // the decay starts at peak (cos 0 = 1)
  EXPECT_DOUBLE_EQ(s.lr(60), 2e-3 * (0.1 + 0.9 * 0.5));  // halfway: cos(pi / 2) = 0
  EXPECT_DOUBLE_EQ(s.lr(109), 2e-3 * (0.1 + 0.9 * 0.5 * (1 + std::cos(std::numbers::pi * 0.99))));
  EXPECT_DOUBLE_EQ(s.lr(110), 2e-4);  // the floor, from T on
  EXPECT_DOUBLE_EQ(s.lr(1000), 2e-4);
  for (int64_t i = 10; i < 120; ++i) EXPECT_LE(s.lr(i + 1), s.lr(i)) << i;
  // No warmup: step 0 at peak.
  EXPECT_DOUBLE_EQ((LrSchedule{1.0, 0, 5, 0.0}.lr(0)), 1.0);
  EXPECT_DOUBLE_EQ((LrSchedule{1.0, 0, 5, 0.0}.lr(5)), 0.0);
  for (const LrSchedule& bad :
       {LrSchedule{-1, 0, 5, 0}, LrSchedule{1, 5, 5, 0}, LrSchedule{1, -1, 5, 0},
        LrSchedule{1, 0, 5, 1.5}, LrSchedule{NAN, 0, 5, 0}}) {
    EXPECT_EQ(bad.Validate().code(), StatusCode::kInvalidInput);
  }
}

TEST(TrainLoop, WindowStartIsAPureFunctionCoveringTheStream) {
  const int64_t len = 40, seq = 8;  // starts 0 .. 31
  std::set<int64_t> seen;
  for (int64_t s = 0; s < 200; ++s)
    for (int64_t i = 0; i < 4; ++i) {
      const int64_t w = WindowStart(7, s, i, len, seq);
      ASSERT_GE(w, 0);
      ASSERT_LE(w + seq + 1, len);
      EXPECT_EQ(w, WindowStart(7, s, i, len, seq));  // same inputs, same window
      seen.insert(w);
    }
  EXPECT_EQ(seen.size(), 32u);  // 800 draws over 32 starts miss one with p ~ 32 e^-25
  int differ = 0;
  for (int64_t s = 0; s < 50; ++s)
    differ += WindowStart(7, s, 0, 1000, seq) != WindowStart(8, s, 0, 1000, seq);
  EXPECT_GE(differ, 45);  // another seed, another order (equal by chance with p ~ 1/991 each)
  EXPECT_EQ(WindowStart(1, 0, 0, seq + 1, seq), 0);  // one window: always it
}

TEST(TrainLoop, AccumulationEqualsTheMeanOverBothSequences) {
  const LlamaConfig c = TinyConfig();
  auto gen = Seeded(2801);
  ModelWeights w = TinyWeights(c, &gen);
  const std::vector<BlockMasks> masks = Mask24(c, &w);
  const std::vector<int32_t> a = Stream(c, 10, &gen), b = Stream(c, 10, &gen);
  const std::vector<std::span<const int32_t>> seqs = {a, b};
  double loss = 0.0;
  ModelWeights acc;
  ASSERT_TRUE(AccumulatedLossAndGrad(c, w, masks, seqs, &loss, &acc).ok());

  // The reference: each sequence's gradient alone, averaged in double.
  ModelWeights ga = ZerosLike(w), gb = ZerosLike(w);
  LossResult ra, rb;
  ASSERT_TRUE(ModelLossAndGrad(c, w, masks, a, {}, &ra, &ga).ok());
  ASSERT_TRUE(ModelLossAndGrad(c, w, masks, b, {}, &rb, &gb).ok());
  // Each loss is a mean over its 9 positions; equal lengths make their mean the mean over all 18.
  EXPECT_EQ(loss, (ra.loss + rb.loss) / 2);
  // Tolerance: the accumulated buffer adds b's contributions (<= 4 per entry: the tied embedding
  // gets the head's dW and the lookup's rows) onto a's in f32, each rounding at most eps32 = 6e-8
  // of a partial sum that cancellation may make ~10x the result: 4 * 10 * 6e-8 = 2.4e-6 of the
  // tensor's largest entry. (The halving is exact.) So 1e-5; measured errors print below.
  auto check = [](const char* what, const std::vector<float>& got, const std::vector<float>& x,
                  const std::vector<float>& y) {
    std::vector<double> want(x.size());
    for (size_t i = 0; i < x.size(); ++i) want[i] = (double(x[i]) + double(y[i])) / 2;
    testing::ExpectGradNear(what, got, want, 1e-5);
  };
  check("token_embd", acc.token_embd, ga.token_embd, gb.token_embd);
  check("output_norm", acc.output_norm, ga.output_norm, gb.output_norm);
  for (int64_t l = 0; l < c.n_layer; ++l) {
    check("attn_norm", acc.blocks[l].attn_norm, ga.blocks[l].attn_norm, gb.blocks[l].attn_norm);
    for (int s = 0; s < kNumSlots; ++s) {
      check("slot", acc.blocks[l].linear[s], ga.blocks[l].linear[s], gb.blocks[l].linear[s]);
      std::vector<bool> kept(acc.blocks[l].linear[s].size(), false);
      for (int64_t i : masks[l].kept[s]) kept[i] = true;
      for (size_t i = 0; i < kept.size(); ++i)
        if (!kept[i]) {
          ASSERT_EQ(acc.blocks[l].linear[s][i], 0.0f);  // pruned: never written
        }
    }
  }
  EXPECT_EQ(AccumulatedLossAndGrad(c, w, masks, {}, &loss, &acc).code(), StatusCode::kInvalidInput);
}

TEST(TrainLoop, ResumeFromTheStateFileIsBitIdentical) {
  const LlamaConfig c = TinyConfig();
  auto gen = Seeded(2802);
  ModelWeights w0 = TinyWeights(c, &gen);
  const std::vector<BlockMasks> masks = Mask24(c, &w0);
  const std::vector<int32_t> data = Stream(c, 200, &gen);
  TrainOptions opt = SmallOptions();
  opt.checkpoint_every = 4;

  auto full = NewTrainState(c, w0, masks, opt);
  ASSERT_TRUE(full.ok()) << full.status().ToString();
  ASSERT_TRUE(TrainLoop(&*full, data, {}).ok());
  EXPECT_EQ(full->step(), 12);
  EXPECT_NE(full->weights.token_embd, w0.token_embd);  // the run moved the weights

  const std::string path = TempPath("resume.safetensors");
  auto first = NewTrainState(c, w0, masks, opt);
  ASSERT_TRUE(first.ok());
  int calls = 0;
  TrainLoopOptions lo;
  lo.stop_at = 5;  // a checkpoint at 4 and the end's at 5
  lo.checkpoint_path = path;
  lo.progress = [&](const TrainProgress& p) {
    EXPECT_EQ(p.step, ++calls);
    EXPECT_EQ(p.total_steps, 12);
    EXPECT_EQ(p.lr, opt.schedule.lr(p.step - 1));
    EXPECT_TRUE(std::isfinite(p.loss) && p.grad_norm > 0 && p.tokens_per_s > 0);
    if (p.step == 4) {  // checkpoint_every 4: the file holds step 4 when the report comes
      auto at4 = LoadTrainState(path);
      ASSERT_TRUE(at4.ok()) << at4.status().ToString();
      EXPECT_EQ(at4->step(), 4);
    }
  };
  ASSERT_TRUE(TrainLoop(&*first, data, lo).ok());
  EXPECT_EQ(calls, 5);
  EXPECT_NE(first->weights.token_embd, full->weights.token_embd);  // 5 steps are not 12

  auto loaded = LoadTrainState(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  // The file holds the state exactly: weights, masks, moments, step, options.
  ExpectSameBits(loaded->weights, first->weights);
  ExpectSameOptim(loaded->optim, first->optim);
  EXPECT_EQ(loaded->step(), 5);
  for (int64_t l = 0; l < c.n_layer; ++l) EXPECT_EQ(loaded->masks[l].kept, masks[l].kept);
  EXPECT_EQ(loaded->config.ToJson(), c.ToJson());
  EXPECT_EQ(loaded->options.seed, opt.seed);
  EXPECT_EQ(loaded->options.schedule.peak, opt.schedule.peak);
  EXPECT_EQ(loaded->options.adamw.eps, opt.adamw.eps);
  EXPECT_EQ(loaded->options.checkpoint_every, 4);

  EXPECT_EQ(loaded->data_tokens, 200);
  EXPECT_EQ(loaded->data_hash, DataHash(data));
  // Other data would read other windows: refused, the state untouched.
  std::vector<int32_t> other = data;
  other[17] = (other[17] + 1) % static_cast<int32_t>(c.n_vocab);
  const Status st = TrainLoop(&*loaded, other, {});
  EXPECT_EQ(st.code(), StatusCode::kInvalidInput);
  EXPECT_NE(st.message().find("must read the same data"), std::string::npos) << st.message();
  EXPECT_EQ(loaded->step(), 5);

  ASSERT_TRUE(TrainLoop(&*loaded, data, {}).ok());
  EXPECT_EQ(loaded->step(), 12);
  ExpectSameBits(loaded->weights, full->weights);
  ExpectSameOptim(loaded->optim, full->optim);
  ExpectPrunedZero(*loaded);
  std::filesystem::remove(path);
}

TEST(TrainLoop, LossDecreasesOnTheTinyModel) {
  const LlamaConfig c = TinyConfig();
  auto gen = Seeded(2803);
  ModelWeights w = TinyWeights(c, &gen);
  const std::vector<BlockMasks> masks = Mask24(c, &w);
  const std::vector<int32_t> data = Stream(c, 400, &gen);
  TrainOptions opt = SmallOptions();
  opt.schedule = {/*peak=*/1e-2, /*warmup_steps=*/5, /*total_steps=*/60, /*min_ratio=*/0.1};
  opt.seq_len = 16;
  auto s = NewTrainState(c, w, masks, opt);
  ASSERT_TRUE(s.ok());
  std::vector<double> losses;
  TrainLoopOptions lo;
  lo.progress = [&](const TrainProgress& p) { losses.push_back(p.loss); };
  ASSERT_TRUE(TrainLoop(&*s, data, lo).ok());
  ASSERT_EQ(losses.size(), 60u);
  double head = 0, tail = 0;
  for (int i = 0; i < 5; ++i) head += losses[i] / 5, tail += losses[55 + i] / 5;
  std::printf("  mean loss: first 5 steps %.4f, last 5 steps %.4f\n", head, tail);
  // The bigram holds 7 tokens in 8: the loss falls from ~ln 11 = 2.4 well below 1.5.
  EXPECT_LT(tail, head - 0.5);
  ExpectPrunedZero(*s);
}

TEST(TrainLoop, AdamWStateRoundTripContinuesBitForBit) {
  const LlamaConfig c = TinyConfig();
  auto gen = Seeded(2805);
  ModelWeights w = TinyWeights(c, &gen);
  const std::vector<BlockMasks> masks = Mask24(c, &w);
  const std::vector<int32_t> a = Stream(c, 12, &gen), b = Stream(c, 12, &gen);
  ModelWeights ga, gb;
  double loss;
  const std::vector<std::span<const int32_t>> sa = {a}, sb = {b};
  ASSERT_TRUE(AccumulatedLossAndGrad(c, w, masks, sa, &loss, &ga).ok());
  ASSERT_TRUE(AccumulatedLossAndGrad(c, w, masks, sb, &loss, &gb).ok());
  auto one = AdamW::Create(c, w, masks, {});
  ASSERT_TRUE(one.ok());
  ModelWeights w1 = w, w2 = w;
  ASSERT_TRUE(one->Step(&w1, ga, 1e-2).ok());
  // A fresh optimizer given the first's state takes the same second step.
  auto two = AdamW::Create(c, w, masks, {});
  ASSERT_TRUE(two.ok());
  ASSERT_TRUE(two->ImportState(one->ExportState()).ok());
  w2 = w1;
  ASSERT_TRUE(one->Step(&w1, gb, 1e-2).ok());
  ASSERT_TRUE(two->Step(&w2, gb, 1e-2).ok());
  ExpectSameBits(w1, w2);
  EXPECT_EQ(two->steps(), 2);

  AdamWState bad = one->ExportState();
  bad.tensors[3].m.pop_back();
  EXPECT_EQ(two->ImportState(bad).code(), StatusCode::kInvalidInput);
  bad = one->ExportState();
  std::swap(bad.tensors[0], bad.tensors[1]);
  EXPECT_NE(two->ImportState(bad).message().find("found tensor"), std::string::npos);
  bad = one->ExportState();
  bad.steps = -1;
  EXPECT_EQ(two->ImportState(bad).code(), StatusCode::kInvalidInput);
  ExpectSameOptim(two->ExportState(), one->ExportState());  // failed imports changed nothing
}

TEST(TrainLoop, DistillationLowersTheKlToTheDenseTeacher) {
  const LlamaConfig c = TinyConfig();
  auto gen = Seeded(2807);
  const ModelWeights dense = TinyWeights(c, &gen);
  ModelWeights student = dense;
  const std::vector<BlockMasks> masks = Mask24(c, &student);
  const std::vector<int32_t> data = Stream(c, 300, &gen);
  TrainOptions opt = SmallOptions();
  opt.schedule = {/*peak=*/1e-2, /*warmup_steps=*/3, /*total_steps=*/40, /*min_ratio=*/0.1};
  opt.seq_len = 16;
  opt.ce_weight = 0.0;
  opt.kl_weight = 1.0;
  opt.tau = 2.0;
  auto s = NewTrainState(c, student, masks, opt);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(TrainLoop(&*s, data, {}).code(), StatusCode::kInvalidInput);  // no teacher
  EXPECT_EQ(s->step(), 0);
  EXPECT_EQ(s->data_tokens, 0);  // a refused call leaves the state as it was
  std::vector<double> kl;
  TrainLoopOptions lo;
  lo.teacher = [&](std::span<const int32_t> in, std::span<float> logits) {
    return ModelLogits(c, dense, in, logits);
  };
  lo.progress = [&](const TrainProgress& p) { kl.push_back(p.loss); };
  ASSERT_TRUE(TrainLoop(&*s, data, lo).ok());
  ASSERT_EQ(kl.size(), 40u);
  double head = 0, tail = 0;
  for (int i = 0; i < 5; ++i) head += kl[i] / 5, tail += kl[35 + i] / 5;
  std::printf("  mean KL to the dense teacher: first 5 steps %.4f, last 5 steps %.4f\n", head,
              tail);
  // Pruning half the weights moves the logits; training the kept half wins most of it back.
  EXPECT_LT(tail, 0.6 * head);
  ExpectPrunedZero(*s);
  TrainOptions bad = opt;
  bad.ce_weight = bad.kl_weight = 0.0;
  EXPECT_EQ(NewTrainState(c, student, masks, bad).status().code(), StatusCode::kInvalidInput);
}

class TrainStateFile : public ::testing::Test {
 protected:
  void SetUp() override {
    const LlamaConfig c = TinyConfig();
    auto gen = Seeded(2804);
    ModelWeights w = TinyWeights(c, &gen);
    std::vector<BlockMasks> masks = Mask24(c, &w);
    auto s = NewTrainState(c, w, masks, SmallOptions());
    ASSERT_TRUE(s.ok());
    state_ = std::move(*s);
    const std::vector<int32_t> data = Stream(c, 100, &gen);
    TrainLoopOptions lo;
    lo.stop_at = 2;  // nonzero moments
    ASSERT_TRUE(TrainLoop(&state_, data, lo).ok());
    path_ = TempPath(std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    ASSERT_TRUE(SaveTrainState(path_, state_).ok());
    bytes_ = ReadBytes(path_);
  }
  void TearDown() override { std::filesystem::remove(path_); }

  // The load's error after `edit` changed the file's bytes.
  std::string LoadError() {
    auto r = LoadTrainState(path_);
    EXPECT_FALSE(r.ok());
    if (!r.ok()) std::printf("  error: %s\n", r.status().message().c_str());
    return r.ok() ? "" : r.status().message();
  }
  // Offset in the file of entry i of tensor `name`.
  uint64_t OffsetOf(const std::string& name, uint64_t i) {
    auto f = SafetensorsFile::Open(path_);
    EXPECT_TRUE(f.ok());
    const SafetensorsEntry* e = f->Find(name);
    EXPECT_NE(e, nullptr) << name;
    return 8 + f->header_size() + e->data_begin + i * 4;
  }

  TrainState state_;
  std::string path_;
  std::vector<uint8_t> bytes_;
};

TEST_F(TrainStateFile, TruncatedFileNamesTheFile) {
  for (size_t keep : {size_t{0}, size_t{7}, size_t{100}, bytes_.size() - 1}) {
    WriteBytes(path_, std::vector<uint8_t>(bytes_.begin(), bytes_.begin() + keep));
    EXPECT_NE(LoadError().find(path_), std::string::npos) << keep;
  }
}

TEST_F(TrainStateFile, NonFiniteWeightNamesTheTensorAndEntry) {
  const float nan = NAN;
  std::memcpy(&bytes_[OffsetOf("blk.1.ffn_norm.weight", 3)], &nan, 4);
  WriteBytes(path_, bytes_);
  const std::string e = LoadError();
  EXPECT_NE(e.find(path_), std::string::npos) << e;
  EXPECT_NE(e.find("blk.1.ffn_norm.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("entry 3"), std::string::npos) << e;
}

TEST_F(TrainStateFile, NegativeSecondMomentIsRefused) {
  const float neg = -1.0f;
  std::memcpy(&bytes_[OffsetOf("adamw.v.output_norm.weight", 0)], &neg, 4);
  WriteBytes(path_, bytes_);
  const std::string e = LoadError();
  EXPECT_NE(e.find("output_norm.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("v >= 0"), std::string::npos) << e;
}

TEST_F(TrainStateFile, NonzeroPrunedWeightBreaksTheMask) {
  // The first pruned entry of blk.0.attn_q.weight (2:4 keeps 2 of each 4: one of 0..3 is pruned).
  const std::vector<int64_t>& kept = state_.masks[0].at(LinearSlot::kQ);
  int64_t pruned = 0;
  while (std::find(kept.begin(), kept.end(), pruned) != kept.end()) ++pruned;
  const float one = 1.0f;
  std::memcpy(&bytes_[OffsetOf("blk.0.attn_q.weight", pruned)], &one, 4);
  WriteBytes(path_, bytes_);
  const std::string e = LoadError();
  EXPECT_NE(e.find("blk.0.attn_q.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("pruned entry " + std::to_string(pruned)), std::string::npos) << e;
}

TEST_F(TrainStateFile, MissingTensorWrongShapeAndVersionAreNamed) {
  auto f = SafetensorsFile::Open(path_);
  ASSERT_TRUE(f.ok());
  auto rewrite = [&](const std::string& drop, const std::string& reshape,
                     std::map<std::string, std::string> meta) {
    std::vector<NamedTensor> t;
    for (const SafetensorsEntry& e : f->tensors()) {
      if (e.name == drop) continue;
      Tensor x = e.tensor.Clone();
      if (e.name == reshape)
        x = Tensor::View(x.dtype(), {1, int64_t(x.numel())}, e.tensor.data_as<float>());
      t.push_back({e.name, x});
    }
    const std::string out = path_ + ".edit";
    EXPECT_TRUE(WriteSafetensors(out, t, meta).ok());
    auto r = LoadTrainState(out);
    std::filesystem::remove(out);
    EXPECT_FALSE(r.ok());
    if (!r.ok()) std::printf("  error: %s\n", r.status().message().c_str());
    return r.ok() ? std::string() : r.status().message();
  };
  std::string e = rewrite("adamw.m.blk.1.ffn_down.weight", "", f->metadata());
  EXPECT_NE(e.find("adamw.m.blk.1.ffn_down.weight': missing"), std::string::npos) << e;
  e = rewrite("", "output_norm.weight", f->metadata());
  EXPECT_NE(e.find("output_norm.weight': shape [1, 16], expected [16]"), std::string::npos) << e;
  auto meta = f->metadata();
  meta["sparq.train_state"] = "99";
  e = rewrite("", "", meta);
  EXPECT_NE(e.find("version '99'"), std::string::npos) << e;
  meta = f->metadata();
  meta.erase("sparq.train_state");
  e = rewrite("", "", meta);
  EXPECT_NE(e.find("not a sparq train state"), std::string::npos) << e;
  meta = f->metadata();
  meta["sparq.model"].replace(meta["sparq.model"].find("\"n_layer\":2"), 11, "\"n_layer\":4000");
  e = rewrite("", "", meta);  // a count the file cannot back: refused before it sizes anything
  EXPECT_NE(e.find("n_layer 4000 but the file holds only"), std::string::npos) << e;
  meta = f->metadata();
  meta["sparq.train"] = R"({"step": 2})";
  e = rewrite("", "", meta);
  EXPECT_NE(e.find("missing field 'seed'"), std::string::npos) << e;
}

TEST_F(TrainStateFile, AFailedSaveLeavesThePreviousFileIntact) {
  TrainState bad = state_;
  bad.weights.blocks[0].attn_norm.pop_back();  // refused before anything is written
  EXPECT_EQ(SaveTrainState(path_, bad).code(), StatusCode::kInvalidInput);
  EXPECT_EQ(ReadBytes(path_), bytes_);
  EXPECT_FALSE(SaveTrainState(TempPath("no_such_dir") + "/x/state.safetensors", state_).ok());
  auto r = LoadTrainState(path_);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ExpectSameBits(r->weights, state_.weights);
}

TEST(TrainStateSeeds, TheFuzzSeedsLoadOrFailAsNamed) {
  // fuzz/corpus/train_state is written by scripts/make_fuzz_seeds.py, not by SaveTrainState: the
  // valid seed checks that the format is what the header says.
  const std::string dir = std::string(SPARQ_SOURCE_DIR) + "/fuzz/corpus/train_state/";
  auto s = LoadTrainState(dir + "one_layer_24.safetensors");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->step(), 3);
  EXPECT_EQ(s->config.n_layer, 1);
  EXPECT_EQ(s->masks[0].at(LinearSlot::kQ), (std::vector<int64_t>{0, 1, 4, 5, 8, 9, 12, 13}));
  EXPECT_TRUE(s->masks[0].at(LinearSlot::kK).empty());
  EXPECT_EQ(s->options.schedule.total_steps, 10);
  EXPECT_EQ(s->data_hash, 12345u);
  EXPECT_EQ(s->options.kl_weight, 0.5);
  EXPECT_EQ(s->options.tau, 2.0);
  const std::vector<uint8_t> bytes = ReadBytes(dir + "one_layer_24.safetensors");
  auto m = LoadTrainStateFromMemory(bytes.data(), bytes.size());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ExpectSameBits(m->weights, s->weights);
  ExpectSameOptim(m->optim, s->optim);
  EXPECT_FALSE(LoadTrainState(dir + "broken_truncated.safetensors").ok());
  auto bad = LoadTrainState(dir + "broken_mask_mismatch.safetensors");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("pruned entry 2"), std::string::npos)
      << bad.status().message();
}

TEST_F(TrainStateFile, AKillMidWriteLeavesAWholeFile) {
  // A child saves two states in turn until it is killed at a random moment; the file must then
  // load whole as one of them (the rename is the only moment it changes).
  TrainState other = state_;
  other.weights.output_norm[0] += 1.0f;
  const std::string dir = TempPath("kill_dir");
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/state.safetensors";
  ASSERT_TRUE(SaveTrainState(path, state_).ok());
  std::mt19937_64 gen(2806);
  for (int round = 0; round < 6; ++round) {
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      for (int i = 0;; ++i) (void)SaveTrainState(path, i % 2 == 0 ? other : state_);
    }
    ::usleep(1000 + static_cast<useconds_t>(gen() % 20000));
    ::kill(pid, SIGKILL);
    int wst = 0;
    ASSERT_EQ(::waitpid(pid, &wst, 0), pid);
    auto r = LoadTrainState(path);
    ASSERT_TRUE(r.ok()) << "round " << round << ": " << r.status().ToString();
    const float g = r->weights.output_norm[0];
    EXPECT_TRUE(g == state_.weights.output_norm[0] || g == other.weights.output_norm[0]);
    ExpectSameOptim(r->optim, state_.optim);
  }
  // Temporary files a killed writer left: evidence that some kills came mid-write.
  int left = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) left += e.path() != path;
  std::printf("  %d of 6 kills left a temporary file (killed mid-write)\n", left);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace sparq::train
