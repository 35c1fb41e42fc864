// Sparse (and dense) weight x dense activation products: the kernel registry.
//
//   Y[t, r] = epilogue( sum_c X[t, c] * W[r, c] )     t < n tokens, r < m = rows, c < k = cols
//
// X, Y are f32 row-major with leading dimensions ldx >= k, ldy >= m. W is a PackedWeight
// (spmm_packed.h). One table of kernels (table.h) feeds dispatch (ChooseKernel), the tests and
// the benchmarks. Every SIMD kernel is compiled for all Highway targets and runs the target of the
// KernelConfig it is given (SpmmArgs::cfg).
// Threads: each kernel splits the rows into a fixed set of tasks (balanced by stored weights, not
// dependent on the thread count) and every output element is summed by one task in a fixed order,
// so results are bitwise identical for any number of threads and for repeated calls.
#pragma once

#include <cassert>
#include <cstdint>
#include <string>
#include <vector>

#include "sparq/kernel_config.h"
#include "sparq/linear.h"
#include "sparq/thread_pool.h"
#include "src/cpu/spmm_packed.h"
#include "src/cpu/table.h"

namespace sparq::cpu {

struct SpmmArgs {
  const float* x = nullptr;
  int64_t n = 0, ldx = 0;  // ldx >= cols
  float* y = nullptr;
  int64_t ldy = 0;         // ldy >= rows
  Epilogue ep;
  // Required: every caller (LinearWeight, the fused and shared-input paths, tests) sets it; there
  // is no default machine to fall back on.
  const KernelConfig* cfg = nullptr;
  const KernelConfig& config() const {
    assert(cfg != nullptr);
    return *cfg;
  }
};

// The largest n for which `w` runs its decode kernel (above: its tiled kernel), on cfg's target.
int64_t DecodeMaxN(const PackedWeight& w, const KernelConfig& cfg);

// Several weights applied to the same X (q/k/v, gate/up): job j computes
// Y_j = epilogue_j(X * W_j^T). Where every job runs a decode kernel over the same staged input, or
// every job runs a row-tiled kernel (N:M, bit mask; these share one X^T), all of them go out as
// one parallel call; otherwise one call each. Either way each job's output bits
// equal those of its own ChooseKernel(...).run call.
struct SharedInputJob {
  const PackedWeight* w;
  float* y;
  int64_t ldy = 0;  // 0 means w->rows
  Epilogue ep;
};
void RunSharedInput(const float* x, int64_t n, int64_t ldx, const SharedInputJob* jobs,
                    size_t count, const KernelConfig& cfg, ThreadPool* pool);

// The SwiGLU MLP of a Llama block in one call, where the row-tiled kernels allow (SwiGluFuses:
// gate, up and down N:M or bit-mask weights that run tiled for n tokens):
//   Y[t, :] = residual[t, :] + (silu(X gate^T) * (X up^T))[t, :] * down^T
// gate and up run in the same tasks over one X^T, and their product goes straight into down's
// X^T tiles: the [n, n_ff] intermediate is never transposed out to row-major and back (Y
// write-back and X^T transposes were 11% of a 512-token 2:4 prefill of SmolLM2, 2 threads,
// CPU-time profile, and gate/up's outputs and down's input are 4,608 of a block's 8,448 transposed
// columns), the separate SiLU / residual-free epilogue passes and the elementwise product go too.
// x [n, gate.cols], residual and y [n, down.rows] row-major; x_up: up's input where it differs
// from gate's (layers stored with different column permutations; then up gets its own X^T), else
// null. down_row (gate.rows entries, or null for the identity): the X^T row of down that each
// gate/up output feeds (the inverse of down's stored column permutation). Bits equal those of the
// three products run separately with a SiLU epilogue on gate and gate * up in float between
// them. Returns false, having written nothing, where not applicable.
bool SwiGluFuses(const PackedWeight& gate, const PackedWeight& up, const PackedWeight& down,
                 int64_t n, const KernelConfig& cfg);
bool RunSwiGlu(const PackedWeight& gate, const PackedWeight& up, const PackedWeight& down,
               const float* x, const float* x_up, int64_t n, const int32_t* down_row,
               const float* residual, float* y, const KernelConfig& cfg, ThreadPool* pool);

// The plain reference: loops over the packed layout, sums in double. For tests and as a fallback.
void SpmmReference(const PackedWeight& w, const SpmmArgs& a, ThreadPool* pool);

// Applies bias, activation and residual to a raw sum (scalar, libm; the reference kernel's).
float ApplyEpilogue(float v, int64_t t, int64_t r, int64_t m, const Epilogue& ep);
// The same on y[r0, r1) of token t's output row (y points at Y[t, 0]), in the same order (bias,
// activation, residual), in vectors: SiLU through Highway's Exp, within 4 ulp of the exact value
// (SpmmTest.VectorEpilogueMatchesDoubleOnEveryTarget), so not always ApplyEpilogue's bits. Every
// kernel's epilogue; an element's bits do not depend on r0 (see EpilogueRow in spmm-inl.h).
// Inline so that the common no-epilogue case costs a test, not a dispatched call per token.
void EpilogueRowVector(const KernelConfig& cfg, float* y, int64_t t, int64_t r0, int64_t r1,
                       int64_t m, const Epilogue& ep);
inline void ApplyEpilogueRow(const KernelConfig& cfg, float* y, int64_t t, int64_t r0, int64_t r1,
                             int64_t m, const Epilogue& ep) {
  if (ep.bias || ep.residual || ep.act != Activation::kNone) {
    EpilogueRowVector(cfg, y, t, r0, r1, m, ep);
  }
}

}  // namespace sparq::cpu
