// AdamW with fixed masks and global-norm clipping (sparq/train_optim.h). The tensors are walked in
// one fixed order (token_embd, output_norm, then each block's norms and slots), which is also the
// order of the moment state, so the same weights and gradients give the same bits every run.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "sparq/train_optim.h"
#include "src/train/adamw_simd.h"
#include "src/train/model_check.h"

namespace sparq::train {
namespace {

// Trainable entries per task of a step: 64 Ki entries (1.25 MiB of weights, gradients and
// moments) amortize the hand-out; SmolLM2's ~80 M trainable entries make ~1300 tasks.
constexpr int64_t kStepBlock = 65536;

// One tensor of the walk: its name (for errors), weights, trainable entries and decay.
template <class Vec>
struct Entry {
  std::string name;
  Vec* values;
  const std::vector<int64_t>* kept;  // null or empty: every entry trains
  bool matrix;                        // token_embd or a linear slot: decayed; frozen by norms_only
  bool masked() const { return kept != nullptr && !kept->empty(); }
  int64_t trainable() const {
    return masked() ? static_cast<int64_t>(kept->size()) : static_cast<int64_t>(values->size());
  }
  int64_t index(int64_t i) const { return masked() ? (*kept)[i] : i; }
};

// Every tensor, or with norms_only the norms alone (then the matrices are neither read nor written).
template <class W, class Vec = std::conditional_t<std::is_const_v<W>, const std::vector<float>,
                                                  std::vector<float>>>
std::vector<Entry<Vec>> Walk(W& w, std::span<const BlockMasks> masks, bool norms_only) {
  std::vector<Entry<Vec>> e = {{"token_embd.weight", &w.token_embd, nullptr, true},
                               {"output_norm.weight", &w.output_norm, nullptr, false}};
  for (size_t l = 0; l < w.blocks.size(); ++l) {
    const std::string blk = BlockName(static_cast<int>(l));
    e.push_back({blk + "attn_norm.weight", &w.blocks[l].attn_norm, nullptr, false});
    e.push_back({blk + "ffn_norm.weight", &w.blocks[l].ffn_norm, nullptr, false});
    for (int s = 0; s < kNumSlots; ++s) {
      const std::vector<int64_t>* kept = masks.empty() ? nullptr : &masks[l].kept[s];
      e.push_back({blk + std::string(SlotName(static_cast<LinearSlot>(s))) + ".weight",
                   &w.blocks[l].linear[s], kept, true});
    }
  }
  if (norms_only) std::erase_if(e, [](const Entry<Vec>& x) { return x.matrix; });
  return e;
}

}  // namespace

Result<AdamW> AdamW::Create(const LlamaConfig& c, const ModelWeights& w,
                            std::span<const BlockMasks> masks, const AdamWOptions& opt) {
  auto in = [](double x, double lo, double hi) { return std::isfinite(x) && x >= lo && x < hi; };
  if (!in(opt.beta1, 0, 1) || !in(opt.beta2, 0, 1) || !(opt.eps > 0) || !std::isfinite(opt.eps) ||
      !in(opt.weight_decay, 0, INFINITY) || !in(opt.max_grad_norm, 0, INFINITY)) {
    return InvalidInput(
        "AdamW: betas must be in [0, 1), eps > 0, weight decay and max grad norm "
        ">= 0 (got beta1 " +
        std::to_string(opt.beta1) + ", beta2 " + std::to_string(opt.beta2) + ", eps " +
        std::to_string(opt.eps) + ", wd " + std::to_string(opt.weight_decay) + ", max grad norm " +
        std::to_string(opt.max_grad_norm) + ")");
  }
  SPARQ_RETURN_IF_ERROR(CheckModel(c, w, masks));
  AdamW a;
  a.c_ = c;
  a.masks_.assign(masks.begin(), masks.end());
  a.opt_ = opt;
  for (const Entry<const std::vector<float>>& e : Walk(w, masks, /*norms_only=*/false)) {
    if (e.masked()) {
      // Pruned entries must already be 0: the optimizer never writes them.
      std::vector<bool> keep(e.values->size(), false);
      for (int64_t i : *e.kept) keep[i] = true;
      for (size_t i = 0; i < keep.size(); ++i) {
        if (!keep[i] && (*e.values)[i] != 0.0f) {
          return InvalidInput("AdamW: " + e.name + ": pruned entry " + std::to_string(i) + " is " +
                              std::to_string((*e.values)[i]) +
                              ", not 0: the mask does not match the weights");
        }
      }
    }
    if (opt.norms_only && e.matrix) continue;
    a.state_.push_back(
        {e.name, std::vector<float>(e.trainable(), 0.0f), std::vector<float>(e.trainable(), 0.0f)});
  }
  return a;
}

Status AdamW::Step(ModelWeights* w, const ModelWeights& grads, double lr, AdamWStep* info,
                   ThreadPool* pool) {
  if (!(lr >= 0) || !std::isfinite(lr)) {
    return InvalidInput("AdamW: learning rate must be finite and >= 0, got " + std::to_string(lr));
  }
  SPARQ_RETURN_IF_ERROR(CheckModel(c_, *w).WithContext("AdamW weights"));
  SPARQ_RETURN_IF_ERROR(CheckModel(c_, grads).WithContext("AdamW gradient"));
  std::vector<Entry<std::vector<float>>> we = Walk(*w, masks_, opt_.norms_only);
  const std::vector<Entry<const std::vector<float>>> ge = Walk(grads, masks_, opt_.norms_only);
  if (we.size() != state_.size()) return Internal("AdamW: state does not match the weights");

  // The work in blocks of kStepBlock trainable entries of one tensor, a grid of the shapes alone.
  struct Block {
    size_t tensor;
    int64_t begin, end;
  };
  std::vector<Block> blocks;
  for (size_t j = 0; j < we.size(); ++j) {
    for (int64_t i = 0; i < we[j].trainable(); i += kStepBlock) {
      blocks.push_back({j, i, std::min(we[j].trainable(), i + kStepBlock)});
    }
  }
  auto run = [&](const std::function<void(const Block&, size_t)>& fn) {
    auto task = [&](int64_t b, int) { fn(blocks[b], static_cast<size_t>(b)); };
    const auto count = static_cast<int64_t>(blocks.size());
    if (pool != nullptr && pool->num_threads() > 1) {
      pool->ParallelFor(count, task);
    } else {
      for (int64_t b = 0; b < count; ++b) task(b, 0);
    }
  };
  std::vector<double> part(blocks.size(), 0.0);
  run([&](const Block& b, size_t at) {
    const auto& g = ge[b.tensor];
    double sq = 0.0;
    for (int64_t i = b.begin; i < b.end; ++i) {
      const double x = (*g.values)[g.index(i)];
      sq += x * x;
    }
    part[at] = sq;
  });
  double sq = 0.0;
  for (const double p : part) sq += p;
  const double norm = std::sqrt(sq);
  if (!std::isfinite(norm)) {
    return InvalidInput("AdamW: the gradient's norm is " + std::to_string(norm) +
                        " (a NaN or infinite loss?); weights left unchanged at step " +
                        std::to_string(t_));
  }
  const double clip =
      opt_.max_grad_norm > 0 && norm > opt_.max_grad_norm ? opt_.max_grad_norm / norm : 1.0;
  ++t_;
  const double b1 = opt_.beta1, b2 = opt_.beta2;
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(t_));
  const double bc2 = 1.0 - std::pow(b2, static_cast<double>(t_));
  run([&](const Block& b, size_t) {
    const auto& e = we[b.tensor];
    Slot& st = state_[b.tensor];
    const double decay = e.matrix ? 1.0 - lr * opt_.weight_decay : 1.0;
    // The update uses this step's moments in double; the state keeps them rounded to f32.
    const AdamWUpdateArgs args{clip, b1, 1.0 - b1, b2, 1.0 - b2, bc1, bc2, decay, lr, opt_.eps};
    const int64_t* kept = e.masked() ? e.kept->data() + b.begin : nullptr;
    const int64_t off = e.masked() ? 0 : b.begin;
    AdamWUpdate(args, ge[b.tensor].values->data() + off, e.values->data() + off, kept,
                st.m.data() + b.begin, st.v.data() + b.begin, b.end - b.begin);
  });
  if (info != nullptr) *info = {norm, clip};
  return Status::Ok();
}

