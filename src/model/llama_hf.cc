// LlamaModel::FromHfFolder: a Hugging Face Llama folder as transformers saves it.
//
//   config.json                      LlamaConfig::FromHfConfig
//   tokenizer.json                   Tokenizer::FromHfJson (tokenizer_config.json: its chat_template)
//   model.safetensors.index.json     {"weight_map": {tensor: shard file}}, if sharded; else
//   model.safetensors                one file; else every *.safetensors in the folder
//
// Names map to the runtime's (GGUF) slots: model.embed_tokens -> token_embd, model.norm ->
// output_norm, lm_head -> output (ignored when tie_word_embeddings), and per layer i
// input_layernorm -> attn_norm, post_attention_layernorm -> ffn_norm, self_attn.{q,k,v,o}_proj ->
// attn_{q,k,v,output}, mlp.{gate,up,down}_proj -> ffn_{gate,up,down}.
//
// RoPE layout: transformers rotates the two halves of each head (dims i and i + head_dim/2),
// llama.cpp (and this runtime) rotates adjacent pairs (2i, 2i+1). llama.cpp's converter
// (convert_hf_to_gguf.py, LlamaModel.permute) therefore reorders the rows of q_proj (with
// num_attention_heads) and k_proj (with num_key_value_heads):
//   w.reshape(n_head, 2, head_dim / 2, k).swapaxes(1, 2).reshape(m, k)
// i.e. GGUF row h*head_dim + 2i + j is HF row h*head_dim + j*head_dim/2 + i. Loading applies the
// same reordering, so a folder and its GGUF conversion are the same model.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "sparq/safetensors.h"
#include "src/model/llama_internal.h"

namespace sparq {
namespace {

namespace fs = std::filesystem;

constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kSingleName = "model.safetensors";

bool IsRegularFile(const std::string& path) {
  std::error_code ec;
  return fs::is_regular_file(path, ec);
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// The folder's safetensors files and which of them holds each tensor.
class HfShards {
 public:
  static Result<HfShards> Open(const std::string& dir);

  // The tensor as f32 with the expected shape, finite. Errors name the file and the tensor.
  Result<Tensor> ReadF32(const std::string& name, const std::vector<int64_t>& shape);
  // The first tensor that no Read* call asked for and that is not in `ignorable`; "" if none.
  std::string FirstUnused(const std::function<bool(const std::string&)>& ignorable) const;
  // The file that holds `name` (for messages).
  std::string FileOf(const std::string& name) const;

 private:
  Status AddFile(const std::string& path);

  std::string dir_;
  std::string index_path_;  // empty without an index
  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t> where_;  // tensor -> index into files_
  std::set<std::string> used_;
};

Status HfShards::AddFile(const std::string& path) {
  SPARQ_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::Open(path));
  files_.push_back(std::move(f));
  return Status::Ok();
}

Result<HfShards> HfShards::Open(const std::string& dir) {
  HfShards s;
  s.dir_ = dir;
  const std::string index = dir + "/" + kIndexName;
  if (IsRegularFile(index)) {
    s.index_path_ = index;
    std::ifstream in(index, std::ios::binary);
    if (!in) return IoError(index + ": cannot open");
    std::stringstream ss;
    ss << in.rdbuf();
    const nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, false);
    if (j.is_discarded() || !j.is_object()) return InvalidInput(index + ": not JSON");
    auto wm = j.find("weight_map");
    if (wm == j.end() || !wm->is_object() || wm->empty()) {
      return InvalidInput(index + ": no \"weight_map\" object (tensor name -> shard file)");
    }
    std::map<std::string, size_t> shard_ids;
    for (auto it = wm->begin(); it != wm->end(); ++it) {
      if (!it.value().is_string()) {
        return InvalidInput(index + ": weight_map entry for '" + it.key() + "' is not a string");
      }
      const std::string shard = it.value().get<std::string>();
      // Shards are plain file names next to the index; nothing may point outside the folder.
      if (shard.empty() || shard == "." || shard == ".." || shard.find('/') != std::string::npos) {
        return InvalidInput(index + ": tensor '" + it.key() + "' is in shard '" + shard +
                            "', which is not a file name in the folder");
      }
      auto [sid, fresh] = shard_ids.emplace(shard, s.files_.size());
      if (fresh) {
        const std::string path = dir + "/" + shard;
        if (!IsRegularFile(path)) {
          return InvalidInput(index + ": shard '" + shard + "' (holding tensor '" + it.key() +
                              "') is missing: no file " + path);
        }
        SPARQ_RETURN_IF_ERROR(s.AddFile(path));
      }
      const SafetensorsFile& f = s.files_[sid->second];
      if (f.Find(it.key()) == nullptr) {
        return InvalidInput(index + ": tensor '" + it.key() + "' is mapped to " + f.path() +
                            ", which does not contain it");
      }
      s.where_[it.key()] = sid->second;
    }
    return s;
  }
  std::vector<std::string> paths;
  if (IsRegularFile(dir + "/" + kSingleName)) {
    paths.push_back(dir + "/" + kSingleName);
  } else {
    std::error_code ec;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (name.size() > 12 && name.ends_with(".safetensors") && IsRegularFile(it->path())) {
        paths.push_back(it->path().string());
      }
    }
    if (ec) return IoError(dir + ": cannot list the folder: " + ec.message());
    std::sort(paths.begin(), paths.end());
  }
  if (paths.empty()) {
    return InvalidInput(dir + ": no " + kSingleName + ", " + kIndexName +
                        " or other *.safetensors file in the folder");
  }
  for (const std::string& p : paths) {
    SPARQ_RETURN_IF_ERROR(s.AddFile(p));
    const size_t id = s.files_.size() - 1;
    for (const SafetensorsEntry& e : s.files_[id].tensors()) {
      auto [it, fresh] = s.where_.emplace(e.name, id);
      if (!fresh) {
        return InvalidInput(p + ": tensor '" + e.name + "' is also in " +
                            s.files_[it->second].path());
      }
    }
  }
  return s;
}

