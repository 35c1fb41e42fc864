// Quantized values of a DenseMatrix (format.h, QuantParts): quantizing, checking and dequantizing.
// Groups are spec.group consecutive columns of a row, so the codes of a row are its columns.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "sparq/format.h"
#include "src/formats/format_util.h"

namespace sparq {

using namespace formats_internal;  // NOLINT: the codecs and checks of this room

namespace {

// Code of column j in a row of codes (int8: signed byte; int4: the nibble).
int CodeAt(const uint8_t* row, DType dtype, int64_t j) {
  if (dtype == DType::kI8) return static_cast<int8_t>(row[j]);
  return (row[j / 2] >> (j % 2 ? 4 : 0)) & 0x0F;
}

// Stored codes a dense matrix may hold: those of quant.h, and symmetric int4 code 0 as well
// (GGUF Q4_0 uses all 16 codes; (0 - 8) * scale is well defined).
int MinStoredCode(const ValueSpec& spec) { return spec.dtype == DType::kI4 ? 0 : MinCode(spec); }

}  // namespace

int64_t DenseMatrix::quant_groups(const ValueSpec& spec) const {
  return spec.group > 0 ? CeilDiv(cols, int64_t{spec.group}) : 0;
}

namespace formats_internal {

Status ValidateDenseQuant(const DenseMatrix& s, const std::string& name) {
  const ValueSpec& spec = s.quant.spec;
  if (!QuantSpecOk(spec)) {
    return InvalidInput(name + ": quantized values with an unsupported spec (" + spec.Name() + ")");
  }
  const int64_t qg = s.quant_groups(spec), row_bytes = CodeRowBytes(spec, s.cols);
  const DType code_dtype = spec.dtype == DType::kI8 ? DType::kI8 : DType::kU8;
  SPARQ_RETURN_IF_ERROR(CheckPart(s.values, name + ".values", {code_dtype}, {s.rows, row_bytes}));
  SPARQ_RETURN_IF_ERROR(ValidateGroupParams(s.quant, s.rows, qg, name, true));
  const int lo = MinStoredCode(spec), hi = MaxCode(spec);
  const uint8_t* codes = s.values.data_as<uint8_t>();
  for (int64_t r = 0; r < s.rows; ++r) {
    const uint8_t* row = codes + r * row_bytes;
    if (const int64_t j = FirstCodeOutside(row, spec.dtype, s.cols, lo, hi); j >= 0) {
      return InvalidInput(name + ".values: row " + std::to_string(r) + " column " +
                          std::to_string(j) + " has code " +
                          std::to_string(CodeAt(row, spec.dtype, j)) + ", outside " + spec.Name() +
                          "'s " + std::to_string(lo) + ".." + std::to_string(hi));
    }
    // int4 rows of odd length: the unused high nibble of the last byte must be 0, so equal
    // matrices have equal bytes.
    if (spec.dtype == DType::kI4 && s.cols % 2 == 1 && (row[row_bytes - 1] >> 4) != 0) {
      return InvalidInput(name + ".values: row " + std::to_string(r) +
                          " has bits in the unused high nibble of its last byte");
    }
  }
  return Status::Ok();
}

Tensor DenseQuantToF32(const DenseMatrix& s) {
  const ValueSpec& spec = s.quant.spec;
  const int64_t qg = s.quant_groups(spec), row_bytes = CodeRowBytes(spec, s.cols);
  Tensor out = ZeroDense(s.rows, s.cols);
  float* o = out.mutable_data_as<float>();
  const uint8_t* codes = s.values.data_as<uint8_t>();
  const uint16_t* sc = s.quant.scales.data_as<uint16_t>();
  const uint16_t* mn = spec.has_min() ? s.quant.mins.data_as<uint16_t>() : nullptr;
  // Dequantize's values, a group at a time with the code width hoisted (this runs on every load
  // of a quantized embedding: 28M values for SmolLM2). With a min, code * scale is exact in f32
  // (a 4-bit code times an f16 scale's 11-bit significand), so a multiply and an add round once,
  // as Dequantize's fma does: the same bits without a libm fmaf call per value.
  for (int64_t r = 0; r < s.rows; ++r) {
    const uint8_t* row = codes + r * row_bytes;
    float* orow = o + r * s.cols;
    for (int64_t g = 0; g < qg; ++g) {
      const QuantGroup p = QuantGroupFromF16(sc[r * qg + g], mn ? mn[r * qg + g] : 0, spec);
      const float scale = p.scale, min = p.min;
      const int64_t j0 = g * spec.group, j1 = std::min<int64_t>(s.cols, (g + 1) * spec.group);
      if (spec.dtype == DType::kI8) {
        for (int64_t j = j0; j < j1; ++j) orow[j] = static_cast<float>(static_cast<int8_t>(row[j])) * scale;
      } else if (spec.sym) {
        for (int64_t j = j0; j < j1; ++j) {
          orow[j] = static_cast<float>(((row[j / 2] >> (j % 2 ? 4 : 0)) & 0x0F) - 8) * scale;
        }
      } else {
        for (int64_t j = j0; j < j1; ++j) {
          orow[j] = static_cast<float>((row[j / 2] >> (j % 2 ? 4 : 0)) & 0x0F) * scale + min;
        }
      }
    }
  }
  return out;
}

}  // namespace formats_internal

Result<DenseMatrix> DenseMatrix::Quantize(const DenseMatrix& src, const ValueSpec& spec,
                                          std::span<const QuantGroup> fitted,
                                          const std::string& name) {
  if (!QuantSpecOk(spec))
    return InvalidInput(name + ": '" + spec.Name() + "' is not a quantized spec");
  if (src.quant.quantized()) return InvalidInput(name + ": values are quantized already");
  SPARQ_RETURN_IF_ERROR(src.Validate(name));
  const Tensor v = src.ToDense();
  DenseMatrix out;
  out.rows = src.rows;
  out.cols = src.cols;
  SPARQ_RETURN_IF_ERROR(QuantizeRows(v.data_as<float>(), src.rows, src.cols, spec, fitted, name,
                                     &out.values, &out.quant));
  SPARQ_RETURN_IF_ERROR(out.Validate(name));
  return out;
}

}  // namespace sparq
