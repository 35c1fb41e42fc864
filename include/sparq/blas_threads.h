// OpenBLAS's thread count, scoped: set for a guard's lifetime, restored after it.
#pragma once

namespace sparq::blas {

// sparq's one OpenBLAS thread policy: every OpenBLAS / LAPACKE call in the library runs inside one
// of these guards, which sets OpenBLAS's (process-wide) thread count to `threads` for the guard's
// lifetime and restores the previous count on destruction, so no call leaves it changed for the
// code after it. The library's calls all use 1 (the tiled products of src/core/blas_tiles.h, SparseGPT's
// factorization, the model's prefill attention): their parallelism comes from sparq's pool, and
// OpenBLAS's own threading changes bits. The commands set no count of their own; only the
// OpenBLAS peer of `sparq bench` holds one (tools/bench_peers.cc), since its thread count is what
// it measures. Public so that applications mixing their own OpenBLAS calls use the same guard.
// Guards nest; do not create them concurrently from several threads.
class OpenBlasThreads {
 public:
  explicit OpenBlasThreads(int threads);
  ~OpenBlasThreads();
  OpenBlasThreads(const OpenBlasThreads&) = delete;
  OpenBlasThreads& operator=(const OpenBlasThreads&) = delete;

 private:
  int saved_;
};

}  // namespace sparq::blas
