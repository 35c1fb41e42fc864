// Standalone measurement program (not part of the build): 2:4 int4:g64 (with min) decode, n = 1,
// AVX-512 VNNI/VBMI; docs/measurements/xeon-int4-vnni-decode-prototype-2026-12-05.md has its results.
// (A) f32 path as sparq's NmDecodeRows<2, kValI4, perm, R=4, T=1>: dequantize codes to f32, vpermt2ps X window, FMA.
// (B) integer path: x -> int8 per 64 columns, vpermt2b select by 2-bit indices (vpmultishiftqb expand), vpdpbusd.
// Same weight layout as sparq's NmWeight for both: per chunk of 16 kept values one u32 of 2-bit
// indices and 8 bytes of codes (byte b: value b low nibble, value b+8 high nibble); f32 (f16-valued)
// scale and min per group of 64 kept values. Build: g++ -O2 -march=native -std=c++20
// bench/proto/int4_nm24_vnni_decode.cc -o proto; run ./proto [reps].
#include <immintrin.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

static float RoundF16(float v) { return _cvtsh_ss(_cvtss_sh(v, 0)); }
static float RoundF16Up(float v) {
  float r = RoundF16(v);
  if (r < v) { uint16_t h = _cvtss_sh(v, 0); r = _cvtsh_ss(h + 1); }
  return r;
}
static float RoundF16Down(float v) {
  float r = RoundF16(v);
  if (r > v) { uint16_t h = _cvtss_sh(v, 0); r = _cvtsh_ss(v >= 0 ? h - 1 : h + 1); if (r > v) r = v; }
  return r;
}

struct W24 {
  int rows, k;            // dense columns (multiple of 64)
  int chunks;             // real chunks per row (k / 32)
  int groups;             // groups per row, the last may be short (k / 128 rounded up)
  int cstride;            // chunk slots per row (groups * 4): padded with zero codes / index 0
  std::vector<uint8_t> codes;    // [rows, cstride * 8]
  std::vector<uint32_t> meta;    // [rows, cstride]
  std::vector<float> scales, mins;  // [rows, groups]
  std::vector<float> deq;        // dense dequantized [rows, k] (reference)
  std::vector<uint8_t> bidx;     // variant B2 only: [rows, groups, 64] vpermb byte index per kept weight
};

static W24 MakeW(int rows, int k, std::mt19937& rng) {
  W24 w;
  w.rows = rows; w.k = k; w.chunks = k / 32; w.groups = (k / 2 + 63) / 64; w.cstride = w.groups * 4;
  w.codes.assign((size_t)rows * w.cstride * 8, 0);
  w.meta.assign((size_t)rows * w.cstride, 0);
  w.scales.assign((size_t)rows * w.groups, 0);
  w.mins.assign((size_t)rows * w.groups, 0);
  w.deq.assign((size_t)rows * k, 0.f);
  std::normal_distribution<float> nd(0.f, 0.02f);
  std::uniform_int_distribution<int> pick(0, 5);
  static const int pairs[6][2] = {{0,1},{0,2},{0,3},{1,2},{1,3},{2,3}};
  std::vector<float> kv(k / 2);
  std::vector<int> kidx(k / 2);
  for (int r = 0; r < rows; ++r) {
    for (int g4 = 0; g4 < k / 4; ++g4) {
      const int p = pick(rng);
      for (int t = 0; t < 2; ++t) { kidx[2 * g4 + t] = pairs[p][t]; kv[2 * g4 + t] = nd(rng); }
    }
    for (int g = 0; g < w.groups; ++g) {
      const int j0 = g * 64, j1 = std::min(k / 2, j0 + 64);
      float lo = kv[j0], hi = kv[j0];
      for (int j = j0; j < j1; ++j) { lo = std::min(lo, kv[j]); hi = std::max(hi, kv[j]); }
      const float mn = RoundF16Down(lo);
      float sc = RoundF16Up((hi - mn) / 15.f);
      if (sc == 0) sc = RoundF16Up(1e-6f);
      w.scales[(size_t)r * w.groups + g] = sc; w.mins[(size_t)r * w.groups + g] = mn;
      for (int j = j0; j < j1; ++j) {
        int q = (int)std::nearbyint((kv[j] - mn) / sc);
        q = std::clamp(q, 0, 15);
        const int c = j / 16, l = j % 16;
        uint8_t& byte = w.codes[((size_t)r * w.cstride + c) * 8 + (l % 8)];
        byte |= (uint8_t)(q << (l >= 8 ? 4 : 0));
        w.meta[(size_t)r * w.cstride + c] |= (uint32_t)kidx[j] << (2 * l);
        const int col = (j / 2) * 4 + kidx[j];
        w.deq[(size_t)r * k + col] = __builtin_fmaf((float)q, sc, mn);
      }
    }
  }
  // B2's byte indices, in BTab's byte order (byte p: kept value j(p) of the group)
  w.bidx.assign((size_t)rows * w.groups * 64, 0);
  for (int r = 0; r < rows; ++r)
    for (int g = 0; g < w.groups; ++g)
      for (int p = 0; p < 64; ++p) {
        const int j = p < 32 ? 16 * (p / 8) + p % 8 : 16 * ((p - 32) / 8) + 8 + p % 8;
        const int c = 4 * g + j / 16, l = j % 16;
        const int idx = (w.meta[(size_t)r * w.cstride + c] >> (2 * l)) & 3;
        w.bidx[((size_t)r * w.groups + g) * 64 + p] = (uint8_t)(4 * (j / 2) + idx);
      }
  return w;
}

