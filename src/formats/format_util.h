// Internal helpers shared by the format implementations (not part of the public API).
#pragma once

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include "sparq/checked.h"
#include "sparq/dtype.h"
#include "sparq/quant.h"
#include "sparq/status.h"
#include "sparq/tensor.h"

namespace sparq {
struct BsrMatrix;
struct CsrMatrix;
struct DenseMatrix;
struct QuantParts;
}  // namespace sparq

namespace sparq::formats_internal {

// Value codecs: how an f32 is stored in each value dtype, and back. Bits() gives the raw storage
// bits so that "stored" tests are exact: +0 is all-zero bits, -0 is the sign bit alone.
struct F32Codec {
  using Storage = float;
  static constexpr DType kDType = DType::kF32;
  static constexpr uint32_t kSignBit = 0x80000000u;
  static Storage Enc(float x) { return x; }
  static float Dec(Storage s) { return s; }
  static uint32_t Bits(Storage s) { return F32Bits(s); }
};
struct BF16Codec {
  using Storage = uint16_t;
  static constexpr DType kDType = DType::kBF16;
  static constexpr uint32_t kSignBit = 0x8000u;
  static Storage Enc(float x) { return F32ToBF16(x); }
  static float Dec(Storage s) { return BF16ToF32(s); }
  static uint32_t Bits(Storage s) { return s; }
};
struct F16Codec {
  using Storage = uint16_t;
  static constexpr DType kDType = DType::kF16;
  static constexpr uint32_t kSignBit = 0x8000u;
  static Storage Enc(float x) { return F32ToF16(x); }
  static float Dec(Storage s) { return F16ToF32(s); }
  static uint32_t Bits(Storage s) { return s; }
};

inline bool IsValueDType(DType t) {
  return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16;
}

// Calls fn(Codec{}) for a value dtype; precondition: IsValueDType(t).
template <typename Fn>
decltype(auto) DispatchValue(DType t, Fn&& fn) {
  switch (t) {
    case DType::kBF16: return fn(BF16Codec{});
    case DType::kF16: return fn(F16Codec{});
    default: return fn(F32Codec{});
  }
}

// Index types of CSR / BSR: u16 whenever the indexed extent fits, else u32.
inline DType IndexDTypeFor(int64_t extent) { return extent <= 65536 ? DType::kU16 : DType::kU32; }
inline bool IsIndexDType(DType t) { return t == DType::kU16 || t == DType::kU32; }

// Calls fn(T{}) with T = uint16_t or uint32_t; precondition: IsIndexDType(t).
template <typename Fn>
decltype(auto) DispatchIndex(DType t, Fn&& fn) {
  if (t == DType::kU16) return fn(uint16_t{});
  return fn(uint32_t{});
}

// Checks that part `t` has one of `dtypes` and exactly `shape`, and that its data is present
// when it has bytes. `what` is "<name>.<part>"; the message says what was expected and found.
Status CheckPart(const Tensor& t, const std::string& what, std::initializer_list<DType> dtypes,
                 const std::vector<int64_t>& shape);

// Common checks of (rows, cols) for Validate: non-negative, rows * cols * 4 fits in int64.
Status CheckDims(int64_t rows, int64_t cols, const std::string& name);

// FromDense precondition: w.size() == rows * cols, dims >= 0, value dtype supported.
Status CheckDenseInput(std::span<const float> w, int64_t rows, int64_t cols, DType value_dtype,
                       const char* what);

// A spec quantized matrices may hold: int8 (always symmetric) or int4, groups of 32, 64 or 128.
inline bool QuantSpecOk(const ValueSpec& spec) {
  return spec.quantized() && (spec.group == 32 || spec.group == 64 || spec.group == 128) &&
         (spec.dtype == DType::kI4 || spec.sym);
}

// The group parameters of quantized values: scales (and mins, when the spec has them) f16 [rows,
// qg], every scale finite (and >= 0 unless `signed_scales`: GGUF's Q4_0 stores negative ones),
// every min finite; mins absent when the spec has none. Messages name "<name>.scales" / ".mins"
// and the row and group.
Status ValidateGroupParams(const QuantParts& q, int64_t rows, int64_t qg, const std::string& name,
                           bool signed_scales);

// Bytes of a row of `per_row` codes: int8 one each, int4 two to a byte.
inline int64_t CodeRowBytes(const ValueSpec& spec, int64_t per_row) {
  return spec.dtype == DType::kI8 ? per_row : (per_row + 1) / 2;
}

// The first of a row's `count` codes (int8: signed bytes; int4: nibbles, low first) outside
// [lo, hi], or -1. Whole-row passes the compiler vectorizes, and none where every int4 code is
// legal: this runs on every load, over every stored weight.
inline int64_t FirstCodeOutside(const uint8_t* row, DType dtype, int64_t count, int lo, int hi) {
  if (dtype == DType::kI8) {
    bool bad = false;
    for (int64_t j = 0; j < count; ++j) {
      const int q = static_cast<int8_t>(row[j]);
      bad |= q < lo || q > hi;
    }
    if (!bad) return -1;
    for (int64_t j = 0; j < count; ++j) {
      const int q = static_cast<int8_t>(row[j]);
      if (q < lo || q > hi) return j;
    }
    return -1;
  }
  if (lo <= 0 && hi >= 15) return -1;
  bool bad = false;
  for (int64_t b = 0; b < count / 2; ++b) {
    const int q0 = row[b] & 0x0F, q1 = row[b] >> 4;
    bad |= q0 < lo || q0 > hi || q1 < lo || q1 > hi;
  }
  if (!bad && count % 2 == 0) return -1;
  for (int64_t j = bad ? 0 : count - 1; j < count; ++j) {
    const int q = (row[j / 2] >> (j % 2 ? 4 : 0)) & 0x0F;
    if (q < lo || q > hi) return j;
  }
  return -1;
}

// Codes and parameters of `rows` rows of `per_row` f32 values (row-major) in groups of spec.group
// values of a row (the last group may be short): round to nearest, or the parameters of `fitted`
// (rows * groups entries, e.g. GPTQ's) with each value's nearest code. Shared by the N:M (kept
// values) and dense (columns) Quantize. Errors name `<name>.values row R group G`.
Status QuantizeRows(const float* values, int64_t rows, int64_t per_row, const ValueSpec& spec,
                    std::span<const QuantGroup> fitted, const std::string& name, Tensor* codes,
                    QuantParts* quant);

// A quantized CsrMatrix's codes, scales and mins (csr_quant.cc); row_ptr and col_idx are
// checked before (precondition: valid).
Status ValidateCsrQuant(const CsrMatrix& s, const std::string& name);

// A quantized BsrMatrix's codes (padding 0), scales and mins (bsr_quant.cc); row_ptr and col_idx
// are checked before (precondition: valid).
Status ValidateBsrQuant(const BsrMatrix& s, const std::string& name);

// A quantized DenseMatrix (dense_quant.cc): its parts' shapes, dtypes, scales and codes; and its
// values dequantized (precondition: valid).
Status ValidateDenseQuant(const DenseMatrix& s, const std::string& name);
Tensor DenseQuantToF32(const DenseMatrix& s);

// Dense f32 [rows, cols], zero-filled.
inline Tensor ZeroDense(int64_t rows, int64_t cols) {
  return Tensor::Alloc(DType::kF32, {rows, cols});
}

// ---- N:M bit streams (LSB-first, little-endian; see format.h) ---------------------------------
inline int IndexBitsFor(int m) {
  int bits = 1;
  while ((1 << bits) < m) ++bits;
  return bits;
}

inline uint32_t ReadBits(const uint8_t* row, int64_t bit_offset, int bits) {
  uint32_t v = 0;
  for (int b = 0; b < bits; ++b) {
    const int64_t pos = bit_offset + b;
    v |= static_cast<uint32_t>((row[pos >> 3] >> (pos & 7)) & 1u) << b;
  }
  return v;
}

inline void WriteBits(uint8_t* row, int64_t bit_offset, int bits, uint32_t value) {
  for (int b = 0; b < bits; ++b) {
    const int64_t pos = bit_offset + b;
    row[pos >> 3] |= static_cast<uint8_t>(((value >> b) & 1u) << (pos & 7));
  }
}

}  // namespace sparq::formats_internal