std::string HfShards::FileOf(const std::string& name) const {
  auto it = where_.find(name);
  return it == where_.end() ? dir_ : files_[it->second].path();
}

Result<Tensor> HfShards::ReadF32(const std::string& name, const std::vector<int64_t>& shape) {
  auto it = where_.find(name);
  if (it == where_.end()) {
    if (!index_path_.empty()) {
      return InvalidInput(index_path_ + ": missing tensor '" + name + "' (not in weight_map)");
    }
    std::string files;
    for (const SafetensorsFile& f : files_) files += (files.empty() ? "" : ", ") + f.path();
    return InvalidInput(dir_ + ": missing tensor '" + name + "' (looked in " + files + ")");
  }
  used_.insert(name);
  const SafetensorsFile& f = files_[it->second];
  const Tensor& t = f.Find(name)->tensor;
  const std::string what = f.path() + ": tensor '" + name + "'";
  if (t.dtype() != DType::kF32 && t.dtype() != DType::kF16 && t.dtype() != DType::kBF16) {
    return Unsupported(what + " has dtype " + std::string(DTypeName(t.dtype())) +
                       "; only F32, F16 and BF16 are read");
  }
  if (t.shape() != shape) {
    return InvalidInput(what + " has shape " + ShapeText(t.shape()) + ", config.json needs " +
                        ShapeText(shape));
  }
  auto x = ToF32(t);
  if (!x.ok()) return x.status().WithContext(what);
  const float* p = x->data_as<float>();
  for (uint64_t i = 0; i < x->numel(); ++i) {
    if (!std::isfinite(p[i])) {
      return InvalidInput(what + " has a non-finite value at element " + std::to_string(i));
    }
  }
  return std::move(*x);
}

std::string HfShards::FirstUnused(const std::function<bool(const std::string&)>& ignorable) const {
  for (const auto& [name, id] : where_) {
    if (!used_.count(name) && !ignorable(name)) return name;
  }
  return "";
}

// HF rows -> GGUF rows of a q_proj / k_proj weight [n_head * head_dim, k] (see the file comment).
Tensor PermuteRopeRows(const Tensor& hf, int64_t n_head) {
  const int64_t m = hf.dim(0), k = hf.dim(1), hd = m / n_head, half = hd / 2;
  Tensor out = Tensor::Alloc(DType::kF32, {m, k});
  const float* src = hf.data_as<float>();
  float* dst = out.mutable_data_as<float>();
  for (int64_t h = 0; h < n_head; ++h) {
    for (int64_t i = 0; i < half; ++i) {
      for (int64_t j = 0; j < 2; ++j) {
        const int64_t to = h * hd + 2 * i + j, from = h * hd + j * half + i;
        std::copy_n(src + from * k, k, dst + to * k);
      }
    }
  }
  return out;
}

