// spmm_nm24_bf16_mmasp_m16n8k32: 2:4 bf16 GEMM on the sparse tensor cores (sm_80 and later), and
// the dense mma.sync tile reference its GPU test compares with (src/cuda/kernels.h).
//
// This is the correctness-first sm_80 path: one warp per 16 x 8 output tile, A registers and
// metadata read straight from the packing (one 16-byte load and one word a lane per k step, laid
// out by PackMmaSp so that no shuffle is needed), B fragments read from X in global memory (each
// register is two consecutive bf16 of one token: one aligned 4-byte load). Shared-memory staging,
// pipelining and the sm_90a wgmma.mma_async.sp path are the performance work still to come.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <utility>

#include "src/cuda/cuda_check.h"
#include "src/cuda/kernels.h"
#include "src/cuda/mma_frag.h"

namespace sparq::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;  // four 16-row tiles of W per block share a token tile
constexpr int kTileN = 8;          // tokens per mma (the n of m16n8k32)

__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    SpmmNm24Bf16MmaSpKernel(const uint4* __restrict__ a, const uint32_t* __restrict__ meta,
                            const uint16_t* __restrict__ x, float* __restrict__ y, int64_t rows,
                            int64_t cols, int64_t n, int64_t tiles_m, int64_t tiles_k) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t tm = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (tm >= tiles_m) return;  // whole warps leave together: mma.sp needs all 32 lanes
  const int64_t tn = blockIdx.y;
  // B = X^T: each B register is two consecutive bf16 of one token's row (mma_frag.h).
  const int64_t tok = tn * kTileN + g;
  const uint32_t* xrow = reinterpret_cast<const uint32_t*>(x + (tok < n ? tok : 0) * cols);
  float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int64_t tk = 0; tk < tiles_k; ++tk) {
    const int64_t tile = tm * tiles_k + tk;
    const uint4 av = __ldg(a + tile * 32 + lane);
    const uint32_t e = __ldg(meta + MmaSpMetaWord(tile, g, t));
    uint32_t b[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) b[r] = tok < n ? __ldg(xrow + MmaSpBWord(tk, r, t)) : 0u;
    asm volatile(
        "mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9, %10, %11}, {%0, %1, %2, %3}, %12, 0x0;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(av.x), "r"(av.y), "r"(av.z), "r"(av.w), "r"(b[0]), "r"(b[1]), "r"(b[2]), "r"(b[3]),
          "r"(e));
  }
  // D = Y^T: register i holds W row MmaDRow, token MmaDCol of this tile.
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t row = tm * 16 + MmaDRow(i, g), token = tn * kTileN + MmaDCol(i, t);
    if (token < n) y[token * rows + row] = d[i];
  }
}

// Dense bf16 mma.sync.m16n8k16 twice over a 16 x 32 tile. Fragments (PTX ISA, mma.m16n8k16
// .bf16): A register r of lane (g, t) holds A[g + 8 (r & 1)][2 t + 8 (r >> 1) + {0, 1}]; B register
// r holds B[2 t + 8 r + {0, 1}][g].
__global__ void DenseMmaTileBf16Kernel(const uint16_t* __restrict__ w,
                                       const uint16_t* __restrict__ x, float* __restrict__ y) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  auto pair = [](const uint16_t* p) {
    return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 16;
  };
  float d0 = 0.0f, d1 = 0.0f, d2 = 0.0f, d3 = 0.0f;
  for (int k0 = 0; k0 < 32; k0 += 16) {
    uint32_t a[4], b[2];
#pragma unroll
    for (int r = 0; r < 4; ++r) a[r] = pair(w + (g + 8 * (r & 1)) * 32 + k0 + 2 * t + 8 * (r >> 1));
#pragma unroll
    for (int r = 0; r < 2; ++r) b[r] = pair(x + g * 32 + k0 + 2 * t + 8 * r);
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
  y[(2 * t) * 16 + g] = d0;
  y[(2 * t + 1) * 16 + g] = d1;
  y[(2 * t) * 16 + g + 8] = d2;
  y[(2 * t + 1) * 16 + g + 8] = d3;
}

}  // namespace

Result<MmaSpDevice> MmaSpDevice::Upload(const MmaSpPacked& p, const std::string& name) {
  if (p.shape != MmaSpShape::kM16N8K32 || p.dtype != DType::kBF16) {
    return InvalidInput(name + ": spmm_nm24_bf16_mmasp takes an m16n8k32 bf16 packing, not " +
                        MmaSpShapeName(p.shape) + " " + std::string(DTypeName(p.dtype)));
  }
  MmaSpDevice d;
  d.rows = p.rows;
  d.cols = p.cols;
  d.tiles_m = p.tiles_m;
  d.tiles_k = p.tiles_k;
  SPARQ_ASSIGN_OR_RETURN(d.a, DeviceBuffer::Upload(p.a.data(), p.a.size() * 4, name + ".a"));
  SPARQ_ASSIGN_OR_RETURN(d.meta,
                         DeviceBuffer::Upload(p.meta.data(), p.meta.size() * 4, name + ".meta"));
  return Result<MmaSpDevice>(std::move(d));  // (nvcc does not move a local into Result<T>)
}

Status SpmmNm24Bf16MmaSp(const MmaSpDevice& w, const uint16_t* x, int64_t n, float* y,
                         void* stream) {
  if (n < 1) return InvalidInput("spmm_nm24_bf16_mmasp: " + std::to_string(n) + " tokens");
  const int64_t tiles_n = (n + kTileN - 1) / kTileN;
  if (tiles_n > 65535) {
    return InvalidInput("spmm_nm24_bf16_mmasp: " + std::to_string(n) +
                        " tokens; at most 524280 per call");
  }
  if (w.tiles_m == 0) return Status::Ok();
  const dim3 grid(static_cast<unsigned>((w.tiles_m + kWarpsPerBlock - 1) / kWarpsPerBlock),
                  static_cast<unsigned>(tiles_n));
  SpmmNm24Bf16MmaSpKernel<<<grid, kWarpsPerBlock * 32, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const uint4*>(w.a.get()), static_cast<const uint32_t*>(w.meta.get()), x, y,
      w.rows, w.cols, n, w.tiles_m, w.tiles_k);
  return CudaStatus(cudaGetLastError(), "spmm_nm24_bf16_mmasp launch");
}

Status DenseMmaTileBf16(const uint16_t* w, const uint16_t* x, float* y) {
  DenseMmaTileBf16Kernel<<<1, 32>>>(w, x, y);
  return CudaStatus(cudaGetLastError(), "dense_mma_tile_bf16 launch");
}

}  // namespace sparq::cuda
