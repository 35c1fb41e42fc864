// VnmMatrix: V:N:M, slabs of v rows sharing the kept positions of each N:M group.
#include <string>

#include "sparq/format.h"
#include "src/formats/format_util.h"
#include "src/formats/nm_codec.h"

namespace sparq {

using namespace formats_internal;  // NOLINT: the codecs and checks of this room

int VnmMatrix::index_bits() const { return IndexBitsFor(m); }

int64_t VnmMatrix::meta_row_bytes() const { return CeilDiv(groups() * n * index_bits(), 8); }

int VnmMatrix::Index(int64_t slab, int64_t j) const {
  return static_cast<int>(ReadBits(meta.data_as<uint8_t>() + slab * meta_row_bytes(),
                                   j * index_bits(), index_bits()));
}

Result<VnmMatrix> VnmMatrix::FromDense(std::span<const float> w, int64_t rows, int64_t cols,
                                       int v, int n, int m, DType value_dtype) {
  const std::string what = "VnmMatrix::FromDense";
  SPARQ_RETURN_IF_ERROR(CheckDenseInput(w, rows, cols, value_dtype, what.c_str()));
  SPARQ_RETURN_IF_ERROR(ValidateNmParams(v, n, m, what));
  const NmLayout l = MakeNmLayout(rows, cols, v, n, m);
  VnmMatrix out;
  out.rows = rows;
  out.cols = cols;
  out.v = v;
  out.n = n;
  out.m = m;
  out.values = Tensor::Alloc(value_dtype, {rows, l.values_row()});
  out.meta = Tensor::Alloc(DType::kU8, {l.slabs, l.meta_row_bytes});
  SPARQ_RETURN_IF_ERROR(DispatchValue(value_dtype, [&](auto codec) {
    using C = decltype(codec);
    return EncodeNm<C>(w.data(), l, out.values.mutable_data_as<typename C::Storage>(),
                       out.meta.mutable_data_as<uint8_t>(), what);
  }));
  return out;
}

Tensor VnmMatrix::ToDense() const {
  Tensor out = ZeroDense(rows, cols);
  if (!ValidateNmParams(v, n, m, "").ok()) return out;
  const NmLayout l = MakeNmLayout(rows, cols, v, n, m);
  if (quant.quantized()) {
    if (!ValidateQuantParts(*this, "").ok()) return out;
    const Tensor vals = StoredValuesF32();
    DecodeNm<F32Codec>(vals.data_as<float>(), meta.data_as<uint8_t>(), l,
                       out.mutable_data_as<float>());
    return out;
  }
  // Precondition is a valid matrix; mismatched parts give zeros rather than a bad read.
  if (!ValidateNmParts(values, meta, l, "").ok()) return out;
  DispatchValue(values.dtype(), [&](auto codec) {
    using C = decltype(codec);
    DecodeNm<C>(values.data_as<typename C::Storage>(), meta.data_as<uint8_t>(), l,
                out.mutable_data_as<float>());
  });
  return out;
}

Status VnmMatrix::Validate(const std::string& name) const {
  SPARQ_RETURN_IF_ERROR(CheckDims(rows, cols, name));
  SPARQ_RETURN_IF_ERROR(ValidateNmParams(v, n, m, name));
  const NmLayout l = MakeNmLayout(rows, cols, v, n, m);
  if (quant.quantized()) {
    SPARQ_RETURN_IF_ERROR(ValidateQuantParts(*this, name));
    // The codes are checked above; the indices need no values (as NmMatrix::Validate).
    return ValidateNmIndices<F32Codec>(nullptr, meta.data_as<uint8_t>(), l, name);
  }
  SPARQ_RETURN_IF_ERROR(ValidateNmParts(values, meta, l, name));
  return DispatchValue(values.dtype(), [&](auto codec) {
    using C = decltype(codec);
    return ValidateNmIndices<C>(values.data_as<typename C::Storage>(), meta.data_as<uint8_t>(), l,
                                name);
  });
}

uint64_t VnmMatrix::ByteSize() const {
  return values.nbytes() + meta.nbytes() + quant.scales.nbytes() + quant.mins.nbytes();
}

}  // namespace sparq
