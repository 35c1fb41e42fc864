// Dispatch, threading and data staging of the sparse x dense kernels (bodies in spmm-inl.h).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/cpu/spmm.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "src/cpu/spmm-inl.h"

HWY_BEFORE_NAMESPACE();
namespace sparq::cpu::HWY_NAMESPACE {

void NmDecodeT(const NmWeight* w, const float* xpad, int64_t n, int64_t r0, int64_t r1,
               float* raw) {
  NmDecode(*w, xpad, n, r0, r1, raw);
}
void ScgDecodeT(const ScgWeight* w, const float* x, int64_t ldx, int64_t n, int64_t g0,
                int64_t g1, float* raw) {
  ScgDecode(*w, x, ldx, n, g0, g1, raw);
}
void NmTiledT(const NmWeight* w, int64_t nt, int64_t r0, int64_t r1, const float* xt,
              int64_t c0, int64_t c1, float* scratch, const XtNext* next) {
  NmTiled(*w, nt, r0, r1, xt, c0, c1, scratch, *next);
}
void ScgTiledT(const ScgWeight* w, int64_t nt, int64_t g0, int64_t g1, const float* xt,
               const ScgBlock* blk, float* scratch, const XtNext* next) {
  ScgTiled(*w, nt, g0, g1, xt, *blk, scratch, *next);
}
void MaskDecodeT(const MaskWeight* w, const float* xpad, int64_t n, int64_t r0, int64_t r1,
                 float* raw) {
  MaskDecode(*w, xpad, n, r0, r1, raw);
}
void MaskTiledT(const MaskWeight* w, int64_t nt, int64_t r0, int64_t r1, const float* xt,
                int64_t c0, int64_t c1, int64_t* cursor, int32_t* off, float* scratch,
                const XtNext* next) {
  MaskTiled(*w, nt, r0, r1, xt, c0, c1, cursor, off, scratch, *next);
}
// out[i] = silu(g[i]) * u[i], i < len, with the SiLU of the epilogue (EpilogueSpan: an element's
// bits do not depend on its position), so the fused MLP (RunSwiGlu) gives the bits of a SiLU
// epilogue on gate's output times up's. g is overwritten (it may be out).
void SiluMulT(float* g, const float* u, int64_t len, float* out) {
  EpilogueSpan<false, false, 2>(g, nullptr, nullptr, 0, len);
  for (int64_t i = 0; i < len; ++i) out[i] = g[i] * u[i];
}
int64_t TileWidthT(int g, int64_t n) { return TileWidth(g, n); }
int64_t NarrowCsrWidthT(int64_t n) { return NarrowCsrWidth(n); }
int64_t RowTileWidthT(int64_t n) { return RowTileWidth(n); }
// stream: write dst with non-temporal stores where the target has whole-line squares (dst and ldd
// must then be 64-byte aligned), fenced before returning.
void TransposeT(const float* src, int64_t lds, int64_t rows, int64_t cols, float* dst, int64_t ldd,
                bool stream) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if (stream) {
    TransposeBlock<true>(src, lds, rows, cols, dst, ldd);
    _mm_sfence();
    return;
  }
#endif
  (void)stream;
  TransposeBlock(src, lds, rows, cols, dst, ldd);
}
const char* TargetNameT() { return hwy::TargetName(HWY_TARGET); }
// The token counts up to which the decode kernels run on this target (DecodeMaxN below).
void DecodeLimitsT(DecodeLimits* b) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  *b = DecodeLimits{16, 4, 2, AmdFamily19h() ? kZen4GroupsDecodeMaxN : 4, 12, 12, 8};
#else
  *b = DecodeLimits{4, 4, 3, 1, 6, 12, 12};
#endif
}
void EpilogueBlockT(float* y, int64_t ldy, int64_t t0, int64_t t1, int64_t r0, int64_t r1,
                    int64_t m, const Epilogue* ep) {
  EpilogueBlock(y, ldy, t0, t1, r0, r1, m, *ep);
}
void EpilogueRowT(float* y, int64_t t, int64_t r0, int64_t r1, int64_t m, const Epilogue* ep) {
  EpilogueRow(y, t, r0, r1, m, *ep);
}

}  // namespace sparq::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <cblas.h>
#if HWY_ARCH_X86
#include <cpuid.h>
#endif
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>

#include "sparq/checked.h"
#include "src/cpu/machine.h"

