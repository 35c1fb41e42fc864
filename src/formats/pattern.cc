// Pattern spelling: Parse / ToString / Validate.
#include <charconv>
#include <cmath>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "sparq/pattern.h"

namespace sparq {
namespace {

constexpr std::string_view kSpellings =
    "dense | unstructured:F | unstructured-row:F | rows:F | cols:F | N:M | block:HxW[:F] | "
    "vnm:V:N:M";

// The default fraction of `block:HxW` when none is given.
constexpr double kDefaultBlockFraction = 0.5;

Status SpecError(std::string_view spec, const std::string& why) {
  return InvalidInput("pattern '" + std::string(spec) + "': " + why + " (expected " +
                      std::string(kSpellings) + ")");
}

std::vector<std::string_view> Split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (true) {
    size_t pos = s.find(sep, start);
    if (pos == std::string_view::npos) {
      out.push_back(s.substr(start));
      return out;
    }
    out.push_back(s.substr(start, pos - start));
    start = pos + 1;
  }
}

// A whole decimal integer (no sign, no spaces), at most 9 digits.
bool ParseInt(std::string_view s, int* out) {
  if (s.empty() || s.size() > 9) return false;
  int v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || ptr != s.data() + s.size()) return false;
  *out = v;
  return true;
}

// A fraction in [0, 1], plain decimal or exponent notation; no sign, no spaces.
Status ParseFraction(std::string_view spec, std::string_view s, double* out) {
  double v = 0;
  if (s.empty() || s.front() == '+' || s.front() == '-') {
    return SpecError(spec, "fraction '" + std::string(s) + "' is not a number in [0, 1]");
  }
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || ptr != s.data() + s.size() || !std::isfinite(v)) {
    return SpecError(spec, "fraction '" + std::string(s) + "' is not a number in [0, 1]");
  }
  if (v < 0.0 || v > 1.0) {
    return SpecError(spec, "fraction " + std::string(s) + " is outside [0, 1]");
  }
  *out = v;
  return Status::Ok();
}

// Shortest decimal spelling that parses back to the same double.
std::string FormatFraction(double f) {
  char buf[64];
  auto [ptr, ec] = std::to_chars(buf, buf + sizeof(buf), f);
  if (ec != std::errc()) return std::to_string(f);
  return std::string(buf, ptr);
}

}  // namespace

Result<Pattern> Pattern::Parse(std::string_view spec) {
  if (spec.empty()) return SpecError(spec, "empty pattern");
  const std::vector<std::string_view> parts = Split(spec, ':');
  const std::string_view head = parts[0];
  Pattern p;
  auto need_parts = [&](size_t count, const char* form) -> Status {
    if (parts.size() != count) {
      return SpecError(spec, std::string("expected the form '") + form + "'");
    }
    return Status::Ok();
  };
  if (head == "dense") {
    SPARQ_RETURN_IF_ERROR(need_parts(1, "dense"));
    p = Pattern::Dense();
  } else if (head == "unstructured" || head == "unstructured-row" || head == "rows" ||
             head == "cols") {
    const std::string form = std::string(head) + ":F";
    SPARQ_RETURN_IF_ERROR(need_parts(2, form.c_str()));
    double f = 0;
    SPARQ_RETURN_IF_ERROR(ParseFraction(spec, parts[1], &f));
    if (head == "unstructured") p = Pattern::Unstructured(f, false);
    if (head == "unstructured-row") p = Pattern::Unstructured(f, true);
    if (head == "rows") p = Pattern::Rows(f);
    if (head == "cols") p = Pattern::Cols(f);
  } else if (head == "block") {
    if (parts.size() != 2 && parts.size() != 3) {
      return SpecError(spec, "expected the form 'block:HxW' or 'block:HxW:F'");
    }
    const std::vector<std::string_view> sides = Split(parts[1], 'x');
    int bh = 0, bw = 0;
    if (sides.size() != 2 || !ParseInt(sides[0], &bh) || !ParseInt(sides[1], &bw)) {
      return SpecError(spec, "block shape '" + std::string(parts[1]) +
                                 "' is not HxW with whole numbers");
    }
    double f = kDefaultBlockFraction;
    if (parts.size() == 3) SPARQ_RETURN_IF_ERROR(ParseFraction(spec, parts[2], &f));
    p = Pattern::Block(bh, bw, f);
  } else if (head == "vnm") {
    SPARQ_RETURN_IF_ERROR(need_parts(4, "vnm:V:N:M"));
    int v = 0, n = 0, m = 0;
    if (!ParseInt(parts[1], &v) || !ParseInt(parts[2], &n) || !ParseInt(parts[3], &m)) {
      return SpecError(spec, "V, N and M must be whole numbers");
    }
    p = Pattern::VNM(v, n, m);
  } else {
    int n = 0, m = 0;
    if (!ParseInt(head, &n)) return SpecError(spec, "unknown pattern '" + std::string(head) + "'");
    if (parts.size() != 2) {
      return SpecError(spec, "an N:M pattern has exactly two numbers (use vnm:V:N:M for V:N:M)");
    }
    if (!ParseInt(parts[1], &m)) return SpecError(spec, "M must be a whole number");
    p = Pattern::NM(n, m);
  }
  Status st = p.Validate();
  if (!st.ok()) return SpecError(spec, st.message());
  return p;
}

