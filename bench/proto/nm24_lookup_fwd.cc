// Standalone measurement program (not part of the build): the windowed SDDMM's table-lookup form
// (src/cpu/sddmm.cc) tried on the 2:4 *forward*, Y = X W^T at 4096 x 4096, 512 tokens, one
// thread, against OpenBLAS's dense sgemm in the same process. Lanes are 16 rows of W; per window
// of 16 columns each row keeps 8: 8 slot vectors of values and of in-window column indices (u8).
// Per 8 tokens and window: 8 X vectors, then per slot 8 vpermps + 8 FMAs into the tokens' sums.
// Measured on a Zen 5 (2026-12-07, docs/measurements/zen5-windowed-sddmm-2026-12-07.md): 70 ms
// (47% of the FMA peak on the kept FMAs), 1.06x OpenBLAS's dense, slower than sparq's 2:4 tiled
// row (63.7 ms); indices pre-widened to i32 (no vpmovzxbd): 83 ms. Not a path for the forward.
// Build: g++ -O2 -march=native -std=c++20 nm24_lookup_fwd.cc -lopenblas -o fwd
//        env -u OPENBLAS_CORETYPE ./fwd
#include <cblas.h>
#include <immintrin.h>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>
#include <algorithm>

static double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

int main(int argc, char** argv) {
  const int64_t m = 4096, k = 4096, n = 512;
  const int64_t W = k / 16, RB = m / 16;
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  std::vector<float> w(m * k, 0.0f), x(n * k), y(n * m), yref(n * m);
  for (auto& v : x) v = nd(rng);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t g = 0; g < k; g += 4) {
      int a = rng() % 4, b = rng() % 3; b += b >= a;
      w[r * k + g + a] = nd(rng); w[r * k + g + b] = nd(rng);
    }
  // Pack: [rb][w][s][16] values and u8 indices.
  float* val = static_cast<float*>(std::aligned_alloc(64, RB * W * 8 * 16 * 4));
  uint8_t* idx = static_cast<uint8_t*>(std::aligned_alloc(64, RB * W * 8 * 16));
  for (int64_t rb = 0; rb < RB; ++rb)
    for (int64_t i = 0; i < 16; ++i) {
      const int64_t r = rb * 16 + i;
      for (int64_t ww = 0; ww < W; ++ww) {
        int s = 0;
        for (int c = 0; c < 16; ++c) {
          const float v = w[r * k + ww * 16 + c];
          if (v != 0.0f || ((c % 4) == 3 && s < ((c / 4) + 1) * 2)) {  // keep exactly 2 per group
            if (s >= ((c / 4) + 1) * 2) continue;
            val[((rb * W + ww) * 8 + s) * 16 + i] = v;
            idx[((rb * W + ww) * 8 + s) * 16 + i] = static_cast<uint8_t>(c);
            ++s;
          }
        }
        if (s != 8) { std::printf("pack: row %ld window %ld has %d\n", r, ww, s); return 1; }
      }
    }
  float* xa = static_cast<float*>(std::aligned_alloc(64, n * k * 4));
  std::memcpy(xa, x.data(), n * k * 4);
  const int64_t KB = 64;   // windows per k block: 1024 columns
  const int64_t TG = 64;   // tokens per group: X tile 64 x 1024 x 4 = 256 KiB
  auto run = [&] {
    for (int64_t kb = 0; kb < W; kb += KB) {
      for (int64_t tg = 0; tg < n; tg += TG) {
        for (int64_t rb = 0; rb < RB; ++rb) {
          for (int64_t t0 = tg; t0 < tg + TG; t0 += 8) {
            __m512 acc[8];
            _Pragma("GCC unroll 8") for (int t = 0; t < 8; ++t)
              acc[t] = kb == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(&y[(t0 + t) * m + rb * 16]);
            for (int64_t ww = kb; ww < kb + KB; ++ww) {
              const float* vp = val + (rb * W + ww) * 8 * 16;
              const uint8_t* ip = idx + (rb * W + ww) * 8 * 16;
              __m512 xv[8];
              _Pragma("GCC unroll 8") for (int t = 0; t < 8; ++t) xv[t] = _mm512_load_ps(xa + (t0 + t) * k + ww * 16);
              _Pragma("GCC unroll 8") for (int s = 0; s < 8; ++s) {
                const __m512 wv = _mm512_load_ps(vp + s * 16);
                const __m512i iv = _mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(ip + s * 16)));
                _Pragma("GCC unroll 8") for (int t = 0; t < 8; ++t) acc[t] = _mm512_fmadd_ps(wv, _mm512_permutexvar_ps(iv, xv[t]), acc[t]);
              }
            }
            _Pragma("GCC unroll 8") for (int t = 0; t < 8; ++t) _mm512_storeu_ps(&y[(t0 + t) * m + rb * 16], acc[t]);
          }
        }
      }
    }
  };
  auto dense = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, m, k, 1.0f, x.data(), k, w.data(), k, 0.0f, yref.data(), m);
  };
  openblas_set_num_threads(1);
  dense(); run();
  double worst = 0;
  for (int64_t i = 0; i < n * m; ++i) worst = std::max(worst, (double)std::fabs(y[i] - yref[i]));
  std::printf("max |y - y_dense| = %.3g (OpenBLAS %s)\n", worst, openblas_get_corename());
  for (int rep = 0; rep < 3; ++rep) {
    std::vector<double> ts, td;
    for (int i = 0; i < 5; ++i) {
      double t0 = Now(); run(); ts.push_back(Now() - t0);
      t0 = Now(); dense(); td.push_back(Now() - t0);
    }
    std::sort(ts.begin(), ts.end()); std::sort(td.begin(), td.end());
    const double fl = 2.0 * m * (k / 2) * n;
    std::printf("lookup 2:4 %.2f ms (%.0f GFLOP/s of kept FMAs), OpenBLAS dense %.2f ms: %.2fx\n",
                ts[2] * 1e3, fl / ts[2] * 1e-9, td[2] * 1e3, td[2] / ts[2]);
  }
}
