// Standalone measurement program (not part of the build): what a bit-mask row's per-step expand
// costs on the running CPU. Four rows' 64-column steps, each with its own u64 of mask bits, spread
// 64 bytes to the set bits and feed one vpdpbusd per step (as the int4 mask rows do):
//   vpexpandb / vpcompressb / vpexpandd / vpexpandw / vexpandps with the mask written per step;
//   a masked byte move with the same masks (the floor: a mask register written per step);
//   the expand done as one vpermb on a computed index (the per-byte popcounts' exclusive prefix in
//   a general register, vpopcntb for the bits below each lane), checked against vpexpandb.
// docs/measurements/zen5-mask-expand-2026-12-07.md has its results on a Zen 5.
// Build: g++ -O2 -march=native -std=c++20 bench/proto/mask_expand_bench.cc -o mexp; run ./mexp.
#include <immintrin.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

template <class F>
static double NsPer(F f, long reps, long per) {
  const auto t0 = std::chrono::steady_clock::now();
  f(reps);
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / reps / per;
}

static inline uint64_t ExclBytePrefix(uint64_t m) {
  uint64_t c = m - ((m >> 1) & 0x5555555555555555ull);
  c = (c & 0x3333333333333333ull) + ((c >> 2) & 0x3333333333333333ull);
  c = (c + (c >> 4)) & 0x0F0F0F0F0F0F0F0Full;
  return (c * 0x0101010101010101ull) << 8;
}

int main() {
  constexpr long kSteps = 4096;
  std::vector<uint64_t> masks(kSteps);
  std::mt19937_64 rng(1);
  for (auto& m : masks) m = rng();  // ~50% of the bits set, as a 50% layer's
  const uint64_t* mp = masks.data();
  alignas(64) uint8_t spread[64], below[64], iota[64];
  for (int i = 0; i < 64; ++i) {
    spread[i] = static_cast<uint8_t>(i / 8 % 8);
    below[i] = static_cast<uint8_t>((1u << (i % 8)) - 1);
    iota[i] = static_cast<uint8_t>(i);
  }
  const __m512i vspread = _mm512_load_si512(spread), vbelow = _mm512_load_si512(below);
  const __m512i v = _mm512_load_si512(iota), x = _mm512_set1_epi8(5);
  auto prefix_expand = [&](uint64_t m) {
    const __m512i local = _mm512_popcnt_epi8(_mm512_and_si512(
        _mm512_shuffle_epi8(_mm512_set1_epi64(static_cast<int64_t>(m)), vspread), vbelow));
    const __m512i idx = _mm512_add_epi8(
        local, _mm512_shuffle_epi8(_mm512_set1_epi64(static_cast<int64_t>(ExclBytePrefix(m))), vspread));
    return _mm512_maskz_permutexvar_epi8(_cvtu64_mask64(m), idx, v);
  };
  for (long s = 0; s < kSteps; ++s) {
    const __m512i a = _mm512_maskz_expand_epi8(_cvtu64_mask64(mp[s]), v), b = prefix_expand(mp[s]);
    if (_mm512_cmpneq_epi8_mask(a, b) != 0) {
      std::printf("prefix expand differs from vpexpandb at step %ld\n", s);
      return 1;
    }
  }
  constexpr long kReps = 20000;
#define SPARQ_STEPS(OP)                                                                         \
  [&](long reps) {                                                                              \
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;                             \
    for (long r = 0; r < reps; ++r) {                                                           \
      for (long s = 0; s < kSteps; s += 4) {                                                    \
        a0 = _mm512_dpbusd_epi32(a0, OP(mp[s]), x);                                             \
        a1 = _mm512_dpbusd_epi32(a1, OP(mp[s + 1]), x);                                         \
        a2 = _mm512_dpbusd_epi32(a2, OP(mp[s + 2]), x);                                         \
        a3 = _mm512_dpbusd_epi32(a3, OP(mp[s + 3]), x);                                         \
      }                                                                                         \
    }                                                                                           \
    asm volatile("" ::"v"(a0), "v"(a1), "v"(a2), "v"(a3));                                     \
  }
#define EXPB(m) _mm512_maskz_expand_epi8(_cvtu64_mask64(m), v)
#define CMPB(m) _mm512_maskz_compress_epi8(_cvtu64_mask64(m), v)
#define EXPD(m) _mm512_maskz_expand_epi32(static_cast<__mmask16>(m), v)
#define EXPW(m) _mm512_maskz_expand_epi16(static_cast<__mmask32>(m), v)
#define EXPPS(m) \
  _mm512_castps_si512(_mm512_maskz_expand_ps(static_cast<__mmask16>(m), _mm512_castsi512_ps(v)))
#define MOVB(m) _mm512_maskz_mov_epi8(_cvtu64_mask64(m), v)
#define PREF(m) prefix_expand(m)
#define EXPB_FIXED(m) _mm512_maskz_expand_epi8(_cvtu64_mask64(0x5555555555555555ull), v)
  std::printf("ns per 64-column step (4 rows in flight, one vpdpbusd each):\n");
  std::printf("  vpexpandb, mask per step      %.3f\n", NsPer(SPARQ_STEPS(EXPB), kReps, kSteps));
  std::printf("  vpcompressb, mask per step    %.3f\n", NsPer(SPARQ_STEPS(CMPB), kReps, kSteps));
  std::printf("  vpexpandd, mask per step      %.3f\n", NsPer(SPARQ_STEPS(EXPD), kReps, kSteps));
  std::printf("  vpexpandw, mask per step      %.3f\n", NsPer(SPARQ_STEPS(EXPW), kReps, kSteps));
  std::printf("  vexpandps, mask per step      %.3f\n", NsPer(SPARQ_STEPS(EXPPS), kReps, kSteps));
  std::printf("  vpexpandb, one constant mask  %.3f\n", NsPer(SPARQ_STEPS(EXPB_FIXED), kReps, kSteps));
  std::printf("  masked byte move (the floor)  %.3f\n", NsPer(SPARQ_STEPS(MOVB), kReps, kSteps));
  std::printf("  prefix index + vpermb         %.3f\n", NsPer(SPARQ_STEPS(PREF), kReps, kSteps));
  return 0;
}
