// FromLlamaModel (sparq/train_model.h): the training weights read back from an inference
// LlamaModel whose slots are stored dense, 2:4 N:M, and 2:4 N:M with a column permutation equal
// the weights it was built from bit for bit, the kept lists are the 2:4 masks, and the training
// forward on them reproduces LlamaModel::Forward's logits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "sparq/model.h"
#include "sparq/train_model.h"
#include "tests/train/tiny_model_testutil.h"
#include "tests/train/train_testutil.h"

namespace sparq::train {
namespace {

using testing::Prune24;
using testing::Seeded;
using testing::SlotStorage;
using testing::TinyConfig;
using testing::TinyWeights;

TEST(TrainFromModel, ReadsWeightsMasksAndReproducesLogits) {
  const LlamaConfig c = TinyConfig();
  auto gen = Seeded(601);
  ModelWeights w = TinyWeights(c, &gen);
  // blk.0: ffn_up and attn_q 2:4; blk.1: ffn_down 2:4 on a permuted column order (the 2:4
  // groups hold in W[:, perm], so W itself is not 2:4 along k). Other slots dense.
  std::vector<std::array<SlotStorage, kNumSlots>> storage(c.n_layer);
  std::vector<BlockMasks> want_masks(c.n_layer);
  for (LinearSlot s : {LinearSlot::kUp, LinearSlot::kQ}) {
    const auto [m, k] = SlotShape(c, s);
    want_masks[0].at(s) = Prune24(&w.blocks[0].at(s), m, k);
    storage[0][static_cast<int>(s)].nm24 = true;
  }
  {
    const auto [m, k] = SlotShape(c, LinearSlot::kDown);
    std::vector<int32_t> perm(k);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), gen);
    std::vector<float>& wd = w.blocks[1].at(LinearSlot::kDown);
    std::vector<float> wp(m * k);  // W_p = W[:, perm], pruned 2:4, scattered back into W
    for (int64_t r = 0; r < m; ++r)
      for (int64_t j = 0; j < k; ++j) wp[r * k + j] = wd[r * k + perm[j]];
    for (int64_t i : Prune24(&wp, m, k))
      want_masks[1].at(LinearSlot::kDown).push_back(i / k * k + perm[i % k]);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t j = 0; j < k; ++j) wd[r * k + perm[j]] = wp[r * k + j];
    storage[1][static_cast<int>(LinearSlot::kDown)] = {.nm24 = true, .perm = perm};
  }
  const LlamaModel model = testing::TinyLlamaModel(c, w, storage);
  EXPECT_EQ(model.weights().blocks[0].at(LinearSlot::kUp).format().rfind("nm 2:4", 0), 0u)
      << model.weights().blocks[0].at(LinearSlot::kUp).format();

  auto tm = FromLlamaModel(model, nullptr);
  ASSERT_TRUE(tm.ok()) << tm.status().ToString();
  ASSERT_TRUE(CheckModel(c, tm->weights, tm->masks).ok());
  EXPECT_EQ(tm->weights.token_embd, w.token_embd);
  EXPECT_EQ(tm->weights.output_norm, w.output_norm);
  int64_t kept = 0;
  for (int64_t l = 0; l < c.n_layer; ++l) {
    EXPECT_EQ(tm->weights.blocks[l].attn_norm, w.blocks[l].attn_norm);
    EXPECT_EQ(tm->weights.blocks[l].ffn_norm, w.blocks[l].ffn_norm);
    for (int s = 0; s < kNumSlots; ++s) {
      EXPECT_EQ(tm->weights.blocks[l].linear[s], w.blocks[l].linear[s])
          << "blk." << l << " slot " << s;
      std::vector<int64_t> got = tm->masks[l].kept[s], want = want_masks[l].kept[s];
      std::sort(got.begin(), got.end());
      std::sort(want.begin(), want.end());
      EXPECT_EQ(got, want) << "blk." << l << " slot " << s;
      kept += static_cast<int64_t>(got.size());
    }
  }
  std::printf("  3 sparse slots (one permuted): %lld kept weights, values bit-exact\n",
              static_cast<long long>(kept));

  const std::vector<int32_t> ids = {3, 7, 3, 0, 10, 5, 2, 8};
  for (int64_t n : {8, 3}) {  // n >= 4: the batched (prompt) kernels; 3: decode
    const std::span<const int32_t> in(ids.data(), static_cast<size_t>(n));
    auto cache = KvCache::Create(c, n);
    ASSERT_TRUE(cache.ok());
    std::vector<float> want(n * c.n_vocab), got(n * c.n_vocab);
    ASSERT_TRUE(model.Forward(in, &*cache, want.data(), true, nullptr).ok());
    ASSERT_TRUE(ModelLogits(c, tm->weights, in, got).ok());
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < got.size(); ++i) {
      num = std::max(num, std::abs(double(got[i]) - want[i]));
      den = std::max(den, std::abs(double(want[i])));
    }
    // As model_grad_test's LogitsMatchLlamaModelForward: two f32 forwards rounding differently,
    // a few eps32 * sqrt(K) per op over ~25 ops: ~8e-6 of the logits.
    std::printf("  n %lld: logits vs LlamaModel max rel err %.3g (tol 1e-5)\n",
                static_cast<long long>(n), num / den);
    EXPECT_LE(num / den, 1e-5);
  }
}

TEST(TrainFromModel, DenseModelHasNoMasks) {
  const LlamaConfig c = TinyConfig();
  auto gen = Seeded(602);
  const ModelWeights w = TinyWeights(c, &gen);
  auto tm = FromLlamaModel(testing::TinyLlamaModel(c, w), nullptr);
  ASSERT_TRUE(tm.ok()) << tm.status().ToString();
  for (const BlockMasks& m : tm->masks)
    for (const auto& k : m.kept) EXPECT_TRUE(k.empty());
  EXPECT_EQ(tm->weights.blocks[1].at(LinearSlot::kGate), w.blocks[1].at(LinearSlot::kGate));
}

}  // namespace
}  // namespace sparq::train
