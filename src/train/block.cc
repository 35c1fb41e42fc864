// One Llama decoder block, forward and backward, composed from the train ops:
//   hidden = x + Wo Attn(RoPE(Wq n1), RoPE(Wk n1), Wv n1),  n1 = RMSNorm(x, attn_norm)
//   y      = hidden + Wdown (silu(Wgate n2) * Wup n2),      n2 = RMSNorm(hidden, ffn_norm)
// The forward saves every op's input (BlockActivations); the backward reads them and recomputes
// nothing but the attention softmax (AttentionBackward does that from q and k). The ops run on
// the path the TrainExec picks (exec_ops.h: the reference or the fast path).
#include <algorithm>
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

// Elements per task of the fast path's residual sums (64 KiB per operand).
constexpr int64_t kAddGrain = 16384;

// acc += x (elementwise: the same bits on either path and any split).
void AddTo(const ExecOps& ops, std::span<float> acc, std::span<const float> x) {
  auto add = [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) acc[i] += x[i];
  };
  if (ops.fast()) {
    fast::ForBlocks(ops.pool(), static_cast<int64_t>(acc.size()), kAddGrain, add);
  } else {
    add(0, static_cast<int64_t>(acc.size()));
  }
}

RopeShape Rope(const LlamaConfig& c, int64_t n, int64_t heads) {
  return {.n = n,
          .heads = heads,
          .hd = c.head_dim(),
          .rope_dim = c.rope_dim,
          .pos0 = 0,
          .theta = c.rope_theta};
}

// dW of one slot from dY [n, m] and the slot's input X [n, k]: dense, or only at the kept
// positions (then a scatter-add) when the slot has a mask.
Status SlotGrad(const ExecOps& ops, const LlamaConfig& c, LinearSlot slot, const BlockMasks* masks,
                std::span<const float> dy, std::span<const float> x, int64_t n,
                BlockWeights* grads) {
  if (!ops.weight_grads()) return Status::Ok();
  const auto [m, k] = SlotShape(c, slot);
  std::vector<float>& dw = grads->at(slot);
  if (masks == nullptr || masks->at(slot).empty()) {
    return ops.LinearBackwardWeight(dy, x, n, k, m, dw);
  }
  const std::vector<int64_t>& kept = masks->at(slot);
  std::vector<float> dw_kept(kept.size(), 0.0f);
  SPARQ_RETURN_IF_ERROR(ops.LinearBackwardWeightMasked(dy, x, n, k, m, kept, dw_kept));
  for (size_t i = 0; i < kept.size(); ++i) dw[kept[i]] += dw_kept[i];
  return Status::Ok();
}

}  // namespace

BlockWeights ZerosLike(const BlockWeights& w) {
  BlockWeights z;
  z.attn_norm.assign(w.attn_norm.size(), 0.0f);
  z.ffn_norm.assign(w.ffn_norm.size(), 0.0f);
  for (int s = 0; s < kNumSlots; ++s) z.linear[s].assign(w.linear[s].size(), 0.0f);
  return z;
}

std::string BlockName(int block_index) { return "blk." + std::to_string(block_index) + "."; }

Status CheckBlock(const LlamaConfig& c, const BlockWeights& w, const std::string& prefix) {
  auto check = [&](const std::string& name, const std::vector<float>& t, int64_t rows,
                   int64_t cols) -> Status {
    const std::string what = prefix + name;
    return CheckSize(what.c_str(), "tensor", std::span<const float>(t), {rows, cols});
  };
  SPARQ_RETURN_IF_ERROR(check("attn_norm.weight", w.attn_norm, 1, c.n_embd));
  SPARQ_RETURN_IF_ERROR(check("ffn_norm.weight", w.ffn_norm, 1, c.n_embd));
  for (int s = 0; s < kNumSlots; ++s) {
    const auto slot = static_cast<LinearSlot>(s);
    const auto [m, k] = SlotShape(c, slot);
    SPARQ_RETURN_IF_ERROR(check(std::string(SlotName(slot)) + ".weight", w.linear[s], m, k));
  }
  return Status::Ok();
}

Status CheckMasks(const LlamaConfig& c, const BlockMasks& masks, const std::string& prefix) {
  // Runs on every backward (and every model call): a linear scan that builds no string unless
  // something is wrong. An ascending list (what FromLlamaModel makes) is free of repeats by the
  // scan alone; any other order gets a seen-table.
  for (int s = 0; s < kNumSlots; ++s) {
    const auto slot = static_cast<LinearSlot>(s);
    const auto [m, k] = SlotShape(c, slot);
    const std::vector<int64_t>& kept = masks.kept[s];
    auto where = [&](size_t i) {
      return prefix + std::string(SlotName(slot)) + ".weight: kept[" + std::to_string(i) +
             "] = " + std::to_string(kept[i]);
    };
    bool ascending = true;
    for (size_t i = 0; i < kept.size(); ++i) {
      if (kept[i] < 0 || kept[i] >= m * k) {
        return InvalidInput(where(i) + " is outside [" + std::to_string(m) + ", " +
                            std::to_string(k) + "]");
      }
      if (i > 0 && kept[i] <= kept[i - 1]) ascending = false;
    }
    if (ascending) continue;
    std::vector<uint8_t> seen(static_cast<size_t>(m * k), 0);
    for (size_t i = 0; i < kept.size(); ++i) {
      if (seen[kept[i]]) return InvalidInput(where(i) + " is listed twice");
      seen[kept[i]] = 1;
    }
  }
  return Status::Ok();
}

