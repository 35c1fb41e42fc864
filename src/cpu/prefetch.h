// When the tiled kernels prefetch the next k block's X^T slice (XtSlicePrefetcher in
// prefetch-inl.h), and which slice that is. Measurements behind the rule: docs/kernels.md.
#pragma once

#include <algorithm>
#include <cstdint>

#include "sparq/kernel_config.h"
#include "src/cpu/spmm_packed.h"

namespace sparq::cpu {

// X^T tiles of k_rows x nt floats, the task's partial sums scratch_bytes: it pays where the X^T
// tile is beyond L2 and a task's partial sums fit L1.
inline bool XtPrefetchWorthIt(const KernelConfig& c, int64_t k_rows, int64_t nt,
                              int64_t scratch_bytes) {
  return c.xt_prefetch && k_rows * nt * 4 > (512 << 10) && scratch_bytes <= (32 << 10);
}

// The X^T slice the next tiled call reads (X^T tiles of nt tokens and k_rows columns, k blocks of
// kb_chunks chunks of chunk_cols columns; the current call ends at chunk c1 of tile `tile`, and
// this thread's loop runs to tile_end): the next k block of this tile, else the first of the next
// tile; none after the last, or when `on` is false. Only L1-sized slices: wider ones belong to
// sparse rows that touch a fraction of their columns, where fetching the whole slice evicts the
// one in use (block_bytes: the caller's k block budget, xt_block_bytes or row_xt_block_bytes).
inline XtNext NextXtSlice(bool on, const float* xt, int64_t k_rows, int64_t nt, int64_t tile,
                          int64_t tile_end, int64_t c1, int64_t chunks, int64_t kb_chunks,
                          int64_t chunk_cols, int64_t block_bytes) {
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
  if (next.bytes > block_bytes) next = XtNext{};
  return next;
}

}  // namespace sparq::cpu
