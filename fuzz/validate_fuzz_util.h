// Shared by fuzz/validate_<format>_fuzz.cc: decodes a fuzz input into a format's parts (dims,
// parameters and raw tensor bytes), and the checks run once Validate() accepts them.
//
// Input layout (all formats): a few header bytes (dims, dtype selectors, format parameters, a
// `perturb` byte that may make a part one element too long or short), then the raw bytes of each
// part in declaration order. Parts are zero-filled once the input runs out. Dimensions are small
// so a valid matrix's dense form stays under a few MB.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "sparq/format.h"
#include "sparq/quant.h"
#include "sparq/tensor.h"

namespace sparq::fuzz {

class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, size_t size) : p_(data), n_(size) {}
  uint8_t U8() {
    if (n_ == 0) return 0;
    --n_;
    return *p_++;
  }
  uint16_t U16() { return static_cast<uint16_t>(U8() | (U8() << 8)); }
  // Owned tensor of `dtype` and `shape`, filled from the input (then zeros).
  Tensor Take(DType dtype, std::vector<int64_t> shape) {
    for (int64_t& d : shape) d = std::max<int64_t>(d, 0);
    Tensor t = Tensor::Alloc(dtype, std::move(shape));
    const size_t bytes = std::min<size_t>(t.nbytes(), n_);
    if (bytes) std::memcpy(t.mutable_data(), p_, bytes);
    p_ += bytes;
    n_ -= bytes;
    return t;
  }

 private:
  const uint8_t* p_;
  size_t n_;
};

// Value dtype from a selector byte: mostly valid, sometimes not.
inline DType ValueDTypeFrom(uint8_t sel) {
  static constexpr DType kTypes[] = {DType::kF32, DType::kBF16, DType::kF16, DType::kI8};
  return kTypes[sel % 4];
}
inline DType IndexDTypeFrom(uint8_t sel) {
  static constexpr DType kTypes[] = {DType::kU16, DType::kU32, DType::kI32};
  return kTypes[sel % 3];
}
// A length, sometimes off by one (bit `bit` of `perturb` set: +1, bit + 4 set: -1).
inline int64_t Perturbed(int64_t len, uint8_t perturb, int bit) {
  if (perturb & (1u << bit)) return len + 1;
  if (perturb & (1u << (bit + 4))) return std::max<int64_t>(len - 1, 0);
  return len;
}

// Dense forms must agree bit for bit (NaN payloads may be quietened by re-encoding).
inline void CheckSameDense(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != DType::kF32 || b.dtype() != DType::kF32) abort();
  const uint32_t* x = a.data_as<uint32_t>();
  const uint32_t* y = b.data_as<uint32_t>();
  for (uint64_t i = 0; i < a.numel(); ++i) {
    const bool nan_x = (x[i] & 0x7fffffffu) > 0x7f800000u;
    const bool nan_y = (y[i] & 0x7fffffffu) > 0x7f800000u;
    if (nan_x && nan_y) continue;
    if (x[i] != y[i]) abort();
  }
}

// For a matrix that validated: decode it, re-encode the dense form in the same format and value
// dtype, and check that the new encoding validates and decodes to the same dense matrix.
template <typename M, typename Reencode>
void CheckValidRoundTrip(const M& mat, Reencode reencode) {
  const Tensor dense = mat.ToDense();
  std::span<const float> w(dense.data_as<float>(), dense.numel());
  auto again = reencode(w);
  if (!again.ok()) abort();
  if (!again->Validate("again").ok()) abort();
  CheckSameDense(dense, again->ToDense());
}

// A quantized spec from a selector byte (the specs the formats hold).
inline ValueSpec QuantSpecFrom(uint8_t sel) {
  static constexpr const char* kSpecs[] = {"int8:g32", "int8:g128",    "int4:g32",
                                           "int4:g64", "int4:g64:sym", "int4:g128:sym"};
  return *ValueSpec::Parse(kSpecs[sel % 6]);
}

// For a quantized matrix that validated: its codes dequantized are finite, and quantizing those
// values again on the matrix's own groups (scales and mins as fitted) gives them back (equal as
// floats: a scale of -0 may turn a 0 into -0).
template <typename M>
void CheckQuantizedRoundTrip(const M& mat) {
  const Tensor dense = mat.ToDense();
  const float* d = dense.data_as<float>();
  for (uint64_t i = 0; i < dense.numel(); ++i) {
    if (!std::isfinite(d[i])) abort();
  }
  const ValueSpec& spec = mat.quant.spec;
  std::vector<QuantGroup> fitted(mat.quant.scales.numel());
  for (size_t i = 0; i < fitted.size(); ++i) {
    fitted[i] = QuantGroupFromF16(
        mat.quant.scales.template data_as<uint16_t>()[i],
        spec.has_min() ? mat.quant.mins.template data_as<uint16_t>()[i] : 0, spec);
  }
  M numbers = mat;
  numbers.quant = QuantParts{};
  numbers.values = mat.StoredValuesF32();
  auto again = M::Quantize(numbers, spec, fitted, "again");
  if (!again.ok()) abort();
  const Tensor back = again->ToDense();
  if (back.numel() != dense.numel()) abort();
  for (uint64_t i = 0; i < dense.numel(); ++i) {
    if (back.data_as<float>()[i] != d[i]) abort();
  }
}

}  // namespace sparq::fuzz
