// Quantized values of an NmMatrix or VnmMatrix (format.h, QuantParts): quantizing, checking and
// dequantizing.
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

// Code j of a row of codes (int8: signed byte; int4: the nibble).
int CodeAt(const uint8_t* row, DType dtype, int64_t j) {
  if (dtype == DType::kI8) return static_cast<int8_t>(row[j]);
  return (row[j / 2] >> (j % 2 ? 4 : 0)) & 0x0F;
}

// The checks of quantized N:M and V:N:M values (the same layout: l.v rows share a meta row).
Status ValidateNmQuant(const NmLayout& l, const Tensor& values, const Tensor& meta,
                       const QuantParts& quant, const std::string& name) {
  const ValueSpec& spec = quant.spec;
  if (!QuantSpecOk(spec)) {
    return InvalidInput(name + ": quantized values with an unsupported spec (" + spec.Name() + ")");
  }
  const int64_t per_row = l.values_row(), qg = CeilDiv(per_row, int64_t{spec.group});
  const int64_t row_bytes = CodeRowBytes(spec, per_row);
  const DType code_dtype = spec.dtype == DType::kI8 ? DType::kI8 : DType::kU8;
  SPARQ_RETURN_IF_ERROR(CheckPart(values, name + ".values", {code_dtype}, {l.rows, row_bytes}));
  SPARQ_RETURN_IF_ERROR(CheckPart(meta, name + ".meta", {DType::kU8}, {l.slabs, l.meta_row_bytes}));
  SPARQ_RETURN_IF_ERROR(ValidateGroupParams(quant, l.rows, qg, name, false));
  const int lo = MinCode(spec), hi = MaxCode(spec);
  for (int64_t r = 0; r < l.rows; ++r) {
    const uint8_t* row = values.data_as<uint8_t>() + r * row_bytes;
    if (const int64_t j = FirstCodeOutside(row, spec.dtype, per_row, lo, hi); j >= 0) {
      return InvalidInput(name + ".values: row " + std::to_string(r) + " value " +
                          std::to_string(j) + " has code " +
                          std::to_string(CodeAt(row, spec.dtype, j)) + ", outside " + spec.Name() +
                          "'s " + std::to_string(lo) + ".." + std::to_string(hi));
    }
    // int4 rows of odd length: the unused high nibble of the last byte must be 0.
    if (spec.dtype == DType::kI4 && per_row % 2 == 1 && (row[row_bytes - 1] >> 4) != 0) {
      return InvalidInput(name + ".values: row " + std::to_string(r) +
                          " has bits in the unused high nibble of its last byte");
    }
  }
  return Status::Ok();
}

// The stored values as f32 [rows, groups * n]: numbers widened, or codes dequantized (slots in
// the padded tail group 0). Precondition: valid parts.
Tensor NmStoredF32(const NmLayout& l, const Tensor& values, const Tensor& meta,
                   const QuantParts& quant) {
  const int64_t per_row = l.values_row();
  Tensor out = Tensor::Alloc(DType::kF32, {l.rows, per_row});
  float* o = out.mutable_data_as<float>();
  if (!quant.quantized()) {
    DispatchValue(values.dtype(), [&](auto codec) {
      using C = decltype(codec);
      const auto* v = values.data_as<typename C::Storage>();
      for (int64_t i = 0; i < l.rows * per_row; ++i) o[i] = C::Dec(v[i]);
    });
    return out;
  }
  const ValueSpec& spec = quant.spec;
  const int64_t qg = CeilDiv(per_row, int64_t{spec.group}), row_bytes = CodeRowBytes(spec, per_row);
  const uint16_t* sc = quant.scales.data_as<uint16_t>();
  const uint16_t* mn = spec.has_min() ? quant.mins.data_as<uint16_t>() : nullptr;
  const uint8_t* mrow0 = meta.data_as<uint8_t>();
  for (int64_t r = 0; r < l.rows; ++r) {
    const uint8_t* codes = values.data_as<uint8_t>() + r * row_bytes;
    const uint8_t* mrow = mrow0 + (r / l.v) * l.meta_row_bytes;
    // One group's parameters per group, not per value: this loop runs on every load (Validate,
    // packing), over every kept weight of the model.
    for (int64_t gq = 0; gq < qg; ++gq) {
      const int64_t gi = r * qg + gq;
      const QuantGroup g = QuantGroupFromF16(sc[gi], mn ? mn[gi] : 0, spec);
      const int64_t j1 = std::min<int64_t>(per_row, (gq + 1) * spec.group);
      for (int64_t j = gq * spec.group; j < j1; ++j) {
        const int64_t col = (j / l.n) * l.m + ReadBits(mrow, j * l.bits, l.bits);
        o[r * per_row + j] =
            col < l.cols ? Dequantize(CodeAt(codes, spec.dtype, j), g, spec) : 0.0f;
      }
    }
  }
  return out;
}

}  // namespace

namespace formats_internal {

Status ValidateQuantParts(const NmMatrix& s, const std::string& name) {
  return ValidateNmQuant(MakeNmLayout(s.rows, s.cols, 1, s.n, s.m), s.values, s.meta, s.quant,
                         name);
}

Status ValidateQuantParts(const VnmMatrix& s, const std::string& name) {
  return ValidateNmQuant(MakeNmLayout(s.rows, s.cols, s.v, s.n, s.m), s.values, s.meta, s.quant,
                         name);
}

}  // namespace formats_internal

int64_t NmMatrix::quant_groups(const ValueSpec& spec) const {
  return spec.group > 0 ? CeilDiv(groups() * n, int64_t{spec.group}) : 0;
}

int64_t VnmMatrix::quant_groups(const ValueSpec& spec) const {
  return spec.group > 0 ? CeilDiv(groups() * n, int64_t{spec.group}) : 0;
}

Tensor NmMatrix::StoredValuesF32() const {
  return NmStoredF32(MakeNmLayout(rows, cols, 1, n, m), values, meta, quant);
}

Tensor VnmMatrix::StoredValuesF32() const {
  return NmStoredF32(MakeNmLayout(rows, cols, v, n, m), values, meta, quant);
}

// N:M and V:N:M: the same meta, codes of the stored values (a row's kept values in groups).
template <typename M>
Result<M> QuantizeKept(const M& src, const ValueSpec& spec, std::span<const QuantGroup> fitted,
                       const std::string& name) {
  if (!QuantSpecOk(spec)) {
    return InvalidInput(name + ": '" + spec.Name() + "' is not a quantized spec");
  }
  if (src.quant.quantized()) return InvalidInput(name + ": values are quantized already");
  SPARQ_RETURN_IF_ERROR(src.Validate(name));
  const Tensor v = src.StoredValuesF32();
  M out = src;  // dims, n, m (and v), meta
  SPARQ_RETURN_IF_ERROR(QuantizeRows(v.data_as<float>(), src.rows, src.groups() * src.n, spec,
                                     fitted, name, &out.values, &out.quant));
  SPARQ_RETURN_IF_ERROR(out.Validate(name));
  return out;
}

Result<NmMatrix> NmMatrix::Quantize(const NmMatrix& src, const ValueSpec& spec,
                                    std::span<const QuantGroup> fitted, const std::string& name) {
  return QuantizeKept(src, spec, fitted, name);
}

Result<VnmMatrix> VnmMatrix::Quantize(const VnmMatrix& src, const ValueSpec& spec,
                                      std::span<const QuantGroup> fitted, const std::string& name) {
  return QuantizeKept(src, spec, fitted, name);
}

}  // namespace sparq
