// libFuzzer target: CsrMatrix::Validate on arbitrary parts; ToDense and a re-encode round trip
// when it passes. Header: rows u8, cols u16, value dtype, index dtype, nnz u16, perturb, mode
// (bit 0: row_ptr given as u8 per-row counts, so it is monotone), then row_ptr, col_idx, values.
#include <cstdint>

#include "fuzz/validate_fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace sparq;
  fuzz::FuzzInput in(data, size);
  CsrMatrix c;
  c.rows = in.U8() % 65;
  c.cols = in.U16() % 2049;
  const DType vt = fuzz::ValueDTypeFrom(in.U8());
  const DType it = fuzz::IndexDTypeFrom(in.U8());
  const int64_t nnz = in.U16() % 1025;
  const uint8_t perturb = in.U8(), mode = in.U8();
  const int64_t rp_len = fuzz::Perturbed(c.rows + 1, perturb, 0);
  if (mode & 1) {
    c.row_ptr = Tensor::Alloc(DType::kI64, {rp_len});
    int64_t* rp = c.row_ptr.mutable_data_as<int64_t>();
    for (int64_t i = 1; i < rp_len; ++i) rp[i] = rp[i - 1] + in.U8() % 8;
  } else {
    c.row_ptr = in.Take(DType::kI64, {rp_len});
  }
  c.col_idx = in.Take(it, {fuzz::Perturbed(nnz, perturb, 1)});
  c.values = in.Take(vt, {fuzz::Perturbed(nnz, perturb, 2)});
  if (!c.Validate("fuzz").ok()) return 0;
  if (c.ByteSize() != c.row_ptr.nbytes() + c.col_idx.nbytes() + c.values.nbytes()) abort();
  fuzz::CheckValidRoundTrip(c, [&](std::span<const float> w) {
    return CsrMatrix::FromDense(w, c.rows, c.cols, vt);
  });
  return 0;
}
