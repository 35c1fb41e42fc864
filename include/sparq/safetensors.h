// safetensors reader and writer (https://github.com/huggingface/safetensors, format v0.4).
//
// File layout: u64 little-endian header length N, N bytes of JSON header, then the data section.
// The header maps tensor names to {"dtype", "shape", "data_offsets": [begin, end)} (offsets
// relative to the data section) plus an optional "__metadata__" string -> string map.
//
// Reading: the file is memory-mapped and every tensor is a read-only Tensor::View into the
// mapping (the mapping is the view's keepalive, so tensors outlive the SafetensorsFile). If the
// file puts a tensor at an address not aligned to its element size (legal but rare) that tensor is
// copied into an aligned buffer instead, so consumers may always load elements directly.
//
// Validation (file is hostile; each failure names the file, the tensor and the field):
//   header length beyond the file or above 100 MB, invalid JSON, nesting deeper than 64,
//   duplicate keys, unknown dtype, dimensions that are negative / not integers / overflow when
//   multiplied, data_offsets not [begin <= end] or beyond the data section, a byte span that does
//   not equal numel * dtype size, overlapping tensors, gaps between tensors or trailing bytes.
// Like the reference implementation, sparq requires the tensors to cover the data section
// contiguously (no gaps, nothing after the last tensor). Zero-sized dimensions are legal (the
// tensor then spans zero bytes): sparse checkpoints use them for empty parts.
//
// Writing: tensors are laid out contiguously, ordered by decreasing element size (then in the
// order given), and the header is padded with spaces so the data section starts at a multiple of
// 64 bytes; hence every tensor of a sparq-written file is naturally aligned in the mapping. The
// file is written to a temporary name and renamed (atomic). Output is deterministic: the same
// tensors and metadata give the same bytes.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sparq/status.h"
#include "sparq/tensor.h"

namespace sparq {

namespace io {
struct ByteSource;
}

struct NamedTensor {
  std::string name;
  Tensor tensor;
};

struct SafetensorsEntry {
  std::string name;
  Tensor tensor;             // view into the file (see above)
  uint64_t data_begin = 0;   // byte range within the data section
  uint64_t data_end = 0;
};

class SafetensorsFile {
 public:
  // Maps and validates the file.
  static Result<SafetensorsFile> Open(const std::string& path);
  // Parses a buffer the caller keeps alive while any returned tensor is used (fuzzers, tests).
  static Result<SafetensorsFile> FromMemory(const void* data, uint64_t size,
                                            const std::string& name = "<memory>");
  static Result<SafetensorsFile> FromSource(const io::ByteSource& src);

  const std::string& path() const { return path_; }
  uint64_t file_size() const { return file_size_; }
  uint64_t header_size() const { return header_size_; }  // the JSON's length N
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // In data-section order.
  const std::vector<SafetensorsEntry>& tensors() const { return tensors_; }
  const SafetensorsEntry* Find(std::string_view name) const;

 private:
  std::string path_;
  uint64_t file_size_ = 0;
  uint64_t header_size_ = 0;
  std::map<std::string, std::string> metadata_;
  std::vector<SafetensorsEntry> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
};

// Largest header sparq reads (the reference implementation's limit).
inline constexpr uint64_t kMaxSafetensorsHeader = 100'000'000;

// Serializes to bytes (the exact file content WriteSafetensors writes). Errors: empty or
// duplicate names, the name "__metadata__", dtypes safetensors cannot spell (i4/u4).
Result<std::vector<uint8_t>> SerializeSafetensors(std::span<const NamedTensor> tensors,
                                                  const std::map<std::string, std::string>& metadata = {});
// Writes atomically (temporary file + rename) without building the whole file in memory.
Status WriteSafetensors(const std::string& path, std::span<const NamedTensor> tensors,
                        const std::map<std::string, std::string>& metadata = {});

}  // namespace sparq
