// Device discovery and memory for the CUDA kernels (src/cuda/kernels.h).
#include <cuda_runtime.h>

#include <cstdio>
#include <string>
#include <utility>

#include "src/cuda/cuda_check.h"
#include "src/cuda/kernels.h"

namespace sparq::cuda {

int DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device / no driver" error for later calls
    return 0;
  }
  return n;
}

std::string DeviceDescription(int device) {
  cudaDeviceProp p{};
  const cudaError_t e = cudaGetDeviceProperties(&p, device);
  if (e != cudaSuccess) return std::string("no CUDA device: ") + cudaGetErrorString(e);
  char buf[512];  // name is at most 256 bytes
  std::snprintf(buf, sizeof(buf), "%s (sm_%d%d, %d SMs, %.1f GiB)", p.name, p.major, p.minor,
                p.multiProcessorCount, static_cast<double>(p.totalGlobalMem) / (1ull << 30));
  return buf;
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_ != nullptr) cudaFree(ptr_);
}
DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

Result<DeviceBuffer> DeviceBuffer::Alloc(uint64_t bytes, const std::string& what) {
  DeviceBuffer b;
  if (bytes == 0) return Result<DeviceBuffer>(std::move(b));
  SPARQ_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&b.ptr_, bytes),
                                   what + ": cudaMalloc(" + std::to_string(bytes) + " bytes)"));
  b.bytes_ = bytes;
  return Result<DeviceBuffer>(std::move(b));  // (nvcc does not move a local into Result<T>)
}

Result<DeviceBuffer> DeviceBuffer::Upload(const void* src, uint64_t bytes,
                                          const std::string& what) {
  SPARQ_ASSIGN_OR_RETURN(DeviceBuffer b, Alloc(bytes, what));
  if (bytes != 0) {
    SPARQ_RETURN_IF_ERROR(CudaStatus(cudaMemcpy(b.ptr_, src, bytes, cudaMemcpyHostToDevice),
                                     what + ": upload"));
  }
  return Result<DeviceBuffer>(std::move(b));  // (nvcc does not move a local into Result<T>)
}

Status DeviceBuffer::CopyTo(void* dst, uint64_t bytes) const {
  if (bytes > bytes_) {
    return InvalidInput("DeviceBuffer::CopyTo: " + std::to_string(bytes) + " bytes from a buffer of " +
                        std::to_string(bytes_));
  }
  if (bytes == 0) return Status::Ok();
  return CudaStatus(cudaMemcpy(dst, ptr_, bytes, cudaMemcpyDeviceToHost), "download");
}

namespace {

__global__ void DeviceCodeArchKernel(int* out) {
#if defined(__CUDA_ARCH__)
  int v = __CUDA_ARCH__ * 10;
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  // Only the sm_90a pass defines this: the code that may use wgmma.mma_async.sp.
  v += 1;
#endif
  *out = v;
#endif
}

}  // namespace

Result<int> DeviceCodeArch() {
  SPARQ_ASSIGN_OR_RETURN(DeviceBuffer out, DeviceBuffer::Alloc(sizeof(int), "DeviceCodeArch"));
  DeviceCodeArchKernel<<<1, 1>>>(static_cast<int*>(out.get()));
  SPARQ_RETURN_IF_ERROR(CudaStatus(cudaGetLastError(), "DeviceCodeArch launch"));
  int v = 0;
  SPARQ_RETURN_IF_ERROR(out.CopyTo(&v, sizeof(v)));
  return v;
}

}  // namespace sparq::cuda
