// Value specs and round-to-nearest group quantization (sparq/quant.h).
#include "sparq/quant.h"

#include <algorithm>
#include <cmath>
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

Result<QuantGroup> QuantizeGroup(const float* v, int64_t count, const ValueSpec& spec,
                                 int8_t* codes) {
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
  const float range = with_min ? hi - g.min : amax;
  g.scale_f16 = F32ToF16(range / steps);
  g.scale = F16ToF32(g.scale_f16);
  if (!std::isfinite(g.scale) || !std::isfinite(g.min)) {
    return InvalidInput("values up to " + std::to_string(amax) + " do not fit an f16 group scale");
  }
  const int qmin = spec.dtype == DType::kI8 ? -127 : with_min ? 0 : 1;
  const int qmax = spec.dtype == DType::kI8 ? 127 : 15;
  for (int64_t i = 0; i < count; ++i) {
    int q = 0;
    if (g.scale > 0) {
      const float t = with_min ? (v[i] - g.min) / g.scale : v[i] / g.scale;
      q = static_cast<int>(std::nearbyint(t)) + (spec.dtype == DType::kI4 && !with_min ? 8 : 0);
    } else {
      q = spec.dtype == DType::kI4 && !with_min ? 8 : 0;
    }
    q = std::clamp(q, qmin, qmax);
    // Round to the nearer of the neighbouring codes by the dequantized value itself (the f16 scale
    // and the fma/mul rounding can move a value across a rounding boundary).
    float best = std::fabs(Dequantize(q, g, spec) - v[i]);
    for (int d : {-1, 1}) {
      const int c = q + d;
      if (c < qmin || c > qmax) continue;
      const float e = std::fabs(Dequantize(c, g, spec) - v[i]);
      if (e < best) {
        best = e;
        q = c;
      }
    }
    codes[i] = static_cast<int8_t>(q);
  }
  return g;
}

}  // namespace sparq
