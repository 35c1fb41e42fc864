// The training fast path (TrainExec::fast, sparq/train_model.h): the ops of sparq/train_ops.h with
// the same shapes, conventions (activation gradients written, parameter gradients accumulated)
// and checks (kInvalidInput naming the op and the operand), computed in f32 on a ThreadPool.
//
// How each op runs:
//   - linear products: fixed grids of single-threaded OpenBLAS tiles (src/core/blas_tiles.h):
//       Y = X W^T (SgemmNTTiled), dX = dY W (SgemmTiled), dW += dY^T X (SgemmTNTiled);
//     the masked dW is the dense product gathered at the kept positions, or the masked SDDMM
//     (cpu::MaskedWeightGrad: dY^T X at the kept positions only) for sparse and N:M masks;
//   - attention: tasks of (query head, block of kAttnRows query rows), each with single-threaded
//     OpenBLAS calls over the keys its rows see (fast_attention.cc);
//   - RMSNorm, SwiGLU, RoPE, the losses: blocks of rows (or elements) per task, double sums where
//     the reference has them over a row (RMSNorm) and f32 exponentials in the losses.
// Determinism: every split (tiles, row blocks, the order partial sums are added in) is a function
// of the shapes alone, never of the pool's size, and each task runs on one thread, so the outputs
// are bit-identical for any pool (null: the calling thread). pool must not be inside a
// ParallelFor of the caller's (ThreadPool is not re-entrant).
// Accuracy against the reference (long sums in double): f32 accumulation, about
// eps_f32 * K * max|a| * max|b| per product of length K (tests/train/fast_path_test.cc).
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "sparq/status.h"
#include "sparq/thread_pool.h"
#include "sparq/train_ops.h"

namespace sparq::train::fast {

// Query rows per attention task: 64 rows x 512 keys of scores (128 KiB) stay in L2 between the
// two products, and 256 tokens x 9 heads still give 36 tasks.
inline constexpr int64_t kAttnRows = 64;

// fn(begin, end) over [0, count) in blocks of `grain` (a grid of count and grain alone), the
// blocks spread over pool (null or 1 thread: in order on the calling thread).
void ForBlocks(ThreadPool* pool, int64_t count, int64_t grain,
               const std::function<void(int64_t begin, int64_t end)>& fn);
// The same with a Status per block: returns the first failing block's (in block order).
Status ForBlocksStatus(ThreadPool* pool, int64_t count, int64_t grain,
                       const std::function<Status(int64_t begin, int64_t end)>& fn);

Status RmsNormForward(std::span<const float> x, std::span<const float> g, int64_t n, int64_t d,
                      double eps, std::span<float> y, ThreadPool* pool);
// dg's sum over rows: double partials per block of rows, added in block order.
Status RmsNormBackward(std::span<const float> x, std::span<const float> g,
                       std::span<const float> dy, int64_t n, int64_t d, double eps,
                       std::span<float> dx, std::span<float> dg, ThreadPool* pool);

Status SwigluForward(std::span<const float> a, std::span<const float> b, std::span<float> y,
                     ThreadPool* pool);
Status SwigluBackward(std::span<const float> a, std::span<const float> b, std::span<const float> dy,
                      std::span<float> da, std::span<float> db, ThreadPool* pool);

// Y[n, m] = X[n, k] W[m, k]^T.
Status LinearForward(std::span<const float> x, std::span<const float> w, int64_t n, int64_t k,
                     int64_t m, std::span<float> y, ThreadPool* pool);
// dX[n, k] = dY[n, m] W[m, k] (written).
Status LinearBackwardInput(std::span<const float> dy, std::span<const float> w, int64_t n,
                           int64_t k, int64_t m, std::span<float> dx, ThreadPool* pool);
// dW[m, k] += dY[n, m]^T X[n, k].
Status LinearBackwardWeight(std::span<const float> dy, std::span<const float> x, int64_t n,
                            int64_t k, int64_t m, std::span<float> dw, ThreadPool* pool);
// dw_kept[i] += (dY^T X)[kept[i]] (kept: flat indices into W[m, k], each in range; repeats are
// allowed as in the reference). Strictly ascending (a mask's positions) with at most 20% kept, or
// an N:M mask the windowed SDDMM takes (cpu::MaskedWeightGradWindowed): only the kept products
// (cpu::MaskedWeightGrad); otherwise the dense [m, k] product, then gathers.
Status LinearBackwardWeightMasked(std::span<const float> dy, std::span<const float> x, int64_t n,
                                  int64_t k, int64_t m, std::span<const int64_t> kept,
                                  std::span<float> dw_kept, ThreadPool* pool);

// Blocks of rows, each the reference op at its positions: bitwise the reference's output.
Status RopeForward(std::span<const float> x, const RopeShape& s, std::span<float> y,
                   ThreadPool* pool);
Status RopeBackward(std::span<const float> dy, const RopeShape& s, std::span<float> dx,
                    ThreadPool* pool);

// fast_attention.cc. The backward's dk / dv sum each task's partial in (head, row block) order.
Status AttentionForward(std::span<const float> q, std::span<const float> k,
                        std::span<const float> v, const AttentionShape& s, std::span<float> out,
                        ThreadPool* pool);
Status AttentionBackward(std::span<const float> q, std::span<const float> k,
                         std::span<const float> v, std::span<const float> dout,
                         const AttentionShape& s, std::span<float> dq, std::span<float> dk,
                         std::span<float> dv, ThreadPool* pool);

// The losses by blocks of rows: each row's log-softmax with f32 exponentials and a double sum,
// the loss the double sum of the rows' terms in row order.
Status CrossEntropy(std::span<const float> logits, std::span<const int32_t> targets, int64_t n,
                    int64_t vocab, double* loss, std::span<float> dlogits, ThreadPool* pool);
Status KlDivergence(std::span<const float> teacher, std::span<const float> student, int64_t n,
                    int64_t vocab, double tau, double* loss, std::span<float> dstudent,
                    ThreadPool* pool);

}  // namespace sparq::train::fast
