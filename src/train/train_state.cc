// The train state file (sparq/train_loop.h): a safetensors file of the weights, the kept lists
// and AdamW's moments, with the config, the options and the step in its __metadata__. The load
// trusts nothing: every tensor is checked against the config before it becomes a TrainState.
#include <cmath>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "sparq/safetensors.h"
#include "sparq/tensor.h"
#include "sparq/train_loop.h"
#include "sparq/train_model.h"
#include "sparq/train_optim.h"
#include "src/train/model_check.h"

namespace sparq::train {
namespace {

constexpr const char* kVersionKey = "sparq.train_state";
constexpr const char* kModelKey = "sparq.model";
constexpr const char* kTrainKey = "sparq.train";
const std::string kMaskPrefix = "mask.";
const std::string kMomentM = "adamw.m.";
const std::string kMomentV = "adamw.v.";

// Every weight tensor with its name and shape, in AdamW's walk order.
struct WeightRef {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float>* values;
  std::vector<int64_t>* kept;  // null for the norms and token_embd
};
std::vector<WeightRef> Weights(const LlamaConfig& c, ModelWeights* w,
                               std::vector<BlockMasks>* masks) {
  std::vector<WeightRef> r = {{"token_embd.weight", {c.n_vocab, c.n_embd}, &w->token_embd, nullptr},
                              {"output_norm.weight", {c.n_embd}, &w->output_norm, nullptr}};
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const std::string blk = BlockName(static_cast<int>(l));
    BlockWeights& b = w->blocks[l];
    r.push_back({blk + "attn_norm.weight", {c.n_embd}, &b.attn_norm, nullptr});
    r.push_back({blk + "ffn_norm.weight", {c.n_embd}, &b.ffn_norm, nullptr});
    for (int s = 0; s < kNumSlots; ++s) {
      const auto slot = static_cast<LinearSlot>(s);
      const auto [m, k] = SlotShape(c, slot);
      r.push_back({blk + std::string(SlotName(slot)) + ".weight",
                   {m, k},
                   &b.linear[s],
                   masks->empty() ? nullptr : &(*masks)[l].kept[s]});
    }
  }
  return r;
}

Tensor ViewOf(DType t, const void* data, int64_t count) { return Tensor::View(t, {count}, data); }

nlohmann::json OptionsJson(const TrainState& s) {
  const TrainOptions& o = s.options;
  return {{"step", s.optim.steps},
          {"seed", o.seed},
          {"seq_len", o.seq_len},
          {"accum", o.accum},
          {"checkpoint_every", o.checkpoint_every},
          {"data_tokens", s.data_tokens},
          {"data_hash", s.data_hash},
          {"loss",
           {{"ce_weight", o.ce_weight},
            {"kl_weight", o.kl_weight},
            {"tau", o.tau},
            {"hidden_weight", o.hidden_weight}}},
          {"lr",
           {{"peak", o.schedule.peak},
            {"warmup_steps", o.schedule.warmup_steps},
            {"total_steps", o.schedule.total_steps},
            {"min_ratio", o.schedule.min_ratio}}},
          {"adamw",
           {{"beta1", o.adamw.beta1},
            {"beta2", o.adamw.beta2},
            {"eps", o.adamw.eps},
            {"weight_decay", o.adamw.weight_decay},
            {"max_grad_norm", o.adamw.max_grad_norm},
            {"norms_only", o.adamw.norms_only}}}};
}

// Reads "a.b" of j as T, or an error naming the field.
template <class T>
Result<T> Field(const nlohmann::json& j, const std::string& path, const std::string& field) {
  const nlohmann::json* at = &j;
  size_t from = 0;
  while (true) {
    const size_t dot = field.find('.', from);
    const std::string key = field.substr(from, dot == std::string::npos ? dot : dot - from);
    if (!at->is_object() || !at->contains(key)) {
      return InvalidInput(path + ": " + kTrainKey + ": missing field '" + field + "'");
    }
    at = &(*at)[key];
    if (dot == std::string::npos) break;
    from = dot + 1;
  }
  const bool ok = std::is_same_v<T, bool>       ? at->is_boolean()
                  : std::is_same_v<T, double>   ? at->is_number()
                  : std::is_same_v<T, uint64_t> ? at->is_number_unsigned()
                                                : at->is_number_integer();
  if (!ok)
    return InvalidInput(path + ": " + kTrainKey + ": field '" + field + "' is " + at->dump());
  return at->get<T>();
}

// The options, and into *step and *s the step and the data fingerprint.
Result<TrainOptions> ParseOptions(const std::string& json, const std::string& path, int64_t* step,
                                  TrainState* s) {
  const nlohmann::json j = nlohmann::json::parse(json, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return InvalidInput(path + ": metadata '" + kTrainKey + "' is not a JSON object");
  }
  TrainOptions o;
  SPARQ_ASSIGN_OR_RETURN(*step, Field<int64_t>(j, path, "step"));
  SPARQ_ASSIGN_OR_RETURN(o.seed, Field<uint64_t>(j, path, "seed"));
  SPARQ_ASSIGN_OR_RETURN(o.seq_len, Field<int64_t>(j, path, "seq_len"));
  SPARQ_ASSIGN_OR_RETURN(o.accum, Field<int64_t>(j, path, "accum"));
  SPARQ_ASSIGN_OR_RETURN(o.checkpoint_every, Field<int64_t>(j, path, "checkpoint_every"));
  SPARQ_ASSIGN_OR_RETURN(s->data_tokens, Field<int64_t>(j, path, "data_tokens"));
  SPARQ_ASSIGN_OR_RETURN(s->data_hash, Field<uint64_t>(j, path, "data_hash"));
  if (s->data_tokens < 0) {
    return InvalidInput(path + ": " + kTrainKey + ": data_tokens " +
                        std::to_string(s->data_tokens) + " < 0");
  }
  SPARQ_ASSIGN_OR_RETURN(o.ce_weight, Field<double>(j, path, "loss.ce_weight"));
  SPARQ_ASSIGN_OR_RETURN(o.kl_weight, Field<double>(j, path, "loss.kl_weight"));
  SPARQ_ASSIGN_OR_RETURN(o.tau, Field<double>(j, path, "loss.tau"));
  // Absent in states written before SquareHead existed: those had no hidden-state term.
  if (j.at("loss").contains("hidden_weight")) {
    SPARQ_ASSIGN_OR_RETURN(o.hidden_weight, Field<double>(j, path, "loss.hidden_weight"));
  }
  SPARQ_ASSIGN_OR_RETURN(o.schedule.peak, Field<double>(j, path, "lr.peak"));
  SPARQ_ASSIGN_OR_RETURN(o.schedule.warmup_steps, Field<int64_t>(j, path, "lr.warmup_steps"));
  SPARQ_ASSIGN_OR_RETURN(o.schedule.total_steps, Field<int64_t>(j, path, "lr.total_steps"));
  SPARQ_ASSIGN_OR_RETURN(o.schedule.min_ratio, Field<double>(j, path, "lr.min_ratio"));
  SPARQ_ASSIGN_OR_RETURN(o.adamw.beta1, Field<double>(j, path, "adamw.beta1"));
  SPARQ_ASSIGN_OR_RETURN(o.adamw.beta2, Field<double>(j, path, "adamw.beta2"));
  SPARQ_ASSIGN_OR_RETURN(o.adamw.eps, Field<double>(j, path, "adamw.eps"));
  SPARQ_ASSIGN_OR_RETURN(o.adamw.weight_decay, Field<double>(j, path, "adamw.weight_decay"));
  SPARQ_ASSIGN_OR_RETURN(o.adamw.max_grad_norm, Field<double>(j, path, "adamw.max_grad_norm"));
  // Absent in states written before norm-only runs existed: those trained every weight.
  if (j.at("adamw").contains("norms_only")) {
    SPARQ_ASSIGN_OR_RETURN(o.adamw.norms_only, Field<bool>(j, path, "adamw.norms_only"));
  }
  return o;
}

// The tensor `name` of f as a copy, checked for dtype and shape; floats checked finite.
template <class T>
Result<std::vector<T>> Read(const SafetensorsFile& f, const std::string& name, DType dtype,
                            const std::vector<int64_t>& shape, std::set<std::string>* seen) {
  const std::string at = f.path() + ": tensor '" + name + "': ";
  const SafetensorsEntry* e = f.Find(name);
  if (e == nullptr) return InvalidInput(at + "missing");
  seen->insert(name);
  if (e->tensor.dtype() != dtype) {
    return InvalidInput(at + "dtype " + std::string(DTypeName(e->tensor.dtype())) + ", expected " +
                        std::string(DTypeName(dtype)));
  }
  if (e->tensor.shape() != shape) {
    std::string got, want;
    for (int64_t d : e->tensor.shape()) got += (got.empty() ? "" : ", ") + std::to_string(d);
    for (int64_t d : shape) want += (want.empty() ? "" : ", ") + std::to_string(d);
    return InvalidInput(at + "shape [" + got + "], expected [" + want + "]");
  }
  const T* p = e->tensor.data_as<T>();
  std::vector<T> v(p, p + e->tensor.numel());
  if constexpr (std::is_floating_point_v<T>) {
    for (size_t i = 0; i < v.size(); ++i) {
      if (!std::isfinite(v[i])) {
        return InvalidInput(at + "entry " + std::to_string(i) + " is " + std::to_string(v[i]));
      }
    }
  }
  return v;
}

}  // namespace

