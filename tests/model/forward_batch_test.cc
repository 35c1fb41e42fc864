// LlamaModel::ForwardBatch on SmolLM2-135M: one decode step of B sequences at different lengths
// gives the logits of one Forward per sequence (B = 1 bit for bit), the same bits on 1 and 2
// threads, appends one position to each cache, and rejects bad inputs before running anything.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "model/model_testutil.h"
#include "sparq/model.h"

namespace sparq {
namespace {

// Batched vs one-at-a-time decode: the linear layers run with n = B instead of n = 1, which may
// take another kernel path (other tiles, another summation order), so the bits may differ. Both
// are the same forward pass in f32; SmolLM2's logits from either path are within 5e-5 of the
// float64 reference (llama_test.cc kLogitTol: logits O(10-30), a few dozen f32 ulps of
// accumulated rounding after 30 blocks, i.e. ~eps * sqrt(K) * |w| * |x| per product compounded
// over the blocks; summation order moves it by ~2e-5), hence
//   |batched - single| <= |batched - ref| + |ref - single| <= 2 * 5e-5 = 1e-4.
// A row given another sequence's position, cache or RoPE angle moves logits by whole units.
constexpr double kBatchTol = 1e-4;

class ForwardBatchTest : public testing::SharedSmolLm<ForwardBatchTest> {
 protected:
  // B caches holding prompts of different lengths (prompt b: the first 3 + 2b tokens of a
  // sentence), capacity for a few more positions.
  static std::vector<KvCache> Prefilled(int64_t b_count, const std::vector<int32_t>& ids,
                                        ThreadPool* pool) {
    std::vector<KvCache> caches;
    for (int64_t b = 0; b < b_count; ++b) {
      auto kv = KvCache::Create(model_->config(), 32);
      EXPECT_TRUE(kv.ok());
      const auto len = static_cast<size_t>(std::min<int64_t>(3 + 2 * b, ids.size()));
      EXPECT_TRUE(model_->Forward(std::span(ids).first(len), &*kv, nullptr, false, pool).ok());
      caches.push_back(std::move(*kv));
    }
    return caches;
  }
  static std::vector<int32_t> Ids() {
    auto ids = model_->tokenizer().Encode(
        "The quick brown fox jumps over the lazy dog, and then it runs into the forest.");
    EXPECT_TRUE(ids.ok());
    EXPECT_GE(ids->size(), 13u);
    return ids.ok() ? *ids : std::vector<int32_t>{};
  }
};

TEST_F(ForwardBatchTest, BatchMatchesOneForwardPerSequence) {
  const std::vector<int32_t> ids = Ids();
  const int64_t vocab = model_->config().n_vocab;
  ThreadPool pool(2);
  for (int64_t B : {1, 3, 5}) {
    // Two steps, so the second runs on caches the batch itself appended to.
    std::vector<KvCache> batched = Prefilled(B, ids, &pool), single = Prefilled(B, ids, &pool);
    double max_diff = 0.0;
    for (int step = 0; step < 2; ++step) {
      std::vector<int32_t> tokens;
      std::vector<KvCache*> ptrs;
      for (int64_t b = 0; b < B; ++b) {
        tokens.push_back(ids[static_cast<size_t>((7 * b + 3 * step) % 13)]);
        ptrs.push_back(&batched[b]);
      }
      std::vector<float> got(static_cast<size_t>(B * vocab), NAN);
      Status st = model_->ForwardBatch(tokens, ptrs, got.data(), &pool);
      ASSERT_TRUE(st.ok()) << st.ToString();
      for (int64_t b = 0; b < B; ++b) {
        std::vector<float> want(static_cast<size_t>(vocab));
        ASSERT_TRUE(model_->Forward(std::span(tokens).subspan(b, 1), &single[b], want.data(), false,
                                    &pool)
                        .ok());
        EXPECT_EQ(batched[b].length(), single[b].length()) << "B " << B << " sequence " << b;
        for (int64_t j = 0; j < vocab; ++j) {
          const float g = got[b * vocab + j];
          if (B == 1) {  // Forward's own kernels: the same bits
            ASSERT_EQ(std::bit_cast<uint32_t>(g), std::bit_cast<uint32_t>(want[j])) << j;
          }
          max_diff = std::max(max_diff, std::abs(double(g) - want[j]));
          ASSERT_NEAR(g, want[j], kBatchTol) << "B " << B << " sequence " << b << " vocab " << j;
        }
      }
    }
    std::printf("B %lld: max |batched - single| = %.2e (bound %.0e)\n", static_cast<long long>(B),
                max_diff, kBatchTol);
  }
}

TEST_F(ForwardBatchTest, ThreadCountDoesNotChangeTheBits) {
  const std::vector<int32_t> ids = Ids();
  const int64_t B = 4, vocab = model_->config().n_vocab;
  std::vector<float> out[2];
  for (int threads : {1, 2}) {
    ThreadPool pool(threads);
    std::vector<KvCache> caches = Prefilled(B, ids, &pool);
    std::vector<KvCache*> ptrs;
    for (KvCache& kv : caches) ptrs.push_back(&kv);
    const std::vector<int32_t> tokens = {ids[5], ids[1], ids[9], ids[2]};
    out[threads - 1].resize(static_cast<size_t>(B * vocab));
    ASSERT_TRUE(model_->ForwardBatch(tokens, ptrs, out[threads - 1].data(), &pool).ok());
  }
  for (size_t i = 0; i < out[0].size(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(out[0][i]), std::bit_cast<uint32_t>(out[1][i])) << i;
  }
}

TEST_F(ForwardBatchTest, BadInputsAreErrors) {
  auto a = KvCache::Create(model_->config(), 2);
  auto b = KvCache::Create(model_->config(), 2);
  ASSERT_TRUE(a.ok() && b.ok());
  auto error = [&](std::vector<int32_t> tokens, std::vector<KvCache*> caches) {
    Status st = model_->ForwardBatch(tokens, caches, nullptr, nullptr);
    EXPECT_EQ(st.code(), StatusCode::kInvalidInput);
    return st.message();
  };
  EXPECT_NE(error({}, {}).find("no tokens"), std::string::npos);
  EXPECT_NE(error({1, 2}, {&*a}).find("2 tokens but 1 KV caches"), std::string::npos);
  EXPECT_NE(error({1, 49152}, {&*a, &*b}).find("token 1 has id 49152"), std::string::npos);
  EXPECT_NE(error({1, 2}, {&*a, nullptr}).find("KV cache 1 is null"), std::string::npos);
  EXPECT_NE(error({1, 2}, {&*a, &*a}).find("sequences 0 and 1 share one KV cache"),
            std::string::npos);
  b->set_length(2);
  const std::string full = error({1, 2}, {&*a, &*b});
  EXPECT_NE(full.find("sequence 1 is full: 3 positions exceed its KV cache capacity 2"),
            std::string::npos)
      << full;
  EXPECT_EQ(a->length(), 0) << "a failed call appended to a cache";
}

}  // namespace
}  // namespace sparq
