// The kernel bodies' per-target entry points (kernels.cc), each run on the target of the
// configuration it is given (KernelConfig::dispatch_index).
#pragma once

#include <cstdint>

#include "sparq/kernel_config.h"
#include "sparq/linear.h"
#include "src/cpu/spmm_packed.h"

namespace sparq::cpu {

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
// V:N:M / BSR decode limit on AVX-512 on AMD family 19h (Zen 4), where its X gathers made the
// decode slower than the tiled kernel from 3 tokens (4 elsewhere on AVX-512).
inline constexpr int64_t kZen4GroupsDecodeMaxN = 2;

void NmDecodeAt(const KernelConfig& c, const NmWeight& w, const float* xpad, int64_t n,
                int64_t r0, int64_t r1, float* raw);
void ScgDecodeAt(const KernelConfig& c, const ScgWeight& w, const float* x, int64_t ldx,
                 int64_t n, int64_t g0, int64_t g1, float* raw);
void MaskDecodeAt(const KernelConfig& c, const MaskWeight& w, const float* xpad, int64_t n,
                  int64_t r0, int64_t r1, float* raw);
void NmTiledAt(const KernelConfig& c, const NmWeight& w, int64_t nt, int64_t r0, int64_t r1,
               const float* xt, int64_t c0, int64_t c1, float* scratch, const XtNext& next);
void ScgTiledAt(const KernelConfig& c, const ScgWeight& w, int64_t nt, int64_t g0, int64_t g1,
                const float* xt, const ScgBlock& blk, float* scratch, const XtNext& next);
void MaskTiledAt(const KernelConfig& c, const MaskWeight& w, int64_t nt, int64_t r0, int64_t r1,
                 const float* xt, int64_t c0, int64_t c1, int64_t* cursor, int32_t* off,
                 float* scratch, const XtNext& next);
// out[i] = silu(g[i]) * u[i] with the epilogue's SiLU (g is overwritten; it may be out).
void SiluMulAt(const KernelConfig& c, float* g, const float* u, int64_t len, float* out);
// Token tile widths: row groups of g rows (TileWidth), narrow CSR tiles (0: none), row tiles.
int64_t TileWidthAt(const KernelConfig& c, int g, int64_t n);
int64_t NarrowCsrWidthAt(const KernelConfig& c, int64_t n);
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
