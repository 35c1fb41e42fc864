// Dense f32 weights run through OpenBLAS (sgemv for one token, sgemm otherwise); the pool's
// thread count is OpenBLAS's for the call.
#include <cblas.h>

#include <algorithm>
#include <cstdio>
#include <mutex>

#include "sparq/machine.h"
#include "src/cpu/runners.h"
#include "src/cpu/staging.h"

namespace sparq::cpu {

void RunDenseBlas(const PackedWeight& w, const SpmmArgs& a, ThreadPool* pool) {
  static std::once_flag warned;
  std::call_once(warned, [] {
    if (const char* core = SuggestedOpenBlasCore()) {
      std::fprintf(stderr, "sparq: OpenBLAS chose its %s kernels on this CPU (too new for its table): "
                   "dense f32 runs several times slower; start with OPENBLAS_CORETYPE=%s\n",
                   BlasCoreName().c_str(), core);
    }
  });
  const int threads = pool ? pool->num_threads() : 1;
  openblas_set_num_threads(threads);  // process-global: the last caller's count wins
  const float* wd = w.dense.data_as<float>();
  if (w.rows > 0 && a.n > 0) {
    if (w.cols == 0) {
      for (int64_t t = 0; t < a.n; ++t) std::fill(a.y + t * a.ldy, a.y + t * a.ldy + w.rows, 0.0f);
    } else if (a.n == 1) {
      cblas_sgemv(CblasRowMajor, CblasNoTrans, w.rows, w.cols, 1.0f, wd, w.cols, a.x, 1, 0.0f,
                  a.y, 1);
    } else {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, a.n, w.rows, w.cols, 1.0f, a.x, a.ldx,
                  wd, w.cols, 0.0f, a.y, a.ldy);
    }
  }
  ApplyEpilogueBlock(a.config(), a.y, a.ldy, 0, a.n, 0, w.rows, w.rows, a.ep);
}

}  // namespace sparq::cpu
