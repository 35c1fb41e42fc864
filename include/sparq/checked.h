// Overflow-checked size arithmetic for values that came from outside (file headers, flags).
// ggml's worst bugs were unchecked `rows * cols` products on file-derived sizes; use these instead.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>

#include "sparq/status.h"

namespace sparq {

// a * b, or nullopt on overflow. Both must be >= 0.
inline std::optional<uint64_t> CheckedMul(uint64_t a, uint64_t b) {
  uint64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}
inline std::optional<uint64_t> CheckedAdd(uint64_t a, uint64_t b) {
  uint64_t r;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// Product of dimensions; fails if any is negative or the product (times elem_bytes) exceeds
// `limit` (default: what fits in int64). `what` names the thing for the message.
Result<uint64_t> CheckedNumel(std::span<const int64_t> dims, const std::string& what,
                              uint64_t limit = uint64_t{INT64_MAX});
Result<uint64_t> CheckedNumel(std::initializer_list<int64_t> dims, const std::string& what,
                              uint64_t limit = uint64_t{INT64_MAX});

// ceil(a / b) for b > 0.
constexpr int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
constexpr int64_t RoundUp(int64_t a, int64_t b) { return CeilDiv(a, b) * b; }

}  // namespace sparq
