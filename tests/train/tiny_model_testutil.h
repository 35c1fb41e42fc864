// A tiny random Llama for the training tests: its config, f32 training weights, 2:4 masks, and
// the same weights assembled as an inference LlamaModel (dense f32, or 2:4 N:M and column-permuted
// slots), so the training code can be checked against the runtime.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "sparq/format.h"
#include "sparq/linear.h"
#include "sparq/model.h"
#include "sparq/tensor.h"
#include "sparq/tokenizer.h"
#include "sparq/train_model.h"
#include "tests/train/train_testutil.h"

namespace sparq::train::testing {

// d 16, 2 query heads on 1 KV head (GQA) of hd 8, ffn 24, vocab 11, 2 layers, rope_dim 6 < hd.
inline LlamaConfig TinyConfig() {
  LlamaConfig c;
  c.n_vocab = 11;
  c.n_embd = 16;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_head_kv = 1;
  c.n_ff = 24;
  c.n_ctx_train = 64;
  c.rope_dim = 6;
  c.rope_theta = 10000.0;
  c.rms_eps = 1e-5;
  c.tied_output = true;
  return c;
}

// Weights ~N(0, 1/sqrt(k)) keep every activation O(1); gains near 1 as trained gains are.
inline ModelWeights TinyWeights(const LlamaConfig& c, std::mt19937_64* gen) {
  auto gains = [&]() {
    auto g = RandomNormal(gen, c.n_embd, 0.2f);
    for (float& x : g) x += 1.0f;
    return g;
  };
  ModelWeights w;
  w.token_embd = RandomNormal(gen, c.n_vocab * c.n_embd, 0.4f);
  w.output_norm = gains();
  for (int64_t l = 0; l < c.n_layer; ++l) {
    BlockWeights b;
    b.attn_norm = gains();
    b.ffn_norm = gains();
    for (int s = 0; s < kNumSlots; ++s) {
      const auto [m, k] = SlotShape(c, static_cast<LinearSlot>(s));
      b.linear[s] = RandomNormal(gen, m * k, static_cast<float>(1.0 / std::sqrt(double(k))));
    }
    w.blocks.push_back(std::move(b));
  }
  return w;
}

// Magnitude 2:4 along k of w [m, k] in place (k % 4 == 0): zeroes the two smallest of each
// group of 4 and returns the kept flat indices in ascending order.
inline std::vector<int64_t> Prune24(std::vector<float>* w, int64_t m, int64_t k) {
  std::vector<int64_t> kept;
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t g = 0; g < k; g += 4) {
      int64_t idx[4] = {0, 1, 2, 3};
      const float* p = w->data() + r * k + g;
      std::sort(idx, idx + 4,
                [&](int64_t a, int64_t b) { return std::abs(p[a]) > std::abs(p[b]); });
      std::sort(idx, idx + 2);
      for (int64_t j = 0; j < 4; ++j) {
        if (j == idx[0] || j == idx[1]) {
          kept.push_back(r * k + g + j);
        } else {
          (*w)[r * k + g + j] = 0.0f;
        }
      }
    }
  }
  return kept;
}

// How one slot is stored in the assembled LlamaModel.
struct SlotStorage {
  bool nm24 = false;          // 2:4 N:M f32 (the weights must already be 2:4 along k)
  std::vector<int32_t> perm;  // column permutation (empty: none); 2:4 then holds for W[:, perm]
};

// The runtime model of w: slot s of block l stored as storage[l][s] (missing: dense f32).
inline LlamaModel TinyLlamaModel(
    const LlamaConfig& c, const ModelWeights& w,
    const std::vector<std::array<SlotStorage, kNumSlots>>& storage = {}) {
  static const KernelConfig cfg = KernelConfig::FromMachine().value();  // passed, never global
  auto linear = [](SparseMatrix sm, const std::string& name) {
    auto lw = LinearWeight::FromMatrix(std::move(sm), name, cfg);
    EXPECT_TRUE(lw.ok()) << lw.status().ToString();
    return std::move(*lw);
  };
  auto dense = [&](const std::vector<float>& v, int64_t rows, int64_t cols, const std::string& n) {
    auto dm = DenseMatrix::FromDense(v, rows, cols);
    EXPECT_TRUE(dm.ok());
    return linear(SparseMatrix(std::move(*dm)), n);
  };
  LlamaWeights lw;
  lw.token_embd = Tensor::Alloc(DType::kF32, {c.n_vocab, c.n_embd});
  std::copy(w.token_embd.begin(), w.token_embd.end(), lw.token_embd.mutable_data_as<float>());
  lw.output_norm = w.output_norm;
  lw.output = dense(w.token_embd, c.n_vocab, c.n_embd, "output.weight");
  for (size_t l = 0; l < w.blocks.size(); ++l) {
    const BlockWeights& b = w.blocks[l];
    LlamaBlock lb;
    lb.attn_norm = b.attn_norm;
    lb.ffn_norm = b.ffn_norm;
    for (int s = 0; s < kNumSlots; ++s) {
      const auto [m, k] = SlotShape(c, static_cast<LinearSlot>(s));
      const std::string name = "blk." + std::to_string(l) + "." +
                               std::string(SlotName(static_cast<LinearSlot>(s))) + ".weight";
      const SlotStorage st = l < storage.size() ? storage[l][s] : SlotStorage{};
      std::vector<float> wp = b.linear[s];
      if (!st.perm.empty()) {  // W_p[:, j] = W[:, perm[j]]: the runtime gathers X[:, perm]
        for (int64_t r = 0; r < m; ++r)
          for (int64_t j = 0; j < k; ++j) wp[r * k + j] = b.linear[s][r * k + st.perm[j]];
        lb.perm[s] = st.perm;
      }
      if (st.nm24) {
        auto nm = NmMatrix::FromDense(wp, m, k, 2, 4);
        EXPECT_TRUE(nm.ok()) << name << ": " << nm.status().ToString();
        lb.linear[s] = linear(SparseMatrix(std::move(*nm)), name);
      } else {
        lb.linear[s] = dense(wp, m, k, name);
      }
    }
    lw.blocks.push_back(std::move(lb));
  }
  // n_vocab one-letter tokens (FromParts reads the tokenizer's vocab_size).
  TokenizerData td;
  for (int64_t t = 0; t < c.n_vocab; ++t) td.tokens.push_back(std::string(1, char('a' + t)));
  auto tok = Tokenizer::FromData(std::move(td), "tiny tokenizer");
  EXPECT_TRUE(tok.ok()) << tok.status().ToString();
  auto model = LlamaModel::FromParts(c, std::move(lw), std::move(*tok), "tiny");
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  return std::move(*model);
}

}  // namespace sparq::train::testing
