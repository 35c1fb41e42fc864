// An independent f64 forward of the whole Llama model (embedding, blocks, final RMSNorm, tied
// head) and of its training loss, written from the math (no train op or model code is called):
// the reference that the f32 block / model backward is checked against by finite differences.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "sparq/model.h"
#include "sparq/train_model.h"
#include "tests/train/train_testutil.h"

namespace sparq::train::testing {

using Vec64 = std::vector<double>;

struct Block64 {
  Vec64 attn_norm, ffn_norm;
  std::array<Vec64, kNumSlots> w;
};
struct Model64 {
  Vec64 embd, out_norm;
  std::vector<Block64> blocks;
};

inline Vec64 To64(const std::vector<float>& v) { return Vec64(v.begin(), v.end()); }

inline Model64 ToModel64(const ModelWeights& w) {
  Model64 m{To64(w.token_embd), To64(w.output_norm), {}};
  for (const BlockWeights& b : w.blocks) {
    Block64 b64{To64(b.attn_norm), To64(b.ffn_norm), {}};
    for (int s = 0; s < kNumSlots; ++s) b64.w[s] = To64(b.linear[s]);
    m.blocks.push_back(std::move(b64));
  }
  return m;
}

// y[t, :] = x[t, :] / sqrt(mean(x[t, :]^2) + eps) * g
inline Vec64 RmsNorm64(const Vec64& x, const Vec64& g, int64_t n, int64_t d, double eps) {
  Vec64 y(x.size());
  for (int64_t t = 0; t < n; ++t) {
    double ms = 0.0;
    for (int64_t i = 0; i < d; ++i) ms += x[t * d + i] * x[t * d + i] / d;
    for (int64_t i = 0; i < d; ++i) y[t * d + i] = x[t * d + i] / std::sqrt(ms + eps) * g[i];
  }
  return y;
}

// Y[n, m] = X[n, k] W[m, k]^T
inline Vec64 Matmul64(const Vec64& x, const Vec64& w, int64_t n, int64_t k, int64_t m) {
  Vec64 y(static_cast<size_t>(n * m), 0.0);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < k; ++c) y[t * m + r] += x[t * k + c] * w[r * k + c];
  return y;
}

// Each head's pairs (2i, 2i+1), i < rope_dim / 2, rotate by t * theta^(-2i / rope_dim).
inline void Rope64(Vec64* x, int64_t n, int64_t heads, const LlamaConfig& c) {
  const int64_t hd = c.head_dim();
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < c.rope_dim / 2; ++i) {
        const double a = t * std::pow(c.rope_theta, -2.0 * i / c.rope_dim);
        double* p = x->data() + (t * heads + h) * hd + 2 * i;
        const double x0 = p[0], x1 = p[1];
        p[0] = x0 * std::cos(a) - x1 * std::sin(a);
        p[1] = x0 * std::sin(a) + x1 * std::cos(a);
      }
}

// x [n, d] -> the block's output.
inline Vec64 Block64Forward(const LlamaConfig& c, const Block64& b, const Vec64& x, int64_t n) {
  const int64_t d = c.n_embd, hd = c.head_dim(), kvd = c.kv_dim(), f = c.n_ff;
  const int64_t group = c.n_head / c.n_head_kv;
  auto W = [&](LinearSlot s) -> const Vec64& { return b.w[static_cast<int>(s)]; };
  const Vec64 n1 = RmsNorm64(x, b.attn_norm, n, d, c.rms_eps);
  Vec64 q = Matmul64(n1, W(LinearSlot::kQ), n, d, d);
  Vec64 k = Matmul64(n1, W(LinearSlot::kK), n, d, kvd);
  const Vec64 v = Matmul64(n1, W(LinearSlot::kV), n, d, kvd);
  Rope64(&q, n, c.n_head, c);
  Rope64(&k, n, c.n_head_kv, c);
  Vec64 att(static_cast<size_t>(n * d), 0.0);
  for (int64_t h = 0; h < c.n_head; ++h) {
    const int64_t g = h / group;
    for (int64_t i = 0; i < n; ++i) {
      Vec64 e(static_cast<size_t>(i + 1));
      for (int64_t j = 0; j <= i; ++j) {
        double dot = 0.0;
        for (int64_t u = 0; u < hd; ++u) dot += q[i * d + h * hd + u] * k[j * kvd + g * hd + u];
        e[j] = dot / std::sqrt(static_cast<double>(hd));
      }
      const double mx = *std::max_element(e.begin(), e.end());
      double z = 0.0;
      for (double& s : e) z += (s = std::exp(s - mx));
      for (int64_t j = 0; j <= i; ++j)
        for (int64_t u = 0; u < hd; ++u)
          att[i * d + h * hd + u] += e[j] / z * v[j * kvd + g * hd + u];
    }
  }
  Vec64 hidden = Matmul64(att, W(LinearSlot::kO), n, d, d);
  for (size_t i = 0; i < hidden.size(); ++i) hidden[i] += x[i];
  const Vec64 n2 = RmsNorm64(hidden, b.ffn_norm, n, d, c.rms_eps);
  const Vec64 a = Matmul64(n2, W(LinearSlot::kGate), n, d, f);
  const Vec64 u = Matmul64(n2, W(LinearSlot::kUp), n, d, f);
  Vec64 act(a.size());
  for (size_t i = 0; i < a.size(); ++i) act[i] = a[i] / (1.0 + std::exp(-a[i])) * u[i];
  Vec64 y = Matmul64(act, W(LinearSlot::kDown), n, f, d);
  for (size_t i = 0; i < y.size(); ++i) y[i] += hidden[i];
  return y;
}

