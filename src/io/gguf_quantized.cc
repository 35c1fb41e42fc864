// GGUF Q4_0 / Q4_1 / Q8_0 tensors as quantized DenseMatrix values, as stored (gguf.h).
//
// A ggml block of 32 values of a row is one sparq group of 32 (ne[0] is a multiple of 32, so
// blocks never straddle rows): its f16 d (and m) are the group's scale (and min) bits, and its
// codes keep their values. The three decodings agree bit for bit with ggml's (gguf_dequant.cc):
//   Q8_0 d * q        = int8:g32       q * scale
//   Q4_0 d * (q - 8)  = int4:g32:sym   (q - 8) * scale   (sparq's symmetric int4 convention)
//   Q4_1 d * q + m    = int4:g32       fma(q, scale, min)
// because q * d is exact in f32 (a code of at most 8 bits times an f16's 11-bit significand), so
// ggml's rounded product is the exact one and the single rounding of the sum equals fma's.
// Only the nibble order differs: a ggml block keeps values 0..15 in the low nibbles of qs[0..15]
// and 16..31 in the high ones; sparq packs values 2i, 2i+1 into byte i (low, high).
#include <cmath>
#include <cstdio>
#include <cstring>

#include "sparq/dtype.h"
#include "sparq/gguf.h"

namespace sparq {

namespace {

constexpr int kQK = 32;  // values per block of Q8_0 / Q4_0 / Q4_1, and sparq's group

std::string Hex(uint16_t h) {
  char b[8];
  std::snprintf(b, sizeof b, "0x%04x", h);
  return b;
}

uint16_t Load16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);  // file data need not be aligned
  return v;
}

}  // namespace

Result<DenseMatrix> GgmlToQuantizedDense(GgmlType type, const void* src, int64_t rows, int64_t cols,
                                         const std::string& what) {
  ValueSpec spec;
  spec.group = kQK;
  int64_t block_bytes = 0;
  switch (type) {
    case GgmlType::kQ8_0:
      spec.dtype = DType::kI8, spec.sym = true, block_bytes = 2 + kQK;
      break;
    case GgmlType::kQ4_0:
      spec.dtype = DType::kI4, spec.sym = true, block_bytes = 2 + kQK / 2;
      break;
    case GgmlType::kQ4_1:
      spec.dtype = DType::kI4, spec.sym = false, block_bytes = 4 + kQK / 2;
      break;
    default:
      return Unsupported(what + ": ggml type " + GgmlTypeName(type) +
                         " has no quantized dense form (Q4_0, Q4_1 and Q8_0 do)");
  }
  if (rows < 0 || cols < 0 || cols % kQK != 0) {
    return InvalidInput(what + ": shape [" + std::to_string(rows) + ", " + std::to_string(cols) +
                        "] is not rows of whole " + GgmlTypeName(type) + " blocks");
  }
  const int64_t groups = cols / kQK;
  const bool i8 = spec.dtype == DType::kI8;
  DenseMatrix out;
  out.rows = rows;
  out.cols = cols;
  out.quant.spec = spec;
  SPARQ_ASSIGN_OR_RETURN(out.values, Tensor::TryAlloc(i8 ? DType::kI8 : DType::kU8,
                                                      {rows, i8 ? cols : cols / 2}, what));
  SPARQ_ASSIGN_OR_RETURN(out.quant.scales, Tensor::TryAlloc(DType::kF16, {rows, groups}, what));
  if (spec.has_min()) {
    SPARQ_ASSIGN_OR_RETURN(out.quant.mins, Tensor::TryAlloc(DType::kF16, {rows, groups}, what));
  }
  const auto* s = static_cast<const uint8_t*>(src);
  uint8_t* codes = out.values.mutable_data_as<uint8_t>();
  uint16_t* scales = out.quant.scales.mutable_data_as<uint16_t>();
  uint16_t* mins = spec.has_min() ? out.quant.mins.mutable_data_as<uint16_t>() : nullptr;
  for (int64_t b = 0; b < rows * groups; ++b) {
    const uint8_t* blk = s + b * block_bytes;
    const uint16_t d = Load16(blk);
    if (!std::isfinite(F16ToF32(d))) {
      return InvalidInput(what + ": block " + std::to_string(b) + ": f16 scale d = " + Hex(d) +
                          " is not finite");
    }
    scales[b] = d;
    if (mins != nullptr) {
      mins[b] = Load16(blk + 2);
      if (!std::isfinite(F16ToF32(mins[b]))) {
        return InvalidInput(what + ": block " + std::to_string(b) +
                            ": f16 min m = " + Hex(mins[b]) + " is not finite");
      }
    }
    if (i8) {
      const uint8_t* qs = blk + 2;
      for (int j = 0; j < kQK; ++j) {
        // ggml's quantizer writes -127..127; -128 is outside sparq's int8 codes (quant.h).
        if (static_cast<int8_t>(qs[j]) == -128) {
          return InvalidInput(what + ": block " + std::to_string(b) + " value " +
                              std::to_string(j) + " has code -128, outside int8's -127..127");
        }
      }
      std::memcpy(codes + b * kQK, qs, kQK);
    } else {
      const uint8_t* qs = blk + (mins != nullptr ? 4 : 2);
      uint8_t* dst = codes + b * (kQK / 2);
      for (int i = 0; i < kQK / 2; ++i) {
        // Values 2i and 2i+1 of the block: the low or high nibble of qs[(2i) % 16].
        const auto nib = [&](int v) { return (qs[v % 16] >> (v < 16 ? 0 : 4)) & 0x0f; };
        dst[i] = static_cast<uint8_t>(nib(2 * i) | nib(2 * i + 1) << 4);
      }
    }
  }
  SPARQ_RETURN_IF_ERROR(out.Validate(what));
  return out;
}

Result<DenseMatrix> GgufFile::ReadQuantized(const GgufTensorInfo& t) const {
  const std::string what = path_ + ": tensor '" + t.name + "'";
  // Rows of ne[0] values: the ggml layout, whatever the rank.
  const int64_t cols = t.ne.empty() ? 0 : t.ne[0];
  int64_t rows = 1;
  for (size_t i = 1; i < t.ne.size(); ++i) rows *= t.ne[i];  // the file's numel is checked on open
  return GgmlToQuantizedDense(t.type, TensorData(t), rows, cols, what);
}

}  // namespace sparq
