// StoreLinearsAsBf16 (sparq/model.h): the dense model with its linear layers stored bf16.
#include <span>
#include <vector>

#include "sparq/model.h"

namespace sparq {
namespace {

Result<LinearWeight> DenseBf16(const LinearWeight& w, const std::string& name) {
  const float* f = w.dense_f32();
  if (f == nullptr) {
    return InvalidInput(name + " is stored as " + w.format() + ", not dense f32: only a dense model "
                        "converts to dense bf16");
  }
  const uint64_t n = static_cast<uint64_t>(w.rows()) * static_cast<uint64_t>(w.cols());
  SPARQ_ASSIGN_OR_RETURN(DenseMatrix d, DenseMatrix::FromDense(std::span<const float>(f, n), w.rows(),
                                                               w.cols(), DType::kBF16));
  return LinearWeight::FromMatrix(SparseMatrix(std::move(d)), name, w.config());  // its own target
}

}  // namespace

Status StoreLinearsAsBf16(LlamaModel* model) {
  LlamaWeights& w = model->mutable_weights();
  // Convert everything first, then swap in, so an error leaves the model as it was.
  std::vector<LinearWeight> blocks;
  blocks.reserve(w.blocks.size() * kNumSlots);
  for (size_t l = 0; l < w.blocks.size(); ++l) {
    for (int s = 0; s < kNumSlots; ++s) {
      const std::string name = "blk." + std::to_string(l) + "." +
                               std::string(SlotName(static_cast<LinearSlot>(s))) + ".weight";
      SPARQ_ASSIGN_OR_RETURN(LinearWeight b, DenseBf16(w.blocks[l].linear[s], name));
      blocks.push_back(std::move(b));
    }
  }
  SPARQ_ASSIGN_OR_RETURN(LinearWeight head, DenseBf16(w.output, "output.weight"));
  for (size_t l = 0; l < w.blocks.size(); ++l) {
    for (int s = 0; s < kNumSlots; ++s) w.blocks[l].linear[s] = std::move(blocks[l * kNumSlots + s]);
  }
  w.output = std::move(head);
  return Status::Ok();
}

}  // namespace sparq