// ---------------- (A) f32 path ----------------
struct ATab {
  __m512i pbase, shift;
  ATab() {
    alignas(64) int32_t pb[16], sh[16];
    for (int j = 0; j < 16; ++j) { pb[j] = (j / 2) * 4; sh[j] = 2 * j; }
    pbase = _mm512_load_si512(pb); shift = _mm512_load_si512(sh);
  }
};
static inline __m512 NibblesF(const uint8_t* p) {
  uint64_t b; std::memcpy(&b, p, 8);
  const __m512i w = _mm512_cvtepu8_epi32(_mm_set1_epi64x((long long)b));
  const __m512i sh = _mm512_set_epi32(4,4,4,4,4,4,4,4,0,0,0,0,0,0,0,0);
  return _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srlv_epi32(w, sh), _mm512_set1_epi32(15)));
}
template <int R>
static inline void ARows(const W24& w, const ATab& t, const float* x, int r, float* y) {
  __m512 acc[R];
  for (int q = 0; q < R; ++q) acc[q] = _mm512_setzero_ps();
  const __m512i three = _mm512_set1_epi32(3);
  for (int c = 0; c < w.chunks; ++c) {
    const __m512 lo = _mm512_loadu_ps(x + 32 * c), hi = _mm512_loadu_ps(x + 32 * c + 16);
    const int g = c >> 2;
#pragma GCC unroll 4
    for (int q = 0; q < R; ++q) {
      const size_t rr = (size_t)(r + q);
      const __m512i sw = _mm512_srlv_epi32(_mm512_set1_epi32((int)w.meta[rr * w.cstride + c]), t.shift);
      const __m512i idx = _mm512_ternarylogic_epi32(sw, three, t.pbase, 0xEA);  // (sw & 3) | pbase
      const __m512 xv = _mm512_permutex2var_ps(lo, idx, hi);
      const __m512 v = _mm512_fmadd_ps(NibblesF(&w.codes[(rr * w.cstride + c) * 8]),
                                       _mm512_set1_ps(w.scales[rr * w.groups + g]),
                                       _mm512_set1_ps(w.mins[rr * w.groups + g]));
      acc[q] = _mm512_fmadd_ps(v, xv, acc[q]);
    }
  }
  for (int q = 0; q < R; ++q) y[r + q] = _mm512_reduce_add_ps(acc[q]);
}
__attribute__((noinline)) static void DecodeA(const W24& w, const float* xpad, float* y) {
  const ATab t;
  int r = 0;
  for (; r + 4 <= w.rows; r += 4) ARows<4>(w, t, xpad, r, y);
  for (; r < w.rows; ++r) ARows<1>(w, t, xpad, r, y);
}

