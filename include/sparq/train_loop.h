// The training loop of issue 28 over sparq/train_model.h and sparq/train_optim.h: the learning-rate
// schedule, the seeded data order, gradient accumulation, the train state file (save / resume)
// and the driver that ties them together (what `sparq finetune` calls).
//
// Determinism: a step reads its data from (seed, step, micro-batch) alone and the optimizer's
// state is saved bit for bit, so k steps, save, load, N - k steps gives the same weights (bitwise)
// as N steps uninterrupted.
// Thread-safety: the functions keep no state; a TrainState is a plain value.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "sparq/model.h"
#include "sparq/status.h"
#include "sparq/train_model.h"
#include "sparq/train_optim.h"

namespace sparq::train {

// Linear warmup, then cosine decay from peak to peak * min_ratio (PyTorch / Hugging Face's
// cosine-with-warmup, with warmup starting at peak / warmup_steps rather than 0: a step at lr 0
// moves AdamW's moments without moving the weights). For step s = 0, 1, ... (0-based):
//   s < W:  lr = peak * (s + 1) / W
//   else:   p = min(1, (s - W) / (T - W)),  lr = peak * (r + (1 - r) * (1 + cos(pi p)) / 2)
// with W = warmup_steps, T = total_steps, r = min_ratio; steps at or past T get the floor.
struct LrSchedule {
  double peak = 1e-3;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  double min_ratio = 0.0;
  // peak finite >= 0, 0 <= warmup_steps < total_steps, min_ratio in [0, 1].
  Status Validate() const;
  double lr(int64_t step) const;
};

// The first token of the window [start, start + seq_len + 1) that micro-batch `micro` of step
// `step` trains on (seq_len inputs and their next tokens; ModelLossAndGrad's tokens). A pure
// function of its arguments: a resumed run reads the same windows without replaying the data.
// Uniform over [0, stream_len - seq_len - 1] (a hash of (seed, step, micro); windows are drawn
// with replacement). Precondition: stream_len > seq_len >= 1.
int64_t WindowStart(uint64_t seed, int64_t step, int64_t micro, int64_t stream_len,
                    int64_t seq_len);

// Gradient accumulation: *grads (shaped like w) = the mean of the gradients of the sequences
// (each n_i + 1 tokens, the loss of `spec` as in ModelLossAndGrad), *loss = the mean of their
// losses. With equal lengths this is the gradient of the mean loss over all positions, i.e. one
// step on all the sequences at once. When spec.kl_weight > 0, teacher_logits holds one
// [n_i, n_vocab] tensor per sequence (spec.teacher_logits is ignored); when spec.hidden_weight > 0,
// teacher_hidden one [n_layer, n_i, d] (spec.teacher_hidden is ignored). grads is overwritten
// (zeroed first); masked pruned entries stay exactly 0. The per-sequence gradients are summed
// into one f32 buffer, then scaled by 1 / count. exec: the path and pool (sparq/train_model.h).
Status AccumulatedLossAndGrad(const LlamaConfig& c, const ModelWeights& w,
                              std::span<const BlockMasks> masks,
                              std::span<const std::span<const int32_t>> sequences, double* loss,
                              ModelWeights* grads, const LossSpec& spec = {},
                              std::span<const std::span<const float>> teacher_logits = {},
                              std::span<const std::span<const float>> teacher_hidden = {},
                              const TrainExec& exec = {});

// What a run needs to continue, saved with the state.
struct TrainOptions {
  LrSchedule schedule;  // total_steps is the run's length
  AdamWOptions adamw;
  int64_t seq_len = 64;          // tokens per micro-batch (the window is seq_len + 1)
  int64_t accum = 1;             // micro-batches per step
  uint64_t seed = 0;             // the data order's
  int64_t checkpoint_every = 0;  // steps between saves (0: only at the end, if a path is given)
  // The loss (LossSpec): ce_weight * CE + kl_weight * KL(teacher || student at tau)
  // + hidden_weight * SquareHead; a KL term needs TrainLoopOptions::teacher, a SquareHead term
  // TrainLoopOptions::teacher_hidden.
  double ce_weight = 1.0;
  double kl_weight = 0.0;
  double tau = 1.0;
  double hidden_weight = 0.0;
  // seq_len in [1, n_ctx_train], accum >= 1, checkpoint_every >= 0, loss weights finite >= 0
  // and not all 0, tau finite > 0, the schedule's checks (AdamW's: AdamW::Create). Errors are
  // kInvalidInput naming the field.
  Status Validate(const LlamaConfig& c) const;
};

// Everything a resumed run reads: weights, masks, the optimizer's moments and step, the options.
struct TrainState {
  LlamaConfig config;
  ModelWeights weights;
  std::vector<BlockMasks> masks;  // empty or n_layer entries
  AdamWState optim;               // optim.steps: the completed steps (the schedule's position)
  TrainOptions options;
  // The token stream the run reads (set by TrainLoop's first call): a resume on other data would
  // silently train on other windows, so TrainLoop refuses it. 0 tokens: not yet set.
  int64_t data_tokens = 0;
  uint64_t data_hash = 0;  // DataHash(tokens)
  int64_t step() const { return optim.steps; }
};

// FNV-1a over the ids' little-endian bytes: the stream's fingerprint in TrainState.
uint64_t DataHash(std::span<const int32_t> tokens);

// A fresh state at step 0: checks the options, the weights and masks (AdamW::Create) and sets
// zero moments.
Result<TrainState> NewTrainState(const LlamaConfig& c, ModelWeights w,
                                 std::vector<BlockMasks> masks, const TrainOptions& opt);

// The state file: safetensors (sparq/safetensors.h) holding the weights under their model names
// ("blk.0.attn_q.weight", f32), the kept lists ("mask.blk.0.attn_q.weight", i64), AdamW's moments
// ("adamw.m.<tensor>", "adamw.v.<tensor>", f32 over the trainable entries), and in __metadata__
// "sparq.train_state" = the format version, "sparq.model" = LlamaConfig::ToJson(), and
// "sparq.train" = the options and step as JSON. Written atomically (temporary file + rename): a
// crash mid-write leaves the previous file intact.
inline constexpr int kTrainStateVersion = 1;
Status SaveTrainState(const std::string& path, const TrainState& state);
// Reads and validates a state file: the version, the config, every tensor's presence, dtype and
// shape against the config, finite weights and moments, v >= 0, masks in range and matching the
// weights (pruned entries 0), the options. Errors name the file and the field or tensor.
Result<TrainState> LoadTrainState(const std::string& path);
// The same on bytes in memory (fuzzers, tests); `name` stands for the file in errors.
Result<TrainState> LoadTrainStateFromMemory(const void* data, uint64_t size,
                                            const std::string& name = "<memory>");

struct TrainProgress {
  int64_t step = 0;  // the step just completed (1-based: 1 after the first update)
  int64_t total_steps = 0;
  double loss = 0.0;          // the mean loss of the step's micro-batches, before the update
  double lr = 0.0;            // the rate the update used
  double grad_norm = 0.0;     // before clipping
  double tokens_per_s = 0.0;  // trained tokens (accum * seq_len) over the step's wall time
};

struct TrainLoopOptions {
  int64_t stop_at = -1;         // stop after this step (< 0: the schedule's total_steps)
  std::string checkpoint_path;  // empty: no saves
  std::function<void(const TrainProgress&)> progress;  // may be empty
  // Needed when kl_weight > 0: writes the teacher's logits [n, n_vocab] of n input tokens (a
  // window's first seq_len). Must be deterministic for a resumed run to match (a fixed model).
  std::function<Status(std::span<const int32_t> inputs, std::span<float> logits)> teacher;
  // Needed when hidden_weight > 0, and then called instead of `teacher`: writes the teacher's
  // block outputs hidden [n_layer, n, d] (ModelLogitsAndHidden) and, when kl_weight > 0, its
  // logits [n, n_vocab] (else logits is empty). Deterministic, as `teacher`.
  std::function<Status(std::span<const int32_t> inputs, std::span<float> logits,
                       std::span<float> hidden)>
      teacher_hidden;
  // The path the forward / backward runs on (sparq/train_model.h; default: the reference), its
  // pool and timers (the teacher's and the optimizer's time are added here too).
  TrainExec exec;
};

// Runs *state from state->step() to min(stop_at, total_steps): each step averages the gradients
// of options.accum windows of `tokens` (WindowStart), clips and updates with AdamW at the
// schedule's rate. Saves to checkpoint_path every checkpoint_every steps and at the end. On an
// error (a non-finite gradient, a failed save) *state holds the last completed step.
// Errors: tokens shorter than seq_len + 1, ids outside the vocabulary, a state that fails its
// checks, a stream other than the one the state was trained on (data_tokens / data_hash).
Status TrainLoop(TrainState* state, std::span<const int32_t> tokens, const TrainLoopOptions& opt);

}  // namespace sparq::train