Result<TrainState> NewTrainState(const LlamaConfig& c, ModelWeights w,
                                 std::vector<BlockMasks> masks, const TrainOptions& opt) {
  SPARQ_RETURN_IF_ERROR(c.Validate("train state config"));
  SPARQ_RETURN_IF_ERROR(opt.Validate(c));
  SPARQ_ASSIGN_OR_RETURN(AdamW a, AdamW::Create(c, w, masks, opt.adamw));
  TrainState s;
  s.config = c;
  s.weights = std::move(w);
  s.masks = std::move(masks);
  s.optim = a.ExportState();
  s.options = opt;
  return s;
}

Status SaveTrainState(const std::string& path, const TrainState& state) {
  // A state that would not load is refused here, before it replaces a good file.
  SPARQ_RETURN_IF_ERROR(state.options.Validate(state.config).WithContext(path));
  SPARQ_RETURN_IF_ERROR(CheckModel(state.config, state.weights, state.masks).WithContext(path));
  TrainState& s = const_cast<TrainState&>(state);  // Weights() hands out pointers; none written
  std::vector<NamedTensor> tensors;
  for (const WeightRef& r : Weights(s.config, &s.weights, &s.masks)) {
    tensors.push_back({r.name, Tensor::View(DType::kF32, r.shape, r.values->data())});
    if (r.kept != nullptr && !r.kept->empty()) {
      tensors.push_back({kMaskPrefix + r.name, ViewOf(DType::kI64, r.kept->data(),
                                                      static_cast<int64_t>(r.kept->size()))});
    }
  }
  for (const AdamWState::Moments& t : state.optim.tensors) {
    const auto n = static_cast<int64_t>(t.m.size());
    tensors.push_back({kMomentM + t.name, ViewOf(DType::kF32, t.m.data(), n)});
    tensors.push_back({kMomentV + t.name, ViewOf(DType::kF32, t.v.data(), n)});
  }
  const std::map<std::string, std::string> meta = {
      {kVersionKey, std::to_string(kTrainStateVersion)},
      {kModelKey, state.config.ToJson()},
      {kTrainKey, OptionsJson(state).dump()}};
  return WriteSafetensors(path, tensors, meta);
}

