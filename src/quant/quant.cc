// Value specs and round-to-nearest group quantization (sparq/quant.h).
#include "sparq/quant.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace sparq {

std::string ValueSpec::Name() const {
  if (!quantized()) return std::string(DTypeName(dtype));
  std::string s = dtype == DType::kI8 ? "int8" : "int4";
  s += ":g" + std::to_string(group);
  if (dtype == DType::kI4 && sym) s += ":sym";
  return s;
}

double ValueSpec::BitsPerValue() const {
  if (!quantized()) return DTypeBits(dtype);
  const double params = has_min() ? 32.0 : 16.0;
  return (dtype == DType::kI8 ? 8.0 : 4.0) + params / group;
}

Result<ValueSpec> ValueSpec::Parse(const std::string& text) {
  auto bad = [&](const std::string& why) {
    return InvalidInput("values '" + text + "': " + why +
                        " (want f32, bf16, f16, int8[:gN] or int4[:gN][:sym], N = 32, 64 or 128)");
  };
  ValueSpec s;
  std::vector<std::string> parts;
  size_t at = 0;
  while (true) {
    const size_t colon = text.find(':', at);
    parts.push_back(text.substr(at, colon == std::string::npos ? std::string::npos : colon - at));
    if (colon == std::string::npos) break;
    at = colon + 1;
  }
  const std::string& head = parts[0];
  if (head == "f32" || head == "bf16" || head == "f16") {
    if (parts.size() > 1) return bad("a float type takes no group or options");
    s.dtype = *ParseDType(head);
    return s;
  }
  if (head != "int8" && head != "int4") return bad("unknown type '" + head + "'");
  s.dtype = head == "int8" ? DType::kI8 : DType::kI4;
  bool seen_group = false;
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::string& p = parts[i];
    if (p == "sym") {
      if (s.dtype != DType::kI4) return bad("int8 is always symmetric; ':sym' is for int4");
      if (s.sym) return bad("':sym' given twice");
      s.sym = true;
    } else if (p.size() > 1 && p[0] == 'g' && !seen_group &&
               std::all_of(p.begin() + 1, p.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      const std::string digits = p.substr(1);
      if (digits.size() > 4) return bad("group '" + p + "' out of range");
      s.group = std::stoi(digits);
      if (s.group != 32 && s.group != 64 && s.group != 128) return bad("group " + digits + " not supported");
      seen_group = true;
    } else {
      return bad("unknown part '" + p + "'");
    }
  }
  if (s.dtype == DType::kI8) s.sym = true;
  return s;
}

namespace {

// The f16 bits of the least f16 >= x (x >= 0; past the largest f16: infinity).
uint16_t F16AtLeast(double x) {
  float f = static_cast<float>(x);
  if (static_cast<double>(f) < x) f = std::nextafter(f, std::numeric_limits<float>::infinity());
  uint16_t h = F32ToF16(f);
  if (F16ToF32(h) < f) ++h;  // positive: the next bit pattern is the next f16 up (0x7bff -> inf)
  return h;
}

}  // namespace

Result<QuantGroup> FitQuantGroup(const float* v, int64_t count, const ValueSpec& spec) {
  QuantGroup g;
  float lo = 0, hi = 0, amax = 0;
  for (int64_t i = 0; i < count; ++i) {
    if (!std::isfinite(v[i])) return InvalidInput("value " + std::to_string(i) + " is not finite");
    lo = std::min(lo, v[i]);
    hi = std::max(hi, v[i]);
    amax = std::max(amax, std::fabs(v[i]));
  }
  const bool with_min = spec.has_min();
  // The group's grid: int8 and symmetric int4 scale |v| to the largest code (127, 7); int4 with a
  // min spreads [min, max] over 15 steps (min rounded to f16 first, so the grid starts exactly at
  // the stored min and codes are computed against what the kernels will use).
  const float steps = spec.dtype == DType::kI8 ? 127.0f : with_min ? 15.0f : 7.0f;
  if (with_min) {
    g.min_f16 = F32ToF16(lo);
    // A min rounded up past the smallest value would clip it: one f16 step towards -inf.
    if (F16ToF32(g.min_f16) > lo) {
      if (g.min_f16 & 0x8000u) {
        ++g.min_f16;
      } else if (g.min_f16 == 0) {
        g.min_f16 = 0x8001u;
      } else {
        --g.min_f16;
      }
    }
    g.min = F16ToF32(g.min_f16);
  }
  // The scale is rounded *up* to f16: rounded down, the group's extreme value would need a code
  // past the last one and be clamped, by several half-steps where f16 is subnormal (an int8 group
  // with amax below ~8e-3; a scale of 2^-24 has one significant bit). Rounded up, every value is
  // within half a step of its code at any magnitude, and the extreme code is reached wherever the
  // scale is a normal f16 (amax / 127 >= 2^-14).
  const double step = (with_min ? double(hi) - double(g.min) : double(amax)) / steps;
  g.scale_f16 = F16AtLeast(step);
  g.scale = F16ToF32(g.scale_f16);
  if (!std::isfinite(g.scale) || !std::isfinite(g.min)) {
    return InvalidInput("values up to " + std::to_string(amax) + " do not fit an f16 group scale");
  }
  return g;
}

QuantGroup QuantGroupFromF16(uint16_t scale_f16, uint16_t min_f16, const ValueSpec& spec) {
  QuantGroup g;
  g.scale_f16 = scale_f16;
  g.scale = F16ToF32(scale_f16);
  if (spec.has_min()) {
    g.min_f16 = min_f16;
    g.min = F16ToF32(min_f16);
  }
  return g;
}

int NearestCode(float v, const QuantGroup& g, const ValueSpec& spec) {
  const bool with_min = spec.has_min();
  const int qmin = MinCode(spec), qmax = MaxCode(spec);
  int q = 0;
  if (g.scale > 0) {
    const float t = with_min ? (v - g.min) / g.scale : v / g.scale;
    // Clamp before converting: a value far off the grid must not overflow the int.
    q = static_cast<int>(std::nearbyint(std::clamp(t, -256.0f, 256.0f))) +
        (spec.dtype == DType::kI4 && !with_min ? 8 : 0);
  } else {
    q = spec.dtype == DType::kI4 && !with_min ? 8 : 0;
  }
  q = std::clamp(q, qmin, qmax);
  // Round to the nearer of the neighbouring codes by the dequantized value itself (the f16 scale
  // and the fma/mul rounding can move a value across a rounding boundary).
  float best = std::fabs(Dequantize(q, g, spec) - v);
  for (int d : {-1, 1}) {
    const int c = q + d;
    if (c < qmin || c > qmax) continue;
    const float e = std::fabs(Dequantize(c, g, spec) - v);
    if (e < best) {
      best = e;
      q = c;
    }
  }
  return q;
}

Result<QuantGroup> QuantizeGroup(const float* v, int64_t count, const ValueSpec& spec,
                                 int8_t* codes) {
  SPARQ_ASSIGN_OR_RETURN(QuantGroup g, FitQuantGroup(v, count, spec));
  for (int64_t i = 0; i < count; ++i) codes[i] = static_cast<int8_t>(NearestCode(v[i], g, spec));
  return g;
}

}  // namespace sparq
