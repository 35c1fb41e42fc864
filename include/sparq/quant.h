// Quantized weight values: the value spec users name (`--values f32|bf16|f16|int8[:gN]|
// int4[:gN][:sym]`) and round-to-nearest quantization of groups of values.
//
// A group is `group` consecutive stored values of one row (for sparse layouts: kept values, so 64
// kept values of a 2:4 row span 128 dense columns). Each group has an f16 scale (and, for int4 with
// a min, an f16 min); the value of code q is, computed in f32:
//   int8:            q * scale,          q in [-127, 127]
//   int4 symmetric:  (q - 8) * scale,    q in [1, 15] (one code spare, as in the int8 range)
//   int4 with min:   fma(q, scale, min), q in [0, 15]
// (A DenseMatrix may also store symmetric int4 code 0 and negative scales, as GGUF Q4_0 does:
// format.h. The expressions above hold for them unchanged.)
// Kernels compute exactly these expressions, so a quantized product has the bits of the f32 product
// with the dequantized weights.
//
// Scales are amax / 127 (int8), amax / 7 (symmetric int4) or (max - min) / 15 (int4 with a min,
// min rounded down to f16), rounded *up* to f16 so no value needs a code past the last: every value
// comes back within half a step (half its group's scale) at any magnitude, subnormal scales
// included. Zero: int8 and symmetric int4 give 0 back exactly (codes 0 and 8). With a min, 0 is a
// value like any other: it comes back as the grid value nearest it, within half a step but not 0
// (as in llama.cpp's Q4_1). This matters for a kept N:M slot that holds 0 (a group with fewer than
// N nonzeros): it stays a slot of the pattern, and its value is within half a step of 0.
#pragma once

#include <cstdint>
#include <string>

#include "sparq/dtype.h"
#include "sparq/status.h"

namespace sparq {

struct ValueSpec {
  DType dtype = DType::kF32;  // kF32, kBF16, kF16, kI8 or kI4
  int group = 64;             // values per scale (quantized types only): 32, 64 or 128
  bool sym = false;           // int4: symmetric (no min); int8 is always symmetric

  bool quantized() const { return dtype == DType::kI8 || dtype == DType::kI4; }
  bool has_min() const { return dtype == DType::kI4 && !sym; }
  // "f32", "bf16", "int8:g64", "int4:g64", "int4:g32:sym".
  std::string Name() const;
  // Bits per stored value including its share of the scales (and mins).
  double BitsPerValue() const;
  // Parses the forms above; the group defaults to 64. Errors name the text and the allowed forms.
  static Result<ValueSpec> Parse(const std::string& text);
};

// One group's parameters, as f16 bits and their exact f32 values.
struct QuantGroup {
  uint16_t scale_f16 = 0, min_f16 = 0;
  float scale = 0, min = 0;
};

// The parameters round-to-nearest gives a group of `count` finite values v[0..count) under `spec`
// (quantized). An error if a value is not finite or a scale or min does not fit f16.
Result<QuantGroup> FitQuantGroup(const float* v, int64_t count, const ValueSpec& spec);

// A group's parameters from their stored f16 bits (min ignored unless spec.has_min()).
QuantGroup QuantGroupFromF16(uint16_t scale_f16, uint16_t min_f16, const ValueSpec& spec);

// The code of `spec` whose value in group g (Dequantize) is nearest to v, clamped to the codes
// spec allows.
int NearestCode(float v, const QuantGroup& g, const ValueSpec& spec);

// The codes spec allows: int8 -127..127, int4 with a min 0..15, symmetric int4 1..15.
inline int MinCode(const ValueSpec& spec) {
  return spec.dtype == DType::kI8 ? -127 : spec.has_min() ? 0 : 1;
}
inline int MaxCode(const ValueSpec& spec) { return spec.dtype == DType::kI8 ? 127 : 15; }

// Round-to-nearest codes of `count` finite values v[0..count) under `spec` (quantized): writes
// codes[i] (int8: -127..127; int4: the 4-bit code 0..15 as above) and returns the group's scale
// (and min). An error if a scale or min does not fit f16 (|v| beyond ~8e6 for int8).
Result<QuantGroup> QuantizeGroup(const float* v, int64_t count, const ValueSpec& spec,
                                 int8_t* codes);

// The f32 value of a code in a group (the expressions above).
inline float Dequantize(int code, const QuantGroup& g, const ValueSpec& spec) {
  if (spec.dtype == DType::kI8) return static_cast<float>(code) * g.scale;
  if (spec.sym) return static_cast<float>(code - 8) * g.scale;
  return __builtin_fmaf(static_cast<float>(code), g.scale, g.min);
}

}  // namespace sparq
