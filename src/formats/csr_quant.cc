// Quantized values of a CsrMatrix (format.h): quantizing, checking and dequantizing. A group is a
// range of spec.group dense columns of a row (format.h says why), so the stored values of group g
// of row r are the contiguous run of row r whose columns lie in [g * group, (g + 1) * group).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "sparq/format.h"
#include "src/formats/format_util.h"

namespace sparq {

using namespace formats_internal;  // NOLINT: the codecs and checks of this room

namespace {

// Code p of the matrix (int8: signed byte; int4: nibble p % 2 of byte p / 2).
int CodeAt(const uint8_t* codes, DType dtype, int64_t p) {
  if (dtype == DType::kI8) return static_cast<int8_t>(codes[p]);
  return (codes[p / 2] >> (p % 2 ? 4 : 0)) & 0x0F;
}

std::string At(int64_t r, int64_t g) {
  return "row " + std::to_string(r) + " group " + std::to_string(g);
}

// Calls fn(r, g, p0, p1) for every group of every row: its stored values are [p0, p1).
// Precondition: row_ptr and col_idx valid.
template <typename Fn>
void ForEachGroup(const CsrMatrix& s, int64_t group, Fn&& fn) {
  const int64_t qg = CeilDiv(s.cols, group);
  const int64_t* rp = s.row_ptr.data_as<int64_t>();
  DispatchIndex(s.col_idx.dtype(), [&](auto itag) {
    const auto* ci = s.col_idx.data_as<decltype(itag)>();
    for (int64_t r = 0; r < s.rows; ++r) {
      int64_t p = rp[r];
      for (int64_t g = 0; g < qg; ++g) {
        const int64_t p0 = p, end = (g + 1) * group;
        while (p < rp[r + 1] && static_cast<int64_t>(ci[p]) < end) ++p;
        fn(r, g, p0, p);
      }
    }
  });
}

}  // namespace

int64_t CsrMatrix::quant_groups(const ValueSpec& spec) const {
  return spec.group > 0 ? CeilDiv(cols, int64_t{spec.group}) : 0;
}

namespace formats_internal {

Status ValidateCsrQuant(const CsrMatrix& s, const std::string& name) {
  const ValueSpec& spec = s.quant.spec;
  if (!QuantSpecOk(spec)) {
    return InvalidInput(name + ": quantized values with an unsupported spec (" + spec.Name() + ")");
  }
  const int64_t nnz = s.nnz(), qg = s.quant_groups(spec);
  const DType code_dtype = spec.dtype == DType::kI8 ? DType::kI8 : DType::kU8;
  SPARQ_RETURN_IF_ERROR(
      CheckPart(s.values, name + ".values", {code_dtype}, {CodeRowBytes(spec, nnz)}));
  SPARQ_RETURN_IF_ERROR(ValidateGroupParams(s.quant, s.rows, qg, name, false));
  const int lo = MinCode(spec), hi = MaxCode(spec);
  const uint8_t* codes = s.values.data_as<uint8_t>();
  if (const int64_t p = FirstCodeOutside(codes, spec.dtype, nnz, lo, hi); p >= 0) {
    return InvalidInput(name + ".values: value " + std::to_string(p) + " has code " +
                        std::to_string(CodeAt(codes, spec.dtype, p)) + ", outside " + spec.Name() +
                        "'s " + std::to_string(lo) + ".." + std::to_string(hi));
  }
  // int4 with an odd count: the unused high nibble of the last byte must be 0, so equal matrices
  // have equal bytes.
  if (spec.dtype == DType::kI4 && nnz % 2 == 1 && (codes[nnz / 2] >> 4) != 0) {
    return InvalidInput(name + ".values: bits in the unused high nibble of the last byte");
  }
  return Status::Ok();
}

}  // namespace formats_internal

Tensor CsrMatrix::StoredValuesF32() const {
  const int64_t n = nnz();
  Tensor out = Tensor::Alloc(DType::kF32, {n});
  float* o = out.mutable_data_as<float>();
  if (!quant.quantized()) {
    DispatchValue(values.dtype(), [&](auto codec) {
      using C = decltype(codec);
      const auto* v = values.data_as<typename C::Storage>();
      for (int64_t p = 0; p < n; ++p) o[p] = C::Dec(v[p]);
    });
    return out;
  }
  const ValueSpec& spec = quant.spec;
  const int64_t qg = quant_groups(spec);
  const uint8_t* codes = values.data_as<uint8_t>();
  const uint16_t* sc = quant.scales.data_as<uint16_t>();
  const uint16_t* mn = spec.has_min() ? quant.mins.data_as<uint16_t>() : nullptr;
  ForEachGroup(*this, spec.group, [&](int64_t r, int64_t g, int64_t p0, int64_t p1) {
    const int64_t gi = r * qg + g;
    const QuantGroup qp = QuantGroupFromF16(sc[gi], mn ? mn[gi] : 0, spec);
    for (int64_t p = p0; p < p1; ++p) o[p] = Dequantize(CodeAt(codes, spec.dtype, p), qp, spec);
  });
  return out;
}

Result<CsrMatrix> CsrMatrix::Quantize(const CsrMatrix& src, const ValueSpec& spec,
                                      std::span<const QuantGroup> fitted,
                                      const std::string& name) {
  if (!QuantSpecOk(spec)) {
    return InvalidInput(name + ": '" + spec.Name() + "' is not a quantized spec");
  }
  if (src.quant.quantized()) return InvalidInput(name + ": values are quantized already");
  SPARQ_RETURN_IF_ERROR(src.Validate(name));
  const int64_t qg = src.quant_groups(spec), nnz = src.nnz();
  if (!fitted.empty() && fitted.size() != static_cast<size_t>(src.rows * qg)) {
    return InvalidInput(name + ": " + std::to_string(fitted.size()) + " fitted groups, want " +
                        std::to_string(src.rows * qg));
  }
  const Tensor v = src.StoredValuesF32();
  const float* x = v.data_as<float>();
  CsrMatrix out;
  out.rows = src.rows;
  out.cols = src.cols;
  out.row_ptr = src.row_ptr;
  out.col_idx = src.col_idx;
  out.values = Tensor::Alloc(spec.dtype == DType::kI8 ? DType::kI8 : DType::kU8,
                             {CodeRowBytes(spec, nnz)});
  if (out.values.nbytes() > 0) std::memset(out.values.mutable_data(), 0, out.values.nbytes());
  out.quant.spec = spec;
  out.quant.scales = Tensor::Alloc(DType::kF16, {src.rows, qg});
  out.quant.mins = spec.has_min() ? Tensor::Alloc(DType::kF16, {src.rows, qg}) : Tensor();
  uint8_t* codes = out.values.mutable_data_as<uint8_t>();
  uint16_t* sc = out.quant.scales.mutable_data_as<uint16_t>();
  uint16_t* mn = spec.has_min() ? out.quant.mins.mutable_data_as<uint16_t>() : nullptr;
  Status st = Status::Ok();
  ForEachGroup(src, spec.group, [&](int64_t r, int64_t g, int64_t p0, int64_t p1) {
    if (!st.ok()) return;
    QuantGroup qp;
    if (fitted.empty()) {
      auto f = FitQuantGroup(x + p0, p1 - p0, spec);
      if (!f.ok()) {
        st = f.status().WithContext(name + ".values " + At(r, g));
        return;
      }
      qp = *f;
    } else {
      const QuantGroup& in = fitted[r * qg + g];
      qp = QuantGroupFromF16(in.scale_f16, in.min_f16, spec);
    }
    sc[r * qg + g] = qp.scale_f16;
    if (mn != nullptr) mn[r * qg + g] = qp.min_f16;
    for (int64_t p = p0; p < p1; ++p) {
      const int q = NearestCode(x[p], qp, spec);
      if (spec.dtype == DType::kI8) {
        codes[p] = static_cast<uint8_t>(static_cast<int8_t>(q));
      } else {
        codes[p / 2] |= static_cast<uint8_t>(q << (p % 2 ? 4 : 0));
      }
    }
  });
  SPARQ_RETURN_IF_ERROR(st);
  SPARQ_RETURN_IF_ERROR(out.Validate(name));
  return out;
}

}  // namespace sparq