namespace sparq::cpu {

HWY_EXPORT(NmDecodeT);
HWY_EXPORT(ScgDecodeT);
HWY_EXPORT(NmTiledT);
HWY_EXPORT(ScgTiledT);
HWY_EXPORT(MaskDecodeT);
HWY_EXPORT(MaskTiledT);
HWY_EXPORT(TileWidthT);
HWY_EXPORT(NarrowCsrWidthT);
HWY_EXPORT(RowTileWidthT);
HWY_EXPORT(TransposeT);
HWY_EXPORT(TargetNameT);
HWY_EXPORT(DecodeLimitsT);
HWY_EXPORT(EpilogueRowT);
HWY_EXPORT(EpilogueBlockT);
HWY_EXPORT(SiluMulT);

namespace {

// Up to how many tokens the decode (gather) kernels run, by layout and target (DecodeLimitsT);
// above, the tiled (X^T) kernels. The decode kernels stream the weights once but expand or gather
// X per token; the tiled ones pay a transpose of X, and one FMA per kept weight covers a whole
// vector of tokens (a tile costs the same from 1 to 16 tokens on AVX-512: one padded vector).
// Measured 2026-12-01, 2 threads, decode against tiled on the same packed weight, an OpenBLAS call
// before each sample, ms (4096x4096 unless said; 576x1536 and 1536x576 agree unless said):
// AVX-512:
// - N:M with m = 2n (2:4, 4:8; X windows permuted, 4 tokens per pass): up to 16 (2:4 f32 3.0 /
//   3.3 at 16, 5.3 / 4.4 at 32; 576x576 0.125 / 0.112 at 16).
// - other N:M (1:4; X gathered): up to 4 (1.6 / 2.1 at 4; 2.4 / 2.0 at 6).
// - CSR rows (groups of one row): up to 2, the tiled kernel on narrow 4- / 8-token tiles from 3
//   (measured again 2026-12-01 after that kernel, one thread, ms: 90% 1.0 / 1.4 at 2, 2.0 / 1.4 at
//   3; 99% 0.15 / 0.22 at 2, 0.21 / 0.22 at 3, 0.29 / 0.22 at 4; 576x1536 90% 0.043 / 0.053 at 2,
//   0.059 / 0.055 at 3; 1536x576 99% 0.040 / 0.024 at 3).
// - V:N:M and BSR (groups of 2-4 rows; the decode takes 16 / g columns per vector): up to 4
//   (V:16:2:4 3.1 / 3.3, BSR 16x16 70% 1.8 / 2.0, 32x32 90% 0.68 / 0.68; 576x1536 0.18 / 0.20,
//   0.12 / 0.15, 0.066 / 0.108); at 6 tiled is ahead at 4096x4096 (3.8 / 3.4, 2.5 / 2.1).
//   On AMD Zen 4 up to 2 (kZen4GroupsDecodeMaxN; measured there 2026-12-01 evening, 2 threads,
//   decode / tiled, ms, two rounds, the tiled kernel's second round on a slower host): 4096x4096
//   V:16:2:4 2.25 / 2.63-2.87 at 2, 3.05-3.09 / 2.55-2.92 at 3, 4.02-4.09 / 2.61-2.97 at 4; BSR
//   32x32 90% 0.38-0.42 / 0.47 at 2, 0.59-0.62 / 0.42-0.50 at 3; 576x576 V:16:2:4 0.036 / 0.035
//   at 2, 0.054 / 0.035 at 3, 0.071 / 0.035 at 4; 1536x576 BSR 16x16 50% 0.14 / 0.084 at 3. The
//   decode gathers its X values; that Zen 4's gathers are what costs was not measured apart.
// - dense bf16 rows: up to 12 (4.3 / 6.5 at 8, 6.0 / 6.5 at 12, 7.9 / 6.5 at 16).
// - bit-mask rows (4 tokens per pass): at 50% up to 12 (3.5 / 4.0), at 70% up to 8 (2.1 / 2.7 at 8,
//   3.1 / 2.7 at 12).
// AVX2 (SPARQ_MAX_ISA=AVX2 on the same machine; the other targets follow it):
// - 2:4: up to 4 (2.7 / 2.9 at 4, 3.9 / 2.9 at 6; 16 tokens ran 9.6 against 3.7);
//   1:4: up to 4 (1.9 / 1.9); CSR up to 3 (narrow 4-token tiles, one thread: 90% 1.31 / 1.44 at
//   3, 1.93 / 1.49 at 4; 99% 0.16 / 0.22 at 3, 0.22 / 0.22 at 4; 1536x576 90% 0.065 / 0.074 at
//   3, 0.084 / 0.073 at 4).
// - V:N:M and BSR: 1 (V:16:2:4 2.7 / 2.5 at 2; BSR 32x32 90% 0.52 / 0.50 at 1).
// - dense bf16: up to 6 (3.5 / 5.5 at 4, 6.2 / 5.5 at 8); bit mask: 12 at 50% and 70% (the
//   AVX2 tiled mask kernel is slower: 5.2 / 6.8 at 12).
// Fewest multiply-adds per task: below, thread hand-off costs more than it saves. 16K (a few
// microseconds of decode): with 64K, SmolLM2's 576x576 layers made 3 decode tasks and its
// 192x576 ones a single task, so 2 threads idled; at 16K the model's 2-thread decode went
// 59.1 -> 63.0 tok/s (2:4 bf16) and 58.0 -> 60.3 (50% bf16), `sparq bench model`, 5 interleaved.
constexpr int64_t kMinTaskWork = 1 << 14;
// Most tasks per call: enough to balance 2..8 threads, few enough to keep per-task setup small.
constexpr int64_t kMaxTasks = 64;
// Most tasks of a task-outer shared-column prefill cut so that each task's weights stay in L2
// (RunScgTiled).
constexpr int64_t kMaxTasksL2 = 256;
// Fewest rows per task of the tiled kernels: every task streams all of X^T once per token tile,
// so tiny tasks (9 rows for SmolLM2's 576-row layers at n = 512) multiply that traffic.
constexpr int64_t kTiledMinRows = 32;
// This core's L2 in bytes as the system reports it (0 when it does not).
int64_t CoreL2Bytes() {
  static const int64_t v = std::max<int64_t>(0, sysconf(_SC_LEVEL2_CACHE_SIZE));
  return v;
}
// Largest X^T tile (all k x tile tokens) of the tile-outer order: three quarters of this core's
// L2 (1 MiB when the system does not say), the rest for the streamed weights and the partial
// sums. SPARQ_XT_TILE_BYTES overrides it (tuning experiments only).
int64_t XtTileL2Bytes() {
  static const int64_t v = [] {
    if (const char* e = std::getenv("SPARQ_XT_TILE_BYTES"))
      return std::max<int64_t>(4096, std::atoll(e));
    const int64_t l2 = CoreL2Bytes();
    return l2 > 0 ? std::clamp<int64_t>(l2 / 4 * 3, 128 << 10, 16 << 20) : int64_t{1} << 20;
  }();
  return v;
}
// Bytes of the X^T slice of one k block: it should stay in L1 (48 KiB here) with room for weights.
constexpr int64_t kXtBlockBytesDefault = 16 * 1024;
// Narrowest token tile that the row-tiled kernels (N:M, bit mask) run by k blocks even when it is
// the only tile (5 vectors on AVX-512). Measured (one thread, ms, whole k -> k blocks, interleaved
// rounds): n = 128, three rounds: 2:4 f32 4096x4096 57-64 -> 31-34, 576x1536 1.59-1.68 ->
// 1.14-1.30, 1536x576 1.54-1.65 -> 1.15-1.22; 2:4 bf16 4096x4096 55-65 -> 25-27; 50% bit mask f32
// 4096x4096 52-64 -> 25-26, 576x1536 1.58-1.70 -> 1.26-1.38. n = 112 / 80 (7- and 5-vector
// tiles), two rounds: 2:4 4096x4096 43-56 -> 28-31 / 22-24 -> 22-26, 576x1536 1.40-1.47 ->
// 1.11-1.28 / 1.01-1.09 -> 0.83-0.90. A 64-token tile is better whole (2:4 4096x4096 n = 64:
// 14.3-15.1 -> 17.5-17.7 with k blocks; 576- and 1536-column shapes within noise), and so is
// anything narrower (n = 32 within noise). Same sums in the same order either way: the bits do not
// change.
constexpr int64_t kOneTileBlockMinNt = 80;

int64_t XtBlockBytes() {
  static const int64_t v = [] {
    const char* e = std::getenv("SPARQ_XT_BLOCK_BYTES");  // tuning experiments only
    return e ? std::max<int64_t>(1024, std::atoll(e)) : kXtBlockBytesDefault;
  }();
  return v;
}

// Whether a tiled task should prefetch each next k block's X^T slice (XtSlicePrefetcher): X^T
// tiles of k_rows x nt floats, the task's partial sums scratch_bytes. Measured (n = 512, one
// thread, 2:4 / V:16:2:4 / 50%, interleaved rounds, time without / with; docs/kernels.md): it
// pays where the X^T tile is beyond L2 and a task's partial sums fit L1 (576x1536 0.93-1.23x, 2:4
// 1.18-1.23x; 4096x4096 1.00-1.15x; 4096x11008 0.93-1.13x); it costs where the X^T tile stays in
// L2 anyway (k = 576: 0.89-1.04x) and where the partial sums alone fill L1 (11008x4096: 2:4 and
// 50% 0.98-1.01x with 88 KiB, V:16:2:4 0.91-0.93x with 44 KiB). SPARQ_XT_PREFETCH=0 turns it off
// everywhere (A/B experiments; it changes no result, only time).
bool XtPrefetchWorthIt(int64_t k_rows, int64_t nt, int64_t scratch_bytes) {
  static const bool allowed = [] {
    const char* e = std::getenv("SPARQ_XT_PREFETCH");
    return e == nullptr || std::atoi(e) != 0;
  }();
  return allowed && k_rows * nt * 4 > (512 << 10) && scratch_bytes <= (32 << 10);
}

// The X^T slice the next tiled call reads (X^T tiles of nt tokens and k_rows columns, k blocks of
// kb_chunks chunks of chunk_cols columns; the current call ends at chunk c1 of tile `tile`, and
// this thread's loop runs to tile_end): the next k block of this tile, else the first of the next
// tile; none after the last, or when `on` is false. Only L1-sized slices (XtBlockBytes): wider
// ones belong to sparse rows that touch a fraction of their columns, where fetching the whole
// slice evicts the one in use (4096x4096 n = 512 BSR 32x32 90%: 21-25 -> 38 ms; CSR 99%: +10%).
XtNext NextXtSlice(bool on, const float* xt, int64_t k_rows, int64_t nt, int64_t tile,
                   int64_t tile_end, int64_t c1, int64_t chunks, int64_t kb_chunks,
                   int64_t chunk_cols) {
  XtNext next;
  if (!on) return next;
  const int64_t chunk_floats = chunk_cols * nt;
  if (c1 < chunks) {
    next.xt = xt + tile * k_rows * nt + c1 * chunk_floats;
    next.bytes = std::min(kb_chunks, chunks - c1) * chunk_floats * 4;
  } else if (tile + 1 < tile_end) {
    next.xt = xt + (tile + 1) * k_rows * nt;
    next.bytes = std::min(kb_chunks, chunks) * chunk_floats * 4;
  }
  if (next.bytes > XtBlockBytes()) next = XtNext{};
  return next;
}

// Per-thread reusable buffers (calls on one LinearWeight may run concurrently from many threads,
// so buffers belong to threads, not to the weight), 64-byte aligned: the tiled kernels load X^T
// rows of 16 floats at multiples of the tile width, and a load that straddles two cache lines
// costs two (measured on the 2:4 inner loop here: 42 -> 67 GFLOP/s when aligned).
struct AlignedFree {
  void operator()(float* p) const { std::free(p); }
};
float* ThreadBuffer(int slot, size_t floats) {
  constexpr size_t kAlign = 64;
  thread_local std::unique_ptr<float, AlignedFree> bufs[6];
  thread_local size_t sizes[6] = {0, 0, 0, 0, 0, 0};
  if (sizes[slot] < floats || !bufs[slot]) {
    const size_t bytes = (std::max<size_t>(floats, 1) * sizeof(float) + kAlign - 1) / kAlign * kAlign;
    bufs[slot].reset(static_cast<float*>(std::aligned_alloc(kAlign, bytes)));
    if (!bufs[slot]) throw std::bad_alloc();
    sizes[slot] = bytes / sizeof(float);
  }
  return bufs[slot].get();
}

// Splits [0, units) into tasks balanced by cost prefix `cum` (cum[i] = cost of units < i), each
// of at least `min_units` units and cut at units u with u % align == offset % align (whole row
// blocks for the row-blocked kernels; CutsFor adds Y's line starts). The split depends on the
// shape (and, streaming, on where Y starts in a cache line), never on the thread count; no sum
// depends on it.
std::vector<int64_t> SplitTasks(const std::vector<int64_t>& cum, int64_t n, int64_t min_units = 1,
                                int64_t align = 1, int64_t max_tasks = kMaxTasks,
                                int64_t offset = 0) {
  const int64_t units = static_cast<int64_t>(cum.size()) - 1;
  const int64_t total = cum.back();
  int64_t tasks = std::clamp<int64_t>(total * std::max<int64_t>(n, 1) / kMinTaskWork, 1, max_tasks);
  tasks = std::min(tasks, std::max<int64_t>(units / std::max<int64_t>(min_units, 1), 1));
  std::vector<int64_t> bounds{0};
  int64_t u = 0;
  for (int64_t t = 1; t < tasks; ++t) {
    const int64_t target = total * t / tasks;
    while (u < units && cum[u] < target) ++u;
    u = std::min(units, u + ((offset - u) % align + align) % align);
    if (u > bounds.back()) bounds.push_back(u);
  }
  if (units > bounds.back() || bounds.size() == 1) bounds.push_back(units);
  return bounds;
}

void ParallelTasks(ThreadPool* pool, int64_t tasks, const std::function<void(int64_t, int)>& fn) {
  if (pool == nullptr || pool->num_threads() == 1) {
    for (int64_t t = 0; t < tasks; ++t) fn(t, 0);
  } else {
    pool->ParallelFor(tasks, fn);
  }
}

std::vector<int64_t> RowCost(const PackedWeight& w) {
  if (w.kind == PackedKind::kNm) {
    std::vector<int64_t> cum(w.rows + 1);
    for (int64_t r = 0; r <= w.rows; ++r) cum[r] = r * w.nm.chunks * kNmChunk;
    return cum;
  }
  if (w.kind == PackedKind::kMask) {
    // Decode steps through every 16 columns (a vector step costs about as much as two kept
    // weights), and each kept weight is a load and an FMA.
    std::vector<int64_t> cum(w.rows + 1);
    for (int64_t r = 0; r <= w.rows; ++r) cum[r] = w.mask.row_ptr[r] + r * w.mask.chunks * 2;
    return cum;
  }
  const ScgWeight& s = w.scg;
  std::vector<int64_t> cum(s.groups() + 1);
  // Each group costs its columns times g, plus a little per row (setup and write-out).
  for (int64_t i = 0; i <= s.groups(); ++i) cum[i] = s.group_ptr[i] * s.g + s.group_row[i] * 8;
  return cum;
}

// ApplyEpilogueRow (spmm.h) for tokens [t0, t1) of Y (y = Y[0, 0], rows ldy apart), in one call.
void ApplyEpilogueBlock(float* y, int64_t ldy, int64_t t0, int64_t t1, int64_t r0, int64_t r1,
                        int64_t m, const Epilogue& ep) {
  if (ep.bias || ep.residual || ep.act != Activation::kNone) {
    HWY_DYNAMIC_DISPATCH(EpilogueBlockT)(y, ldy, t0, t1, r0, r1, m, &ep);
  }
}

// Writes raw sums [n][r1 - r0] (row-major over the task's rows) to Y with the epilogue.
void WriteRaw(const float* raw, int64_t n, int64_t r0, int64_t r1, const SpmmArgs& a,
              int64_t m) {
  const int64_t rows = r1 - r0;
  for (int64_t t = 0; t < n; ++t) {
    float* y = a.y + t * a.ldy;
    std::memcpy(y + r0, raw + t * rows, sizeof(float) * rows);
    ApplyEpilogueRow(y, t, r0, r1, m, a.ep);
  }
}

// dst[j * ldd + i] = src[i * lds + j] (TransposeT on the best target).
void Transpose(const float* src, int64_t lds, int64_t rows, int64_t cols, float* dst, int64_t ldd,
               bool stream) {
  HWY_DYNAMIC_DISPATCH(TransposeT)(src, lds, rows, cols, dst, ldd, stream);
}

std::atomic<int> g_stream_y{0};

// Whether the tiled kernels write Y (n x m) with non-temporal stores (TransposeT's stream): where
// Y is larger than the L2 of the threads that write it, so its lines would go back to L3 or memory
// before anyone reads them anyway, and a plain store first reads each line it fills (a 99% CSR
// call at 4096x4096 n = 512 moves 8 MB of X in and 8 MB of Y out beside 1 MB of weights). Not
// with an epilogue, which reads Y back. Measured (4096x4096 n = 512, 99% CSR, ms, two rounds,
// caches cold as in `bench kernels`: an OpenBLAS call between samples): one thread 5.49 / 5.53 ->
// 4.43 / 4.57, two threads 2.63 / 3.17 -> 2.36 / 2.53; back to back (Y still in L3) one thread
// 3.93 / 4.03 -> 4.06 / 4.17, two threads within noise. More in docs/kernels.md.
bool StreamY(const SpmmArgs& a, int64_t m, const ThreadPool* pool) {
  const int threads = pool ? pool->num_threads() : 1;
  const auto forced = static_cast<StreamYMode>(g_stream_y.load(std::memory_order_relaxed));
  if (forced == StreamYMode::kNever || a.ep.bias || a.ep.residual ||
      a.ep.act != Activation::kNone || a.ldy % 16 != 0 ||
      reinterpret_cast<uintptr_t>(a.y) % sizeof(float) != 0) {
    return false;
  }
  const double l2_bytes = CoreL2Bytes() > 0 ? static_cast<double>(CoreL2Bytes()) : double{1 << 20};
  return forced == StreamYMode::kAlways ||
         static_cast<double>(a.n) * static_cast<double>(m) * 4.0 > l2_bytes * threads;
}

// Rows from Y's row 0 to the first 64-byte line start (Y rows of ldy % 16 == 0 floats all start
// at the same offset in a line): tasks cut at rows r with (phase + r) % 16 == 0 write whole lines.
int64_t YLinePhase(const SpmmArgs& a) {
  return (16 - static_cast<int64_t>(reinterpret_cast<uintptr_t>(a.y) / sizeof(float) % 16)) % 16;
}

// Where tasks of g-row units may be cut: every `align` units from `offset`. The kernels need cuts
// at multiples of base_align units; a streamed Y also wants them at its line starts, where that
// grid and the line starts meet.
struct TaskCuts {
  int64_t align, offset;
};
TaskCuts CutsFor(const SpmmArgs& a, bool stream, int64_t g, int64_t base_align) {
  const int64_t phase = YLinePhase(a);
  if (stream && g <= 16 && 16 % g == 0 && phase % g == 0 && (16 / g) % base_align == 0 &&
      (phase / g) % base_align == 0) {
    return {16 / g, phase / g};
  }
  return {base_align, 0};
}

// Writes tokens [t0, t1) of a token tile from scratch laid out [row][nt] (row r's sums at
// scratch + row_off[r - r0], token t at + t - t0) to Y. Y is written along rows, contiguously per
// token (the scratch side is the strided one: it sits in L1/L2, while Y's lines would each be
// touched once per row otherwise), then the epilogue runs over each contiguous span.
void WriteTile(const float* scratch, const int64_t* row_off, int64_t r0, int64_t r1, int64_t t0,
               int64_t t1, const SpmmArgs& a, int64_t m, bool stream) {
  // Rows one after the other in scratch (all but shared-column groups with padded rows): one
  // register transpose of the [rows][tokens] block.
  const int64_t nt = r1 - r0 > 1 ? row_off[1] - row_off[0] : 0;
  bool regular = row_off[0] == 0 && nt >= t1 - t0;
  for (int64_t r = r0; regular && r < r1; ++r) regular = row_off[r - r0] == (r - r0) * nt;
  if (regular && r1 - r0 > 1) {
    float* y = a.y + t0 * a.ldy;
    // Streamed (StreamY): rows from the first whole line on, in 16-row squares; the rows before
    // and after them (none where the task was cut at line starts) with plain stores.
    int64_t head = 0, body = 0;
    if (stream) {
      head = std::min(r1 - r0, (YLinePhase(a) + 16 - r0 % 16) % 16);
      body = (r1 - r0 - head) / 16 * 16;
    }
    if (head > 0) Transpose(scratch, nt, head, t1 - t0, y + r0, a.ldy, false);
    if (body > 0) Transpose(scratch + head * nt, nt, body, t1 - t0, y + r0 + head, a.ldy, true);
    const int64_t done = head + body;
    if (r1 - r0 > done) {
      Transpose(scratch + done * nt, nt, r1 - r0 - done, t1 - t0, y + r0 + done, a.ldy, false);
    }
    ApplyEpilogueBlock(a.y, a.ldy, t0, t1, r0, r1, m, a.ep);
    return;
  }
  for (int64_t t = t0; t < t1; ++t) {
    float* y = a.y + t * a.ldy;
    const float* s = scratch + (t - t0);
    for (int64_t r = r0; r < r1; ++r) y[r] = s[row_off[r - r0]];
    ApplyEpilogueRow(y, t, r0, r1, m, a.ep);
  }
}

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
  ApplyEpilogueBlock(a.y, a.ldy, 0, a.n, 0, w.rows, w.rows, a.ep);
}

// X copied to rows of k_pad floats, zero beyond cols (the padded kernels read whole chunks).
float* PaddedX(const float* x, int64_t n, int64_t ldx, int64_t cols, int64_t k_pad) {
  float* xpad = ThreadBuffer(0, n * k_pad);
  for (int64_t t = 0; t < n; ++t) {
    std::memcpy(xpad + t * k_pad, x + t * ldx, cols * sizeof(float));
    std::fill(xpad + t * k_pad + cols, xpad + (t + 1) * k_pad, 0.0f);
  }
  return xpad;
}

// The decode kernels (gathers and expansions, n <= their max_n) of several weights that read the
// same X, in one parallel call: q/k/v of an attention block, gate/up of an MLP. A model's decode
// step is ~200 calls of 20-100 us each, and each call ends by waiting for its slowest task; one
// call per input instead of per weight removes 3 of a Llama block's 8 waits and gives the small
// k/v products' rows to whichever thread is free. Every job keeps its own row split, so its bits
// are those of a call on its own.
struct DecodeJob {
  const PackedWeight* w;
  SpmmArgs a;
};

// The X rows the decode kernels of `pw` read, staged once per input (same kind and width for all
// jobs of a call): N:M and bit-mask rows read X zero-padded to k_pad; dense bf16 reads each x
// repeated 4 times (matching its [col][4] values); CSR column lists read X as it is.
struct DecodeInput {
  const float* x;
  int64_t ldx;
};
DecodeInput StageDecodeInput(const PackedWeight& pw, const float* x, int64_t n, int64_t ldx) {
  switch (pw.kind) {
    case PackedKind::kNm: return {PaddedX(x, n, ldx, pw.nm.cols, pw.nm.k_pad), pw.nm.k_pad};
    case PackedKind::kMask:
      return {PaddedX(x, n, ldx, pw.mask.cols, pw.mask.k_pad()), pw.mask.k_pad()};
    case PackedKind::kScg: {
      const ScgWeight& w = pw.scg;
      if (!w.implicit_cols) return {x, ldx};
      float* xrep = ThreadBuffer(0, n * w.cols * 4);
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t c = 0; c < w.cols; ++c) {
          const float v = x[t * ldx + c];
          float* d = xrep + (t * w.cols + c) * 4;
          d[0] = d[1] = d[2] = d[3] = v;
        }
      }
      return {xrep, w.cols * 4};
    }
    case PackedKind::kDenseF32: break;
  }
  return {x, ldx};
}

