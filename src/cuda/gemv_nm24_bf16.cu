// gemv_nm24_bf16_warp: 2:4 bf16 decode for 1..16 tokens (src/cuda/kernels.h). Decode is bound by
// the bytes of W, so W is read once, in sparq's stored layout (0.5625 bytes per weight: 8 bf16
// values and 16 bits of metadata per 16 columns), and expanded in registers: each group's two
// 2-bit indices select two of the token's four activations (one 8-byte load).
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <utility>

#include "src/cuda/cuda_check.h"
#include "src/cuda/gemv_nm24_step.h"
#include "src/cuda/kernels.h"

namespace sparq::cuda {
namespace {

constexpr int kColsPerLaneStep = kGemvNm24StepCols;
constexpr int kWarpsPerBlock = 8;  // 256 threads: one output row per warp

template <int N>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    GemvNm24Bf16Kernel(const uint4* __restrict__ values, const uint16_t* __restrict__ meta,
                       const uint16_t* __restrict__ x, float* __restrict__ y, int64_t rows,
                       int64_t cols) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= rows) return;
  const int64_t steps = cols / kColsPerLaneStep;
  const uint4* v = values + row * steps;
  const uint16_t* e = meta + row * steps;
  float acc[N];
#pragma unroll
  for (int t = 0; t < N; ++t) acc[t] = 0.0f;
  auto load_x4 = [&](int t, int64_t c, uint32_t* lo, uint32_t* hi) {
    const uint2 x4 = __ldg(reinterpret_cast<const uint2*>(x + t * cols + c));
    *lo = x4.x;
    *hi = x4.y;
  };
  // Lanes take consecutive 16-column steps, so a warp's loads of W are 512 contiguous bytes.
  for (int64_t s = lane; s < steps; s += 32) {
    const uint4 vv = __ldg(v + s);
    const uint32_t w[4] = {vv.x, vv.y, vv.z, vv.w};
    GemvNm24Step<N>(w, __ldg(e + s), s * kColsPerLaneStep, load_x4, acc);
  }
#pragma unroll
  for (int t = 0; t < N; ++t) {
    float a = acc[t];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) a += __shfl_xor_sync(0xFFFFFFFFu, a, off);
    if (lane == 0) y[t * rows + row] = a;
  }
}

template <int N>
void Launch(const Nm24Bf16Device& w, const uint16_t* x, float* y, cudaStream_t s) {
  const unsigned blocks = static_cast<unsigned>((w.rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
  GemvNm24Bf16Kernel<N><<<blocks, kWarpsPerBlock * 32, 0, s>>>(
      static_cast<const uint4*>(w.values.get()), static_cast<const uint16_t*>(w.meta.get()), x, y,
      w.rows, w.cols);
}

template <int... Ns>
void LaunchFor(int64_t n, const Nm24Bf16Device& w, const uint16_t* x, float* y, cudaStream_t s,
               std::integer_sequence<int, Ns...>) {
  ((n == Ns + 1 ? Launch<Ns + 1>(w, x, y, s) : void()), ...);
}

}  // namespace

Result<Nm24Bf16Device> Nm24Bf16Device::Upload(const NmMatrix& w, const std::string& name) {
  SPARQ_RETURN_IF_ERROR(w.Validate(name));
  if (w.n != 2 || w.m != 4 || w.quant.quantized() || w.values.dtype() != DType::kBF16) {
    return InvalidInput(name + ": gemv_nm24_bf16 takes a 2:4 matrix with bf16 values");
  }
  if (w.cols % kColsPerLaneStep != 0) {
    return InvalidInput(name + ": gemv_nm24_bf16 needs cols a multiple of 16, not " +
                        std::to_string(w.cols));
  }
  Nm24Bf16Device d;
  d.rows = w.rows;
  d.cols = w.cols;
  SPARQ_ASSIGN_OR_RETURN(d.values,
                         DeviceBuffer::Upload(w.values.data(), w.values.nbytes(), name + ".values"));
  SPARQ_ASSIGN_OR_RETURN(d.meta, DeviceBuffer::Upload(w.meta.data(), w.meta.nbytes(), name + ".meta"));
  return Result<Nm24Bf16Device>(std::move(d));  // (nvcc does not move a local into Result<T>)
}

Status GemvNm24Bf16(const Nm24Bf16Device& w, const uint16_t* x, int64_t n, float* y,
                    void* stream) {
  if (n < 1 || n > kGemvNm24MaxTokens) {
    return InvalidInput("gemv_nm24_bf16: " + std::to_string(n) + " tokens; it takes 1 to " +
                        std::to_string(kGemvNm24MaxTokens));
  }
  if (w.rows == 0) return Status::Ok();
  LaunchFor(n, w, x, y, static_cast<cudaStream_t>(stream),
            std::make_integer_sequence<int, kGemvNm24MaxTokens>{});
  return CudaStatus(cudaGetLastError(), "gemv_nm24_bf16 launch");
}

}  // namespace sparq::cuda
