// Calls that run several products at once: weights sharing one input (q/k/v, gate/up) and the
// fused SwiGLU MLP (spmm.h).
#include <algorithm>
#include <cstring>

#include "sparq/checked.h"
#include "src/cpu/kernel_entry.h"
#include "src/cpu/runners.h"
#include "src/cpu/staging.h"
#include "src/cpu/tasks.h"

namespace sparq::cpu {

void RunSharedInput(const float* x, int64_t n, int64_t ldx, const SharedInputJob* jobs,
                    size_t count, const KernelConfig& cfg, ThreadPool* pool) {
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
    a.cfg = &cfg;
    const KernelRow& row = ChooseKernel(w, n, cfg);
    decode.push_back({&w, a, &row});
    fuse = fuse && row.run == RunDecode && SameDecodeInput(*jobs[0].w, w);
  }
  if (fuse) {
    RunDecodeJobs(decode.data(), decode.size(), pool);
    return;
  }
  bool row_tiled = true;
  for (const DecodeJob& d : decode) row_tiled = row_tiled && d.row->run == RunRowTiled;
  if (row_tiled && count > 1 && RowTiledJobsShareTiles(decode)) {
    RunRowTiledJobs(decode, pool);
    return;
  }
  for (const DecodeJob& d : decode) d.row->Run(*d.w, d.a, pool);
}

bool RunSwiGlu(const PackedWeight& gate, const PackedWeight& up, const PackedWeight& down,
               const float* x, const float* x_up, int64_t n, const int32_t* down_row,
               const float* residual, float* y, const KernelConfig& cfg, ThreadPool* pool) {
  if (!SwiGluFuses(gate, up, down, n, cfg)) return false;
  const KernelRow& row_g = ChooseKernel(gate, n, cfg);
  const KernelRow& row_u = ChooseKernel(up, n, cfg);
  const KernelRow& row_d = ChooseKernel(down, n, cfg);
  const int64_t nt = TileTokens(row_g, gate, n, cfg);
  const int64_t tiles = CeilDiv(n, nt);
  SpmmArgs in;
  in.x = x;
  in.n = n;
  in.ldx = gate.cols;
  in.cfg = &cfg;
  const int64_t in_rows = std::max(RowTiledKRows(gate), RowTiledKRows(up));
  const float* xt = BuildXt(in, gate.cols, in_rows, nt, pool);
  const float* xt_up = xt;
  if (x_up != nullptr && x_up != x) {  // up reads its own (differently permuted) input
    in.x = x_up;
    xt_up = BuildXt(in, gate.cols, in_rows, nt, pool, 5);
  }
  const RowTiled rg(row_g, gate, xt, n, nt, in_rows, cfg), ru(row_u, up, xt_up, n, nt, in_rows, cfg);
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
        SiluMulAt(cfg, sg, su, rows * nt, dst + r0 * nt);
      } else {
        SiluMulAt(cfg, sg, su, rows * nt, sg);
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
  out.cfg = &cfg;
  RunRowTiledXt(RowTiled(row_d, down, act, n, nt, k_rows, cfg), out, pool);
  return true;
}

bool SwiGluFuses(const PackedWeight& gate, const PackedWeight& up, const PackedWeight& down,
                 int64_t n, const KernelConfig& cfg) {
  // All three row-tiled, on tiles of one width (gate/up share X^T; down reads their output tiles).
  auto row_tiled = [n, &cfg](const PackedWeight& w) {
    const KernelRow& row = ChooseKernel(w, n, cfg);
    return row.run == RunRowTiled ? TileTokens(row, w, n, cfg) : int64_t{-1};
  };
  const int64_t nt = n > 0 ? row_tiled(gate) : -1;
  return nt > 0 && row_tiled(up) == nt && row_tiled(down) == nt && gate.rows == up.rows &&
         gate.cols == up.cols && down.cols == gate.rows;
}

}  // namespace sparq::cpu
