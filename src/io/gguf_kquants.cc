// K-quant dequantization. Super-block layouts (256 elements each) as ggml's ggml-common.h
// defines them; byte offsets within one super-block:
//   Q2_K  84 B: scales[16] (lo nibble: scale, hi nibble: min, one per 16 elements), qs[64]
//               (2-bit), d f16 @80, dmin f16 @82.      x = (d * sc) * q - (dmin * m)
//   Q3_K 110 B: hmask[32] (3rd bit), qs[64] (2-bit), scales[12] (16 x 6-bit, stored as low
//               nibbles in bytes 0..7 and 2-bit tops in bytes 8..11), d f16 @108.
//                                                      x = (d * (s - 32)) * (q - (hbit ? 0 : 4))
//   Q4_K 144 B: d f16 @0, dmin f16 @2, scales[12] (8 x 6-bit scale + 8 x 6-bit min, one pair per
//               32 elements), qs[128] (4-bit).          x = (d * sc) * q - (dmin * m)
//   Q5_K 176 B: as Q4_K, then qh[32] (5th bit) before qs[128].
//   Q6_K 210 B: ql[128] (low 4 bits), qh[64] (top 2 bits), scales[16] int8 (one per 16
//               elements), d f16 @208.                  x = (d * sc) * (q - 32)
// Bit placement: element e of a 128-element half h sits at byte 32h + e % 32 of the 2-bit planes
// (Q2_K/Q3_K qs, Q6_K qh), in bit pair e / 32 % 4; the nibble planes pair sub-block 2p (low) with
// 2p + 1 (high). The f32 products and differences are done in the order shown, as ggml's
// dequantize_row_* and the gguf Python package do, so results agree bit for bit.
#include "src/io/gguf_kquants.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "sparq/dtype.h"

namespace sparq::io {

namespace {

uint16_t LoadU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);  // little-endian host assumed, as for the rest of the reader
  return v;
}

// The 6-bit (scale, min) pair of sub-block j (0..7) of a Q4_K / Q5_K scales[12]: pairs 0..3 are
// the low 6 bits of bytes 0..3 / 4..7; pairs 4..7 take a nibble of bytes 8..11 plus the spare
// top 2 bits of bytes 0..3 / 4..7.
void ScaleMinK4(const uint8_t* s, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// The 2-bit field of element e (0..255) in a 64-byte 2-bit plane (see the header comment).
int Bits2(const uint8_t* plane, int e) {
  return (plane[32 * (e / 128) + e % 32] >> (2 * (e / 32 % 4))) & 3;
}

void Q2K(const uint8_t* b, float d, float dmin, float* y) {
  const uint8_t* scales = b;
  const uint8_t* qs = b + 16;
  for (int g = 0; g < 16; ++g) {  // 16 groups of 16 elements
    const float dl = d * static_cast<float>(scales[g] & 15);
    const float ml = dmin * static_cast<float>(scales[g] >> 4);
    for (int e = 16 * g; e < 16 * g + 16; ++e) y[e] = dl * static_cast<float>(Bits2(qs, e)) - ml;
  }
}

void Q3K(const uint8_t* b, float d, float* y) {
  const uint8_t* hmask = b;
  const uint8_t* qs = b + 32;
  const uint8_t* s = b + 96;
  for (int g = 0; g < 16; ++g) {
    const int lo = g < 8 ? s[g] & 15 : s[g - 8] >> 4;
    const int hi = (s[8 + g % 4] >> (2 * (g / 4))) & 3;
    const float dl = d * static_cast<float>((lo | (hi << 4)) - 32);
    for (int e = 16 * g; e < 16 * g + 16; ++e) {
      const bool high = (hmask[e % 32] >> (e / 32)) & 1;  // set bit: no -4 offset
      y[e] = dl * static_cast<float>(Bits2(qs, e) - (high ? 0 : 4));
    }
  }
}

// Q4_K (qh == nullptr) and Q5_K: 8 sub-blocks of 32, nibble planes as described above.
void Q45K(const uint8_t* scales, const uint8_t* qh, const uint8_t* qs, float d, float dmin,
          float* y) {
  for (int j = 0; j < 8; ++j) {
    int sc, m;
    ScaleMinK4(scales, j, &sc, &m);
    const float dl = d * static_cast<float>(sc);
    const float ml = dmin * static_cast<float>(m);
    const uint8_t* q = qs + 32 * (j / 2);
    const int shift = 4 * (j % 2);
    for (int l = 0; l < 32; ++l) {
      int v = (q[l] >> shift) & 15;
      if (qh) v |= ((qh[l] >> j) & 1) << 4;
      y[32 * j + l] = dl * static_cast<float>(v) - ml;
    }
  }
}

void Q6K(const uint8_t* b, float d, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const auto* scales = reinterpret_cast<const int8_t*>(b + 192);
  for (int g = 0; g < 16; ++g) {
    const float dl = d * static_cast<float>(scales[g]);
    for (int e = 16 * g; e < 16 * g + 16; ++e) {
      const int k = e / 32 % 4;  // which quarter of the half: picks the ql row and nibble
      const int lo = (ql[64 * (e / 128) + 32 * (k % 2) + e % 32] >> (4 * (k / 2))) & 15;
      y[e] = dl * static_cast<float>((lo | (Bits2(qh, e) << 4)) - 32);
    }
  }
}

struct KLayout {
  int64_t bytes;
  int d_at;     // byte offset of the f16 scale d
  int dmin_at;  // byte offset of the f16 min scale, -1 if the type has none
};

KLayout LayoutOf(GgmlType type) {
  switch (type) {
    case GgmlType::kQ2_K:
      return {84, 80, 82};
    case GgmlType::kQ3_K:
      return {110, 108, -1};
    case GgmlType::kQ4_K:
      return {144, 0, 2};
    case GgmlType::kQ5_K:
      return {176, 0, 2};
    default:
      return {210, 208, -1};  // Q6_K
  }
}

}  // namespace

bool IsKQuant(GgmlType type) {
  switch (type) {
    case GgmlType::kQ2_K:
    case GgmlType::kQ3_K:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
      return true;
    default:
      return false;
  }
}

Status DequantizeKQuant(GgmlType type, const uint8_t* src, int64_t blocks, float* dst) {
  const KLayout lay = LayoutOf(type);
  for (int64_t i = 0; i < blocks; ++i) {
    const uint8_t* b = src + i * lay.bytes;
    float* y = dst + i * kQK_K;
    const uint16_t dh = LoadU16(b + lay.d_at);
    const uint16_t mh = lay.dmin_at >= 0 ? LoadU16(b + lay.dmin_at) : 0;
    const float d = F16ToF32(dh);
    const float dmin = F16ToF32(mh);
    if (!std::isfinite(d) || !std::isfinite(dmin)) {
      const bool bad_d = !std::isfinite(d);
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%04x", bad_d ? dh : mh);
      return InvalidInput("super-block " + std::to_string(i) + ": f16 " +
                          (bad_d ? "scale d" : "min scale dmin") + " = " + hex + " is not finite");
    }
    switch (type) {
      case GgmlType::kQ2_K:
        Q2K(b, d, dmin, y);
        break;
      case GgmlType::kQ3_K:
        Q3K(b, d, y);
        break;
      case GgmlType::kQ4_K:
        Q45K(b + 4, nullptr, b + 16, d, dmin, y);
        break;
      case GgmlType::kQ5_K:
        Q45K(b + 4, b + 16, b + 48, d, dmin, y);
        break;
      default:
        Q6K(b, d, y);
        break;
    }
  }
  return Status::Ok();
}

}  // namespace sparq::io
