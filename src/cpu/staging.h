// Moving data in and out of the kernels: X padded or transposed into X^T tiles before a call, raw
// sums and token tiles written to Y with the epilogue after it.
#pragma once

#include <cstdint>

#include "sparq/kernel_config.h"
#include "sparq/thread_pool.h"
#include "src/cpu/spmm.h"

namespace sparq::cpu {

// ApplyEpilogueRow (spmm.h) for tokens [t0, t1) of Y (y = Y[0, 0], rows ldy apart), in one call.
void ApplyEpilogueBlock(const KernelConfig& c, float* y, int64_t ldy, int64_t t0, int64_t t1,
                        int64_t r0, int64_t r1, int64_t m, const Epilogue& ep);
// Writes raw sums [n][r1 - r0] (row-major over the task's rows) to Y with the epilogue.
void WriteRaw(const float* raw, int64_t n, int64_t r0, int64_t r1, const SpmmArgs& a, int64_t m);
// Whether the tiled kernels write Y (n x m) with non-temporal stores.
bool StreamY(const SpmmArgs& a, int64_t m, const ThreadPool* pool);
// Writes tokens [t0, t1) of a token tile from scratch laid out [row][nt] (row r's sums at
// scratch + row_off[r - r0], token t at + t - t0) to Y, then the epilogue.
void WriteTile(const float* scratch, const int64_t* row_off, int64_t r0, int64_t r1, int64_t t0,
               int64_t t1, const SpmmArgs& a, int64_t m, bool stream);
// X copied to rows of k_pad floats, zero beyond cols (the padded kernels read whole chunks).
float* PaddedX(const float* x, int64_t n, int64_t ldx, int64_t cols, int64_t k_pad);
// X^T tiles: xt[tile - tile0][c][j] = X[tile * nt + j][c] (zero for padded tokens and c >=
// cols), tiles [tile0, tile1) (tile1 < 0: all), in ThreadBuffer `slot`.
float* BuildXt(const SpmmArgs& a, int64_t cols, int64_t k_rows, int64_t nt, ThreadPool* pool,
               int slot = 0, int64_t tile0 = 0, int64_t tile1 = -1);

}  // namespace sparq::cpu