Status BlockForward(const LlamaConfig& c, const BlockWeights& w, int block_index,
                    std::span<const float> x, int64_t n, std::span<float> y, BlockActivations* acts,
                    const TrainExec& exec) {
  const ExecOps ops(exec);
  const std::string blk = BlockName(block_index);
  SPARQ_RETURN_IF_ERROR(c.Validate("BlockForward"));
  SPARQ_RETURN_IF_ERROR(CheckBlock(c, w, blk));
  SPARQ_RETURN_IF_ERROR(CheckSize("BlockForward", "x", x, {n, c.n_embd}));
  SPARQ_RETURN_IF_ERROR(CheckSize("BlockForward", "y", y, {n, c.n_embd}));
  const int64_t d = c.n_embd, kvd = c.kv_dim(), f = c.n_ff;
  BlockActivations& a = *acts;
  a.n = n;
  a.x.assign(x.begin(), x.end());
  for (auto* t : {&a.attn_in, &a.q, &a.att, &a.hidden, &a.ffn_in}) t->resize(n * d);
  for (auto* t : {&a.k, &a.v}) t->resize(n * kvd);
  for (auto* t : {&a.gate, &a.up, &a.act}) t->resize(n * f);
  auto slot = [&](LinearSlot s) { return std::span<const float>(w.at(s)); };
  const Status st = [&]() -> Status {
    SPARQ_RETURN_IF_ERROR(ops.RmsNormForward(x, w.attn_norm, n, d, c.rms_eps, a.attn_in));
    std::vector<float> q(n * d), k(n * kvd);
    SPARQ_RETURN_IF_ERROR(ops.LinearForward(a.attn_in, slot(LinearSlot::kQ), n, d, d, q));
    SPARQ_RETURN_IF_ERROR(ops.LinearForward(a.attn_in, slot(LinearSlot::kK), n, d, kvd, k));
    SPARQ_RETURN_IF_ERROR(ops.LinearForward(a.attn_in, slot(LinearSlot::kV), n, d, kvd, a.v));
    SPARQ_RETURN_IF_ERROR(ops.RopeForward(q, Rope(c, n, c.n_head), a.q));
    SPARQ_RETURN_IF_ERROR(ops.RopeForward(k, Rope(c, n, c.n_head_kv), a.k));
    const AttentionShape as{.t = n, .n_head = c.n_head, .n_kv = c.n_head_kv, .hd = c.head_dim()};
    SPARQ_RETURN_IF_ERROR(ops.AttentionForward(a.q, a.k, a.v, as, a.att));
    SPARQ_RETURN_IF_ERROR(ops.LinearForward(a.att, slot(LinearSlot::kO), n, d, d, a.hidden));
    AddTo(ops, a.hidden, x);
    SPARQ_RETURN_IF_ERROR(ops.RmsNormForward(a.hidden, w.ffn_norm, n, d, c.rms_eps, a.ffn_in));
    SPARQ_RETURN_IF_ERROR(ops.LinearForward(a.ffn_in, slot(LinearSlot::kGate), n, d, f, a.gate));
    SPARQ_RETURN_IF_ERROR(ops.LinearForward(a.ffn_in, slot(LinearSlot::kUp), n, d, f, a.up));
    SPARQ_RETURN_IF_ERROR(ops.SwigluForward(a.gate, a.up, a.act));
    SPARQ_RETURN_IF_ERROR(ops.LinearForward(a.act, slot(LinearSlot::kDown), n, f, d, y));
    AddTo(ops, y, a.hidden);
    return Status::Ok();
  }();
  return st.WithContext(blk + "forward");
}