AdamWState AdamW::ExportState() const {
  AdamWState s;
  s.steps = t_;
  for (const Slot& st : state_) s.tensors.push_back({st.name, st.m, st.v});
  return s;
}

Status AdamW::ImportState(AdamWState s) {
  if (s.steps < 0) return InvalidInput("AdamW state: steps " + std::to_string(s.steps) + " < 0");
  if (s.tensors.size() != state_.size()) {
    return InvalidInput("AdamW state: " + std::to_string(s.tensors.size()) + " tensors, expected " +
                        std::to_string(state_.size()));
  }
  for (size_t j = 0; j < state_.size(); ++j) {
    const AdamWState::Moments& t = s.tensors[j];
    const std::string at = "AdamW state: " + state_[j].name + ": ";
    if (t.name != state_[j].name)
      return InvalidInput(at + "found tensor '" + t.name + "' in its place");
    if (t.m.size() != state_[j].m.size() || t.v.size() != state_[j].m.size()) {
      return InvalidInput(at + std::to_string(t.m.size()) + " / " + std::to_string(t.v.size()) +
                          " moments, expected " + std::to_string(state_[j].m.size()) +
                          " (the trainable entries)");
    }
    for (size_t i = 0; i < t.m.size(); ++i) {
      // v < 0 would make sqrt(v) a NaN at the next step.
      if (!std::isfinite(t.m[i]) || !std::isfinite(t.v[i]) || t.v[i] < 0) {
        return InvalidInput(at + "entry " + std::to_string(i) + " has m " + std::to_string(t.m[i]) +
                            ", v " + std::to_string(t.v[i]) + " (must be finite, v >= 0)");
      }
    }
  }
  for (size_t j = 0; j < state_.size(); ++j) {
    state_[j].m = std::move(s.tensors[j].m);
    state_[j].v = std::move(s.tensors[j].v);
  }
  t_ = s.steps;
  return Status::Ok();
}

}  // namespace sparq::train
