// The kernel bodies' per-target entry points (kernels.cc), each run on the target of the
// configuration it is given (KernelConfig::dispatch_index).
#pragma once

#include <cstdint>

#include "sparq/kernel_config.h"
#include "sparq/linear.h"
#include "src/cpu/spmm_packed.h"
#include "src/cpu/table.h"

namespace sparq::cpu {

// Token counts up to which the decode kernels run, per layout (DecodeMaxN); they differ by target.
struct DecodeLimits {
  int64_t nm_window;    // N:M with m = 2n (X windows permuted)
  int64_t nm_gather;    // other N:M (X gathered)
  int64_t csr;          // row groups of one row (CSR)
  int64_t groups;       // groups of 2-4 rows (V:N:M, BSR)
  int64_t dense_bf16;   // dense bf16 rows
  int64_t mask;         // bit-mask rows, at least 40% kept
  int64_t sparse_mask;  // bit-mask rows, under 40% kept
  int64_t dense_quant;  // dense int8 / int4 rows
  int64_t groups_quant;  // groups of 2-4 rows with int8 / int4 codes (their tiled rows dequantize
                         // the whole weight per call)
};
// V:N:M / BSR decode limit on AVX-512 on AMD family 19h (Zen 4), where its X gathers made the
// decode slower than the tiled kernel from 3 tokens (4 elsewhere on AVX-512). Groups of 4 rows
// have since read X by broadcast loads (row_groups-inl.h BroadcastColumns4): not re-measured.
inline constexpr int64_t kZen4GroupsDecodeMaxN = 2;

// One call of a row's body (KernelRow::Body): rows (N:M, bit mask) or row groups (CSR, V:N:M,
// BSR, dense bf16) [u0, u1) of w. Decode bodies read x (staged: StageDecodeInput), ldx, n and
// write raw[t][row - first row]; tiled bodies read the X^T tile xt (nt tokens) over k chunks
// [c0, c1) (row layouts) or k block *blk (row groups) into scratch (cursor, off: the bit-mask
// kernel's working space) and may prefetch *next.
struct KernelCall {
  const PackedWeight* w = nullptr;
  int64_t u0 = 0, u1 = 0;
  const float* x = nullptr;
  int64_t ldx = 0, n = 0;
  float* raw = nullptr;
  int64_t nt = 0;
  const float* xt = nullptr;
  int64_t c0 = 0, c1 = 0;
  const RowGroupBlock* blk = nullptr;
  int64_t* cursor = nullptr;
  int32_t* off = nullptr;
  float* scratch = nullptr;
  const XtNext* next = nullptr;
  // int8-X rows (KernelMode::kDecodeInt8X): x8_out set, the body only rounds the n tokens of x into
  // it (Int8XFloatsPerToken floats each, tasks.h); else the rows read X rounded so from x8.
  float* x8_out = nullptr;
  const float* x8 = nullptr;
};
// Every row's body entries, in table order (kernels.cc; the same list as table_rows.h).
const KernelBody* const* RowBodies();
// One shard's (kernel_rows_*.cc): its rows' entries in table order, nullptr for the others'.
const KernelBody* const* RowBodiesF32();
const KernelBody* const* RowBodiesBf16();
const KernelBody* const* RowBodiesI8();
const KernelBody* const* RowBodiesI4();
const KernelBody* const* RowBodiesI4Sym();

// out[i] = silu(g[i]) * u[i] with the epilogue's SiLU (g is overwritten; it may be out).
void SiluMulAt(const KernelConfig& c, float* g, const float* u, int64_t len, float* out);
// f32 lanes of a vector on c's target.
int64_t LanesAt(const KernelConfig& c);
// Token tile widths chosen by n (rows whose tile_nv is 0): row groups of g rows (TileWidth), row
// tiles (RowTileWidth).
int64_t TileWidthAt(const KernelConfig& c, int g, int64_t n);
int64_t RowTileWidthAt(const KernelConfig& c, int64_t n);
// dst[j * ldd + i] = src[i * lds + j]; stream: non-temporal stores where the target has them.
void TransposeAt(const KernelConfig& c, const float* src, int64_t lds, int64_t rows, int64_t cols,
                 float* dst, int64_t ldd, bool stream);
const char* TargetNameAt(const KernelConfig& c);
DecodeLimits DecodeLimitsAt(const KernelConfig& c);
void EpilogueBlockAt(const KernelConfig& c, float* y, int64_t ldy, int64_t t0, int64_t t1,
                     int64_t r0, int64_t r1, int64_t m, const Epilogue& ep);
void EpilogueRowAt(const KernelConfig& c, float* y, int64_t t, int64_t r0, int64_t r1, int64_t m,
                   const Epilogue& ep);

}  // namespace sparq::cpu
