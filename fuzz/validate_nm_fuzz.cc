// libFuzzer target: NmMatrix::Validate on arbitrary parts; ToDense and a re-encode round trip
// when it passes. Header: rows u8, cols u16, n u8, m u8, value dtype, perturb, then values, meta.
#include <cstdint>

#include "fuzz/validate_fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace sparq;
  fuzz::FuzzInput in(data, size);
  NmMatrix s;
  s.rows = in.U8() % 65;
  s.cols = in.U16() % 1025;
  s.n = in.U8() % 18;
  s.m = in.U8() % 18;
  const DType vt = fuzz::ValueDTypeFrom(in.U8());
  const uint8_t perturb = in.U8();
  // Part shapes as the layout would have them (any m >= 1 gives a computable layout).
  const int64_t groups = s.m > 0 ? (s.cols + s.m - 1) / s.m : 1;
  int bits = 1;
  while (s.m > 0 && (1 << bits) < s.m) ++bits;
  const int64_t meta_row = (groups * s.n * bits + 7) / 8;
  s.values = in.Take(vt, {s.rows, fuzz::Perturbed(groups * s.n, perturb, 0)});
  s.meta = in.Take(DType::kU8, {fuzz::Perturbed(s.rows, perturb, 1), meta_row});
  if (!s.Validate("fuzz").ok()) return 0;
  for (int64_t r = 0; r < s.rows; ++r) {
    for (int64_t j = 0; j < s.groups() * s.n; ++j) {
      if (s.Index(r, j) >= s.m) abort();
    }
  }
  fuzz::CheckValidRoundTrip(s, [&](std::span<const float> w) {
    return NmMatrix::FromDense(w, s.rows, s.cols, s.n, s.m, vt);
  });
  return 0;
}
