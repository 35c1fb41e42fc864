// sparq_cuda_bench (SPARQ_CUDA=ON): the CUDA kernel grid of issue 30, each sparse kernel beside
// cuBLAS dense bf16 (cublasGemmEx, f32 accumulate and output) in the same run. Calls alternate
// sparse, dense, sparse, dense ... and each figure is the median of --reps timed calls (CUDA
// events around one call). Weights rotate through enough copies to exceed twice the L2 cache, so
// decode streams W from memory as it would in a model. One JSON object per line on stdout.
//
//   sparq_cuda_bench [--reps N] [--quick]      (--quick: small shapes, a smoke run)
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "sparq/format.h"
#include "src/cuda/kernels.h"
#include "src/cuda/mma_sp_pack.h"

namespace sparq::cuda {
namespace {

[[noreturn]] void Die(const std::string& what) {
  std::printf("{\"error\": \"%s\"}\n", what.c_str());
  std::exit(1);
}
template <typename T>
T Must(Result<T> r) {
  if (!r.ok()) Die(r.status().ToString());
  return std::move(r).value();
}
void Must(const Status& s) {
  if (!s.ok()) Die(s.ToString());
}
void MustCuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) Die(std::string(what) + ": " + cudaGetErrorString(e));
}

// A random 2:4 bf16 matrix built directly in sparq's layout (legal nibbles only), no dense copy.
NmMatrix RandomNm24(int64_t rows, int64_t cols, uint32_t seed) {
  static const uint8_t kNibbles[6] = {0x4, 0x8, 0xC, 0x9, 0xD, 0xE};
  std::mt19937 rng(seed);
  NmMatrix w;
  w.rows = rows;
  w.cols = cols;
  w.n = 2;
  w.m = 4;
  w.values = Tensor::Alloc(DType::kBF16, {rows, cols / 2});
  w.meta = Tensor::Alloc(DType::kU8, {rows, cols / 8});
  uint16_t* v = w.values.mutable_data_as<uint16_t>();
  for (uint64_t i = 0; i < w.values.numel(); ++i) v[i] = 0x3C00 | (rng() & 0x3FF);  // ~[0.0078, 0.0156)
  uint8_t* m = w.meta.mutable_data_as<uint8_t>();
  for (uint64_t i = 0; i < w.meta.numel(); ++i) m[i] = kNibbles[rng() % 6] | kNibbles[rng() % 6] << 4;
  return w;
}

int Copies(uint64_t bytes, uint64_t l2) {
  return static_cast<int>(std::max<uint64_t>(1, (2 * l2 + bytes - 1) / bytes));
}