std::string Pattern::ToString() const {
  switch (kind) {
    case PatternKind::kDense:
      return "dense";
    case PatternKind::kUnstructured:
      return std::string(per_row ? "unstructured-row:" : "unstructured:") + FormatFraction(fraction);
    case PatternKind::kRows:
      return "rows:" + FormatFraction(fraction);
    case PatternKind::kCols:
      return "cols:" + FormatFraction(fraction);
    case PatternKind::kNM:
      return std::to_string(n) + ":" + std::to_string(m);
    case PatternKind::kBlock: {
      // (Appended piecewise: "lit" + std::string&& trips a GCC 12 -Wrestrict false positive.)
      std::string s = "block:";
      s += std::to_string(bh);
      s += 'x';
      s += std::to_string(bw);
      if (fraction != kDefaultBlockFraction) {
        s += ':';
        s += FormatFraction(fraction);
      }
      return s;
    }
    case PatternKind::kVNM:
      return "vnm:" + std::to_string(v) + ":" + std::to_string(n) + ":" + std::to_string(m);
  }
  return "unknown";
}

Status Pattern::Validate() const {
  auto check_fraction = [&]() -> Status {
    if (!(fraction >= 0.0 && fraction <= 1.0)) {
      return InvalidInput("fraction " + FormatFraction(fraction) + " is outside [0, 1]");
    }
    return Status::Ok();
  };
  auto check_nm = [&]() -> Status {
    if (m < 2 || m > 16) {
      return InvalidInput("M = " + std::to_string(m) + " is outside 2..16");
    }
    if (n < 1 || n >= m) {
      return InvalidInput("N = " + std::to_string(n) + " must satisfy 1 <= N < M = " +
                          std::to_string(m));
    }
    return Status::Ok();
  };
  switch (kind) {
    case PatternKind::kDense:
      return Status::Ok();
    case PatternKind::kUnstructured:
    case PatternKind::kRows:
    case PatternKind::kCols:
      return check_fraction();
    case PatternKind::kNM:
      return check_nm();
    case PatternKind::kBlock:
      if (bh < 1 || bh > 64 || bw < 1 || bw > 64) {
        return InvalidInput("block " + std::to_string(bh) + "x" + std::to_string(bw) +
                            ": each side must be in 1..64");
      }
      return check_fraction();
    case PatternKind::kVNM:
      if (v < 2 || v > 64) {
        return InvalidInput("V = " + std::to_string(v) + " is outside 2..64");
      }
      return check_nm();
  }
  return InvalidInput("unknown pattern kind " + std::to_string(static_cast<int>(kind)));
}

}  // namespace sparq