std::vector<float> ToVector(const Tensor& t) {
  const float* p = t.data_as<float>();
  return std::vector<float>(p, p + t.numel());
}

// HF name of each LinearSlot, after "model.layers.{i}.".
constexpr const char* kHfSlotNames[kNumSlots] = {
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};

}  // namespace

Result<LlamaModel> LlamaModel::FromHfFolder(const std::string& path, const KernelConfig& cfg) {
  std::string dir = path;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const std::string config_path = dir + "/config.json";
  const std::string tok_path = dir + "/tokenizer.json";
  for (const std::string& p : {config_path, tok_path}) {
    if (!IsRegularFile(p)) {
      return InvalidInput(dir + ": missing " + p.substr(dir.size() + 1) +
                          " (a Hugging Face folder needs config.json, tokenizer.json and "
                          "*.safetensors)");
    }
  }
  SPARQ_ASSIGN_OR_RETURN(LlamaConfig c, LlamaConfig::FromHfConfig(config_path));
  SPARQ_ASSIGN_OR_RETURN(Tokenizer tok,
                         Tokenizer::FromHfJson(tok_path, dir + "/tokenizer_config.json"));
  SPARQ_ASSIGN_OR_RETURN(HfShards shards, HfShards::Open(dir));

  LlamaWeights w;
  SPARQ_ASSIGN_OR_RETURN(w.token_embd,
                         shards.ReadF32("model.embed_tokens.weight", {c.n_vocab, c.n_embd}));
  SPARQ_ASSIGN_OR_RETURN(Tensor onorm, shards.ReadF32("model.norm.weight", {c.n_embd}));
  w.output_norm = ToVector(onorm);
  if (c.tied_output) {
    SPARQ_ASSIGN_OR_RETURN(w.output, DenseLinearFromF32(w.token_embd.Clone(), "output.weight", cfg));
  } else {
    SPARQ_ASSIGN_OR_RETURN(Tensor out, shards.ReadF32("lm_head.weight", {c.n_vocab, c.n_embd}));
    SPARQ_ASSIGN_OR_RETURN(w.output, DenseLinearFromF32(std::move(out), "output.weight", cfg));
  }
  w.blocks.resize(c.n_layer);
  for (int64_t l = 0; l < c.n_layer; ++l) {
    LlamaBlock& b = w.blocks[l];
    const std::string hf = "model.layers." + std::to_string(l) + ".";
    const std::string blk = "blk." + std::to_string(l) + ".";
    SPARQ_ASSIGN_OR_RETURN(Tensor an, shards.ReadF32(hf + "input_layernorm.weight", {c.n_embd}));
    SPARQ_ASSIGN_OR_RETURN(Tensor fn,
                           shards.ReadF32(hf + "post_attention_layernorm.weight", {c.n_embd}));
    b.attn_norm = ToVector(an);
    b.ffn_norm = ToVector(fn);
    for (int s = 0; s < kNumSlots; ++s) {
      const auto slot = static_cast<LinearSlot>(s);
      const auto [m, k] = SlotShape(c, slot);
      const std::string name = hf + kHfSlotNames[s] + ".weight";
      SPARQ_ASSIGN_OR_RETURN(Tensor t, shards.ReadF32(name, {m, k}));
      if (slot == LinearSlot::kQ) t = PermuteRopeRows(t, c.n_head);
      if (slot == LinearSlot::kK) t = PermuteRopeRows(t, c.n_head_kv);
      // Runtime names in the LinearWeight (what pruning and checkpoints see).
      SPARQ_ASSIGN_OR_RETURN(
          b.linear[s],
          DenseLinearFromF32(std::move(t), blk + std::string(SlotName(slot)) + ".weight", cfg));
    }
  }
  // A tensor this runtime has no place for (a bias, an extra norm) means the model computes
  // something else: refuse rather than run a different model. RoPE caches that old checkpoints
  // carry, and the head when it is tied, are derived data and may be ignored.
  const std::string extra = shards.FirstUnused([&](const std::string& n) {
    return n.ends_with(".rotary_emb.inv_freq") || (c.tied_output && n == "lm_head.weight");
  });
  if (!extra.empty()) {
    return Unsupported(shards.FileOf(extra) + ": tensor '" + extra +
                       "' is not part of a Llama model as this runtime runs it");
  }
  return FromParts(c, std::move(w), std::move(tok), dir);
}

}  // namespace sparq