Status BlockBackward(const LlamaConfig& c, const BlockWeights& w, int block_index,
                     const BlockMasks* masks, const BlockActivations& a, std::span<const float> dy,
                     std::span<float> dx, BlockWeights* grads, const TrainExec& exec) {
  const ExecOps ops(exec);
  const std::string blk = BlockName(block_index);
  SPARQ_RETURN_IF_ERROR(c.Validate("BlockBackward"));
  SPARQ_RETURN_IF_ERROR(CheckBlock(c, w, blk));
  SPARQ_RETURN_IF_ERROR(CheckBlock(c, *grads, "gradient of " + blk));
  if (masks != nullptr) SPARQ_RETURN_IF_ERROR(CheckMasks(c, *masks, blk));
  const int64_t n = a.n, d = c.n_embd, kvd = c.kv_dim(), f = c.n_ff;
  SPARQ_RETURN_IF_ERROR(CheckSize("BlockBackward", "dy", dy, {n, d}));
  SPARQ_RETURN_IF_ERROR(CheckSize("BlockBackward", "dx", dx, {n, d}));
  auto slot = [&](LinearSlot s) { return std::span<const float>(w.at(s)); };
  auto dw = [&](LinearSlot s, std::span<const float> g, std::span<const float> in) {
    return SlotGrad(ops, c, s, masks, g, in, n, grads);
  };
  const Status st = [&]() -> Status {
    // MLP: y = hidden + Wdown act, so dhidden starts as dy (the residual).
    std::vector<float> dhidden(dy.begin(), dy.end()), dact(n * f), dgate(n * f), dup(n * f);
    SPARQ_RETURN_IF_ERROR(dw(LinearSlot::kDown, dy, a.act));
    SPARQ_RETURN_IF_ERROR(ops.LinearBackwardInput(dy, slot(LinearSlot::kDown), n, f, d, dact));
    SPARQ_RETURN_IF_ERROR(ops.SwigluBackward(a.gate, a.up, dact, dgate, dup));
    SPARQ_RETURN_IF_ERROR(dw(LinearSlot::kGate, dgate, a.ffn_in));
    SPARQ_RETURN_IF_ERROR(dw(LinearSlot::kUp, dup, a.ffn_in));
    std::vector<float> dn(n * d), tmp(n * d);
    SPARQ_RETURN_IF_ERROR(ops.LinearBackwardInput(dgate, slot(LinearSlot::kGate), n, d, f, dn));
    SPARQ_RETURN_IF_ERROR(ops.LinearBackwardInput(dup, slot(LinearSlot::kUp), n, d, f, tmp));
    AddTo(ops, dn, tmp);  // n2 feeds both gate and up
    SPARQ_RETURN_IF_ERROR(
        ops.RmsNormBackward(a.hidden, w.ffn_norm, dn, n, d, c.rms_eps, tmp, grads->ffn_norm));
    AddTo(ops, dhidden, tmp);
    // Attention: hidden = x + Wo att, so dx starts as dhidden.
    std::vector<float> datt(n * d);
    SPARQ_RETURN_IF_ERROR(dw(LinearSlot::kO, dhidden, a.att));
    SPARQ_RETURN_IF_ERROR(ops.LinearBackwardInput(dhidden, slot(LinearSlot::kO), n, d, d, datt));
    std::vector<float> dq_rot(n * d), dk_rot(n * kvd), dv(n * kvd), dq(n * d), dk(n * kvd);
    const AttentionShape as{.t = n, .n_head = c.n_head, .n_kv = c.n_head_kv, .hd = c.head_dim()};
    SPARQ_RETURN_IF_ERROR(ops.AttentionBackward(a.q, a.k, a.v, datt, as, dq_rot, dk_rot, dv));
    SPARQ_RETURN_IF_ERROR(ops.RopeBackward(dq_rot, Rope(c, n, c.n_head), dq));
    SPARQ_RETURN_IF_ERROR(ops.RopeBackward(dk_rot, Rope(c, n, c.n_head_kv), dk));
    SPARQ_RETURN_IF_ERROR(dw(LinearSlot::kQ, dq, a.attn_in));
    SPARQ_RETURN_IF_ERROR(dw(LinearSlot::kK, dk, a.attn_in));
    SPARQ_RETURN_IF_ERROR(dw(LinearSlot::kV, dv, a.attn_in));
    SPARQ_RETURN_IF_ERROR(ops.LinearBackwardInput(dq, slot(LinearSlot::kQ), n, d, d, dn));
    SPARQ_RETURN_IF_ERROR(ops.LinearBackwardInput(dk, slot(LinearSlot::kK), n, d, kvd, tmp));
    AddTo(ops, dn, tmp);
    SPARQ_RETURN_IF_ERROR(ops.LinearBackwardInput(dv, slot(LinearSlot::kV), n, d, kvd, tmp));
    AddTo(ops, dn, tmp);  // n1 feeds q, k and v
    SPARQ_RETURN_IF_ERROR(
        ops.RmsNormBackward(a.x, w.attn_norm, dn, n, d, c.rms_eps, tmp, grads->attn_norm));
    std::copy(dhidden.begin(), dhidden.end(), dx.begin());
    AddTo(ops, dx, tmp);
    return Status::Ok();
  }();
  return st.WithContext(blk + "backward");
}

}  // namespace sparq::train
