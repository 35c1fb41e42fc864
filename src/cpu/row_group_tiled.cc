// The tiled path of row groups (many tokens): CSR rows, V:N:M slabs, BSR block rows and dense
// bf16 against X^T tiles, task-outer or tile-outer by the bytes each order moves.
#include <algorithm>
#include <cmath>

#include "sparq/checked.h"
#include "src/cpu/kernel_entry.h"
#include "src/cpu/prefetch.h"
#include "src/cpu/runners.h"
#include "src/cpu/staging.h"
#include "src/cpu/tasks.h"

namespace sparq::cpu {

void RunRowGroupTiled(const KernelRow& row, const PackedWeight& pw, const SpmmArgs& a,
                 ThreadPool* pool) {
  const KernelConfig& c = a.config();
  const RowGroupWeight& w = pw.row_groups();
  const std::vector<int64_t> cost = RowCost(pw);
  const bool stream = StreamY(a, w.rows, pool);
  const TaskCuts cuts = CutsFor(a, stream, w.g, std::max(1, 4 / w.g));
  auto bounds = SplitTasks(cost, a.n, kTiledMinRows / w.g, cuts.align, kMaxTasks, cuts.offset);
  int64_t tasks = int64_t(bounds.size()) - 1;
  const KernelBody body = row.Body(c);
  int64_t nt = TileTokens(row, pw, a.n, c);
  // Loop order by bytes moved from beyond L2: task-outer keeps a task's weights cached across the
  // token tiles but streams all of X^T once per task; tile-outer keeps one X^T tile (of the
  // kernel's own width, in L2) cached for every task but streams all the weights once per tile.
  // The order changes no sum: the bits are the same. Measurements: docs/kernels.md.
  const double xt_all = static_cast<double>(a.n) * static_cast<double>(w.cols) * 4.0;
  const double wbytes = static_cast<double>(pw.weight_bytes);
  const bool fewer_bytes =
      static_cast<double>(tasks) * xt_all > static_cast<double>(CeilDiv(a.n, nt)) * wbytes;
  const bool fits_l2 = w.cols * nt * 4 <= c.xt_tile_bytes;
  const TiledOrder forced = c.tiled_order;
  const bool tile_outer =
      forced == TiledOrder::kAuto
          ? a.n > nt && fewer_bytes && !w.implicit_cols && (fits_l2 || wbytes < xt_all)
          : forced == TiledOrder::kTileOuter;
  // Tile-outer, the columns a row touches are scattered over the whole X^T tile, so the tile must
  // stay in L2 beside the streamed weights: narrower tiles (fewer tokens) when it would not.
  const int64_t lanes = LanesAt(c);
  // (Whole vectors: AVX2's 3-vector group tiles step down to 2.)
  while (tile_outer && nt > lanes && w.cols * nt * 4 > c.xt_tile_bytes) {
    nt = nt % (2 * lanes) == 0 ? nt / 2 : nt - lanes;
  }
  const int64_t tiles = CeilDiv(a.n, nt);
  // Task-outer re-reads each task's weights once per token tile: from L2 only if they fit beside
  // the X^T tile. Where the X^T tile fits L2 but 64 tasks' weights do not (11008x4096 V:N:M), cut
  // more tasks (up to kMaxTasksL2), each with weights in the rest of the L2 budget.
  if (!tile_outer && tiles > 1 && !w.implicit_cols) {
    const int64_t room = c.xt_tile_bytes - w.cols * nt * 4;
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
  // The narrow CSR rows always run one k block: their sums alternate between two partial sums by
  // a kept weight's position in the block, so more blocks would change the bits.
  const int64_t kb = tiles == 1 || row.tile_nv < 0 ? std::max<int64_t>(1, w.cols)
                                : std::max<int64_t>({16, c.xt_block_bytes / (nt * 4),
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
  const bool stream_w = nt < lanes && wbytes > static_cast<double>(c.cpu.l2_bytes);
  // Token tiles [tile0, tile1) of one task's groups, over X^T tiles from xt (tile tile0 first).
  auto run = [&](const float* xt, int64_t task, int64_t tile0, int64_t tile1) {
    const int64_t g0 = bounds[task], g1 = bounds[task + 1];
    float* scratch = ThreadBuffer(1, (g1 - g0) * w.g * nt);
    const bool pf = XtPrefetchWorthIt(c, w.cols, nt, (g1 - g0) * w.g * nt * 4);
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
        RowGroupBlock blk;
        blk.first = b == 0;
        blk.stream = stream_w;
        blk.pb = starts + b * stride + g0;
        blk.pe = starts + (b + 1) * stride + g0;
        const XtNext next = NextXtSlice(pf, xt, w.cols, nt, tile - tile0, tile1 - tile0,
                                        std::min(w.cols, (b + 1) * kb), w.cols, kb, 1,
                                        c.xt_block_bytes);
        KernelCall call;
        call.w = &pw;
        call.u0 = g0;
        call.u1 = g1;
        call.nt = nt;
        call.xt = xtt;
        call.blk = &blk;
        call.scratch = scratch;
        call.next = &next;
        body(call);
      }
      WriteTile(scratch, row_off, r0, r1, tile * nt, std::min(a.n, (tile + 1) * nt), a, w.rows,
                stream);
    }
  };
  if (tile_outer) {
    // Each X^T tile is built just before its tasks run, into one tile-sized buffer still in L2
    // when they read it. With several threads and enough tiles to share evenly, each thread takes
    // whole tiles (its X^T tile never leaves its core; one parallel call). The bits do not depend
    // on who runs a (tile, task).
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

void RunRowGroupQuantTiled(const KernelRow& row, const PackedWeight& pw, const SpmmArgs& a,
                           ThreadPool* pool) {
  const RowGroupWeight& w = pw.row_groups();
  const int64_t nvals = w.group_ptr.back() * w.g;
  // Grown, never shrunk (layers of different sizes alternate). The calling thread's: the pool's
  // workers fill disjoint groups of it while this call waits.
  thread_local std::vector<float> twin;
  if (twin.size() < static_cast<size_t>(nvals)) twin.resize(static_cast<size_t>(nvals));
  float* const out = twin.data();  // the caller's (a worker naming `twin` gets its own)
  const KernelBody body = row.Body(a.config());
  constexpr int64_t kGroupsPerTask = 64;
  const int64_t groups = w.groups(), tasks = CeilDiv(groups, kGroupsPerTask);
  auto task = [&](int64_t t, int) {
    KernelCall c;
    c.w = &pw;
    c.u0 = t * kGroupsPerTask;
    c.u1 = std::min(groups, c.u0 + kGroupsPerTask);
    c.scratch = out;
    body(c);
  };
  if (pool != nullptr && tasks > 1) {
    pool->ParallelFor(tasks, task);
  } else {
    for (int64_t t = 0; t < tasks; ++t) task(t, 0);
  }
  // The f32 row groups of the same structure over the twin, through the f32 tiled row.
  PackedWeight f32;
  f32.rows = pw.rows;
  f32.cols = pw.cols;
  f32.source = pw.source;
  RowGroupWeight v;
  v.rows = w.rows;
  v.cols = w.cols;
  v.g = w.g;
  v.value_dtype = DType::kF32;
  v.idx16 = w.idx16;
  v.group_row = w.group_row;
  v.group_ptr = w.group_ptr;
  v.col_idx = w.col_idx;
  v.values = Tensor::View(DType::kF32, {nvals}, out);
  f32.weight_bytes = static_cast<uint64_t>(nvals) * 4 + w.col_idx.nbytes();
  f32.stored = pw.stored;
  f32.layout = std::move(v);
  static const KernelRow* const f32_row = [] {
    for (const KernelRow& r : KernelTable()) {
      if (std::string(r.name) == "f32_rowgroups_tiled_GxNV") return &r;
    }
    return static_cast<const KernelRow*>(nullptr);
  }();
  RunRowGroupTiled(*f32_row, f32, a, pool);
}

}  // namespace sparq::cpu
