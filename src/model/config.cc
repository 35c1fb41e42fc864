// LlamaConfig: from GGUF metadata, config.json, and the JSON form stored in .sparq checkpoints.
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "sparq/gguf.h"
#include "sparq/model.h"

namespace sparq {

Status LlamaConfig::Validate(const std::string& what) const {
  auto bad = [&](const std::string& msg) { return InvalidInput(what + ": " + msg); };
  constexpr int64_t kMaxDim = int64_t{1} << 20;  // far above any real model, keeps products small
  for (auto [name, v] : {std::pair{"n_vocab", n_vocab}, {"n_embd", n_embd}, {"n_layer", n_layer},
                         {"n_head", n_head}, {"n_head_kv", n_head_kv}, {"n_ff", n_ff}}) {
    if (v <= 0 || v > kMaxDim) {
      return bad(std::string(name) + " = " + std::to_string(v) + " is out of range [1, 2^20]");
    }
  }
  if (n_layer > 4096) return bad("n_layer = " + std::to_string(n_layer) + " is implausible");
  if (n_embd % n_head != 0) {
    return bad("n_embd " + std::to_string(n_embd) + " is not a multiple of n_head " +
               std::to_string(n_head));
  }
  if (n_head % n_head_kv != 0) {
    return bad("n_head " + std::to_string(n_head) + " is not a multiple of n_head_kv " +
               std::to_string(n_head_kv));
  }
  if (rope_dim <= 0 || rope_dim > head_dim() || rope_dim % 2 != 0) {
    return bad("rope dimension " + std::to_string(rope_dim) + " must be even and in [2, " +
               std::to_string(head_dim()) + "]");
  }
  if (!(rope_theta > 0) || !(rms_eps > 0) || rms_eps > 1) {
    return bad("rope theta and RMS epsilon must be positive");
  }
  return Status::Ok();
}

namespace {

Status GetInt(const GgufFile& f, const std::string& key, bool required, int64_t* out) {
  const GgufValue* v = f.Find(key);
  if (v == nullptr) {
    return required ? InvalidInput(f.path() + ": missing metadata '" + key + "'") : Status::Ok();
  }
  auto i = v->AsInt();
  if (!i) return InvalidInput(f.path() + ": metadata '" + key + "' is not an integer");
  *out = *i;
  return Status::Ok();
}

Status GetFloat(const GgufFile& f, const std::string& key, double* out) {
  const GgufValue* v = f.Find(key);
  if (v == nullptr) return Status::Ok();
  auto d = v->AsFloat();
  if (!d) return InvalidInput(f.path() + ": metadata '" + key + "' is not a number");
  *out = *d;
  return Status::Ok();
}

}  // namespace

Result<LlamaConfig> LlamaConfig::FromGguf(const GgufFile& f) {
  const GgufValue* arch = f.Find("general.architecture");
  if (arch == nullptr || arch->AsString() == nullptr) {
    return InvalidInput(f.path() + ": missing metadata 'general.architecture'");
  }
  if (*arch->AsString() != "llama") {
    return Unsupported(f.path() + ": architecture '" + *arch->AsString() +
                       "' is not supported (only 'llama')");
  }
  LlamaConfig c;
  SPARQ_RETURN_IF_ERROR(GetInt(f, "llama.block_count", true, &c.n_layer));
  SPARQ_RETURN_IF_ERROR(GetInt(f, "llama.embedding_length", true, &c.n_embd));
  SPARQ_RETURN_IF_ERROR(GetInt(f, "llama.feed_forward_length", true, &c.n_ff));
  SPARQ_RETURN_IF_ERROR(GetInt(f, "llama.attention.head_count", true, &c.n_head));
  c.n_head_kv = c.n_head;
  SPARQ_RETURN_IF_ERROR(GetInt(f, "llama.attention.head_count_kv", false, &c.n_head_kv));
  SPARQ_RETURN_IF_ERROR(GetInt(f, "llama.context_length", false, &c.n_ctx_train));
  c.rope_dim = c.n_head > 0 ? c.n_embd / c.n_head : 0;
  SPARQ_RETURN_IF_ERROR(GetInt(f, "llama.rope.dimension_count", false, &c.rope_dim));
  SPARQ_RETURN_IF_ERROR(GetFloat(f, "llama.rope.freq_base", &c.rope_theta));
  SPARQ_RETURN_IF_ERROR(GetFloat(f, "llama.attention.layer_norm_rms_epsilon", &c.rms_eps));
  // Vocabulary: the key if present, else the token list, else the embedding's rows.
  if (f.Find("llama.vocab_size") != nullptr) {
    SPARQ_RETURN_IF_ERROR(GetInt(f, "llama.vocab_size", true, &c.n_vocab));
  } else if (const GgufValue* t = f.Find("tokenizer.ggml.tokens"); t && t->AsArray()) {
    c.n_vocab = static_cast<int64_t>(t->AsArray()->size());
  } else if (const GgufTensorInfo* e = f.FindTensor("token_embd.weight"); e && e->ne.size() == 2) {
    c.n_vocab = e->ne[1];
  }
  c.tied_output = f.FindTensor("output.weight") == nullptr;
  SPARQ_RETURN_IF_ERROR(c.Validate(f.path()));
  return c;
}

Result<LlamaConfig> LlamaConfig::FromHfConfig(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return IoError(path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return InvalidInput(path + ": not JSON");
  LlamaConfig c;
  try {
    const std::string type = j.value("model_type", "");
    if (type != "llama") {
      return Unsupported(path + ": model_type '" + type + "' is not supported (only 'llama')");
    }
    c.n_vocab = j.at("vocab_size").get<int64_t>();
    c.n_embd = j.at("hidden_size").get<int64_t>();
    c.n_layer = j.at("num_hidden_layers").get<int64_t>();
    c.n_head = j.at("num_attention_heads").get<int64_t>();
    c.n_head_kv = j.value("num_key_value_heads", c.n_head);
    c.n_ff = j.at("intermediate_size").get<int64_t>();
    c.n_ctx_train = j.value("max_position_embeddings", int64_t{0});
    c.rope_theta = j.value("rope_theta", 10000.0);
    c.rms_eps = j.value("rms_norm_eps", 1e-5);
    c.tied_output = j.value("tie_word_embeddings", false);
    c.rope_dim = c.n_head > 0 ? c.n_embd / c.n_head : 0;
    // What transformers' LlamaForCausalLM can be told to do that this runtime does not do.
    const std::string act = j.value("hidden_act", "silu");
    if (act != "silu") {
      return Unsupported(path + ": hidden_act '" + act + "' is not supported (only 'silu')");
    }
    for (const char* key : {"attention_bias", "mlp_bias"}) {
      if (j.value(key, false)) return Unsupported(path + ": " + key + " = true is not supported");
    }
    if (auto rs = j.find("rope_scaling"); rs != j.end() && !rs->is_null()) {
      return Unsupported(path + ": rope_scaling " + rs->dump() + " is not supported");
    }
    if (auto hd = j.find("head_dim"); hd != j.end() && !hd->is_null() &&
                                      hd->get<int64_t>() != c.rope_dim) {
      return Unsupported(path + ": head_dim " + hd->dump() +
                         " differs from hidden_size / num_attention_heads = " +
                         std::to_string(c.rope_dim) + " (not supported)");
    }
  } catch (const nlohmann::json::exception& e) {
    return InvalidInput(path + ": bad config.json: " + e.what());
  }
  SPARQ_RETURN_IF_ERROR(c.Validate(path));
  return c;
}

std::string LlamaConfig::ToJson() const {
  nlohmann::json j = {{"architecture", "llama"},   {"n_vocab", n_vocab},
                      {"n_embd", n_embd},          {"n_layer", n_layer},
                      {"n_head", n_head},          {"n_head_kv", n_head_kv},
                      {"n_ff", n_ff},              {"n_ctx_train", n_ctx_train},
                      {"rope_dim", rope_dim},      {"rope_theta", rope_theta},
                      {"rms_eps", rms_eps},        {"tied_output", tied_output}};
  return j.dump();
}

Result<LlamaConfig> LlamaConfig::FromJson(std::string_view json, const std::string& what) {
  nlohmann::json j = nlohmann::json::parse(json, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return InvalidInput(what + ": model config is not JSON");
  LlamaConfig c;
  try {
    if (j.at("architecture").get<std::string>() != "llama") {
      return Unsupported(what + ": architecture '" + j.at("architecture").get<std::string>() +
                         "' is not supported");
    }
    c.n_vocab = j.at("n_vocab").get<int64_t>();
    c.n_embd = j.at("n_embd").get<int64_t>();
    c.n_layer = j.at("n_layer").get<int64_t>();
    c.n_head = j.at("n_head").get<int64_t>();
    c.n_head_kv = j.at("n_head_kv").get<int64_t>();
    c.n_ff = j.at("n_ff").get<int64_t>();
    c.n_ctx_train = j.at("n_ctx_train").get<int64_t>();
    c.rope_dim = j.at("rope_dim").get<int64_t>();
    c.rope_theta = j.at("rope_theta").get<double>();
    c.rms_eps = j.at("rms_eps").get<double>();
    c.tied_output = j.at("tied_output").get<bool>();
  } catch (const nlohmann::json::exception& e) {
    return InvalidInput(what + ": bad model config JSON: " + e.what());
  }
  SPARQ_RETURN_IF_ERROR(c.Validate(what));
  return c;
}

std::string_view SlotName(LinearSlot s) {
  static constexpr std::string_view kNames[kNumSlots] = {
      "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"};
  return kNames[static_cast<int>(s)];
}

std::array<int64_t, 2> SlotShape(const LlamaConfig& c, LinearSlot s) {
  switch (s) {
    case LinearSlot::kQ: return {c.n_embd, c.n_embd};
    case LinearSlot::kK:
    case LinearSlot::kV: return {c.kv_dim(), c.n_embd};
    case LinearSlot::kO: return {c.n_embd, c.n_embd};
    case LinearSlot::kGate:
    case LinearSlot::kUp: return {c.n_ff, c.n_embd};
    case LinearSlot::kDown: return {c.n_embd, c.n_ff};
  }
  return {0, 0};
}

}  // namespace sparq
