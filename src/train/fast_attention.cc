// Causal grouped-query attention of the training fast path (src/train/fast_ops.h), forward and
// backward, as single-threaded OpenBLAS products inside tasks of (query head h, block of query
// rows [i0, i1)). A block's rows see the keys [0, i1) (causal), so the products skip the keys that
// the mask would zero (about half of them at t = 256):
//   forward:  S = scale Q_b K^T, P = softmax by row (masked beyond the diagonal), O_b = P V;
//   backward: P again (the same bits), dP = dO_b V^T, dS = scale P (dP - rowsum(P dP)),
//             dQ_b = dS K, and the block's partials dK_hb = dS^T Q_b, dV_hb = P^T dO_b.
// The partials are summed per KV head in (head, block) order after the tasks: the same bits for
// any pool size.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "sparq/blas_threads.h"
#include "src/train/fast_ops.h"
#include "src/train/shape_check.h"

namespace sparq::train::fast {
namespace {

// The task grid: n_head x blocks of kAttnRows query rows.
struct Grid {
  int64_t t, hd, qd, kvd, group, blocks;
  float scale;
  explicit Grid(const AttentionShape& s)
      : t(s.t),
        hd(s.hd),
        qd(s.n_head * s.hd),
        kvd(s.n_kv * s.hd),
        group(s.n_head / s.n_kv),
        blocks((s.t + kAttnRows - 1) / kAttnRows),
        scale(static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.hd)))) {}
  int64_t tasks(const AttentionShape& s) const { return s.n_head * blocks; }
};

void RunTasks(ThreadPool* pool, int64_t tasks, const std::function<void(int64_t, int)>& fn) {
  if (pool != nullptr && pool->num_threads() > 1) {
    pool->ParallelFor(tasks, fn);
  } else {
    for (int64_t i = 0; i < tasks; ++i) fn(i, 0);
  }
}

// P[rows, keys] of query rows [i0, i1) of head h: scale q_i . k_j, softmax over j <= i (f32
// exponentials, the sum in double), 0 beyond.
void Probabilities(const Grid& g, const float* q, const float* k, int64_t h, int64_t i0, int64_t i1,
                   float* p) {
  const int64_t keys = i1, kv = h / g.group;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(i1 - i0),
              static_cast<int>(keys), static_cast<int>(g.hd), g.scale, q + i0 * g.qd + h * g.hd,
              static_cast<int>(g.qd), k + kv * g.hd, static_cast<int>(g.kvd), 0.0f, p,
              static_cast<int>(keys));
  for (int64_t i = i0; i < i1; ++i) {
    float* row = p + (i - i0) * keys;
    const int64_t len = i + 1;
    const float mx = *std::max_element(row, row + len);
    double sum = 0.0;
    for (int64_t j = 0; j < len; ++j) sum += (row[j] = std::exp(row[j] - mx));
    const auto inv = static_cast<float>(1.0 / sum);
    for (int64_t j = 0; j < len; ++j) row[j] *= inv;
    std::fill(row + len, row + keys, 0.0f);
  }
}

}  // namespace

Status AttentionForward(std::span<const float> q, std::span<const float> k,
                        std::span<const float> v, const AttentionShape& s, std::span<float> out,
                        ThreadPool* pool) {
  SPARQ_RETURN_IF_ERROR(CheckAttention("AttentionForward", s, q, k, v));
  SPARQ_RETURN_IF_ERROR(CheckSize("AttentionForward", "out", out, {s.t, s.n_head, s.hd}));
  if (s.t == 0) return Status::Ok();
  const Grid g(s);
  const int threads = pool != nullptr ? pool->num_threads() : 1;
  std::vector<float> scratch(static_cast<size_t>(threads * kAttnRows * g.t));  // P per thread
  blas::OpenBlasThreads pin(1);  // each task's calls on its own thread; restored on return
  RunTasks(pool, g.tasks(s), [&](int64_t task, int thread) {
    const int64_t h = task / g.blocks, kv = h / g.group;
    const int64_t i0 = (task % g.blocks) * kAttnRows, i1 = std::min(g.t, i0 + kAttnRows);
    float* p = scratch.data() + thread * kAttnRows * g.t;
    Probabilities(g, q.data(), k.data(), h, i0, i1, p);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(i1 - i0),
                static_cast<int>(g.hd), static_cast<int>(i1), 1.0f, p, static_cast<int>(i1),
                v.data() + kv * g.hd, static_cast<int>(g.kvd), 0.0f,
                out.data() + i0 * g.qd + h * g.hd, static_cast<int>(g.qd));
  });
  return Status::Ok();
}

