// Forward and backward of a whole Llama decoder block and of the whole model with a tied head,
// composed from the ops of sparq/train_ops.h. The math is the runtime's
// (src/model/llama_forward.cc): the training forward's logits match LlamaModel::Forward's on the
// same weights (tests/train/model_grad_test.cc). Two paths compute it (TrainExec below): the
// reference (plain loops, one thread, long sums in double) and the fast path (f32 BLAS tiles and
// per-row / per-head work on a ThreadPool) that training runs on.
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
// Thread-safety: the functions keep no state; concurrent calls on distinct outputs are safe as
// long as they do not share a pool (TrainExec::pool: ThreadPool is not re-entrant).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "sparq/model.h"
#include "sparq/status.h"
#include "sparq/thread_pool.h"

namespace sparq::train {

// Where a training step's time goes (seconds, accumulated over calls): filled when
// TrainExec::timers is set. teacher and optimizer are TrainLoop's; the rest ModelLossAndGrad's.
struct TrainTimers {
  double teacher = 0.0;        // the teacher's logits (and block outputs, with SquareHead)
  double forward = 0.0;        // embedding and blocks, forward (keeping each block's input)
  double head = 0.0;           // final RMSNorm, the tied head's logits and the loss
  double head_backward = 0.0;  // the head's dE and dx, the final RMSNorm's backward
  double recompute = 0.0;      // each block's forward again, in the backward (checkpointing)
  double backward = 0.0;       // the blocks' backward and the embedding's scatter-add
  double optimizer = 0.0;      // zeroing / scaling the gradients and the AdamW update
  double total() const {
    return teacher + forward + head + head_backward + recompute + backward + optimizer;
  }
};

// How the training math runs. fast = false: the reference ops of sparq/train_ops.h (plain loops,
// one thread, long sums in double; pool unused). fast = true: the f32 fast path
// (src/train/fast_ops.h): the linear products as fixed grids of single-threaded OpenBLAS tiles
// (src/core/blas_tiles.h), attention by (head, block of rows) and the norms, SwiGLU, RoPE and the
// losses by blocks of rows, all on `pool`. The split depends on the shapes alone, so the fast
// path gives the same bits for any pool size (and null: one thread); it agrees with the reference
// to f32 rounding (tests/train/fast_path_test.cc). The pool must not be running a ParallelFor
// of the caller's (ThreadPool is not re-entrant).
struct BlockActivations;

struct TrainExec {
  bool fast = false;
  ThreadPool* pool = nullptr;
  TrainTimers* timers = nullptr;  // null: not timed
  // false: leave the matrices' gradients (token_embd, the linear slots) untouched, computing the
  // norms' alone: a norm-only run (AdamWOptions::norms_only) needs no dW, ~1/3 of the backward.
  bool weight_grads = true;
  // Not null: ModelLossAndGrad keeps every block's activations from the forward here (n_layer
  // BlockActivations: ~17 MB per block at n = 512 on SmolLM2, 0.5 GB in all), reused from call
  // to call (no allocation per step), instead of keeping only the blocks' inputs and recomputing
  // each block's in the backward (~15% of a fine-tuning step). The same bits either way: the
  // recompute is the forward again.
  std::vector<BlockActivations>* activations = nullptr;
};

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
                    std::span<const float> x, int64_t n, std::span<float> y, BlockActivations* acts,
                    const TrainExec& exec = {});
// dx [n, d] (written) and the weights' gradients (accumulated into *grads) from dy [n, d], the
// gradient of the block's output. masks: null for dense dW everywhere.
Status BlockBackward(const LlamaConfig& c, const BlockWeights& w, int block_index,
                     const BlockMasks* masks, const BlockActivations& acts,
                     std::span<const float> dy, std::span<float> dx, BlockWeights* grads,
                     const TrainExec& exec = {});

// logits [n, n_vocab] of tokens [n] at positions 0..n-1 (ids in [0, n_vocab)).
Status ModelLogits(const LlamaConfig& c, const ModelWeights& w, std::span<const int32_t> tokens,
                   std::span<float> logits, const TrainExec& exec = {});
