#include "sparq/checked.h"

#include <vector>

namespace sparq {

Result<uint64_t> CheckedNumel(std::span<const int64_t> dims, const std::string& what,
                              uint64_t limit) {
  uint64_t n = 1;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] < 0) {
      return InvalidInput(what + ": negative dimension " + std::to_string(dims[i]) + " at axis " +
                          std::to_string(i));
    }
    auto p = CheckedMul(n, static_cast<uint64_t>(dims[i]));
    if (!p || *p > limit) {
      return InvalidInput(what + ": dimension product overflows (axis " + std::to_string(i) + ")");
    }
    n = *p;
  }
  return n;
}

Result<uint64_t> CheckedNumel(std::initializer_list<int64_t> dims, const std::string& what,
                              uint64_t limit) {
  std::vector<int64_t> v(dims);
  return CheckedNumel(std::span<const int64_t>(v), what, limit);
}

}  // namespace sparq
