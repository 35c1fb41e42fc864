// The training losses, forward and backward in one pass: on logits, cross-entropy against
// target ids and KL(teacher || student) at a temperature (log-softmax in double per row); on
// hidden states, SquareHead's normalized MSE (sums in double).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "sparq/train_ops.h"
#include "src/train/shape_check.h"

namespace sparq::train {
namespace {

// logp[v] = z[v] * inv_tau - logsumexp(z * inv_tau) of one row, in double.
void LogSoftmax(const float* z, int64_t vocab, double inv_tau, double* logp) {
  double mx = -INFINITY;
  for (int64_t v = 0; v < vocab; ++v) mx = std::max(mx, z[v] * inv_tau);
  double sum = 0.0;
  for (int64_t v = 0; v < vocab; ++v) sum += std::exp(z[v] * inv_tau - mx);
  const double lse = mx + std::log(sum);
  for (int64_t v = 0; v < vocab; ++v) logp[v] = z[v] * inv_tau - lse;
}

}  // namespace

Status CheckCrossEntropyArgs(std::span<const float> logits, std::span<const int32_t> targets,
                             int64_t n, int64_t vocab, std::span<const float> dlogits) {
  constexpr const char* kOp = "CrossEntropy";
  if (n <= 0 || vocab <= 0) {
    return InvalidInput(std::string(kOp) + ": needs n > 0 tokens and vocab > 0, got n = " +
                        std::to_string(n) + ", vocab = " + std::to_string(vocab));
  }
  SPARQ_RETURN_IF_ERROR(CheckSize(kOp, "logits", logits, {n, vocab}));
  SPARQ_RETURN_IF_ERROR(CheckSize(kOp, "targets", targets, {n}));
  if (!dlogits.empty()) SPARQ_RETURN_IF_ERROR(CheckSize(kOp, "dlogits", dlogits, {n, vocab}));
  return CheckIds(kOp, "targets", targets, vocab);
}

Status CheckKlArgs(std::span<const float> teacher, std::span<const float> student, int64_t n,
                   int64_t vocab, double tau, std::span<const float> dstudent) {
  constexpr const char* kOp = "KlDivergence";
  if (n <= 0 || vocab <= 0 || !(tau > 0) || !std::isfinite(tau)) {
    return InvalidInput(std::string(kOp) + ": needs n > 0 tokens, vocab > 0 and a finite " +
                        "temperature > 0, got n = " + std::to_string(n) +
                        ", vocab = " + std::to_string(vocab) + ", tau = " + std::to_string(tau));
  }
  SPARQ_RETURN_IF_ERROR(CheckSize(kOp, "teacher", teacher, {n, vocab}));
  SPARQ_RETURN_IF_ERROR(CheckSize(kOp, "student", student, {n, vocab}));
  if (!dstudent.empty()) SPARQ_RETURN_IF_ERROR(CheckSize(kOp, "dstudent", dstudent, {n, vocab}));
  return Status::Ok();
}

Status CrossEntropy(std::span<const float> logits, std::span<const int32_t> targets, int64_t n,
                    int64_t vocab, double* loss, std::span<float> dlogits) {
  SPARQ_RETURN_IF_ERROR(CheckCrossEntropyArgs(logits, targets, n, vocab, dlogits));
  std::vector<double> logp(static_cast<size_t>(vocab));
  double total = 0.0;
  const double inv_n = 1.0 / static_cast<double>(n);
  for (int64_t t = 0; t < n; ++t) {
    LogSoftmax(logits.data() + t * vocab, vocab, 1.0, logp.data());
    total -= logp[targets[t]];
    if (dlogits.empty()) continue;
    float* d = dlogits.data() + t * vocab;
    for (int64_t v = 0; v < vocab; ++v) {
      d[v] = static_cast<float>((std::exp(logp[v]) - (v == targets[t] ? 1.0 : 0.0)) * inv_n);
    }
  }
  *loss = total * inv_n;
  return Status::Ok();
}

Status KlDivergence(std::span<const float> teacher, std::span<const float> student, int64_t n,
                    int64_t vocab, double tau, double* loss, std::span<float> dstudent) {
  SPARQ_RETURN_IF_ERROR(CheckKlArgs(teacher, student, n, vocab, tau, dstudent));
  std::vector<double> logp(static_cast<size_t>(vocab)), logq(static_cast<size_t>(vocab));
  double total = 0.0;
  const double inv_n = 1.0 / static_cast<double>(n), inv_tau = 1.0 / tau;
  for (int64_t t = 0; t < n; ++t) {
    LogSoftmax(teacher.data() + t * vocab, vocab, inv_tau, logp.data());
    LogSoftmax(student.data() + t * vocab, vocab, inv_tau, logq.data());
    for (int64_t v = 0; v < vocab; ++v) {
      const double p = std::exp(logp[v]);
      if (p > 0) total += p * (logp[v] - logq[v]);  // 0 log 0 = 0
    }
    if (dstudent.empty()) continue;
    float* d = dstudent.data() + t * vocab;
    for (int64_t v = 0; v < vocab; ++v) {
      d[v] = static_cast<float>((std::exp(logq[v]) - std::exp(logp[v])) * inv_tau * inv_n);
    }
  }
  *loss = total * inv_n;
  return Status::Ok();
}

Status NormalizedMse(std::span<const float> s, std::span<const float> t, double scale, double* loss,
                     std::span<float> ds) {
  constexpr const char* kOp = "NormalizedMse";
  if (s.empty() || s.size() != t.size() || (!ds.empty() && ds.size() != s.size())) {
    return InvalidInput(std::string(kOp) + ": student " + std::to_string(s.size()) + ", teacher " +
                        std::to_string(t.size()) + " and ds " + std::to_string(ds.size()) +
                        " elements: needs equal, nonzero sizes");
  }
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < s.size(); ++i) {
    const double e = static_cast<double>(s[i]) - t[i];
    diff += e * e;
    norm += static_cast<double>(t[i]) * t[i];
  }
  if (!(norm > 0) || !std::isfinite(norm)) {
    return InvalidInput(std::string(kOp) + ": the teacher's sum of squares is " +
                        std::to_string(norm) + " (needs finite > 0: it normalizes the loss)");
  }
  *loss = diff / norm;
  if (ds.empty()) return Status::Ok();
  const double k = 2.0 * scale / norm;
  for (size_t i = 0; i < s.size(); ++i) {
    ds[i] = static_cast<float>(k * (static_cast<double>(s[i]) - t[i]));
  }
  return Status::Ok();
}

}  // namespace sparq::train
