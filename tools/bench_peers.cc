#include "tools/bench_peers.h"

#include <cblas.h>
#include <dlfcn.h>

#include <cstdlib>
#include <optional>
#include <eigen3/Eigen/Sparse>

#include "sparq/blas_threads.h"

#if defined(SPARQ_HAVE_DNNL)
#include <dnnl.h>
#endif

namespace sparq::cli {
namespace {

// Both oneDNN and BLIS (Debian builds) use the OpenMP runtime: its thread count is process-wide.
void SetOmpThreads(int threads) {
  using Fn = void (*)(int);
  static Fn fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
  if (fn) fn(threads);
}

class OpenBlasPeer : public DensePeer {
 public:
  std::string name() const override { return "openblas"; }
  // The count is held by a guard (sparq's one OpenBLAS thread policy) until the next SetThreads or
  // the peer's end, not set for good; the timed calls themselves pay no set / restore.
  void SetThreads(int threads) override {
    pin_.reset();
    pin_.emplace(threads);
  }
  void Run(const float* w, const float* x, float* y, int64_t m, int64_t k, int64_t n) override {
    if (n == 1) {
      cblas_sgemv(CblasRowMajor, CblasNoTrans, m, k, 1.0f, w, k, x, 1, 0.0f, y, 1);
    } else {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, m, k, 1.0f, x, k, w, k, 0.0f, y, m);
    }
  }

 private:
  std::optional<blas::OpenBlasThreads> pin_;
};

#if defined(SPARQ_HAVE_DNNL)
class DnnlPeer : public DensePeer {
 public:
  std::string name() const override { return "onednn"; }
  void SetThreads(int threads) override { SetOmpThreads(threads); }
  void Run(const float* w, const float* x, float* y, int64_t m, int64_t k, int64_t n) override {
    dnnl_sgemm('N', 'T', n, m, k, 1.0f, x, k, w, k, 0.0f, y, m);  // row-major
  }
};
#endif

// BLIS exports cblas_* symbols that clash with OpenBLAS: load it privately and call bli_sgemm.
// The sanitizers' runtimes refuse RTLD_DEEPBIND; bli_sgemm calls only bli_* symbols, which no
// other library exports, so RTLD_LOCAL alone binds them to BLIS there too.
#if defined(__SANITIZE_ADDRESS__)
#define SPARQ_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SPARQ_ASAN 1
#endif
#endif
#if defined(SPARQ_ASAN)
constexpr int kDeepBind = 0;
#else
constexpr int kDeepBind = RTLD_DEEPBIND;
#endif
class BlisPeer : public DensePeer {
 public:
  using Gemm = void (*)(int, int, int64_t, int64_t, int64_t, const float*, const float*, int64_t,
                        int64_t, const float*, int64_t, int64_t, const float*, float*, int64_t,
                        int64_t);
  using SetThreadsFn = void (*)(int64_t);
  static std::unique_ptr<BlisPeer> Load() {
    void* h = dlopen("libblis.so.4", RTLD_NOW | RTLD_LOCAL | kDeepBind);
    if (!h) return nullptr;
    auto gemm = reinterpret_cast<Gemm>(dlsym(h, "bli_sgemm"));
    auto st = reinterpret_cast<SetThreadsFn>(dlsym(h, "bli_thread_set_num_threads"));
    if (!gemm) return nullptr;
    auto p = std::make_unique<BlisPeer>();
    p->gemm_ = gemm;
    p->set_threads_ = st;
    return p;
  }
  std::string name() const override { return "blis"; }
  void SetThreads(int threads) override {
    if (set_threads_) set_threads_(threads);
  }
  void Run(const float* w, const float* x, float* y, int64_t m, int64_t k, int64_t n) override {
    const float one = 1.0f, zero = 0.0f;
    // C[n x m] (rs m, cs 1) = A[n x k] (rs k, cs 1) * B[k x m] with B(c, r) = W[r, c] (rs 1, cs k).
    gemm_(0, 0, n, m, k, &one, x, k, 1, w, 1, k, &zero, y, m, 1);
  }

 private:
  Gemm gemm_ = nullptr;
  SetThreadsFn set_threads_ = nullptr;
};

}  // namespace

std::vector<std::unique_ptr<DensePeer>> MakeDensePeers() {
  std::vector<std::unique_ptr<DensePeer>> peers;
  peers.push_back(std::make_unique<OpenBlasPeer>());
#if defined(SPARQ_HAVE_DNNL)
  peers.push_back(std::make_unique<DnnlPeer>());
#endif
  if (auto b = BlisPeer::Load()) peers.push_back(std::move(b));
  return peers;
}

struct EigenSparsePeer::Impl {
  Eigen::SparseMatrix<float, Eigen::RowMajor, int64_t> w;
};

EigenSparsePeer::EigenSparsePeer(const float* w, int64_t m, int64_t k) : impl_(new Impl) {
  std::vector<Eigen::Triplet<float, int64_t>> trip;
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t c = 0; c < k; ++c) {
      if (w[r * k + c] != 0.0f) trip.emplace_back(r, c, w[r * k + c]);
    }
  }
  impl_->w.resize(m, k);
  impl_->w.setFromTriplets(trip.begin(), trip.end());
  impl_->w.makeCompressed();
}
EigenSparsePeer::~EigenSparsePeer() = default;

void EigenSparsePeer::Run(const float* x, float* y, int64_t n) {
  const int64_t m = impl_->w.rows(), k = impl_->w.cols();
  Eigen::Map<const Eigen::MatrixXf> xm(x, k, n);  // column-major k x n == X row-major n x k
  Eigen::Map<Eigen::MatrixXf> ym(y, m, n);
  ym.noalias() = impl_->w * xm;
}

}  // namespace sparq::cli
