// The pieces of a training step (sparq/train_loop.h): the learning-rate schedule, the seeded
// data order, gradient accumulation and the run options' checks.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <span>
#include <string>
#include <vector>

#include "sparq/train_loop.h"
#include "sparq/train_model.h"
#include "src/train/exec_ops.h"

namespace sparq::train {
namespace {

// splitmix64's finalizer: a bijection on 64 bits whose outputs pass BigCrush for counter inputs.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Calls fn on every tensor of g.
template <class Fn>
void ForEachTensor(ModelWeights* g, Fn fn) {
  fn(g->token_embd);
  fn(g->output_norm);
  for (BlockWeights& b : g->blocks) {
    fn(b.attn_norm);
    fn(b.ffn_norm);
    for (std::vector<float>& l : b.linear) fn(l);
  }
}

void ScaleAll(ModelWeights* g, float s) {
  if (s == 1.0f) return;  // x * 1 is x
  ForEachTensor(g, [s](std::vector<float>& v) {
    for (float& x : v) x *= s;
  });
}

bool SameShapes(const ModelWeights& a, const ModelWeights& b) {
  if (a.token_embd.size() != b.token_embd.size() || a.output_norm.size() != b.output_norm.size() ||
      a.blocks.size() != b.blocks.size()) {
    return false;
  }
  for (size_t l = 0; l < a.blocks.size(); ++l) {
    if (a.blocks[l].attn_norm.size() != b.blocks[l].attn_norm.size() ||
        a.blocks[l].ffn_norm.size() != b.blocks[l].ffn_norm.size()) {
      return false;
    }
    for (int s = 0; s < kNumSlots; ++s) {
      if (a.blocks[l].linear[s].size() != b.blocks[l].linear[s].size()) return false;
    }
  }
  return true;
}

// *g = zeros shaped like w, keeping g's buffers when they already have w's shapes (a training
// loop's gradient: no fresh half-gigabyte each step).
void ZeroLike(const ModelWeights& w, ModelWeights* g, ThreadPool* pool) {
  if (!SameShapes(w, *g)) {
    *g = ZerosLike(w);
    return;
  }
  ForEachTensor(g, [pool](std::vector<float>& v) {
    fast::ForBlocks(
        pool, static_cast<int64_t>(v.size()), int64_t{1} << 18,
        [&](int64_t i0, int64_t i1) { std::fill(v.begin() + i0, v.begin() + i1, 0.0f); });
  });
}

}  // namespace

Status LrSchedule::Validate() const {
  if (!std::isfinite(peak) || peak < 0 || warmup_steps < 0 || total_steps <= warmup_steps ||
      !(min_ratio >= 0 && min_ratio <= 1)) {
    return InvalidInput(
        "lr schedule: needs peak >= 0, 0 <= warmup_steps < total_steps, min_ratio "
        "in [0, 1] (got peak " +
        std::to_string(peak) + ", warmup_steps " + std::to_string(warmup_steps) + ", total_steps " +
        std::to_string(total_steps) + ", min_ratio " + std::to_string(min_ratio) + ")");
  }
  return Status::Ok();
}

double LrSchedule::lr(int64_t step) const {
  if (step < warmup_steps) {
    return peak * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  }
  const double p = std::min(1.0, static_cast<double>(step - warmup_steps) /
                                     static_cast<double>(total_steps - warmup_steps));
  return peak * (min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + std::cos(std::numbers::pi * p)));
}

int64_t WindowStart(uint64_t seed, int64_t step, int64_t micro, int64_t stream_len,
                    int64_t seq_len) {
  // Chained mixing keeps (step, micro) pairs apart: Mix is a bijection, so distinct inputs to
  // the last call give distinct hashes.
  const uint64_t h =
      Mix(Mix(Mix(seed) ^ static_cast<uint64_t>(step)) ^ static_cast<uint64_t>(micro));
  const auto range = static_cast<uint64_t>(stream_len - seq_len);  // starts 0 .. range - 1
  // Multiply-high maps the hash onto [0, range); its bias (range / 2^64) is far below noise.
  return static_cast<int64_t>((static_cast<unsigned __int128>(h) * range) >> 64);
}

