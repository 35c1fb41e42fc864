// The Llama forward ops and their backward, in f32 with plain loops: the reference math of
// sparq's training (issue 28). Every tensor is row-major and contiguous; shapes are given in
// the comments as [rows, cols] and checked against the spans' sizes: a mismatch (or a token /
// target id out of range) returns kInvalidInput naming the op and the operand, never a crash.
//
// Conventions of the backward entries:
//   - gradients of activations (dx, da, dq ...) are *written* (overwritten);
//   - gradients of parameters (dg, dW, dE) are *accumulated* (+=), so a caller sums them over
//     micro-batches or over the query heads that share a KV head without a copy.
// Long sums (over a row of d, over tokens, over keys) accumulate in double.
// Matrices in the BLAS names of the linear layers: Y[n, m] = X[n, k] W[m, k]^T with n tokens,
// k input features and m output features (W as stored in the model: one output row per line).
#pragma once

#include <cstdint>
#include <span>

#include "sparq/status.h"

namespace sparq::train {

// ---- RMSNorm: y = x / sqrt(mean(x^2) + eps) * g, per row ------------------------------------
// x, y, dy, dx [n, d]; g, dg [d]. As the model's forward (src/model/llama_forward.cc RmsNorm).
Status RmsNormForward(std::span<const float> x, std::span<const float> g, int64_t n, int64_t d,
                      double eps, std::span<float> y);
// dx = r (dy*g - xhat * mean(dy*g*xhat)) with r = 1/sqrt(mean(x^2)+eps), xhat = x r;
// dg += sum over rows of dy * xhat.
Status RmsNormBackward(std::span<const float> x, std::span<const float> g,
                       std::span<const float> dy, int64_t n, int64_t d, double eps,
                       std::span<float> dx, std::span<float> dg);

// ---- SwiGLU: y = silu(a) * b, elementwise (a = gate, b = up) ----------------------------------
// a, b, y, dy, da, db: `count` elements each.
Status SwigluForward(std::span<const float> a, std::span<const float> b, std::span<float> y);
// da = dy * b * silu'(a), silu'(a) = s (1 + a (1 - s)) with s = sigmoid(a); db = dy * silu(a).
Status SwigluBackward(std::span<const float> a, std::span<const float> b, std::span<const float> dy,
                      std::span<float> da, std::span<float> db);

// ---- Linear: Y[n, m] = X[n, k] W[m, k]^T -------------------------------------------------------
Status LinearForward(std::span<const float> x, std::span<const float> w, int64_t n, int64_t k,
                     int64_t m, std::span<float> y);
// dX[n, k] = dY[n, m] W[m, k] (written).
Status LinearBackwardInput(std::span<const float> dy, std::span<const float> w, int64_t n,
                           int64_t k, int64_t m, std::span<float> dx);
// dW[m, k] += dY[n, m]^T X[n, k] (dense dW: the mask may move).
Status LinearBackwardWeight(std::span<const float> dy, std::span<const float> x, int64_t n,
                            int64_t k, int64_t m, std::span<float> dw);
// The masked SDDMM form (the mask is fixed): dw_kept[i] += sum_t dY[t, r] X[t, c] for the kept
// weight kept[i] = r * k + c (flat index into W[m, k]; any order, each in [0, m*k)).
Status LinearBackwardWeightMasked(std::span<const float> dy, std::span<const float> x, int64_t n,
                                  int64_t k, int64_t m, std::span<const int64_t> kept,
                                  std::span<float> dw_kept);

// ---- RoPE: sparq's (llama.cpp's NORM type) ----------------------------------------------------
// x [n, heads * hd]: in each head, the adjacent pairs (2i, 2i+1), i < rope_dim / 2, rotate by
// angle (pos0 + row) * theta^(-2i / rope_dim); dims from rope_dim on pass through. cos and sin
// are computed in double and rounded to f32, as the model's RopeTable does.
struct RopeShape {
  int64_t n = 0;         // rows (tokens)
  int64_t heads = 0;     // heads in a row
  int64_t hd = 0;        // head dimension
  int64_t rope_dim = 0;  // rotated dims of a head: even, in [2, hd]
  int64_t pos0 = 0;      // position of row 0
  double theta = 10000.0;
};
Status RopeForward(std::span<const float> x, const RopeShape& s, std::span<float> y);
// The rotation is orthogonal: dx = R^T dy (rotation by the negative angle).
Status RopeBackward(std::span<const float> dy, const RopeShape& s, std::span<float> dx);

// ---- Causal grouped-query softmax attention ---------------------------------------------------
// q, out [t, n_head * hd]; k, v [t, n_kv * hd]; query head h reads KV head h / (n_head / n_kv).
// out_i = sum_{j <= i} softmax_j(scale q_i . k_j) v_j with scale = 1/sqrt(hd); positions 0..t-1.
struct AttentionShape {
  int64_t t = 0;       // tokens
  int64_t n_head = 0;  // query heads
  int64_t n_kv = 0;    // KV heads: divides n_head
  int64_t hd = 0;      // head dimension
};
Status AttentionForward(std::span<const float> q, std::span<const float> k,
                        std::span<const float> v, const AttentionShape& s, std::span<float> out);
// dq (written), dk, dv (written: the sum over the query heads of each KV head). The softmax is
// recomputed from q and k (nothing is kept from the forward).
Status AttentionBackward(std::span<const float> q, std::span<const float> k,
                         std::span<const float> v, std::span<const float> dout,
                         const AttentionShape& s, std::span<float> dq, std::span<float> dk,
                         std::span<float> dv);

// ---- Losses: forward and backward in one call -------------------------------------------------
// Cross-entropy of logits [n, vocab] against targets [n] (ids in [0, vocab)), mean over the n
// tokens: *loss = mean_t (logsumexp(logits_t) - logits_t[target_t]);
// dlogits [n, vocab] = (softmax(logits_t) - onehot(target_t)) / n, written (empty: loss only).
Status CrossEntropy(std::span<const float> logits, std::span<const int32_t> targets, int64_t n,
                    int64_t vocab, double* loss, std::span<float> dlogits);
// KL(teacher || student) at temperature tau > 0, mean over the n tokens, with p = softmax(t/tau),
// q = softmax(s/tau): *loss = mean_t sum_v p (log p - log q); dstudent [n, vocab] =
// (q - p) / (tau n), written (empty: loss only). No tau^2 factor (Hinton's): the caller scales.
Status KlDivergence(std::span<const float> teacher, std::span<const float> student, int64_t n,
                    int64_t vocab, double tau, double* loss, std::span<float> dstudent);

// SquareHead's per-layer term (Kurtic et al. 2023, "Sparse Fine-tuning for Inference
// Acceleration of Large Language Models", arXiv:2310.06927, Sec. 3): the MSE of the student's
// features s against the teacher's t, normalized by the MSE of t against 0, so that every layer
// weighs the same whatever its activations' scale. Over `count` = s.size() = t.size() elements:
//   *loss = sum_i (s_i - t_i)^2 / sum_i t_i^2     (the 1/count of both means cancels)
// ds = scale * 2 (s - t) / sum_i t_i^2, written (empty: loss only). Errors: sizes that differ,
// no elements, a teacher that is all zeros (the normalizer would be 0).
Status NormalizedMse(std::span<const float> s, std::span<const float> t, double scale, double* loss,
                     std::span<float> ds);

// ---- Embedding: x[t, :] = E[token_t, :] -------------------------------------------------------
// table [vocab, d], tokens [n] (ids in [0, vocab)), x / dx [n, d].
Status EmbeddingForward(std::span<const float> table, std::span<const int32_t> tokens,
                        int64_t vocab, int64_t d, std::span<float> x);
// dE[token_t, :] += dx[t, :] (scatter-add: a token seen twice gets both rows).
Status EmbeddingBackward(std::span<const float> dx, std::span<const int32_t> tokens, int64_t vocab,
                         int64_t d, std::span<float> dtable);

}  // namespace sparq::train
