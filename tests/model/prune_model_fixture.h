// The shared fixture of the end-to-end pruning tests (CI tier prune_model_test.cc and slow tier
// prune_model_slowtest.cc): SmolLM2-135M loaded once, the calibration text and 1,024 WikiText ids.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>
#include <regex>
#include <span>
#include <vector>
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
  // --embedding-values cases (prune_model_test.cc, prune_model_slowtest.cc): each stores the
  // embedding as a dense quantized matrix (nothing else pruned), which the model looks tokens up
  // in (its dequantization) and runs as the tied head (the dense quantized rows); the head bytes,
  // the lookup table and the perplexity cost over f32 (at most max_cost) are checked. Returns
  // each case's head reconstruction error.
  struct EmbeddingCase {
    const char* spec;
    ModelPruneOptions::QuantMethod method;
    double max_cost;
  };
  std::vector<double> CheckQuantizedEmbeddings(std::span<const EmbeddingCase> wants) {
    using QM = ModelPruneOptions::QuantMethod;
    ThreadPool pool(2);
    ModelPruneOptions o = SmallOptions(PruneMethod::kMagnitude, "2:4");
    o.max_blocks = 0;  // nothing pruned: the embedding's cost alone
    o.values.dtype = DType::kBF16;
    const double p32 = Ppl(*dense_);
    const LlamaConfig& c = dense_->config();
    std::vector<double> head_error(wants.size(), 0.0);
    for (size_t wi = 0; wi < wants.size(); ++wi) {
      const EmbeddingCase& want = wants[wi];
      const char* method = want.method == QM::kGptq ? "gptq" : "rtn";
      o.embedding_values = *ValueSpec::Parse(want.spec);
      o.quant_method = want.method;
      const std::string out = Out(std::string("embd-") + want.spec + "-" + method + ".sparq");
      auto r = PruneLlama(path_, calib_, o, out, testing::MachineConfig(), &pool);
      EXPECT_TRUE(r.ok()) << r.status().ToString();
      if (!r.ok()) return head_error;
      // The tied head is reported as a layer, with the error of what is stored.
      EXPECT_EQ(r->layers.size(), 1u);
      EXPECT_EQ(r->layers[0].name, "token_embd.weight");
      head_error[wi] = r->layers[0].report.rel_error;
      auto ck = ReadCheckpoint(out);
      EXPECT_TRUE(ck.ok()) << ck.status().ToString();
      if (!ck.ok()) return head_error;
      EXPECT_EQ(ck->FindTensor("token_embd.weight"), nullptr);
      const CheckpointTensor* em = ck->FindMatrix("token_embd.weight");
      EXPECT_NE(em, nullptr);
      if (em == nullptr) return head_error;
      const auto& dm = std::get<DenseMatrix>(em->matrix);
      EXPECT_EQ(dm.quant.spec.Name(), want.spec);
      auto m = LlamaModel::Load(out, testing::MachineConfig());
      EXPECT_TRUE(m.ok()) << m.status().ToString();
      if (!m.ok()) return head_error;
      EXPECT_EQ(m->weights().output.format(), std::string("dense ") + want.spec);
      EXPECT_EQ(m->weights().output.values().Name(), want.spec);
      // Head bytes: codes (int8 1 byte, int4 half; rows padded to 16 columns: 576 is a multiple)
      // plus an f16 scale (and min, int4) per group, streamed as f32.
      const int64_t groups = (c.n_embd + dm.quant.spec.group - 1) / dm.quant.spec.group;
      const int64_t code_bytes = dm.quant.spec.dtype == DType::kI8 ? c.n_embd : c.n_embd / 2;
      const int64_t group_bytes = dm.quant.spec.has_min() ? 8 : 4;
      EXPECT_EQ(int64_t(m->weights().output.weight_bytes()),
                c.n_vocab * (code_bytes + group_bytes * groups))
          << want.spec;
      // The lookup table is the stored matrix's dequantization, element for element.
      const Tensor deq = dm.ToDense();
      const float* e = m->weights().token_embd.data_as<float>();
      for (int64_t i = 0; i < c.n_vocab * c.n_embd; i += 991) {
        EXPECT_EQ(e[i], deq.data_as<float>()[i]) << want.spec << " element " << i;
        if (e[i] != deq.data_as<float>()[i]) break;
      }
      const double pq = Ppl(*m);
      std::printf(
          "perplexity (1024 tokens): f32 %.4f, bf16 blocks + %s %s embedding and head %.4f "
          "(%+.2f%%), head rel_error %.5f\n",
          p32, want.spec, method, pq, 100.0 * (pq / p32 - 1.0), head_error[wi]);
      EXPECT_LE(pq, p32 * (1.0 + want.max_cost)) << want.spec << " " << method;
      std::remove(out.c_str());
    }
    return head_error;
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
