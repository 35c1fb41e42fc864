// Writes trained f32 masters back into the student's .sparq (sparq/finetune.h): the student's file
// is the template, so every matrix keeps its format, indices, pattern and value dtype and only its
// values change.
// Route: the value slots of a matrix are mapped to dense positions through its own decoder
// (SlotPositions, stored_slots.h), so no format's layout is repeated here and the stored
// structure is kept bit for bit. Quantized values are re-quantized into the student's own spec
// by round to nearest (QuantizeMatrix: N:M, V:N:M, CSR, dense), every stored slot kept.
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "sparq/checkpoint.h"
#include "sparq/dtype.h"
#include "sparq/finetune.h"
#include "sparq/format.h"
#include "sparq/prune.h"
#include "src/train/stored_slots.h"

namespace sparq::train {
namespace {

Status StoreValues(Tensor* t, std::span<const float> v, const std::string& name) {
  switch (t->dtype()) {
    case DType::kF32:
      std::memcpy(t->mutable_data(), v.data(), v.size() * sizeof(float));
      return Status::Ok();
    case DType::kBF16: {
      auto* p = t->mutable_data_as<uint16_t>();
      for (size_t i = 0; i < v.size(); ++i) p[i] = F32ToBF16(v[i]);
      return Status::Ok();
    }
    case DType::kF16: {
      auto* p = t->mutable_data_as<uint16_t>();
      for (size_t i = 0; i < v.size(); ++i) p[i] = F32ToF16(v[i]);
      return Status::Ok();
    }
    default:
      return Unsupported("finetune: tensor '" + name + "' stores " +
                         std::string(DTypeName(t->dtype())) +
                         " values; the output can hold f32, bf16 or f16");
  }
}

// The mask is fixed: a weight with no stored value (covered[j] false) must have stayed exactly 0,
// or writing would silently drop what was trained.
Status CheckMaskKept(const std::string& name, std::span<const float> w,
                     const std::vector<bool>& covered, int64_t k) {
  for (size_t j = 0; j < w.size(); ++j) {
    if (!covered[j] && w[j] != 0.0f) {
      return InvalidInput("finetune: tensor '" + name + "' weight (" + std::to_string(j / k) +
                          ", " + std::to_string(j % k) + ") is pruned in the student but " +
                          std::to_string(w[j]) + " after training: the mask must stay fixed");
    }
  }
  return Status::Ok();
}

// A quantized ct.matrix: every stored slot is a kept weight (finetune_structure.cc trained it,
// whatever its code), its value w at the slot's position, re-quantized into the stored spec.
// Weights equal to the student's dequantized values keep their codes bit for bit (`--train norms`).
// numbers_only: the trained numbers in the same structure, not quantized (GPTQ's input).
Status WriteQuantizedMatrix(CheckpointTensor* ct, std::span<const float> w, bool numbers_only) {
  const std::string& name = ct->name;
  const ValueSpec spec = QuantOf(ct->matrix)->spec;
  const std::vector<int64_t> pos = SlotPositions(ct->matrix);
  if (!numbers_only) {
    const Tensor d = ToDense(ct->matrix);
    if (std::memcmp(d.data(), w.data(), w.size_bytes()) == 0) return Status::Ok();
  }
  const int64_t k = Cols(ct->matrix);
  std::vector<bool> covered(w.size(), false);
  Tensor nt = Tensor::Alloc(DType::kF32, NumberShape(ct->matrix));
  float* nv = nt.mutable_data_as<float>();
  for (size_t i = 0; i < pos.size(); ++i) {
    nv[i] = 0.0f;
    if (pos[i] < 0) continue;  // padding: stays +0
    covered[pos[i]] = true;
    nv[i] = w[pos[i]];
  }
  SPARQ_RETURN_IF_ERROR(CheckMaskKept(name, w, covered, k));
  SparseMatrix plain = WithNumbers(ct->matrix, std::move(nt));  // the trained numbers
  if (numbers_only) {
    ct->matrix = std::move(plain);
    return Validate(ct->matrix, name);
  }
  SPARQ_ASSIGN_OR_RETURN(ct->matrix, QuantizeMatrix(plain, spec, {}, name));
  return Validate(ct->matrix, name);
}

// Replaces the values of ct.matrix with w [m, k] (in the stored column order).
Status WriteMatrix(CheckpointTensor* ct, std::span<const float> w, bool numbers_only) {
  if (IsQuantized(ct->matrix)) return WriteQuantizedMatrix(ct, w, numbers_only);
  const std::string& name = ct->name;
  const Tensor& old = StoredValues(ct->matrix);
  SPARQ_ASSIGN_OR_RETURN(Tensor old_f32, ToF32(old));
  const float* ov = old_f32.data_as<float>();
  const std::vector<int64_t> pos = SlotPositions(ct->matrix);
  const int64_t k = Cols(ct->matrix);
  // FromLlamaModel trains every weight of a dense slot, but reads a stored 0 of a sparse one as
  // pruned (a kept weight that is exactly 0 keeps the pattern).
  const bool dense = KindOf(ct->matrix) == FormatKind::kDense;
  std::vector<bool> covered(w.size(), false);
  std::vector<float> nv(pos.size(), 0.0f);
  for (size_t i = 0; i < pos.size(); ++i) {
    if (pos[i] < 0) continue;  // padding: stays +0
    covered[pos[i]] = dense || ov[i] != 0.0f;
    nv[i] = w[pos[i]];
  }
  SPARQ_RETURN_IF_ERROR(CheckMaskKept(name, w, covered, k));  // a stored 0 is not covered
  Tensor t = Tensor::Alloc(old.dtype(), old.shape());
  SPARQ_RETURN_IF_ERROR(StoreValues(&t, nv, name));
  MutableStoredValues(ct->matrix) = std::move(t);
  return Validate(ct->matrix, name);
}

Status WritePlain(Checkpoint* ck, const std::string& name, std::span<const float> v) {
  for (NamedTensor& nt : ck->tensors) {
    if (nt.name != name) continue;
    if (nt.tensor.numel() != v.size()) {
      return InvalidInput("finetune: tensor '" + name + "' is " + nt.tensor.ShapeString() +
                          ", the trained one has " + std::to_string(v.size()) + " values");
    }
    Tensor t = Tensor::Alloc(nt.tensor.dtype(), nt.tensor.shape());
    SPARQ_RETURN_IF_ERROR(StoreValues(&t, v, name));
    nt.tensor = std::move(t);
    return Status::Ok();
  }
  return InvalidInput("finetune: the student has no tensor '" + name + "'");
}

}  // namespace

Result<Checkpoint> FinetunedCheckpoint(const std::string& student_path, const LlamaConfig& c,
                                       const ModelWeights& w, bool numbers_only) {
  SPARQ_ASSIGN_OR_RETURN(Checkpoint ck, ReadCheckpoint(student_path));
  if (!c.tied_output) {
    return Unsupported("finetune: " + student_path + " has an untied output head");
  }
  SPARQ_RETURN_IF_ERROR(CheckModel(c, w));
  // name -> (trained values in the original column order, the slot's k)
  std::map<std::string, std::pair<const std::vector<float>*, int64_t>> matrices;
  matrices["token_embd.weight"] = {&w.token_embd, c.n_embd};
  SPARQ_RETURN_IF_ERROR(WritePlain(&ck, "output_norm.weight", w.output_norm));
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const std::string blk = "blk." + std::to_string(l) + ".";
    const BlockWeights& b = w.blocks[l];
    SPARQ_RETURN_IF_ERROR(WritePlain(&ck, blk + "attn_norm.weight", b.attn_norm));
    SPARQ_RETURN_IF_ERROR(WritePlain(&ck, blk + "ffn_norm.weight", b.ffn_norm));
    for (int s = 0; s < kNumSlots; ++s) {
      const auto slot = static_cast<LinearSlot>(s);
      matrices[blk + std::string(SlotName(slot)) + ".weight"] = {&b.linear[s],
                                                                 SlotShape(c, slot)[1]};
    }
  }
  // The head's rows stored apart (token_embd.rows.*) are re-fitted from the trained embedding too.
  std::vector<float> rows_apart;
  if (const NamedTensor* ids = ck.FindTensor("token_embd.rows.ids"); ids != nullptr) {
    if (ids->tensor.dtype() != DType::kI32 || ids->tensor.rank() != 1) {
      return InvalidInput("finetune: tensor 'token_embd.rows.ids' must be i32 [K], is " +
                          ids->tensor.ShapeString());
    }
    const int32_t* id = ids->tensor.data_as<int32_t>();
    for (int64_t j = 0; j < ids->tensor.dim(0); ++j) {
      if (id[j] < 0 || id[j] >= c.n_vocab) {
        return InvalidInput("finetune: token_embd.rows.ids[" + std::to_string(j) + "] = " +
                            std::to_string(id[j]) + " is outside the vocabulary");
      }
      const float* r = w.token_embd.data() + int64_t{id[j]} * c.n_embd;
      rows_apart.insert(rows_apart.end(), r, r + c.n_embd);
    }
    matrices["token_embd.rows.weight"] = {&rows_apart, c.n_embd};
  }
  // The embedding is a plain tensor unless the student stored it as a matrix.
  if (ck.FindMatrix("token_embd.weight") == nullptr) {
    SPARQ_RETURN_IF_ERROR(WritePlain(&ck, "token_embd.weight", w.token_embd));
    matrices.erase("token_embd.weight");
  }
  for (CheckpointTensor& ct : ck.matrices) {
    auto it = matrices.find(ct.name);
    if (it == matrices.end()) continue;  // nothing trained under this name: kept as it was
    const std::vector<float>& src = *it->second.first;
    const int64_t k = it->second.second;
    const auto m = static_cast<int64_t>(src.size()) / k;
    if (Rows(ct.matrix) != m || Cols(ct.matrix) != k) {
      return InvalidInput("finetune: matrix '" + ct.name + "' of " + student_path + " is [" +
                          std::to_string(Rows(ct.matrix)) + ", " + std::to_string(Cols(ct.matrix)) +
                          "], the trained one [" + std::to_string(m) + ", " + std::to_string(k) +
                          "]");
    }
    std::vector<float> stored;
    std::span<const float> wp = src;
    if (const NamedTensor* p = ck.FindTensor(ct.name + ".perm"); p != nullptr) {
      // The file stores W_p[:, j] = W[:, perm[j]] (the runtime gathers X by perm).
      if (p->tensor.dtype() != DType::kI32 || p->tensor.numel() != uint64_t(k)) {
        return InvalidInput("finetune: tensor '" + ct.name + ".perm' must be i32[" +
                            std::to_string(k) + "], is " + p->tensor.ShapeString());
      }
      const std::span<const int32_t> perm(p->tensor.data_as<int32_t>(), k);
      SPARQ_RETURN_IF_ERROR(ValidatePermutation(perm, k, ct.name + ".perm"));
      stored.resize(src.size());
      for (int64_t r = 0; r < m; ++r)
        for (int64_t j = 0; j < k; ++j) stored[r * k + j] = src[r * k + perm[j]];
      wp = stored;
    }
    SPARQ_RETURN_IF_ERROR(WriteMatrix(&ct, wp, numbers_only));
    matrices.erase(it);
  }
  if (!matrices.empty()) {
    return InvalidInput("finetune: " + student_path + " has no matrix '" + matrices.begin()->first +
                        "'");
  }
  return ck;
}

Status WriteFinetunedCheckpoint(const std::string& student_path, const LlamaConfig& c,
                                const ModelWeights& w, const std::string& out_path,
                                const std::map<std::string, std::string>& metadata) {
  SPARQ_ASSIGN_OR_RETURN(Checkpoint ck, FinetunedCheckpoint(student_path, c, w, false));
  for (const auto& [key, value] : metadata) ck.metadata[key] = value;
  return WriteCheckpoint(out_path, ck);
}

}  // namespace sparq::train
