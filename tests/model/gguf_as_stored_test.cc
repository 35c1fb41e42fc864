// LoadOptions::gguf_values = kAsStored on SmolLM2-135M Q4_1: the blocks' Q4_1 linear layers and
// the tied head (token_embd is Q8_0) run as stored, with the bytes the codes and scales take, and
// the same model as the f32 load up to f32 summation order.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include "model/model_testutil.h"
#include "sparq/gguf.h"
#include "sparq/model.h"
#include "src/model/llama_internal.h"

namespace sparq {
namespace {

class LlamaGgufAsStoredTest : public testing::SharedSmolLmPair<LlamaGgufAsStoredTest> {
 protected:
};

// What the file holds (checked, so the expectations below follow from it): Q4_1 blocks, a Q8_0
// token embedding that is also the head.
TEST_F(LlamaGgufAsStoredTest, FileHoldsQ41BlocksAndAQ80TiedEmbedding) {
  auto f = GgufFile::Open(path_);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  ASSERT_TRUE(stored_->config().tied_output);
  ASSERT_EQ(f->FindTensor("output.weight"), nullptr);
  EXPECT_EQ(f->FindTensor("token_embd.weight")->type, GgmlType::kQ8_0);
  for (int64_t l = 0; l < stored_->config().n_layer; ++l) {
    for (int s = 0; s < kNumSlots; ++s) {
      const std::string name = "blk." + std::to_string(l) + "." +
                               std::string(SlotName(static_cast<LinearSlot>(s))) + ".weight";
      EXPECT_EQ(f->FindTensor(name)->type, GgmlType::kQ4_1) << name;
    }
  }
}

// Every block linear is dense int4:g32, the head dense int8:g32; the default load is still f32.
TEST_F(LlamaGgufAsStoredTest, FormatsAndValues) {
  for (const LlamaBlock& b : stored_->weights().blocks) {
    for (const LinearWeight& lw : b.linear) {
      EXPECT_EQ(lw.format(), "dense int4:g32");
      EXPECT_EQ(lw.values().Name(), "int4:g32");
    }
  }
  EXPECT_EQ(stored_->block_linear_values(), "int4:g32");
  EXPECT_EQ(stored_->weights().output.format(), "dense int8:g32");
  EXPECT_EQ(stored_->weights().output.values().Name(), "int8:g32");
  EXPECT_EQ(f32_->block_linear_values(), "f32");
  EXPECT_EQ(f32_->weights().output.format(), "dense f32");
  // The lookup table stays f32 (Embed reads f32 rows), the same numbers in both loads.
  const Tensor& a = f32_->weights().token_embd;
  const Tensor& e = stored_->weights().token_embd;
  ASSERT_EQ(e.dtype(), DType::kF32);
  ASSERT_EQ(e.numel(), a.numel());
  EXPECT_EQ(std::memcmp(e.data(), a.data(), e.nbytes()), 0);
}

// Bytes, exactly: an int4:g32 [m, k] layer streams m * k / 2 code bytes plus an f32 scale and an
// f32 min per 32 values (the kernels' copies of the file's f16s): 3/4 byte per weight. The
// int8:g32 head: 1 byte per code plus an f32 scale per 32: 9/8 byte per weight. Every k here is a
// multiple of 32 (and of the kernels' 16-column chunk), so no row is padded.
TEST_F(LlamaGgufAsStoredTest, WeightBytesAreCodesScalesAndMins) {
  const LlamaConfig& c = stored_->config();
  uint64_t linears = 0;
  for (int s = 0; s < kNumSlots; ++s) {
    const auto [m, k] = SlotShape(c, static_cast<LinearSlot>(s));
    ASSERT_EQ(k % 32, 0);
    const uint64_t layer = uint64_t(m) * k / 2 + uint64_t(m) * (k / 32) * 4 * 2;
    EXPECT_EQ(stored_->weights().blocks[0].linear[s].weight_bytes(), layer);
    linears += layer;
  }
  linears *= c.n_layer;
  const uint64_t embd = uint64_t(c.n_vocab) * c.n_embd;
  const uint64_t head = embd + uint64_t(c.n_vocab) * (c.n_embd / 32) * 4;
  const uint64_t norms = uint64_t(2 * c.n_layer + 1) * c.n_embd * 4;
  EXPECT_EQ(stored_->block_linear_bytes(), linears);
  EXPECT_EQ(stored_->weights().output.weight_bytes(), head);
  EXPECT_EQ(stored_->weight_bytes(), linears + head + 4 * embd + norms);
  EXPECT_EQ(stored_->weight_bytes_per_token(), linears + head + norms + 4 * uint64_t(c.n_embd));
  // SmolLM2-135M: 106,168,320 block-linear weights.
  EXPECT_EQ(linears, 106168320ull * 3 / 4);
}

// Layer by layer: block 0's seven layers and the head, as stored and as f32, on the same random
// X of 1 token (decode kernels) and 7 tokens (tiled kernels), each against a double-precision
// reference sum over the f32 weights (the dequantized values, bit for bit the codes' values). The
// kernels compute each weight from its code in f32 (at most one rounding off the reference
// weight, |dw| <= eps |w|) and add K products in f32 in some order: |y - ref| <= (K + 1) eps
// sum_k |w_k x_k| to first order; twice that is the bound.
TEST_F(LlamaGgufAsStoredTest, EveryLayerMatchesTheF32SumWithinTheRoundingBound) {
  std::mt19937 rng(27);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<std::pair<const LinearWeight*, const LinearWeight*>> pairs;
  for (int s = 0; s < kNumSlots; ++s) {
    pairs.push_back(
        {&f32_->weights().blocks[0].linear[s], &stored_->weights().blocks[0].linear[s]});
  }
  pairs.push_back({&f32_->weights().output, &stored_->weights().output});
  ThreadPool pool(2);
  const double eps = std::ldexp(1.0, -24);
  for (const auto& [dense, quant] : pairs) {
    const int64_t m = dense->rows(), k = dense->cols();
    const float* w = dense->dense_f32();
    ASSERT_NE(w, nullptr);
    for (int64_t n : {1, 7}) {
      std::vector<float> x(n * k), yd(n * m), yq(n * m);
      for (float& v : x) v = nd(rng);
      dense->Forward(x.data(), n, yd.data(), &pool);
      quant->Forward(x.data(), n, yq.data(), &pool);
      int64_t bad = 0;
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t r = 0; r < m; ++r) {
          double ref = 0.0, abs = 0.0;
          for (int64_t j = 0; j < k; ++j) {
            const double p = double(w[r * k + j]) * x[t * k + j];
            ref += p;
            abs += std::fabs(p);
          }
          const double tol = 2.0 * double(k + 1) * eps * abs;
          const double eq = std::fabs(yq[t * m + r] - ref), ed = std::fabs(yd[t * m + r] - ref);
          if ((eq > tol || ed > tol) && ++bad <= 3) {
            ADD_FAILURE() << quant->kernel_name(n) << " n=" << n << " token " << t << " row " << r
                          << ": as stored off by " << eq << ", f32 by " << ed << ", bound " << tol;
          }
        }
      }
      EXPECT_EQ(bad, 0) << quant->kernel_name(n) << " n=" << n;
    }
  }
}

