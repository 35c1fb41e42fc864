// Dense BLAS products as a fixed grid of output tiles, each one single-threaded OpenBLAS call, the
// tiles spread over sparq's ThreadPool: the dense f32 kernel (src/cpu/blas.cc) and the products of
// src/prune (the Hessian's X^T X, SparseGPT's lazy updates, the quadratic forms of its report)
// and the training fast path of src/train (the linear layers' and the tied head's forward and
// backward).
//
// Why: OpenBLAS splits a call's output between its own threads, and on several kernel families
// the split changes the bits (Debian's 0.3.21: sgemm with every kernel family at some shapes,
// dgemm and dsyrk with the SkylakeX kernels at k not a multiple of their tile, sgemv with 3
// threads), so a result computed with 2 OpenBLAS threads differs from the one computed with 1. Here
// the grid depends on the shape only and every tile runs on one thread, so the bits are the same
// for any pool size and any OpenBLAS thread count, on every CPU.
//
// Threads: the calls pin OpenBLAS to one thread for their duration (process-wide; restored after),
// so a BLAS call made concurrently elsewhere also runs on one thread meanwhile: slower, never
// wrong.
#pragma once

#include <cstdint>

#include "sparq/blas_threads.h"
#include "sparq/thread_pool.h"

namespace sparq::blas {

// OpenBlasThreads, the one OpenBLAS thread policy: sparq/blas_threads.h.

// Row-major C[m, n] = alpha * A[m, kk] * B[kk, n] + beta * C (leading dimensions lda, ldb, ldc).
// pool may be null (tiles run in order on the calling thread).
void SgemmTiled(int64_t m, int64_t n, int64_t kk, float alpha, const float* a, int64_t lda,
                const float* b, int64_t ldb, float beta, float* c, int64_t ldc, ThreadPool* pool);

// Row-major C[m, n] = A[m, kk] * B[n, kk]^T (a weight B stored row per output), on a grid of
// output tiles chosen from the shape alone (narrower column tiles for narrow C, so a 576-wide
// layer still gives every thread work).
void SgemmNTTiled(int64_t m, int64_t n, int64_t kk, const float* a, int64_t lda, const float* b,
                  int64_t ldb, float* c, int64_t ldc, ThreadPool* pool);

// Row-major C[m, n] = alpha * A[kk, m]^T * B[kk, n] + beta * C (a weight gradient
// dW[outputs, inputs] += dY[tokens, outputs]^T X[tokens, inputs] with alpha = beta = 1), on a grid
// of output tiles chosen from the shape alone.
void SgemmTNTiled(int64_t m, int64_t n, int64_t kk, float alpha, const float* a, int64_t lda,
                  const float* b, int64_t ldb, float beta, float* c, int64_t ldc, ThreadPool* pool);

// y[m] = A[m, kk] x, in blocks of rows.
void SgemvTiled(int64_t m, int64_t kk, const float* a, int64_t lda, const float* x, float* y,
                ThreadPool* pool);
void DgemmTiled(int64_t m, int64_t n, int64_t kk, double alpha, const double* a, int64_t lda,
                const double* b, int64_t ldb, double beta, double* c, int64_t ldc,
                ThreadPool* pool);

// The upper triangle (diagonal included) of row-major C[k, k] += X^T X for X[rows, k] (leading
// dimension ldx); the strict lower triangle is not touched.
void SyrkUpperTransTiled(int64_t k, int64_t rows, const double* x, int64_t ldx, double* c,
                         int64_t ldc, ThreadPool* pool);

}  // namespace sparq::blas
