// The cubic gradual pruning schedule of Zhu & Gupta, "To prune, or not to prune" (2017).
#include <algorithm>
#include <cmath>

#include "sparq/prune.h"

namespace sparq {

Status CubicSchedule::Validate() const {
  if (!(initial_sparsity >= 0 && initial_sparsity <= 1 && final_sparsity >= 0 &&
        final_sparsity <= 1)) {
    return InvalidInput("cubic schedule: sparsities must be in [0, 1]");
  }
  if (num_updates < 1 || frequency < 1 || start_step < 0) {
    return InvalidInput("cubic schedule: needs num_updates >= 1, frequency >= 1, start_step >= 0");
  }
  return Status::Ok();
}

double CubicSchedule::At(int64_t step) const {
  if (step < start_step) return initial_sparsity;
  const int64_t span = num_updates * frequency;
  const int64_t t = std::min((step - start_step) / frequency * frequency, span);
  const double r = 1.0 - static_cast<double>(t) / static_cast<double>(span);
  return final_sparsity + (initial_sparsity - final_sparsity) * r * r * r;
}

bool CubicSchedule::IsUpdateStep(int64_t step) const {
  return step >= start_step && step <= start_step + num_updates * frequency &&
         (step - start_step) % frequency == 0;
}

}  // namespace sparq
