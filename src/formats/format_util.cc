#include "src/formats/format_util.h"

#include <string>

namespace sparq::formats_internal {
namespace {

std::string ShapeList(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

}  // namespace

Status CheckPart(const Tensor& t, const std::string& what, std::initializer_list<DType> dtypes,
                 const std::vector<int64_t>& shape) {
  bool dtype_ok = false;
  std::string dtype_text;
  for (DType d : dtypes) {
    dtype_ok |= t.dtype() == d;
    if (!dtype_text.empty()) dtype_text += "|";
    dtype_text += std::string(DTypeName(d));
  }
  if (!dtype_ok || t.shape() != shape) {
    return InvalidInput(what + ": expected " + dtype_text + ShapeList(shape) + ", got " +
                        (t.empty() ? std::string("nothing") : t.ShapeString()));
  }
  if (t.nbytes() > 0 && t.data() == nullptr) {
    return InvalidInput(what + ": " + t.ShapeString() + " has no data");
  }
  return Status::Ok();
}

Status CheckDims(int64_t rows, int64_t cols, const std::string& name) {
  if (rows < 0 || cols < 0) {
    return InvalidInput(name + ": negative shape " + std::to_string(rows) + " x " +
                        std::to_string(cols));
  }
  // The dense f32 form must be addressable: rows * cols * 4 bytes within int64; and each side
  // alone times 16 (index bits per column, row pointers) too, also when the other side is 0.
  SPARQ_ASSIGN_OR_RETURN(uint64_t n, CheckedNumel({rows, cols, 4}, name + ": shape"));
  SPARQ_ASSIGN_OR_RETURN(uint64_t nr, CheckedNumel({rows, 16}, name + ": rows"));
  SPARQ_ASSIGN_OR_RETURN(uint64_t nc, CheckedNumel({cols, 16}, name + ": cols"));
  (void)n;
  (void)nr;
  (void)nc;
  return Status::Ok();
}

Status CheckDenseInput(std::span<const float> w, int64_t rows, int64_t cols, DType value_dtype,
                       const char* what) {
  SPARQ_RETURN_IF_ERROR(CheckDims(rows, cols, what));
  if (w.size() != static_cast<uint64_t>(rows) * static_cast<uint64_t>(cols)) {
    return InvalidInput(std::string(what) + ": " + std::to_string(w.size()) +
                        " values for a " + std::to_string(rows) + " x " + std::to_string(cols) +
                        " matrix");
  }
  if (!IsValueDType(value_dtype)) {
    return InvalidInput(std::string(what) + ": value dtype " +
                        std::string(DTypeName(value_dtype)) + " is not f32, bf16 or f16");
  }
  return Status::Ok();
}

}  // namespace sparq::formats_internal
