// A small Llama trained from scratch, dense or 2:4 sparse (issue 28, item 6b: `sparq train --task
// lm`): the language-model half of "2:4 sparse training", beside the Fashion-MNIST MLP of
// sparq/train_mlp.h.
//
// Model: a LlamaConfig (tied head) drawn from the seed: every matrix N(0, 0.02), the residual
// outputs (attn_output, ffn_down) N(0, 0.02 / sqrt(2 n_layer)) as GPT-2 does so that the residual
// stream does not grow with depth, the RMSNorm gains 1. Optimizer: AdamW (sparq/train_optim.h)
// with warmup + cosine (sparq/train_loop.h), windows of the token stream by WindowStart, gradient
// accumulation over `batch` windows: the same machinery as `sparq finetune`, on the fast path.
//
// 2:4: every linear slot keeps dense f32 master weights W and a mask M holding the 2 largest |w|
// of each group of 4 consecutive inputs of a row (ties: the lower index), recomputed from W every
// `mask_every` steps. The forward uses W_eff = W * M; the backward is the straight-through
// estimator (the dense gradient of the masked product, for every entry of W). SR-STE (Zhou et al.
// 2021) adds lambda (1 - M) W to the gradient of SGD; under AdamW that term would be divided by
// sqrt(v) entry by entry, so it is applied decoupled instead, as AdamW applies weight decay:
// after each update the pruned entries are scaled by (1 - lr * srste). The embedding / head and
// the norms stay dense. The masked products run as dense BLAS on W_eff: no step speedup yet (the
// 2:4 kernel rows are the fast path to come).
//
// Determinism: a run is a function of its options and tokens; the same bits for any pool size.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "sparq/model.h"
#include "sparq/status.h"
#include "sparq/thread_pool.h"
#include "sparq/train_model.h"

namespace sparq::train {

struct LmTrainOptions {
  LlamaConfig config;     // n_vocab: the tokenizer's; n_ctx_train >= seq_len
  bool sparse24 = false;  // 2:4 on every linear slot of every block
  int64_t mask_every = 1;
  double srste = 0.0;  // decoupled SR-STE rate on the pruned entries (per unit of lr)
  int64_t steps = 300;
  int64_t seq_len = 128;
  int64_t batch = 8;  // windows per step
  double lr = 1e-3;
  int64_t warmup = -1;  // < 0: 5% of the steps
  double weight_decay = 0.1;
  double max_grad_norm = 1.0;
  uint64_t seed = 0;      // the weights' and the data order's
  int64_t eval_every = 0;  // > 0: evaluate every N steps too (the curve); the end always
  // step (1-based), total, the step's training loss, and the evaluation perplexity when this
  // step was evaluated (else 0).
  std::function<void(int64_t step, int64_t total, double loss, double eval_ppl, double step_ms)>
      progress;
};

struct LmTrainResult {
  int64_t steps = 0;
  int64_t params = 0;             // trainable entries (the masters)
  double final_loss = 0.0;        // mean training loss of the last min(20, steps) steps
  double eval_perplexity = 0.0;   // exp(mean CE) on the evaluation tokens, of W_eff at the end
  int64_t eval_tokens = 0;        // predicted positions evaluated
  std::vector<std::pair<int64_t, double>> curve;  // (step, eval perplexity)
  double median_step_ms = 0.0;    // masks + forward + backward + update
  double seconds = 0.0;
  double zero_fraction = 0.0;     // of the linear slots' effective weights at the end
  double last_mask_change = 0.0;  // fraction of mask entries that flipped at the last recompute
  ModelWeights masters;           // the dense f32 masters at the end (2:4: before masking)
};

// Initial weights of `c` from `seed` (the scheme above).
ModelWeights InitLmWeights(const LlamaConfig& c, uint64_t seed);

// The 2:4 mask of W [m, k] (k % 4 == 0): 1 for the 2 largest |w| of each group of 4 consecutive
// entries of a row (ties: the lower index), 0 for the others.
std::vector<uint8_t> Mask2of4(std::span<const float> w, int64_t m, int64_t k);

// Perplexity of the weights on `tokens`: consecutive windows of seq_len + 1 tokens (the last
// partial window dropped), exp of the mean cross-entropy over their predicted positions.
// Errors: fewer than seq_len + 1 tokens.
Result<double> LmPerplexity(const LlamaConfig& c, const ModelWeights& w,
                            std::span<const int32_t> tokens, int64_t seq_len, ThreadPool* pool,
                            int64_t* positions = nullptr);

// Trains from scratch on train_tokens and evaluates on eval_tokens. Errors (kInvalidInput naming
// the option): a config that fails Validate, 2:4 with a slot's input size not a multiple of 4,
// steps / seq_len / batch / mask_every < 1, srste < 0, too few tokens for a window, token ids
// outside the vocabulary, a non-finite loss.
Result<LmTrainResult> TrainLm(const LmTrainOptions& opt, std::span<const int32_t> train_tokens,
                              std::span<const int32_t> eval_tokens, ThreadPool* pool);

}  // namespace sparq::train
