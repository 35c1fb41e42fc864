// ThreadPool: one explicit pool object, passed down to whatever runs in parallel (no hidden
// globals). ParallelFor splits [0, n) into tasks that the caller defines; which thread runs which
// task may vary, so results must not depend on it: write each task's output to its own place.
#pragma once

#include <condition_variable>
#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace sparq {

class ThreadPool {
 public:
  // num_threads >= 1 counts the calling thread: ThreadPool(1) runs everything inline.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Runs fn(task, thread) for every task in [0, num_tasks); thread in [0, num_threads()).
  // Tasks are handed out dynamically (an atomic counter); the call returns when all are done.
  // Not re-entrant: fn must not call ParallelFor on the same pool.
  void ParallelFor(int64_t num_tasks, const std::function<void(int64_t task, int thread)>& fn);

  // The machine's hardware threads (hardware_concurrency(), at least 1). The library never picks
  // a thread count itself: callers pass one (the CLI honours --threads and SPARQ_NUM_THREADS).
  static int HardwareThreads();

 private:
  void WorkerLoop(int thread);
  void RunTasks(int thread);

  int num_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_start_, cv_done_;
  const std::function<void(int64_t, int)>* fn_ = nullptr;
  int64_t num_tasks_ = 0;
  std::atomic<int64_t> next_{0};
  // Written under mu_, read without it by spinning workers (generation_) and the caller (busy_).
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> busy_{0};
  bool stop_ = false;
};

}  // namespace sparq