// The same staged input serves two weights when they are decoded by the same kernel over the same
// padded width.
bool SameDecodeInput(const PackedWeight& a, const PackedWeight& b) {
  if (a.kind != b.kind || a.cols != b.cols) return false;
  switch (a.kind) {
    case PackedKind::kNm: return a.nm.k_pad == b.nm.k_pad;
    case PackedKind::kMask: return a.mask.k_pad() == b.mask.k_pad();
    case PackedKind::kScg: return a.scg.implicit_cols == b.scg.implicit_cols;
    case PackedKind::kDenseF32: return false;
  }
  return false;
}

// Task units of a weight's decode split: rows (N:M, bit mask; blocks of 4 rows for the mask
// kernel) or row groups (CSR column lists, BSR, V:N:M, dense bf16).
std::vector<int64_t> DecodeBounds(const PackedWeight& pw, int64_t n) {
  return SplitTasks(RowCost(pw), n, 1, pw.kind == PackedKind::kMask ? 4 : 1);
}

void RunDecodeTask(const PackedWeight& pw, const DecodeInput& in, const SpmmArgs& a, int64_t u0,
                   int64_t u1) {
  switch (pw.kind) {
    case PackedKind::kNm: {
      float* raw = ThreadBuffer(1, a.n * (u1 - u0));
      HWY_DYNAMIC_DISPATCH(NmDecodeT)(&pw.nm, in.x, a.n, u0, u1, raw);
      WriteRaw(raw, a.n, u0, u1, a, pw.rows);
      return;
    }
    case PackedKind::kMask: {
      float* raw = ThreadBuffer(1, a.n * (u1 - u0));
      HWY_DYNAMIC_DISPATCH(MaskDecodeT)(&pw.mask, in.x, a.n, u0, u1, raw);
      WriteRaw(raw, a.n, u0, u1, a, pw.rows);
      return;
    }
    case PackedKind::kScg: {
      const ScgWeight& w = pw.scg;
      const int64_t r0 = w.group_row[u0], r1 = w.group_row[u1];
      float* raw = ThreadBuffer(1, a.n * (r1 - r0));
      HWY_DYNAMIC_DISPATCH(ScgDecodeT)(&w, in.x, in.ldx, a.n, u0, u1, raw);
      WriteRaw(raw, a.n, r0, r1, a, w.rows);
      return;
    }
    case PackedKind::kDenseF32: break;
  }
}