// ---------------- (B) int8 x, vpdpbusd ----------------
struct BTab {
  __m512i base, ctrl, didx;
  BTab() {
    alignas(64) uint8_t b[64], c[64];
    alignas(64) int32_t d[16];
    for (int p = 0; p < 64; ++p) {
      const int j = p < 32 ? 16 * (p / 8) + p % 8 : 16 * ((p - 32) / 8) + 8 + p % 8;  // kept value of byte p
      b[p] = (uint8_t)(4 * (j / 2));          // its 4-column group within the 128 columns
      c[p] = (uint8_t)((p < 32 ? 0 : 16) + 2 * (p % 8));  // bit offset of its index in its qword
    }
    for (int i = 0; i < 16; ++i) d[i] = (i / 2) % 4;  // qword Q holds chunk Q%4's index word
    base = _mm512_load_si512(b); ctrl = _mm512_load_si512(c); didx = _mm512_load_si512(d);
  }
};
struct XQ {  // x as int8 per 64 columns; per 128-column group the lane scales of the dpbusd sums
  std::vector<int8_t> q;    // [groups * 128]
  std::vector<float> sv;    // [groups * 16]
};
static int g_xblock = 64;  // columns per x scale: 32, 64 or 128
static void QuantizeXBlock(const float* xpad, int groups, XQ& xq, int blk);
__attribute__((noinline)) static void QuantizeX(const float* xpad, int groups, XQ& xq) {
  if (g_xblock != 64) { QuantizeXBlock(xpad, groups, xq, g_xblock); return; }
  for (int b = 0; b < 2 * groups; ++b) {
    const __m512 a0 = _mm512_loadu_ps(xpad + 64 * b), a1 = _mm512_loadu_ps(xpad + 64 * b + 16);
    const __m512 a2 = _mm512_loadu_ps(xpad + 64 * b + 32), a3 = _mm512_loadu_ps(xpad + 64 * b + 48);
    const __m512 m = _mm512_max_ps(_mm512_max_ps(_mm512_abs_ps(a0), _mm512_abs_ps(a1)),
                                   _mm512_max_ps(_mm512_abs_ps(a2), _mm512_abs_ps(a3)));
    const float amax = _mm512_reduce_max_ps(m);
    const float s = amax / 127.f, inv = amax > 0 ? 127.f / amax : 0.f;
    const __m512 vi = _mm512_set1_ps(inv);
    const __m512 as[4] = {a0, a1, a2, a3};
    for (int i = 0; i < 4; ++i) {
      const __m512i qi = _mm512_cvtps_epi32(_mm512_mul_ps(as[i], vi));  // round to nearest even
      _mm_storeu_si128((__m128i*)&xq.q[64 * b + 16 * i], _mm512_cvtsepi32_epi8(qi));
    }
    // dpbusd lanes 0-3 and 8-11 sum bytes of kept values in columns [0, 64), 4-7 and 12-15 [64, 128)
    float* sv = &xq.sv[16 * (b / 2)];
    for (int l = 0; l < 16; ++l) if (((l / 4) & 1) == (b & 1)) sv[l] = s;
  }
}
// Scalar version for x blocks of 32 or 128 columns (accuracy runs only). dpbusd lane l sums bytes
// 4l..4l+3 = kept values of chunk (l / 2) % 4, i.e. dense columns [32 * ((l / 2) % 4), +32).
static void QuantizeXBlock(const float* xpad, int groups, XQ& xq, int blk) {
  for (int g = 0; g < groups; ++g) {
    float s[4];
    for (int b0 = 0; b0 < 128; b0 += blk) {
      float amax = 0;
      for (int c = 0; c < blk; ++c) amax = std::max(amax, std::fabs(xpad[128 * g + b0 + c]));
      const float sc = amax / 127.f, inv = amax > 0 ? 127.f / amax : 0.f;
      for (int c = 0; c < blk; ++c)
        xq.q[128 * g + b0 + c] = (int8_t)std::clamp((int)std::nearbyint(xpad[128 * g + b0 + c] * inv), -127, 127);
      for (int c = b0 / 32; c < (b0 + blk) / 32; ++c) s[c] = sc;
    }
    for (int l = 0; l < 16; ++l) xq.sv[16 * g + l] = s[(l / 2) % 4];
  }
}
template <int R, bool kInsert, bool kPre>
static inline void BRows(const W24& w, const BTab& t, const XQ& xq, int r, float* y) {
  __m512 acc[R];
  for (int q = 0; q < R; ++q) acc[q] = _mm512_setzero_ps();
  const __m512i three = _mm512_set1_epi8(3), nib = _mm512_set1_epi8(15), ones = _mm512_set1_epi8(1);
  const __m256i nib256 = _mm256_set1_epi8(15);
  const __m512i sh16 = _mm512_set_epi64(0x0004000400040004LL, 0x0004000400040004LL, 0x0004000400040004LL, 0x0004000400040004LL, 0, 0, 0, 0);
  for (int g = 0; g < w.groups; ++g) {
    const __m512i xlo = _mm512_loadu_si512(&xq.q[128 * g]), xhi = _mm512_loadu_si512(&xq.q[128 * g + 64]);
    const __m512 sxv = _mm512_loadu_ps(&xq.sv[16 * g]);
#pragma GCC unroll 4
    for (int q = 0; q < R; ++q) {
      const size_t rr = (size_t)(r + q);
      // 64 2-bit indices (4 u32 words) -> byte indices into the 128 int8 x values
      __m512i bidx;
      if constexpr (kPre) {  // byte indices precomputed at pack time (1 byte per kept weight)
        bidx = _mm512_loadu_si512(&w.bidx[(rr * w.groups + g) * 64]);
      } else {
        const __m128i m = _mm_loadu_si128((const __m128i*)&w.meta[rr * w.cstride + 4 * g]);
        const __m512i src = _mm512_permutexvar_epi32(t.didx, _mm512_castsi128_si512(m));
        const __m512i fld = _mm512_multishift_epi64_epi8(t.ctrl, src);
        bidx = _mm512_ternarylogic_epi32(fld, three, t.base, 0xEA);  // (fld & 3) | base
      }
      const __m512i xs = _mm512_permutex2var_epi8(xlo, bidx, xhi);
      // 32 code bytes -> 64 u8 codes: low nibbles then high nibbles (the byte order bidx follows)
      __m512i codes;
      if constexpr (kInsert) {
        const __m256i cb = _mm256_loadu_si256((const __m256i*)&w.codes[(rr * w.cstride + 4 * g) * 8]);
        codes = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(cb, nib256)),
                                   _mm256_and_si256(_mm256_srli_epi16(cb, 4), nib256), 1);
      } else {  // the 32 bytes in both halves, the upper half shifted right by 4 (vpsrlvw), & 15
        const __m512i cb = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i*)&w.codes[(rr * w.cstride + 4 * g) * 8]));
        codes = _mm512_and_si512(_mm512_srlv_epi16(cb, sh16), nib);
      }
      const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), codes, xs);
      const __m512i sx = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, xs);
      const __m512 tt = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_set1_ps(w.scales[rr * w.groups + g]),
                                        _mm512_mul_ps(_mm512_cvtepi32_ps(sx), _mm512_set1_ps(w.mins[rr * w.groups + g])));
      acc[q] = _mm512_fmadd_ps(tt, sxv, acc[q]);
    }
  }
  (void)nib;
  for (int q = 0; q < R; ++q) y[r + q] = _mm512_reduce_add_ps(acc[q]);
}
template <bool kInsert, bool kPre>
__attribute__((noinline)) static void DecodeBCore(const W24& w, const XQ& xq, float* y) {
  const BTab t;
  int r = 0;
  for (; r + 4 <= w.rows; r += 4) BRows<4, kInsert, kPre>(w, t, xq, r, y);
  for (; r < w.rows; ++r) BRows<1, kInsert, kPre>(w, t, xq, r, y);
}
// v 0: as first written (vinserti64x4 code unpack); 1: broadcast + vpsrlvw unpack; 2: 1 + precomputed byte indices
static void DecodeB(const W24& w, const float* xpad, XQ& xq, float* y, int v = 1) {
  QuantizeX(xpad, w.groups, xq);
  if (v == 0) DecodeBCore<true, false>(w, xq, y);
  else if (v == 1) DecodeBCore<false, false>(w, xq, y);
  else DecodeBCore<false, true>(w, xq, y);
}

