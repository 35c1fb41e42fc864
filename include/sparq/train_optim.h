// AdamW over the training weights of sparq/train_model.h, with fixed masks and gradient clipping
// by global norm (issue 28's training loop).
//
// Update of one trainable entry p with gradient g at step t = 1, 2, ... (PyTorch's AdamW):
//   g <- g * clip, clip = min(1, max_grad_norm / ||G||) (||G||: the global L2 norm of every
//        trainable entry's gradient; max_grad_norm 0: no clipping)
//   m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2
//   p <- p (1 - lr wd) - lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
// computed in double from the f32 state and rounded to f32 once. wd applies to the matrices (the
// linear slots and token_embd), never to the RMSNorm gains (decaying a gain pulls it to 0, not to
// its neutral 1).
// Trainable entries: every entry of the norms and of token_embd, every entry of a slot whose kept
// list is empty, and only the kept entries of the others (with norms_only: the norms' alone). A masked slot's moments are held for its
// kept entries only; its pruned entries are neither read nor written, so they stay exactly 0.
// Thread-safety: an AdamW is a single-threaded state object; Step may spread its work over a pool
// (blocks of entries fixed by the shapes, the norm's partial sums added in block order: the same
// bits for any pool size, and with none).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "sparq/status.h"
#include "sparq/thread_pool.h"
#include "sparq/train_model.h"

namespace sparq::train {

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  double max_grad_norm = 0.0;  // 0: no clipping
  // Train only the RMSNorm gains (issue 28's norm-only recovery: ~10k entries, a step costs no
  // dW): the matrices (token_embd and the linear slots) are frozen, hold no moments and are not
  // part of the gradient's norm.
  bool norms_only = false;
};

struct AdamWStep {
  double grad_norm = 0.0;  // ||G|| before clipping
  double clip = 1.0;       // the factor applied to G
};

// AdamW's state, for saving and resuming a run: each tensor of the walk (named as the model files
// name it, "blk.0.attn_q.weight") with its moments over its trainable entries, and the steps
// taken. Restoring it with ImportState continues bit for bit.
struct AdamWState {
  struct Moments {
    std::string name;
    std::vector<float> m, v;
  };
  std::vector<Moments> tensors;
  int64_t steps = 0;
};

class AdamW {
 public:
  // Checks the options (betas in [0, 1), eps > 0, wd >= 0, max_grad_norm >= 0), the weights and
  // masks (CheckModel), and that every pruned entry of w is exactly 0 (else kInvalidInput naming
  // the tensor and entry: a mask that does not match the weights).
  static Result<AdamW> Create(const LlamaConfig& c, const ModelWeights& w,
                              std::span<const BlockMasks> masks, const AdamWOptions& opt);

  // One update of *w (the weights Create saw) with grads (same shapes) at learning rate lr >= 0.
  // Errors: shapes that do not fit; a non-finite gradient norm (kInvalidInput, weights and state
  // unchanged: a NaN loss stops the run instead of poisoning it). pool: may be null.
  Status Step(ModelWeights* w, const ModelWeights& grads, double lr, AdamWStep* info = nullptr,
              ThreadPool* pool = nullptr);

  int64_t steps() const { return t_; }

  // A copy of the moments and the step count.
  AdamWState ExportState() const;
  // Replaces them. Errors (kInvalidInput, state unchanged): tensors not those of Create's walk
  // (names, order, trainable counts), non-finite moments, v < 0, steps < 0.
  Status ImportState(AdamWState s);

 private:
  // One tensor's state: moments over its trainable entries (kept.size() of them when masked).
  struct Slot {
    std::string name;
    std::vector<float> m, v;
  };
  LlamaConfig c_;
  std::vector<BlockMasks> masks_;
  AdamWOptions opt_;
  std::vector<Slot> state_;  // in the order of the tensors' walk (src/train/adamw.cc)
  int64_t t_ = 0;
};

}  // namespace sparq::train
