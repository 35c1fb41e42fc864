// The losses of the training fast path (src/train/fast_ops.h): cross-entropy and KL(teacher ||
// student), by blocks of rows on the pool. Per row: the log-softmax's max, f32 exponentials
// summed in double, then the gradient from the stored exponentials (one exp per logit and
// distribution, where the reference takes two or three). The loss is the double sum of the rows'
// terms in row order, whatever thread computed them.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "src/train/fast_ops.h"
#include "src/train/shape_check.h"

namespace sparq::train::fast {
namespace {

// Rows per task: a row is a whole vocabulary (49152 logits: 192 KiB), so 4 rows a task already
// amortize the hand-out, and 256 tokens make 64 tasks.
constexpr int64_t kLossRows = 4;

struct RowExp {
  float mx;    // max_v z[v] inv_tau (f32)
  double sum;  // sum_v exp(z[v] inv_tau - mx)
  double lse() const { return static_cast<double>(mx) + std::log(sum); }
};

// e[v] = exp(z[v] inv_tau - mx) (f32; e may be null: the sum only).
RowExp ExpRow(const float* z, int64_t vocab, float inv_tau, float* e) {
  float mx = -INFINITY;
  for (int64_t v = 0; v < vocab; ++v) mx = std::max(mx, z[v] * inv_tau);
  double sum = 0.0;
  if (e == nullptr) {
    for (int64_t v = 0; v < vocab; ++v) sum += std::exp(z[v] * inv_tau - mx);
  } else {
    for (int64_t v = 0; v < vocab; ++v) sum += (e[v] = std::exp(z[v] * inv_tau - mx));
  }
  return {mx, sum};
}

}  // namespace

Status CrossEntropy(std::span<const float> logits, std::span<const int32_t> targets, int64_t n,
                    int64_t vocab, double* loss, std::span<float> dlogits, ThreadPool* pool) {
  SPARQ_RETURN_IF_ERROR(CheckCrossEntropyArgs(logits, targets, n, vocab, dlogits));
  std::vector<double> row_loss(static_cast<size_t>(n));
  const double inv_n = 1.0 / static_cast<double>(n);
  ForBlocks(pool, n, kLossRows, [&](int64_t r0, int64_t r1) {
    for (int64_t t = r0; t < r1; ++t) {
      const float* z = logits.data() + t * vocab;
      // The exponentials go straight into the gradient row, then scale to softmax / n.
      float* e = dlogits.empty() ? nullptr : dlogits.data() + t * vocab;
      const RowExp r = ExpRow(z, vocab, 1.0f, e);
      row_loss[t] = r.lse() - z[targets[t]];
      if (e == nullptr) continue;
      const auto scale = static_cast<float>(inv_n / r.sum);
      for (int64_t v = 0; v < vocab; ++v) e[v] *= scale;
      e[targets[t]] -= static_cast<float>(inv_n);
    }
  });
  double total = 0.0;
  for (const double l : row_loss) total += l;
  *loss = total * inv_n;
  return Status::Ok();
}

Status KlDivergence(std::span<const float> teacher, std::span<const float> student, int64_t n,
                    int64_t vocab, double tau, double* loss, std::span<float> dstudent,
                    ThreadPool* pool) {
  SPARQ_RETURN_IF_ERROR(CheckKlArgs(teacher, student, n, vocab, tau, dstudent));
  std::vector<double> row_loss(static_cast<size_t>(n));
  // The teacher's exponentials: one row per block of rows (the block's own slot, so no thread
  // index is needed: blocks x vocab floats, a quarter of the logits).
  const int64_t blocks = (n + kLossRows - 1) / kLossRows;
  std::vector<float> ep(static_cast<size_t>(blocks * vocab));
  std::vector<float> eq(static_cast<size_t>(dstudent.empty() ? blocks * vocab : 0));
  const double inv_n = 1.0 / static_cast<double>(n), inv_tau = 1.0 / tau;
  const auto inv_tau_f = static_cast<float>(inv_tau);
  ForBlocks(pool, n, kLossRows, [&](int64_t r0, int64_t r1) {
    float* pe = ep.data() + (r0 / kLossRows) * vocab;
    for (int64_t t = r0; t < r1; ++t) {
      const float* zt = teacher.data() + t * vocab;
      const float* zs = student.data() + t * vocab;
      float* qe =
          dstudent.empty() ? eq.data() + (r0 / kLossRows) * vocab : dstudent.data() + t * vocab;
      const RowExp rp = ExpRow(zt, vocab, inv_tau_f, pe);
      const RowExp rq = ExpRow(zs, vocab, inv_tau_f, qe);
      // log p - log q = (zt - zs) / tau - lse_p + lse_q; p = pe / sum_p, q = qe / sum_q.
      const auto shift = static_cast<float>(rq.lse() - rp.lse());
      const auto ip = static_cast<float>(1.0 / rp.sum), iq = static_cast<float>(1.0 / rq.sum);
      double kl = 0.0;
      for (int64_t v = 0; v < vocab; ++v) {
        const float p = pe[v] * ip;
        if (p > 0) kl += static_cast<double>(p) * ((zt[v] - zs[v]) * inv_tau_f + shift);
      }
      row_loss[t] = kl;
      if (dstudent.empty()) continue;
      const auto scale = static_cast<float>(inv_tau * inv_n);
      for (int64_t v = 0; v < vocab; ++v) qe[v] = (qe[v] * iq - pe[v] * ip) * scale;
    }
  });
  double total = 0.0;
  for (const double l : row_loss) total += l;
  *loss = total * inv_n;
  return Status::Ok();
}

}  // namespace sparq::train::fast
