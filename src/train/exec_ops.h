// The ops the block and the model (block.cc, model.cc) call, on the path TrainExec picks
// (sparq/train_model.h): the reference of sparq/train_ops.h, or the fast path of fast_ops.h.
// Same signatures as the reference; the pool comes from the TrainExec.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>

#include "sparq/train_model.h"
#include "sparq/train_ops.h"
#include "src/train/fast_ops.h"

namespace sparq::train {

class ExecOps {
 public:
  explicit ExecOps(const TrainExec& e)
      : fast_(e.fast), weight_grads_(e.weight_grads), pool_(e.pool) {}
  bool fast() const { return fast_; }
  bool weight_grads() const { return weight_grads_; }
  ThreadPool* pool() const { return pool_; }

  Status RmsNormForward(std::span<const float> x, std::span<const float> g, int64_t n, int64_t d,
                        double eps, std::span<float> y) const {
    return fast_ ? fast::RmsNormForward(x, g, n, d, eps, y, pool_)
                 : train::RmsNormForward(x, g, n, d, eps, y);
  }
  Status RmsNormBackward(std::span<const float> x, std::span<const float> g,
                         std::span<const float> dy, int64_t n, int64_t d, double eps,
                         std::span<float> dx, std::span<float> dg) const {
    return fast_ ? fast::RmsNormBackward(x, g, dy, n, d, eps, dx, dg, pool_)
                 : train::RmsNormBackward(x, g, dy, n, d, eps, dx, dg);
  }
  Status SwigluForward(std::span<const float> a, std::span<const float> b,
                       std::span<float> y) const {
    return fast_ ? fast::SwigluForward(a, b, y, pool_) : train::SwigluForward(a, b, y);
  }
  Status SwigluBackward(std::span<const float> a, std::span<const float> b,
                        std::span<const float> dy, std::span<float> da, std::span<float> db) const {
    return fast_ ? fast::SwigluBackward(a, b, dy, da, db, pool_)
                 : train::SwigluBackward(a, b, dy, da, db);
  }
  Status LinearForward(std::span<const float> x, std::span<const float> w, int64_t n, int64_t k,
                       int64_t m, std::span<float> y) const {
    return fast_ ? fast::LinearForward(x, w, n, k, m, y, pool_)
                 : train::LinearForward(x, w, n, k, m, y);
  }
  Status LinearBackwardInput(std::span<const float> dy, std::span<const float> w, int64_t n,
                             int64_t k, int64_t m, std::span<float> dx) const {
    return fast_ ? fast::LinearBackwardInput(dy, w, n, k, m, dx, pool_)
                 : train::LinearBackwardInput(dy, w, n, k, m, dx);
  }
  Status LinearBackwardWeight(std::span<const float> dy, std::span<const float> x, int64_t n,
                              int64_t k, int64_t m, std::span<float> dw) const {
    return fast_ ? fast::LinearBackwardWeight(dy, x, n, k, m, dw, pool_)
                 : train::LinearBackwardWeight(dy, x, n, k, m, dw);
  }
  Status LinearBackwardWeightMasked(std::span<const float> dy, std::span<const float> x, int64_t n,
                                    int64_t k, int64_t m, std::span<const int64_t> kept,
                                    std::span<float> dw_kept) const {
    return fast_ ? fast::LinearBackwardWeightMasked(dy, x, n, k, m, kept, dw_kept, pool_)
                 : train::LinearBackwardWeightMasked(dy, x, n, k, m, kept, dw_kept);
  }
  Status RopeForward(std::span<const float> x, const RopeShape& s, std::span<float> y) const {
    return fast_ ? fast::RopeForward(x, s, y, pool_) : train::RopeForward(x, s, y);
  }
  Status RopeBackward(std::span<const float> dy, const RopeShape& s, std::span<float> dx) const {
    return fast_ ? fast::RopeBackward(dy, s, dx, pool_) : train::RopeBackward(dy, s, dx);
  }
  Status AttentionForward(std::span<const float> q, std::span<const float> k,
                          std::span<const float> v, const AttentionShape& s,
                          std::span<float> out) const {
    return fast_ ? fast::AttentionForward(q, k, v, s, out, pool_)
                 : train::AttentionForward(q, k, v, s, out);
  }
  Status AttentionBackward(std::span<const float> q, std::span<const float> k,
                           std::span<const float> v, std::span<const float> dout,
                           const AttentionShape& s, std::span<float> dq, std::span<float> dk,
                           std::span<float> dv) const {
    return fast_ ? fast::AttentionBackward(q, k, v, dout, s, dq, dk, dv, pool_)
                 : train::AttentionBackward(q, k, v, dout, s, dq, dk, dv);
  }
  Status CrossEntropy(std::span<const float> logits, std::span<const int32_t> targets, int64_t n,
                      int64_t vocab, double* loss, std::span<float> dlogits) const {
    return fast_ ? fast::CrossEntropy(logits, targets, n, vocab, loss, dlogits, pool_)
                 : train::CrossEntropy(logits, targets, n, vocab, loss, dlogits);
  }
  Status KlDivergence(std::span<const float> teacher, std::span<const float> student, int64_t n,
                      int64_t vocab, double tau, double* loss, std::span<float> dstudent) const {
    return fast_ ? fast::KlDivergence(teacher, student, n, vocab, tau, loss, dstudent, pool_)
                 : train::KlDivergence(teacher, student, n, vocab, tau, loss, dstudent);
  }

 private:
  bool fast_;
  bool weight_grads_;
  ThreadPool* pool_;
};

// Adds the scope's wall time to *slot (null: nothing is timed).
class ScopedTimer {
 public:
  explicit ScopedTimer(double* slot)
      : slot_(slot), t0_(slot ? std::chrono::steady_clock::now() : Clock::time_point()) {}
  ~ScopedTimer() {
    if (slot_ != nullptr) {
      *slot_ += std::chrono::duration<double>(Clock::now() - t0_).count();
    }
  }
  ScopedTimer(const ScopedTimer&) = delete;
  ScopedTimer& operator=(const ScopedTimer&) = delete;

 private:
  using Clock = std::chrono::steady_clock;
  double* slot_;
  Clock::time_point t0_;
};

// The slot of *timers a field names, or null when timers is null.
inline double* TimerSlot(TrainTimers* timers, double TrainTimers::*field) {
  return timers != nullptr ? &(timers->*field) : nullptr;
}

}  // namespace sparq::train
