#include "src/model/unicode.h"

#include <algorithm>
#include <array>
#include <cstdio>

namespace sparq::unicode {
namespace {

std::array<uint8_t, 128> MakeAsciiFlags() {
  std::array<uint8_t, 128> t{};
  for (int i = 0; i < kNumCodepointRanges && kCodepointRanges[i].first < 128; ++i) {
    const CodepointRange& r = kCodepointRanges[i];
    for (uint32_t c = r.first; c <= r.last && c < 128; ++c) t[c] = r.flags;
  }
  return t;
}

}  // namespace

uint8_t Flags(uint32_t cp) {
  static const std::array<uint8_t, 128> ascii = MakeAsciiFlags();
  if (cp < 128) return ascii[cp];
  const CodepointRange* end = kCodepointRanges + kNumCodepointRanges;
  // First range whose `last` is >= cp.
  const CodepointRange* it = std::lower_bound(
      kCodepointRanges, end, cp, [](const CodepointRange& r, uint32_t c) { return r.last < c; });
  return (it != end && it->first <= cp) ? it->flags : 0;
}

Status DecodeUtf8(std::string_view s, const std::string& what, std::vector<uint32_t>* cps,
                  std::vector<size_t>* offsets) {
  cps->clear();
  offsets->clear();
  cps->reserve(s.size());
  offsets->reserve(s.size() + 1);
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const uint8_t b0 = p[i];
    uint32_t cp = 0;
    int len = 0;
    uint32_t min = 0;
    if (b0 < 0x80) {
      cp = b0, len = 1;
    } else if ((b0 & 0xE0) == 0xC0) {
      cp = b0 & 0x1F, len = 2, min = 0x80;
    } else if ((b0 & 0xF0) == 0xE0) {
      cp = b0 & 0x0F, len = 3, min = 0x800;
    } else if ((b0 & 0xF8) == 0xF0) {
      cp = b0 & 0x07, len = 4, min = 0x10000;
    }
    bool ok = len > 0 && i + len <= n;
    for (int j = 1; ok && j < len; ++j) {
      if ((p[i + j] & 0xC0) != 0x80) ok = false;
      cp = (cp << 6) | (p[i + j] & 0x3F);
    }
    if (ok && len > 1 && (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))) ok = false;
    if (!ok) {
      char buf[64];
      std::snprintf(buf, sizeof(buf), "invalid UTF-8 at byte %zu (0x%02X)", i, b0);
      return InvalidInput(what + ": " + buf);
    }
    cps->push_back(cp);
    offsets->push_back(i);
    i += len;
  }
  offsets->push_back(n);
  return Status::Ok();
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace sparq::unicode