// The whole model: perplexity on 1,024 WikiText tokens (two windows of 512), as stored vs f32.
// The per-layer check above bounds each product; through 30 blocks (RMSNorm, softmax, SiLU) those
// differences are not bounded by a closed form, so the model-level check compares what a user
// reads. Rounding noise of ~1e-6 relative per logit moves a mean over 1,023 log-likelihoods by far
// less than 1e-5 relative, while a wrong nibble order, sign convention or dropped min moves it by
// orders of magnitude more (re-rounding only the head to int8:g64 already costs +0.10%).
TEST_F(LlamaGgufAsStoredTest, PerplexityMatchesTheF32Load) {
  SPARQ_REQUIRE_TEXT("wikitext-2-raw-test.txt");
  const std::string wiki = testing::ReadFileOrEmpty(testing::DataText("wikitext-2-raw-test.txt"));
  auto ids = f32_->tokenizer().Encode(wiki.substr(0, 20000));
  ASSERT_TRUE(ids.ok()) << ids.status().ToString();
  ASSERT_GE(ids->size(), 1024u);
  ids->resize(1024);
  ThreadPool pool(2);
  auto a = Perplexity(*f32_, *ids, 512, &pool);
  auto q = Perplexity(*stored_, *ids, 512, &pool);
  ASSERT_TRUE(a.ok() && q.ok());
  std::printf("perplexity on 1,024 WikiText tokens: f32 %.6f, as stored %.6f (%+.2e relative)\n",
              a->perplexity, q->perplexity, q->perplexity / a->perplexity - 1.0);
  // Measured +3.7e-7 relative (AVX3_DL); 1e-5 leaves room for other targets' summation orders.
  EXPECT_NEAR(q->perplexity / a->perplexity, 1.0, 1e-5);
}

