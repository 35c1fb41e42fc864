// The quantized slots of a student as training masters and masks (sparq/finetune.h,
// StudentQuantizedMasters): FromLlamaModel reads a sparse slot's kept positions from its nonzero
// values, but a kept quantized weight can dequantize to exactly 0 (symmetric int4 code 8, int8
// code 0), which would freeze it and label it pruned. Here the mask comes from the stored
// structure (SlotPositions: N:M metadata, CSR indices) and the masters from Dequantize (ToDense).
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "sparq/finetune.h"
#include "sparq/prune.h"
#include "src/train/stored_slots.h"

namespace sparq::train {

Status StudentQuantizedMasters(const Checkpoint& ck, const LlamaConfig& c, TrainableModel* tm) {
  if (static_cast<int64_t>(tm->weights.blocks.size()) != c.n_layer ||
      static_cast<int64_t>(tm->masks.size()) != c.n_layer) {
    return InvalidInput("finetune: the training model has " +
                        std::to_string(tm->weights.blocks.size()) + " blocks, the student " +
                        std::to_string(c.n_layer));
  }
  for (int64_t l = 0; l < c.n_layer; ++l) {
    for (int s = 0; s < kNumSlots; ++s) {
      const auto slot = static_cast<LinearSlot>(s);
      const std::string name =
          "blk." + std::to_string(l) + "." + std::string(SlotName(slot)) + ".weight";
      const CheckpointTensor* ct = ck.FindMatrix(name);
      if (ct == nullptr || !IsQuantized(ct->matrix)) continue;
      const auto [m, k] = SlotShape(c, slot);
      if (Rows(ct->matrix) != m || Cols(ct->matrix) != k) {
        return InvalidInput("finetune: matrix '" + name + "' is [" +
                            std::to_string(Rows(ct->matrix)) + ", " +
                            std::to_string(Cols(ct->matrix)) + "], the model's [" +
                            std::to_string(m) + ", " + std::to_string(k) + "]");
      }
      // Stored column j is the model's column col[j] (a channel-permuted slot: perm[j]).
      std::vector<int64_t> col(k);
      for (int64_t j = 0; j < k; ++j) col[j] = j;
      if (const NamedTensor* p = ck.FindTensor(name + ".perm"); p != nullptr) {
        if (p->tensor.dtype() != DType::kI32 || p->tensor.numel() != uint64_t(k)) {
          return InvalidInput("finetune: tensor '" + name + ".perm' must be i32[" +
                              std::to_string(k) + "], is " + p->tensor.ShapeString());
        }
        const std::span<const int32_t> perm(p->tensor.data_as<int32_t>(), k);
        SPARQ_RETURN_IF_ERROR(ValidatePermutation(perm, k, name + ".perm"));
        for (int64_t j = 0; j < k; ++j) col[j] = perm[j];
      }
      const Tensor d = ToDense(ct->matrix);  // the stored values, dequantized
      const float* dp = d.data_as<float>();
      std::vector<float>& dst = tm->weights.blocks[l].linear[s];
      dst.assign(m * k, 0.0f);
      for (int64_t r = 0; r < m; ++r)
        for (int64_t j = 0; j < k; ++j) dst[r * k + col[j]] = dp[r * k + j];
      std::vector<int64_t>& kept = tm->masks[l].kept[s];
      kept.clear();
      if (KindOf(ct->matrix) == FormatKind::kDense) continue;  // every weight trains
      for (int64_t p : SlotPositions(ct->matrix)) {
        if (p >= 0) kept.push_back((p / k) * k + col[p % k]);
      }
      std::sort(kept.begin(), kept.end());
      if (kept.empty()) kept.push_back(0);  // as FromLlamaModel: "none kept" reads as dense
    }
  }
  return Status::Ok();
}

}  // namespace sparq::train
