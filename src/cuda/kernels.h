// The CUDA kernels of sparq (built with SPARQ_CUDA=ON; docs/cuda.md) and the device memory they
// read. This header needs no CUDA headers: pointers are plain device addresses, streams are
// cudaStream_t passed as void* (null: the default stream).
//
// Shapes as in LinearWeight (sparq/linear.h):  Y[n, m] = X[n, k] * W[m, k]^T, X bf16 [n, k]
// row-major (each token's activations contiguous), Y f32 [n, m] row-major, W a 2:4 matrix (m rows
// of outputs, groups of 4 along k). Every entry point checks its shapes and returns a Status
// naming what is wrong; launches are asynchronous (errors of the launch itself are returned,
// errors while running come back from the next synchronizing call, e.g. DeviceBuffer::CopyTo).
#pragma once

#include <cstdint>
#include <string>

#include "sparq/format.h"
#include "sparq/status.h"
#include "src/cuda/mma_sp_pack.h"

namespace sparq::cuda {

// CUDA devices the runtime sees; 0 when there is none, or no driver (never an error).
int DeviceCount();
// "NVIDIA H200 (sm_90, 132 SMs, 139.8 GiB)", or the runtime's error text.
std::string DeviceDescription(int device = 0);

// Device memory, owned; moves only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  static Result<DeviceBuffer> Alloc(uint64_t bytes, const std::string& what);
  // Allocates and copies `bytes` from host memory.
  static Result<DeviceBuffer> Upload(const void* src, uint64_t bytes, const std::string& what);
  Status CopyTo(void* dst, uint64_t bytes) const;  // synchronizes; bytes <= size()
  void* get() const { return ptr_; }
  uint64_t size() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  uint64_t bytes_ = 0;
};

// Which code the device runs: __CUDA_ARCH__ * 10 of the cubin the driver picked, + 1 when it is
// the arch-specific sm_90a pass (__CUDA_ARCH_FEAT_SM90_ALL). 800 on an A100, 901 on an H100/H200.
Result<int> DeviceCodeArch();

// ---- 2:4 bf16 decode (1 to 16 tokens): gemv_nm24_bf16_warp ---------------------------------------
// W in sparq's own N:M layout (format.h), uploaded as stored: values bf16 [m, k/2], meta u8
// [m, k/8]. One warp per output row streams the row once (16 bytes of values and 2 of metadata a
// lane), expands each group's two values in registers against the token's 4 activations, and
// accumulates in f32. k must be a multiple of 16 (whole 16-byte loads).
inline constexpr int kGemvNm24MaxTokens = 16;
struct Nm24Bf16Device {
  int64_t rows = 0, cols = 0;
  DeviceBuffer values, meta;
  // Errors: not 2:4, values not bf16, cols not a multiple of 16.
  static Result<Nm24Bf16Device> Upload(const NmMatrix& w, const std::string& name);
};
Status GemvNm24Bf16(const Nm24Bf16Device& w, const uint16_t* x, int64_t n, float* y,
                    void* stream = nullptr);

// ---- 2:4 bf16 GEMM on sparse tensor cores: spmm_nm24_bf16_mmasp_m16n8k32 (sm_80 path) ------------
// W packed by PackMmaSp (m16n8k32, bf16). One warp per 16 x 8 output tile walks k in steps of 32
// with mma.sp::ordered_metadata; any n >= 1.
struct MmaSpDevice {
  int64_t rows = 0, cols = 0, tiles_m = 0, tiles_k = 0;
  DeviceBuffer a, meta;
  // Errors: not an m16n8k32 bf16 packing.
  static Result<MmaSpDevice> Upload(const MmaSpPacked& p, const std::string& name);
};
Status SpmmNm24Bf16MmaSp(const MmaSpDevice& w, const uint16_t* x, int64_t n, float* y,
                         void* stream = nullptr);

// ---- reference: dense bf16 mma.sync of one expanded tile ------------------------------------------
// Y[8, 16] = X[8, 32] * W[16, 32]^T by two dense mma.sync.m16n8k16 (bf16, f32 accumulate): the
// GPU-side check that a packed tile multiplies like its expansion. w, x: bf16 row-major device
// arrays; y: f32 [8, 16] device array.
Status DenseMmaTileBf16(const uint16_t* w, const uint16_t* x, float* y);

}  // namespace sparq::cuda