// ---------------- harness ----------------
static double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
struct Err { double norm_rel, max_rel_abs_scaled, max_rel_ref; };
static Err Compare(const W24& w, const std::vector<float>& x, const float* y) {
  double e2 = 0, r2 = 0, worst_scaled = 0, maxref = 0, maxerr = 0;
  for (int r = 0; r < w.rows; ++r) {
    double ref = 0, mag = 0;
    for (int c = 0; c < w.k; ++c) {
      const double p = (double)w.deq[(size_t)r * w.k + c] * x[c];
      ref += p; mag += std::fabs(p);
    }
    const double e = y[r] - ref;
    e2 += e * e; r2 += ref * ref;
    worst_scaled = std::max(worst_scaled, std::fabs(e) / mag);
    maxref = std::max(maxref, std::fabs(ref)); maxerr = std::max(maxerr, std::fabs(e));
  }
  return {std::sqrt(e2 / r2), worst_scaled, maxerr / maxref};
}
// The test tolerance an int8-x kernel can be held to: per row, sum over x blocks of (x scale / 2)
// * sum |w| over the block's kept weights (round-to-nearest int8 x), plus f32 rounding of the sums
// (4 * 2^-24 * (number of terms per lane + log2 16 + group count) * sum |w x|, a loose bound). Returns max |e| / bound.
static double MaxErrOverBound(const W24& w, const std::vector<float>& x, const float* y, int blk) {
  double worst = 0;
  const int nb = (w.k + blk - 1) / blk;
  std::vector<double> sx(nb);
  for (int b = 0; b < nb; ++b) {
    float amax = 0;
    for (int c = b * blk; c < std::min(w.k, (b + 1) * blk); ++c) amax = std::max(amax, std::fabs(x[c]));
    sx[b] = amax / 127.0;
  }
  for (int r = 0; r < w.rows; ++r) {
    double ref = 0, mag = 0, bound = 0;
    for (int c = 0; c < w.k; ++c) {
      const double wv = w.deq[(size_t)r * w.k + c];
      ref += wv * x[c]; mag += std::fabs(wv * x[c]);
      bound += std::fabs(wv) * sx[c / blk] * 0.5;
    }
    bound += 4 * std::ldexp(1.0, -24) * (16 + 4 + w.groups) * (mag + bound);
    worst = std::max(worst, std::fabs(y[r] - ref) / bound);
  }
  return worst;
}
static double Median(std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }

