// GroupQuantizer (prune.h): sparq's stored-value grid (sparq/quant.h) as SparseGPT's quantizer.
#include <algorithm>
#include <string>
#include <vector>

#include "sparq/prune.h"

namespace sparq {

Result<GroupQuantizer> GroupQuantizer::Make(const ValueSpec& spec, const Pattern& p, int64_t rows,
                                            int64_t cols) {
  if (!spec.quantized()) return InvalidInput("GroupQuantizer: '" + spec.Name() + "' is not quantized");
  GroupQuantizer q;
  q.spec_ = spec;
  if (p.kind == PatternKind::kNM || p.kind == PatternKind::kVNM) {
    if (spec.group % p.n != 0) {
      return InvalidInput("values " + spec.Name() + ": a group of " + std::to_string(spec.group) +
                          " kept values is not a whole number of " + p.ToString() + " groups");
    }
    q.dense_group_ = int64_t{spec.group} / p.n * p.m;
  } else if (p.kind == PatternKind::kDense || p.kind == PatternKind::kBlock) {
    // Dense and BSR: groups of spec.group dense columns (format.h), a block's stored values all
    // kept, so nothing of the mask needs keeping.
    q.dense_group_ = spec.group;
  } else if (p.kind == PatternKind::kUnstructured || p.kind == PatternKind::kRows ||
             p.kind == PatternKind::kCols) {
    // Stored as CSR, whose groups are spec.group dense columns (format.h CsrMatrix). The masks
    // are chosen before the sweep reaches a group, so FitGroup sees the final mask: keep it.
    q.dense_group_ = spec.group;
    q.cols_ = cols;
    q.kept_.assign(static_cast<size_t>(rows * cols), 0);
  } else {
    return InvalidInput("values " + spec.Name() +
                        ": quantized values need a dense, N:M, V:N:M, "
                        "block, unstructured, rows or cols pattern, not " +
                        p.ToString());
  }
  q.per_row_ = (cols + q.dense_group_ - 1) / q.dense_group_;
  q.groups_.assign(static_cast<size_t>(rows * q.per_row_), QuantGroup{});
  q.errors_.assign(static_cast<size_t>(rows), std::string());
  return q;
}

void GroupQuantizer::FitGroup(int64_t row, int64_t col, const float* w, const uint8_t* keep,
                              int64_t len) {
  if (!kept_.empty()) std::copy(keep, keep + len, kept_.begin() + row * cols_ + col);
  std::vector<float> kept;
  kept.reserve(static_cast<size_t>(spec_.group));
  for (int64_t j = 0; j < len; ++j) {
    if (keep[j]) kept.push_back(w[j]);
  }
  auto g = FitQuantGroup(kept.data(), static_cast<int64_t>(kept.size()), spec_);
  const int64_t gi = col / dense_group_;
  if (!g.ok()) {
    if (errors_[row].empty()) {
      errors_[row] = "row " + std::to_string(row) + " group " + std::to_string(gi) + ": " +
                     g.status().message();
    }
    return;
  }
  groups_[row * per_row_ + gi] = *g;
}

float GroupQuantizer::Quantize(int64_t row, int64_t col, float w) const {
  const QuantGroup& g = groups_[row * per_row_ + col / dense_group_];
  return Dequantize(NearestCode(w, g, spec_), g, spec_);
}

Status GroupQuantizer::status() const {
  for (const std::string& e : errors_) {
    if (!e.empty()) return InvalidInput("values " + spec_.Name() + ": " + e);
  }
  return Status::Ok();
}

}  // namespace sparq
