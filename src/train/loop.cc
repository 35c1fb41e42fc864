// The training driver (sparq/train_loop.h): windows from the seeded data order, accumulated
// gradients, AdamW at the schedule's rate, periodic saves and progress reports.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "sparq/train_loop.h"
#include "sparq/train_model.h"
#include "sparq/train_optim.h"
#include "src/train/exec_ops.h"

namespace sparq::train {

uint64_t DataHash(std::span<const int32_t> tokens) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const int32_t t : tokens) {
    const auto u = static_cast<uint32_t>(t);
    for (int b = 0; b < 4; ++b) h = (h ^ ((u >> (8 * b)) & 0xff)) * 0x100000001b3ull;
  }
  return h;
}

Status TrainLoop(TrainState* state, std::span<const int32_t> tokens, const TrainLoopOptions& opt) {
  const LlamaConfig& c = state->config;
  const TrainOptions& o = state->options;
  SPARQ_RETURN_IF_ERROR(o.Validate(c));
  const auto stream_len = static_cast<int64_t>(tokens.size());
  if (stream_len < o.seq_len + 1) {
    return InvalidInput("TrainLoop: " + std::to_string(stream_len) +
                        " tokens, a window needs seq_len + 1 = " + std::to_string(o.seq_len + 1));
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= c.n_vocab) {
      return InvalidInput("TrainLoop: token " + std::to_string(i) + " is " +
                          std::to_string(tokens[i]) + ", outside the vocabulary [0, " +
                          std::to_string(c.n_vocab) + ")");
    }
  }
  const uint64_t hash = DataHash(tokens);
  if (state->data_tokens != 0 && (state->data_tokens != stream_len || state->data_hash != hash)) {
    return InvalidInput("TrainLoop: the state was trained on " +
                        std::to_string(state->data_tokens) + " tokens (hash " +
                        std::to_string(state->data_hash) + "), this stream has " +
                        std::to_string(stream_len) + " (hash " + std::to_string(hash) +
                        "): a resumed run must read the same data");
  }
  const bool kl = o.kl_weight > 0, hidden = o.hidden_weight > 0;
  if (hidden && !opt.teacher_hidden) {
    return InvalidInput("TrainLoop: hidden_weight > 0 needs a teacher_hidden");
  }
  if (kl && !hidden && !opt.teacher) {
    return InvalidInput("TrainLoop: kl_weight > 0 needs a teacher");
  }
  SPARQ_ASSIGN_OR_RETURN(AdamW adamw, AdamW::Create(c, state->weights, state->masks, o.adamw));
  SPARQ_RETURN_IF_ERROR(adamw.ImportState(state->optim));
  // Set only once every check passed: a refused call leaves *state as it was.
  state->data_tokens = stream_len;
  state->data_hash = hash;
  const int64_t total = o.schedule.total_steps;
  const int64_t end = opt.stop_at < 0 ? total : std::min(opt.stop_at, total);

  auto save = [&]() -> Status {
    state->optim = adamw.ExportState();
    return opt.checkpoint_path.empty() ? Status::Ok() : SaveTrainState(opt.checkpoint_path, *state);
  };
  const LossSpec spec{o.ce_weight, o.kl_weight, o.tau, {}, o.hidden_weight, {}};
  TrainExec exec = opt.exec;
  exec.weight_grads = !o.adamw.norms_only;  // frozen matrices need no dW
  ModelWeights grads;
  std::vector<std::span<const int32_t>> windows(o.accum);
  std::vector<std::vector<float>> teacher(kl ? o.accum : 0,
                                          std::vector<float>(o.seq_len * c.n_vocab));
  std::vector<std::span<const float>> teacher_spans(teacher.begin(), teacher.end());
  std::vector<std::vector<float>> teacher_h(hidden ? o.accum : 0,
                                            std::vector<float>(c.n_layer * o.seq_len * c.n_embd));
  std::vector<std::span<const float>> hidden_spans(teacher_h.begin(), teacher_h.end());
  auto step = [&]() -> Status {
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t s = adamw.steps();
    for (int64_t i = 0; i < o.accum; ++i) {
      windows[i] = tokens.subspan(WindowStart(o.seed, s, i, stream_len, o.seq_len), o.seq_len + 1);
      if (!kl && !hidden) continue;
      ScopedTimer t(TimerSlot(opt.exec.timers, &TrainTimers::teacher));
      const std::span<const int32_t> in = windows[i].first(o.seq_len);
      if (hidden) {  // one forward gives both (the logits only when the KL needs them)
        const std::span<float> logits = kl ? std::span<float>(teacher[i]) : std::span<float>();
        SPARQ_RETURN_IF_ERROR(opt.teacher_hidden(in, logits, teacher_h[i]).WithContext("teacher"));
      } else {
        SPARQ_RETURN_IF_ERROR(opt.teacher(in, teacher[i]).WithContext("teacher"));
      }
    }
    double loss = 0.0;
    SPARQ_RETURN_IF_ERROR(AccumulatedLossAndGrad(c, state->weights, state->masks, windows, &loss,
                                                 &grads, spec, teacher_spans, hidden_spans, exec));
    const double lr = o.schedule.lr(s);
    AdamWStep info;
    {
      ScopedTimer t(TimerSlot(opt.exec.timers, &TrainTimers::optimizer));
      SPARQ_RETURN_IF_ERROR(adamw.Step(&state->weights, grads, lr, &info, opt.exec.pool));
    }
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (o.checkpoint_every > 0 && adamw.steps() % o.checkpoint_every == 0 && adamw.steps() < end) {
      SPARQ_RETURN_IF_ERROR(save());
    }
    if (opt.progress) {
      const auto n = static_cast<double>(o.accum * o.seq_len);
      opt.progress({adamw.steps(), total, loss, lr, info.grad_norm, secs > 0 ? n / secs : 0.0});
    }
    return Status::Ok();
  };
  while (adamw.steps() < end) {
    const Status st = step();
    if (!st.ok()) {
      // *state keeps the last completed step: its weights with their moments.
      state->optim = adamw.ExportState();
      return st.WithContext("step " + std::to_string(adamw.steps() + 1));
    }
  }
  return save();
}

}  // namespace sparq::train
