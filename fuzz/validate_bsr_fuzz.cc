// libFuzzer target: BsrMatrix::Validate on arbitrary parts; ToDense and a re-encode round trip
// when it passes. Header: rows u8, cols u16, bh u8, bw u8, value dtype, index dtype, nblocks u8,
// perturb, mode (bit 0: row_ptr as u8 per-block-row counts; bit 1: quantized values, the spec in
// bits 2-7), then row_ptr, col_idx, values (or codes, then scales and mins).
#include <cstdint>

#include "fuzz/validate_fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace sparq;
  fuzz::FuzzInput in(data, size);
  BsrMatrix b;
  b.rows = in.U8() % 65;
  b.cols = in.U16() % 1025;
  b.bh = in.U8() % 18;  // 0 and 17 exercise the invalid / non-dividing cases
  b.bw = in.U8() % 18;
  const DType vt = fuzz::ValueDTypeFrom(in.U8());
  const DType it = fuzz::IndexDTypeFrom(in.U8());
  const int64_t nblocks = in.U8() % 65;
  const uint8_t perturb = in.U8(), mode = in.U8();
  const int64_t brows = b.bh > 0 ? (b.rows + b.bh - 1) / b.bh : 1;
  const int64_t rp_len = fuzz::Perturbed(brows + 1, perturb, 0);
  if (mode & 1) {
    b.row_ptr = Tensor::Alloc(DType::kI64, {rp_len});
    int64_t* rp = b.row_ptr.mutable_data_as<int64_t>();
    for (int64_t i = 1; i < rp_len; ++i) rp[i] = rp[i - 1] + in.U8() % 4;
  } else {
    b.row_ptr = in.Take(DType::kI64, {rp_len});
  }
  b.col_idx = in.Take(it, {fuzz::Perturbed(nblocks, perturb, 1)});
  if (mode & 2) {  // quantized values (spec from bits 2-7): codes, then scales and mins
    b.quant.spec = fuzz::QuantSpecFrom(mode >> 2);
    const bool i8 = b.quant.spec.dtype == DType::kI8;
    const int64_t qg = (b.cols + b.quant.spec.group - 1) / b.quant.spec.group;
    b.values = in.Take(i8 ? DType::kI8 : DType::kU8,
                       {fuzz::Perturbed(nblocks, perturb, 2), b.bh, i8 ? b.bw : (b.bw + 1) / 2});
    b.quant.scales = in.Take(DType::kF16, {b.rows, fuzz::Perturbed(qg, perturb, 3)});
    if (b.quant.spec.has_min()) b.quant.mins = in.Take(DType::kF16, {b.rows, qg});
    if (!b.Validate("fuzz").ok()) return 0;
    fuzz::CheckQuantizedRoundTrip(b);
    return 0;
  }
  b.values = in.Take(vt, {fuzz::Perturbed(nblocks, perturb, 2), b.bh, b.bw});
  if (!b.Validate("fuzz").ok()) return 0;
  fuzz::CheckValidRoundTrip(b, [&](std::span<const float> w) {
    return BsrMatrix::FromDense(w, b.rows, b.cols, b.bh, b.bw, vt);
  });
  return 0;
}
