// The training fast path's per-row ops and linear products (src/train/fast_ops.h).
#include "src/train/fast_ops.h"

#include <algorithm>
#include <functional>
#include <cmath>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "sparq/sddmm.h"
#include "src/core/blas_tiles.h"
#include "src/train/shape_check.h"

namespace sparq::train::fast {
namespace {

// Rows per task of the per-row ops: 16 rows of d = 576 are 37 KiB per operand (L2), and 256
// tokens still make 16 tasks.
constexpr int64_t kRowGrain = 16;
// Elements per task of the elementwise ops (SwiGLU, the gathers): 64 KiB per operand.
constexpr int64_t kElemGrain = 16384;
// LinearBackwardWeightMasked takes the SDDMM at or below this fraction of kept weights.
constexpr double kSddmmMaxDensity = 0.2;

// The kernels' target for the SDDMM: this machine's best (the training ops carry no KernelConfig;
// their dense products run OpenBLAS's own choice of kernels the same way).
const KernelConfig& MachineKernelConfig() {
  static const KernelConfig cfg = KernelConfig::FromMachine().value();
  return cfg;
}

}  // namespace

void ForBlocks(ThreadPool* pool, int64_t count, int64_t grain,
               const std::function<void(int64_t, int64_t)>& fn) {
  if (count <= 0) return;
  const int64_t blocks = (count + grain - 1) / grain;
  auto task = [&](int64_t b, int) { fn(b * grain, std::min(count, (b + 1) * grain)); };
  if (pool != nullptr && pool->num_threads() > 1 && blocks > 1) {
    pool->ParallelFor(blocks, task);
  } else {
    for (int64_t b = 0; b < blocks; ++b) task(b, 0);
  }
}

Status ForBlocksStatus(ThreadPool* pool, int64_t count, int64_t grain,
                       const std::function<Status(int64_t begin, int64_t end)>& fn) {
  if (count <= 0) return Status::Ok();
  std::vector<Status> st(static_cast<size_t>((count + grain - 1) / grain), Status::Ok());
  ForBlocks(pool, count, grain, [&](int64_t b0, int64_t b1) { st[b0 / grain] = fn(b0, b1); });
  for (const Status& s : st) SPARQ_RETURN_IF_ERROR(s);
  return Status::Ok();
}

// ---- RMSNorm ----------------------------------------------------------------------------------

Status RmsNormForward(std::span<const float> x, std::span<const float> g, int64_t n, int64_t d,
                      double eps, std::span<float> y, ThreadPool* pool) {
  constexpr const char* kOp = "RmsNormForward";
  SPARQ_RETURN_IF_ERROR(CheckSize(kOp, "x", x, {n, d}));
  SPARQ_RETURN_IF_ERROR(CheckSize(kOp, "g", g, {d}));
  SPARQ_RETURN_IF_ERROR(CheckSize(kOp, "y", y, {n, d}));
  return ForBlocksStatus(pool, n, kRowGrain, [&](int64_t r0, int64_t r1) {
    return train::RmsNormForward(x.subspan(r0 * d, (r1 - r0) * d), g, r1 - r0, d, eps,
                                 y.subspan(r0 * d, (r1 - r0) * d));
  });
}

Status RmsNormBackward(std::span<const float> x, std::span<const float> g,
                       std::span<const float> dy, int64_t n, int64_t d, double eps,
                       std::span<float> dx, std::span<float> dg, ThreadPool* pool) {
  constexpr const char* kOp = "RmsNormBackward";
  SPARQ_RETURN_IF_ERROR(CheckSize(kOp, "x", x, {n, d}));
  SPARQ_RETURN_IF_ERROR(CheckSize(kOp, "g", g, {d}));
  SPARQ_RETURN_IF_ERROR(CheckSize(kOp, "dy", dy, {n, d}));
  SPARQ_RETURN_IF_ERROR(CheckSize(kOp, "dx", dx, {n, d}));
  SPARQ_RETURN_IF_ERROR(CheckSize(kOp, "dg", dg, {d}));
  if (n == 0) return Status::Ok();
  const int64_t blocks = (n + kRowGrain - 1) / kRowGrain;
  std::vector<double> part(static_cast<size_t>(blocks * d), 0.0);  // dg of each block of rows
  ForBlocks(pool, n, kRowGrain, [&](int64_t r0, int64_t r1) {
    double* dgb = part.data() + (r0 / kRowGrain) * d;
    for (int64_t r = r0; r < r1; ++r) {  // the reference's row (ops.cc)
      const float* xr = x.data() + r * d;
      const float* dyr = dy.data() + r * d;
      double ss = 0.0;
      for (int64_t i = 0; i < d; ++i) ss += static_cast<double>(xr[i]) * xr[i];
      const double inv = 1.0 / std::sqrt(ss / static_cast<double>(d) + eps);
      double dot = 0.0;
      for (int64_t i = 0; i < d; ++i) {
        const double xhat = xr[i] * inv;
        dot += static_cast<double>(dyr[i]) * g[i] * xhat;
        dgb[i] += static_cast<double>(dyr[i]) * xhat;
      }
      dot /= static_cast<double>(d);
      float* dxr = dx.data() + r * d;
      for (int64_t i = 0; i < d; ++i) {
        const double xhat = xr[i] * inv;
        dxr[i] = static_cast<float>(inv * (static_cast<double>(dyr[i]) * g[i] - xhat * dot));
      }
    }
  });
  for (int64_t i = 0; i < d; ++i) {
    double s = 0.0;
    for (int64_t b = 0; b < blocks; ++b) s += part[b * d + i];
    dg[i] += static_cast<float>(s);
  }
  return Status::Ok();
}

// ---- SwiGLU -----------------------------------------------------------------------------------

Status SwigluForward(std::span<const float> a, std::span<const float> b, std::span<float> y,
                     ThreadPool* pool) {
  const auto count = static_cast<int64_t>(a.size());
  SPARQ_RETURN_IF_ERROR(CheckSize("SwigluForward", "b", b, {count}));
  SPARQ_RETURN_IF_ERROR(CheckSize("SwigluForward", "y", y, {count}));
  return ForBlocksStatus(pool, count, kElemGrain, [&](int64_t i0, int64_t i1) {
    return train::SwigluForward(a.subspan(i0, i1 - i0), b.subspan(i0, i1 - i0),
                                y.subspan(i0, i1 - i0));
  });
}

Status SwigluBackward(std::span<const float> a, std::span<const float> b, std::span<const float> dy,
                      std::span<float> da, std::span<float> db, ThreadPool* pool) {
  constexpr const char* kOp = "SwigluBackward";
  const auto count = static_cast<int64_t>(a.size());
  SPARQ_RETURN_IF_ERROR(CheckSize(kOp, "b", b, {count}));
  SPARQ_RETURN_IF_ERROR(CheckSize(kOp, "dy", dy, {count}));
  SPARQ_RETURN_IF_ERROR(CheckSize(kOp, "da", da, {count}));
  SPARQ_RETURN_IF_ERROR(CheckSize(kOp, "db", db, {count}));
  return ForBlocksStatus(pool, count, kElemGrain, [&](int64_t i0, int64_t i1) {
    const int64_t len = i1 - i0;
    return train::SwigluBackward(a.subspan(i0, len), b.subspan(i0, len), dy.subspan(i0, len),
                                 da.subspan(i0, len), db.subspan(i0, len));
  });
}

// ---- Linear -----------------------------------------------------------------------------------

Status LinearForward(std::span<const float> x, std::span<const float> w, int64_t n, int64_t k,
                     int64_t m, std::span<float> y, ThreadPool* pool) {
  SPARQ_RETURN_IF_ERROR(CheckSize("LinearForward", "x", x, {n, k}));
  SPARQ_RETURN_IF_ERROR(CheckSize("LinearForward", "w", w, {m, k}));
  SPARQ_RETURN_IF_ERROR(CheckSize("LinearForward", "y", y, {n, m}));
  if (k == 0) {  // an empty sum (BLAS is not asked about kk = 0)
    std::fill(y.begin(), y.end(), 0.0f);
    return Status::Ok();
  }
  blas::SgemmNTTiled(n, m, k, x.data(), k, w.data(), k, y.data(), m, pool);
  return Status::Ok();
}

Status LinearBackwardInput(std::span<const float> dy, std::span<const float> w, int64_t n,
                           int64_t k, int64_t m, std::span<float> dx, ThreadPool* pool) {
  SPARQ_RETURN_IF_ERROR(CheckSize("LinearBackwardInput", "dy", dy, {n, m}));
  SPARQ_RETURN_IF_ERROR(CheckSize("LinearBackwardInput", "w", w, {m, k}));
  SPARQ_RETURN_IF_ERROR(CheckSize("LinearBackwardInput", "dx", dx, {n, k}));
  if (m == 0) {
    std::fill(dx.begin(), dx.end(), 0.0f);
    return Status::Ok();
  }
  blas::SgemmTiled(n, k, m, 1.0f, dy.data(), m, w.data(), k, 0.0f, dx.data(), k, pool);
  return Status::Ok();
}

Status LinearBackwardWeight(std::span<const float> dy, std::span<const float> x, int64_t n,
                            int64_t k, int64_t m, std::span<float> dw, ThreadPool* pool) {
  SPARQ_RETURN_IF_ERROR(CheckSize("LinearBackwardWeight", "dy", dy, {n, m}));
  SPARQ_RETURN_IF_ERROR(CheckSize("LinearBackwardWeight", "x", x, {n, k}));
  SPARQ_RETURN_IF_ERROR(CheckSize("LinearBackwardWeight", "dw", dw, {m, k}));
  if (n == 0) return Status::Ok();
  blas::SgemmTNTiled(m, k, n, 1.0f, dy.data(), m, x.data(), k, 1.0f, dw.data(), k, pool);
  return Status::Ok();
}

Status LinearBackwardWeightMasked(std::span<const float> dy, std::span<const float> x, int64_t n,
                                  int64_t k, int64_t m, std::span<const int64_t> kept,
                                  std::span<float> dw_kept, ThreadPool* pool) {
  constexpr const char* kOp = "LinearBackwardWeightMasked";
  SPARQ_RETURN_IF_ERROR(CheckSize(kOp, "dy", dy, {n, m}));
  SPARQ_RETURN_IF_ERROR(CheckSize(kOp, "x", x, {n, k}));
  SPARQ_RETURN_IF_ERROR(CheckSize(kOp, "dw_kept", dw_kept, {static_cast<int64_t>(kept.size())}));
  SPARQ_RETURN_IF_ERROR(CheckedNumel({m, k}, std::string(kOp) + ": W").status());
  for (size_t i = 0; i < kept.size(); ++i) {
    if (kept[i] < 0 || kept[i] >= m * k) {
      return InvalidInput(std::string(kOp) + ": kept[" + std::to_string(i) +
                          "] = " + std::to_string(kept[i]) + " is outside W[" + std::to_string(m) +
                          ", " + std::to_string(k) + "]");
    }
  }
  if (n == 0 || kept.empty()) return Status::Ok();
  // Sparse masks in row-major order: only the kept dot products (cpu::MaskedWeightGrad). Denser
  // ones: the dense dY^T X, then the kept entries, which stays faster down to ~20% kept (`sparq
  // bench grad`, 4096 x 4096, 512 tokens, Emerald Rapids VM: the SDDMM at 80% sparse ~1.0x the
  // dense dW, 90% ~2x, 2:4 and 50% 0.5-0.7x; docs/measurements/xeon-backward-grad-2026-12-06.md),
  // except N:M masks the windowed SDDMM takes (2:4 about even with the dense dW and its gather,
  // without their m x k buffer; 1:4 1.9x: docs/measurements/zen5-windowed-sddmm-2026-12-07.md).
  const KernelConfig& cfg = MachineKernelConfig();
  const bool ascending =
      std::adjacent_find(kept.begin(), kept.end(), std::greater_equal<int64_t>()) == kept.end();
  if (ascending && (static_cast<double>(kept.size()) <= kSddmmMaxDensity * static_cast<double>(m * k) ||
                    cpu::MaskedWeightGradWindowed(k, m, kept, cfg))) {
    return cpu::MaskedWeightGrad(dy, x, n, k, m, kept, dw_kept, pool, cfg);
  }
  // (Not zero-filled: beta = 0 writes every entry.)
  const std::unique_ptr<float[]> dense(new float[static_cast<size_t>(m * k)]);
  blas::SgemmTNTiled(m, k, n, 1.0f, dy.data(), m, x.data(), k, 0.0f, dense.get(), k, pool);
  ForBlocks(pool, static_cast<int64_t>(kept.size()), kElemGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) dw_kept[i] += dense[kept[i]];
  });
  return Status::Ok();
}

