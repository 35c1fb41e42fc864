// Quantized bit-mask packing (MaskWeight::spec, spmm_packed.h): a CSR weight's int8 / int4 codes
// kept as stored beside the mask bits, with f16 group parameters, so that decode streams the codes
// (half a byte per kept int4 value) instead of f32 values.
#include <algorithm>
#include <cstring>
#include <string>

#include "sparq/format.h"
#include "src/cpu/spmm_packed.h"

namespace sparq::cpu {

std::string MaskQuantDeclines(const ValueSpec& spec) {
  if (!spec.quantized()) return "values are not quantized";
  if (spec.group <= 0 || spec.group % kMaskChunk != 0 || (spec.group & (spec.group - 1)) != 0) {
    return "group " + std::to_string(spec.group) + " is not a power-of-two multiple of the " +
           std::to_string(kMaskChunk) + "-column mask chunk";
  }
  return {};
}

Status KeepMaskCodes(PackedWeight& pw, const CsrMatrix& q, const std::string& name) {
  MaskWeight& w = pw.mask();
  const ValueSpec& spec = q.quant.spec;
  const int64_t nnz = q.nnz();
  const int64_t code_bytes = spec.dtype == DType::kI8 ? nnz : (nnz + 1) / 2;
  Tensor codes;
  SPARQ_ASSIGN_OR_RETURN(codes,
                         Tensor::TryAlloc(DType::kU8, {code_bytes + kMaskQuantTail}, name + ".values"));
  uint8_t* dst = codes.mutable_data_as<uint8_t>();
  if (code_bytes > 0) std::memcpy(dst, q.values.data(), static_cast<size_t>(code_bytes));
  std::memset(dst + code_bytes, 0, kMaskQuantTail);
  const int64_t gpr = q.quant_groups(spec);
  const int np = spec.has_min() ? 2 : 1;
  std::vector<uint16_t> params(static_cast<size_t>(w.rows * gpr * np));
  const uint16_t* sc = q.quant.scales.data_as<uint16_t>();
  const uint16_t* mn = spec.has_min() ? q.quant.mins.data_as<uint16_t>() : nullptr;
  for (int64_t g = 0; g < w.rows * gpr; ++g) {
    params[static_cast<size_t>(g * np)] = sc[g];
    if (mn != nullptr) params[static_cast<size_t>(g * np + 1)] = mn[g];
  }
  w.values = std::move(codes);
  w.spec = spec;
  w.group_shift = 0;
  while ((1 << w.group_shift) < spec.group) ++w.group_shift;
  w.groups_per_row = gpr;
  w.params = std::move(params);
  pw.source = "csr " + spec.Name() + " as bitmask";
  pw.weight_bytes = uint64_t(code_bytes) + w.bits.nbytes() + 2 * uint64_t(w.params.size()) +
                    8 * (uint64_t(w.rows) + 1);
  return Status::Ok();
}

float MaskWeight::Value(int64_t r, int64_t c, int64_t p) const {
  if (!spec.quantized()) return ValueAt(values, p);
  const size_t gi = static_cast<size_t>((r * groups_per_row + (c >> group_shift)) * params_per_group());
  const QuantGroup g = QuantGroupFromF16(params[gi], spec.has_min() ? params[gi + 1] : 0, spec);
  const uint8_t* b = values.data_as<uint8_t>();
  const int code = spec.dtype == DType::kI8 ? int(static_cast<int8_t>(b[p]))
                                             : (b[p / 2] >> (p % 2 ? 4 : 0)) & 0x0F;
  return Dequantize(code, g, spec);
}

}  // namespace sparq::cpu