int main(int argc, char** argv) {
  const int reps = argc > 1 ? atoi(argv[1]) : 61;
  const int shapes[4][2] = {{576, 576}, {1536, 576}, {576, 1536}, {4096, 4096}};
  std::mt19937 rng(1234);
  const char* vname[4] = {"A", "B0", "B1", "B2"};
  for (auto& s : shapes) {
    const int rows = s[0], k = s[1];
    W24 w = MakeW(rows, k, rng);
    const int kpad = w.groups * 128;
    std::vector<float> x(k), xpad(kpad + 64, 0.f), yA(rows), yB(rows), yB2(rows);
    XQ xq; xq.q.assign((size_t)kpad, 0); xq.sv.assign((size_t)w.groups * 16, 0.f);
    const double wbytes = (double)rows * (w.cstride * 8 + w.cstride * 4 + w.groups * 4);  // codes + meta + f16 scale/min
    const double bbytes = (double)rows * w.groups * 64;
    printf("== %dx%d: kept %d, stream bytes (codes+meta+f16 params) %.0f KiB (%.3f B/kept), B2 adds %.0f KiB (1 B/kept)\n",
           rows, k, rows * k / 2, wbytes / 1024, wbytes / (rows * (double)k / 2), bbytes / 1024);
    for (int kind = 0; kind < 3; ++kind) {
      std::normal_distribution<float> nd(0.f, 1.f);
      for (int c = 0; c < k; ++c) x[c] = nd(rng);
      const char* name = "gauss";
      if (kind == 1) {
        name = "gauss+4 outliers ~40";
        for (int i = 0; i < 4; ++i) x[rng() % k] = (rng() & 1 ? 40.f : -40.f) * (1 + 0.1f * nd(rng));
      } else if (kind == 2) {
        name = "gauss+1% outliers 100";
        for (int i = 0; i < std::max(1, k / 100); ++i) x[rng() % k] = (rng() & 1 ? 100.f : -100.f);
      }
      std::copy(x.begin(), x.end(), xpad.begin());
      DecodeA(w, xpad.data(), yA.data());
      int same = 1;
      for (int v = 0; v < 3; ++v) {
        DecodeB(w, xpad.data(), xq, v == 0 ? yB.data() : yB2.data(), v);
        if (v) same &= std::memcmp(yB.data(), yB2.data(), rows * 4) == 0;
      }
      const Err ea = Compare(w, x, yA.data()), eb = Compare(w, x, yB.data());
      Err ebk[2];
      for (int bi = 0; bi < 2; ++bi) {
        g_xblock = bi == 0 ? 32 : 128;
        DecodeB(w, xpad.data(), xq, yB2.data(), 1);
        ebk[bi] = Compare(w, x, yB2.data());
        g_xblock = 64;
      }
      printf("  accB xblock32: l2rel %.2e max|e|/sum|wx| %.2e max|e|/max|ref| %.2e | xblock128: l2rel %.2e max|e|/sum|wx| %.2e max|e|/max|ref| %.2e\n",
             ebk[0].norm_rel, ebk[0].max_rel_abs_scaled, ebk[0].max_rel_ref, ebk[1].norm_rel, ebk[1].max_rel_abs_scaled, ebk[1].max_rel_ref);
      printf("  accB xblock64 max|e|/tolerance bound %.3f\n", MaxErrOverBound(w, x, yB.data(), 64));
      printf("  acc %-22s A: l2rel %.2e max|e|/sum|wx| %.2e max|e|/max|ref| %.2e | B: l2rel %.2e max|e|/sum|wx| %.2e max|e|/max|ref| %.2e | B0=B1=B2 bitwise %d\n",
             name, ea.norm_rel, ea.max_rel_abs_scaled, ea.max_rel_ref, eb.norm_rel,
             eb.max_rel_abs_scaled, eb.max_rel_ref, same);
    }
    const int inner = std::max(1, (int)(2e6 / ((double)rows * k / 2)));
    auto call = [&](int v) {
      if (v == 0) DecodeA(w, xpad.data(), yA.data());
      else DecodeB(w, xpad.data(), xq, yB.data(), v - 1);
    };
    for (int i = 0; i < 3; ++i) for (int v = 0; v < 4; ++v) call(v);
    std::vector<double> t[4], tq, ratio[4];
    for (int rep = 0; rep < reps; ++rep) {
      double cur[4];
      for (int o = 0; o < 4; ++o) {
        const int v = (o + rep) % 4;  // rotate the order
        const double t0 = Now();
        for (int i = 0; i < inner; ++i) call(v);
        cur[v] = (Now() - t0) / inner;
      }
      const double t0 = Now();
      for (int i = 0; i < inner; ++i) QuantizeX(xpad.data(), w.groups, xq);
      tq.push_back((Now() - t0) / inner);
      for (int v = 0; v < 4; ++v) { t[v].push_back(cur[v]); ratio[v].push_back(cur[0] / cur[v]); }
    }
    const double kept = (double)rows * k / 2;
    printf("  time (reps %d, calls per sample %d): quantize x %.0f ns\n", reps, inner, Median(tq) * 1e9);
    for (int v = 0; v < 4; ++v)
      printf("  TIME %dx%d %-3s median %9.0f ns  %6.2f GFLOP/s  speedup vs A: median-of-ratios %.2f (p25 %.2f, p75 %.2f)\n",
             rows, k, vname[v], Median(t[v]) * 1e9, 2 * kept / Median(t[v]) * 1e-9, Median(ratio[v]),
             [&] { auto r = ratio[v]; std::sort(r.begin(), r.end()); return r[r.size() / 4]; }(),
             [&] { auto r = ratio[v]; std::sort(r.begin(), r.end()); return r[3 * r.size() / 4]; }());
    fflush(stdout);
  }
  return 0;
}