Status AccumulatedLossAndGrad(const LlamaConfig& c, const ModelWeights& w,
                              std::span<const BlockMasks> masks,
                              std::span<const std::span<const int32_t>> sequences, double* loss,
                              ModelWeights* grads, const LossSpec& spec,
                              std::span<const std::span<const float>> teacher_logits,
                              std::span<const std::span<const float>> teacher_hidden,
                              const TrainExec& exec) {
  if (sequences.empty()) return InvalidInput("AccumulatedLossAndGrad: no sequences");
  const bool kl = spec.kl_weight > 0, hidden = spec.hidden_weight > 0;
  if (kl && teacher_logits.size() != sequences.size()) {
    return InvalidInput("AccumulatedLossAndGrad: " + std::to_string(teacher_logits.size()) +
                        " teacher logits for " + std::to_string(sequences.size()) + " sequences");
  }
  if (hidden && teacher_hidden.size() != sequences.size()) {
    return InvalidInput("AccumulatedLossAndGrad: " + std::to_string(teacher_hidden.size()) +
                        " teacher hidden states for " + std::to_string(sequences.size()) +
                        " sequences");
  }
  {
    ScopedTimer t(TimerSlot(exec.timers, &TrainTimers::optimizer));
    ZeroLike(w, grads, exec.pool);
  }
  double sum = 0.0;
  for (size_t i = 0; i < sequences.size(); ++i) {
    LossResult r;
    LossSpec si = spec;
    si.teacher_logits = kl ? teacher_logits[i] : std::span<const float>();
    si.teacher_hidden = hidden ? teacher_hidden[i] : std::span<const float>();
    // Each call adds its gradient to *grads (train_model.h), so the sum needs no copy.
    SPARQ_RETURN_IF_ERROR(ModelLossAndGrad(c, w, masks, sequences[i], si, &r, grads, exec)
                              .WithContext("micro-batch " + std::to_string(i)));
    sum += r.loss;
  }
  const auto count = static_cast<double>(sequences.size());
  *loss = sum / count;
  ScopedTimer t(TimerSlot(exec.timers, &TrainTimers::optimizer));
  ScaleAll(grads, static_cast<float>(1.0 / count));
  return Status::Ok();
}

Status TrainOptions::Validate(const LlamaConfig& c) const {
  SPARQ_RETURN_IF_ERROR(schedule.Validate());
  if (seq_len < 1 || seq_len > c.n_ctx_train) {
    return InvalidInput("train options: seq_len " + std::to_string(seq_len) +
                        " outside [1, n_ctx_train " + std::to_string(c.n_ctx_train) + "]");
  }
  if (accum < 1) return InvalidInput("train options: accum " + std::to_string(accum) + " < 1");
  auto weight = [](double x) { return std::isfinite(x) && x >= 0; };
  if (!weight(ce_weight) || !weight(kl_weight) || !weight(hidden_weight) ||
      ce_weight + kl_weight + hidden_weight == 0 || !std::isfinite(tau) || !(tau > 0)) {
    return InvalidInput(
        "train options: loss weights must be finite, >= 0 and not all 0, tau "
        "finite > 0 (got ce_weight " +
        std::to_string(ce_weight) + ", kl_weight " + std::to_string(kl_weight) +
        ", hidden_weight " + std::to_string(hidden_weight) + ", tau " + std::to_string(tau) + ")");
  }
  if (checkpoint_every < 0) {
    return InvalidInput("train options: checkpoint_every " + std::to_string(checkpoint_every) +
                        " < 0");
  }
  return Status::Ok();
}

}  // namespace sparq::train
