// Self-distillation data (sparq/finetune.h SelfDistillText) from SmolLM2: samples start from the
// prompt list in order, each sample is seeded on its own (one at a time, a shorter request gives a
// prefix of a longer one), the text does not depend on the thread count, batches decode the same
// samples from the same prompts, seeds change it, and bad options are errors.
#include <gtest/gtest.h>

#include <string>

#include "model/model_testutil.h"
#include "sparq/finetune.h"

namespace sparq::train {
namespace {

class SelfDistillTest : public testing::SharedSmolLm<SelfDistillTest> {
 protected:
  static std::string Text(int64_t tokens, uint64_t seed, int threads, int64_t batch = 1) {
    SelfDistillOptions o;
    o.tokens = tokens;
    o.sample_len = 12;
    o.seed = seed;
    o.batch = batch;
    ThreadPool pool(threads);
    auto r = SelfDistillText(*model_, o, &pool);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : std::string();
  }
};

TEST_F(SelfDistillTest, SamplesFollowThePromptsAndTheSeed) {
  const std::vector<std::string>& prompts = SelfDistillPrompts();
  ASSERT_GE(prompts.size(), 3u);
  // Batch 1: every token from Forward's n = 1 kernels, whatever the request (a batch's size
  // follows the request, and its n = B kernels may round a logit otherwise, which can change a
  // draw).
  const std::string one = Text(12, 0, 1), three = Text(30, 0, 2);
  std::printf("self-distill sample: %s\n", one.c_str());
  // Sample 0 of either request: the first prompt and 12 sampled tokens (unless EOS ends it).
  EXPECT_EQ(one.rfind(prompts[0], 0), 0u) << one;
  EXPECT_GT(one.size(), prompts[0].size());
  EXPECT_EQ(three.rfind(one, 0), 0u) << "a shorter request is not a prefix of a longer one";
  // 30 tokens: samples of 12, 12 and 6, each after a blank line from its prompt.
  EXPECT_NE(three.find("\n\n" + prompts[1]), std::string::npos) << three;
  EXPECT_NE(three.find("\n\n" + prompts[2]), std::string::npos) << three;
  EXPECT_EQ(three, Text(30, 0, 1)) << "the thread count changed the samples";
  // Training reads it as strict UTF-8 (the tokenizer's check).
  EXPECT_TRUE(model_->tokenizer().Encode(three).ok());
  EXPECT_NE(Text(12, 1, 1), one) << "another seed gave the same sample";
}

// Continuous batching: up to 4 samples decoded at once, slots refilled as samples end. The text
// is a function of the options (same call twice, 1 or 2 threads: the same bytes) and holds the
// samples of batch 1, from the same prompts in the same order.
TEST_F(SelfDistillTest, BatchedSamplingIsDeterministicAndFollowsThePrompts) {
  const std::vector<std::string>& prompts = SelfDistillPrompts();
  const std::string batched = Text(100, 3, 2, 4);
  EXPECT_EQ(batched, Text(100, 3, 2, 4)) << "the same options gave another text";
  EXPECT_EQ(batched, Text(100, 3, 1, 4)) << "the thread count changed the samples";
  const std::string single = Text(100, 3, 1, 1);
  std::printf("batch 4:\n%s\nbatch 1:\n%s\n", batched.c_str(), single.c_str());
  EXPECT_EQ(batched.rfind(prompts[0], 0), 0u) << batched;
  // 100 tokens in samples of at most 12: at least 9 samples; each prompt's "\n\n" + prompt starts
  // a sample in both texts or in neither, in order.
  size_t at_batched = 0, at_single = 0;
  int samples = 1;
  for (size_t i = 1; i < prompts.size(); ++i) {
    const size_t b = batched.find("\n\n" + prompts[i], at_batched);
    const size_t s = single.find("\n\n" + prompts[i], at_single);
    EXPECT_EQ(b == std::string::npos, s == std::string::npos) << "sample " << i;
    if (b == std::string::npos || s == std::string::npos) break;
    at_batched = b, at_single = s;
    ++samples;
  }
  EXPECT_GE(samples, 9);
  EXPECT_TRUE(model_->tokenizer().Encode(batched).ok());
}

TEST_F(SelfDistillTest, BadOptionsAreErrors) {
  ThreadPool pool(1);
  SelfDistillOptions o;
  o.tokens = 4;
  o.temperature = 0.0;
  auto r = SelfDistillText(*model_, o, &pool);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("temperature"), std::string::npos);
  o.temperature = 1.0;
  o.tokens = 0;
  EXPECT_FALSE(SelfDistillText(*model_, o, &pool).ok());
  o.tokens = 4;
  o.top_k = -1;
  EXPECT_FALSE(SelfDistillText(*model_, o, &pool).ok());
  o.top_k = 0;
  o.batch = 0;
  r = SelfDistillText(*model_, o, &pool);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("batch must be >= 1"), std::string::npos);
  o.batch = 16;
  o.top_p = 0.0;
  r = SelfDistillText(*model_, o, &pool);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("top-p must be in (0, 1]"), std::string::npos);
}

}  // namespace
}  // namespace sparq::train