// Median milliseconds of `reps` calls of each of a and b, alternating.
std::pair<double, double> TimeAB(int reps, const std::function<void(int)>& a,
                                 const std::function<void(int)>& b) {
  cudaEvent_t e0, e1;
  MustCuda(cudaEventCreate(&e0), "event");
  MustCuda(cudaEventCreate(&e1), "event");
  auto once = [&](const std::function<void(int)>& f, int i) {
    MustCuda(cudaEventRecord(e0), "record");
    f(i);
    MustCuda(cudaEventRecord(e1), "record");
    MustCuda(cudaEventSynchronize(e1), "run");
    float ms = 0;
    MustCuda(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
    return static_cast<double>(ms);
  };
  for (int i = 0; i < 3; ++i) once(a, i), once(b, i);  // warm up (clocks, cuBLAS heuristics)
  std::vector<double> ta, tb;
  for (int i = 0; i < reps; ++i) {
    ta.push_back(once(a, i));
    tb.push_back(once(b, i));
  }
  std::sort(ta.begin(), ta.end());
  std::sort(tb.begin(), tb.end());
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return {ta[ta.size() / 2], tb[tb.size() / 2]};
}

struct Dense {
  std::vector<DeviceBuffer> w;
  cublasHandle_t h = nullptr;
  // Y[n, m] = X[n, k] W[m, k]^T: column-major Y^T (m x n) = (W as k x m)^T * (X as k x n).
  void Run(int copy, int64_t m, int64_t n, int64_t k, const void* x, float* y) const {
    const float one = 1.0f, zero = 0.0f;
    const cublasStatus_t s = cublasGemmEx(
        h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
        &one, w[copy % w.size()].get(), CUDA_R_16BF, static_cast<int>(k), x, CUDA_R_16BF,
        static_cast<int>(k), &zero, y, CUDA_R_32F, static_cast<int>(m), CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS) Die("cublasGemmEx: status " + std::to_string(s));
  }
};

Dense MakeDense(cublasHandle_t h, int64_t m, int64_t k, uint64_t l2) {
  Dense d;
  d.h = h;
  const uint64_t bytes = static_cast<uint64_t>(m) * k * 2;
  for (int c = 0; c < Copies(bytes, l2); ++c) {
    d.w.push_back(Must(DeviceBuffer::Alloc(bytes, "dense w")));
    MustCuda(cudaMemset(d.w.back().get(), 0x3C, bytes), "memset");  // bf16 0x3C3C ~ 0.0115
  }
  return d;
}

void Decode(cublasHandle_t h, uint64_t l2, int reps, int64_t m, int64_t k,
            const std::vector<int64_t>& ns) {
  const NmMatrix w = RandomNm24(m, k, 1);
  const uint64_t sparse_bytes = w.values.nbytes() + w.meta.nbytes();
  std::vector<Nm24Bf16Device> sw;
  for (int c = 0; c < Copies(sparse_bytes, l2); ++c) sw.push_back(Must(Nm24Bf16Device::Upload(w, "w")));
  const Dense dense = MakeDense(h, m, k, l2);
  const int64_t nmax = *std::max_element(ns.begin(), ns.end());
  DeviceBuffer x = Must(DeviceBuffer::Alloc(nmax * k * 2, "x"));
  MustCuda(cudaMemset(x.get(), 0x3F, nmax * k * 2), "memset");
  DeviceBuffer y = Must(DeviceBuffer::Alloc(nmax * m * 4, "y"));
  const auto* xp = static_cast<const uint16_t*>(x.get());
  auto* yp = static_cast<float*>(y.get());
  for (int64_t n : ns) {
    const auto [ts, td] = TimeAB(
        reps, [&](int i) { Must(GemvNm24Bf16(sw[i % sw.size()], xp, n, yp)); },
        [&](int i) { dense.Run(i, m, n, k, xp, yp); });
    const double dense_bytes = static_cast<double>(m) * k * 2;
    std::printf("{\"case\": \"decode\", \"m\": %lld, \"k\": %lld, \"n\": %lld, \"kernel\": "
                "\"gemv_nm24_bf16_warp\", \"ms\": %.4f, \"GBps\": %.1f, \"peer\": "
                "\"cublas_gemmex_bf16_dense\", \"peer_ms\": %.4f, \"peer_GBps\": %.1f, "
                "\"speedup\": %.3f, \"weight_copies\": [%zu, %zu]}\n",
                static_cast<long long>(m), static_cast<long long>(k), static_cast<long long>(n), ts,
                sparse_bytes / ts / 1e6, td, dense_bytes / td / 1e6, td / ts, sw.size(),
                dense.w.size());
    std::fflush(stdout);
  }
}

void Gemm(cublasHandle_t h, uint64_t l2, int reps, int64_t m, int64_t k, int64_t n) {
  const NmMatrix w = RandomNm24(m, k, 2);
  const MmaSpPacked packed = Must(PackMmaSp(w, MmaSpShape::kM16N8K32, "w"));
  const MmaSpDevice sw = Must(MmaSpDevice::Upload(packed, "w"));
  const Dense dense = MakeDense(h, m, k, 0);  // compute-bound: one copy
  DeviceBuffer x = Must(DeviceBuffer::Alloc(n * k * 2, "x"));
  MustCuda(cudaMemset(x.get(), 0x3F, n * k * 2), "memset");
  DeviceBuffer y = Must(DeviceBuffer::Alloc(n * m * 4, "y"));
  const auto* xp = static_cast<const uint16_t*>(x.get());
  auto* yp = static_cast<float*>(y.get());
  const auto [ts, td] = TimeAB(
      reps, [&](int) { Must(SpmmNm24Bf16MmaSp(sw, xp, n, yp)); },
      [&](int i) { dense.Run(i, m, n, k, xp, yp); });
  const double flop = 2.0 * m * n * k;  // dense-equivalent
  std::printf("{\"case\": \"gemm\", \"m\": %lld, \"k\": %lld, \"n\": %lld, \"kernel\": "
              "\"spmm_nm24_bf16_mmasp_m16n8k32\", \"ms\": %.4f, \"TFLOPs\": %.1f, \"peer\": "
              "\"cublas_gemmex_bf16_dense\", \"peer_ms\": %.4f, \"peer_TFLOPs\": %.1f, "
              "\"speedup\": %.3f}\n",
              static_cast<long long>(m), static_cast<long long>(k), static_cast<long long>(n), ts,
              flop / ts / 1e9, td, flop / td / 1e9, td / ts);
  std::fflush(stdout);
}

}  // namespace
}  // namespace sparq::cuda

int main(int argc, char** argv) {
  using namespace sparq::cuda;
  int reps = 20;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else {
      std::fprintf(stderr, "sparq_cuda_bench: unknown argument '%s' (--reps N, --quick)\n", argv[i]);
      return 2;
    }
  }
  if (DeviceCount() == 0) Die(DeviceDescription());  // "no CUDA device: <why>"
  cudaDeviceProp p{};
  MustCuda(cudaGetDeviceProperties(&p, 0), "properties");
  std::printf("{\"device\": \"%s\", \"l2_bytes\": %d, \"reps\": %d, \"peers_missing\": "
              "[\"cusparselt (the nvidia-cusparselt-cu13 wheel is not in the checkout)\", "
              "\"cusparse csr/bsr (no sparq CSR/BSR CUDA kernel yet)\"]}\n",
              DeviceDescription().c_str(), p.l2CacheSize, reps);
  cublasHandle_t h;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) Die("cublasCreate failed");
  const uint64_t l2 = static_cast<uint64_t>(p.l2CacheSize);
  if (quick) {
    Decode(h, l2, reps, 1024, 1024, {1, 16});
    Gemm(h, l2, reps, 1024, 1024, 256);
  } else {
    Decode(h, l2, reps, 8192, 8192, {1, 8, 16});
    Decode(h, l2, reps, 28672, 8192, {1, 8, 16});
    Gemm(h, l2, reps, 8192, 8192, 8192);
  }
  cublasDestroy(h);
  return 0;
}
