// A small Llama trained from scratch, dense or 2:4 with dense masters (sparq/train_lm.h).
#include "sparq/train_lm.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "sparq/train_loop.h"
#include "sparq/train_optim.h"
#include "src/train/sparse24.h"

namespace sparq::train {
namespace {

void FillNormal(std::vector<float>* v, size_t count, double stddev, std::mt19937_64* rng) {
  v->resize(count);
  for (float& x : *v) x = static_cast<float>(stddev * Normal(*rng));
}

// Per slot of every block: its mask (one byte per weight, recomputed from the masters) or its
// W_eff.
template <class T>
using PerSlot = std::vector<std::array<std::vector<T>, kNumSlots>>;
using Masks = PerSlot<uint8_t>;

// Recomputes *masks from w, and with eff (not null) each slot's W_eff in the same vector pass;
// returns the fraction of entries that flipped (0 the first time).
double UpdateMasks(const LlamaConfig& c, const ModelWeights& w, Masks* masks,
                   PerSlot<float>* eff = nullptr) {
  const bool first = masks->empty();
  masks->resize(c.n_layer);
  if (eff != nullptr) eff->resize(c.n_layer);
  std::vector<uint8_t> next;
  std::vector<float> scratch;
  int64_t flipped = 0, total = 0;
  for (int64_t l = 0; l < c.n_layer; ++l) {
    for (int s = 0; s < kNumSlots; ++s) {
      const std::vector<float>& v = w.blocks[l].linear[s];
      std::vector<float>& out = eff != nullptr ? (*eff)[l][s] : scratch;
      next.resize(v.size());
      out.resize(v.size());
      // Rows of k % 4 == 0 entries end to end: groups of 4 never straddle a row.
      MaskAndApply2of4(v.data(), static_cast<int64_t>(v.size()), next.data(), out.data());
      std::vector<uint8_t>& cur = (*masks)[l][s];
      if (!first) {
        for (size_t i = 0; i < next.size(); ++i) flipped += next[i] != cur[i];
      }
      total += static_cast<int64_t>(next.size());
      cur.swap(next);
    }
  }
  return first || total == 0 ? 0.0 : static_cast<double>(flipped) / static_cast<double>(total);
}

// Each slot's W_eff from the current masks (the steps between mask recomputations).
void ApplyMasks(const ModelWeights& w, const Masks& masks, PerSlot<float>* eff) {
  eff->resize(masks.size());
  for (size_t l = 0; l < masks.size(); ++l) {
    for (int s = 0; s < kNumSlots; ++s) {
      const std::vector<float>& v = w.blocks[l].linear[s];
      const uint8_t* __restrict m = masks[l][s].data();
      std::vector<float>& out = (*eff)[l][s];
      out.resize(v.size());
      const float* __restrict in = v.data();
      float* __restrict o = out.data();
      for (size_t i = 0; i < v.size(); ++i) o[i] = m[i] ? in[i] : 0.0f;
    }
  }
}

// Swaps every slot of w with its W_eff (O(1) each): the step trains on W_eff without copying the
// model (the embedding alone is 50 MB at this vocabulary), and a second swap restores the masters.
void SwapSlots(ModelWeights* w, PerSlot<float>* eff) {
  for (size_t l = 0; l < eff->size(); ++l) {
    for (int s = 0; s < kNumSlots; ++s) w->blocks[l].linear[s].swap((*eff)[l][s]);
  }
}

Status CheckTokens(std::span<const int32_t> t, const LlamaConfig& c, const char* what,
                   int64_t seq_len) {
  if (static_cast<int64_t>(t.size()) < seq_len + 1) {
    return InvalidInput(std::string("train lm: the ") + what + " text holds " +
                        std::to_string(t.size()) + " tokens; a window needs --seq-len + 1 = " +
                        std::to_string(seq_len + 1));
  }
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] < 0 || t[i] >= c.n_vocab) {
      return InvalidInput(std::string("train lm: ") + what + " token " + std::to_string(i) +
                          " is " + std::to_string(t[i]) + ", outside the vocabulary");
    }
  }
  return Status::Ok();
}

}  // namespace

std::vector<uint8_t> Mask2of4(std::span<const float> w, int64_t m, int64_t k) {
  std::vector<uint8_t> mask(static_cast<size_t>(m * k));
  // Rows of k % 4 == 0 entries laid end to end are groups of 4 that never straddle a row.
  MaskRow2of4(w.data(), m * k, mask.data());
  return mask;
}

