// A multilayer perceptron trained from scratch, dense or with 2:4 sparse layers (issue 28, item 6:
// `sparq train --task fashion-mnist`).
//
// Model: sizes {d0, d1, ..., dL}; layer l maps d_l -> d_{l+1} as Y = X W_l^T + b_l, with W_l
// [d_{l+1}, d_l] row-major (one row per output, as sparq stores every weight) and ReLU between
// layers; the last layer's output is the logits of a softmax cross-entropy (mean over the batch).
// Batches are row-major X[n, d0]. Every product is an f32 OpenBLAS sgemm on the fixed tile grid of
// src/core/blas_tiles.h, so a run's bits do not depend on the thread count, and the same run twice
// is bitwise identical.
//
// 2:4 sparse training (SR-STE, Zhou et al. 2021, "Learning N:M fine-grained structured sparse
// neural networks from scratch"): every layer but the last keeps dense f32 master weights W and a
// mask M holding the 2 largest |w| of each group of 4 consecutive inputs of a row (ties: the lower
// index), recomputed from W every `mask_every` steps. The forward uses W_eff = W * M; the backward
// is the straight-through estimator (dW is the dense gradient of the masked product, written for
// every entry, pruned ones included) plus SR-STE's decay on the pruned entries,
// dW += lambda (1 - M) W. The last layer (1024 -> 10: 0.5% of the weights) stays dense. The masked
// products run as dense sgemm on W_eff: no step speedup yet; the 2:4 rows of the kernel table
// (src/cpu, SpmmNm24*) are the fast path to come, for the forward and dX (dW stays dense under STE).
//
// Optimizer: SGD with momentum (PyTorch's: v <- mu v + g; w <- w - lr v), cosine learning rate
// from lr to 0 over the run. SGD rather than AdamW because SR-STE's decay is defined against SGD
// (the paper trains with SGD + momentum): under Adam the term lambda (1 - M) W is divided by
// sqrt(v) entry by entry and no longer acts as the decay the paper tunes.
// Thread-safety: an Mlp is a single-threaded object; it uses the pool it is handed per call.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "sparq/status.h"
#include "sparq/thread_pool.h"

namespace sparq::train {

enum class MlpPattern { kDense, k2of4 };

struct MlpOptions {
  std::vector<int64_t> sizes = {784, 1024, 1024, 10};
  MlpPattern pattern = MlpPattern::kDense;
  int64_t mask_every = 1;  // steps between mask recomputations (2:4)
  // SR-STE's lambda_W: the paper's value is 2e-4 (Zhou et al. 2021, section 4 / appendix: the
  // decay on the pruned weights of its ImageNet runs).
  double srste = 2e-4;
  double lr = 0.05;
  double momentum = 0.9;
  uint64_t seed = 0;
};

class Mlp {
 public:
  // Checks the options (at least 2 sizes, each >= 1; mask_every >= 1; srste >= 0; lr >= 0;
  // momentum in [0, 1); with 2:4, every sparse layer's input size a multiple of 4) and draws the
  // weights from the seed (He normal, std sqrt(2 / fan_in); biases 0).
  static Result<Mlp> Create(const MlpOptions& opt);

  const MlpOptions& options() const { return opt_; }
  int num_layers() const { return static_cast<int>(w_.size()); }
  bool sparse(int layer) const;  // whether layer runs 2:4
  // Master weights [out, in], biases [out], masks [out, in] (1 kept, 0 pruned; all 1 when dense),
  // and the effective weights W * M the forward uses.
  std::vector<float>& weight(int l) {
    masks_current_ = false;  // the caller may change the weights the masks were made from
    return w_[l];
  }
  const std::vector<float>& weight(int l) const { return w_[l]; }
  std::vector<float>& bias(int l) { return b_[l]; }
  const std::vector<uint8_t>& mask(int l) const { return mask_[l]; }
  const std::vector<float>& effective_weight(int l) const { return sparse(l) ? weff_[l] : w_[l]; }

  // Recomputes the masks of the sparse layers from the master weights, and W_eff (pool: may be
  // null).
  void UpdateMasks(ThreadPool* pool = nullptr);
  // Recomputes W_eff from the current masks (after editing weight()).
  void RefreshEffective();

  // Logits [n, d_L] of x [n, d0].
  void Forward(const float* x, int64_t n, float* logits, ThreadPool* pool);
  // Mean cross-entropy of the batch and its gradients: dw[l] [out, in] (STE + SR-STE decay
  // for the sparse layers) and db[l] [out]. Labels in [0, d_L).
  double LossAndGrad(const float* x, const uint8_t* labels, int64_t n,
                     std::vector<std::vector<float>>* dw, std::vector<std::vector<float>>* db,
                     ThreadPool* pool);
  // One training step at learning rate lr: masks (every mask_every steps, counting from 0),
  // gradients, SGD-momentum update. Returns the batch's loss. When the next step's masks are
  // due, the update makes them from the new weights: mask() and effective_weight() then show
  // the masks of the weights the step wrote (else those the step trained with).
  double Step(const float* x, const uint8_t* labels, int64_t n, double lr, ThreadPool* pool);
  int64_t steps() const { return t_; }

 private:
  double Backward(const float* x, const uint8_t* labels, int64_t n,
                  std::vector<std::vector<float>>* dw, std::vector<std::vector<float>>* db,
                  bool add_srste, ThreadPool* pool);

  MlpOptions opt_;
  std::vector<std::vector<float>> w_, b_, weff_, vw_, vb_, dw_, db_;
  std::vector<std::vector<uint8_t>> mask_;
  std::vector<std::vector<float>> acts_;  // activations kept for the backward
  std::vector<float> dz_, dzt_, da_;      // the backward's scratch, kept across steps
  int64_t t_ = 0;
  // The masks and W_eff were made from the current master weights (by UpdateMasks, or by the
  // last Step's update when this step's masks were due): a due recomputation is skipped.
  bool masks_current_ = false;
};

// A whole run of `sparq train --task fashion-mnist`.
struct MnistTrainOptions {
  MlpOptions mlp;
  int64_t epochs = 3;  // used when steps == 0
  int64_t steps = 0;   // > 0: exactly this many steps (the data order continues across epochs)
  int64_t batch = 256;
  std::string data_dir;  // holds the four IDX files (sparq/idx.h)
  // Called after each epoch (and at the end of a --steps run) with the test accuracy so far.
  std::function<void(int64_t step, int64_t total, double loss, double test_acc)> progress;
};

struct MnistTrainResult {
  int64_t steps = 0, epochs_run = 0, batch = 0;
  double final_loss = 0.0;       // mean loss over the last epoch's steps (or the run's last 100)
  double test_accuracy = 0.0;    // on the 10,000 test images, in [0, 1]
  double median_step_ms = 0.0;   // forward + backward + masks + update
  double seconds = 0.0;
  std::vector<double> epoch_test_accuracy;
  double sparse_fraction = 0.0;  // of all weights, zeros of the effective weights
};

// Loads the data (pixels / 255, then normalized by Fashion-MNIST's mean 0.2860 and std 0.3530),
// shuffles each epoch with a seeded Fisher-Yates (the last partial batch of an epoch is dropped),
// trains and evaluates. Errors: the data's (sparq/idx.h), bad options (naming the flag).
Result<MnistTrainResult> TrainFashionMnist(const MnistTrainOptions& opt, ThreadPool* pool);

}  // namespace sparq::train