// Jobs must share X (a.x, a.n, a.ldx) and SameDecodeInput.
void RunDecodeJobs(const DecodeJob* jobs, size_t count, ThreadPool* pool) {
  const SpmmArgs& a0 = jobs[0].a;
  const DecodeInput in = StageDecodeInput(*jobs[0].w, a0.x, a0.n, a0.ldx);
  struct Task {
    size_t job;
    int64_t u0, u1;
  };
  std::vector<Task> tasks;
  for (size_t j = 0; j < count; ++j) {
    const auto bounds = DecodeBounds(*jobs[j].w, jobs[j].a.n);
    for (size_t b = 0; b + 1 < bounds.size(); ++b) tasks.push_back({j, bounds[b], bounds[b + 1]});
  }
  ParallelTasks(pool, static_cast<int64_t>(tasks.size()), [&](int64_t t, int) {
    const Task& tk = tasks[static_cast<size_t>(t)];
    RunDecodeTask(*jobs[tk.job].w, in, jobs[tk.job].a, tk.u0, tk.u1);
  });
}

void RunDecode(const PackedWeight& pw, const SpmmArgs& a, ThreadPool* pool) {
  const DecodeJob job{&pw, a};
  RunDecodeJobs(&job, 1, pool);
}

// X^T tiles: xt[tile - tile0][c][j] = X[tile * nt + j][c] (zero for padded tokens and c >=
// cols), tiles [tile0, tile1) (tile1 < 0: all).
float* BuildXt(const SpmmArgs& a, int64_t cols, int64_t k_rows, int64_t nt, ThreadPool* pool,
               int slot = 0, int64_t tile0 = 0, int64_t tile1 = -1) {
  if (tile1 < 0) tile1 = CeilDiv(a.n, nt);
  const int64_t tiles = tile1 - tile0;
  float* xt = ThreadBuffer(slot, tiles * k_rows * nt);
  constexpr int64_t kCb = 64;  // columns per transpose block (cache friendly both ways)
  const int64_t cblocks = CeilDiv(k_rows, kCb);
  ParallelTasks(pool, tiles * cblocks, [&](int64_t task, int) {
    const int64_t tile = tile0 + task / cblocks, c0 = (task % cblocks) * kCb;
    const int64_t c1 = std::min(k_rows, c0 + kCb);
    float* dst = xt + (tile - tile0) * k_rows * nt;
    const int64_t cx = std::max(c0, std::min(c1, cols));
    const int64_t tokens = std::min(nt, a.n - tile * nt);
    // Zeros where no X lands: padded tokens of the last tile, columns past cols.
    if (tokens < nt) {
      for (int64_t c = c0; c < cx; ++c) std::fill(dst + c * nt + tokens, dst + (c + 1) * nt, 0.0f);
    }
    for (int64_t c = cx; c < c1; ++c) std::fill(dst + c * nt, dst + (c + 1) * nt, 0.0f);
    Transpose(a.x + tile * nt * a.ldx + c0, a.ldx, tokens, cx - c0, dst + c0 * nt, nt, false);
  });
  return xt;
}

