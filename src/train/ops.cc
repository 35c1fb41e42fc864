// Forward and backward of the per-row and per-element ops of a Llama block: RMSNorm, SwiGLU,
// the linear layer (dense and masked dW), RoPE and the embedding. Plain loops, row-major,
// long sums in double (the reference the later kernel-table rows are tested against).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "sparq/train_ops.h"
#include "src/train/shape_check.h"

namespace sparq::train {

Status CheckIds(const char* op, const char* what, std::span<const int32_t> ids, int64_t limit) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= limit) {
      return InvalidInput(std::string(op) + ": " + what + "[" + std::to_string(i) +
                          "] = " + std::to_string(ids[i]) + " is outside [0, " +
                          std::to_string(limit) + ")");
    }
  }
  return Status::Ok();
}

namespace {

// 1 / sqrt(mean(x^2) + eps) of one row of d, summed in double (the model's RmsNorm).
double InvRms(const float* x, int64_t d, double eps) {
  double ss = 0.0;
  for (int64_t i = 0; i < d; ++i) ss += static_cast<double>(x[i]) * x[i];
  return 1.0 / std::sqrt(ss / static_cast<double>(d) + eps);
}

float Sigmoid(float a) { return 1.0f / (1.0f + std::exp(-a)); }

}  // namespace

// ---- RMSNorm ----------------------------------------------------------------------------------

Status RmsNormForward(std::span<const float> x, std::span<const float> g, int64_t n, int64_t d,
                      double eps, std::span<float> y) {
  constexpr const char* kOp = "RmsNormForward";
  SPARQ_RETURN_IF_ERROR(CheckSize(kOp, "x", x, {n, d}));
  SPARQ_RETURN_IF_ERROR(CheckSize(kOp, "g", g, {d}));
  SPARQ_RETURN_IF_ERROR(CheckSize(kOp, "y", y, {n, d}));
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = x.data() + r * d;
    const auto scale = static_cast<float>(InvRms(xr, d, eps));
    float* yr = y.data() + r * d;
    for (int64_t i = 0; i < d; ++i) yr[i] = (xr[i] * scale) * g[i];
  }
  return Status::Ok();
}

Status RmsNormBackward(std::span<const float> x, std::span<const float> g,
                       std::span<const float> dy, int64_t n, int64_t d, double eps,
                       std::span<float> dx, std::span<float> dg) {
  constexpr const char* kOp = "RmsNormBackward";
  SPARQ_RETURN_IF_ERROR(CheckSize(kOp, "x", x, {n, d}));
  SPARQ_RETURN_IF_ERROR(CheckSize(kOp, "g", g, {d}));
  SPARQ_RETURN_IF_ERROR(CheckSize(kOp, "dy", dy, {n, d}));
  SPARQ_RETURN_IF_ERROR(CheckSize(kOp, "dx", dx, {n, d}));
  SPARQ_RETURN_IF_ERROR(CheckSize(kOp, "dg", dg, {d}));
  std::vector<double> dg_acc(static_cast<size_t>(d), 0.0);
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = x.data() + r * d;
    const float* dyr = dy.data() + r * d;
    const double inv = InvRms(xr, d, eps);
    // dot = mean_i (dy_i g_i) xhat_i
    double dot = 0.0;
    for (int64_t i = 0; i < d; ++i) {
      const double xhat = xr[i] * inv;
      dot += static_cast<double>(dyr[i]) * g[i] * xhat;
      dg_acc[i] += static_cast<double>(dyr[i]) * xhat;
    }
    dot /= static_cast<double>(d);
    float* dxr = dx.data() + r * d;
    for (int64_t i = 0; i < d; ++i) {
      const double xhat = xr[i] * inv;
      dxr[i] = static_cast<float>(inv * (static_cast<double>(dyr[i]) * g[i] - xhat * dot));
    }
  }
  for (int64_t i = 0; i < d; ++i) dg[i] += static_cast<float>(dg_acc[i]);
  return Status::Ok();
}

// ---- SwiGLU -----------------------------------------------------------------------------------

Status SwigluForward(std::span<const float> a, std::span<const float> b, std::span<float> y) {
  const auto count = static_cast<int64_t>(a.size());
  SPARQ_RETURN_IF_ERROR(CheckSize("SwigluForward", "b", b, {count}));
  SPARQ_RETURN_IF_ERROR(CheckSize("SwigluForward", "y", y, {count}));
  for (int64_t i = 0; i < count; ++i) y[i] = a[i] * Sigmoid(a[i]) * b[i];
  return Status::Ok();
}

