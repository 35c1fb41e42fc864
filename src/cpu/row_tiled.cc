// The row-tiled path of N:M and bit-mask rows (many tokens): X^T tiles built once, fixed row
// tasks, k blocks whose X^T slice fits L1 (runners.h).
#include <algorithm>

#include "sparq/checked.h"
#include "src/cpu/kernel_entry.h"
#include "src/cpu/prefetch.h"
#include "src/cpu/runners.h"
#include "src/cpu/staging.h"
#include "src/cpu/tasks.h"

namespace sparq::cpu {

// Narrowest token tile that the row-tiled kernels run by k blocks even when it is the only tile
// (5 vectors on AVX-512): narrower single tiles are faster whole (docs/kernels.md). Either way the
// same sums run in the same order: the bits do not change.
constexpr int64_t kOneTileBlockMinNt = 80;

int64_t RowTiledKRows(const PackedWeight& w) {
  switch (w.kind()) {
    case PackedKind::kNm: return w.nm().k_pad;
    case PackedKind::kDenseQuant: return w.dense_quant().k_pad;
    default: return w.mask().k_pad();
  }
}


RowTiled::RowTiled(const KernelRow& row, const PackedWeight& w, const float* xt_tiles, int64_t n,
                   int64_t nt_, int64_t stride_, const KernelConfig& c)
    : pw(&w), body(row.Body(c)), cfg(&c), xt(xt_tiles), nt(nt_), tiles(CeilDiv(n, nt_)), stride(stride_) {
  if (w.kind() == PackedKind::kNm) {
    chunks = w.nm().chunks;
    chunk_cols = (kNmChunk / w.nm().n) * w.nm().m;
  } else if (w.kind() == PackedKind::kDenseQuant) {
    chunks = w.dense_quant().k_pad / kDqChunk;
    chunk_cols = kDqChunk;
  } else {
    chunks = w.mask().chunks;
    chunk_cols = kMaskChunk;
  }
  kb_chunks = tiles == 1 && nt < kOneTileBlockMinNt
                  ? std::max<int64_t>(1, chunks)
                  : std::max<int64_t>(1, c.row_xt_block_bytes / (nt * 4) / chunk_cols);
}

bool RowTiled::prefetch(int64_t rows) const {
  return XtPrefetchWorthIt(*cfg, stride, nt, rows * nt * 4);
}

void RowTiled::Tile(int64_t r0, int64_t r1, int64_t tile, bool pf, float* scratch,
                    int64_t* cursor, int32_t* off) const {
  const float* xtt = xt + tile * stride * nt;
  for (int64_t c0 = 0; c0 == 0 || c0 < chunks; c0 += kb_chunks) {
    const int64_t c1 = std::min(chunks, c0 + kb_chunks);
    const XtNext next =
        NextXtSlice(pf, xt, stride, nt, tile, tiles, c1, chunks, kb_chunks, chunk_cols,
                    cfg->row_xt_block_bytes);
    KernelCall c;
    c.w = pw;
    c.u0 = r0;
    c.u1 = r1;
    c.nt = nt;
    c.xt = xtt;
    c.c0 = c0;
    c.c1 = c1;
    c.cursor = cursor;
    c.off = off;
    c.scratch = scratch;
    c.next = &next;
    body(c);
  }
}

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
bool RowTiledJobsShareTiles(const std::vector<DecodeJob>& jobs) {
  const SpmmArgs& a0 = jobs[0].a;
  const int64_t nt = TileTokens(*jobs[0].row, *jobs[0].w, a0.n, a0.config());
  for (const DecodeJob& j : jobs) {
    if (TileTokens(*j.row, *j.w, a0.n, a0.config()) != nt) return false;
  }
  return true;
}

void RunRowTiledJobs(const std::vector<DecodeJob>& jobs, ThreadPool* pool) {
  const SpmmArgs& a0 = jobs[0].a;
  const int64_t nt = TileTokens(*jobs[0].row, *jobs[0].w, a0.n, a0.config());
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
    rts.emplace_back(*jobs[j].row, *jobs[j].w, xt, a0.n, nt, stride, a0.config());
    stream[j] = StreamY(jobs[j].a, jobs[j].w->rows, pool);
    const auto bounds = RowTiledBounds(rts.back(), jobs[j].a, stream[j]);
    for (size_t b = 0; b + 1 < bounds.size(); ++b) tasks.push_back({j, bounds[b], bounds[b + 1]});
  }
  ParallelTasks(pool, static_cast<int64_t>(tasks.size()), [&](int64_t t, int) {
    const Task& tk = tasks[static_cast<size_t>(t)];
    RowTiledTask(rts[tk.job], jobs[tk.job].a, tk.r0, tk.r1, stream[tk.job] != 0);
  });
}

void RunRowTiled(const KernelRow& row, const PackedWeight& pw, const SpmmArgs& a,
                 ThreadPool* pool) {
  const int64_t nt = TileTokens(row, pw, a.n, a.config());
  const int64_t k_rows = RowTiledKRows(pw);
  const RowTiled rt(row, pw, BuildXt(a, pw.cols, k_rows, nt, pool), a.n, nt, k_rows,
                    a.config());
  RunRowTiledXt(rt, a, pool);
}


}  // namespace sparq::cpu
