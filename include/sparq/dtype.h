// Element types and the f32 <-> f16 / bf16 conversions (round-to-nearest-even, NaN/Inf kept).
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

namespace sparq {

// Element types of tensors. kI4/kU4 are packed two per byte: element 2j in the low nibble of
// byte j, element 2j+1 in the high nibble (ggml's and safetensors-style order). Index types
// (kU16, kU32, kI32, kI64, kU8) appear as parts of sparse formats.
enum class DType : uint8_t {
  kF32, kF16, kBF16, kF64,
  kI8, kU8, kI16, kU16, kI32, kU32, kI64, kU64, kBool,
  kI4, kU4,
};

// Bits per element (4 for kI4/kU4).
int DTypeBits(DType t);
// Bytes for `numel` elements (rounded up for 4-bit types); caller checks overflow of numel.
inline uint64_t DTypeBytes(DType t, uint64_t numel) {
  return (numel * static_cast<uint64_t>(DTypeBits(t)) + 7) / 8;
}
// Lower-case name: "f32", "bf16", "i4", "u16" ...
std::string_view DTypeName(DType t);
std::optional<DType> ParseDType(std::string_view name);
// safetensors spelling ("F32", "BF16", "U16" ...); nullopt for types it has no name for (i4/u4).
std::optional<std::string_view> SafetensorsDTypeName(DType t);
std::optional<DType> ParseSafetensorsDType(std::string_view name);

// ---- f16 / bf16 <-> f32 --------------------------------------------------------------------
inline uint32_t F32Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float F32FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// bf16 is the top half of an f32. Rounding: nearest, ties to even; NaN stays NaN (quiet bit set so
// that truncation cannot turn a NaN into Inf).
inline uint16_t F32ToBF16(float f) {
  uint32_t u = F32Bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float BF16ToF32(uint16_t h) { return F32FromBits(static_cast<uint32_t>(h) << 16); }

uint16_t F32ToF16(float f);
float F16ToF32(uint16_t h);

}  // namespace sparq
