// COO: row_idx u32 [nnz], col_idx u32 [nnz], values [nnz], sorted by (row, col), no duplicates.
#include <string>

#include "sparq/format.h"
#include "src/formats/format_util.h"

namespace sparq {
namespace {

using namespace formats_internal;  // NOLINT: the codecs and checks of this room

// u32 indices address rows and columns below 2^32.
constexpr int64_t kMaxCooExtent = int64_t{1} << 32;

}  // namespace

Result<CooMatrix> CooMatrix::FromDense(std::span<const float> w, int64_t rows, int64_t cols,
                                       DType value_dtype) {
  SPARQ_RETURN_IF_ERROR(CheckDenseInput(w, rows, cols, value_dtype, "CooMatrix::FromDense"));
  if (rows > kMaxCooExtent || cols > kMaxCooExtent) {
    return InvalidInput("CooMatrix::FromDense: " + std::to_string(rows) + " x " +
                        std::to_string(cols) + " does not fit u32 indices");
  }
  CooMatrix out;
  out.rows = rows;
  out.cols = cols;
  DispatchValue(value_dtype, [&](auto codec) {
    using C = decltype(codec);
    const uint64_t total = w.size();
    int64_t nnz = 0;
    for (uint64_t i = 0; i < total; ++i) nnz += C::Bits(C::Enc(w[i])) != 0;
    out.row_idx = Tensor::Alloc(DType::kU32, {nnz});
    out.col_idx = Tensor::Alloc(DType::kU32, {nnz});
    out.values = Tensor::Alloc(value_dtype, {nnz});
    uint32_t* ri = out.row_idx.mutable_data_as<uint32_t>();
    uint32_t* ci = out.col_idx.mutable_data_as<uint32_t>();
    auto* v = out.values.mutable_data_as<typename C::Storage>();
    int64_t p = 0;
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < cols; ++j) {
        const typename C::Storage s = C::Enc(w[i * cols + j]);
        if (C::Bits(s) == 0) continue;
        ri[p] = static_cast<uint32_t>(i);
        ci[p] = static_cast<uint32_t>(j);
        v[p] = s;
        ++p;
      }
    }
  });
  return out;
}

Tensor CooMatrix::ToDense() const {
  Tensor out = ZeroDense(rows, cols);
  float* d = out.mutable_data_as<float>();
  const uint32_t* ri = row_idx.data_as<uint32_t>();
  const uint32_t* ci = col_idx.data_as<uint32_t>();
  const int64_t n = nnz();
  DispatchValue(values.dtype(), [&](auto codec) {
    using C = decltype(codec);
    const auto* v = values.data_as<typename C::Storage>();
    for (int64_t p = 0; p < n; ++p) {
      if (ri[p] >= rows || ci[p] >= cols) continue;  // only on unvalidated input
      d[static_cast<int64_t>(ri[p]) * cols + ci[p]] = C::Dec(v[p]);
    }
  });
  return out;
}

Status CooMatrix::Validate(const std::string& name) const {
  SPARQ_RETURN_IF_ERROR(CheckDims(rows, cols, name));
  if (values.rank() != 1) {
    return InvalidInput(name + ".values: expected a 1-D tensor [nnz], got " +
                        values.ShapeString());
  }
  const int64_t n = static_cast<int64_t>(values.numel());
  SPARQ_RETURN_IF_ERROR(
      CheckPart(values, name + ".values", {DType::kF32, DType::kBF16, DType::kF16}, {n}));
  SPARQ_RETURN_IF_ERROR(CheckPart(row_idx, name + ".row_idx", {DType::kU32}, {n}));
  SPARQ_RETURN_IF_ERROR(CheckPart(col_idx, name + ".col_idx", {DType::kU32}, {n}));
  const uint32_t* ri = row_idx.data_as<uint32_t>();
  const uint32_t* ci = col_idx.data_as<uint32_t>();
  for (int64_t p = 0; p < n; ++p) {
    const int64_t r = ri[p], c = ci[p];
    if (r >= rows) {
      return InvalidInput(name + ".row_idx[" + std::to_string(p) + "] = " + std::to_string(r) +
                          ": row out of range, rows = " + std::to_string(rows));
    }
    if (c >= cols) {
      return InvalidInput(name + ".col_idx[" + std::to_string(p) + "] = " + std::to_string(c) +
                          " (row " + std::to_string(r) + "): column out of range, cols = " +
                          std::to_string(cols));
    }
    if (p == 0) continue;
    const int64_t pr = ri[p - 1], pc = ci[p - 1];
    if (r < pr || (r == pr && c <= pc)) {
      const std::string at = "entry " + std::to_string(p) + " (row " + std::to_string(r) +
                             ", col " + std::to_string(c) + ")";
      if (r == pr && c == pc) return InvalidInput(name + ": " + at + ": duplicate entry");
      return InvalidInput(name + ": " + at + " comes after (row " + std::to_string(pr) +
                          ", col " + std::to_string(pc) +
                          "): entries must be sorted by (row, col)");
    }
  }
  return Status::Ok();
}

uint64_t CooMatrix::ByteSize() const {
  return row_idx.nbytes() + col_idx.nbytes() + values.nbytes();
}

}  // namespace sparq
