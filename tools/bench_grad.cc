// `sparq bench grad`: the backward products of a linear layer whose mask is fixed, against the
// dense ones OpenBLAS computes in one sgemm each, same shape, same threads, interleaved, medians:
// dW = dY^T X at the kept positions only (cpu::MaskedWeightGrad, a masked SDDMM), and dX = dY W
// as sparq's forward kernel on W^T (CSR, packed as the library chooses: a bit mask from 20% kept).
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <span>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "sparq/blas_threads.h"
#include "sparq/format.h"
#include "sparq/linear.h"
#include "sparq/pattern.h"
#include "sparq/sddmm.h"
#include "sparq/thread_pool.h"
#include "tools/bench_hooks.h"
#include "tools/bench_util.h"
#include "tools/json_output.h"

namespace sparq::cli {
namespace {

struct GradOptions {
  std::string shapes = "4096x4096", ns = "512", patterns = "2:4,unstructured:0.5,unstructured:0.9",
              threads = "1,2";
  int repeats = 5;
  JsonOutput json;
};

// Random kept positions of the pattern (ascending): N:M exactly n of each m columns, unstructured
// each weight kept with probability 1 - fraction.
Result<std::vector<int64_t>> RandomKept(const Pattern& p, int64_t m, int64_t k, std::mt19937_64& rng) {
  std::vector<int64_t> kept;
  if (p.kind == PatternKind::kNM) {
    if (k % p.m != 0) return InvalidInput(p.ToString() + " needs k divisible by " + std::to_string(p.m));
    std::vector<int> idx(static_cast<size_t>(p.m));
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t g = 0; g < k; g += p.m) {
        for (int j = 0; j < p.m; ++j) idx[j] = j;
        std::shuffle(idx.begin(), idx.end(), rng);
        std::sort(idx.begin(), idx.begin() + p.n);
        for (int j = 0; j < p.n; ++j) kept.push_back(r * k + g + idx[j]);
      }
    }
  } else if (p.kind == PatternKind::kUnstructured) {
    std::uniform_real_distribution<double> u(0.0, 1.0);
    for (int64_t i = 0; i < m * k; ++i) {
      if (u(rng) >= p.fraction) kept.push_back(i);
    }
  } else {
    return InvalidInput("bench grad: patterns N:M and unstructured:F, not " + p.ToString());
  }
  return kept;
}

Status CheckClose(const char* what, std::span<const float> got, std::span<const float> want) {
  double worst = 0, scale = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    worst = std::max(worst, static_cast<double>(std::abs(got[i] - want[i])));
    scale = std::max(scale, static_cast<double>(std::abs(want[i])));
  }
  if (worst > 1e-4 * scale + 1e-6) {
    return Internal(std::string("bench grad: the sparse ") + what + " differs from the dense one by " +
                    std::to_string(worst) + " (largest entry " + std::to_string(scale) + ")");
  }
  return Status::Ok();
}

