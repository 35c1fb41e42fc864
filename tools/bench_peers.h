// Peers for `sparq bench kernels`: dense f32 GEMM libraries (OpenBLAS always; oneDNN and BLIS when
// installed) and the Eigen SparseMatrix sparse peer. All compute Y[n, m] = X[n, k] W[m, k]^T.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace sparq::cli {

class DensePeer {
 public:
  virtual ~DensePeer() = default;
  virtual std::string name() const = 0;
  virtual void SetThreads(int threads) = 0;
  virtual void Run(const float* w, const float* x, float* y, int64_t m, int64_t k, int64_t n) = 0;
};

// OpenBLAS, then oneDNN (if linked) and BLIS (if libblis.so.4 loads).
std::vector<std::unique_ptr<DensePeer>> MakeDensePeers();

// Eigen::SparseMatrix<float, RowMajor> built from a dense f32 matrix (zeros dropped).
class EigenSparsePeer {
 public:
  EigenSparsePeer(const float* w, int64_t m, int64_t k);
  ~EigenSparsePeer();
  void Run(const float* x, float* y, int64_t n);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sparq::cli