Status SwigluBackward(std::span<const float> a, std::span<const float> b, std::span<const float> dy,
                      std::span<float> da, std::span<float> db) {
  constexpr const char* kOp = "SwigluBackward";
  const auto count = static_cast<int64_t>(a.size());
  SPARQ_RETURN_IF_ERROR(CheckSize(kOp, "b", b, {count}));
  SPARQ_RETURN_IF_ERROR(CheckSize(kOp, "dy", dy, {count}));
  SPARQ_RETURN_IF_ERROR(CheckSize(kOp, "da", da, {count}));
  SPARQ_RETURN_IF_ERROR(CheckSize(kOp, "db", db, {count}));
  for (int64_t i = 0; i < count; ++i) {
    const float s = Sigmoid(a[i]);
    const float silu = a[i] * s;
    da[i] = dy[i] * b[i] * (s * (1.0f + a[i] * (1.0f - s)));
    db[i] = dy[i] * silu;
  }
  return Status::Ok();
}

// ---- Linear -----------------------------------------------------------------------------------

Status LinearForward(std::span<const float> x, std::span<const float> w, int64_t n, int64_t k,
                     int64_t m, std::span<float> y) {
  SPARQ_RETURN_IF_ERROR(CheckSize("LinearForward", "x", x, {n, k}));
  SPARQ_RETURN_IF_ERROR(CheckSize("LinearForward", "w", w, {m, k}));
  SPARQ_RETURN_IF_ERROR(CheckSize("LinearForward", "y", y, {n, m}));
  for (int64_t t = 0; t < n; ++t) {
    const float* xt = x.data() + t * k;
    for (int64_t r = 0; r < m; ++r) {
      const float* wr = w.data() + r * k;
      double acc = 0.0;
      for (int64_t c = 0; c < k; ++c) acc += static_cast<double>(xt[c]) * wr[c];
      y[t * m + r] = static_cast<float>(acc);
    }
  }
  return Status::Ok();
}

Status LinearBackwardInput(std::span<const float> dy, std::span<const float> w, int64_t n,
                           int64_t k, int64_t m, std::span<float> dx) {
  SPARQ_RETURN_IF_ERROR(CheckSize("LinearBackwardInput", "dy", dy, {n, m}));
  SPARQ_RETURN_IF_ERROR(CheckSize("LinearBackwardInput", "w", w, {m, k}));
  SPARQ_RETURN_IF_ERROR(CheckSize("LinearBackwardInput", "dx", dx, {n, k}));
  std::vector<double> acc(static_cast<size_t>(k));
  for (int64_t t = 0; t < n; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t r = 0; r < m; ++r) {  // row t of dX = sum_r dY[t, r] W[r, :]
      const double g = dy[t * m + r];
      const float* wr = w.data() + r * k;
      for (int64_t c = 0; c < k; ++c) acc[c] += g * wr[c];
    }
    for (int64_t c = 0; c < k; ++c) dx[t * k + c] = static_cast<float>(acc[c]);
  }
  return Status::Ok();
}

Status LinearBackwardWeight(std::span<const float> dy, std::span<const float> x, int64_t n,
                            int64_t k, int64_t m, std::span<float> dw) {
  SPARQ_RETURN_IF_ERROR(CheckSize("LinearBackwardWeight", "dy", dy, {n, m}));
  SPARQ_RETURN_IF_ERROR(CheckSize("LinearBackwardWeight", "x", x, {n, k}));
  SPARQ_RETURN_IF_ERROR(CheckSize("LinearBackwardWeight", "dw", dw, {m, k}));
  std::vector<double> acc(static_cast<size_t>(k));
  for (int64_t r = 0; r < m; ++r) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t t = 0; t < n; ++t) {  // row r of dW = sum_t dY[t, r] X[t, :]
      const double g = dy[t * m + r];
      const float* xt = x.data() + t * k;
      for (int64_t c = 0; c < k; ++c) acc[c] += g * xt[c];
    }
    for (int64_t c = 0; c < k; ++c) dw[r * k + c] += static_cast<float>(acc[c]);
  }
  return Status::Ok();
}

Status LinearBackwardWeightMasked(std::span<const float> dy, std::span<const float> x, int64_t n,
                                  int64_t k, int64_t m, std::span<const int64_t> kept,
                                  std::span<float> dw_kept) {
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
  for (size_t i = 0; i < kept.size(); ++i) {  // one dot product over the tokens per kept weight
    const int64_t r = kept[i] / k, c = kept[i] % k;
    double acc = 0.0;
    for (int64_t t = 0; t < n; ++t) acc += static_cast<double>(dy[t * m + r]) * x[t * k + c];
    dw_kept[i] += static_cast<float>(acc);
  }
  return Status::Ok();
}