Status AttentionBackward(std::span<const float> q, std::span<const float> k,
                         std::span<const float> v, std::span<const float> dout,
                         const AttentionShape& s, std::span<float> dq, std::span<float> dk,
                         std::span<float> dv, ThreadPool* pool) {
  constexpr const char* kOp = "AttentionBackward";
  SPARQ_RETURN_IF_ERROR(CheckAttention(kOp, s, q, k, v));
  SPARQ_RETURN_IF_ERROR(CheckSize(kOp, "dout", dout, {s.t, s.n_head, s.hd}));
  SPARQ_RETURN_IF_ERROR(CheckSize(kOp, "dq", dq, {s.t, s.n_head, s.hd}));
  SPARQ_RETURN_IF_ERROR(CheckSize(kOp, "dk", dk, {s.t, s.n_kv, s.hd}));
  SPARQ_RETURN_IF_ERROR(CheckSize(kOp, "dv", dv, {s.t, s.n_kv, s.hd}));
  if (s.t == 0) return Status::Ok();
  const Grid g(s);
  const int threads = pool != nullptr ? pool->num_threads() : 1;
  const int64_t tile = kAttnRows * g.t;
  std::vector<float> scratch(static_cast<size_t>(threads * 2 * tile));  // P, dP per thread
  // dK, dV partial of task (h, b): rows [0, i1) of [t, hd], at part + task * t * hd.
  const int64_t part_size = g.t * g.hd;
  std::vector<float> dk_part(static_cast<size_t>(g.tasks(s) * part_size));
  std::vector<float> dv_part(dk_part.size());
  {
    blas::OpenBlasThreads pin(1);
    RunTasks(pool, g.tasks(s), [&](int64_t task, int thread) {
      const int64_t h = task / g.blocks, kv = h / g.group;
      const int64_t i0 = (task % g.blocks) * kAttnRows, i1 = std::min(g.t, i0 + kAttnRows);
      const int64_t rows = i1 - i0, keys = i1;
      float* p = scratch.data() + thread * 2 * tile;
      float* ds = p + tile;  // dP, then dS in place
      const float* qb = q.data() + i0 * g.qd + h * g.hd;
      const float* dob = dout.data() + i0 * g.qd + h * g.hd;
      const float* kk = k.data() + kv * g.hd;
      const float* vv = v.data() + kv * g.hd;
      const int ri = static_cast<int>(rows), ki = static_cast<int>(keys);
      const int hd = static_cast<int>(g.hd), qd = static_cast<int>(g.qd);
      const int kvd = static_cast<int>(g.kvd);
      Probabilities(g, q.data(), k.data(), h, i0, i1, p);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, ri, ki, hd, 1.0f, dob, qd, vv, kvd, 0.0f,
                  ds, ki);
      for (int64_t i = i0; i < i1; ++i) {
        const float* pr = p + (i - i0) * keys;
        float* dr = ds + (i - i0) * keys;
        const int64_t len = i + 1;
        double pdp = 0.0;
        for (int64_t j = 0; j < len; ++j) pdp += static_cast<double>(pr[j]) * dr[j];
        const auto c = static_cast<float>(pdp);
        for (int64_t j = 0; j < len; ++j) dr[j] = g.scale * pr[j] * (dr[j] - c);
        std::fill(dr + len, dr + keys, 0.0f);
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, ri, hd, ki, 1.0f, ds, ki, kk, kvd,
                  0.0f, dq.data() + i0 * g.qd + h * g.hd, qd);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, ki, hd, ri, 1.0f, ds, ki, qb, qd, 0.0f,
                  dk_part.data() + task * part_size, hd);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, ki, hd, ri, 1.0f, p, ki, dob, qd, 0.0f,
                  dv_part.data() + task * part_size, hd);
    });
  }
  // dk[j, kv] = sum over the group's heads and the blocks whose rows see key j (i1 > j), in
  // (head, block) order.
  ForBlocks(pool, g.t, kAttnRows, [&](int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; ++j) {
      const int64_t first_block = j / kAttnRows;  // blocks before it end at or before j
      for (int64_t kv = 0; kv < s.n_kv; ++kv) {
        float* dkj = dk.data() + j * g.kvd + kv * g.hd;
        float* dvj = dv.data() + j * g.kvd + kv * g.hd;
        std::fill(dkj, dkj + g.hd, 0.0f);
        std::fill(dvj, dvj + g.hd, 0.0f);
        for (int64_t h = kv * g.group; h < (kv + 1) * g.group; ++h) {
          for (int64_t b = first_block; b < g.blocks; ++b) {
            const int64_t at = (h * g.blocks + b) * part_size + j * g.hd;
            for (int64_t e = 0; e < g.hd; ++e) {
              dkj[e] += dk_part[at + e];
              dvj[e] += dv_part[at + e];
            }
          }
        }
      }
    }
  });
  return Status::Ok();
}

}  // namespace sparq::train::fast
