// Dense f32 weights run through OpenBLAS (sgemv for one token, sgemm otherwise) on a grid of
// single-threaded calls spread over the pool: OpenBLAS's own threading changes the bits with the
// thread count on every kernel family (src/core/blas_tiles.h), and the promise is the same bits
// for any thread count. Dense int8 / int4 weights from 64 tokens: the same grid on dequantized
// panels.

#include <cblas.h>

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <vector>

#include "sparq/machine.h"
#include "src/core/blas_tiles.h"
#include "src/cpu/kernel_entry.h"
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

// Rows per panel: 64 x 1536 f32 (384 KiB) stays in L2 while sgemm packs it; a 576-row layer still
// makes 9 panels for 2-3 threads.
constexpr int64_t kDqPanelRows = 64;

// sparq's own tiled kernel ran at 0.59-0.68x the best f32 peer at 512 tokens, and a GGUF as
// stored prefilled at 0.76x / 0.88x its f32 copy (1 / 2 threads, Zen 5); dequantizing 64 rows
// and letting OpenBLAS multiply them costs one dequantization per weight against 2n FLOPs. Panels are fixed by the shape and each sgemm runs on
// one thread, so the bits do not depend on the thread count.
void RunDenseQuantSgemm(const KernelRow& row, const PackedWeight& pw, const SpmmArgs& a,
                        ThreadPool* pool) {
  const DenseQuantWeight& w = pw.dense_quant();
  if (w.rows > 0 && a.n > 0) {
    if (w.cols == 0) {
      for (int64_t t = 0; t < a.n; ++t) std::fill(a.y + t * a.ldy, a.y + t * a.ldy + w.rows, 0.0f);
    } else {
      const KernelBody body = row.Body(a.config());
      const int64_t panels = (w.rows + kDqPanelRows - 1) / kDqPanelRows;
      blas::OpenBlasThreads pin(1);
      auto task = [&](int64_t p, int) {
        const int64_t r0 = p * kDqPanelRows, r1 = std::min(w.rows, r0 + kDqPanelRows);
        // Grown, never shrunk: layers of 576 and 1536 columns alternate, and a resize up again
        // would zero the new part on every call.
        thread_local std::vector<float> panel;
        const auto need = static_cast<size_t>(kDqPanelRows * w.k_pad);
        if (panel.size() < need) panel.resize(need);
        KernelCall c;
        c.w = &pw;
        c.u0 = r0;
        c.u1 = r1;
        c.scratch = panel.data();
        body(c);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(a.n),
                    static_cast<int>(r1 - r0), static_cast<int>(w.cols), 1.0f, a.x,
                    static_cast<int>(a.ldx), panel.data(), static_cast<int>(w.k_pad), 0.0f,
                    a.y + r0, static_cast<int>(a.ldy));
      };
      if (pool != nullptr) {
        pool->ParallelFor(panels, task);
      } else {
        for (int64_t p = 0; p < panels; ++p) task(p, 0);
      }
    }
  }
  ApplyEpilogueBlock(a.config(), a.y, a.ldy, 0, a.n, 0, w.rows, w.rows, a.ep);
}

}  // namespace sparq::cpu
