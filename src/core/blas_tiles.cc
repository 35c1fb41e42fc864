#include "src/core/blas_tiles.h"

#include <cblas.h>

#include <algorithm>
#include <functional>
#include <utility>
#include <vector>

namespace sparq::blas {
namespace {

// Output tile of the gemms: 128 x 512 keeps the repacking that tiling adds (each tile packs its
// own A and B panels: (1/512 + 1/128) / 2 values per flop) to a few percent of the work, and
// still gives a few tiles per thread on the smallest layers served (576 x 576).
constexpr int64_t kGemmTileRows = 128;
constexpr int64_t kGemmTileCols = 512;
// Square tile of X^T X: 256 x 256 x (256 rows of X) is 33 Mflop per task, and k = 576 still
// splits into 6 tasks.
constexpr int64_t kSyrkTile = 256;
// The kernel's C[tokens, outputs]: 256 tokens x 128 outputs keeps the repacking near 1% of the
// work; 64 outputs below 2048 give a 576-wide layer 9 tiles for 2-3 threads.
constexpr int64_t kNTTileRows = 256;
int64_t NTTileCols(int64_t n) { return n >= 2048 ? 128 : 64; }
// C[m, n] = A^T B (a weight gradient dW[outputs, inputs] = dY^T X over a few hundred tokens):
// 128 x 192 tiles, 192 dividing the usual widths (576, 1536, 2304) so no thin tail tile, and a
// 576 x 576 layer still gives 15 tiles for 2-3 threads.
constexpr int64_t kTNTileRows = 128;
constexpr int64_t kTNTileCols = 192;
// sgemv: 64 rows per call (a 192-row layer still splits in 3).
constexpr int64_t kGemvTileRows = 64;

int64_t Tiles(int64_t n, int64_t t) { return (n + t - 1) / t; }

void Run(int64_t tasks, ThreadPool* pool, const std::function<void(int64_t, int)>& fn) {
  if (pool) {
    pool->ParallelFor(tasks, fn);
  } else {
    for (int64_t t = 0; t < tasks; ++t) fn(t, 0);
  }
}

// trans_a: A is [kk, m] (C = A^T ...) instead of [m, kk]; trans_b: B is [n, kk] (row per output
// column of C) instead of [kk, n].
template <typename T, typename Gemm>
void GemmTiled(int64_t m, int64_t n, int64_t kk, T alpha, const T* a, int64_t lda, const T* b,
               int64_t ldb, T beta, T* c, int64_t ldc, ThreadPool* pool, Gemm gemm,
               bool trans_a = false, bool trans_b = false, int64_t tile_rows = kGemmTileRows,
               int64_t tile_cols = kGemmTileCols) {
  if (m <= 0 || n <= 0) return;
  OpenBlasThreads pin(1);
  const int64_t tr = Tiles(m, tile_rows), tc = Tiles(n, tile_cols);
  Run(tr * tc, pool, [&](int64_t t, int) {
    const int64_t r0 = (t / tc) * tile_rows, c0 = (t % tc) * tile_cols;
    const int64_t rn = std::min(tile_rows, m - r0), cn = std::min(tile_cols, n - c0);
    gemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
         static_cast<int>(rn), static_cast<int>(cn), static_cast<int>(kk), alpha,
         trans_a ? a + r0 : a + r0 * lda, static_cast<int>(lda),
         trans_b ? b + c0 * ldb : b + c0, static_cast<int>(ldb), beta, c + r0 * ldc + c0,
         static_cast<int>(ldc));
  });
}

}  // namespace

OpenBlasThreads::OpenBlasThreads(int threads) : saved_(openblas_get_num_threads()) {
  if (threads != saved_) openblas_set_num_threads(threads);
}
OpenBlasThreads::~OpenBlasThreads() {
  if (openblas_get_num_threads() != saved_) openblas_set_num_threads(saved_);
}

void SgemmTiled(int64_t m, int64_t n, int64_t kk, float alpha, const float* a, int64_t lda,
                const float* b, int64_t ldb, float beta, float* c, int64_t ldc, ThreadPool* pool) {
  GemmTiled<float>(m, n, kk, alpha, a, lda, b, ldb, beta, c, ldc, pool, cblas_sgemm);
}

void SgemmNTTiled(int64_t m, int64_t n, int64_t kk, const float* a, int64_t lda, const float* b,
                  int64_t ldb, float* c, int64_t ldc, ThreadPool* pool) {
  GemmTiled<float>(m, n, kk, 1.0f, a, lda, b, ldb, 0.0f, c, ldc, pool, cblas_sgemm, false, true,
                   kNTTileRows, NTTileCols(n));
}

void SgemmTNTiled(int64_t m, int64_t n, int64_t kk, float alpha, const float* a, int64_t lda,
                  const float* b, int64_t ldb, float beta, float* c, int64_t ldc,
                  ThreadPool* pool) {
  GemmTiled<float>(m, n, kk, alpha, a, lda, b, ldb, beta, c, ldc, pool, cblas_sgemm, true, false,
                   kTNTileRows, kTNTileCols);
}

void SgemvTiled(int64_t m, int64_t kk, const float* a, int64_t lda, const float* x, float* y,
                ThreadPool* pool) {
  if (m <= 0) return;
  OpenBlasThreads pin(1);
  Run(Tiles(m, kGemvTileRows), pool, [&](int64_t t, int) {
    const int64_t r0 = t * kGemvTileRows, rn = std::min(kGemvTileRows, m - r0);
    cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(rn), static_cast<int>(kk), 1.0f,
                a + r0 * lda, static_cast<int>(lda), x, 1, 0.0f, y + r0, 1);
  });
}

void DgemmTiled(int64_t m, int64_t n, int64_t kk, double alpha, const double* a, int64_t lda,
                const double* b, int64_t ldb, double beta, double* c, int64_t ldc,
                ThreadPool* pool) {
  GemmTiled<double>(m, n, kk, alpha, a, lda, b, ldb, beta, c, ldc, pool, cblas_dgemm);
}

void SyrkUpperTransTiled(int64_t k, int64_t rows, const double* x, int64_t ldx, double* c,
                         int64_t ldc, ThreadPool* pool) {
  if (k <= 0 || rows <= 0) return;
  OpenBlasThreads pin(1);
  // Tiles (I, J) with I <= J, numbered row by row of the upper triangle of the tile grid.
  const int64_t nt = Tiles(k, kSyrkTile);
  std::vector<std::pair<int64_t, int64_t>> tiles;
  for (int64_t i = 0; i < nt; ++i) {
    for (int64_t j = i; j < nt; ++j) tiles.emplace_back(i, j);
  }
  Run(static_cast<int64_t>(tiles.size()), pool, [&](int64_t t, int) {
    const int64_t i0 = tiles[t].first * kSyrkTile, j0 = tiles[t].second * kSyrkTile;
    const int64_t in = std::min(kSyrkTile, k - i0), jn = std::min(kSyrkTile, k - j0);
    if (i0 == j0) {
      cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, static_cast<int>(in),
                  static_cast<int>(rows), 1.0, x + i0, static_cast<int>(ldx), 1.0,
                  c + i0 * ldc + i0, static_cast<int>(ldc));
    } else {
      cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(in),
                  static_cast<int>(jn), static_cast<int>(rows), 1.0, x + i0, static_cast<int>(ldx),
                  x + j0, static_cast<int>(ldx), 1.0, c + i0 * ldc + j0, static_cast<int>(ldc));
    }
  });
}

}  // namespace sparq::blas
