// Magnitude pruning: scores |W|, per layer / per row through ComputeMask, and global across layers
// (one threshold over all of them).
#include <algorithm>
#include <cmath>

#include "src/prune/prune_internal.h"

namespace sparq {
namespace prune_internal {

std::vector<float> MagnitudeScores(std::span<const float> w) {
  std::vector<float> s(w.size());
  for (size_t i = 0; i < w.size(); ++i) s[i] = std::abs(w[i]);
  return s;
}

}  // namespace prune_internal

Status MagnitudePruneGlobal(std::span<LayerRef> layers, double fraction) {
  if (!(fraction >= 0.0 && fraction <= 1.0)) {
    return InvalidInput("global magnitude pruning: fraction " + std::to_string(fraction) +
                        " is not in [0, 1]");
  }
  uint64_t total = 0;
  for (const LayerRef& l : layers) {
    for (size_t i = 0; i < l.w.size(); ++i) {
      if (!std::isfinite(l.w[i])) {
        return InvalidInput(l.name + ": non-finite weight at flat index " + std::to_string(i));
      }
    }
    total += l.w.size();
  }
  const int64_t nprune = std::llround(fraction * static_cast<double>(total));
  if (nprune <= 0) return Status::Ok();
  // Threshold = the nprune-th smallest |w| over all layers; prune below it, then ties from the
  // last layer's highest index backwards (earlier layer / lower index kept).
  std::vector<float> all;
  all.reserve(total);
  for (const LayerRef& l : layers) {
    for (float x : l.w) all.push_back(std::abs(x));
  }
  std::nth_element(all.begin(), all.begin() + (nprune - 1), all.end());
  const float t = all[nprune - 1];
  all.clear();
  all.shrink_to_fit();
  int64_t below = 0;
  for (const LayerRef& l : layers) {
    for (float x : l.w) below += std::abs(x) < t;
  }
  int64_t ties = nprune - below;
  for (const LayerRef& l : layers) {
    for (float& x : l.w) {
      if (std::abs(x) < t) x = 0.0f;
    }
  }
  for (auto it = layers.rbegin(); it != layers.rend() && ties > 0; ++it) {
    for (int64_t i = static_cast<int64_t>(it->w.size()) - 1; i >= 0 && ties > 0; --i) {
      if (std::abs(it->w[i]) == t) {
        it->w[i] = 0.0f;
        --ties;
      }
    }
  }
  return Status::Ok();
}

}  // namespace sparq
