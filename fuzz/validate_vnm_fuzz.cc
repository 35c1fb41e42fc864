// libFuzzer target: VnmMatrix::Validate on arbitrary parts; ToDense and a re-encode round trip
// when it passes. Header: rows u8, cols u16, v u8, n u8, m u8, value dtype (bit 7: quantized, the
// spec in bits 2-6), perturb, then values (or codes), meta (then scales and mins).
#include <cstdint>

#include "fuzz/validate_fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace sparq;
  fuzz::FuzzInput in(data, size);
  VnmMatrix s;
  s.rows = in.U8() % 65;
  s.cols = in.U16() % 1025;
  s.v = in.U8() % 67;
  s.n = in.U8() % 18;
  s.m = in.U8() % 18;
  const uint8_t vsel = in.U8();
  const DType vt = fuzz::ValueDTypeFrom(vsel);
  const uint8_t perturb = in.U8();
  // Selector bit 7: quantized values (spec from bits 2-6): codes, then scales and mins.
  const bool quantized = vsel & 0x80;
  const int64_t groups = s.m > 0 ? (s.cols + s.m - 1) / s.m : 1;
  const int64_t slabs = s.v > 0 ? (s.rows + s.v - 1) / s.v : 1;
  int bits = 1;
  while (s.m > 0 && (1 << bits) < s.m) ++bits;
  const int64_t meta_row = (groups * s.n * bits + 7) / 8;
  if (quantized) {
    s.quant.spec = fuzz::QuantSpecFrom(vsel >> 2);
    const bool i8 = s.quant.spec.dtype == DType::kI8;
    const int64_t per_row = groups * s.n,
                  qg = (per_row + s.quant.spec.group - 1) / s.quant.spec.group;
    s.values = in.Take(i8 ? DType::kI8 : DType::kU8,
                       {s.rows, fuzz::Perturbed(i8 ? per_row : (per_row + 1) / 2, perturb, 0)});
    s.meta = in.Take(DType::kU8, {fuzz::Perturbed(slabs, perturb, 1), meta_row});
    s.quant.scales = in.Take(DType::kF16, {s.rows, fuzz::Perturbed(qg, perturb, 2)});
    if (s.quant.spec.has_min()) s.quant.mins = in.Take(DType::kF16, {s.rows, qg});
    if (!s.Validate("fuzz").ok()) return 0;
    fuzz::CheckQuantizedRoundTrip(s);
    return 0;
  }
  s.values = in.Take(vt, {s.rows, fuzz::Perturbed(groups * s.n, perturb, 0)});
  s.meta = in.Take(DType::kU8, {fuzz::Perturbed(slabs, perturb, 1), meta_row});
  if (!s.Validate("fuzz").ok()) return 0;
  fuzz::CheckValidRoundTrip(s, [&](std::span<const float> w) {
    return VnmMatrix::FromDense(w, s.rows, s.cols, s.v, s.n, s.m, vt);
  });
  return 0;
}
