// libFuzzer target: CooMatrix::Validate on arbitrary parts; ToDense and a re-encode round trip
// when it passes. Header: rows u8, cols u16, value dtype, nnz u16, perturb, then row_idx, col_idx,
// values.
#include <cstdint>

#include "fuzz/validate_fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace sparq;
  fuzz::FuzzInput in(data, size);
  CooMatrix c;
  c.rows = in.U8() % 65;
  c.cols = in.U16() % 2049;
  const DType vt = fuzz::ValueDTypeFrom(in.U8());
  const int64_t nnz = in.U16() % 1025;
  const uint8_t perturb = in.U8();
  c.row_idx = in.Take(DType::kU32, {fuzz::Perturbed(nnz, perturb, 0)});
  c.col_idx = in.Take(DType::kU32, {fuzz::Perturbed(nnz, perturb, 1)});
  c.values = in.Take(vt, {fuzz::Perturbed(nnz, perturb, 2)});
  if (!c.Validate("fuzz").ok()) return 0;
  fuzz::CheckValidRoundTrip(c, [&](std::span<const float> w) {
    return CooMatrix::FromDense(w, c.rows, c.cols, vt);
  });
  return 0;
}
