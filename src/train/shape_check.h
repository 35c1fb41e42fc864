// Shape checks shared by the train ops: a span's size against the product of its dimensions.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>

#include "sparq/checked.h"
#include "sparq/status.h"
#include "sparq/train_ops.h"

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

// The argument checks of the ops that have a reference and a fast version (the same messages):
// attention's shape and q / k / v sizes (attention.cc), the losses' sizes, ids and temperature
// (loss.cc). `dlogits` / `dstudent` may be empty (no gradient).
Status CheckAttention(const char* op, const AttentionShape& s, std::span<const float> q,
                      std::span<const float> k, std::span<const float> v);
Status CheckCrossEntropyArgs(std::span<const float> logits, std::span<const int32_t> targets,
                             int64_t n, int64_t vocab, std::span<const float> dlogits);
Status CheckKlArgs(std::span<const float> teacher, std::span<const float> student, int64_t n,
                   int64_t vocab, double tau, std::span<const float> dstudent);

}  // namespace sparq::train
