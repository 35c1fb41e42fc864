// CSR: row_ptr i64 [rows + 1], col_idx u16/u32 [nnz], values [nnz] (quantized: csr_quant.cc).
#include <string>

#include "sparq/format.h"
#include "src/formats/format_util.h"

namespace sparq {
namespace {

using namespace formats_internal;  // NOLINT: the codecs and checks of this room

template <typename C, typename I>
void CsrFill(const float* w, int64_t rows, int64_t cols, CsrMatrix* out) {
  int64_t* rp = out->row_ptr.mutable_data_as<int64_t>();
  I* ci = out->col_idx.mutable_data_as<I>();
  auto* v = out->values.mutable_data_as<typename C::Storage>();
  for (int64_t i = 0; i < rows; ++i) {
    int64_t p = rp[i];
    const float* row = w + i * cols;
    for (int64_t j = 0; j < cols; ++j) {
      const typename C::Storage s = C::Enc(row[j]);
      if (C::Bits(s) != 0) {
        ci[p] = static_cast<I>(j);
        v[p] = s;
        ++p;
      }
    }
  }
}

template <typename C>
void CsrCount(const float* w, int64_t rows, int64_t cols, int64_t* rp) {
  rp[0] = 0;
  for (int64_t i = 0; i < rows; ++i) {
    int64_t count = 0;
    const float* row = w + i * cols;
    for (int64_t j = 0; j < cols; ++j) count += C::Bits(C::Enc(row[j])) != 0;
    rp[i + 1] = rp[i] + count;
  }
}

}  // namespace

Result<CsrMatrix> CsrMatrix::FromDense(std::span<const float> w, int64_t rows, int64_t cols,
                                       DType value_dtype) {
  SPARQ_RETURN_IF_ERROR(CheckDenseInput(w, rows, cols, value_dtype, "CsrMatrix::FromDense"));
  CsrMatrix out;
  out.rows = rows;
  out.cols = cols;
  out.row_ptr = Tensor::Alloc(DType::kI64, {rows + 1});
  DispatchValue(value_dtype, [&](auto codec) {
    using C = decltype(codec);
    int64_t* rp = out.row_ptr.mutable_data_as<int64_t>();
    CsrCount<C>(w.data(), rows, cols, rp);
    const int64_t nnz = rp[rows];
    const DType idx = IndexDTypeFor(cols);
    out.col_idx = Tensor::Alloc(idx, {nnz});
    out.values = Tensor::Alloc(value_dtype, {nnz});
    DispatchIndex(idx, [&](auto i) { CsrFill<C, decltype(i)>(w.data(), rows, cols, &out); });
  });
  return out;
}

Result<CsrMatrix> CsrMatrix::FromDenseMasked(std::span<const float> w,
                                             std::span<const uint8_t> keep, int64_t rows,
                                             int64_t cols, DType value_dtype) {
  SPARQ_RETURN_IF_ERROR(
      CheckDenseInput(w, rows, cols, value_dtype, "CsrMatrix::FromDenseMasked"));
  if (keep.size() != w.size()) {
    return InvalidInput("CsrMatrix::FromDenseMasked: a mask of " + std::to_string(keep.size()) +
                        " entries for " + std::to_string(w.size()) + " values");
  }
  CsrMatrix out;
  out.rows = rows;
  out.cols = cols;
  out.row_ptr = Tensor::Alloc(DType::kI64, {rows + 1});
  int64_t* rp = out.row_ptr.mutable_data_as<int64_t>();
  rp[0] = 0;
  for (int64_t i = 0; i < rows; ++i) {
    int64_t count = 0;
    for (int64_t j = 0; j < cols; ++j) count += keep[i * cols + j] != 0;
    rp[i + 1] = rp[i] + count;
  }
  const DType idx = IndexDTypeFor(cols);
  out.col_idx = Tensor::Alloc(idx, {rp[rows]});
  out.values = Tensor::Alloc(value_dtype, {rp[rows]});
  DispatchValue(value_dtype, [&](auto codec) {
    using C = decltype(codec);
    auto* v = out.values.mutable_data_as<typename C::Storage>();
    DispatchIndex(idx, [&](auto itag) {
      auto* ci = out.col_idx.mutable_data_as<decltype(itag)>();
      int64_t p = 0;
      for (int64_t i = 0; i < rows * cols; ++i) {
        if (keep[i] == 0) continue;
        ci[p] = static_cast<decltype(itag)>(i % cols);
        v[p++] = C::Enc(w[i]);
      }
    });
  });
  return out;
}

Tensor CsrMatrix::ToDense() const {
  Tensor out = ZeroDense(rows, cols);
  float* d = out.mutable_data_as<float>();
  const int64_t* rp = row_ptr.data_as<int64_t>();
  const int64_t n = nnz();
  // Quantized: the codes dequantized (a precondition of validity, as StoredValuesF32's).
  const Tensor deq = quant.quantized() ? StoredValuesF32() : Tensor();
  const Tensor& vals = quant.quantized() ? deq : values;
  DispatchValue(vals.dtype(), [&](auto codec) {
    using C = decltype(codec);
    const auto* v = vals.data_as<typename C::Storage>();
    DispatchIndex(col_idx.dtype(), [&](auto itag) {
      const auto* ci = col_idx.data_as<decltype(itag)>();
      for (int64_t i = 0; i < rows; ++i) {
        for (int64_t p = rp[i]; p < rp[i + 1]; ++p) {
          // Bounds tests cost little and keep an unvalidated matrix from writing out of range.
          if (p < 0 || p >= n || ci[p] >= cols) continue;
          d[i * cols + ci[p]] = C::Dec(v[p]);
        }
      }
    });
  });
  return out;
}

Status CsrMatrix::Validate(const std::string& name) const {
  SPARQ_RETURN_IF_ERROR(CheckDims(rows, cols, name));
  // Quantized: nnz is col_idx's length (int4 codes are two to a byte), checked part by part below.
  const Tensor& counted = quant.quantized() ? col_idx : values;
  if (counted.rank() != 1) {
    return InvalidInput(name + (quant.quantized() ? ".col_idx" : ".values") +
                        ": expected a 1-D tensor [nnz], got " + counted.ShapeString());
  }
  const int64_t n = static_cast<int64_t>(counted.numel());
  if (!quant.quantized()) {
    SPARQ_RETURN_IF_ERROR(
        CheckPart(values, name + ".values", {DType::kF32, DType::kBF16, DType::kF16}, {n}));
  }
  SPARQ_RETURN_IF_ERROR(CheckPart(col_idx, name + ".col_idx", {DType::kU16, DType::kU32}, {n}));
  SPARQ_RETURN_IF_ERROR(CheckPart(row_ptr, name + ".row_ptr", {DType::kI64}, {rows + 1}));
  const int64_t* rp = row_ptr.data_as<int64_t>();
  if (rp[0] != 0) {
    return InvalidInput(name + ".row_ptr[0] = " + std::to_string(rp[0]) + ", must be 0");
  }
  for (int64_t i = 0; i < rows; ++i) {
    if (rp[i + 1] < rp[i]) {
      return InvalidInput(name + ".row_ptr[" + std::to_string(i + 1) + "] = " +
                          std::to_string(rp[i + 1]) + " < row_ptr[" + std::to_string(i) +
                          "] = " + std::to_string(rp[i]) +
                          ": row pointers must be non-decreasing (row " + std::to_string(i) +
                          ")");
    }
  }
  if (rp[rows] != n) {
    return InvalidInput(name + ".row_ptr[" + std::to_string(rows) + "] = " +
                        std::to_string(rp[rows]) + ", expected nnz = " + std::to_string(n) +
                        " (the length of values and col_idx)");
  }
  const Status indices = DispatchIndex(col_idx.dtype(), [&](auto itag) -> Status {
    const auto* ci = col_idx.data_as<decltype(itag)>();
    for (int64_t i = 0; i < rows; ++i) {
      // A row is good iff ascending with its last column < cols: a pass the compiler vectorizes
      // (this runs on every load, over every kept weight); the loop below names what is wrong.
      bool bad = rp[i + 1] > rp[i] && static_cast<int64_t>(ci[rp[i + 1] - 1]) >= cols;
      for (int64_t p = rp[i] + 1; p < rp[i + 1]; ++p) bad |= ci[p] <= ci[p - 1];
      if (!bad) continue;
      for (int64_t p = rp[i]; p < rp[i + 1]; ++p) {
        const int64_t c = ci[p];
        const bool out_of_range = c >= cols;
        const bool unordered = p > rp[i] && c <= static_cast<int64_t>(ci[p - 1]);
        if (!out_of_range && !unordered) continue;
        const std::string where = name + ".col_idx[" + std::to_string(p) + "] = " +
                                  std::to_string(c) + " (row " + std::to_string(i) + ")";
        if (out_of_range) {
          return InvalidInput(where + ": column out of range, cols = " + std::to_string(cols));
        }
        return InvalidInput(where + (c == static_cast<int64_t>(ci[p - 1])
                                         ? ": duplicate column index in the row"
                                         : ": column indices unsorted in the row (previous " +
                                               std::to_string(ci[p - 1]) + ")"));
      }
    }
    return Status::Ok();
  });
  SPARQ_RETURN_IF_ERROR(indices);
  if (quant.quantized()) return ValidateCsrQuant(*this, name);
  return Status::Ok();
}

uint64_t CsrMatrix::ByteSize() const {
  return row_ptr.nbytes() + col_idx.nbytes() + values.nbytes() + quant.scales.nbytes() +
         quant.mins.nbytes();
}

}  // namespace sparq
