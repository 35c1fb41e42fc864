// Opens any model file sparq reads (GGUF, safetensors, sparq checkpoint; told apart by
// DetectModelFile, model_file.h) as a list of named tensors that can each be read as dense f32.
// Shared by `sparq inspect` and `sparq convert`. A folder (Hugging Face layout) is an error that
// says so: these commands work on one file.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "sparq/checkpoint.h"
#include "sparq/gguf.h"
#include "sparq/model_file.h"
#include "sparq/safetensors.h"
#include "sparq/status.h"
#include "sparq/tensor.h"

namespace sparq::cli {


struct SourceTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::string dtype;          // as stored: "Q4_1", "f32", "bf16" (sparq: the value dtype)
  std::string format;         // "dense" or the sparq format name ("nm", "csr", ...)
  uint64_t stored_bytes = 0;  // bytes the file spends on it (all parts for sparse matrices)
  bool can_read = true;       // false: listed, but sparq cannot convert it to f32
  int gguf_index = -1;        // index into gguf->tensors()
  int matrix_index = -1;      // index into ckpt->matrices
  int plain_index = -1;       // index into ckpt->tensors (safetensors files too)
};

struct ModelSource {
  std::string path;
  ModelFileKind kind = ModelFileKind::kSafetensors;
  uint64_t file_bytes = 0;
  std::optional<GgufFile> gguf;
  std::optional<Checkpoint> ckpt;  // safetensors files are read as checkpoints without matrices
  std::vector<SourceTensor> tensors;

  static Result<ModelSource> Open(const std::string& path);
  // Dense f32 in the tensor's row-major shape. Errors for unreadable types or shapes too large
  // to densify in this machine's memory.
  Result<Tensor> ReadF32(const SourceTensor& t) const;
  // The tensor as stored when it is a plain float tensor (f32/f16/bf16, a view, no copy);
  // nullopt otherwise (quantized GGUF types, sparse matrices).
  std::optional<Tensor> PlainFloat(const SourceTensor& t) const;
};

}  // namespace sparq::cli