Status RunGrad(const GradOptions& o, const KernelConfig& cfg) {
  SPARQ_ASSIGN_OR_RETURN(auto shapes, ParseShapes(o.shapes));
  SPARQ_ASSIGN_OR_RETURN(auto ns, ParseList<int64_t>(o.ns, "--n"));
  SPARQ_ASSIGN_OR_RETURN(auto threads, ParseList<int64_t>(o.threads, "--threads"));
  SPARQ_ASSIGN_OR_RETURN(auto patterns, ParsePatterns(o.patterns));
  if (o.repeats < 1) return InvalidInput("--repeats must be >= 1");
  nlohmann::json rows = nlohmann::json::array();
  const bool text = !o.json.to_stdout();
  if (text) {
    std::printf("isa: %s. dW: OpenBLAS sgemm dY^T X (its threads = T) vs MaskedWeightGrad; dX: "
                "OpenBLAS sgemm dY W vs sparq's forward kernel on W^T (packed once: pack ms)\n",
                cfg.target_name().c_str());
    std::printf("%6s %6s %5s %2s %-18s %9s %9s %7s %9s %9s %7s %8s %8s\n", "m", "k", "n", "T",
                "pattern", "dW dense", "dW sparse", "dW x", "dX dense", "dX sparse", "dX x",
                "dX+dW x", "pack ms");
  }
  std::mt19937_64 rng(1);
  for (const auto& [m, k] : shapes) {
    for (const int64_t n : ns) {
      std::vector<float> dy(static_cast<size_t>(n * m)), x(static_cast<size_t>(n * k)),
          dw(static_cast<size_t>(m * k)), dx(static_cast<size_t>(n * k)),
          dx2(static_cast<size_t>(n * k));
      std::normal_distribution<float> nd;
      for (float& v : dy) v = nd(rng);
      for (float& v : x) v = nd(rng);
      for (const Pattern& p : patterns) {
        SPARQ_ASSIGN_OR_RETURN(std::vector<int64_t> kept, RandomKept(p, m, k, rng));
        std::vector<float> out(kept.size());
        // W with random kept values (zeros elsewhere), and W^T packed for the forward kernels:
        // dX [n, k] = dY W is the forward product of dY with the [k, m] weight W^T.
        std::vector<float> w(static_cast<size_t>(m * k), 0.0f), wt(static_cast<size_t>(m * k));
        for (const int64_t i : kept) w[i] = nd(rng);
        for (int64_t r = 0; r < m; ++r) {
          for (int64_t c = 0; c < k; ++c) wt[c * m + r] = w[r * k + c];
        }
        const double tp0 = Now();
        SPARQ_ASSIGN_OR_RETURN(CsrMatrix csr, CsrMatrix::FromDense(wt, k, m, DType::kF32));
        SPARQ_ASSIGN_OR_RETURN(LinearWeight lt, LinearWeight::FromMatrix(std::move(csr), "W^T", cfg));
        const double pack = Now() - tp0;
        for (const int64_t t : threads) {
          ThreadPool pool(static_cast<int>(t));
          std::vector<double> tdw, tsw, tdx, tsx;
          for (int rep = 0; rep < o.repeats + 1; ++rep) {  // the first round warms up, unrecorded
            // Row-major C [rows, cols] = op(A) B over `depth`, on OpenBLAS's t threads; seconds.
            // 2 ms first, as bench kernels' samples: the previous library parks its spinning
            // threads (tools/main.cc), which otherwise held the second vCPU through a 2-thread
            // sparq product (measured: some 2-thread rows at one thread's speed).
            auto pause = [] { std::this_thread::sleep_for(std::chrono::milliseconds(2)); };
            auto sgemm = [&](CBLAS_TRANSPOSE ta, int64_t rows, int64_t cols, int64_t depth,
                             const float* a, int64_t lda, const float* b, float* c) {
              blas::OpenBlasThreads bt(static_cast<int>(t));
              pause();
              const double t0 = Now();
              cblas_sgemm(CblasRowMajor, ta, CblasNoTrans, static_cast<int>(rows),
                          static_cast<int>(cols), static_cast<int>(depth), 1.0f, a,
                          static_cast<int>(lda), b, static_cast<int>(cols), 0.0f, c,
                          static_cast<int>(cols));
              return Now() - t0;
            };
            const double d1 = sgemm(CblasTrans, m, k, n, dy.data(), m, x.data(), dw.data());
            std::fill(out.begin(), out.end(), 0.0f);
            pause();
            double t0 = Now();
            SPARQ_RETURN_IF_ERROR(cpu::MaskedWeightGrad(dy, x, n, k, m, kept, out, &pool, cfg));
            const double s1 = Now() - t0;
            const double d2 = sgemm(CblasNoTrans, n, k, m, dy.data(), m, w.data(), dx.data());
            pause();
            t0 = Now();
            lt.Forward(dy.data(), n, dx2.data(), &pool);
            const double s2 = Now() - t0;
            if (rep > 0) {
              tdw.push_back(d1);
              tsw.push_back(s1);
              tdx.push_back(d2);
              tsx.push_back(s2);
            }
          }
          // A benchmark of a wrong result is no benchmark: the sparse products agree with the
          // dense ones within f32 rounding.
          std::vector<float> dw_kept(kept.size());
          for (size_t i = 0; i < kept.size(); ++i) dw_kept[i] = dw[kept[i]];
          SPARQ_RETURN_IF_ERROR(CheckClose("dW", out, dw_kept));
          SPARQ_RETURN_IF_ERROR(CheckClose("dX", dx2, dx));
          const double mdw = Median(tdw), msw = Median(tsw), mdx = Median(tdx), msx = Median(tsx);
          if (text) {
            std::printf("%6lld %6lld %5lld %2lld %-18s %9.2f %9.2f %6.2fx %9.2f %9.2f %6.2fx %7.2fx %8.1f\n",
                        static_cast<long long>(m), static_cast<long long>(k),
                        static_cast<long long>(n), static_cast<long long>(t),
                        p.ToString().c_str(), mdw * 1e3, msw * 1e3, mdw / msw, mdx * 1e3,
                        msx * 1e3, mdx / msx, (mdw + mdx) / (msw + msx), pack * 1e3);
            std::fflush(stdout);
          }
          rows.push_back({{"m", m}, {"k", k}, {"n", n}, {"threads", t},
                          {"pattern", p.ToString()}, {"kept", kept.size()},
                          {"dw_dense_median_s", mdw}, {"dw_sparse_median_s", msw},
                          {"dx_dense_median_s", mdx}, {"dx_sparse_median_s", msx},
                          {"dx_kernel", lt.kernel_name(n)}, {"pack_s", pack},
                          {"speedup", (mdw + mdx) / (msw + msx)}, {"isa", cfg.target_name()}});
        }
      }
    }
  }
  return o.json.Write(rows.dump(1));
}

BenchRegistrar reg(
    "grad",
    "Time the masked weight gradient (dW at the kept positions, an SDDMM) against the dense dY^T X",
    [](CLI::App& sub) -> RunFn {
      auto o = std::make_shared<GradOptions>();
      sub.add_option("--shapes", o->shapes, "Weight shapes MxK, comma-separated")->capture_default_str();
      sub.add_option("--n", o->ns, "Tokens, comma-separated")->capture_default_str();
      sub.add_option("--patterns", o->patterns, "N:M or unstructured:F masks (random)")
          ->capture_default_str();
      sub.add_option("--threads", o->threads, "Thread counts")->capture_default_str();
      sub.add_option("--repeats", o->repeats, "Timed rounds (medians; one more warms up)")
          ->capture_default_str();
      o->json.Register(sub, "one row per shape, n, pattern and thread count");
      return [o](const KernelConfig& cfg) { return RunGrad(*o, cfg); };
    });

}  // namespace
}  // namespace sparq::cli
