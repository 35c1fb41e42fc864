// The sparq checkpoint: a safetensors file (so any safetensors tool opens it) holding
//   * matrices: 2-D weights in any format of format.h. A sparse matrix `<name>` is stored as its
//     parts `<name>.<part>`, part names being the member names of its struct (values, col_idx,
//     row_ptr, row_idx, meta); a DenseMatrix is stored plain under `<name>` itself;
//   * plain tensors of any rank under their own names (embeddings, norms, biases, ...);
//   * __metadata__: key "sparq" holds a JSON string
//       {"format_version": 2,
//        "tensors": {"<name>": {"format": "nm", "pattern": "2:4", "shape": [m, k],
//                               "dtype": "bf16", "n": 2, "m": 4}, ...}}
//     with "bh"/"bw" for bsr and "v"/"n"/"m" for vnm, "n"/"m" for nm; every other __metadata__
//     entry is free-form (Checkpoint::metadata: model configuration, tokenizer, ...).
//     Version 2 adds quantized nm values (format.h, QuantParts): "values": "int4:g64" (the spec),
//     "dtype" the codes' storage (i8 for int8, u8 for int4), and the parts `<name>.scales` (f16)
//     and, for int4 with a min, `<name>.mins`. Version 1 files read unchanged.
//     A quantized dense matrix is stored the same way ("format": "dense", "values": "int8:g32",
//     parts `<name>.values` (codes i8 [rows, cols] or u8 [rows, ceil(cols/2)]), `<name>.scales`,
//     `<name>.mins`) and never as a plain `<name>` tensor. This needs no new format_version: a
//     version-2 reader that predates it rejects such a file (it allows "values" on nm only, and
//     finds no `<name>` part) rather than misreading it. A quantized csr matrix likewise
//     ("format": "csr", "values": "int4:g64": parts `<name>.row_ptr`, `.col_idx`, `.values` (codes
//     i8 [nnz] or u8 [ceil(nnz/2)]), `.scales` and `.mins` f16 [rows, ceil(cols/G)], a group being
//     G dense columns of a row: format.h); a reader that predates it refuses "values" on csr.
//     Version 3 adds a second index encoding for csr, written whenever it is the smaller one
//     (density above ~1/16 with u16 indices: e.g. 50% unstructured, where u16 column indices
//     would cost 8 bits per dense weight against the mask's 1): "index": "mask" and the part
//     `<name>.mask`, u8 [rows, ceil(cols / 8)], bit (c % 8) of byte c / 8 of a row (LSB first)
//     set when column c holds a stored value, in place of `.row_ptr` and `.col_idx` (which the
//     reader rebuilds); bits past cols must be 0. Version 1 and 2 files read unchanged.
//     Version 4 adds a second meta encoding for nm and vnm, written whenever it is the smaller
//     one (2:4: 3 bits per group against 4; 4:8: 7 against 12; never for 1:M): "meta": "rank"
//     and the part `<name>.meta_rank`, u8 [slabs, ceil(groups * R / 8)] with R = ceil(log2
//     C(m, n)): per group, LSB first, the rank of its ascending indices c_1 < ... < c_n in the
//     combinatorial number system, sum over j of C(c_j, j), below C(m, n); bits past the last
//     group must be 0. The reader rebuilds `.meta` from it. Earlier versions read unchanged.
// A tensor that is not listed under "sparq" is a plain tensor, so a plain safetensors file reads
// as a checkpoint without matrices.
//
// Reading maps the file; every part is a zero-copy view (see safetensors.h) kept alive by the
// mapping. Each matrix's parts must exist with the dtypes and shapes its metadata implies, and
// the matrix must pass Validate(name) (format.h), before it is returned: a hostile file gives an
// error naming the file, the tensor and the field, never a crash.
// Writing is atomic (temporary file + rename) and deterministic (same input, same bytes).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "sparq/format.h"
#include "sparq/pattern.h"
#include "sparq/safetensors.h"
#include "sparq/status.h"

namespace sparq {

inline constexpr int kCheckpointFormatVersion = 4;
inline constexpr char kCheckpointMetadataKey[] = "sparq";

struct CheckpointTensor {
  std::string name;       // logical name, e.g. "blk.0.attn_q.weight"
  SparseMatrix matrix;    // any format; its parts are stored as `<name>.<part>`
  Pattern pattern;        // the pattern the matrix was pruned to (Pattern::Dense() if none)
};

struct Checkpoint {
  std::vector<CheckpointTensor> matrices;
  std::vector<NamedTensor> tensors;              // plain tensors (any rank and safetensors dtype)
  std::map<std::string, std::string> metadata;   // free-form; the key "sparq" is reserved

  const CheckpointTensor* FindMatrix(const std::string& name) const;
  const NamedTensor* FindTensor(const std::string& name) const;
};

// How matrices are written. csr_mask_index: a csr matrix's indices as a bit mask when that is
// smaller (above); false writes row_ptr / col_idx always (what a version-2 reader needs).
// nm_rank_meta: an nm / vnm meta as ranks when that is smaller; false writes the indices (what a
// version-3 reader needs).
struct CheckpointWriteOptions {
  bool csr_mask_index = true;
  bool nm_rank_meta = true;
};

// The bytes a checkpoint spends on the matrix's parts (the index as written under `opt`):
// what `inspect` and the reports call stored.
uint64_t StoredByteSize(const SparseMatrix& s, const CheckpointWriteOptions& opt = {});

// The bytes `file` (a checkpoint) holds for the parts of the matrix `name`, read from it as `s`:
// StoredByteSize under the options the file was written with (an older file's indices where
// today's writer would write a mask or ranks), which `inspect` reports.
uint64_t FileByteSize(const SafetensorsFile& file, const std::string& name, const SparseMatrix& s);

// The safetensors tensors (parts and plain tensors) and __metadata__ a checkpoint is stored as.
// Errors: duplicate names (a part colliding with a plain tensor too), the reserved metadata key.
Status FlattenCheckpoint(const Checkpoint& ckpt, std::vector<NamedTensor>* tensors,
                         std::map<std::string, std::string>* metadata,
                         const CheckpointWriteOptions& opt = {});

Status WriteCheckpoint(const std::string& path, const Checkpoint& ckpt,
                       const CheckpointWriteOptions& opt = {});
Result<std::vector<uint8_t>> SerializeCheckpoint(const Checkpoint& ckpt,
                                                 const CheckpointWriteOptions& opt = {});

Result<Checkpoint> ReadCheckpoint(const std::string& path);
// From a parsed safetensors file (views stay valid as long as the file's mapping, which they hold).
Result<Checkpoint> CheckpointFromSafetensors(const SafetensorsFile& file);
// From a caller-owned buffer that must outlive the result's views (fuzzers, tests).
Result<Checkpoint> ReadCheckpointFromMemory(const void* data, uint64_t size,
                                            const std::string& name = "<memory>");

// True if the file's __metadata__ marks it as a sparq checkpoint.
bool IsSparqCheckpoint(const SafetensorsFile& file);

}  // namespace sparq
