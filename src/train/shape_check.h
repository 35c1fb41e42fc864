// Shape checks shared by the train ops: a span's size against the product of its dimensions.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>

#include "sparq/checked.h"
#include "sparq/status.h"

namespace sparq::train {

// OK when `s` holds exactly prod(dims) elements (dims >= 0, no overflow); else kInvalidInput
// "<op>: <what> has N elements, expected [d0, d1] = M".
template <typename T>
Status CheckSize(const char* op, const char* what, std::span<T> s,
                 std::initializer_list<int64_t> dims) {
  std::string shape = "[";
  for (int64_t d : dims) shape += (shape.size() > 1 ? ", " : "") + std::to_string(d);
  shape += "]";
  auto numel = CheckedNumel(dims, std::string(op) + ": " + what);
  if (!numel.ok()) return numel.status();
  if (s.size() != *numel) {
    return InvalidInput(std::string(op) + ": " + what + " has " + std::to_string(s.size()) +
                        " elements, expected " + shape + " = " + std::to_string(*numel));
  }
  return Status::Ok();
}

// OK when every id is in [0, limit).
Status CheckIds(const char* op, const char* what, std::span<const int32_t> ids, int64_t limit);

}  // namespace sparq::train
