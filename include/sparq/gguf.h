// GGUF reader (versions 2 and 3), as specified in ggml's docs/gguf.md.
//
// The file is memory-mapped; tensor data are views into the mapping (no copy). Every offset,
// length, count and dimension read from the file is bounds- and overflow-checked before use; a
// malformed file yields an error naming the file and the field, never a crash or an allocation
// the size of a lie.
//
// What is rejected (kInvalidInput, message naming the file and the tensor / key / offset): bad
// magic, versions other than 2 and 3, counts or string / array lengths beyond the end of the
// file (counts are capped by the bytes left before anything is reserved), unknown value types,
// arrays nested deeper than 8, bool values other than 0 / 1, duplicate keys or tensor names,
// general.alignment that is not a u32 nonzero power of two, more than 4 dimensions, zero or
// negative dimensions, dimension / byte-size products that overflow, ggml type numbers ggml does
// not define, ne[0] not a multiple of the type's block size, tensor offsets not aligned or whose
// data runs past the end of the file, overlapping tensors. Known but non-dequantizable types
// (IQ2_XXS, Q5_0, ...) open fine and fail in ReadF32 with kUnsupported; a quantized block with a
// non-finite scale fails in ReadF32 with kInvalidInput naming the tensor and the block.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "sparq/format.h"
#include "sparq/status.h"
#include "sparq/tensor.h"

namespace sparq {

// ggml tensor types sparq knows (values as in ggml.h).
enum class GgmlType : uint32_t {
  kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ8_0 = 8, kQ2_K = 10, kQ3_K = 11, kQ4_K = 12,
  kQ5_K = 13, kQ6_K = 14, kBF16 = 30,
};
// A GgmlType may hold any type number ggml defines (IQ2_XXS, Q5_0, ...): such tensors are listed
// and their sizes known, but ReadF32 returns kUnsupported for them.

// Block geometry of a ggml type: `block` elements take `bytes` bytes (F32: 1 and 4; Q4_1: 32 and
// 20). nullopt for type numbers ggml does not define.
struct GgmlBlockInfo {
  int64_t block;
  int64_t bytes;
};
std::optional<GgmlBlockInfo> GgmlTypeBlock(uint32_t type);
// "F32", "Q4_1", "IQ2_XXS", ... or "type<N>" for unknown numbers.
std::string GgmlTypeName(GgmlType type);
// True for the types ReadF32 converts: F32, F16, BF16, Q8_0, Q4_0, Q4_1 and the K-quants Q2_K,
// Q3_K, Q4_K, Q5_K, Q6_K (all dequantized to f32).
bool GgmlTypeCanDequantize(GgmlType type);
// Converts `n` elements (a multiple of the type's block size) from `src` (n / block * bytes
// bytes, any alignment) to f32. Error for unsupported types or a bad n, and kInvalidInput naming
// the block for a quantized block whose f16 scale (or min) is NaN or infinite: no quantizer
// writes one, and letting it through would only turn the block into NaNs.
Status DequantizeGgml(GgmlType type, const void* src, int64_t n, float* dst);

// Q4_0 / Q4_1 / Q8_0 data (`rows` rows of `cols` values, cols a multiple of 32; src holds
// rows * cols / 32 blocks) as a quantized DenseMatrix (format.h) with the file's codes and f16
// scales as they are, no f32 in between: Q8_0 -> int8:g32 (q * d), Q4_0 -> int4:g32:sym
// ((q - 8) * d, sparq's symmetric convention; Q4_0 uses code 0 and negative d, both legal in a
// dense matrix), Q4_1 -> int4:g32 (q * d + m). Nibbles are repacked from ggml's block order (low
// nibbles values 0..15, high 16..31) to sparq's (value 2i low, 2i+1 high in byte i). ToDense()
// equals DequantizeGgml bit for bit (gguf_quantized.cc says why). Errors (naming `what` and the
// block): other types (kUnsupported, naming the type), a non-finite d or m, a Q8_0 code -128.
Result<DenseMatrix> GgmlToQuantizedDense(GgmlType type, const void* src, int64_t rows, int64_t cols,
                                         const std::string& what);

struct GgufValue;
using GgufArray = std::vector<GgufValue>;
// A metadata value: all GGUF value types. Integers keep their signedness/width in `type`.
struct GgufValue {
  enum class Type : uint32_t {
    kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
    kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
  };
  Type type = Type::kU8;
  std::variant<uint64_t, int64_t, double, bool, std::string, std::shared_ptr<GgufArray>> v;

  std::optional<int64_t> AsInt() const;    // any integer type (u64 above INT64_MAX: nullopt)
  std::optional<double> AsFloat() const;   // floats and integers
  const std::string* AsString() const;     // nullptr unless kString
  const GgufArray* AsArray() const;        // nullptr unless kArray
  Type array_type = Type::kU8;             // element type when kArray
};
// "u32", "string", "array", ...
std::string GgufValueTypeName(GgufValue::Type t);
// Short human-readable rendering: numbers, quoted strings (cut at 64 chars), arrays as
// "[string x 49152]" or their first few elements.
std::string GgufValueToString(const GgufValue& v);

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> ne;  // ggml order: ne[0] is the fastest-varying (row length)
  GgmlType type;
  uint64_t offset = 0;      // relative to the data section
  uint64_t nbytes = 0;
  // Row-major shape as sparq uses it: reversed ne (so a ggml weight [ne0=k, ne1=m] is [m, k]).
  std::vector<int64_t> shape() const;
};

class GgufFile {
 public:
  static Result<GgufFile> Open(const std::string& path);
  // Parses a buffer the caller keeps alive while the GgufFile (or a view from it) is used.
  static Result<GgufFile> FromMemory(const void* data, uint64_t size,
                                     const std::string& name = "<memory>");

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  const GgufValue* Find(const std::string& key) const;
  uint64_t file_size() const { return size_; }
  uint64_t data_offset() const { return data_offset_; }  // start of the data section
  // Tensors in the order of the file's tensor-info table.
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* FindTensor(const std::string& name) const;

  // Raw bytes of a tensor (a view into the mapping).
  const uint8_t* TensorData(const GgufTensorInfo& t) const;
  // Dequantized (or converted) to f32, row-major `t.shape()`. kUnsupported (naming the tensor and
  // the type) for types GgmlTypeCanDequantize rejects.
  Result<Tensor> ReadF32(const GgufTensorInfo& t) const;
  // A Q4_0 / Q4_1 / Q8_0 tensor as stored (GgmlToQuantizedDense), rows of ne[0] values:
  // [prod(ne[1..]), ne[0]], so a 2-D weight is [m, k] as in ReadF32.
  Result<DenseMatrix> ReadQuantized(const GgufTensorInfo& t) const;

 private:
  friend class GgufParser;
  std::string path_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::map<std::string, GgufValue> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t> tensor_index_;
  std::shared_ptr<const void> mapping_;  // keeps the mmap alive for views
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  uint64_t data_offset_ = 0;
};

}  // namespace sparq
