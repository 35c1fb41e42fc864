// ggml type table and dequantization of F32 / F16 / BF16 / Q8_0 / Q4_0 / Q4_1 to f32 (the
// K-quants are in gguf_kquants.cc).
//
// Block layouts as in ggml-org/ggml src/ggml-common.h (QK = 32 elements per block):
//   block_q8_0 { ggml_half d; int8_t  qs[32]; }            x[j] = d * qs[j]
//   block_q4_0 { ggml_half d; uint8_t qs[16]; }            x[j] = d * ((qs[j] & 15) - 8),
//                                                          x[j + 16] = d * ((qs[j] >> 4) - 8)
//   block_q4_1 { ggml_half d; ggml_half m; uint8_t qs[16]; } x[j] = d * (qs[j] & 15) + m,
//                                                          x[j + 16] = d * (qs[j] >> 4) + m
// (low nibbles hold the first half of the block, high nibbles the second half). The products
// and sums are done in f32 in that order, like ggml's reference dequantize_row_* and the gguf
// Python package, so the results agree bit for bit.
#include <cmath>
#include <cstdio>
#include <cstring>

#include "src/io/gguf_kquants.h"
#include "sparq/dtype.h"
#include "sparq/gguf.h"

namespace sparq {

namespace {

constexpr int kQK = 32;  // elements per block of Q8_0 / Q4_0 / Q4_1 (QK8_0, QK4_0, QK4_1)

struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kQK];
};
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[kQK / 2];
};
struct BlockQ4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ8_0) == 2 + kQK, "block_q8_0 layout");
static_assert(sizeof(BlockQ4_0) == 2 + kQK / 2, "block_q4_0 layout");
static_assert(sizeof(BlockQ4_1) == 4 + kQK / 2, "block_q4_1 layout");
static_assert(offsetof(BlockQ4_1, m) == 2 && offsetof(BlockQ4_1, qs) == 4, "block_q4_1 layout");

struct TypeRow {
  uint32_t type;
  const char* name;
  int64_t block;
  int64_t bytes;
};
// ggml.h enum ggml_type with the block sizes of ggml's type_traits. Numbers 4, 5, 31-33 and 36-38
// were removed from ggml and are unknown here.
constexpr TypeRow kTypes[] = {
    {0, "F32", 1, 4},          {1, "F16", 1, 2},         {2, "Q4_0", 32, 18},
    {3, "Q4_1", 32, 20},       {6, "Q5_0", 32, 22},      {7, "Q5_1", 32, 24},
    {8, "Q8_0", 32, 34},       {9, "Q8_1", 32, 36},      {10, "Q2_K", 256, 84},
    {11, "Q3_K", 256, 110},    {12, "Q4_K", 256, 144},   {13, "Q5_K", 256, 176},
    {14, "Q6_K", 256, 210},    {15, "Q8_K", 256, 292},   {16, "IQ2_XXS", 256, 66},
    {17, "IQ2_XS", 256, 74},   {18, "IQ3_XXS", 256, 98}, {19, "IQ1_S", 256, 50},
    {20, "IQ4_NL", 32, 18},    {21, "IQ3_S", 256, 110},  {22, "IQ2_S", 256, 82},
    {23, "IQ4_XS", 256, 136},  {24, "I8", 1, 1},         {25, "I16", 1, 2},
    {26, "I32", 1, 4},         {27, "I64", 1, 8},        {28, "F64", 1, 8},
    {29, "IQ1_M", 256, 56},    {30, "BF16", 1, 2},       {34, "TQ1_0", 256, 54},
    {35, "TQ2_0", 256, 66},    {39, "MXFP4", 32, 17},
};

const TypeRow* FindType(uint32_t t) {
  for (const auto& r : kTypes)
    if (r.type == t) return &r;
  return nullptr;
}

template <typename Block>
Block LoadBlock(const uint8_t* p) {
  Block b;
  std::memcpy(&b, p, sizeof(Block));  // file data need not be aligned
  return b;
}

