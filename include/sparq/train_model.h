// Forward and backward of a whole Llama decoder block and of the whole model with a tied head,
// composed from the ops of sparq/train_ops.h (f32, plain loops, long sums in double). The math is
// the runtime's (src/model/llama_forward.cc): the training forward's logits match
// LlamaModel::Forward's on the same weights (tests/train/model_grad_test.cc).
//
// Shapes follow LlamaConfig: d = n_embd, hd = head_dim(), kvd = kv_dim(), f = n_ff, n tokens.
// Every weight is f32, row-major, W of a linear slot shaped SlotShape(c, slot) = [m, k] (one
// output row per line, as the model stores it). Activations are [n, width] row-major.
//
// Gradients follow train_ops.h: activation gradients are written, parameter gradients are
// accumulated (+=) into a ModelWeights / BlockWeights of the same shapes (ZerosLike), so a caller
// sums micro-batches without a copy. A linear slot with a kept-index mask gets its dW only at the
// kept positions (LinearBackwardWeightMasked): the pruned positions of the gradient are never
// written, so a zeroed gradient stays exactly 0 there and pruned weights stay pruned.
//
// Errors: a weight, mask, token or teacher tensor that does not fit the config returns
// kInvalidInput naming the tensor ("blk.1.ffn_up.weight ..."), never a crash.
// Thread-safety: the functions keep no state; concurrent calls on distinct outputs are safe.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "sparq/model.h"
#include "sparq/status.h"

namespace sparq::train {

// f32 master weights of one block.
struct BlockWeights {
  std::vector<float> attn_norm;                      // [d]
  std::vector<float> ffn_norm;                       // [d]
  std::array<std::vector<float>, kNumSlots> linear;  // SlotShape(c, slot) each
  std::vector<float>& at(LinearSlot s) { return linear[static_cast<int>(s)]; }
  const std::vector<float>& at(LinearSlot s) const { return linear[static_cast<int>(s)]; }
};

// f32 master weights of the model. The output head is tied: logits = norm(h) token_embd^T.
struct ModelWeights {
  std::vector<float> token_embd;     // [n_vocab, d]
  std::vector<float> output_norm;    // [d]
  std::vector<BlockWeights> blocks;  // n_layer
};

// Kept weights of each linear slot of a block: flat indices r * k + c into W[m, k], each once,
// any order. An empty list means dense (every weight trains); to freeze a slot entirely, prune it
// in the caller (no list can say "none kept" apart from "dense").
struct BlockMasks {
  std::array<std::vector<int64_t>, kNumSlots> kept;
  std::vector<int64_t>& at(LinearSlot s) { return kept[static_cast<int>(s)]; }
  const std::vector<int64_t>& at(LinearSlot s) const { return kept[static_cast<int>(s)]; }
};

// Zero-filled tensors of w's shapes: the gradient accumulator.
BlockWeights ZerosLike(const BlockWeights& w);
ModelWeights ZerosLike(const ModelWeights& w);

// Checks c (LlamaConfig::Validate), every tensor's size and, when masks is not empty (n_layer
// entries), every kept list (indices in range, no repeats). Errors name the tensor.
Status CheckModel(const LlamaConfig& c, const ModelWeights& w,
                  std::span<const BlockMasks> masks = {});

// What BlockBackward reads, saved by BlockForward (all [n, width] row-major).
struct BlockActivations {
  int64_t n = 0;
  std::vector<float> x;         // block input [n, d]
  std::vector<float> attn_in;   // RMSNorm(x) [n, d]
  std::vector<float> q, k, v;   // q, k after RoPE [n, d], [n, kvd]; v [n, kvd]
  std::vector<float> att;       // attention output [n, d]
  std::vector<float> hidden;    // x + Wo att [n, d]
  std::vector<float> ffn_in;    // RMSNorm(hidden) [n, d]
  std::vector<float> gate, up;  // [n, f]
  std::vector<float> act;       // silu(gate) * up [n, f]
};

// y [n, d] = the block on x [n, d] at positions 0..n-1; *acts receives what the backward needs.
// (block_index names the tensors in errors: "blk.<i>.")
Status BlockForward(const LlamaConfig& c, const BlockWeights& w, int block_index,
                    std::span<const float> x, int64_t n, std::span<float> y,
                    BlockActivations* acts);
// dx [n, d] (written) and the weights' gradients (accumulated into *grads) from dy [n, d], the
// gradient of the block's output. masks: null for dense dW everywhere.
Status BlockBackward(const LlamaConfig& c, const BlockWeights& w, int block_index,
                     const BlockMasks* masks, const BlockActivations& acts,
                     std::span<const float> dy, std::span<float> dx, BlockWeights* grads);

// logits [n, n_vocab] of tokens [n] at positions 0..n-1 (ids in [0, n_vocab)).
Status ModelLogits(const LlamaConfig& c, const ModelWeights& w, std::span<const int32_t> tokens,
                   std::span<float> logits);

// The training loss on one sequence tokens [n + 1]: positions 0..n-1 read tokens[0..n), and the
// target of position t is tokens[t + 1].
//   loss = ce_weight * CrossEntropy + kl_weight * KL(teacher || student at tau)
// with both terms means over the n positions (train_ops.h); the KL term needs teacher_logits
// [n, n_vocab] and is skipped when kl_weight is 0.
struct LossSpec {
  double ce_weight = 1.0;
  double kl_weight = 0.0;
  double tau = 1.0;
  std::span<const float> teacher_logits;
};
struct LossResult {
  double loss = 0.0;  // the weighted sum
  double ce = 0.0;    // the unweighted terms (kl 0 when not computed)
  double kl = 0.0;
};
// *result = the loss; grads: null for the loss only, else every parameter's gradient accumulated
// (token_embd gets the lookup's scatter-add and the tied head's dW). masks: empty or n_layer
// entries (BlockMasks). Activation checkpointing: the forward keeps only each block's input
// (n_layer * n * d floats); the backward recomputes one block's activations at a time.
Status ModelLossAndGrad(const LlamaConfig& c, const ModelWeights& w,
                        std::span<const BlockMasks> masks, std::span<const int32_t> tokens,
                        const LossSpec& spec, LossResult* result, ModelWeights* grads);

}  // namespace sparq::train
