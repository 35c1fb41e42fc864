// Internals of the Llama runtime shared by loading, forward, calibration and checkpoint code.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "sparq/model.h"

namespace sparq {

struct LlamaModel::Impl {
  LlamaConfig config;
  LlamaWeights weights;
  Tokenizer tokenizer;
  std::string source;
  bool fuse_mlp = true;  // see LlamaModel::set_fuse_mlp
};

// Per-call buffers of one block over n tokens. After RunBlock they hold that block's linear-layer
// inputs, which calibration reads: attn_in (q/k/v input), att (attn_output input), ffn_in
// (gate/up input), act (ffn_down input; only with keep_inputs, else a fused MLP may skip it).
struct BlockScratch {
  std::vector<float> attn_in, q, k, v, att, hidden, ffn_in, gate, up, act, scores, gathered;
  std::vector<float> attn_part;  // decode attention: per (task, head, token) partial outputs
  // An f16 cache's filled rows widened to f32 for the prompt path: [2][n_head_kv][T][hd].
  std::vector<float> kv32;
  std::vector<float>
      gathered_up;  // up's gathered input if its permutation is not gate's (fused MLP)
  std::vector<int32_t> down_row;  // the inverse of ffn_down's column permutation (fused MLP)
  // RoPE angles of the positions [rope_pos0, rope_pos0 + rope_n) (RopeTable), kept across layers.
  std::vector<float> rope_cos, rope_sin;
  int64_t rope_n = -1, rope_pos0 = -1, rope_dim = -1;
  double rope_theta = 0.0;
  // Keep every linear-layer input (calibration reads act): the fused SwiGLU MLP never writes act.
  bool keep_inputs = false;
  // Run the MLP as one fused SwiGLU call where the weights allow (same bits either way).
  bool fuse_mlp = true;
  void Reserve(const LlamaConfig& c, int64_t n, int64_t total_len);
};

// One layer's rows of a KV cache, [n_head_kv][cap][head_dim] each: f32 (k, v) or f16 bits (k16,
// v16; k and v null then).
struct KvLayer {
  float* k = nullptr;
  float* v = nullptr;
  uint16_t* k16 = nullptr;
  uint16_t* v16 = nullptr;
  int64_t cap = 0;
  bool f16() const { return k16 != nullptr; }
};
KvLayer CacheLayer(KvCache* cache, int64_t layer);

// One transformer block over x [n, n_embd] (in place) at positions pos0 .. pos0+n-1. kv is this
// layer's cache (cap >= pos0 + n: each KV head's rows contiguous, so that decode attention
// streams them); rows < pos0 must hold the earlier keys/values. The float overload: an f32
// cache kc / vc.
void RunBlock(const LlamaConfig& c, const LlamaBlock& b, float* x, int64_t n, int64_t pos0,
              const KvLayer& kv, BlockScratch* s, ThreadPool* pool);
void RunBlock(const LlamaConfig& c, const LlamaBlock& b, float* x, int64_t n, int64_t pos0,
              float* kc, float* vc, int64_t cap, BlockScratch* s, ThreadPool* pool);

// One transformer block over x [n, n_embd] (in place) where row r is the next token of its own
// sequence, at position pos[r], with this layer's cache kv[r] (as RunBlock's; rows < pos[r] hold
// that sequence's earlier keys/values): the linear layers run over all n rows at once, RoPE and
// attention per sequence (as RunBlock with n = 1).
void RunBlockBatch(const LlamaConfig& c, const LlamaBlock& b, float* x,
                   std::span<const int64_t> pos, std::span<const KvLayer> kv, BlockScratch* s,
                   ThreadPool* pool);

// A dense f32 [m, k] tensor as a LinearWeight named `name` (for error messages).
Result<LinearWeight> DenseLinearFromF32(Tensor values, const std::string& name,
                                        const KernelConfig& cfg);

// f16 holds magnitudes up to 65504: a weight beyond it would be stored as inf. An error naming
// `name` and the value where dt is f16 and a weight does not fit; ok otherwise (bf16 keeps f32's
// range). Pruning's and SaveLlamaCheckpoint's check.
Status FitsValueType(std::span<const float> w, DType dt, const std::string& name);

// out[i] = x[i] / sqrt(mean(x[i]^2) + eps) * w, for n rows of d.
void RmsNorm(const float* x, int64_t n, int64_t d, const float* w, double eps, float* out,
             ThreadPool* pool = nullptr);

// Embedding rows of `tokens` into x [n, n_embd] (ids already checked).
void Embed(const LlamaWeights& w, int64_t n_embd, std::span<const int32_t> tokens, float* x);
// logits [n, n_vocab] = the head on xn [n, n_embd], the rows stored apart (output_row_ids)
// overwriting theirs.
void HeadForward(const LlamaWeights& w, const float* xn, int64_t n, float* logits, ThreadPool* pool);

}  // namespace sparq
