// .sparq checkpoints of Llama models. Layout (see checkpoint.h for the container):
//   metadata "sparq.model"     LlamaConfig::ToJson()
//   metadata "sparq.tokenizer" TokenizerData::ToJson()
//   metadata "sparq.prune"     how it was made (optional, informative)
//   plain tensors              token_embd.weight, output_norm.weight, blk.N.{attn,ffn}_norm.weight,
//                              <linear>.perm (i32 [k]) for layers stored with a channel permutation
//   matrices                   blk.N.<slot>.weight in any format; output.weight when untied;
//                              token_embd.weight when quantized, and then optionally
//                              token_embd.rows.weight (int8 [K, n_embd]) with the plain tensor
//                              token_embd.rows.ids (i32 [K], increasing): rows stored apart
#include <cmath>
#include <cstring>

#include <nlohmann/json.hpp>
#include "src/model/llama_internal.h"

namespace sparq {
namespace {

Result<Tensor> PlainF32(const Checkpoint& ck, const std::string& path, const std::string& name,
                        const std::vector<int64_t>& shape) {
  const NamedTensor* t = ck.FindTensor(name);
  if (t == nullptr) return InvalidInput(path + ": missing tensor '" + name + "'");
  if (t->tensor.shape() != shape) {
    return InvalidInput(path + ": tensor '" + name + "' is " + t->tensor.ShapeString() +
                        ", the configuration needs " + std::to_string(shape.size()) + "-D [" +
                        std::to_string(shape[0]) + (shape.size() > 1 ? ", ..." : "") + "]");
  }
  auto f = ToF32(t->tensor);
  if (!f.ok()) return f.status().WithContext(path + ": tensor '" + name + "'");
  const float* p = f->data_as<float>();
  for (uint64_t i = 0; i < f->numel(); ++i) {
    if (!std::isfinite(p[i])) {
      return InvalidInput(path + ": tensor '" + name + "' has a non-finite value at element " +
                          std::to_string(i));
    }
  }
  return f;
}

std::vector<float> ToVector(const Tensor& t) {
  const float* p = t.data_as<float>();
  return std::vector<float>(p, p + t.numel());
}

Result<LinearWeight> MatrixLinear(Checkpoint& ck, const std::string& path,
                                  const std::string& name, int64_t m, int64_t k,
                                  const KernelConfig& cfg) {
  for (CheckpointTensor& ct : ck.matrices) {
    if (ct.name != name) continue;
    if (Rows(ct.matrix) != m || Cols(ct.matrix) != k) {
      return InvalidInput(path + ": matrix '" + name + "' is [" + std::to_string(Rows(ct.matrix)) +
                          ", " + std::to_string(Cols(ct.matrix)) + "], the configuration needs [" +
                          std::to_string(m) + ", " + std::to_string(k) + "]");
    }
    auto lw = LinearWeight::FromMatrix(std::move(ct.matrix), name, cfg);
    if (!lw.ok()) return lw.status().WithContext(path);
    return lw;
  }
  return InvalidInput(path + ": missing matrix '" + name + "'");
}

// token_embd.rows.{weight,ids} (see the top): checked, then their rows overwrite token_embd's
// (the lookup) and become w->output_rows (the head's logits of those ids).
Status HeadRowsApart(Checkpoint& ck, const std::string& path, const LlamaConfig& c,
                     bool embd_is_matrix, const KernelConfig& cfg, LlamaWeights* w) {
  CheckpointTensor* rows = nullptr;
  for (CheckpointTensor& ct : ck.matrices) {
    if (ct.name == "token_embd.rows.weight") rows = &ct;
  }
  const NamedTensor* ids = ck.FindTensor("token_embd.rows.ids");
  if (rows == nullptr && ids == nullptr) return Status::Ok();
  const std::string what = path + ": token_embd.rows";
  if (rows == nullptr || ids == nullptr) {
    return InvalidInput(what + ": has " +
                        (rows ? "the matrix 'token_embd.rows.weight'" : "the ids") + " but not " +
                        (rows ? "the ids 'token_embd.rows.ids'" : "the matrix"));
  }
  if (!c.tied_output || !embd_is_matrix) {
    return InvalidInput(what + ": rows stored apart need a tied head stored as a quantized "
                        "matrix 'token_embd.weight'");
  }
  const auto* dm = std::get_if<DenseMatrix>(&rows->matrix);
  if (dm == nullptr || !dm->quant.quantized()) {
    return InvalidInput(what + ".weight: must be a dense quantized matrix");
  }
  if (ids->tensor.dtype() != DType::kI32 || ids->tensor.rank() != 1 ||
      ids->tensor.dim(0) != dm->rows || dm->cols != c.n_embd) {
    return InvalidInput(what + ": ids " + ids->tensor.ShapeString() + " and matrix [" +
                        std::to_string(dm->rows) + ", " + std::to_string(dm->cols) +
                        "] must be i32 [K] and [K, " + std::to_string(c.n_embd) + "]");
  }
  const int32_t* id = ids->tensor.data_as<int32_t>();
  const int64_t k = dm->rows;
  for (int64_t j = 0; j < k; ++j) {
    if (id[j] < 0 || id[j] >= c.n_vocab || (j > 0 && id[j] <= id[j - 1])) {
      return InvalidInput(what + ".ids: entry " + std::to_string(j) + " (" + std::to_string(id[j]) +
                          ") is not an increasing token id below " + std::to_string(c.n_vocab));
    }
  }
  if (!w->token_embd.empty()) {
    Tensor f = ToDense(rows->matrix);
    float* e = w->token_embd.mutable_data_as<float>();
    const float* r = f.data_as<float>();
    for (int64_t j = 0; j < k; ++j) {
      std::memcpy(e + int64_t{id[j]} * c.n_embd, r + j * c.n_embd, sizeof(float) * c.n_embd);
    }
  }
  w->output_row_ids.assign(id, id + k);
  auto lw = LinearWeight::FromMatrix(std::move(rows->matrix), "output.weight rows", cfg);
  if (!lw.ok()) return lw.status().WithContext(path);
  w->output_rows = std::move(lw).value();
  return Status::Ok();
}

// A plain f32 vector as a tensor of `dt` (f32, bf16 or f16), refused when f16 cannot hold it.
Result<Tensor> StoredTensor(const float* v, std::vector<int64_t> shape, DType dt,
                            const std::string& name) {
  Tensor f = Tensor::View(DType::kF32, std::move(shape), v);
  SPARQ_RETURN_IF_ERROR(FitsValueType(std::span<const float>(v, f.numel()), dt, "save: " + name));
  if (dt == DType::kF32) return f.Clone();
  return FromF32(f, dt);
}

}  // namespace

Status SaveLlamaCheckpoint(const LlamaModel& model, const std::string& path, DType values) {
  if (values != DType::kF32 && values != DType::kBF16 && values != DType::kF16) {
    return InvalidInput("save: values must be f32, bf16 or f16, not " +
                        std::string(DTypeName(values)));
  }
  const LlamaConfig& c = model.config();
  const LlamaWeights& w = model.weights();
  Checkpoint ck;
  auto add_linear = [&](const LinearWeight& lw, const std::string& name) -> Status {
    if (std::optional<DenseMatrix> q = lw.dense_quant()) {  // its codes, as loaded
      ck.matrices.push_back({name, std::move(*q), Pattern::Dense()});
      return Status::Ok();
    }
    const float* p = lw.dense_f32();
    if (p == nullptr) {
      return InvalidInput("save: " + name + " is stored " + lw.format() + " with " +
                          lw.values().Name() +
                          " values; only dense layers (f32, or quantized as a GGUF stores them) "
                          "are written this way: a model loaded from a .sparq is saved by copying "
                          "its file");
    }
    SPARQ_ASSIGN_OR_RETURN(Tensor t, StoredTensor(p, {lw.rows(), lw.cols()}, values, name));
    DenseMatrix dm;
    dm.rows = lw.rows();
    dm.cols = lw.cols();
    dm.values = std::move(t);
    ck.matrices.push_back({name, std::move(dm), Pattern::Dense()});
    return Status::Ok();
  };
  if (std::optional<DenseMatrix> q; c.tied_output && (q = w.output.dense_quant())) {
    // A tied head run as stored (a GGUF's Q4_1, say): the embedding is that matrix (FromSparq
    // looks tokens up in its dequantization, which is the f32 copy the model holds).
    ck.matrices.push_back({"token_embd.weight", std::move(*q), Pattern::Dense()});
    if (!w.output_row_ids.empty()) {
      std::optional<DenseMatrix> rows = w.output_rows.dense_quant();
      if (!rows) return InvalidInput("save: the head's rows stored apart are not quantized");
      ck.matrices.push_back({"token_embd.rows.weight", std::move(*rows), Pattern::Dense()});
      ck.tensors.push_back(
          {"token_embd.rows.ids",
           Tensor::View(DType::kI32, {static_cast<int64_t>(w.output_row_ids.size())},
                        w.output_row_ids.data())
               .Clone()});
    }
  } else {
    SPARQ_ASSIGN_OR_RETURN(Tensor te, StoredTensor(w.token_embd.data_as<float>(),
                                                   {c.n_vocab, c.n_embd}, values,
                                                   "token_embd.weight"));
    ck.tensors.push_back({"token_embd.weight", std::move(te)});
  }
  // Norm gains stay f32 whatever the values: FromSparq reads them as f32 and they are tiny.
  ck.tensors.push_back({"output_norm.weight", Tensor::View(DType::kF32, {c.n_embd},
                                                           w.output_norm.data()).Clone()});
  if (!c.tied_output) SPARQ_RETURN_IF_ERROR(add_linear(w.output, "output.weight"));
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const LlamaBlock& b = w.blocks[static_cast<size_t>(l)];
    const std::string blk = "blk." + std::to_string(l) + ".";
    ck.tensors.push_back(
        {blk + "attn_norm.weight", Tensor::View(DType::kF32, {c.n_embd}, b.attn_norm.data()).Clone()});
    ck.tensors.push_back(
        {blk + "ffn_norm.weight", Tensor::View(DType::kF32, {c.n_embd}, b.ffn_norm.data()).Clone()});
    for (int s = 0; s < kNumSlots; ++s) {
      const std::string name = blk + std::string(SlotName(static_cast<LinearSlot>(s))) + ".weight";
      SPARQ_RETURN_IF_ERROR(add_linear(b.linear[static_cast<size_t>(s)], name));
      const std::vector<int32_t>& perm = b.perm[static_cast<size_t>(s)];
      if (!perm.empty()) {
        ck.tensors.push_back({name + ".perm", Tensor::View(DType::kI32,
                                                           {static_cast<int64_t>(perm.size())},
                                                           perm.data()).Clone()});
      }
    }
  }
  ck.metadata["sparq.model"] = c.ToJson();
  ck.metadata["sparq.tokenizer"] = model.tokenizer().data().ToJson();
  std::string source = model.source();
  while (source.size() > 1 && source.back() == '/') source.pop_back();  // a folder "dir/"
  source = source.substr(source.find_last_of('/') + 1);
  // "sparq.prune" records how a checkpoint was made; a saved model was not pruned.
  ck.metadata["sparq.saved"] =
      nlohmann::json{{"source", source}, {"values", std::string(DTypeName(values))}}.dump();
  return WriteCheckpoint(path, ck);
}