ModelWeights InitLmWeights(const LlamaConfig& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  ModelWeights w;
  const double sd = 0.02, sd_out = 0.02 / std::sqrt(2.0 * static_cast<double>(c.n_layer));
  FillNormal(&w.token_embd, static_cast<size_t>(c.n_vocab * c.n_embd), sd, &rng);
  w.output_norm.assign(static_cast<size_t>(c.n_embd), 1.0f);
  w.blocks.resize(c.n_layer);
  for (BlockWeights& b : w.blocks) {
    b.attn_norm.assign(static_cast<size_t>(c.n_embd), 1.0f);
    b.ffn_norm.assign(static_cast<size_t>(c.n_embd), 1.0f);
    for (int s = 0; s < kNumSlots; ++s) {
      const auto slot = static_cast<LinearSlot>(s);
      const auto [m, k] = SlotShape(c, slot);
      const bool residual = slot == LinearSlot::kO || slot == LinearSlot::kDown;
      FillNormal(&b.linear[s], static_cast<size_t>(m * k), residual ? sd_out : sd, &rng);
    }
  }
  return w;
}

Result<double> LmPerplexity(const LlamaConfig& c, const ModelWeights& w,
                            std::span<const int32_t> tokens, int64_t seq_len, ThreadPool* pool,
                            int64_t* positions) {
  const auto n = static_cast<int64_t>(tokens.size());
  if (seq_len < 1 || n < seq_len + 1) {
    return InvalidInput("LmPerplexity: " + std::to_string(n) + " tokens, a window needs " +
                        std::to_string(seq_len + 1));
  }
  double sum = 0.0;
  int64_t count = 0;
  const TrainExec exec{.fast = true, .pool = pool};
  // Windows overlap by one token: the last input of one is the first of the next, so every token
  // after the first is predicted once.
  for (int64_t at = 0; at + seq_len + 1 <= n; at += seq_len) {
    LossResult r;
    SPARQ_RETURN_IF_ERROR(ModelLossAndGrad(c, w, {}, tokens.subspan(at, seq_len + 1), LossSpec{},
                                           &r, nullptr, exec));
    sum += r.ce * static_cast<double>(seq_len);
    count += seq_len;
  }
  if (positions != nullptr) *positions = count;
  return std::exp(sum / static_cast<double>(count));
}