// X^T rows a row-tiled weight reads (its k_pad).
int64_t RowTiledKRows(const PackedWeight& w) {
  return w.kind == PackedKind::kNm ? w.nm.k_pad : w.mask.k_pad();
}

// The row kernels' tiled runs (N:M, and bit-mask rows) of one weight over prebuilt X^T tiles of
// nt tokens and `stride` rows each (stride >= the weight's k_pad; rows beyond it are not read).
// k blocks whose X^T slice fits L1, the task's weights re-read from L2 per tile; except a single
// tile narrower than kOneTileBlockMinNt tokens, where each row's weights stream contiguously over
// the whole k (X^T, k x nt, from L2).
struct RowTiled {
  RowTiled(const PackedWeight& w, const float* xt_tiles, int64_t n, int64_t nt_, int64_t stride_)
      : pw(&w), xt(xt_tiles), nt(nt_), tiles(CeilDiv(n, nt_)), stride(stride_) {
    const bool nm = w.kind == PackedKind::kNm;
    chunks = nm ? w.nm.chunks : w.mask.chunks;
    chunk_cols = nm ? (kNmChunk / w.nm.n) * w.nm.m : kMaskChunk;
    kb_chunks = tiles == 1 && nt < kOneTileBlockMinNt
                    ? std::max<int64_t>(1, chunks)
                    : std::max<int64_t>(1, XtBlockBytes() / (nt * 4) / chunk_cols);
  }
  // Row blocks the kernel runs whole (tasks are cut at multiples of them).
  int64_t align() const { return pw->kind == PackedKind::kNm ? 4 : 2; }
  // int32 offsets a bit-mask task needs (MaskTiled's `off`).
  int64_t off_entries() const { return 4 * (kb_chunks + 1) * kMaskChunk; }
  bool prefetch(int64_t rows) const { return XtPrefetchWorthIt(stride, nt, rows * nt * 4); }
  // Rows [r0, r1) of token tile `tile` into scratch [row][nt]; cursor (r1 - r0 entries) and off
  // (off_entries()) are the bit-mask kernel's working space.
  void Tile(int64_t r0, int64_t r1, int64_t tile, bool pf, float* scratch, int64_t* cursor,
            int32_t* off) const {
    const float* xtt = xt + tile * stride * nt;
    for (int64_t c0 = 0; c0 == 0 || c0 < chunks; c0 += kb_chunks) {
      const int64_t c1 = std::min(chunks, c0 + kb_chunks);
      const XtNext next =
          NextXtSlice(pf, xt, stride, nt, tile, tiles, c1, chunks, kb_chunks, chunk_cols);
      if (pw->kind == PackedKind::kNm) {
        HWY_DYNAMIC_DISPATCH(NmTiledT)(&pw->nm, nt, r0, r1, xtt, c0, c1, scratch, &next);
      } else {
        const MaskWeight* w = &pw->mask;
        HWY_DYNAMIC_DISPATCH(MaskTiledT)(w, nt, r0, r1, xtt, c0, c1, cursor, off, scratch, &next);
      }
    }
  }

  const PackedWeight* pw;
  const float* xt;
  int64_t nt, tiles, stride;
  int64_t chunks = 0, chunk_cols = 0, kb_chunks = 0;
};

// Per-task working space of RowTiled::Tile for `rows` rows: `count` scratch blocks [rows][nt]
// (ThreadBuffer 1), the bit-mask cursor (2), row offsets of WriteTile and the mask offsets (3).
struct RowTaskSpace {
  float* scratch;
  int64_t* cursor;
  int64_t* row_off;
  int32_t* off;
};
RowTaskSpace RowTaskBuffers(int64_t rows, int64_t nt, int64_t count, int64_t off_entries) {
  RowTaskSpace s;
  s.scratch = ThreadBuffer(1, count * rows * nt);
  s.cursor = reinterpret_cast<int64_t*>(ThreadBuffer(2, rows * 2));
  s.row_off = reinterpret_cast<int64_t*>(ThreadBuffer(3, rows * 2 + off_entries));
  s.off = reinterpret_cast<int32_t*>(s.row_off + rows);
  for (int64_t r = 0; r < rows; ++r) s.row_off[r] = r * nt;
  return s;
}

// Rows [r0, r1) of Y (a.y, a.ldy, a.ep) = X W^T over X^T tiles already built (RowTiled's xt).
void RowTiledTask(const RowTiled& rt, const SpmmArgs& a, int64_t r0, int64_t r1, bool stream) {
  const RowTaskSpace s = RowTaskBuffers(r1 - r0, rt.nt, 1, rt.off_entries());
  const bool pf = rt.prefetch(r1 - r0);
  for (int64_t tile = 0; tile < rt.tiles; ++tile) {
    rt.Tile(r0, r1, tile, pf, s.scratch, s.cursor, s.off);
    WriteTile(s.scratch, s.row_off, r0, r1, tile * rt.nt, std::min(a.n, (tile + 1) * rt.nt), a,
              rt.pw->rows, stream);
  }
}

std::vector<int64_t> RowTiledBounds(const RowTiled& rt, const SpmmArgs& a, bool stream) {
  const TaskCuts cuts = CutsFor(a, stream, 1, rt.align());
  return SplitTasks(RowCost(*rt.pw), a.n, kTiledMinRows, cuts.align, kMaxTasks, cuts.offset);
}

void RunRowTiledXt(const RowTiled& rt, const SpmmArgs& a, ThreadPool* pool) {
  const bool stream = StreamY(a, rt.pw->rows, pool);
  const auto bounds = RowTiledBounds(rt, a, stream);
  ParallelTasks(pool, int64_t(bounds.size()) - 1, [&](int64_t task, int) {
    RowTiledTask(rt, a, bounds[task], bounds[task + 1], stream);
  });
}

// Row-tiled products of several weights on the same X (q/k/v): one X^T for all of them (wide
// enough for the widest k_pad) and one parallel call over all their tasks, so the threads wait
// once; every row is summed as in its own call, so each output keeps its bits.
void RunRowTiledJobs(const std::vector<DecodeJob>& jobs, ThreadPool* pool) {
  const SpmmArgs& a0 = jobs[0].a;
  const int64_t nt = HWY_DYNAMIC_DISPATCH(RowTileWidthT)(a0.n);
  int64_t stride = 0;
  for (const DecodeJob& j : jobs) stride = std::max(stride, RowTiledKRows(*j.w));
  const float* xt = BuildXt(a0, jobs[0].w->cols, stride, nt, pool);
  struct Task {
    size_t job;
    int64_t r0, r1;
  };
  std::vector<RowTiled> rts;
  std::vector<Task> tasks;
  std::vector<char> stream(jobs.size());
  for (size_t j = 0; j < jobs.size(); ++j) {
    rts.emplace_back(*jobs[j].w, xt, a0.n, nt, stride);
    stream[j] = StreamY(jobs[j].a, jobs[j].w->rows, pool);
    const auto bounds = RowTiledBounds(rts.back(), jobs[j].a, stream[j]);
    for (size_t b = 0; b + 1 < bounds.size(); ++b) tasks.push_back({j, bounds[b], bounds[b + 1]});
  }
  ParallelTasks(pool, static_cast<int64_t>(tasks.size()), [&](int64_t t, int) {
    const Task& tk = tasks[static_cast<size_t>(t)];
    RowTiledTask(rts[tk.job], jobs[tk.job].a, tk.r0, tk.r1, stream[tk.job] != 0);
  });
}