// ---- RoPE -------------------------------------------------------------------------------------

namespace {

Status RopeBlocks(bool forward, std::span<const float> in, const RopeShape& s, std::span<float> out,
                  ThreadPool* pool) {
  const char* op = forward ? "RopeForward" : "RopeBackward";
  // The whole call's checks first (rope_dim and theta too, on no rows: a call with n = 0 still
  // refuses them), then the blocks.
  SPARQ_RETURN_IF_ERROR(CheckSize(op, forward ? "x" : "dy", in, {s.n, s.heads, s.hd}));
  SPARQ_RETURN_IF_ERROR(CheckSize(op, "output", out, {s.n, s.heads, s.hd}));
  const RopeShape none{.n = 0,
                       .heads = s.heads,
                       .hd = s.hd,
                       .rope_dim = s.rope_dim,
                       .pos0 = s.pos0,
                       .theta = s.theta};
  SPARQ_RETURN_IF_ERROR(forward ? train::RopeForward({}, none, {})
                                : train::RopeBackward({}, none, {}));
  const int64_t width = s.heads * s.hd;
  return ForBlocksStatus(pool, s.n, kRowGrain, [&](int64_t r0, int64_t r1) {
    RopeShape b = s;
    b.n = r1 - r0;
    b.pos0 = s.pos0 + r0;  // the angle depends on the absolute position only
    const auto src = in.subspan(r0 * width, b.n * width);
    const auto dst = out.subspan(r0 * width, b.n * width);
    return forward ? train::RopeForward(src, b, dst) : train::RopeBackward(src, b, dst);
  });
}

}  // namespace

Status RopeForward(std::span<const float> x, const RopeShape& s, std::span<float> y,
                   ThreadPool* pool) {
  return RopeBlocks(true, x, s, y, pool);
}

Status RopeBackward(std::span<const float> dy, const RopeShape& s, std::span<float> dx,
                    ThreadPool* pool) {
  return RopeBlocks(false, dy, s, dx, pool);
}

}  // namespace sparq::train::fast