// Error for a block whose f16 scale is NaN / inf (the K-quants say the same in their file).
Status NonFiniteScale(int64_t block, const char* which, uint16_t h) {
  char hex[8];
  std::snprintf(hex, sizeof hex, "0x%04x", h);
  return InvalidInput("block " + std::to_string(block) + ": f16 " + which + " = " + hex + " is not finite");
}

}  // namespace

std::optional<GgmlBlockInfo> GgmlTypeBlock(uint32_t type) {
  const TypeRow* r = FindType(type);
  if (!r) return std::nullopt;
  return GgmlBlockInfo{r->block, r->bytes};
}

std::string GgmlTypeName(GgmlType type) {
  const TypeRow* r = FindType(static_cast<uint32_t>(type));
  return r ? r->name : "type" + std::to_string(static_cast<uint32_t>(type));
}

bool GgmlTypeCanDequantize(GgmlType type) {
  switch (type) {
    case GgmlType::kF32: case GgmlType::kF16: case GgmlType::kBF16:
    case GgmlType::kQ8_0: case GgmlType::kQ4_0: case GgmlType::kQ4_1:
      return true;
    default:
      return io::IsKQuant(type);
  }
}

Status DequantizeGgml(GgmlType type, const void* src, int64_t n, float* dst) {
  if (!GgmlTypeCanDequantize(type)) {
    return Unsupported("cannot dequantize ggml type " + GgmlTypeName(type));
  }
  const auto* s = static_cast<const uint8_t*>(src);
  const int64_t block = GgmlTypeBlock(static_cast<uint32_t>(type))->block;
  if (n < 0 || n % block != 0) {
    return InvalidInput("element count " + std::to_string(n) + " is not a multiple of the block size " +
                        std::to_string(block) + " of " + GgmlTypeName(type));
  }
  if (io::IsKQuant(type)) return io::DequantizeKQuant(type, s, n / io::kQK_K, dst);
  switch (type) {
    case GgmlType::kF32:
      if (n) std::memcpy(dst, s, static_cast<size_t>(n) * 4);
      break;
    case GgmlType::kF16:
    case GgmlType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, s + 2 * i, 2);
        dst[i] = type == GgmlType::kF16 ? F16ToF32(h) : BF16ToF32(h);
      }
      break;
    case GgmlType::kQ8_0:
      for (int64_t b = 0; b < n / kQK; ++b) {
        const auto blk = LoadBlock<BlockQ8_0>(s + b * sizeof(BlockQ8_0));
        const float d = F16ToF32(blk.d);
        if (!std::isfinite(d)) return NonFiniteScale(b, "scale d", blk.d);
        float* y = dst + b * kQK;
        for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(blk.qs[j]) * d;
      }
      break;
    case GgmlType::kQ4_0:
      for (int64_t b = 0; b < n / kQK; ++b) {
        const auto blk = LoadBlock<BlockQ4_0>(s + b * sizeof(BlockQ4_0));
        const float d = F16ToF32(blk.d);
        if (!std::isfinite(d)) return NonFiniteScale(b, "scale d", blk.d);
        float* y = dst + b * kQK;
        for (int j = 0; j < kQK / 2; ++j) {
          y[j] = static_cast<float>((blk.qs[j] & 0x0f) - 8) * d;
          y[j + kQK / 2] = static_cast<float>((blk.qs[j] >> 4) - 8) * d;
        }
      }
      break;
    case GgmlType::kQ4_1:
      for (int64_t b = 0; b < n / kQK; ++b) {
        const auto blk = LoadBlock<BlockQ4_1>(s + b * sizeof(BlockQ4_1));
        const float d = F16ToF32(blk.d);
        const float m = F16ToF32(blk.m);
        if (!std::isfinite(d)) return NonFiniteScale(b, "scale d", blk.d);
        if (!std::isfinite(m)) return NonFiniteScale(b, "min m", blk.m);
        float* y = dst + b * kQK;
        for (int j = 0; j < kQK / 2; ++j) {
          y[j] = static_cast<float>(blk.qs[j] & 0x0f) * d + m;
          y[j + kQK / 2] = static_cast<float>(blk.qs[j] >> 4) * d + m;
        }
      }
      break;
    default:
      break;  // unreachable: GgmlTypeCanDequantize checked above
  }
  return Status::Ok();
}

}  // namespace sparq
