// MaskedWeightGrad (sparq/sddmm.h): dW at the kept positions only, one dot product over the tokens
// per kept weight. dY and X are first transposed into token tiles ([tile][row][T], tokens
// contiguous, 64-byte aligned); then, tile by tile, each row's kept weights of a column block
// (whose X^T slice stays in L1) are taken 16 at a time (AVX-512): 16 dot products over the tile's
// tokens with the row's dY tile in registers, reduced together (a transpose-and-add tree, 45
// shuffles and adds) into 16 values added to dw_kept with one vector. A dense dY^T X does twice
// the work at 2:4 and 10x at 90%.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/cpu/sddmm.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>

#ifndef SPARQ_CPU_SDDMM_TASK_
#define SPARQ_CPU_SDDMM_TASK_
namespace sparq::cpu {
struct SddmmTask {
  const float* dyt;  // [tiles][m][T]
  const float* xt;   // [tiles][k][T]
  const int64_t* row_begin;  // [m + 1] into kept
  float* out;
  int64_t m, k, tiles, cblock;
};
// The windowed form: every row keeps exactly S weights in every window of L columns (L = the
// target's f32 lanes), as N:M masks with m dividing L do.
struct SddmmWindowTask {
  const float* dyp;     // [m / L][n][L]: dY's rows in blocks of L, token by token
  const float* xp;      // [k / L][n][L]: X's columns likewise
  const uint8_t* slot;  // [m / L][k / L][S][L]: lane i's s-th kept column in the window
  float* out;           // dw_kept: row r's window w, slot s at r * (k / L) * S + w * S + s
  int64_t n, m, k, S;
};
}  // namespace sparq::cpu
#endif

HWY_BEFORE_NAMESPACE();
namespace sparq::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
// 256 tokens: a column block of 32 X^T rows (a 2:4 row's 16 kept weights) is 32 KiB, in L1.
constexpr int64_t kSddmmTile = 256;

// The reduction tree of 16 vectors a[0..15] into one whose lane j is the sum of a[j]'s lanes, in
// three steps that the group below interleaves with its dot products: Pair(a[2p], a[2p+1]) (each
// 128-bit block: block sums of the two, by unpack and add), Quad of two pairs (64-bit unpack: each
// block holds 4 vectors' block sums), then Blk twice across 128-bit blocks.
HWY_INLINE __m512 Pair(__m512 a, __m512 b) {
  return _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
}
HWY_INLINE __m512 Quad(__m512 x, __m512 y) {
  const __m512d a = _mm512_castps_pd(x), b = _mm512_castps_pd(y);
  return _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                       _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
}
HWY_INLINE __m512 Blk(__m512 a, __m512 b) {
  return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(a, b, 0xDD));
}

// cnt (1..16) kept weights of one row, columns col[0..cnt); xt: this tile's X^T. The row's 16 dY
// vectors (256 tokens) stay in registers; each column's dot product runs as two FMA chains whose
// other operand is its X^T vector straight from memory (one pointer, immediate offsets), and the
// 16 results fold into the reduction tree as they come, so registers never spill. (Keeping 16
// sums over an outer token loop instead needs 16 column pointers, which spill: 0.27 against
// 0.20 ns per FMA on an Emerald Rapids VM, where a dense FMA loop takes 0.14.)
template <bool kFull>
HWY_INLINE void SddmmGroup(const float* dyr, const float* xt, const int32_t* col, int cnt,
                           float* out) {
  __m512 d[16];
#pragma GCC unroll 16
  for (int v = 0; v < 16; ++v) d[v] = _mm512_loadu_ps(dyr + 16 * v);
  auto dot = [&](int j) {
    if (!kFull && j >= cnt) return _mm512_setzero_ps();
    const float* p = xt + static_cast<int64_t>(col[j]) * kSddmmTile;
    __m512 s0 = _mm512_mul_ps(d[0], _mm512_loadu_ps(p));
    __m512 s1 = _mm512_mul_ps(d[1], _mm512_loadu_ps(p + 16));
#pragma GCC unroll 7
    for (int v = 2; v < 16; v += 2) {
      s0 = _mm512_fmadd_ps(d[v], _mm512_loadu_ps(p + 16 * v), s0);
      s1 = _mm512_fmadd_ps(d[v + 1], _mm512_loadu_ps(p + 16 * v + 16), s1);
    }
    return _mm512_add_ps(s0, s1);
  };
  __m512 q[4];
#pragma GCC unroll 4
  for (int g = 0; g < 4; ++g) {
    const __m512 a = Pair(dot(4 * g), dot(4 * g + 1));
    const __m512 b = Pair(dot(4 * g + 2), dot(4 * g + 3));
    q[g] = Quad(a, b);
  }
  const __m512 r = Blk(Blk(q[0], q[1]), Blk(q[2], q[3]));
  const __mmask16 mk = kFull ? __mmask16(0xFFFF) : __mmask16((1u << cnt) - 1u);
  _mm512_mask_storeu_ps(out, mk, _mm512_add_ps(_mm512_maskz_loadu_ps(mk, out), r));
}

