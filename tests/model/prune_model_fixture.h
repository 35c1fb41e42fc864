// The shared fixture of the end-to-end pruning tests (CI tier prune_model_test.cc and slow tier
// prune_model_slowtest.cc): SmolLM2-135M loaded once, the calibration text and 1,024 WikiText ids.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>
#include <regex>
#include "model/model_testutil.h"
#include "sparq/checkpoint.h"
#include "sparq/model.h"

namespace sparq {

class PruneModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // Missing files are reported by SetUp, test by test; here they only stop the loading.
    path_ = testing::SmolLmPath();
    if (path_.empty()) return;
    calib_ = testing::ReadFileOrEmpty(testing::DataText("sherlock-holmes-pg1661.txt"));
    const std::string wiki =
        testing::ReadFileOrEmpty(testing::DataText("wikitext-2-raw-test.txt"));
    if (calib_.empty() || wiki.empty()) return;
    dense_ = testing::NewSmolLm();
    ASSERT_NE(dense_, nullptr);
    auto ids = dense_->tokenizer().Encode(wiki.substr(0, 20000));
    ASSERT_TRUE(ids.ok()) << ids.status().ToString();
    ASSERT_GE(ids->size(), kEvalTokens) << "the first 20,000 characters of WikiText are too short";
    eval_ids_ = new std::vector<int32_t>(ids->begin(), ids->begin() + kEvalTokens);
  }
  static void TearDownTestSuite() {
    delete dense_;
    delete eval_ids_;
    dense_ = nullptr;
    eval_ids_ = nullptr;
  }
  void SetUp() override {
    SPARQ_REQUIRE_MODEL();
    SPARQ_REQUIRE_TEXT("sherlock-holmes-pg1661.txt");
    SPARQ_REQUIRE_TEXT("wikitext-2-raw-test.txt");
    ASSERT_NE(eval_ids_, nullptr) << path_ << ": the dense model or its WikiText ids did not load "
                                     "(see the SetUpTestSuite failure above)";
  }
  static ModelPruneOptions SmallOptions(PruneMethod method, const char* pattern) {
    ModelPruneOptions o;
    o.method = method;
    o.pattern = *Pattern::Parse(pattern);
    o.calib_samples = 8;
    o.calib_len = 256;
    o.max_blocks = 2;
    o.progress = false;
    return o;
  }
  static double Ppl(const LlamaModel& m) {
    ThreadPool pool(2);
    auto r = Perplexity(m, *eval_ids_, 512, &pool);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? r->perplexity : 0.0;
  }
  // Unique per process: ctest runs tests (and other checkouts their tests) side by side.
  static std::string Out(const std::string& name) {
    return ::testing::TempDir() + "/sparq_" + std::to_string(::getpid()) + "_" + name;
  }

  static constexpr size_t kEvalTokens = 1024;
  static inline std::string path_, calib_;
  static inline LlamaModel* dense_ = nullptr;
  static inline std::vector<int32_t>* eval_ids_ = nullptr;
};

}  // namespace sparq
