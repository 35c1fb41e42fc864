// Causal grouped-query softmax attention, forward and backward, one query row at a time:
// scores in double, the softmax recomputed in the backward (nothing kept from the forward).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "sparq/train_ops.h"
#include "src/train/shape_check.h"

namespace sparq::train {

Status CheckAttention(const char* op, const AttentionShape& s, std::span<const float> q,
                      std::span<const float> k, std::span<const float> v) {
  if (s.n_head <= 0 || s.n_kv <= 0 || s.n_head % s.n_kv != 0 || s.hd <= 0 || s.t < 0) {
    return InvalidInput(std::string(op) + ": n_head " + std::to_string(s.n_head) +
                        " must be a positive multiple of n_kv " + std::to_string(s.n_kv) + ", hd " +
                        std::to_string(s.hd) + " positive, t >= 0");
  }
  SPARQ_RETURN_IF_ERROR(CheckSize(op, "q", q, {s.t, s.n_head, s.hd}));
  SPARQ_RETURN_IF_ERROR(CheckSize(op, "k", k, {s.t, s.n_kv, s.hd}));
  return CheckSize(op, "v", v, {s.t, s.n_kv, s.hd});
}
namespace {

// p[j] = softmax_j(scale q_i . k_j), j <= i, for query head h (row q_row) over KV head g.
void RowSoftmax(const float* q_row, const float* k, int64_t i, int64_t g, int64_t kvd, int64_t hd,
                double scale, std::vector<double>* p) {
  double mx = -INFINITY;
  for (int64_t j = 0; j <= i; ++j) {
    const float* kj = k + j * kvd + g * hd;
    double dot = 0.0;
    for (int64_t e = 0; e < hd; ++e) dot += static_cast<double>(q_row[e]) * kj[e];
    (*p)[j] = scale * dot;
    mx = std::max(mx, (*p)[j]);
  }
  double sum = 0.0;
  for (int64_t j = 0; j <= i; ++j) sum += ((*p)[j] = std::exp((*p)[j] - mx));
  for (int64_t j = 0; j <= i; ++j) (*p)[j] /= sum;
}

}  // namespace

Status AttentionForward(std::span<const float> q, std::span<const float> k,
                        std::span<const float> v, const AttentionShape& s, std::span<float> out) {
  SPARQ_RETURN_IF_ERROR(CheckAttention("AttentionForward", s, q, k, v));
  SPARQ_RETURN_IF_ERROR(CheckSize("AttentionForward", "out", out, {s.t, s.n_head, s.hd}));
  const int64_t hd = s.hd, qd = s.n_head * hd, kvd = s.n_kv * hd, group = s.n_head / s.n_kv;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  std::vector<double> p(static_cast<size_t>(s.t)), o(static_cast<size_t>(hd));
  for (int64_t h = 0; h < s.n_head; ++h) {
    const int64_t g = h / group;
    for (int64_t i = 0; i < s.t; ++i) {
      RowSoftmax(q.data() + i * qd + h * hd, k.data(), i, g, kvd, hd, scale, &p);
      std::fill(o.begin(), o.end(), 0.0);
      for (int64_t j = 0; j <= i; ++j) {
        const float* vj = v.data() + j * kvd + g * hd;
        for (int64_t e = 0; e < hd; ++e) o[e] += p[j] * vj[e];
      }
      for (int64_t e = 0; e < hd; ++e) out[i * qd + h * hd + e] = static_cast<float>(o[e]);
    }
  }
  return Status::Ok();
}

// Per query row i of head h (P the softmax row, dO_i the output gradient):
//   dv_j += p_j dO_i;  dp_j = dO_i . v_j;  ds_j = p_j (dp_j - sum_l p_l dp_l);
//   dq_i = scale sum_j ds_j k_j;  dk_j += scale ds_j q_i.
Status AttentionBackward(std::span<const float> q, std::span<const float> k,
                         std::span<const float> v, std::span<const float> dout,
                         const AttentionShape& s, std::span<float> dq, std::span<float> dk,
                         std::span<float> dv) {
  constexpr const char* kOp = "AttentionBackward";
  SPARQ_RETURN_IF_ERROR(CheckAttention(kOp, s, q, k, v));
  SPARQ_RETURN_IF_ERROR(CheckSize(kOp, "dout", dout, {s.t, s.n_head, s.hd}));
  SPARQ_RETURN_IF_ERROR(CheckSize(kOp, "dq", dq, {s.t, s.n_head, s.hd}));
  SPARQ_RETURN_IF_ERROR(CheckSize(kOp, "dk", dk, {s.t, s.n_kv, s.hd}));
  SPARQ_RETURN_IF_ERROR(CheckSize(kOp, "dv", dv, {s.t, s.n_kv, s.hd}));
  const int64_t hd = s.hd, qd = s.n_head * hd, kvd = s.n_kv * hd, group = s.n_head / s.n_kv;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  // dk, dv sum over every query row and every head of the group: double accumulators.
  std::vector<double> dk_acc(dk.size(), 0.0), dv_acc(dv.size(), 0.0);
  std::vector<double> p(static_cast<size_t>(s.t)), dp(static_cast<size_t>(s.t));
  std::vector<double> dqi(static_cast<size_t>(hd));
  for (int64_t h = 0; h < s.n_head; ++h) {
    const int64_t g = h / group;
    for (int64_t i = 0; i < s.t; ++i) {
      const float* qi = q.data() + i * qd + h * hd;
      const float* doi = dout.data() + i * qd + h * hd;
      RowSoftmax(qi, k.data(), i, g, kvd, hd, scale, &p);
      double pdp = 0.0;
      for (int64_t j = 0; j <= i; ++j) {
        const float* vj = v.data() + j * kvd + g * hd;
        double* dvj = dv_acc.data() + j * kvd + g * hd;
        double acc = 0.0;
        for (int64_t e = 0; e < hd; ++e) {
          acc += static_cast<double>(doi[e]) * vj[e];
          dvj[e] += p[j] * doi[e];
        }
        dp[j] = acc;
        pdp += p[j] * acc;
      }
      std::fill(dqi.begin(), dqi.end(), 0.0);
      for (int64_t j = 0; j <= i; ++j) {
        const double ds = scale * p[j] * (dp[j] - pdp);
        const float* kj = k.data() + j * kvd + g * hd;
        double* dkj = dk_acc.data() + j * kvd + g * hd;
        for (int64_t e = 0; e < hd; ++e) {
          dqi[e] += ds * kj[e];
          dkj[e] += ds * qi[e];
        }
      }
      for (int64_t e = 0; e < hd; ++e) dq[i * qd + h * hd + e] = static_cast<float>(dqi[e]);
    }
  }
  for (size_t i = 0; i < dk.size(); ++i) dk[i] = static_cast<float>(dk_acc[i]);
  for (size_t i = 0; i < dv.size(); ++i) dv[i] = static_cast<float>(dv_acc[i]);
  return Status::Ok();
}

}  // namespace sparq::train
