#include "sparq/thread_pool.h"

#include <sched.h>

#include <chrono>

namespace sparq {
namespace {

// Before sleeping on a condition variable, a waiting thread polls for up to this long, yielding the
// core between polls. A model's decode step makes ~200 parallel calls of 20-100 us each; waking a
// sleeping worker through a futex costs tens of microseconds on a VM, about as much as the call
// itself, and made 2-thread sparse decode barely faster than 1 thread. sched_yield hands the core
// to any other runnable thread (OpenBLAS's workers, another process), so polling costs no one a
// time slice.
constexpr auto kSpin = std::chrono::microseconds(200);

template <typename Ready>
bool SpinUntil(Ready ready) {
  const auto until = std::chrono::steady_clock::now() + kSpin;
  for (int i = 0;; ++i) {
    if (ready()) return true;
    if ((i & 15) == 15 && std::chrono::steady_clock::now() > until) return false;
    sched_yield();
  }
}

}  // namespace

ThreadPool::ThreadPool(int num_threads) : num_threads_(num_threads < 1 ? 1 : num_threads) {
  workers_.reserve(num_threads_ - 1);
  for (int t = 1; t < num_threads_; ++t) workers_.emplace_back([this, t] { WorkerLoop(t); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_start_.notify_all();
  for (auto& w : workers_) w.join();
}

int ThreadPool::HardwareThreads() {
  const unsigned hc = std::thread::hardware_concurrency();
  return hc == 0 ? 1 : static_cast<int>(hc);
}

void ThreadPool::RunTasks(int thread) {
  for (;;) {
    const int64_t task = next_.fetch_add(1, std::memory_order_relaxed);
    if (task >= num_tasks_) break;
    (*fn_)(task, thread);
  }
}

void ThreadPool::WorkerLoop(int thread) {
  uint64_t seen = 0;
  for (;;) {
    SpinUntil([&] { return generation_.load(std::memory_order_acquire) != seen; });
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_start_.wait(lock, [&] { return stop_ || generation_.load() != seen; });
      if (stop_) return;
      seen = generation_.load();
    }
    RunTasks(thread);
    if (busy_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      // Taking the lock orders this notify after a caller's predicate check: no lost wake-up.
      { std::lock_guard<std::mutex> lock(mu_); }
      cv_done_.notify_one();
    }
  }
}

void ThreadPool::ParallelFor(int64_t num_tasks,
                             const std::function<void(int64_t task, int thread)>& fn) {
  if (num_tasks <= 0) return;
  if (num_threads_ == 1 || num_tasks == 1) {
    for (int64_t t = 0; t < num_tasks; ++t) fn(t, 0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    num_tasks_ = num_tasks;
    next_.store(0, std::memory_order_relaxed);
    busy_.store(num_threads_ - 1);
    generation_.fetch_add(1, std::memory_order_release);
  }
  cv_start_.notify_all();
  RunTasks(0);
  if (!SpinUntil([&] { return busy_.load(std::memory_order_acquire) == 0; })) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_done_.wait(lock, [&] { return busy_.load() == 0; });
  }
  std::lock_guard<std::mutex> lock(mu_);
  fn_ = nullptr;
}

}  // namespace sparq