// logits [n, n_vocab] of ids [n].
inline Vec64 Logits64(const LlamaConfig& c, const Model64& m, std::span<const int32_t> ids) {
  const auto n = static_cast<int64_t>(ids.size());
  const int64_t d = c.n_embd;
  Vec64 x(static_cast<size_t>(n * d));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < d; ++i) x[t * d + i] = m.embd[ids[t] * d + i];
  for (const Block64& b : m.blocks) x = Block64Forward(c, b, x, n);
  return Matmul64(RmsNorm64(x, m.out_norm, n, d, c.rms_eps), m.embd, n, d, c.n_vocab);
}

// log softmax of z[0..v) / tau
inline Vec64 LogSoftmax64(const double* z, int64_t v, double tau) {
  Vec64 l(z, z + v);
  for (double& x : l) x /= tau;
  const double mx = *std::max_element(l.begin(), l.end());
  double s = 0.0;
  for (double x : l) s += std::exp(x - mx);
  for (double& x : l) x -= mx + std::log(s);
  return l;
}

// ce_w * mean CE(next tokens) + kl_w * mean KL(teacher || student at tau); tokens [n + 1].
inline double Loss64(const LlamaConfig& c, const Model64& m, std::span<const int32_t> tokens,
                     double ce_w, double kl_w, double tau, std::span<const float> teacher) {
  const auto n = static_cast<int64_t>(tokens.size()) - 1;
  const int64_t vocab = c.n_vocab;
  const Vec64 logits = Logits64(c, m, tokens.first(n));
  double ce = 0.0, kl = 0.0;
  for (int64_t t = 0; t < n; ++t) {
    ce -= LogSoftmax64(&logits[t * vocab], vocab, 1.0)[tokens[t + 1]];
    if (kl_w == 0) continue;
    const Vec64 tz(teacher.begin() + t * vocab, teacher.begin() + (t + 1) * vocab);
    const Vec64 lp = LogSoftmax64(tz.data(), vocab, tau);
    const Vec64 lq = LogSoftmax64(&logits[t * vocab], vocab, tau);
    for (int64_t v = 0; v < vocab; ++v) kl += std::exp(lp[v]) * (lp[v] - lq[v]);
  }
  return ce_w * ce / n + kl_w * kl / n;
}

// One tensor of the model: its name, its f64 copy (perturbed by the FD) and its f32 gradient.
struct TensorRef {
  std::string name;
  Vec64* param;
  const std::vector<float>* grad;
};

inline std::vector<TensorRef> Tensors(Model64* m, const ModelWeights& g) {
  std::vector<TensorRef> t = {{"token_embd", &m->embd, &g.token_embd},
                              {"output_norm", &m->out_norm, &g.output_norm}};
  for (size_t l = 0; l < m->blocks.size(); ++l) {
    const std::string blk = "blk." + std::to_string(l) + ".";
    t.push_back({blk + "attn_norm", &m->blocks[l].attn_norm, &g.blocks[l].attn_norm});
    t.push_back({blk + "ffn_norm", &m->blocks[l].ffn_norm, &g.blocks[l].ffn_norm});
    for (int s = 0; s < kNumSlots; ++s) {
      t.push_back({blk + std::string(SlotName(static_cast<LinearSlot>(s))), &m->blocks[l].w[s],
                   &g.blocks[l].linear[s]});
    }
  }
  return t;
}

// Central differences of loss64 at up to `samples` entries of each tensor (picked by `pick`)
// against the f32 gradients, within `tol` (ExpectGradNear).
template <class Loss>
void ExpectFdGradients(std::span<const TensorRef> tensors, Loss loss64, double step, int samples,
                       double tol, std::mt19937_64* pick) {
  for (const TensorRef& t : tensors) {
    std::vector<size_t> idx(t.param->size());
    std::iota(idx.begin(), idx.end(), size_t{0});
    std::shuffle(idx.begin(), idx.end(), *pick);
    idx.resize(std::min<size_t>(idx.size(), static_cast<size_t>(samples)));
    std::vector<float> got;
    Vec64 fd;
    for (size_t i : idx) {
      const double x0 = (*t.param)[i];
      (*t.param)[i] = x0 + step;
      const double lp = loss64();
      (*t.param)[i] = x0 - step;
      const double lm = loss64();
      (*t.param)[i] = x0;
      fd.push_back((lp - lm) / (2 * step));
      got.push_back((*t.grad)[i]);
    }
    ExpectGradNear(t.name.c_str(), got, fd, tol);
  }
}
}  // namespace sparq::train::testing
