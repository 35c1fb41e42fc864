#include "sparq/dtype.h"

namespace sparq {

namespace {
struct DTypeInfo {
  DType type;
  int bits;
  const char* name;
  const char* st_name;  // safetensors; nullptr if none
};
constexpr DTypeInfo kInfos[] = {
    {DType::kF32, 32, "f32", "F32"},   {DType::kF16, 16, "f16", "F16"},
    {DType::kBF16, 16, "bf16", "BF16"}, {DType::kF64, 64, "f64", "F64"},
    {DType::kI8, 8, "i8", "I8"},       {DType::kU8, 8, "u8", "U8"},
    {DType::kI16, 16, "i16", "I16"},   {DType::kU16, 16, "u16", "U16"},
    {DType::kI32, 32, "i32", "I32"},   {DType::kU32, 32, "u32", "U32"},
    {DType::kI64, 64, "i64", "I64"},   {DType::kU64, 64, "u64", "U64"},
    {DType::kBool, 8, "bool", "BOOL"}, {DType::kI4, 4, "i4", nullptr},
    {DType::kU4, 4, "u4", nullptr},
};
const DTypeInfo& Info(DType t) {
  for (const auto& i : kInfos)
    if (i.type == t) return i;
  return kInfos[0];  // unreachable for valid enum values
}
}  // namespace

int DTypeBits(DType t) { return Info(t).bits; }
std::string_view DTypeName(DType t) { return Info(t).name; }

std::optional<DType> ParseDType(std::string_view name) {
  for (const auto& i : kInfos)
    if (name == i.name) return i.type;
  return std::nullopt;
}

std::optional<std::string_view> SafetensorsDTypeName(DType t) {
  const char* s = Info(t).st_name;
  if (!s) return std::nullopt;
  return std::string_view(s);
}

std::optional<DType> ParseSafetensorsDType(std::string_view name) {
  for (const auto& i : kInfos)
    if (i.st_name && name == i.st_name) return i.type;
  return std::nullopt;
}

// f32 -> f16, round to nearest even. Works on the bit pattern so that it is exact for every input,
// including subnormal results, overflow to Inf, and NaN (payload top bits kept, quiet bit forced).
uint16_t F32ToF16(float f) {
  const uint32_t u = F32Bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t exp = (u >> 23) & 0xffu;
  uint32_t mant = u & 0x7fffffu;
  if (exp == 0xff) {  // Inf or NaN
    if (mant == 0) return sign | 0x7c00u;
    return static_cast<uint16_t>(sign | 0x7e00u | (mant >> 13));
  }
  const int32_t e = static_cast<int32_t>(exp) - 127 + 15;  // biased f16 exponent
  if (e >= 0x1f) return sign | 0x7c00u;                     // overflow -> Inf
  if (e <= 0) {
    // Subnormal f16 (or zero). Value = mant_full * 2^(exp-150); f16 subnormal unit is 2^-24.
    if (e < -10) return sign;  // below half of the smallest subnormal: rounds to zero
    const uint32_t full = mant | 0x800000u;
    const int shift = 14 - e;  // 14..24
    uint32_t q = full >> shift;
    const uint32_t rem = full & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;  // may carry into the normal range: fine
    return static_cast<uint16_t>(sign | q);
  }
  uint32_t q = (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (q & 1u))) ++q;  // carry may reach Inf: correct
  return static_cast<uint16_t>(sign | q);
}

float F16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return F32FromBits(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    if (mant == 0) return F32FromBits(sign);
    // Subnormal: normalise.
    int e = -1;
    do {
      mant <<= 1;
      ++e;
    } while ((mant & 0x400u) == 0);
    mant &= 0x3ffu;
    return F32FromBits(sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | (mant << 13));
  }
  return F32FromBits(sign | ((exp + 127 - 15) << 23) | (mant << 13));
}

}  // namespace sparq
