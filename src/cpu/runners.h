// The run functions of the kernel table's rows (table.h): the decode path (decode.cc), the
// row-tiled path of N:M and bit-mask rows (row_tiled.cc), the row-group tiled path of CSR, V:N:M,
// BSR and dense bf16 (row_group_tiled.cc) and dense f32 through BLAS (blas.cc); and what the fused
// calls (fused.cc) share with them.
#pragma once

#include <cstdint>
#include <vector>

#include "sparq/thread_pool.h"
#include "src/cpu/spmm.h"

namespace sparq::cpu {

// Each takes the chosen row: its body (KernelRow::Body) and its tile (TileTokens).
void RunDecode(const KernelRow& row, const PackedWeight& pw, const SpmmArgs& a, ThreadPool* pool);
void RunRowTiled(const KernelRow& row, const PackedWeight& pw, const SpmmArgs& a,
                 ThreadPool* pool);
void RunRowGroupTiled(const KernelRow& row, const PackedWeight& pw, const SpmmArgs& a,
                 ThreadPool* pool);
// Row groups of int8 / int4 codes for many tokens (row_group_tiled.cc): the row's body dequantizes
// the weight into an f32 twin (kept per calling thread, grown only), which the f32 tiled row of
// row groups multiplies.
void RunRowGroupQuantTiled(const KernelRow& row, const PackedWeight& pw, const SpmmArgs& a,
                           ThreadPool* pool);
void RunDenseBlas(const KernelRow& row, const PackedWeight& pw, const SpmmArgs& a,
                  ThreadPool* pool);
// Dense int8 / int4 for many tokens (blas.cc): panels of rows dequantized by the row's body, each
// multiplied by OpenBLAS's sgemm.
void RunDenseQuantSgemm(const KernelRow& row, const PackedWeight& pw, const SpmmArgs& a,
                        ThreadPool* pool);

// One weight's product, by the row chosen for it, in a call that runs several over the same X.
struct DecodeJob {
  const PackedWeight* w;
  SpmmArgs a;
  const KernelRow* row;
};
// The decode kernels of several weights that read the same X (jobs share a.x, a.n, a.ldx and
// SameDecodeInput), in one parallel call; every job keeps its own row split, so its bits are those
// of a call on its own.
void RunDecodeJobs(const DecodeJob* jobs, size_t count, ThreadPool* pool);
// The same staged input serves both weights.
bool SameDecodeInput(const PackedWeight& a, const PackedWeight& b);
// Row-tiled products of several weights on the same X: one X^T for all, one parallel call. Every
// job's row must have the same TileTokens (RowTiledJobsShareTiles).
void RunRowTiledJobs(const std::vector<DecodeJob>& jobs, ThreadPool* pool);
bool RowTiledJobsShareTiles(const std::vector<DecodeJob>& jobs);

// X^T rows a row-tiled weight reads (its k_pad).
int64_t RowTiledKRows(const PackedWeight& w);

// The row kernels' tiled runs (N:M, and bit-mask rows) of one weight over prebuilt X^T tiles of
// nt tokens and `stride` rows each (stride >= the weight's k_pad; rows beyond it are not read).
// k blocks whose X^T slice fits L1, the task's weights re-read from L2 per tile; except a single
// tile narrower than kOneTileBlockMinNt tokens, where each row's weights stream contiguously over
// the whole k (X^T, k x nt, from L2).
struct RowTiled {
  RowTiled(const KernelRow& row, const PackedWeight& w, const float* xt_tiles, int64_t n,
           int64_t nt_, int64_t stride_, const KernelConfig& cfg);
  // Row blocks the kernel runs whole (tasks are cut at multiples of them).
  int64_t align() const {
    return pw->kind() == PackedKind::kNm || pw->kind() == PackedKind::kDenseQuant ? 4 : 2;
  }
  // int32 entries a bit-mask task needs (MaskTiled's `off`): four rows of offsets, then two rows'
  // dequantized values for quantized masks (MaskTiledBody).
  int64_t off_entries() const { return 6 * (kb_chunks + 1) * kMaskChunk; }
  bool prefetch(int64_t rows) const;
  // Rows [r0, r1) of token tile `tile` into scratch [row][nt]; cursor (r1 - r0 entries) and off
  // (off_entries()) are the bit-mask kernel's working space.
  void Tile(int64_t r0, int64_t r1, int64_t tile, bool pf, float* scratch, int64_t* cursor,
            int32_t* off) const;

  const PackedWeight* pw;
  KernelBody body;
  const KernelConfig* cfg;
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
RowTaskSpace RowTaskBuffers(int64_t rows, int64_t nt, int64_t count, int64_t off_entries);
// All tasks of one weight over X^T tiles already built (a.y, a.ldy, a.ep: the output).
void RunRowTiledXt(const RowTiled& rt, const SpmmArgs& a, ThreadPool* pool);

}  // namespace sparq::cpu