void RunRowTiled(const PackedWeight& pw, const SpmmArgs& a, ThreadPool* pool) {
  const int64_t nt = HWY_DYNAMIC_DISPATCH(RowTileWidthT)(a.n);
  const int64_t k_rows = RowTiledKRows(pw);
  const RowTiled rt(pw, BuildXt(a, pw.cols, k_rows, nt, pool), a.n, nt, k_rows);
  RunRowTiledXt(rt, a, pool);
}

std::atomic<int> g_scg_order{0};

void RunScgTiled(const PackedWeight& pw, const SpmmArgs& a, ThreadPool* pool) {
  const ScgWeight& w = pw.scg;
  const std::vector<int64_t> cost = RowCost(pw);
  const bool stream = StreamY(a, w.rows, pool);
  const TaskCuts cuts = CutsFor(a, stream, w.g, std::max(1, 4 / w.g));
  auto bounds = SplitTasks(cost, a.n, kTiledMinRows / w.g, cuts.align, kMaxTasks, cuts.offset);
  int64_t tasks = int64_t(bounds.size()) - 1;
  int64_t nt = HWY_DYNAMIC_DISPATCH(TileWidthT)(w.g, a.n);
  if (w.g == 1 && !w.implicit_cols) {
    if (const int64_t narrow = HWY_DYNAMIC_DISPATCH(NarrowCsrWidthT)(a.n)) nt = narrow;
  }
  // Loop order by bytes moved from beyond L2: task-outer keeps a task's weights cached across the
  // token tiles but streams all of X^T once per task; tile-outer keeps one X^T tile cached for
  // every task but streams all the weights once per tile. Very sparse weights are smaller than X^T
  // times the task count, so they go tile-outer (measured here, 4096x4096 n = 512, one thread,
  // CPU time: 99% unstructured 31 -> 22 ms, and about 30% more with the L2-sized tiles below).
  // The order changes no sum: the bits are the same.
  //
  // Tile-outer wants the X^T tile of the kernel's own width (64 tokens) in L2. Until 2026-11-30
  // (night) that budget was a quarter of L2 (512 KiB), so at k = 4096 tile-outer ran 32-token
  // tiles, which cost the kernels half their X^T load reuse (4 rows x 2 vectors of accumulators
  // instead of x 4, CSR pairs x 2 instead of x 4), and it was kept for weights under half of X^T
  // only. With three quarters of L2 (XtTileL2Bytes) the 64-token tile of k = 4096 fits, and
  // tile-outer wins wherever it moves fewer bytes. Measured here (n = 512, sparq ms, old rule ->
  // this one, medians of two interleaved rounds; weights / X^T in brackets), 4096x4096, one
  // thread: CSR 90% f32 (10 MB / 8.4 MB) 47.7 -> 33.4, bf16 47.6 -> 34.7, 95% 34.3 -> 19.8, 99%
  // 6.6 -> 5.8, BSR 32x32 90% 24.5 -> 18.8, 70% 63.8 -> 49.9, 16x16 90% 29.3 -> 18.5, V:8:2:4 (35
  // MB) 87.9 -> 77.1, V:16:2:4 79.2 -> 76.6, V:32:2:4 and BSR 50% within noise; two threads: CSR
  // 90% 21.9 -> 17.6, 95% 16.8 -> 10.5, BSR 32x32 90% 11.6 -> 9.5, 16x16 90% 13.5 -> 10.1, V:N:M
  // within noise or better; n = 128 one thread: CSR 95% 7.1 -> 5.0, V:16:2:4 21.2 -> 17.5.
  // 11008x4096 (k = 4096, 64 tasks), one thread: BSR 32x32 90% 58.0 -> 44.0, CSR 90% 94.5 -> 88.0;
  // V:16:2:4 (90 MB) stays task-outer (tile-outer 435 vs 241). k = 11008 (the 64-token tile
  // does not fit; 32 where the weights are under X^T): CSR 95% 90.2 -> 78.0 (2 threads 43.8 ->
  // 37.4), 99% 25.9 -> 19.4, the rest unchanged. Dense bf16 stays task-outer: tile-outer was
  // slower there (4096x4096 152 -> 162; why was not looked into).
  const double xt_all = static_cast<double>(a.n) * static_cast<double>(w.cols) * 4.0;
  const double wbytes = static_cast<double>(pw.weight_bytes);
  const bool fewer_bytes =
      static_cast<double>(tasks) * xt_all > static_cast<double>(CeilDiv(a.n, nt)) * wbytes;
  const bool fits_l2 = w.cols * nt * 4 <= XtTileL2Bytes();
  const auto forced = static_cast<ScgTiledOrder>(g_scg_order.load(std::memory_order_relaxed));
  const bool tile_outer =
      forced == ScgTiledOrder::kAuto
          ? a.n > nt && fewer_bytes && !w.implicit_cols && (fits_l2 || wbytes < xt_all)
          : forced == ScgTiledOrder::kTileOuter;
  // Tile-outer, the columns a row touches are scattered over the whole X^T tile, so the tile must
  // stay in L2 beside the streamed weights: narrower tiles (fewer tokens) when it would not.
  const int64_t lanes = HWY_DYNAMIC_DISPATCH(TileWidthT)(1, 1);
  while (tile_outer && nt > lanes && w.cols * nt * 4 > XtTileL2Bytes()) nt /= 2;
  const int64_t tiles = CeilDiv(a.n, nt);
  // Task-outer re-reads each task's weights once per token tile: from L2 only if they fit beside
  // the X^T tile. Where the X^T tile fits L2 but 64 tasks' weights do not (11008x4096 V:N:M: 1.4
  // MB per task beside a 1 MiB tile), cut more tasks (up to kMaxTasksL2), each with weights in
  // the rest of the L2 budget; the order stays as chosen above. Measured (one thread, V:16:2:4
  // 11008x4096 n = 512, ms, two rounds, one build with the order and task count forced):
  // task-outer with 64 / 172 tasks 158.8 / 145.6 and 178.4 / 168.3; tile-outer with 64 / 172 /
  // 256 tasks 194.0 / 160.8 / 159.0 and 199.2 / 169.2 / 173.8. Not where the X^T tile alone
  // fills L2 (4096x11008: 172 tasks streamed 22 MB of X^T each, 165-177 -> 212-227 ms before
  // the weight-run prefetch), nor for dense bf16 (11008x4096: 345-359 -> 354-369 ms). Against
  // the build before, on a noisy host (six interleaved rounds of V:16:2:4 and V:32:2:4): faster
  // in 6 of 8 one-thread pairs, by about 4% in the median.
  if (!tile_outer && tiles > 1 && !w.implicit_cols) {
    const int64_t room = XtTileL2Bytes() - w.cols * nt * 4;
    if (room > 0 && wbytes > static_cast<double>(room) * static_cast<double>(tasks)) {
      const int64_t want = std::min<int64_t>(
          kMaxTasksL2, static_cast<int64_t>(std::ceil(wbytes / static_cast<double>(room))));
      bounds = SplitTasks(cost, a.n, kTiledMinRows / w.g, cuts.align, want, cuts.offset);
      tasks = int64_t(bounds.size()) - 1;
    }
  }
  // k blocks keep the X^T slice in L1, but each (group, k block) visit costs an accumulator
  // load/store and a cursor scan: very sparse rows (99%) get wider blocks, >= ~32 columns per
  // group and block on average.
  const int64_t avg_cols = std::max<int64_t>(1, w.group_ptr.back() / std::max<int64_t>(1, w.groups()));
  const int64_t kb = tiles == 1 ? std::max<int64_t>(1, w.cols)
                                : std::max<int64_t>({16, XtBlockBytes() / (nt * 4),
                                                     32 * w.cols / avg_cols});
  const int64_t kblocks = CeilDiv(std::max<int64_t>(w.cols, 1), kb);
  // starts[b * groups + g]: group g's first column position in k block b (b = kblocks: its end),
  // found once per call (in parallel over the tasks) instead of scanning each group's columns
  // again in every token tile and k block.
  //
  // One k block (one token tile: n up to 64 tokens on AVX-512, fewer for groups elsewhere) needs no
  // scan: the blocks' starts are the group pointers (block b of group gi at starts[b * stride +
  // gi], stride 1), and the call saves a parallel region, which costs a wake-up of the sleeping
  // workers (tens of us on this VM) beside SmolLM2-sized products of 20-60 us.
  const int64_t groups = w.groups();
  const int64_t stride = kblocks == 1 ? 1 : groups;
  const int64_t* starts = w.group_ptr.data();
  if (kblocks > 1) {
    int64_t* found = reinterpret_cast<int64_t*>(ThreadBuffer(4, (kblocks + 1) * groups * 2));
    ParallelTasks(pool, tasks, [&](int64_t task, int) {
      for (int64_t gi = bounds[task]; gi < bounds[task + 1]; ++gi) {
        int64_t p = w.group_ptr[gi];
        const int64_t end = w.group_ptr[gi + 1];
        for (int64_t b = 0; b < kblocks; ++b) {
          if (w.implicit_cols) {
            p = w.group_ptr[gi] + b * kb;
          } else {
            while (p < end && w.Col(p) < b * kb) ++p;
          }
          found[b * groups + gi] = p;
        }
        found[kblocks * groups + gi] = end;
      }
    });
    starts = found;
  }
  // A narrow CSR tile (nt under one vector: one token tile, one k block) reads its weights in one
  // pass; beyond L2 they are prefetched (kCsrStreamAhead in spmm-inl.h).
  const bool stream_w = nt < lanes && wbytes > static_cast<double>(CoreL2Bytes());
  // Token tiles [tile0, tile1) of one task's groups, over X^T tiles from xt (tile tile0 first).
  auto run = [&](const float* xt, int64_t task, int64_t tile0, int64_t tile1) {
    const int64_t g0 = bounds[task], g1 = bounds[task + 1];
    float* scratch = ThreadBuffer(1, (g1 - g0) * w.g * nt);
    const bool pf = XtPrefetchWorthIt(w.cols, nt, (g1 - g0) * w.g * nt * 4);
    const int64_t r0 = w.group_row[g0], r1 = w.group_row[g1];
    int64_t* row_off = reinterpret_cast<int64_t*>(ThreadBuffer(3, (r1 - r0) * 2));
    for (int64_t gi = g0; gi < g1; ++gi) {
      for (int64_t r = w.group_row[gi]; r < w.group_row[gi + 1]; ++r) {
        row_off[r - r0] = ((gi - g0) * w.g + r - w.group_row[gi]) * nt;  // [group][g][nt]
      }
    }
    for (int64_t tile = tile0; tile < tile1; ++tile) {
      const float* xtt = xt + (tile - tile0) * w.cols * nt;
      for (int64_t b = 0; b < kblocks; ++b) {
        ScgBlock blk;
        blk.first = b == 0;
        blk.stream = stream_w;
        blk.pb = starts + b * stride + g0;
        blk.pe = starts + (b + 1) * stride + g0;
        const XtNext next = NextXtSlice(pf, xt, w.cols, nt, tile - tile0, tile1 - tile0,
                                        std::min(w.cols, (b + 1) * kb), w.cols, kb, 1);
        HWY_DYNAMIC_DISPATCH(ScgTiledT)(&w, nt, g0, g1, xtt, &blk, scratch, &next);
      }
      WriteTile(scratch, row_off, r0, r1, tile * nt, std::min(a.n, (tile + 1) * nt), a, w.rows,
                stream);
    }
  };
  if (tile_outer) {
    // Each X^T tile is built just before its tasks run, into one tile-sized buffer (1 MiB, not
    // 8, at 4096x4096 n = 512), still in L2 when they read it: 99% CSR 6.0 -> 5.3 ms on one
    // thread (medians of 3 interleaved rounds).
    //
    // With several threads and enough tiles to share evenly, each thread takes whole tiles: it
    // transposes its own X^T tile and runs every task over it, so the tile never leaves its core,
    // and there is one parallel call instead of two per tile. Splitting each tile's tasks across
    // the threads instead had every core read X^T that the other had transposed (the likely
    // reason why the two transposes, ~2 ms of a 4096x4096 n = 512 call, took as long on 2 threads
    // as on 1). Measured (2 threads, 4096x4096, sparq ms, tasks split -> whole tiles, three
    // interleaved rounds): n = 512: CSR 99% 3.7-4.4 -> 2.5-2.7, 90% 17.3-17.8 -> 15.3-16.4, BSR
    // 32x32 90% 9.5-10.6 -> 8.0-9.0, V:16:2:4 37.9-41.4 -> 37.7-39.1; n = 128 (2 tiles): CSR 99%
    // 1.02 -> 0.69, BSR 2.4 -> 2.1. With 3 tiles on 2 threads whole tiles were slower (n = 192:
    // CSR 90% 6.7 -> 8.3), hence the rule below. The bits do not depend on who runs a (tile,
    // task).
    const int threads = pool == nullptr ? 1 : pool->num_threads();
    if (threads > 1 && (tiles % threads == 0 || tiles >= 4 * threads)) {
      ParallelTasks(pool, tiles, [&](int64_t tile, int) {
        const float* xt = BuildXt(a, w.cols, w.cols, nt, nullptr, 0, tile, tile + 1);
        for (int64_t task = 0; task < tasks; ++task) run(xt, task, tile, tile + 1);
      });
    } else {
      for (int64_t tile = 0; tile < tiles; ++tile) {
        const float* xt = BuildXt(a, w.cols, w.cols, nt, pool, 0, tile, tile + 1);
        ParallelTasks(pool, tasks, [&](int64_t task, int) { run(xt, task, tile, tile + 1); });
      }
    }
  } else {
    const float* xt = BuildXt(a, w.cols, w.cols, nt, pool);
    ParallelTasks(pool, tasks, [&](int64_t task, int) { run(xt, task, 0, tiles); });
  }
}

}  // namespace

