// Tensor: a dtype, a row-major shape and a byte buffer that is either owned (64-byte aligned,
// zero-initialised) or a read-only view into memory someone else keeps alive (a memory-mapped file).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sparq/dtype.h"
#include "sparq/status.h"

namespace sparq {

inline constexpr size_t kTensorAlignment = 64;  // a cache line; also enough for any SIMD load

class Tensor {
 public:
  Tensor() = default;

  // Owned, zero-filled, 64-byte-aligned. For sizes sparq computed itself (trusted); aborts only
  // if the allocation itself fails. Use TryAlloc for sizes derived from a file or a flag.
  static Tensor Alloc(DType dtype, std::vector<int64_t> shape);
  // Like Alloc, but checks the shape (no negative dims, no overflow, at most `max_bytes`).
  static Result<Tensor> TryAlloc(DType dtype, std::vector<int64_t> shape,
                                 const std::string& what, uint64_t max_bytes = uint64_t{1} << 40);
  // Non-owning read-only view; `keepalive` (may be null) holds whatever owns `data`.
  static Tensor View(DType dtype, std::vector<int64_t> shape, const void* data,
                     std::shared_ptr<const void> keepalive = nullptr);
  // Owned copy of the data and shape.
  Tensor Clone() const;

  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const { return shape_[i < 0 ? i + rank() : i]; }
  uint64_t numel() const { return numel_; }
  uint64_t nbytes() const { return DTypeBytes(dtype_, numel_); }
  // Row-major strides in elements.
  std::vector<int64_t> strides() const;
  bool empty() const { return data_ == nullptr && numel_ == 0 && shape_.empty(); }
  bool owned() const { return writable_; }

  const void* data() const { return data_; }
  // Mutable access; precondition: owned() (views are read-only).
  void* mutable_data();
  template <typename T>
  const T* data_as() const {
    return static_cast<const T*>(data_);
  }
  template <typename T>
  T* mutable_data_as() {
    return static_cast<T*>(mutable_data());
  }

  // Same bytes, new shape with the same element count (shares the buffer).
  Result<Tensor> Reshape(std::vector<int64_t> shape) const;
  // "f32[576, 1536]"
  std::string ShapeString() const;

 private:
  DType dtype_ = DType::kF32;
  std::vector<int64_t> shape_;
  uint64_t numel_ = 0;
  void* data_ = nullptr;
  bool writable_ = false;
  std::shared_ptr<const void> holder_;
};

// Element-wise conversions of a whole tensor to f32 (from f32/f16/bf16/f64/i8/u8/i16/i32) and
// from f32 to f32/f16/bf16. Error for other types.
Result<Tensor> ToF32(const Tensor& t);
Result<Tensor> FromF32(const Tensor& t, DType target);

}  // namespace sparq