HWY_INLINE void SddmmRun(const float* dyr, const float* xt, const int32_t* col, int64_t cnt,
                         float* out) {
  int64_t i = 0;
  for (; i + 16 <= cnt; i += 16) SddmmGroup<true>(dyr, xt, col + i, 16, out + i);
  if (i < cnt) SddmmGroup<false>(dyr, xt, col + i, static_cast<int>(cnt - i), out + i);
}
#else
constexpr int64_t kSddmmTile = 8 * HWY_LANES(float);

// One dot product per kept weight, each reduced on its own (the portable form).
HWY_INLINE void SddmmRun(const float* dyr, const float* xt, const int32_t* col, int64_t cnt,
                         float* out) {
  const hn::ScalableTag<float> df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t i = 0; i < cnt; ++i) {
    const float* p = xt + static_cast<int64_t>(col[i]) * kSddmmTile;
    auto s = hn::Mul(hn::LoadU(df, dyr), hn::LoadU(df, p));
    for (int64_t t = L; t < kSddmmTile; t += L) {
      s = hn::MulAdd(hn::LoadU(df, dyr + t), hn::LoadU(df, p + t), s);
    }
    out[i] += hn::GetLane(hn::SumOfLanes(df, s));
  }
}
#endif

int64_t SddmmTileT() { return kSddmmTile; }
int64_t SddmmLanesT() { return static_cast<int64_t>(hn::Lanes(hn::ScalableTag<float>())); }

// Windowed SDDMM: lanes are L rows of W. Per token, one vector of dY (the L rows) and one of X
// (a window of L columns), whose lanes a table lookup (vpermps) moves to each row's kept column,
// once per slot: every FMA is a kept weight's, with no reduction across lanes (the dot-product
// form sums 16 lanes per kept weight and reads an X^T vector per FMA: 0.66x the dense dW at 2:4).
// G windows at a time keep S * G = 8 FMA chains in flight. Each sum runs over the tokens in
// order, so the bits do not depend on the threads.
template <int S, int G>
HWY_INLINE void SddmmWindows(const SddmmWindowTask& t, int64_t rb, int64_t w0, float* buf) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<uint8_t, decltype(di)> d8;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  const int64_t W = t.k / L;
  using V = hn::Vec<decltype(df)>;
  using I = decltype(hn::IndicesFromVec(df, hn::Zero(di)));
  V acc[G][S];
  I ind[G][S];
  const float* xb[G];
  for (int g = 0; g < G; ++g) {
    xb[g] = t.xp + (w0 + g) * t.n * L;
    const uint8_t* sl = t.slot + ((rb * W + w0 + g) * S) * L;
    for (int s = 0; s < S; ++s) {
      acc[g][s] = hn::Zero(df);
      ind[g][s] = hn::IndicesFromVec(df, hn::PromoteTo(di, hn::LoadU(d8, sl + s * L)));
    }
  }
  const float* dyb = t.dyp + rb * t.n * L;
  for (int64_t tok = 0; tok < t.n; ++tok) {
    const V dv = hn::Load(df, dyb + tok * L);
    for (int g = 0; g < G; ++g) {
      const V xv = hn::Load(df, xb[g] + tok * L);
      for (int s = 0; s < S; ++s) {
        acc[g][s] = hn::MulAdd(hn::TableLookupLanes(xv, ind[g][s]), dv, acc[g][s]);
      }
    }
  }
  const int64_t per_row = W * S;
  for (int g = 0; g < G; ++g) {
    for (int s = 0; s < S; ++s) hn::StoreU(acc[g][s], df, buf + s * L);
    float* o = t.out + rb * L * per_row + (w0 + g) * S;
    for (int64_t i = 0; i < L; ++i) {
      for (int s = 0; s < S; ++s) o[i * per_row + s] += buf[s * L + i];
    }
  }
}

