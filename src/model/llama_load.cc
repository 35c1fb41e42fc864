// LlamaModel construction: from GGUF (dequantized to f32 = the dense model, or its Q4_0 / Q4_1 /
// Q8_0 linear layers as stored), from parts, and the Load() dispatcher. .sparq checkpoints:
// llama_checkpoint.cc; Hugging Face folders: llama_hf.cc.
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "sparq/format.h"
#include "sparq/gguf.h"
#include "src/model/llama_internal.h"

namespace sparq {

LlamaModel::LlamaModel() = default;
LlamaModel::~LlamaModel() = default;
LlamaModel::LlamaModel(LlamaModel&&) noexcept = default;
LlamaModel& LlamaModel::operator=(LlamaModel&&) noexcept = default;

const LlamaConfig& LlamaModel::config() const { return impl_->config; }
const Tokenizer& LlamaModel::tokenizer() const { return impl_->tokenizer; }
const LlamaWeights& LlamaModel::weights() const { return impl_->weights; }
LlamaWeights& LlamaModel::mutable_weights() { return impl_->weights; }
const std::string& LlamaModel::source() const { return impl_->source; }

uint64_t LlamaModel::block_linear_bytes() const {
  uint64_t total = 0;
  for (const LlamaBlock& b : impl_->weights.blocks) {
    for (const LinearWeight& lw : b.linear) total += lw.weight_bytes();
  }
  return total;
}

uint64_t LlamaModel::weight_bytes() const {
  const LlamaWeights& w = impl_->weights;
  uint64_t total = block_linear_bytes() + w.output.weight_bytes() + w.token_embd.nbytes() +
                   w.output_norm.size() * sizeof(float);
  if (!w.output_row_ids.empty()) total += w.output_rows.weight_bytes();
  for (const LlamaBlock& b : w.blocks) {
    total += (b.attn_norm.size() + b.ffn_norm.size()) * sizeof(float);
  }
  return total;
}

double ParameterCount(const LlamaModel& m) {
  const LlamaConfig& c = m.config();
  double n = double(c.n_vocab) * double(c.n_embd) * (c.tied_output ? 1 : 2) +
             double(c.n_embd) * double(2 * c.n_layer + 1);
  for (const LlamaBlock& b : m.weights().blocks) {
    for (const LinearWeight& lw : b.linear) n += double(lw.rows()) * double(lw.cols());
  }
  return n;
}

uint64_t LlamaModel::weight_bytes_per_token() const {
  const LlamaWeights& w = impl_->weights;
  const uint64_t embd = w.token_embd.nbytes();
  uint64_t row = 0;
  if (w.token_embd.rank() == 2 && w.token_embd.dim(0) > 0) {
    row = embd / static_cast<uint64_t>(w.token_embd.dim(0));
  } else if (w.token_embd.empty() && w.output.rows() > 0) {  // looked up in the head's rows
    row = w.output.weight_bytes() / static_cast<uint64_t>(w.output.rows());
  }
  return weight_bytes() - embd + row;
}

bool LlamaModel::decode_rounds_x() const {
  for (const LlamaBlock& b : impl_->weights.blocks) {
    for (const LinearWeight& lw : b.linear) {
      if (lw.rounds_x(1)) return true;
    }
  }
  return impl_->weights.output.rounds_x(1);
}

std::string LlamaModel::block_linear_values() const {
  std::vector<std::string> seen;
  for (const LlamaBlock& b : impl_->weights.blocks) {
    for (const LinearWeight& lw : b.linear) {
      const std::string v = lw.values().Name();
      if (std::find(seen.begin(), seen.end(), v) == seen.end()) seen.push_back(v);
    }
  }
  std::string out;
  for (const std::string& v : seen) out += (out.empty() ? "" : "+") + v;
  return out;
}

namespace {

// Reads a GGUF tensor as f32 with the expected row-major shape.
Result<Tensor> ReadChecked(const GgufFile& f, const std::string& name,
                           const std::vector<int64_t>& shape) {
  const GgufTensorInfo* t = f.FindTensor(name);
  if (t == nullptr) return InvalidInput(f.path() + ": missing tensor '" + name + "'");
  if (t->shape() != shape) {
    std::string want, got;
    for (int64_t d : shape) want += (want.empty() ? "" : ", ") + std::to_string(d);
    for (int64_t d : t->shape()) got += (got.empty() ? "" : ", ") + std::to_string(d);
    return InvalidInput(f.path() + ": tensor '" + name + "' has shape [" + got +
                        "], the configuration needs [" + want + "]");
  }
  SPARQ_ASSIGN_OR_RETURN(Tensor x, f.ReadF32(*t));
  const float* p = x.data_as<float>();
  for (uint64_t i = 0; i < x.numel(); ++i) {
    if (!std::isfinite(p[i])) {
      return InvalidInput(f.path() + ": tensor '" + name + "' has a non-finite value at element " +
                          std::to_string(i));
    }
  }
  return x;
}

// True for the ggml types GgufFile::ReadQuantized keeps as stored.
bool RunsAsStored(GgmlType t) {
  return t == GgmlType::kQ4_0 || t == GgmlType::kQ4_1 || t == GgmlType::kQ8_0;
}

// A [m, k] linear layer from the GGUF: as stored when asked and its type allows, else from its
// f32 dequantization. `name` is the tensor's name in the file and the layer's.
Result<LinearWeight> GgufLinear(const GgufFile& f, const std::string& name, int64_t m, int64_t k,
                                const LoadOptions& opt, const KernelConfig& cfg) {
  const GgufTensorInfo* t = f.FindTensor(name);
  if (opt.gguf_values == GgufValues::kAsStored && t != nullptr && RunsAsStored(t->type) &&
      t->shape() == std::vector<int64_t>{m, k}) {
    // ReadQuantized rejects non-finite scales and mins, so no f32 check is needed here.
    SPARQ_ASSIGN_OR_RETURN(DenseMatrix dm, f.ReadQuantized(*t));
    return LinearWeight::FromMatrix(SparseMatrix(std::move(dm)), name, cfg);
  }
  // Missing tensors and wrong shapes are reported here, with the f32 path's messages.
  SPARQ_ASSIGN_OR_RETURN(Tensor x, ReadChecked(f, name, {m, k}));
  return DenseLinearFromF32(std::move(x), name, cfg);
}

std::vector<float> ToVector(const Tensor& t) {
  const float* p = t.data_as<float>();
  return std::vector<float>(p, p + t.numel());
}

}  // namespace

Result<LinearWeight> DenseLinearFromF32(Tensor values, const std::string& name,
                                        const KernelConfig& cfg) {
  DenseMatrix dm;
  dm.rows = values.dim(0);
  dm.cols = values.dim(1);
  dm.values = std::move(values);
  return LinearWeight::FromMatrix(SparseMatrix(std::move(dm)), name, cfg);
}

Result<LlamaModel> LlamaModel::FromParts(LlamaConfig config, LlamaWeights weights,
                                         Tokenizer tokenizer, const std::string& what) {
  SPARQ_RETURN_IF_ERROR(config.Validate(what));
  if (static_cast<int64_t>(weights.blocks.size()) != config.n_layer) {
    return InvalidInput(what + ": " + std::to_string(weights.blocks.size()) + " blocks for " +
                        std::to_string(config.n_layer) + " layers");
  }
  if (weights.token_embd.empty()) {
    // The lookup then reads the tied head's rows (Embed): they must be dense quantized.
    std::vector<float> row(static_cast<size_t>(std::max<int64_t>(config.n_embd, 1)));
    const bool rows_ok = weights.output_row_ids.empty() ||
                         (weights.output_rows.rows() ==
                              static_cast<int64_t>(weights.output_row_ids.size()) &&
                          weights.output_rows.cols() == config.n_embd &&
                          weights.output_rows.DequantizeRow(0, row.data()));
    if (!config.tied_output || weights.output.rows() != config.n_vocab ||
        weights.output.cols() != config.n_embd || !weights.output.DequantizeRow(0, row.data()) ||
        !rows_ok) {
      return InvalidInput(what + ": no token embedding table, and the head is not a tied dense "
                          "quantized [" + std::to_string(config.n_vocab) + ", " +
                          std::to_string(config.n_embd) + "] matrix to look tokens up in");
    }
  } else if (weights.token_embd.dtype() != DType::kF32 || weights.token_embd.rank() != 2 ||
      weights.token_embd.dim(0) != config.n_vocab || weights.token_embd.dim(1) != config.n_embd) {
    return InvalidInput(what + ": token embedding is " + weights.token_embd.ShapeString() +
                        ", expected f32[" + std::to_string(config.n_vocab) + ", " +
                        std::to_string(config.n_embd) + "]");
  }
  if (static_cast<int64_t>(weights.output_norm.size()) != config.n_embd ||
      weights.output.rows() != config.n_vocab || weights.output.cols() != config.n_embd) {
    return InvalidInput(what + ": output norm or head does not match the configuration");
  }
  for (int64_t l = 0; l < config.n_layer; ++l) {
    const LlamaBlock& b = weights.blocks[l];
    const std::string blk = "blk." + std::to_string(l) + ".";
    if (static_cast<int64_t>(b.attn_norm.size()) != config.n_embd ||
        static_cast<int64_t>(b.ffn_norm.size()) != config.n_embd) {
      return InvalidInput(what + ": " + blk + " norm weights do not have n_embd elements");
    }
    for (int s = 0; s < kNumSlots; ++s) {
      const auto [m, k] = SlotShape(config, static_cast<LinearSlot>(s));
      if (b.linear[s].rows() != m || b.linear[s].cols() != k) {
        return InvalidInput(what + ": " + blk + std::string(SlotName(static_cast<LinearSlot>(s))) +
                            ".weight is [" + std::to_string(b.linear[s].rows()) + ", " +
                            std::to_string(b.linear[s].cols()) + "], expected [" +
                            std::to_string(m) + ", " + std::to_string(k) + "]");
      }
      if (!b.perm[s].empty()) {
        SPARQ_RETURN_IF_ERROR(ValidatePermutation(
            b.perm[s], k, what + ": " + blk + std::string(SlotName(static_cast<LinearSlot>(s)))));
      }
    }
  }
  if (tokenizer.vocab_size() > config.n_vocab) {
    return InvalidInput(what + ": tokenizer has " + std::to_string(tokenizer.vocab_size()) +
                        " tokens, the model only " + std::to_string(config.n_vocab));
  }
  LlamaModel model;
  model.impl_ = std::make_unique<Impl>();
  model.impl_->config = config;
  model.impl_->weights = std::move(weights);
  model.impl_->tokenizer = std::move(tokenizer);
  model.impl_->source = what;
  return model;
}

Result<LlamaModel> LlamaModel::FromGguf(const std::string& path, const KernelConfig& cfg,
                                        const LoadOptions& opt) {
  SPARQ_ASSIGN_OR_RETURN(GgufFile f, GgufFile::Open(path));
  SPARQ_ASSIGN_OR_RETURN(LlamaConfig c, LlamaConfig::FromGguf(f));
  SPARQ_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::FromGguf(f));
  LlamaWeights w;
  const GgufTensorInfo* te = f.FindTensor("token_embd.weight");
  const bool head_as_stored = c.tied_output && te != nullptr &&
                              opt.gguf_values == GgufValues::kAsStored && RunsAsStored(te->type) &&
                              te->shape() == std::vector<int64_t>{c.n_vocab, c.n_embd};
  // The lookup (Embed) reads f32 rows of this table, or, without it, the tied head's rows
  // dequantized per token (the same bits: tested).
  if (opt.embedding_table || !head_as_stored) {
    SPARQ_ASSIGN_OR_RETURN(w.token_embd,
                           ReadChecked(f, "token_embd.weight", {c.n_vocab, c.n_embd}));
  }
  SPARQ_ASSIGN_OR_RETURN(Tensor onorm, ReadChecked(f, "output_norm.weight", {c.n_embd}));
  w.output_norm = ToVector(onorm);
  if (c.tied_output) {
    if (head_as_stored) {
      // Named output.weight (the layer it is) though read from token_embd.weight.
      SPARQ_ASSIGN_OR_RETURN(DenseMatrix dm, f.ReadQuantized(*te));
      SPARQ_ASSIGN_OR_RETURN(
          w.output, LinearWeight::FromMatrix(SparseMatrix(std::move(dm)), "output.weight", cfg));
    } else {
      SPARQ_ASSIGN_OR_RETURN(w.output,
                             DenseLinearFromF32(w.token_embd.Clone(), "output.weight", cfg));
    }
  } else {
    SPARQ_ASSIGN_OR_RETURN(w.output, GgufLinear(f, "output.weight", c.n_vocab, c.n_embd, opt, cfg));
  }
  w.blocks.resize(c.n_layer);
  for (int64_t l = 0; l < c.n_layer; ++l) {
    LlamaBlock& b = w.blocks[l];
    const std::string blk = "blk." + std::to_string(l) + ".";
    SPARQ_ASSIGN_OR_RETURN(Tensor an, ReadChecked(f, blk + "attn_norm.weight", {c.n_embd}));
    SPARQ_ASSIGN_OR_RETURN(Tensor fn, ReadChecked(f, blk + "ffn_norm.weight", {c.n_embd}));
    b.attn_norm = ToVector(an);
    b.ffn_norm = ToVector(fn);
    for (int s = 0; s < kNumSlots; ++s) {
      const auto slot = static_cast<LinearSlot>(s);
      const auto [m, k] = SlotShape(c, slot);
      const std::string name = blk + std::string(SlotName(slot)) + ".weight";
      SPARQ_ASSIGN_OR_RETURN(b.linear[s], GgufLinear(f, name, m, k, opt, cfg));
    }
  }
  return FromParts(c, std::move(w), std::move(tok), path);
}

Result<LlamaModel> LlamaModel::Load(const std::string& path, const KernelConfig& cfg,
                                    const LoadOptions& opt) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return IoError(path + ": " + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) return FromHfFolder(path, cfg);
  auto ends_with = [&](const char* suffix) {
    const size_t n = std::strlen(suffix);
    return path.size() >= n && path.compare(path.size() - n, n, suffix) == 0;
  };
  if (ends_with(".sparq") || ends_with(".safetensors")) return FromSparq(path, cfg, opt);
  return FromGguf(path, cfg, opt);
}

}  // namespace sparq
