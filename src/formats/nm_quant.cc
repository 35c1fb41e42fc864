// Quantized values of an NmMatrix (format.h, QuantParts): quantizing, checking and dequantizing.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "sparq/format.h"
#include "src/formats/format_util.h"
#include "src/formats/nm_codec.h"

namespace sparq {

using namespace formats_internal;  // NOLINT: the codecs and checks of this room

namespace {

// Code j of row r (int8: signed byte; int4: the nibble).
int CodeAt(const NmMatrix& s, int64_t row_bytes, int64_t r, int64_t j) {
  const uint8_t* row = s.values.data_as<uint8_t>() + r * row_bytes;
  if (s.quant.spec.dtype == DType::kI8) return static_cast<int8_t>(row[j]);
  return (row[j / 2] >> (j % 2 ? 4 : 0)) & 0x0F;
}

}  // namespace

namespace formats_internal {

Status ValidateQuantParts(const NmMatrix& s, const std::string& name) {
  const ValueSpec& spec = s.quant.spec;
  if (!QuantSpecOk(spec)) {
    return InvalidInput(name + ": quantized values with an unsupported spec (" + spec.Name() + ")");
  }
  const NmLayout l = MakeNmLayout(s.rows, s.cols, 1, s.n, s.m);
  const int64_t per_row = l.values_row(), qg = s.quant_groups(spec);
  const int64_t row_bytes = CodeRowBytes(spec, per_row);
  const DType code_dtype = spec.dtype == DType::kI8 ? DType::kI8 : DType::kU8;
  SPARQ_RETURN_IF_ERROR(CheckPart(s.values, name + ".values", {code_dtype}, {s.rows, row_bytes}));
  SPARQ_RETURN_IF_ERROR(CheckPart(s.meta, name + ".meta", {DType::kU8}, {l.slabs, l.meta_row_bytes}));
  SPARQ_RETURN_IF_ERROR(ValidateGroupParams(s.quant, s.rows, qg, name, false));
  const int lo = MinCode(spec), hi = MaxCode(spec);
  for (int64_t r = 0; r < s.rows; ++r) {
    const uint8_t* row = s.values.data_as<uint8_t>() + r * row_bytes;
    if (const int64_t j = FirstCodeOutside(row, spec.dtype, per_row, lo, hi); j >= 0) {
      return InvalidInput(name + ".values: row " + std::to_string(r) + " value " +
                          std::to_string(j) + " has code " +
                          std::to_string(CodeAt(s, row_bytes, r, j)) + ", outside " + spec.Name() +
                          "'s " + std::to_string(lo) + ".." + std::to_string(hi));
    }
    // int4 rows of odd length: the unused high nibble of the last byte must be 0.
    if (spec.dtype == DType::kI4 && per_row % 2 == 1 &&
        (s.values.data_as<uint8_t>()[r * row_bytes + row_bytes - 1] >> 4) != 0) {
      return InvalidInput(name + ".values: row " + std::to_string(r) +
                          " has bits in the unused high nibble of its last byte");
    }
  }
  return Status::Ok();
}

}  // namespace formats_internal

int64_t NmMatrix::quant_groups(const ValueSpec& spec) const {
  return spec.group > 0 ? CeilDiv(groups() * n, int64_t{spec.group}) : 0;
}

Tensor NmMatrix::StoredValuesF32() const {
  const NmLayout l = MakeNmLayout(rows, cols, 1, n, m);
  const int64_t per_row = l.values_row();
  if (!quant.quantized()) {
    Tensor out = Tensor::Alloc(DType::kF32, {rows, per_row});
    float* o = out.mutable_data_as<float>();
    DispatchValue(values.dtype(), [&](auto codec) {
      using C = decltype(codec);
      const auto* v = values.data_as<typename C::Storage>();
      for (int64_t i = 0; i < rows * per_row; ++i) o[i] = C::Dec(v[i]);
    });
    return out;
  }
  const ValueSpec& spec = quant.spec;
  const int64_t qg = quant_groups(spec), row_bytes = CodeRowBytes(spec, per_row);
  Tensor out = Tensor::Alloc(DType::kF32, {rows, per_row});
  float* o = out.mutable_data_as<float>();
  const uint16_t* sc = quant.scales.data_as<uint16_t>();
  const uint16_t* mn = spec.has_min() ? quant.mins.data_as<uint16_t>() : nullptr;
  const uint8_t* mrow0 = meta.data_as<uint8_t>();
  for (int64_t r = 0; r < rows; ++r) {
    // One group's parameters per group, not per value: this loop runs on every load (Validate,
    // packing), over every kept weight of the model.
    for (int64_t gq = 0; gq < qg; ++gq) {
      const int64_t gi = r * qg + gq;
      const QuantGroup g = QuantGroupFromF16(sc[gi], mn ? mn[gi] : 0, spec);
      const int64_t j1 = std::min<int64_t>(per_row, (gq + 1) * spec.group);
      for (int64_t j = gq * spec.group; j < j1; ++j) {
        const int64_t col = (j / n) * m +
                            ReadBits(mrow0 + r * l.meta_row_bytes, j * l.bits, l.bits);
        o[r * per_row + j] =
            col < cols ? Dequantize(CodeAt(*this, row_bytes, r, j), g, spec) : 0.0f;
      }
    }
  }
  return out;
}

Result<NmMatrix> NmMatrix::Quantize(const NmMatrix& src, const ValueSpec& spec,
                                    std::span<const QuantGroup> fitted, const std::string& name) {
  if (!QuantSpecOk(spec)) {
    return InvalidInput(name + ": '" + spec.Name() + "' is not a quantized spec");
  }
  if (src.quant.quantized()) return InvalidInput(name + ": values are quantized already");
  SPARQ_RETURN_IF_ERROR(src.Validate(name));
  const NmLayout l = MakeNmLayout(src.rows, src.cols, 1, src.n, src.m);
  const Tensor v = src.StoredValuesF32();
  NmMatrix out;
  out.rows = src.rows;
  out.cols = src.cols;
  out.n = src.n;
  out.m = src.m;
  out.meta = src.meta;
  SPARQ_RETURN_IF_ERROR(QuantizeRows(v.data_as<float>(), src.rows, l.values_row(), spec, fitted,
                                     name, &out.values, &out.quant));
  SPARQ_RETURN_IF_ERROR(out.Validate(name));
  return out;
}

}  // namespace sparq
