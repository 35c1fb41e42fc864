// Dense f32 weights run through OpenBLAS (sgemv for one token, sgemm otherwise) on a grid of
// single-threaded calls spread over the pool: OpenBLAS's own threading changes the bits with the
// thread count on every kernel family (src/core/blas_tiles.h), and the promise is the same bits
// for any thread count.

#include <algorithm>
#include <cstdio>
#include <mutex>

#include "sparq/machine.h"
#include "src/core/blas_tiles.h"
#include "src/cpu/runners.h"
#include "src/cpu/staging.h"

namespace sparq::cpu {

void RunDenseBlas(const KernelRow&, const PackedWeight& w, const SpmmArgs& a, ThreadPool* pool) {
  static std::once_flag warned;
  std::call_once(warned, [] {
    if (const char* core = SuggestedOpenBlasCore()) {
      std::fprintf(stderr, "sparq: OpenBLAS chose its %s kernels on this CPU (too new for its table): "
                   "dense f32 runs several times slower; start with OPENBLAS_CORETYPE=%s\n",
                   BlasCoreName().c_str(), core);
    }
  });
  const float* wd = w.dense().data_as<float>();
  if (w.rows > 0 && a.n > 0) {
    if (w.cols == 0) {
      for (int64_t t = 0; t < a.n; ++t) std::fill(a.y + t * a.ldy, a.y + t * a.ldy + w.rows, 0.0f);
    } else if (a.n == 1) {
      blas::SgemvTiled(w.rows, w.cols, wd, w.cols, a.x, a.y, pool);
    } else {
      blas::SgemmNTTiled(a.n, w.rows, w.cols, a.x, a.ldx, wd, w.cols, a.y, a.ldy, pool);
    }
  }
  ApplyEpilogueBlock(a.config(), a.y, a.ldy, 0, a.n, 0, w.rows, w.rows, a.ep);
}

}  // namespace sparq::cpu
