#include "src/formats/format_util.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "sparq/format.h"

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
    return InvalidInput(std::string(what) + ": " + std::to_string(w.size()) + " values for a " +
                        std::to_string(rows) + " x " + std::to_string(cols) + " matrix");
  }
  if (!IsValueDType(value_dtype)) {
    return InvalidInput(std::string(what) + ": value dtype " + std::string(DTypeName(value_dtype)) +
                        " is not f32, bf16 or f16");
  }
  return Status::Ok();
}

Status ValidateGroupParams(const QuantParts& q, int64_t rows, int64_t qg, const std::string& name,
                           bool signed_scales) {
  const ValueSpec& spec = q.spec;
  SPARQ_RETURN_IF_ERROR(CheckPart(q.scales, name + ".scales", {DType::kF16}, {rows, qg}));
  if (spec.has_min()) {
    SPARQ_RETURN_IF_ERROR(CheckPart(q.mins, name + ".mins", {DType::kF16}, {rows, qg}));
  } else if (q.mins.numel() != 0) {
    return InvalidInput(name + ".mins: present, but " + spec.Name() + " values have no min");
  }
  const uint16_t* sc = q.scales.data_as<uint16_t>();
  const uint16_t* mn = spec.has_min() ? q.mins.data_as<uint16_t>() : nullptr;
  const auto at = [qg](int64_t i) {
    return "row " + std::to_string(i / qg) + " group " + std::to_string(i % qg);
  };
  for (int64_t i = 0; i < rows * qg; ++i) {
    const float v = F16ToF32(sc[i]);
    if (!std::isfinite(v) || (!signed_scales && std::signbit(v))) {
      return InvalidInput(name + ".scales: " + at(i) + " has scale " + std::to_string(v) +
                          (signed_scales ? " (scales must be finite)"
                                         : " (scales must be finite and >= 0)"));
    }
    if (mn != nullptr && !std::isfinite(F16ToF32(mn[i]))) {
      return InvalidInput(name + ".mins: " + at(i) + " has a non-finite min");
    }
  }
  return Status::Ok();
}

Status QuantizeRows(const float* values, int64_t rows, int64_t per_row, const ValueSpec& spec,
                    std::span<const QuantGroup> fitted, const std::string& name, Tensor* codes,
                    QuantParts* quant) {
  const int64_t qg = (per_row + spec.group - 1) / spec.group;
  if (!fitted.empty() && fitted.size() != static_cast<size_t>(rows * qg)) {
    return InvalidInput(name + ": " + std::to_string(fitted.size()) + " fitted groups, want " +
                        std::to_string(rows * qg));
  }
  const int64_t row_bytes = CodeRowBytes(spec, per_row);
  *codes = Tensor::Alloc(spec.dtype == DType::kI8 ? DType::kI8 : DType::kU8, {rows, row_bytes});
  if (codes->nbytes() > 0) std::memset(codes->mutable_data(), 0, codes->nbytes());
  quant->spec = spec;
  quant->scales = Tensor::Alloc(DType::kF16, {rows, qg});
  quant->mins = spec.has_min() ? Tensor::Alloc(DType::kF16, {rows, qg}) : Tensor();
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = codes->mutable_data_as<uint8_t>() + r * row_bytes;
    for (int64_t g = 0; g < qg; ++g) {
      const int64_t j0 = g * spec.group, cnt = std::min<int64_t>(spec.group, per_row - j0);
      const float* x = values + r * per_row + j0;
      QuantGroup p;
      if (fitted.empty()) {
        auto f = FitQuantGroup(x, cnt, spec);
        if (!f.ok()) {
          return f.status().WithContext(name + ".values row " + std::to_string(r) + " group " +
                                        std::to_string(g));
        }
        p = *f;
      } else {
        const QuantGroup& in = fitted[r * qg + g];
        p = QuantGroupFromF16(in.scale_f16, in.min_f16, spec);
      }
      quant->scales.mutable_data_as<uint16_t>()[r * qg + g] = p.scale_f16;
      if (spec.has_min()) quant->mins.mutable_data_as<uint16_t>()[r * qg + g] = p.min_f16;
      for (int64_t i = 0; i < cnt; ++i) {
        const int q = NearestCode(x[i], p, spec);
        const int64_t j = j0 + i;
        if (spec.dtype == DType::kI8) {
          row[j] = static_cast<uint8_t>(static_cast<int8_t>(q));
        } else {
          row[j / 2] |= static_cast<uint8_t>(q << (j % 2 ? 4 : 0));
        }
      }
    }
  }
  return Status::Ok();
}

}  // namespace sparq::formats_internal