template <int S>
void SddmmWindowBlocks(const SddmmWindowTask& t, int64_t rb0, int64_t rb1) {
  constexpr int G = S >= 8 ? 1 : 8 / S;
  const int64_t L = static_cast<int64_t>(hn::Lanes(hn::ScalableTag<float>()));
  const int64_t W = t.k / L;
  HWY_ALIGN float buf[8 * HWY_LANES(float)];
  // Blocks of windows whose X panels stay in L2 (~512 KiB) while every row block of the task
  // passes over them: without, each row block streamed all of X from L3 (2 GB per call at 4096 x
  // 4096, 512 tokens), and two threads ran no faster than one.
  const int64_t panel = t.n * L * static_cast<int64_t>(sizeof(float));
  const int64_t WB = std::max<int64_t>(G, (int64_t{512} << 10) / std::max<int64_t>(panel, 1) / G * G);
  for (int64_t w0 = 0; w0 < W; w0 += WB) {
    const int64_t w1 = std::min(W, w0 + WB);
    for (int64_t rb = rb0; rb < rb1; ++rb) {
      int64_t w = w0;
      for (; w + G <= w1; w += G) SddmmWindows<S, G>(t, rb, w, buf);
      for (; w < w1; ++w) SddmmWindows<S, 1>(t, rb, w, buf);
    }
  }
}

// Row blocks [rb0, rb1) of the windowed task (S is 1, 2, 4 or 8: checked by the caller).
void SddmmWindowRowsT(const SddmmWindowTask* tp, int64_t rb0, int64_t rb1) {
  switch (tp->S) {
    case 1: return SddmmWindowBlocks<1>(*tp, rb0, rb1);
    case 2: return SddmmWindowBlocks<2>(*tp, rb0, rb1);
    case 4: return SddmmWindowBlocks<4>(*tp, rb0, rb1);
    default: return SddmmWindowBlocks<8>(*tp, rb0, rb1);
  }
}

// Rows [r0, r1) of the task, every token tile in order, column blocks of t.cblock. col: the task's
// kept columns (index 0 = kept weight row_begin[r0]); bstart[(r - r0) * (nblk + 1) + b]: where
// row r's block b starts in col.
void SddmmRowsT(const SddmmTask* tp, int64_t r0, int64_t r1, const int32_t* col,
                const int64_t* bstart) {
  const SddmmTask& t = *tp;
  const int64_t nblk = (t.k + t.cblock - 1) / t.cblock;
  float* out = t.out + t.row_begin[r0];
  for (int64_t tile = 0; tile < t.tiles; ++tile) {
    const float* dyt = t.dyt + tile * t.m * kSddmmTile;
    const float* xt = t.xt + tile * t.k * kSddmmTile;
    for (int64_t b = 0; b < nblk; ++b) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t* bs = bstart + (r - r0) * (nblk + 1) + b;
        if (bs[1] > bs[0]) SddmmRun(dyt + r * kSddmmTile, xt, col + bs[0], bs[1] - bs[0], out + bs[0]);
      }
    }
  }
}

}  // namespace sparq::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <algorithm>
#include <bit>
#include <cstring>
#include <hwy/aligned_allocator.h>
#include <climits>
#include <functional>
#include <string>
#include <vector>

#include "sparq/sddmm.h"
#include "src/cpu/kernel_entry.h"

