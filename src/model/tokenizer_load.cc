// Tokenizer construction: from TokenizerData, GGUF metadata, a Hugging Face tokenizer.json, and
// the JSON form stored in .sparq checkpoints.
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "sparq/gguf.h"
#include "sparq/tokenizer.h"
#include "src/model/tokenizer_impl.h"

namespace sparq {

Result<Tokenizer> Tokenizer::FromData(TokenizerData data, const std::string& what) {
  Tokenizer t;
  t.impl_ = std::make_unique<Impl>();
  t.impl_->data = std::move(data);
  SPARQ_RETURN_IF_ERROR(TokenizerImplInit(t.impl_.get(), what));
  return t;
}

namespace {

Status StringArray(const GgufFile& f, const std::string& key, bool required,
                   std::vector<std::string>* out) {
  const GgufValue* v = f.Find(key);
  if (v == nullptr) {
    return required ? InvalidInput(f.path() + ": missing metadata '" + key + "'") : Status::Ok();
  }
  const GgufArray* a = v->AsArray();
  if (a == nullptr || v->array_type != GgufValue::Type::kString) {
    return InvalidInput(f.path() + ": metadata '" + key + "' is not an array of strings");
  }
  out->reserve(a->size());
  for (const GgufValue& e : *a) {
    const std::string* s = e.AsString();
    if (s == nullptr) return InvalidInput(f.path() + ": metadata '" + key + "' has a non-string");
    out->push_back(*s);
  }
  return Status::Ok();
}

Status OptionalInt(const GgufFile& f, const std::string& key, int32_t* out) {
  const GgufValue* v = f.Find(key);
  if (v == nullptr) return Status::Ok();
  auto i = v->AsInt();
  if (!i || *i < -1 || *i > INT32_MAX) {
    return InvalidInput(f.path() + ": metadata '" + key + "' is not a valid token id");
  }
  *out = static_cast<int32_t>(*i);
  return Status::Ok();
}

}  // namespace

Result<Tokenizer> Tokenizer::FromGguf(const GgufFile& f) {
  TokenizerData d;
  const GgufValue* model = f.Find("tokenizer.ggml.model");
  if (model == nullptr || model->AsString() == nullptr) {
    return InvalidInput(f.path() + ": missing metadata 'tokenizer.ggml.model' (no tokenizer)");
  }
  d.model = *model->AsString();
  if (const GgufValue* pre = f.Find("tokenizer.ggml.pre"); pre != nullptr && pre->AsString()) {
    d.pre = *pre->AsString();
  } else {
    d.pre = "gpt2";
  }
  SPARQ_RETURN_IF_ERROR(StringArray(f, "tokenizer.ggml.tokens", true, &d.tokens));
  SPARQ_RETURN_IF_ERROR(StringArray(f, "tokenizer.ggml.merges", true, &d.merges));
  if (const GgufValue* tt = f.Find("tokenizer.ggml.token_type"); tt != nullptr) {
    const GgufArray* a = tt->AsArray();
    if (a == nullptr) {
      return InvalidInput(f.path() + ": metadata 'tokenizer.ggml.token_type' is not an array");
    }
    d.token_types.reserve(a->size());
    for (const GgufValue& e : *a) {
      auto i = e.AsInt();
      if (!i || *i < 0 || *i > 6) {
        return InvalidInput(f.path() + ": bad entry in 'tokenizer.ggml.token_type'");
      }
      d.token_types.push_back(static_cast<int32_t>(*i));
    }
  }
  SPARQ_RETURN_IF_ERROR(OptionalInt(f, "tokenizer.ggml.bos_token_id", &d.bos_id));
  SPARQ_RETURN_IF_ERROR(OptionalInt(f, "tokenizer.ggml.eos_token_id", &d.eos_id));
  SPARQ_RETURN_IF_ERROR(OptionalInt(f, "tokenizer.ggml.unknown_token_id", &d.unk_id));
  SPARQ_RETURN_IF_ERROR(OptionalInt(f, "tokenizer.ggml.padding_token_id", &d.pad_id));
  if (const GgufValue* ab = f.Find("tokenizer.ggml.add_bos_token"); ab != nullptr) {
    if (const bool* b = std::get_if<bool>(&ab->v)) d.add_bos = *b;
  }
  if (const GgufValue* ct = f.Find("tokenizer.chat_template"); ct != nullptr) {
    if (ct->AsString() == nullptr) {
      return InvalidInput(f.path() + ": metadata 'tokenizer.chat_template' is not a string");
    }
    d.chat_template = *ct->AsString();
  }
  return FromData(std::move(d), f.path());
}

std::string TokenizerData::ToJson() const {
  nlohmann::json j;
  j["model"] = model;
  j["pre"] = pre;
  j["tokens"] = tokens;
  j["token_types"] = token_types;
  j["merges"] = merges;
  j["bos_id"] = bos_id;
  j["eos_id"] = eos_id;
  j["unk_id"] = unk_id;
  j["pad_id"] = pad_id;
  j["add_bos"] = add_bos;
  if (!chat_template.empty()) j["chat_template"] = chat_template;  // older files have none
  return j.dump();
}

Result<TokenizerData> TokenizerData::FromJson(std::string_view json, const std::string& what) {
  nlohmann::json j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return InvalidInput(what + ": tokenizer is not JSON");
  TokenizerData d;
  try {
    d.model = j.at("model").get<std::string>();
    d.pre = j.at("pre").get<std::string>();
    d.tokens = j.at("tokens").get<std::vector<std::string>>();
    d.token_types = j.at("token_types").get<std::vector<int32_t>>();
    d.merges = j.at("merges").get<std::vector<std::string>>();
    d.bos_id = j.at("bos_id").get<int32_t>();
    d.eos_id = j.at("eos_id").get<int32_t>();
    d.unk_id = j.at("unk_id").get<int32_t>();
    d.pad_id = j.at("pad_id").get<int32_t>();
    d.add_bos = j.at("add_bos").get<bool>();
    d.chat_template = j.value("chat_template", "");
  } catch (const nlohmann::json::exception& e) {
    return InvalidInput(what + ": bad tokenizer JSON: " + e.what());
  }
  return d;
}

namespace {

// tokenizer_config.json's chat_template: a string, or [{"name": ..., "template": ...}, ...].
Result<std::string> HfChatTemplate(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::string();
  std::stringstream ss;
  ss << in.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return InvalidInput(path + ": not a JSON object");
  const auto it = j.find("chat_template");
  if (it == j.end() || it->is_null()) return std::string();
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {
    for (const auto& e : *it) {
      if (e.is_object() && e.value("name", "") == "default" && e.contains("template") &&
          e["template"].is_string()) {
        return e["template"].get<std::string>();
      }
    }
    return std::string();  // only named templates (tool use, ...): none for plain chat
  }
  return InvalidInput(path + ": 'chat_template' is neither a string nor a list of templates");
}

}  // namespace

Result<Tokenizer> Tokenizer::FromHfJson(const std::string& path, const std::string& config_path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return IoError(path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return InvalidInput(path + ": not JSON");
  TokenizerData d;
  try {
    const nlohmann::json& m = j.at("model");
    if (m.value("type", "") != "BPE") {
      return Unsupported(path + ": tokenizer model type '" + m.value("type", "?") +
                         "' is not supported (only BPE)");
    }
    const auto& vocab = m.at("vocab");
    int64_t max_id = -1;
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      max_id = std::max<int64_t>(max_id, it.value().get<int64_t>());
    }
    for (const auto& a : j.value("added_tokens", nlohmann::json::array())) {
      max_id = std::max<int64_t>(max_id, a.at("id").get<int64_t>());
    }
    if (max_id < 0 || max_id >= (int64_t{1} << 30)) {
      return InvalidInput(path + ": bad vocabulary size");
    }
    d.tokens.assign(max_id + 1, "");
    d.token_types.assign(max_id + 1, static_cast<int32_t>(TokenType::kNormal));
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      const int64_t id = it.value().get<int64_t>();
      if (id < 0) return InvalidInput(path + ": negative token id for '" + it.key() + "'");
      d.tokens[id] = it.key();
    }
    for (const auto& a : j.value("added_tokens", nlohmann::json::array())) {
      const int64_t id = a.at("id").get<int64_t>();
      if (id < 0) return InvalidInput(path + ": negative added token id");
      d.tokens[id] = a.at("content").get<std::string>();
      d.token_types[id] = static_cast<int32_t>(a.value("special", false) ? TokenType::kControl
                                                                         : TokenType::kUserDefined);
    }
    for (const auto& mg : m.at("merges")) {
      if (mg.is_string()) {
        d.merges.push_back(mg.get<std::string>());
      } else {  // newer files: ["left", "right"]
        d.merges.push_back(mg.at(0).get<std::string>() + " " + mg.at(1).get<std::string>());
      }
    }
    // Pre-tokenizer: ByteLevel alone is GPT-2's; with individual Digits first it is "smollm".
    d.pre = "gpt2";
    const nlohmann::json& pt = j.at("pre_tokenizer");
    if (pt.is_object() && pt.value("type", "") == "Sequence") {
      for (const auto& p : pt.at("pretokenizers")) {
        if (p.value("type", "") == "Digits" && p.value("individual_digits", false)) {
          d.pre = "smollm";
        }
      }
    } else if (!pt.is_object() || pt.value("type", "") != "ByteLevel") {
      return Unsupported(path + ": pre-tokenizer is not ByteLevel (or Digits + ByteLevel)");
    }
  } catch (const nlohmann::json::exception& e) {
    return InvalidInput(path + ": bad tokenizer.json: " + e.what());
  }
  // Special ids by their usual names (tokenizer_config.json is read for the chat template only).
  for (size_t i = 0; i < d.tokens.size(); ++i) {
    const std::string& s = d.tokens[i];
    if (s == "<|endoftext|>" && d.bos_id < 0) d.bos_id = static_cast<int32_t>(i);
    if (s == "<|endoftext|>" && d.unk_id < 0) d.unk_id = static_cast<int32_t>(i);
    if (s == "<|im_start|>" || s == "<s>") d.bos_id = static_cast<int32_t>(i);
    if (s == "<|im_end|>" || s == "</s>") d.eos_id = static_cast<int32_t>(i);
  }
  if (!config_path.empty()) {
    SPARQ_ASSIGN_OR_RETURN(d.chat_template, HfChatTemplate(config_path));
  }
  return FromData(std::move(d), path);
}

}  // namespace sparq