// LoadOptions::embedding_table = false (what generate / eval / bench model load with): no f32
// table; the lookup dequantizes the Q8_0 head's row of each token. Every token's row against the
// f32 load's table (the GGUF reader's own dequantization) bit for bit; a prompt's logits equal
// the as-stored load's with its table bit for bit; 4 bytes x 49,152 x 576 fewer weight bytes.
TEST_F(LlamaGgufAsStoredTest, WithoutTheTableTheHeadsRowsAreTheLookupBitForBit) {
  auto lean = LlamaModel::Load(path_, testing::MachineConfig(),
                               {.gguf_values = GgufValues::kAsStored, .embedding_table = false});
  ASSERT_TRUE(lean.ok()) << lean.status().ToString();
  const LlamaConfig& c = lean->config();
  EXPECT_TRUE(lean->weights().token_embd.empty());
  std::vector<int32_t> all(static_cast<size_t>(c.n_vocab));
  for (int32_t t = 0; t < c.n_vocab; ++t) all[t] = t;
  std::vector<float> x(static_cast<size_t>(c.n_vocab * c.n_embd));
  Embed(lean->weights(), c.n_embd, all, x.data());
  const float* want = f32_->weights().token_embd.data_as<float>();
  for (int32_t t = 0; t < c.n_vocab; ++t) {
    ASSERT_EQ(std::memcmp(x.data() + int64_t{t} * c.n_embd, want + int64_t{t} * c.n_embd,
                          sizeof(float) * c.n_embd),
              0)
        << "token " << t;
  }
  const uint64_t table = uint64_t(c.n_vocab) * c.n_embd * 4;
  EXPECT_EQ(lean->weight_bytes(), stored_->weight_bytes() - table);
  // One embedding row read per token: the head's row (1 code byte + 4/32 scale bytes a value).
  EXPECT_EQ(lean->weight_bytes_per_token(), stored_->weight_bytes_per_token() -
                                                4 * uint64_t(c.n_embd) +
                                                lean->weights().output.weight_bytes() / c.n_vocab);
  auto ids = lean->tokenizer().Encode("The history of the city of London");
  ASSERT_TRUE(ids.ok());
  ThreadPool pool(2);
  std::vector<float> la(static_cast<size_t>(ids->size() * c.n_vocab)), lb(la.size());
  auto ca = lean->NewCache(64), cb = stored_->NewCache(64);
  ASSERT_TRUE(ca.ok() && cb.ok());
  ASSERT_TRUE(lean->Forward(*ids, &*ca, la.data(), true, &pool).ok());
  ASSERT_TRUE(stored_->Forward(*ids, &*cb, lb.data(), true, &pool).ok());
  EXPECT_EQ(std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)), 0);
}

// No table needs a head to look tokens up in: weights without one and with an f32 head are
// refused by FromParts, with a message that says so.
TEST_F(LlamaGgufAsStoredTest, NoTableAndAnF32HeadIsRefused) {
  auto lean = LlamaModel::Load(path_, testing::MachineConfig(),
                               {.gguf_values = GgufValues::kAsStored, .embedding_table = false});
  ASSERT_TRUE(lean.ok()) << lean.status().ToString();
  const LlamaConfig c = lean->config();
  LlamaWeights w = std::move(lean->mutable_weights());
  DenseMatrix dm;
  dm.rows = c.n_vocab;
  dm.cols = c.n_embd;
  dm.values = f32_->weights().token_embd.Clone();
  auto head = LinearWeight::FromMatrix(SparseMatrix(std::move(dm)), "output.weight",
                                       testing::MachineConfig());
  ASSERT_TRUE(head.ok()) << head.status().ToString();
  w.output = std::move(*head);
  auto f = GgufFile::Open(path_);
  ASSERT_TRUE(f.ok());
  auto tok = Tokenizer::FromGguf(*f);
  ASSERT_TRUE(tok.ok());
  auto m = LlamaModel::FromParts(c, std::move(w), std::move(*tok), "parts");
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("parts: no token embedding table, and the head is not a "
                                      "tied dense quantized"),
            std::string::npos)
      << m.status().ToString();
}

}  // namespace
}  // namespace sparq