float ApplyEpilogue(float v, int64_t t, int64_t r, int64_t m, const Epilogue& ep) {
  if (ep.bias) v += ep.bias[r];
  switch (ep.act) {
    case Activation::kNone: break;
    case Activation::kRelu: v = v > 0.0f ? v : 0.0f; break;
    case Activation::kGelu: v = 0.5f * v * (1.0f + std::erf(v * 0.70710678118654752f)); break;
    case Activation::kSilu: v = v / (1.0f + std::exp(-v)); break;
  }
  if (ep.residual) v += ep.residual[t * (ep.ld_residual ? ep.ld_residual : m) + r];
  return v;
}

void EpilogueRowVector(float* y, int64_t t, int64_t r0, int64_t r1, int64_t m,
                       const Epilogue& ep) {
  HWY_DYNAMIC_DISPATCH(EpilogueRowT)(y, t, r0, r1, m, &ep);
}

namespace {
// Every product dispatches through here: a flag test, not the target list (building that string
// on every call cost 3% of a whole model's decode).
void ApplyMaxIsaOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* env = std::getenv("SPARQ_MAX_ISA");
    if (!env || !*env) return;
    const std::string s(env);
    int64_t cap = 0;
    if (s == "AVX3_DL") cap = HWY_AVX3_DL;
    if (s == "AVX3" || s == "AVX512") cap = HWY_AVX3;
    if (s == "AVX2") cap = HWY_AVX2;
    if (s == "SSE4") cap = HWY_SSE4;
    if (s == "SSSE3") cap = HWY_SSSE3;
    if (s == "EMU128" || s == "SCALAR") cap = HWY_EMU128 | HWY_SCALAR;
    if (cap == 0) {
      std::fprintf(stderr, "sparq: SPARQ_MAX_ISA=%s not recognised (AVX3_DL, AVX3, AVX2, SSE4, SSSE3, SCALAR)\n",
                   env);
      return;
    }
    const int64_t lowest = cap & -cap;
    int64_t allowed = 0;
    for (int64_t t : hwy::SupportedAndGeneratedTargets()) {
      if (t >= lowest) allowed |= t;
    }
    if (allowed) hwy::SetSupportedTargetsForTest(allowed);
  });
}
}  // namespace

