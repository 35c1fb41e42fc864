// The whole model for training: embedding, the blocks, the final RMSNorm, the tied head and the
// loss (cross-entropy on the next tokens, optionally KL to a teacher's logits and SquareHead on
// the blocks' outputs), forward and backward. Activation checkpointing per block: the forward
// keeps only each block's input, and the backward recomputes that block's activations just
// before its backward, so memory holds n_layer block inputs plus one block's activations (bounded
// at ctx 512, issue 28); or, with TrainExec::activations, every block's, and no recompute. The
// ops run on the path the TrainExec picks (exec_ops.h), timed into its
// TrainTimers when it has them.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "sparq/train_model.h"
#include "sparq/train_ops.h"
#include "src/train/exec_ops.h"
#include "src/train/model_check.h"
#include "src/train/shape_check.h"

namespace sparq::train {
namespace {

// x [n, d] = the blocks on the embedded tokens; inputs (if not null) gets each block's input,
// outputs (if not empty: [n_layer, n, d]) each block's output, kept (if not null) each block's
// activations (else one scratch set is reused).
Status Trunk(const LlamaConfig& c, const ModelWeights& w, std::span<const int32_t> tokens,
             std::vector<std::vector<float>>* inputs, std::vector<float>* x, const TrainExec& exec,
             std::span<float> outputs = {}, std::vector<BlockActivations>* kept = nullptr) {
  const auto n = static_cast<int64_t>(tokens.size());
  const int64_t d = c.n_embd;
  x->resize(n * d);
  SPARQ_RETURN_IF_ERROR(EmbeddingForward(w.token_embd, tokens, c.n_vocab, d, *x));
  std::vector<float> y(n * d);
  BlockActivations scratch;
  if (inputs != nullptr) inputs->resize(c.n_layer);
  if (kept != nullptr) kept->resize(c.n_layer);
  for (int64_t l = 0; l < c.n_layer; ++l) {
    if (inputs != nullptr) (*inputs)[l] = *x;
    BlockActivations* acts = kept != nullptr ? &(*kept)[l] : &scratch;
    SPARQ_RETURN_IF_ERROR(BlockForward(c, w.blocks[l], static_cast<int>(l), *x, n, y, acts, exec));
    x->swap(y);
    if (!outputs.empty()) std::copy(x->begin(), x->end(), outputs.begin() + l * n * d);
  }
  return Status::Ok();
}

// xf = RMSNorm(x, output_norm), logits = xf E^T (the tied head).
// The head [n, n_vocab] is the biggest single product (49152 x 576 on SmolLM2): on the fast
// path a grid of BLAS tiles over the pool like every linear layer.
Status Head(const ExecOps& ops, const LlamaConfig& c, const ModelWeights& w,
            std::span<const float> x, int64_t n, std::vector<float>* xf, std::span<float> logits) {
  xf->resize(n * c.n_embd);
  SPARQ_RETURN_IF_ERROR(ops.RmsNormForward(x, w.output_norm, n, c.n_embd, c.rms_eps, *xf));
  return ops.LinearForward(*xf, w.token_embd, n, c.n_embd, c.n_vocab, logits);
}

Status CheckTokens(const char* op, std::span<const int32_t> tokens, int64_t min_count) {
  if (static_cast<int64_t>(tokens.size()) < min_count) {
    return InvalidInput(std::string(op) + ": needs at least " + std::to_string(min_count) +
                        " tokens, got " + std::to_string(tokens.size()));
  }
  return Status::Ok();
}

}  // namespace

ModelWeights ZerosLike(const ModelWeights& w) {
  ModelWeights z;
  z.token_embd.assign(w.token_embd.size(), 0.0f);
  z.output_norm.assign(w.output_norm.size(), 0.0f);
  for (const BlockWeights& b : w.blocks) z.blocks.push_back(ZerosLike(b));
  return z;
}

Status CheckModel(const LlamaConfig& c, const ModelWeights& w, std::span<const BlockMasks> masks) {
  SPARQ_RETURN_IF_ERROR(c.Validate("training model config"));
  SPARQ_RETURN_IF_ERROR(CheckSize("token_embd.weight", "tensor",
                                  std::span<const float>(w.token_embd), {c.n_vocab, c.n_embd}));
  SPARQ_RETURN_IF_ERROR(
      CheckSize("output_norm.weight", "tensor", std::span<const float>(w.output_norm), {c.n_embd}));
  if (static_cast<int64_t>(w.blocks.size()) != c.n_layer) {
    return InvalidInput("training model: " + std::to_string(w.blocks.size()) + " blocks for " +
                        std::to_string(c.n_layer) + " layers");
  }
  for (int64_t l = 0; l < c.n_layer; ++l) {
    SPARQ_RETURN_IF_ERROR(CheckBlock(c, w.blocks[l], BlockName(static_cast<int>(l))));
  }
  if (masks.empty()) return Status::Ok();
  if (static_cast<int64_t>(masks.size()) != c.n_layer) {
    return InvalidInput("training model: " + std::to_string(masks.size()) + " block masks for " +
                        std::to_string(c.n_layer) + " layers");
  }
  for (int64_t l = 0; l < c.n_layer; ++l) {
    SPARQ_RETURN_IF_ERROR(CheckMasks(c, masks[l], BlockName(static_cast<int>(l))));
  }
  return Status::Ok();
}

Status ModelLogits(const LlamaConfig& c, const ModelWeights& w, std::span<const int32_t> tokens,
                   std::span<float> logits, const TrainExec& exec) {
  SPARQ_RETURN_IF_ERROR(CheckModel(c, w));
  SPARQ_RETURN_IF_ERROR(CheckTokens("ModelLogits", tokens, 1));
  const auto n = static_cast<int64_t>(tokens.size());
  SPARQ_RETURN_IF_ERROR(CheckSize("ModelLogits", "logits", logits, {n, c.n_vocab}));
  std::vector<float> x, xf;
  SPARQ_RETURN_IF_ERROR(Trunk(c, w, tokens, nullptr, &x, exec));
  return Head(ExecOps(exec), c, w, x, n, &xf, logits);
}

Status ModelLogitsAndHidden(const LlamaConfig& c, const ModelWeights& w,
                            std::span<const int32_t> tokens, std::span<float> logits,
                            std::span<float> hidden, const TrainExec& exec) {
  constexpr const char* kOp = "ModelLogitsAndHidden";
  SPARQ_RETURN_IF_ERROR(CheckModel(c, w));
  SPARQ_RETURN_IF_ERROR(CheckTokens(kOp, tokens, 1));
  const auto n = static_cast<int64_t>(tokens.size());
  if (!logits.empty()) SPARQ_RETURN_IF_ERROR(CheckSize(kOp, "logits", logits, {n, c.n_vocab}));
  SPARQ_RETURN_IF_ERROR(CheckSize(kOp, "hidden", hidden, {c.n_layer, n, c.n_embd}));
  std::vector<float> x, xf;
  SPARQ_RETURN_IF_ERROR(Trunk(c, w, tokens, nullptr, &x, exec, hidden));
  if (logits.empty()) return Status::Ok();
  return Head(ExecOps(exec), c, w, x, n, &xf, logits);
}

Status ModelLossAndGrad(const LlamaConfig& c, const ModelWeights& w,
                        std::span<const BlockMasks> masks, std::span<const int32_t> tokens,
                        const LossSpec& spec, LossResult* result, ModelWeights* grads,
                        const TrainExec& exec) {
  constexpr const char* kOp = "ModelLossAndGrad";
  const ExecOps ops(exec);
  auto timer = [&](double TrainTimers::*field) { return TimerSlot(exec.timers, field); };
  SPARQ_RETURN_IF_ERROR(CheckModel(c, w, masks));
  if (grads != nullptr) SPARQ_RETURN_IF_ERROR(CheckModel(c, *grads).WithContext("gradient"));
  SPARQ_RETURN_IF_ERROR(CheckTokens(kOp, tokens, 2));
  auto weight_ok = [](double x) { return std::isfinite(x) && x >= 0; };
  if (!weight_ok(spec.ce_weight) || !weight_ok(spec.kl_weight) || !weight_ok(spec.hidden_weight)) {
    return InvalidInput(std::string(kOp) + ": loss weights must be finite and >= 0, got ce " +
                        std::to_string(spec.ce_weight) + ", kl " + std::to_string(spec.kl_weight) +
                        ", hidden " + std::to_string(spec.hidden_weight));
  }
  const auto n = static_cast<int64_t>(tokens.size()) - 1;
  const int64_t d = c.n_embd, vocab = c.n_vocab;
  const bool use_kl = spec.kl_weight > 0;
  if (use_kl)
    SPARQ_RETURN_IF_ERROR(CheckSize(kOp, "teacher_logits", spec.teacher_logits, {n, vocab}));
  const bool use_hidden = spec.hidden_weight > 0;
  if (use_hidden) {
    SPARQ_RETURN_IF_ERROR(CheckSize(kOp, "teacher_hidden", spec.teacher_hidden, {c.n_layer, n, d}));
  }
  const std::span<const int32_t> inputs = tokens.first(n), targets = tokens.subspan(1);
  SPARQ_RETURN_IF_ERROR(CheckIds(kOp, "tokens", tokens, vocab));

  const bool backward = grads != nullptr;
  // The checkpoints; SquareHead reads them too: block l's output is block l + 1's input.
  std::vector<std::vector<float>> block_in;
  // With exec.activations: every block's kept there, no recompute below.
  const bool keep = backward && exec.activations != nullptr;
  std::vector<BlockActivations>* kept = keep ? exec.activations : nullptr;
  std::vector<float> x, xf, logits(n * vocab);
  {
    ScopedTimer t(timer(&TrainTimers::forward));
    SPARQ_RETURN_IF_ERROR(Trunk(c, w, inputs, backward || use_hidden ? &block_in : nullptr, &x,
                                exec, {}, kept));
  }
  auto block_out = [&](int64_t l) -> std::span<const float> {
    return l + 1 < c.n_layer ? std::span<const float>(block_in[l + 1]) : std::span<const float>(x);
  };
  auto teacher_out = [&](int64_t l) { return spec.teacher_hidden.subspan(l * n * d, n * d); };
  std::vector<float> dlogits(backward ? n * vocab : 0), dkl(backward && use_kl ? n * vocab : 0);
  LossResult r;
  {
    ScopedTimer t(timer(&TrainTimers::head));
    SPARQ_RETURN_IF_ERROR(Head(ops, c, w, x, n, &xf, logits));
    SPARQ_RETURN_IF_ERROR(ops.CrossEntropy(logits, targets, n, vocab, &r.ce, dlogits));
    if (use_kl) {
      SPARQ_RETURN_IF_ERROR(
          ops.KlDivergence(spec.teacher_logits, logits, n, vocab, spec.tau, &r.kl, dkl));
    }
    for (int64_t l = 0; use_hidden && l < c.n_layer; ++l) {
      double term = 0.0;
      SPARQ_RETURN_IF_ERROR(NormalizedMse(block_out(l), teacher_out(l), 1.0, &term, {})
                                .WithContext(std::string(kOp) + ": blk." + std::to_string(l) +
                                             " output vs teacher_hidden"));
      r.hidden += term;
    }
    r.loss = spec.ce_weight * r.ce + (use_kl ? spec.kl_weight * r.kl : 0.0) +
             (use_hidden ? spec.hidden_weight * r.hidden : 0.0);
    *result = r;
    if (!backward) return Status::Ok();
    auto combine = [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        dlogits[i] = static_cast<float>(spec.ce_weight * dlogits[i] +
                                        (use_kl ? spec.kl_weight * dkl[i] : 0.0));
      }
    };
    if (ops.fast()) {
      fast::ForBlocks(ops.pool(), static_cast<int64_t>(dlogits.size()), 1 << 16, combine);
    } else {
      combine(0, static_cast<int64_t>(dlogits.size()));
    }
  }
  // Tied head: logits = xf E^T, so E gets dlogits^T xf here and the lookup's rows below.
  std::vector<float> dxf(n * d), dx(n * d), dprev(n * d), y(n * d);
  {
    ScopedTimer t(timer(&TrainTimers::head_backward));
    if (ops.weight_grads()) {
      SPARQ_RETURN_IF_ERROR(
          ops.LinearBackwardWeight(dlogits, xf, n, d, vocab, grads->token_embd));
    }
    SPARQ_RETURN_IF_ERROR(ops.LinearBackwardInput(dlogits, w.token_embd, n, d, vocab, dxf));
    SPARQ_RETURN_IF_ERROR(
        ops.RmsNormBackward(x, w.output_norm, dxf, n, d, c.rms_eps, dx, grads->output_norm));
  }
  BlockActivations acts;
  std::vector<float> dh(use_hidden ? n * d : 0);
  for (int64_t l = c.n_layer - 1; l >= 0; --l) {
    const auto bi = static_cast<int>(l);
    if (use_hidden) {
      // dx is the gradient at block l's output (from the blocks above, or for the last block
      // the final RMSNorm's input): SquareHead's term on that output adds its own there.
      ScopedTimer t(timer(&TrainTimers::backward));
      double unused = 0.0;
      SPARQ_RETURN_IF_ERROR(
          NormalizedMse(block_out(l), teacher_out(l), spec.hidden_weight, &unused, dh));
      for (int64_t i = 0; i < n * d; ++i) dx[i] += dh[i];
    }
    if (!keep) {
      // Recompute: the block's activations from its checkpointed input (bitwise the forward's).
      ScopedTimer t(timer(&TrainTimers::recompute));
      SPARQ_RETURN_IF_ERROR(BlockForward(c, w.blocks[l], bi, block_in[l], n, y, &acts, exec));
    }
    ScopedTimer t(timer(&TrainTimers::backward));
    const BlockMasks* m = masks.empty() ? nullptr : &masks[l];
    SPARQ_RETURN_IF_ERROR(BlockBackward(c, w.blocks[l], bi, m, keep ? (*kept)[l] : acts, dx,
                                        dprev, &grads->blocks[l], exec));
    dx.swap(dprev);
  }
  ScopedTimer t(timer(&TrainTimers::backward));
  if (!ops.weight_grads()) return Status::Ok();
  return EmbeddingBackward(dx, inputs, vocab, d, grads->token_embd);
}

}  // namespace sparq::train