namespace sparq::cpu {

HWY_EXPORT(SddmmTileT);
HWY_EXPORT(SddmmRowsT);
HWY_EXPORT(SddmmLanesT);
HWY_EXPORT(SddmmWindowRowsT);

namespace {

Status CheckLen(const char* what, size_t have, int64_t want) {
  if (static_cast<int64_t>(have) != want) {
    return InvalidInput(std::string("MaskedWeightGrad: ") + what + " has " + std::to_string(have) +
                        " values, the shapes say " + std::to_string(want));
  }
  return Status::Ok();
}

void ForTasks(ThreadPool* pool, int64_t n, const std::function<void(int64_t)>& fn) {
  if (pool != nullptr && n > 1) {
    pool->ParallelFor(n, [&](int64_t i, int) { fn(i); });
  } else {
    for (int64_t i = 0; i < n; ++i) fn(i);
  }
}

float* TileBuffer(int slot, size_t len) {
  thread_local hwy::AlignedFreeUniquePtr<float[]> buf[2];
  thread_local size_t cap[2] = {0, 0};
  if (cap[slot] < len) {
    buf[slot] = hwy::AllocateAligned<float>(len);
    cap[slot] = buf[slot] ? len : 0;
  }
  return buf[slot].get();
}

// src [n, cols] -> dst [tiles][cols][T]; the last tile's tokens past n are zeroed (they add 0).
void ToTiles(const KernelConfig& cfg, const float* src, int64_t n, int64_t cols, int64_t T,
             float* dst, ThreadPool* pool) {
  constexpr int64_t kChunk = 256;
  const int64_t tiles = (n + T - 1) / T, chunks = (cols + kChunk - 1) / kChunk;
  ForTasks(pool, tiles * chunks, [&](int64_t task) {
    const int64_t tile = task / chunks, c0 = task % chunks * kChunk;
    const int64_t rows = std::min(T, n - tile * T), nc = std::min(kChunk, cols - c0);
    float* d = dst + (tile * cols + c0) * T;
    TransposeAt(cfg, src + tile * T * cols + c0, cols, rows, nc, d, T, false);
    if (rows < T) {
      for (int64_t c = 0; c < nc; ++c) std::memset(d + c * T + rows, 0, (T - rows) * sizeof(float));
    }
  });
}

// S when every row keeps exactly S (1, 2, 4 or 8) weights in every window of L columns and m and k
// are multiples of L (the windowed form's precondition), else 0. kept is ascending (checked).
int64_t WindowSlots(std::span<const int64_t> kept, int64_t k, int64_t m, int64_t L) {
  if (L < 2 || m % L != 0 || k % L != 0 || m == 0) return 0;
  const int64_t W = k / L;
  if (static_cast<int64_t>(kept.size()) % (m * W) != 0) return 0;
  const int64_t S = static_cast<int64_t>(kept.size()) / (m * W);
  if (S != 1 && S != 2 && S != 4 && S != 8) return 0;
  if (S > L) return 0;
  // Entry i is slot i % S of window i / S of the flattened [m, k / L] windows, so its position
  // divided by L is i / S (L and S are powers of two): one pass the compiler vectorizes.
  const int lg_l = std::countr_zero(static_cast<uint64_t>(L)), lg_s = std::countr_zero(static_cast<uint64_t>(S));
  if ((int64_t{1} << lg_l) != L) return 0;
  bool bad = false;
  const int64_t nk = static_cast<int64_t>(kept.size());
  for (int64_t i = 0; i < nk; ++i) bad |= (kept[i] >> lg_l) != (i >> lg_s);
  return bad ? 0 : S;
}

std::vector<uint8_t>& SlotBuffer() {
  thread_local std::vector<uint8_t> buf;
  return buf;
}

Status WindowedGrad(std::span<const float> dy, std::span<const float> x, int64_t n, int64_t k,
                    int64_t m, int64_t L, int64_t S, std::span<const int64_t> kept,
                    std::span<float> dw_kept, ThreadPool* pool, int c) {
  // Panels of L rows (dY) and L columns (X), token by token: each kernel pass reads two of them
  // front to back (the layouts' rows lie 4 * m or 4 * k bytes apart, a page or more, which the
  // hardware prefetchers do not follow).
  float* dyp = TileBuffer(0, static_cast<size_t>(n * m));
  float* xp = TileBuffer(1, static_cast<size_t>(n * k));
  if (dyp == nullptr || xp == nullptr) return Internal("MaskedWeightGrad: no memory for the panels");
  std::vector<uint8_t>& slot = SlotBuffer();
  slot.resize(kept.size());
  const int64_t MB = m / L, W = k / L, per_row = W * S;
  const size_t lane_bytes = static_cast<size_t>(L) * sizeof(float);
  ForTasks(pool, MB + W, [&](int64_t b) {
    const bool is_dy = b < MB;
    const int64_t blk = is_dy ? b : b - MB, cols = is_dy ? m : k;
    const float* src = (is_dy ? dy.data() : x.data()) + blk * L;
    float* dst = (is_dy ? dyp : xp) + blk * n * L;
    for (int64_t t = 0; t < n; ++t) std::memcpy(dst + t * L, src + t * cols, lane_bytes);
  });
  const SddmmWindowTask task{dyp, xp, slot.data(), dw_kept.data(), n, m, k, S};
  const int64_t threads = pool != nullptr ? pool->num_threads() : 1;
  const int64_t ntasks = std::min<int64_t>(MB, threads * 4);
  ForTasks(pool, ntasks, [&](int64_t q) {
    const int64_t rb0 = MB * q / ntasks, rb1 = MB * (q + 1) / ntasks;
    // Row by row: the row's kept positions in order, entry q to slot q % S of window q / S, lane
    // i (a position within its window is its low lg(L) bits).
    for (int64_t r = rb0 * L; r < rb1 * L; ++r) {
      const int64_t* kr = kept.data() + r * per_row;
      uint8_t* o = slot.data() + (r / L) * per_row * L + r % L;
      for (int64_t q = 0; q < per_row; ++q) o[q * L] = static_cast<uint8_t>(kr[q] & (L - 1));
    }
    HWY_DISPATCH_TABLE(SddmmWindowRowsT)[c](&task, rb0, rb1);
  });
  return Status::Ok();
}

}  // namespace

bool MaskedWeightGradWindowed(int64_t k, int64_t m, std::span<const int64_t> kept,
                              const KernelConfig& cfg) {
  if (k <= 0 || m <= 0 || kept.empty()) return false;
  return WindowSlots(kept, k, m, HWY_DISPATCH_TABLE(SddmmLanesT)[cfg.dispatch_index]()) > 0;
}

Status MaskedWeightGrad(std::span<const float> dy, std::span<const float> x, int64_t n, int64_t k,
                        int64_t m, std::span<const int64_t> kept, std::span<float> dw_kept,
                        ThreadPool* pool, const KernelConfig& cfg) {
  if (n < 0 || k < 0 || m < 0) return InvalidInput("MaskedWeightGrad: negative shape");
  SPARQ_RETURN_IF_ERROR(CheckLen("dy", dy.size(), n * m));
  SPARQ_RETURN_IF_ERROR(CheckLen("x", x.size(), n * k));
  SPARQ_RETURN_IF_ERROR(CheckLen("dw_kept", dw_kept.size(), static_cast<int64_t>(kept.size())));
  // One pass the compiler vectorizes (this runs on every training step, over every kept weight);
  // the loop below names the first bad entry.
  bool bad = !kept.empty() && (kept[0] < 0 || kept.back() >= m * k);
  for (size_t i = 1; i < kept.size(); ++i) bad |= kept[i] <= kept[i - 1];
  for (size_t i = 0; bad && i < kept.size(); ++i) {
    if (kept[i] < 0 || kept[i] >= m * k || (i > 0 && kept[i] <= kept[i - 1])) {
      return InvalidInput("MaskedWeightGrad: kept[" + std::to_string(i) + "] = " +
                          std::to_string(kept[i]) +
                          (kept[i] < 0 || kept[i] >= m * k
                               ? " is outside W[" + std::to_string(m) + ", " + std::to_string(k) + "]"
                               : std::string(" is not above the entry before it")));
    }
  }
  if (k > INT32_MAX) return InvalidInput("MaskedWeightGrad: k = " + std::to_string(k) + " over 2^31");
  if (n == 0 || kept.empty()) return Status::Ok();
  const int c = cfg.dispatch_index;
  const int64_t L = HWY_DISPATCH_TABLE(SddmmLanesT)[c]();
  if (const int64_t S = WindowSlots(kept, k, m, L); S > 0) {
    return WindowedGrad(dy, x, n, k, m, L, S, kept, dw_kept, pool, c);
  }
  const int64_t T = HWY_DISPATCH_TABLE(SddmmTileT)[c]();
  const int64_t tiles = (n + T - 1) / T;
  // 64-byte aligned: every tile row starts a cache line, so no vector load splits two lines.
  // Kept per calling thread and grown, not freed: a training step calls this for every layer,
  // and fresh pages (faulted in one at a time) cost as much as the product at 99% sparsity.
  const size_t dyt_len = static_cast<size_t>(tiles * T * m), xt_len = static_cast<size_t>(tiles * T * k);
  float* dyt = TileBuffer(0, dyt_len);
  float* xt = TileBuffer(1, xt_len);
  if (dyt == nullptr || xt == nullptr) return Internal("MaskedWeightGrad: no memory for the token tiles");
  ToTiles(cfg, dy.data(), n, m, T, dyt, pool);
  ToTiles(cfg, x.data(), n, k, T, xt, pool);
  std::vector<int64_t> row_begin(static_cast<size_t>(m + 1));
  for (int64_t r = 0; r <= m; ++r) {
    row_begin[r] = std::lower_bound(kept.begin(), kept.end(), r * k) - kept.begin();
  }
  // Column blocks whose X^T slice fills about two thirds of L1 (row_xt_block_bytes: 32 columns
  // of 256 tokens at 48 KiB), widened where a row would keep fewer than 8 weights in one, to about
  // 16 (measured on 4096 x 4096, n = 512: 70% sparse runs best unwidened, 90% widened to 256).
  const double density = static_cast<double>(kept.size()) / static_cast<double>(m * k);
  int64_t cblock = std::max<int64_t>(16, cfg.row_xt_block_bytes / (T * 4));
  if (density * static_cast<double>(cblock) < 8.0) {
    cblock = static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(16.0 / density)));
  }
  const SddmmTask task{dyt, xt, row_begin.data(), dw_kept.data(),
                       m, k, tiles, cblock};
  // Row ranges of about equal kept counts, a few per thread. Two costs set their size (measured
  // at 4096 x 4096, 512 tokens, 1 thread, 32 to 2048 rows a task): a task's sums and columns
  // (8 bytes per kept weight) are read once per tile, best from L2 (<= kTaskKept: 2:4 ran 15%
  // faster at 32 rows than at 512); and each task reads the whole X^T tile again, which costs
  // where the column blocks are wide (sparse masks: their X^T slices come from L2 and L3; 90%
  // ran 1.6x faster at 2048 rows than at 32).
  constexpr int64_t kTaskKept = 1 << 16;
  const int64_t threads = pool != nullptr ? pool->num_threads() : 1;
  const int64_t nk = static_cast<int64_t>(kept.size());
  const int64_t per_row = std::max<int64_t>(1, nk / m);
  const int64_t task_rows = cblock > std::max<int64_t>(16, cfg.row_xt_block_bytes / (T * 4))
                                ? 2048
                                : std::max<int64_t>(32, kTaskKept / per_row);
  const int64_t ntasks = std::min<int64_t>(m, std::max(threads * 4, (m + task_rows - 1) / task_rows));
  std::vector<int64_t> bounds(static_cast<size_t>(ntasks + 1), m);
  bounds[0] = 0;
  for (int64_t q = 1, r = 0; q < ntasks; ++q) {
    const int64_t want = nk * q / ntasks;
    while (r < m && row_begin[r] < want) ++r;
    bounds[q] = std::max(r, bounds[q - 1]);
  }
  const int64_t nblk = (k + cblock - 1) / cblock;
  ForTasks(pool, ntasks, [&](int64_t q) {
    const int64_t r0 = bounds[q], r1 = bounds[q + 1];
    if (r1 <= r0) return;
    // The task's columns as int32 (half the bytes of the positions; L2-resident over the tiles)
    // and where each row's column blocks start among them.
    const int64_t base = row_begin[r0];
    std::vector<int32_t> col(static_cast<size_t>(row_begin[r1] - base));
    std::vector<int64_t> bstart(static_cast<size_t>((r1 - r0) * (nblk + 1)));
    for (int64_t r = r0; r < r1; ++r) {
      int64_t* bs = bstart.data() + (r - r0) * (nblk + 1);
      int64_t b = 0;
      for (int64_t i = row_begin[r]; i < row_begin[r + 1]; ++i) {
        const int64_t cc = kept[i] - r * k;
        col[i - base] = static_cast<int32_t>(cc);
        while (b <= cc / cblock) bs[b++] = i - base;
      }
      while (b <= nblk) bs[b++] = row_begin[r + 1] - base;
    }
    HWY_DISPATCH_TABLE(SddmmRowsT)[c](&task, r0, r1, col.data(), bstart.data());
  });
  return Status::Ok();
}

}  // namespace sparq::cpu
#endif  // HWY_ONCE