// ---- RoPE -------------------------------------------------------------------------------------

namespace {

Status CheckRope(const char* op, const char* in_name, std::span<const float> in, const RopeShape& s,
                 std::span<float> out) {
  if (s.rope_dim < 2 || s.rope_dim > s.hd || s.rope_dim % 2 != 0 || !(s.theta > 0) || s.pos0 < 0) {
    return InvalidInput(std::string(op) + ": rope_dim " + std::to_string(s.rope_dim) +
                        " must be even and in [2, hd = " + std::to_string(s.hd) +
                        "], theta > 0, pos0 >= 0");
  }
  SPARQ_RETURN_IF_ERROR(CheckSize(op, in_name, in, {s.n, s.heads, s.hd}));
  return CheckSize(op, "output", out, {s.n, s.heads, s.hd});
}

// Rotates every head of every row by `sign` times its angle (+1 forward, -1 the transpose).
void Rotate(const float* in, const RopeShape& s, float sign, float* out) {
  const int64_t half = s.rope_dim / 2, width = s.heads * s.hd;
  std::vector<double> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    inv[i] = std::pow(s.theta, -2.0 * static_cast<double>(i) / static_cast<double>(s.rope_dim));
  }
  std::vector<float> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
  for (int64_t r = 0; r < s.n; ++r) {
    const auto pos = static_cast<double>(s.pos0 + r);
    for (int64_t i = 0; i < half; ++i) {  // rounded to f32 as the model's RopeTable
      cs[i] = static_cast<float>(std::cos(pos * inv[i]));
      sn[i] = sign * static_cast<float>(std::sin(pos * inv[i]));
    }
    for (int64_t h = 0; h < s.heads; ++h) {
      const float* p = in + r * width + h * s.hd;
      float* o = out + r * width + h * s.hd;
      for (int64_t i = 0; i < half; ++i) {
        const float x0 = p[2 * i], x1 = p[2 * i + 1];
        o[2 * i] = x0 * cs[i] - x1 * sn[i];
        o[2 * i + 1] = x0 * sn[i] + x1 * cs[i];
      }
      for (int64_t i = s.rope_dim; i < s.hd; ++i) o[i] = p[i];
    }
  }
}

}  // namespace

Status RopeForward(std::span<const float> x, const RopeShape& s, std::span<float> y) {
  SPARQ_RETURN_IF_ERROR(CheckRope("RopeForward", "x", x, s, y));
  Rotate(x.data(), s, 1.0f, y.data());
  return Status::Ok();
}

Status RopeBackward(std::span<const float> dy, const RopeShape& s, std::span<float> dx) {
  SPARQ_RETURN_IF_ERROR(CheckRope("RopeBackward", "dy", dy, s, dx));
  Rotate(dy.data(), s, -1.0f, dx.data());
  return Status::Ok();
}

// ---- Embedding --------------------------------------------------------------------------------

Status EmbeddingForward(std::span<const float> table, std::span<const int32_t> tokens,
                        int64_t vocab, int64_t d, std::span<float> x) {
  const auto n = static_cast<int64_t>(tokens.size());
  SPARQ_RETURN_IF_ERROR(CheckSize("EmbeddingForward", "table", table, {vocab, d}));
  SPARQ_RETURN_IF_ERROR(CheckSize("EmbeddingForward", "x", x, {n, d}));
  SPARQ_RETURN_IF_ERROR(CheckIds("EmbeddingForward", "tokens", tokens, vocab));
  for (int64_t t = 0; t < n; ++t) {
    const float* e = table.data() + static_cast<int64_t>(tokens[t]) * d;
    for (int64_t i = 0; i < d; ++i) x[t * d + i] = e[i];
  }
  return Status::Ok();
}

Status EmbeddingBackward(std::span<const float> dx, std::span<const int32_t> tokens, int64_t vocab,
                         int64_t d, std::span<float> dtable) {
  const auto n = static_cast<int64_t>(tokens.size());
  SPARQ_RETURN_IF_ERROR(CheckSize("EmbeddingBackward", "dx", dx, {n, d}));
  SPARQ_RETURN_IF_ERROR(CheckSize("EmbeddingBackward", "dtable", dtable, {vocab, d}));
  SPARQ_RETURN_IF_ERROR(CheckIds("EmbeddingBackward", "tokens", tokens, vocab));
  for (int64_t t = 0; t < n; ++t) {
    float* e = dtable.data() + static_cast<int64_t>(tokens[t]) * d;
    for (int64_t i = 0; i < d; ++i) e[i] += dx[t * d + i];
  }
  return Status::Ok();
}

}  // namespace sparq::train
