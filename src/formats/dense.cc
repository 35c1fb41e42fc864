// DenseMatrix: values [rows, cols] in f32 / bf16 / f16, or quantized codes (dense_quant.cc).
#include <algorithm>
#include <string>

#include "sparq/format.h"
#include "src/formats/format_util.h"

namespace sparq {

using namespace formats_internal;  // NOLINT: the codecs and checks of this room

Result<DenseMatrix> DenseMatrix::FromDense(std::span<const float> w, int64_t rows, int64_t cols,
                                           DType value_dtype) {
  SPARQ_RETURN_IF_ERROR(CheckDenseInput(w, rows, cols, value_dtype, "DenseMatrix::FromDense"));
  DenseMatrix out;
  out.rows = rows;
  out.cols = cols;
  out.values = Tensor::Alloc(value_dtype, {rows, cols});
  DispatchValue(value_dtype, [&](auto codec) {
    using C = decltype(codec);
    auto* v = out.values.mutable_data_as<typename C::Storage>();
    for (size_t i = 0; i < w.size(); ++i) v[i] = C::Enc(w[i]);
  });
  return out;
}

Tensor DenseMatrix::StoredValuesF32() const { return ToDense(); }

Tensor DenseMatrix::ToDense() const {
  if (quant.quantized()) {
    // Precondition is a valid matrix; mismatched parts give zeros rather than a bad read.
    if (!Validate("").ok()) return ZeroDense(rows, cols);
    return DenseQuantToF32(*this);
  }
  Tensor out = ZeroDense(rows, cols);
  float* d = out.mutable_data_as<float>();
  const uint64_t n = std::min<uint64_t>(values.numel(), out.numel());
  DispatchValue(values.dtype(), [&](auto codec) {
    using C = decltype(codec);
    const auto* v = values.data_as<typename C::Storage>();
    for (uint64_t i = 0; i < n; ++i) d[i] = C::Dec(v[i]);
  });
  return out;
}

Status DenseMatrix::Validate(const std::string& name) const {
  SPARQ_RETURN_IF_ERROR(CheckDims(rows, cols, name));
  if (quant.quantized()) return ValidateDenseQuant(*this, name);
  if (quant.scales.numel() != 0 || quant.mins.numel() != 0) {
    return InvalidInput(name + ": scales or mins present, but the values are not quantized");
  }
  return CheckPart(values, name + ".values", {DType::kF32, DType::kBF16, DType::kF16},
                   {rows, cols});
}

uint64_t DenseMatrix::ByteSize() const {
  return values.nbytes() + quant.scales.nbytes() + quant.mins.nbytes();
}

}  // namespace sparq