namespace {

// The state in f (already a valid safetensors file); errors start with f's path.
Result<TrainState> FromFile(const SafetensorsFile& f) {
  const std::string& path = f.path();
  auto meta = [&](const char* key) -> const std::string* {
    auto it = f.metadata().find(key);
    return it == f.metadata().end() ? nullptr : &it->second;
  };
  if (meta(kVersionKey) == nullptr) {
    return InvalidInput(path + ": not a sparq train state (no metadata '" + kVersionKey + "')");
  }
  if (*meta(kVersionKey) != std::to_string(kTrainStateVersion)) {
    return Unsupported(path + ": train state version '" + *meta(kVersionKey) +
                       "', this sparq reads " + std::to_string(kTrainStateVersion));
  }
  for (const char* key : {kModelKey, kTrainKey}) {
    if (meta(key) == nullptr) return InvalidInput(path + ": missing metadata '" + key + "'");
  }
  TrainState s;
  SPARQ_ASSIGN_OR_RETURN(s.config, LlamaConfig::FromJson(*meta(kModelKey), path));
  SPARQ_RETURN_IF_ERROR(s.config.Validate(path + ": " + kModelKey));
  int64_t step = 0;
  SPARQ_ASSIGN_OR_RETURN(s.options, ParseOptions(*meta(kTrainKey), path, &step, &s));
  SPARQ_RETURN_IF_ERROR(s.options.Validate(s.config).WithContext(path));

  std::set<std::string> seen;
  // Each layer has 9 weight tensors: a config asking for more than the file holds is refused
  // before anything is sized by it.
  if (s.config.n_layer > static_cast<int64_t>(f.tensors().size()) / 9) {
    return InvalidInput(path + ": " + kModelKey + ": n_layer " + std::to_string(s.config.n_layer) +
                        " but the file holds only " + std::to_string(f.tensors().size()) +
                        " tensors");
  }
  s.weights.blocks.resize(s.config.n_layer);
  bool any_mask = false;
  for (const SafetensorsEntry& e : f.tensors()) any_mask |= e.name.starts_with(kMaskPrefix);
  if (any_mask) s.masks.resize(s.config.n_layer);
  for (const WeightRef& r : Weights(s.config, &s.weights, &s.masks)) {
    SPARQ_ASSIGN_OR_RETURN(*r.values, Read<float>(f, r.name, DType::kF32, r.shape, &seen));
    const SafetensorsEntry* m = f.Find(kMaskPrefix + r.name);
    if (m == nullptr) continue;
    if (r.kept == nullptr)
      return InvalidInput(path + ": tensor '" + m->name + "': not a linear slot");
    if (m->tensor.rank() != 1) {
      return InvalidInput(path + ": tensor '" + m->name + "': rank " +
                          std::to_string(m->tensor.rank()) + ", expected 1");
    }
    SPARQ_ASSIGN_OR_RETURN(*r.kept,
                           Read<int64_t>(f, m->name, DType::kI64, {m->tensor.shape()[0]}, &seen));
  }
  // Index ranges and repeats (CheckModel), then the pruned entries are 0 (AdamW::Create).
  SPARQ_RETURN_IF_ERROR(CheckModel(s.config, s.weights, s.masks).WithContext(path));
  Result<AdamW> created = AdamW::Create(s.config, s.weights, s.masks, s.options.adamw);
  if (!created.ok()) return created.status().WithContext(path);
  AdamW a = std::move(created).value();
  AdamWState st = a.ExportState();
  st.steps = step;
  for (AdamWState::Moments& t : st.tensors) {
    const std::vector<int64_t> shape = {static_cast<int64_t>(t.m.size())};
    SPARQ_ASSIGN_OR_RETURN(t.m, Read<float>(f, kMomentM + t.name, DType::kF32, shape, &seen));
    SPARQ_ASSIGN_OR_RETURN(t.v, Read<float>(f, kMomentV + t.name, DType::kF32, shape, &seen));
  }
  SPARQ_RETURN_IF_ERROR(a.ImportState(st).WithContext(path));
  for (const SafetensorsEntry& e : f.tensors()) {
    if (!seen.contains(e.name)) return InvalidInput(path + ": unexpected tensor '" + e.name + "'");
  }
  s.optim = a.ExportState();
  return s;
}

}  // namespace

Result<TrainState> LoadTrainState(const std::string& path) {
  SPARQ_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::Open(path));
  return FromFile(f);
}

Result<TrainState> LoadTrainStateFromMemory(const void* data, uint64_t size,
                                            const std::string& name) {
  SPARQ_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::FromMemory(data, size, name));
  return FromFile(f);
}

}  // namespace sparq::train
