// Writes trained f32 masters back into the student's .sparq (sparq/finetune.h): the student's file
// is the template, so every matrix keeps its format, indices, pattern and value dtype and only its
// values change.
// Route: the value slots of a matrix are mapped to dense positions by decoding a probe copy whose
// values are their own slot numbers (ToDense, in 12-bit digits so that each probe value is an
// exact f32 integer). This works for every format through its own decoder, so no format's layout
// is repeated here, and the stored structure is kept bit for bit.
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

namespace sparq::train {
namespace {

// Bits of the slot number each probe decodes: digit + 1 <= 4096 is exact in f32 (and never 0, so
// a decoded 0 means "no slot here").
constexpr int kDigitBits = 12;

const Tensor& ValuesOf(const SparseMatrix& s) {
  return std::visit([](const auto& x) -> const Tensor& { return x.values; }, s);
}
Tensor& MutableValuesOf(SparseMatrix& s) {
  return std::visit([](auto& x) -> Tensor& { return x.values; }, s);
}

// The dense flat position (r * cols + c) of every value slot of sm; -1 for a padding slot.
std::vector<int64_t> SlotPositions(const SparseMatrix& sm) {
  const Tensor& vals = ValuesOf(sm);
  const auto nv = static_cast<int64_t>(vals.numel());
  std::vector<int64_t> pos(nv, -1);
  if (KindOf(sm) == FormatKind::kDense) {
    for (int64_t i = 0; i < nv; ++i) pos[i] = i;
    return pos;
  }
  const int64_t n_dense = Rows(sm) * Cols(sm);
  std::vector<int64_t> slot(n_dense, 0);
  std::vector<bool> hit(n_dense, false);
  SparseMatrix probe = sm;  // shares the structure's buffers; its values are replaced below
  for (int shift = 0; shift == 0 || (nv - 1) >> shift > 0; shift += kDigitBits) {
    Tensor pv = Tensor::Alloc(DType::kF32, vals.shape());
    float* p = pv.mutable_data_as<float>();
    for (int64_t i = 0; i < nv; ++i) {
      p[i] = static_cast<float>(((i >> shift) & ((1 << kDigitBits) - 1)) + 1);
    }
    MutableValuesOf(probe) = std::move(pv);
    const Tensor d = ToDense(probe);
    const float* dp = d.data_as<float>();
    for (int64_t j = 0; j < n_dense; ++j) {
      if (dp[j] == 0.0f) continue;
      hit[j] = true;
      slot[j] |= (static_cast<int64_t>(dp[j]) - 1) << shift;
    }
  }
  for (int64_t j = 0; j < n_dense; ++j) {
    if (hit[j]) pos[slot[j]] = j;
  }
  return pos;
}

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

// Replaces the values of ct.matrix with w [m, k] (in the stored column order).
Status WriteMatrix(CheckpointTensor* ct, std::span<const float> w) {
  const std::string& name = ct->name;
  const Tensor& old = ValuesOf(ct->matrix);
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
  // The mask is fixed: a weight with no stored value (or a stored 0 of a sparse format) must have
  // stayed exactly 0, or writing would silently drop what was trained.
  for (size_t j = 0; j < w.size(); ++j) {
    if (!covered[j] && w[j] != 0.0f) {
      return InvalidInput("finetune: tensor '" + name + "' weight (" + std::to_string(j / k) +
                          ", " + std::to_string(j % k) + ") is pruned in the student but " +
                          std::to_string(w[j]) + " after training: the mask must stay fixed");
    }
  }
  Tensor t = Tensor::Alloc(old.dtype(), old.shape());
  SPARQ_RETURN_IF_ERROR(StoreValues(&t, nv, name));
  MutableValuesOf(ct->matrix) = std::move(t);
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

Status WriteFinetunedCheckpoint(const std::string& student_path, const LlamaConfig& c,
                                const ModelWeights& w, const std::string& out_path,
                                const std::map<std::string, std::string>& metadata) {
  SPARQ_ASSIGN_OR_RETURN(Checkpoint ck, ReadCheckpoint(student_path));
  if (!c.tied_output) {
    return Unsupported("finetune: " + student_path + " has an untied output head");
  }
  for (const CheckpointTensor& ct : ck.matrices) {
    if (IsQuantized(ct.matrix)) {
      return Unsupported("finetune: quantized students are not supported yet (tensor " + ct.name +
                         ")");
    }
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
    SPARQ_RETURN_IF_ERROR(WriteMatrix(&ct, wp));
    matrices.erase(it);
  }
  if (!matrices.empty()) {
    return InvalidInput("finetune: " + student_path + " has no matrix '" + matrices.begin()->first +
                        "'");
  }
  for (const auto& [key, value] : metadata) ck.metadata[key] = value;
  return WriteCheckpoint(out_path, ck);
}

}  // namespace sparq::train
