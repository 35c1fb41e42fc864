// The stored structure of a student's matrix, read through its own decoder (finetune_write.cc,
// finetune_structure.cc): which dense position each value slot holds. Internal to src/train.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sparq/checkpoint.h"
#include "sparq/format.h"
#include "sparq/kernel_config.h"
#include "sparq/thread_pool.h"
#include "sparq/train_model.h"

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

// The `values` tensor of s (numbers or codes).
const Tensor& StoredValues(const SparseMatrix& s);
Tensor& MutableStoredValues(SparseMatrix& s);

// s's structure holding `numbers` (f32, NumberShape(s)) instead of its values, unquantized.
SparseMatrix WithNumbers(const SparseMatrix& s, Tensor numbers);

// OUT's checkpoint as WriteFinetunedCheckpoint (sparq/finetune.h) builds it, without metadata
// (finetune_write.cc). numbers_only: quantized matrices keep their structure but hold the trained
// f32 numbers (no quantization parts): the input of a GPTQ re-quantization.
Result<Checkpoint> FinetunedCheckpoint(const std::string& student_path, const LlamaConfig& c,
                                       const ModelWeights& w, bool numbers_only);

// The quantized block matrices ("blk.*") of student whose values out re-fitted (codes or scales
// differ): the trained ones.
std::vector<std::string> TrainedQuantizedBlockMatrices(const Checkpoint& student,
                                                       const Checkpoint& out);

// What RequantizeWithGptq did with the trained quantized block slots (unchanged ones excluded).
struct GptqRequantReport {
  int64_t candidates = 0;  // trained quantized block slots
  int64_t gptq = 0;        // re-quantized by GPTQ
  int64_t rtn = 0;         // kept round to nearest (structure would change, or permuted)
  std::string note;        // why matrices kept round to nearest (permuted, a GPTQ error), if so
};

// Replaces out's round-to-nearest quantized block matrices (FinetunedCheckpoint of w) by GPTQ's
// with the masks fixed (finetune_gptq.cc: PruneLlama per value spec on a temporary numbers copy
// at tmp_prefix + ".gptq-in.sparq", calibrated on calib_text in 64 segments of calib_len tokens)
// where GPTQ keeps the stored structure bit for bit. The temporary files are removed.
Result<GptqRequantReport> RequantizeWithGptq(const Checkpoint& student,
                                             const std::string& student_path, const LlamaConfig& c,
                                             const ModelWeights& w, std::string_view calib_text,
                                             int64_t calib_len, uint64_t seed,
                                             const std::string& tmp_prefix, const KernelConfig& cfg,
                                             ThreadPool* pool, Checkpoint* out);

}  // namespace sparq::train
