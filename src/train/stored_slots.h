// The stored structure of a student's matrix, read through its own decoder (finetune_write.cc,
// finetune_structure.cc): which dense position each value slot holds. Internal to src/train.
#pragma once

#include <cstdint>
#include <vector>

#include "sparq/format.h"

namespace sparq::train {

// The quantization parts of s (N:M, CSR, dense), or nullptr for a format that has none.
const QuantParts* QuantOf(const SparseMatrix& s);

// The shape s's values have as numbers: `values`' shape, or for quantized codes the shape of the
// numbers they stand for (N:M [rows, groups * n], CSR [nnz], dense [rows, cols]).
std::vector<int64_t> NumberShape(const SparseMatrix& s);

// The dense flat position (r * cols + c, in stored column order) of every value slot of s, in the
// order of its values (numbers, or codes); -1 for a slot that stands for nothing (an N:M slot in
// the padded tail group). Quantized or not: the positions come from the structure (N:M metadata,
// CSR indices) alone, so a kept weight whose value is 0 still has its slot.
std::vector<int64_t> SlotPositions(const SparseMatrix& s);

}  // namespace sparq::train