const std::vector<SpmmKernel>& SpmmRegistry() {
  static const std::vector<SpmmKernel> kKernels = {
      {"DenseF32Blas", PackedKind::kDenseF32, 0, INT64_MAX, false, RunDenseBlas},
      // The ranges span DecodeLimitsT of every target.
      {"SpmmNm_decode", PackedKind::kNm, 0, 16, true, RunDecode},
      {"SpmmNm_tiled", PackedKind::kNm, 5, INT64_MAX, true, RunRowTiled},
      {"SpmmScg_decode", PackedKind::kScg, 0, 12, true, RunDecode},
      {"SpmmScg_tiled", PackedKind::kScg, 2, INT64_MAX, true, RunScgTiled},
      {"SpmmMask_decode", PackedKind::kMask, 0, 12, true, RunDecode},
      {"SpmmMask_tiled", PackedKind::kMask, 9, INT64_MAX, true, RunRowTiled},
  };
  return kKernels;
}

bool AmdFamily19h() {
  static const bool v = [] {
#if HWY_ARCH_X86
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid(0, &eax, &ebx, &ecx, &edx)) return false;
    // "AuthenticAMD" in ebx, edx, ecx.
    if (ebx != 0x68747541u || edx != 0x69746e65u || ecx != 0x444d4163u) return false;
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
    const unsigned base = (eax >> 8) & 0xf;
    return (base == 0xf ? base + ((eax >> 20) & 0xff) : base) == 0x19;
#else
    return false;
#endif
  }();
  return v;
}

void SetStreamYForTest(StreamYMode mode) {
  g_stream_y.store(static_cast<int>(mode), std::memory_order_relaxed);
}

void SetScgTiledOrderForTest(ScgTiledOrder order) {
  g_scg_order.store(static_cast<int>(order), std::memory_order_relaxed);
}

int64_t DecodeMaxN(const PackedWeight& w) {
  DecodeLimits b;
  HWY_DYNAMIC_DISPATCH(DecodeLimitsT)(&b);
  switch (w.kind) {
    case PackedKind::kNm:
      return w.nm.m == 2 * w.nm.n ? b.nm_window : b.nm_gather;
    case PackedKind::kScg:
      if (w.scg.implicit_cols) return b.dense_bf16;
      return w.scg.g == 1 ? b.csr : b.groups;
    case PackedKind::kMask:  // denser than 40%, or sparser
      return 10 * w.stored >= 4 * w.rows * w.cols ? b.mask : b.sparse_mask;
    case PackedKind::kDenseF32:
      break;
  }
  return 0;
}

const SpmmKernel& ChooseKernel(const PackedWeight& w, int64_t n) {
  ApplyMaxIsaOnce();
  const bool decode = n <= DecodeMaxN(w);
  for (const auto& k : SpmmRegistry()) {
    if (k.kind == w.kind && (k.kind == PackedKind::kDenseF32 || (k.run == RunDecode) == decode)) {
      return k;
    }
  }
  return SpmmRegistry().front();  // unreachable: every sparse kind has a decode and a tiled row
}

void RunSharedInput(const float* x, int64_t n, int64_t ldx, const SharedInputJob* jobs,
                    size_t count, ThreadPool* pool) {
  if (count == 0 || n <= 0) return;
  std::vector<DecodeJob> decode;
  decode.reserve(count);
  bool fuse = true;
  for (size_t j = 0; j < count; ++j) {
    const PackedWeight& w = *jobs[j].w;
    SpmmArgs a;
    a.x = x;
    a.n = n;
    a.ldx = ldx > 0 ? ldx : w.cols;
    a.y = jobs[j].y;
    a.ldy = jobs[j].ldy > 0 ? jobs[j].ldy : w.rows;
    a.ep = jobs[j].ep;
    decode.push_back({&w, a});
    fuse = fuse && ChooseKernel(w, n).run == RunDecode && SameDecodeInput(*jobs[0].w, w);
  }
  if (fuse) {
    RunDecodeJobs(decode.data(), decode.size(), pool);
    return;
  }
  bool row_tiled = true;
  for (const DecodeJob& d : decode) {
    row_tiled = row_tiled && ChooseKernel(*d.w, n).run == RunRowTiled;
  }
  if (row_tiled && count > 1) {
    RunRowTiledJobs(decode, pool);
    return;
  }
  for (const DecodeJob& d : decode) ChooseKernel(*d.w, n).run(*d.w, d.a, pool);
}

bool RunSwiGlu(const PackedWeight& gate, const PackedWeight& up, const PackedWeight& down,
               const float* x, const float* x_up, int64_t n, const int32_t* down_row,
               const float* residual, float* y, ThreadPool* pool) {
  if (!SwiGluFuses(gate, up, down, n)) return false;
  const int64_t nt = HWY_DYNAMIC_DISPATCH(RowTileWidthT)(n);
  const int64_t tiles = CeilDiv(n, nt);
  SpmmArgs in;
  in.x = x;
  in.n = n;
  in.ldx = gate.cols;
  const int64_t in_rows = std::max(RowTiledKRows(gate), RowTiledKRows(up));
  const float* xt = BuildXt(in, gate.cols, in_rows, nt, pool);
  const float* xt_up = xt;
  if (x_up != nullptr && x_up != x) {  // up reads its own (differently permuted) input
    in.x = x_up;
    xt_up = BuildXt(in, gate.cols, in_rows, nt, pool, 5);
  }
  const RowTiled rg(gate, xt, n, nt, in_rows), ru(up, xt_up, n, nt, in_rows);
  // down's X^T tiles, written by the gate/up tasks; its rows past n_ff are zero. Padded tokens
  // need nothing: their X^T columns are zero, so they come out as silu(0) * 0 = 0.
  const int64_t k_rows = RowTiledKRows(down);
  float* act = ThreadBuffer(4, tiles * k_rows * nt);
  for (int64_t tile = 0; tile < tiles; ++tile) {
    std::fill(act + (tile * k_rows + gate.rows) * nt, act + (tile + 1) * k_rows * nt, 0.0f);
  }
  std::vector<int64_t> cost = RowCost(gate);
  const std::vector<int64_t> cost_up = RowCost(up);
  for (size_t i = 0; i < cost.size(); ++i) cost[i] += cost_up[i];
  const auto bounds = SplitTasks(cost, n, kTiledMinRows, std::max(rg.align(), ru.align()));
  ParallelTasks(pool, int64_t(bounds.size()) - 1, [&](int64_t task, int) {
    const int64_t r0 = bounds[task], r1 = bounds[task + 1], rows = r1 - r0;
    const RowTaskSpace s =
        RowTaskBuffers(rows, nt, 2, std::max(rg.off_entries(), ru.off_entries()));
    float* sg = s.scratch;
    float* su = s.scratch + rows * nt;
    const bool pf_g = rg.prefetch(rows), pf_u = ru.prefetch(rows);
    for (int64_t tile = 0; tile < tiles; ++tile) {
      rg.Tile(r0, r1, tile, pf_g, sg, s.cursor, s.off);
      ru.Tile(r0, r1, tile, pf_u, su, s.cursor, s.off);
      float* dst = act + tile * k_rows * nt;
      if (down_row == nullptr) {  // rows r0..r1 are one contiguous block of down's X^T
        HWY_DYNAMIC_DISPATCH(SiluMulT)(sg, su, rows * nt, dst + r0 * nt);
      } else {
        HWY_DYNAMIC_DISPATCH(SiluMulT)(sg, su, rows * nt, sg);
        for (int64_t r = r0; r < r1; ++r) {
          std::memcpy(dst + down_row[r] * nt, sg + (r - r0) * nt, sizeof(float) * nt);
        }
      }
    }
  });
  SpmmArgs out;
  out.n = n;
  out.y = y;
  out.ldy = down.rows;
  out.ep.residual = residual;
  RunRowTiledXt(RowTiled(down, act, n, nt, k_rows), out, pool);
  return true;
}

bool SwiGluFuses(const PackedWeight& gate, const PackedWeight& up, const PackedWeight& down,
                 int64_t n) {
  auto row_tiled = [n](const PackedWeight& w) { return ChooseKernel(w, n).run == RunRowTiled; };
  return n > 0 && row_tiled(gate) && row_tiled(up) && row_tiled(down) && gate.rows == up.rows &&
         gate.cols == up.cols && down.cols == gate.rows;
}

std::string ApplyMaxIsaFromEnv() {
  ApplyMaxIsaOnce();
  std::string out;
  for (int64_t t : hwy::SupportedAndGeneratedTargets()) out += std::string(hwy::TargetName(t)) + " ";
  return out + "(running " + HWY_DYNAMIC_DISPATCH(TargetNameT)() + ")";
}

}  // namespace sparq::cpu
#endif  // HWY_ONCE
