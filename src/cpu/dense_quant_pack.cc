// Packing of dense quantized weights (DenseQuantWeight, spmm_packed.h): from f32 by
// round-to-nearest, or from the codes and f16 scales a GGUF / .sparq file stores.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "sparq/checked.h"
#include "src/cpu/spmm_packed.h"

namespace sparq::cpu {
namespace {

// The layout's shape and empty code / scale storage for `values` (int8 or int4, group 32/64/128).
Result<PackedWeight> NewDenseQuant(int64_t rows, int64_t cols, const ValueSpec& values,
                                   const std::string& name) {
  if (!values.quantized()) {
    return InvalidInput(name + ": dense quantized values must be int8 or int4, not " +
                        values.Name());
  }
  const int g = values.group;
  if ((g != 32 && g != 64 && g != 128) || g % kDqChunk != 0) {
    return InvalidInput(name + ": group " + std::to_string(g) + " is not 32, 64 or 128");
  }
  if (rows < 0 || cols <= 0) {
    return InvalidInput(name + ": shape " + std::to_string(rows) + "x" + std::to_string(cols));
  }
  PackedWeight pw;
  pw.rows = rows;
  pw.cols = cols;
  pw.source = "dense " + values.Name();
  DenseQuantWeight w;
  w.rows = rows;
  w.cols = cols;
  w.values = values;
  w.k_pad = RoundUp(cols, kDqChunk);
  w.group_shift = __builtin_ctz(static_cast<unsigned>(g));
  w.groups_per_row = CeilDiv(cols, int64_t{g});
  SPARQ_ASSIGN_OR_RETURN(w.codes,
                         Tensor::TryAlloc(DType::kU8, {rows, w.row_bytes()}, name + ".codes"));
  w.scales.assign(static_cast<size_t>(rows * w.groups_per_row), 0.0f);
  if (values.has_min()) w.mins.assign(w.scales.size(), 0.0f);
  // Streamed per product: codes, and the scales (and mins) as the f32 copies the kernels read
  // (as NmWeight counts them; the file holds them as f16).
  pw.weight_bytes = static_cast<uint64_t>(rows * w.row_bytes()) +
                    w.scales.size() * 4 * (values.has_min() ? 2 : 1);
  pw.stored = rows * cols;
  pw.layout = std::move(w);
  return pw;
}

// Stores code `q` of column c of a row whose codes start at `row` (int4: the chunk nibble order).
void PutCode(const ValueSpec& v, uint8_t* row, int64_t c, int q) {
  if (v.dtype == DType::kI8) {
    row[c] = static_cast<uint8_t>(static_cast<int8_t>(q));
    return;
  }
  const int64_t byte = c / kDqChunk * (kDqChunk / 2) + c % (kDqChunk / 2);
  const int shift = c % kDqChunk >= kDqChunk / 2 ? 4 : 0;
  row[byte] = static_cast<uint8_t>((row[byte] & ~(0x0F << shift)) | ((q & 0x0F) << shift));
}

// The padding columns [cols, k_pad) get the code of 0 where there is one (X is 0 there anyway).
void PadRow(const DenseQuantWeight& w, uint8_t* row) {
  const int zero = w.values.dtype == DType::kI4 && w.values.sym ? 8 : 0;
  for (int64_t c = w.cols; c < w.k_pad; ++c) PutCode(w.values, row, c, zero);
}

}  // namespace

int DenseQuantWeight::Code(int64_t r, int64_t c) const {
  const uint8_t* row = codes.data_as<uint8_t>() + r * row_bytes();
  if (values.dtype == DType::kI8) return static_cast<int8_t>(row[c]);
  const int64_t byte = c / kDqChunk * (kDqChunk / 2) + c % (kDqChunk / 2);
  return (row[byte] >> (c % kDqChunk >= kDqChunk / 2 ? 4 : 0)) & 0x0F;
}

float DenseQuantWeight::Value(int64_t r, int64_t c) const {
  const size_t gi = static_cast<size_t>(r * groups_per_row + (c >> group_shift));
  QuantGroup g;
  g.scale = scales[gi];
  g.min = values.has_min() ? mins[gi] : 0.0f;
  return Dequantize(Code(r, c), g, values);
}

Result<PackedWeight> PackDenseQuant(const float* src, int64_t rows, int64_t cols, int64_t ld,
                                    const ValueSpec& values, const std::string& name) {
  SPARQ_ASSIGN_OR_RETURN(PackedWeight pw, NewDenseQuant(rows, cols, values, name));
  DenseQuantWeight& w = std::get<DenseQuantWeight>(pw.layout);
  uint8_t* out = w.codes.mutable_data_as<uint8_t>();
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = out + r * w.row_bytes();
    for (int64_t g = 0; g < w.groups_per_row; ++g) {
      const int64_t c0 = g * values.group;
      const int64_t count = std::min<int64_t>(values.group, cols - c0);
      const float* v = src + r * ld + c0;
      auto fit = FitQuantGroup(v, count, values);
      if (!fit.ok()) {
        return fit.status().WithContext(name + " row " + std::to_string(r) + " group " +
                                        std::to_string(g));
      }
      w.scales[r * w.groups_per_row + g] = fit->scale;
      if (values.has_min()) w.mins[r * w.groups_per_row + g] = fit->min;
      for (int64_t i = 0; i < count; ++i)
        PutCode(values, row, c0 + i, NearestCode(v[i], *fit, values));
    }
    PadRow(w, row);
  }
  return pw;
}

Result<PackedWeight> PackDenseQuantCodes(int64_t rows, int64_t cols, const ValueSpec& values,
                                         const uint8_t* codes, int64_t code_bytes,
                                         const uint16_t* scales_f16, const uint16_t* mins_f16,
                                         int64_t group_count, const std::string& name) {
  SPARQ_ASSIGN_OR_RETURN(PackedWeight pw, NewDenseQuant(rows, cols, values, name));
  DenseQuantWeight& w = std::get<DenseQuantWeight>(pw.layout);
  const bool i8 = values.dtype == DType::kI8;
  const int64_t src_row = i8 ? cols : CeilDiv(cols, 2);
  if (code_bytes != rows * src_row) {
    return InvalidInput(name + ".codes: " + std::to_string(code_bytes) + " bytes, expected " +
                        std::to_string(rows * src_row));
  }
  if (group_count != rows * w.groups_per_row) {
    return InvalidInput(name + ".scales: " + std::to_string(group_count) + " groups, expected " +
                        std::to_string(rows * w.groups_per_row));
  }
  if (values.has_min() && mins_f16 == nullptr) return InvalidInput(name + ".mins: missing");
  uint8_t* out = w.codes.mutable_data_as<uint8_t>();
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* s = codes + r * src_row;
    uint8_t* row = out + r * w.row_bytes();
    for (int64_t c = 0; c < cols; ++c) {
      const int q = i8 ? static_cast<int8_t>(s[c]) : (s[c / 2] >> (c % 2 ? 4 : 0)) & 0x0F;
      PutCode(values, row, c, q);
    }
    PadRow(w, row);
  }
  for (int64_t gi = 0; gi < group_count; ++gi) {
    const QuantGroup g =
        QuantGroupFromF16(scales_f16[gi], values.has_min() ? mins_f16[gi] : 0, values);
    if (!std::isfinite(g.scale) || !std::isfinite(g.min)) {
      return InvalidInput(name + ".scales[" + std::to_string(gi) + "]: not finite");
    }
    w.scales[gi] = g.scale;
    if (values.has_min()) w.mins[gi] = g.min;
  }
  return pw;
}

}  // namespace sparq::cpu