// The same forward, also writing every block's output: hidden [n_layer, n, d] block-major
// (hidden[l] = the output of block l; the last one is the final RMSNorm's input). logits may be
// empty: the head is skipped (a SquareHead-only teacher needs no logits, and the tied head is
// the forward's biggest product). The teacher side of LossSpec::teacher_hidden.
Status ModelLogitsAndHidden(const LlamaConfig& c, const ModelWeights& w,
                            std::span<const int32_t> tokens, std::span<float> logits,
                            std::span<float> hidden, const TrainExec& exec = {});

// The training loss on one sequence tokens [n + 1]: positions 0..n-1 read tokens[0..n), and the
// target of position t is tokens[t + 1].
//   loss = ce_weight * CrossEntropy + kl_weight * KL(teacher || student at tau)
//        + hidden_weight * SquareHead
// with CE and KL means over the n positions (train_ops.h); the KL term needs teacher_logits
// [n, n_vocab] and is skipped when kl_weight is 0. SquareHead (Kurtic et al. 2023,
// arXiv:2310.06927) distills every block's output h_l [n, d] towards the teacher's t_l:
//   SquareHead = sum over blocks l of NormalizedMse(h_l, t_l)
//              = sum_l mean_rows ||h_l - t_l||^2 / mean_rows ||t_l||^2
// (the paper's per-layer MSE normalized by the teacher's, summed over the layers as the authors'
// code does: IST-DASLab/SparseFinetuning, scripts/train/train_sparse.py). One difference: their
// last term reads Hugging Face's last hidden state, which is after the final norm; here every
// term is a block's output (the last one before the final RMSNorm), so all terms are alike and
// the KL term covers what follows the norm. It needs teacher_hidden [n_layer, n, d] block-major
// (ModelLogitsAndHidden's hidden) and is skipped when hidden_weight is 0. A teacher block output
// that is all zeros is an error (their code adds a bf16 eps to the normalizer instead).
struct LossSpec {
  double ce_weight = 1.0;
  double kl_weight = 0.0;
  double tau = 1.0;
  std::span<const float> teacher_logits;
  double hidden_weight = 0.0;
  std::span<const float> teacher_hidden = {};
};
struct LossResult {
  double loss = 0.0;  // the weighted sum
  double ce = 0.0;    // the unweighted terms (kl, hidden 0 when not computed)
  double kl = 0.0;
  double hidden = 0.0;  // SquareHead: the sum over the blocks
};
// *result = the loss; grads: null for the loss only, else every parameter's gradient accumulated
// (token_embd gets the lookup's scatter-add and the tied head's dW). masks: empty or n_layer
// entries (BlockMasks). Activation checkpointing: the forward keeps only each block's input
// (n_layer * n * d floats); the backward recomputes one block's activations at a time (unless
// exec.activations: then every block's are kept from the forward, the same bits).
Status ModelLossAndGrad(const LlamaConfig& c, const ModelWeights& w,
                        std::span<const BlockMasks> masks, std::span<const int32_t> tokens,
                        const LossSpec& spec, LossResult* result, ModelWeights* grads,
                        const TrainExec& exec = {});

}  // namespace sparq::train

namespace sparq::train {

// A loaded model as training weights: f32 masters of every tensor, and for each linear slot
// stored sparse (any format but dense) the kept positions, so that pruned weights stay pruned.
struct TrainableModel {
  ModelWeights weights;
  std::vector<BlockMasks> masks;  // n_layer entries; a slot's list is empty when stored dense
};
// Reads the weights through the runtime's own products (LinearWeight::Forward on one-hot inputs,
// exact: each output is one stored value times 1 plus zeros), so every stored format and value
// type (bf16, f16, quantized codes) comes out as the f32 numbers the runtime multiplies with.
// Channel permutations (LlamaBlock::perm) are undone: W[r, perm[j]] = W_p[r, j]. A sparse slot's
// kept list is its nonzero values: a kept weight stored as exactly 0 (a quantization code of 0)
// is treated as pruned, which keeps the pattern (Finetune re-reads quantized slots from the
// checkpoint: StudentQuantizedMasters, sparq/finetune.h). Dense f32 slots are copied.
// Errors: an untied output head (the training model's head is tied) is kUnsupported.
Result<TrainableModel> FromLlamaModel(const LlamaModel& model, ThreadPool* pool);

}  // namespace sparq::train