Result<LmTrainResult> TrainLm(const LmTrainOptions& o, std::span<const int32_t> train_tokens,
                              std::span<const int32_t> eval_tokens, ThreadPool* pool) {
  const auto t0 = std::chrono::steady_clock::now();
  const LlamaConfig& c = o.config;
  SPARQ_RETURN_IF_ERROR(c.Validate("train lm: model"));
  if (o.steps < 1 || o.seq_len < 1 || o.batch < 1 || o.mask_every < 1) {
    return InvalidInput("train lm: --steps, --seq-len, --batch and --mask-every must be >= 1");
  }
  if (!(o.srste >= 0) || !std::isfinite(o.srste)) {
    return InvalidInput("train lm: --srste must be finite and >= 0, not " +
                        std::to_string(o.srste));
  }
  if (o.sparse24) {
    for (int s = 0; s < kNumSlots; ++s) {
      const auto [m, k] = SlotShape(c, static_cast<LinearSlot>(s));
      if (k % 4 != 0) {
        return InvalidInput("train lm: 2:4 needs every layer's input size to be a multiple of 4; " +
                            std::string(SlotName(static_cast<LinearSlot>(s))) + " has " +
                            std::to_string(k));
      }
    }
  }
  SPARQ_RETURN_IF_ERROR(CheckTokens(train_tokens, c, "training", o.seq_len));
  SPARQ_RETURN_IF_ERROR(CheckTokens(eval_tokens, c, "evaluation", o.seq_len));
  const int64_t warmup = o.warmup >= 0 ? o.warmup : std::min(o.steps / 20, o.steps - 1);
  const LrSchedule sched{o.lr, warmup, o.steps, 0.1};
  SPARQ_RETURN_IF_ERROR(sched.Validate().WithContext("train lm"));

  ModelWeights w = InitLmWeights(c, o.seed);
  SPARQ_ASSIGN_OR_RETURN(
      AdamW adamw,
      AdamW::Create(c, w, {}, {.weight_decay = o.weight_decay, .max_grad_norm = o.max_grad_norm}));
  LmTrainResult r;
  r.steps = o.steps;
  r.params = static_cast<int64_t>(w.token_embd.size() + w.output_norm.size());
  for (const BlockWeights& b : w.blocks) {
    r.params += static_cast<int64_t>(b.attn_norm.size() + b.ffn_norm.size());
    for (const auto& v : b.linear) r.params += static_cast<int64_t>(v.size());
  }
  Masks masks;
  PerSlot<float> eff;
  ModelWeights grads;
  // A small model: every block's activations kept (no recompute; the same bits).
  std::vector<BlockActivations> activations;
  const TrainExec exec{.fast = true, .pool = pool, .activations = &activations};
  const auto stream = static_cast<int64_t>(train_tokens.size());
  std::vector<std::span<const int32_t>> windows(o.batch);
  std::vector<double> losses, step_ms;
  ModelWeights deployed;  // 2:4: the masters under their own mask (what would be stored)
  auto evaluate = [&]() -> Result<double> {
    if (!o.sparse24) return LmPerplexity(c, w, eval_tokens, o.seq_len, pool, &r.eval_tokens);
    Masks own;  // apart from the training masks, whose schedule an evaluation must not move
    PerSlot<float> own_eff;
    UpdateMasks(c, w, &own, &own_eff);
    deployed = w;  // norms and embedding as they are, the slots W_eff
    SwapSlots(&deployed, &own_eff);
    return LmPerplexity(c, deployed, eval_tokens, o.seq_len, pool, &r.eval_tokens);
  };
  for (int64_t s = 0; s < o.steps; ++s) {
    const auto ts = std::chrono::steady_clock::now();
    if (o.sparse24) {
      if (s % o.mask_every == 0) {
        r.last_mask_change = UpdateMasks(c, w, &masks, &eff);
      } else {
        ApplyMasks(w, masks, &eff);
      }
    }
    for (int64_t i = 0; i < o.batch; ++i) {
      windows[i] = train_tokens.subspan(WindowStart(o.seed, s, i, stream, o.seq_len),
                                        o.seq_len + 1);
    }
    double loss = 0.0;
    // Dense gradient of the masked product (the straight-through estimator): every entry of W.
    if (o.sparse24) SwapSlots(&w, &eff);
    const Status st = AccumulatedLossAndGrad(c, w, {}, windows, &loss, &grads, {}, {}, {}, exec);
    if (o.sparse24) SwapSlots(&w, &eff);
    SPARQ_RETURN_IF_ERROR(st.WithContext("train lm: step " + std::to_string(s + 1)));
    if (!std::isfinite(loss)) {
      return InvalidInput("train lm: the loss is " + std::to_string(loss) + " at step " +
                          std::to_string(s + 1) + " (try a lower --lr)");
    }
    const double lr = sched.lr(s);
    SPARQ_RETURN_IF_ERROR(adamw.Step(&w, grads, lr, nullptr, pool)
                              .WithContext("train lm: step " + std::to_string(s + 1)));
    if (o.sparse24 && o.srste > 0) {
      // Decoupled SR-STE: the pruned entries decay toward 0, so a weight that lost its place
      // must win it back with its gradient rather than by inertia.
      const auto keep = static_cast<float>(1.0 - lr * o.srste);
      for (int64_t l = 0; l < c.n_layer; ++l) {
        for (int k = 0; k < kNumSlots; ++k) {
          std::vector<float>& v = w.blocks[l].linear[k];
          const std::vector<uint8_t>& m = masks[l][k];
          for (size_t i = 0; i < v.size(); ++i) v[i] = m[i] ? v[i] : v[i] * keep;
        }
      }
    }
    step_ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - ts).count());
    losses.push_back(loss);
    double ppl = 0.0;
    const bool last = s + 1 == o.steps;
    if (last || (o.eval_every > 0 && (s + 1) % o.eval_every == 0)) {
      SPARQ_ASSIGN_OR_RETURN(ppl, evaluate());
      r.curve.push_back({s + 1, ppl});
    }
    if (o.progress) o.progress(s + 1, o.steps, loss, ppl, step_ms.back());
  }
  r.eval_perplexity = r.curve.back().second;
  const size_t tail = std::min<size_t>(20, losses.size());
  for (size_t i = losses.size() - tail; i < losses.size(); ++i) r.final_loss += losses[i] / tail;
  std::vector<double> sorted = step_ms;
  std::sort(sorted.begin(), sorted.end());
  r.median_step_ms = sorted[sorted.size() / 2];
  int64_t zeros = 0, total = 0;
  const ModelWeights& final_w = o.sparse24 ? deployed : w;
  for (const BlockWeights& b : final_w.blocks) {
    for (const auto& v : b.linear) {
      zeros += std::count(v.begin(), v.end(), 0.0f);
      total += static_cast<int64_t>(v.size());
    }
  }
  r.zero_fraction = total > 0 ? static_cast<double>(zeros) / static_cast<double>(total) : 0.0;
  r.masters = std::move(w);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace sparq::train