Result<LlamaModel> LlamaModel::FromSparq(const std::string& path, const KernelConfig& cfg,
                                         const LoadOptions& opt) {
  SPARQ_ASSIGN_OR_RETURN(Checkpoint ck, ReadCheckpoint(path));
  auto meta = [&](const char* key) -> const std::string* {
    auto it = ck.metadata.find(key);
    return it == ck.metadata.end() ? nullptr : &it->second;
  };
  if (meta("sparq.model") == nullptr) {
    return InvalidInput(path + ": no model configuration ('sparq.model' metadata): not a model "
                        "checkpoint (made by `sparq prune`)");
  }
  if (meta("sparq.tokenizer") == nullptr) {
    return InvalidInput(path + ": no tokenizer ('sparq.tokenizer' metadata)");
  }
  SPARQ_ASSIGN_OR_RETURN(LlamaConfig c, LlamaConfig::FromJson(*meta("sparq.model"), path));
  SPARQ_ASSIGN_OR_RETURN(TokenizerData td, TokenizerData::FromJson(*meta("sparq.tokenizer"), path));
  SPARQ_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::FromData(std::move(td), path));
  LlamaWeights w;
  // The embedding: a plain tensor, or a matrix (dense int8 / int4, `prune --embedding-values`),
  // looked up from its f32 dequantization and, when tied, run as stored by the head.
  CheckpointTensor* embd_matrix = nullptr;
  for (CheckpointTensor& ct : ck.matrices) {
    if (ct.name == "token_embd.weight") embd_matrix = &ct;
  }
  if (embd_matrix != nullptr) {
    if (Rows(embd_matrix->matrix) != c.n_vocab || Cols(embd_matrix->matrix) != c.n_embd) {
      return InvalidInput(path + ": matrix 'token_embd.weight' is [" +
                          std::to_string(Rows(embd_matrix->matrix)) + ", " +
                          std::to_string(Cols(embd_matrix->matrix)) +
                          "], the configuration needs [" + std::to_string(c.n_vocab) + ", " +
                          std::to_string(c.n_embd) + "]");
    }
    const auto* dm = std::get_if<DenseMatrix>(&embd_matrix->matrix);
    // Without the table the tied head's rows serve the lookup (Embed; the same bits).
    if (opt.embedding_table || !c.tied_output || dm == nullptr || !dm->quant.quantized()) {
      w.token_embd = ToDense(embd_matrix->matrix);
    }
  } else {
    SPARQ_ASSIGN_OR_RETURN(w.token_embd,
                           PlainF32(ck, path, "token_embd.weight", {c.n_vocab, c.n_embd}));
    if (!w.token_embd.owned()) w.token_embd = w.token_embd.Clone();
  }
  SPARQ_ASSIGN_OR_RETURN(Tensor on, PlainF32(ck, path, "output_norm.weight", {c.n_embd}));
  w.output_norm = ToVector(on);
  SPARQ_RETURN_IF_ERROR(HeadRowsApart(ck, path, c, embd_matrix != nullptr, cfg, &w));
  if (c.tied_output && embd_matrix != nullptr) {
    auto head = LinearWeight::FromMatrix(std::move(embd_matrix->matrix), "output.weight", cfg);
    if (!head.ok()) return head.status().WithContext(path);
    w.output = std::move(head).value();
  } else if (c.tied_output) {
    DenseMatrix dm;
    dm.rows = c.n_vocab;
    dm.cols = c.n_embd;
    // A bf16 embedding (`sparq prune --dtype bf16`) makes a bf16 head: half the bytes per token.
    const NamedTensor* te = ck.FindTensor("token_embd.weight");
    dm.values = te->tensor.dtype() == DType::kBF16 ? te->tensor.Clone() : w.token_embd.Clone();
    SPARQ_ASSIGN_OR_RETURN(w.output, LinearWeight::FromMatrix(std::move(dm), "output.weight", cfg));
  } else {
    SPARQ_ASSIGN_OR_RETURN(w.output,
                           MatrixLinear(ck, path, "output.weight", c.n_vocab, c.n_embd, cfg));
  }
  w.blocks.resize(c.n_layer);
  for (int64_t l = 0; l < c.n_layer; ++l) {
    LlamaBlock& b = w.blocks[l];
    const std::string blk = "blk." + std::to_string(l) + ".";
    SPARQ_ASSIGN_OR_RETURN(Tensor an, PlainF32(ck, path, blk + "attn_norm.weight", {c.n_embd}));
    SPARQ_ASSIGN_OR_RETURN(Tensor fn, PlainF32(ck, path, blk + "ffn_norm.weight", {c.n_embd}));
    b.attn_norm = ToVector(an);
    b.ffn_norm = ToVector(fn);
    for (int s = 0; s < kNumSlots; ++s) {
      const auto slot = static_cast<LinearSlot>(s);
      const auto [m, k] = SlotShape(c, slot);
      const std::string name = blk + std::string(SlotName(slot)) + ".weight";
      SPARQ_ASSIGN_OR_RETURN(b.linear[s], MatrixLinear(ck, path, name, m, k, cfg));
      if (const NamedTensor* p = ck.FindTensor(name + ".perm"); p != nullptr) {
        if (p->tensor.dtype() != DType::kI32 || p->tensor.rank() != 1 || p->tensor.dim(0) != k) {
          return InvalidInput(path + ": tensor '" + name + ".perm' must be i32[" +
                              std::to_string(k) + "], is " + p->tensor.ShapeString());
        }
        const int32_t* pp = p->tensor.data_as<int32_t>();
        b.perm[s].assign(pp, pp + k);
        SPARQ_RETURN_IF_ERROR(ValidatePermutation(b.perm[s], k, path + ": " + name + ".perm"));
      }
    }
  }
  return FromParts(c, std::move(w), std::move(tok), path);
}

}  // namespace sparq
