// Sparse (and dense) weight x dense activation products: the kernel registry.
//
//   Y[t, r] = epilogue( sum_c X[t, c] * W[r, c] )     t < n tokens, r < m = rows, c < k = cols
//
// X, Y are f32 row-major with leading dimensions ldx >= k, ldy >= m. W is a PackedWeight
// (spmm_packed.h). One table of kernels (SpmmRegistry) feeds dispatch (ChooseKernel), the tests
// and the benchmarks. Every SIMD kernel is compiled for all Highway targets and dispatched at run
// time (SPARQ_MAX_ISA caps the target: "AVX3", "AVX2", "SSE4", "SSSE3", "EMU128"/"SCALAR").
// Threads: each kernel splits the rows into a fixed set of tasks (balanced by stored weights, not
// dependent on the thread count) and every output element is summed by one task in a fixed order,
// so results are bitwise identical for any number of threads and for repeated calls.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sparq/linear.h"
#include "sparq/thread_pool.h"
#include "src/cpu/spmm_packed.h"

namespace sparq::cpu {

struct SpmmArgs {
  const float* x = nullptr;
  int64_t n = 0, ldx = 0;  // ldx >= cols
  float* y = nullptr;
  int64_t ldy = 0;         // ldy >= rows
  Epilogue ep;
};

struct SpmmKernel {
  const char* name;  // "SpmmNm_decode", ...
  PackedKind kind;
  // Smallest / largest n the dispatcher may pick this kernel for (every kernel is correct for all
  // n); within them the weight decides (DecodeMaxN), so a decode and a tiled range can overlap.
  int64_t min_n, max_n;
  bool simd;  // runs through Highway dispatch (tests run it for every compiled target)
  void (*run)(const PackedWeight& w, const SpmmArgs& a, ThreadPool* pool);
};

// Token counts up to which the decode kernels run, per layout (DecodeMaxN); they differ by target.
struct DecodeLimits {
  int64_t nm_window;    // N:M with m = 2n (X windows permuted)
  int64_t nm_gather;    // other N:M (X gathered)
  int64_t csr;          // shared-column rows in groups of one (CSR)
  int64_t groups;       // groups of 2-4 rows (V:N:M, BSR)
  int64_t dense_bf16;   // dense bf16 rows
  int64_t mask;         // bit-mask rows, at least 40% kept
  int64_t sparse_mask;  // bit-mask rows, under 40% kept
};

// Whether this CPU is AMD family 19h (Zen 3 / Zen 4; with AVX-512: Zen 4), where the V:N:M / BSR
// decode (which gathers X) was measured slower than the tiled kernel from 3 tokens (DecodeLimitsT).
bool AmdFamily19h();
// V:N:M / BSR decode limit on AVX-512 where AmdFamily19h() (4 elsewhere on AVX-512).
inline constexpr int64_t kZen4GroupsDecodeMaxN = 2;

// All kernels: per sparse kind a decode row (RunDecode) and a tiled row; dense f32 one row.
const std::vector<SpmmKernel>& SpmmRegistry();
// The largest n for which `w` runs its decode kernel (above: its tiled kernel), for the target
// that runs (DecodeLimits by w's layout).
int64_t DecodeMaxN(const PackedWeight& w);
// The kernel of w's kind that runs n tokens: decode for n <= DecodeMaxN(w), else tiled.
const SpmmKernel& ChooseKernel(const PackedWeight& w, int64_t n);

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
                    size_t count, ThreadPool* pool);

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
                 int64_t n);
bool RunSwiGlu(const PackedWeight& gate, const PackedWeight& up, const PackedWeight& down,
               const float* x, const float* x_up, int64_t n, const int32_t* down_row,
               const float* residual, float* y, ThreadPool* pool);

// Loop order of the shared-column tiled kernel (SpmmScg_tiled): chosen per call from the bytes
// each order moves (kAuto), or forced, for tests that run both orders on the same call (the order
// changes no sum, so the bits must match). Process-wide.
enum class ScgTiledOrder : uint8_t { kAuto, kTaskOuter, kTileOuter };
void SetScgTiledOrderForTest(ScgTiledOrder order);
// Whether the tiled kernels write Y with non-temporal stores: by size (kAuto), or always / never
// (tests: the bits must not change).
enum class StreamYMode : uint8_t { kAuto, kAlways, kNever };
void SetStreamYForTest(StreamYMode mode);

// The plain reference: loops over the packed layout, sums in double. For tests and as a fallback.
void SpmmReference(const PackedWeight& w, const SpmmArgs& a, ThreadPool* pool);

// Applies bias, activation and residual to a raw sum (scalar, libm; the reference kernel's).
float ApplyEpilogue(float v, int64_t t, int64_t r, int64_t m, const Epilogue& ep);
// The same on y[r0, r1) of token t's output row (y points at Y[t, 0]), in the same order (bias,
// activation, residual), in vectors: SiLU through Highway's Exp, within 4 ulp of the exact value
// (SpmmTest.VectorEpilogueMatchesDoubleOnEveryTarget), so not always ApplyEpilogue's bits. Every
// kernel's epilogue; an element's bits do not depend on r0 (see EpilogueRow in spmm-inl.h).
// Inline so that the common no-epilogue case costs a test, not a dispatched call per token.
void EpilogueRowVector(float* y, int64_t t, int64_t r0, int64_t r1, int64_t m, const Epilogue& ep);
inline void ApplyEpilogueRow(float* y, int64_t t, int64_t r0, int64_t r1, int64_t m,
                             const Epilogue& ep) {
  if (ep.bias || ep.residual || ep.act != Activation::kNone) EpilogueRowVector(y, t, r0, r1, m, ep);
}

// Applies SPARQ_MAX_ISA (once per process; idempotent). Returns the list of targets enabled.
std::string ApplyMaxIsaFromEnv();

}  // namespace sparq::cpu
