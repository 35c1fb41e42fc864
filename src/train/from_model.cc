// A loaded LlamaModel as f32 training weights and fixed masks (issue 28, `sparq finetune`).
// Route: the runtime keeps only each LinearWeight's packed layout, not the stored matrix, so the
// weights are read back through LinearWeight::Forward on one-hot inputs (the public API; no change
// to src/cpu or src/model). Re-reading the .sparq checkpoint would also give the stored structure,
// but needs the file and misses models built in memory or loaded from GGUF / safetensors.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "sparq/train_model.h"

namespace sparq::train {
namespace {

// Tokens per probe: bounds the one-hot input [kProbeRows, k] and output [kProbeRows, m] buffers
// (SmolLM2's ffn_down: 256 x 1536 floats each, 1.5 MiB).
constexpr int64_t kProbeRows = 256;

// W_p [m, k] of lw: row t of the product of the one-hot X (X[t, j0 + t] = 1) is column j0 + t.
// Exact: each output is one stored value times 1.0f plus products with +0.0f.
std::vector<float> ProbeWeight(const LinearWeight& lw, ThreadPool* pool) {
  const int64_t m = lw.rows(), k = lw.cols();
  std::vector<float> w(m * k);
  if (const float* d = lw.dense_f32(); d != nullptr) return std::vector<float>(d, d + m * k);
  std::vector<float> x, y;
  for (int64_t j0 = 0; j0 < k; j0 += kProbeRows) {
    const int64_t nb = std::min(kProbeRows, k - j0);
    x.assign(nb * k, 0.0f);
    y.assign(nb * m, 0.0f);
    for (int64_t t = 0; t < nb; ++t) x[t * k + j0 + t] = 1.0f;
    lw.Forward(x.data(), nb, y.data(), pool);
    for (int64_t t = 0; t < nb; ++t)
      for (int64_t r = 0; r < m; ++r) w[r * k + j0 + t] = y[t * m + r];
  }
  return w;
}

}  // namespace

Result<TrainableModel> FromLlamaModel(const LlamaModel& model, ThreadPool* pool) {
  const LlamaConfig& c = model.config();
  const LlamaWeights& lw = model.weights();
  if (!c.tied_output) {
    return Unsupported(model.source() +
                       ": the output head is untied; training supports a tied head only");
  }
  if (lw.token_embd.dtype() != DType::kF32 ||
      lw.token_embd.numel() != uint64_t(c.n_vocab * c.n_embd)) {
    return InvalidInput(model.source() + ": token_embd.weight must be f32 [n_vocab, n_embd], is " +
                        lw.token_embd.ShapeString());
  }
  TrainableModel tm;
  const float* e = lw.token_embd.data_as<float>();
  tm.weights.token_embd.assign(e, e + c.n_vocab * c.n_embd);
  tm.weights.output_norm = lw.output_norm;
  tm.masks.resize(c.n_layer);
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const LlamaBlock& lb = lw.blocks[l];
    BlockWeights b;
    b.attn_norm = lb.attn_norm;
    b.ffn_norm = lb.ffn_norm;
    for (int s = 0; s < kNumSlots; ++s) {
      const auto [m, k] = SlotShape(c, static_cast<LinearSlot>(s));
      const LinearWeight& w = lb.linear[s];
      if (w.rows() != m || w.cols() != k) {
        return InvalidInput(model.source() + ": blk." + std::to_string(l) + "." +
                            std::string(SlotName(static_cast<LinearSlot>(s))) +
                            ".weight does not have its configured shape");
      }
      std::vector<float> wp = ProbeWeight(w, pool);
      const std::vector<int32_t>& perm = lb.perm[s];
      std::vector<float>& dst = b.linear[s];
      if (perm.empty()) {
        dst = std::move(wp);
      } else {  // Y = W_p X[:, perm]: W_p's column j is W's column perm[j]
        dst.assign(m * k, 0.0f);
        for (int64_t r = 0; r < m; ++r)
          for (int64_t j = 0; j < k; ++j) dst[r * k + perm[j]] = wp[r * k + j];
      }
      // Dense storage trains every weight; any other format keeps its nonzero positions.
      if (w.dense_f32() != nullptr || w.format().rfind("dense", 0) == 0) continue;
      std::vector<int64_t>& kept = tm.masks[l].kept[s];
      for (int64_t i = 0; i < m * k; ++i)
        if (dst[i] != 0.0f) kept.push_back(i);
      // An all-zero sparse slot would read as dense (BlockMasks has no "none kept"): keep one
      // position, whose weight is 0 and so stays within any pattern's budget.
      if (kept.empty()) kept.push_back(0);
    }
    tm.weights.blocks.push_back(std::move(b));
  }
  return tm;
}

}  // namespace sparq::train
