// `sparq bench grad`: the weight gradient of a linear layer whose mask is fixed, dW = dY^T X at
// the kept positions only (cpu::MaskedWeightGrad, a masked SDDMM) against the dense dY^T X that
// OpenBLAS computes in one sgemm (what a dense layer's backward, or a masked one without the
// SDDMM, pays), same shape, same threads, interleaved, medians.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "sparq/blas_threads.h"
#include "sparq/pattern.h"
#include "sparq/sddmm.h"
#include "sparq/thread_pool.h"
#include "tools/bench_hooks.h"
#include "tools/json_output.h"

namespace sparq::cli {
namespace {

struct GradOptions {
  std::string shapes = "4096x4096", ns = "512", patterns = "2:4,unstructured:0.5,unstructured:0.9",
              threads = "1,2";
  int repeats = 5;
  JsonOutput json;
};

template <class T, class Parse>
Result<std::vector<T>> SplitList(const std::string& s, const char* what, Parse parse) {
  std::vector<T> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    auto v = parse(item);
    if (!v.ok()) return v.status().WithContext(what);
    out.push_back(*v);
  }
  if (out.empty()) return InvalidInput(std::string(what) + ": empty list");
  return out;
}

Result<int64_t> ParsePositive(const std::string& s) {
  try {
    size_t used = 0;
    const long long v = std::stoll(s, &used);
    if (used == s.size() && v > 0) return static_cast<int64_t>(v);
  } catch (...) {
  }
  return InvalidInput("'" + s + "' is not a positive integer");
}

Result<std::pair<int64_t, int64_t>> ParseShape(const std::string& s) {
  const size_t x = s.find('x');
  if (x == std::string::npos) return InvalidInput("shape '" + s + "' is not MxK");
  SPARQ_ASSIGN_OR_RETURN(int64_t m, ParsePositive(s.substr(0, x)));
  SPARQ_ASSIGN_OR_RETURN(int64_t k, ParsePositive(s.substr(x + 1)));
  return std::make_pair(m, k);
}

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

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

Status RunGrad(const GradOptions& o, const KernelConfig& cfg) {
  SPARQ_ASSIGN_OR_RETURN(auto shapes, (SplitList<std::pair<int64_t, int64_t>>(o.shapes, "--shapes", ParseShape)));
  SPARQ_ASSIGN_OR_RETURN(auto ns, SplitList<int64_t>(o.ns, "--n", ParsePositive));
  SPARQ_ASSIGN_OR_RETURN(auto threads, SplitList<int64_t>(o.threads, "--threads", ParsePositive));
  SPARQ_ASSIGN_OR_RETURN(auto patterns, SplitList<Pattern>(o.patterns, "--patterns", [](const std::string& s) {
                           return Pattern::Parse(s);
                         }));
  if (o.repeats < 1) return InvalidInput("--repeats must be >= 1");
  nlohmann::json rows = nlohmann::json::array();
  const bool text = !o.json.to_stdout();
  if (text) {
    std::printf("isa: %s; dense = OpenBLAS sgemm dY^T X (its threads = T); sparse = "
                "MaskedWeightGrad (sparq's pool of T)\n", cfg.target_name().c_str());
    std::printf("%6s %6s %5s %2s %-18s %10s %10s %8s %9s %10s %10s\n", "m", "k", "n", "T",
                "pattern", "dense ms", "sparse ms", "speedup", "kept GF/s", "dense min", "sparse min");
  }
  std::mt19937_64 rng(1);
  for (const auto& [m, k] : shapes) {
    for (const int64_t n : ns) {
      std::vector<float> dy(static_cast<size_t>(n * m)), x(static_cast<size_t>(n * k)),
          dw(static_cast<size_t>(m * k));
      std::normal_distribution<float> nd;
      for (float& v : dy) v = nd(rng);
      for (float& v : x) v = nd(rng);
      for (const Pattern& p : patterns) {
        SPARQ_ASSIGN_OR_RETURN(std::vector<int64_t> kept, RandomKept(p, m, k, rng));
        std::vector<float> out(kept.size());
        for (const int64_t t : threads) {
          ThreadPool pool(static_cast<int>(t));
          std::vector<double> td, ts;
          for (int rep = 0; rep < o.repeats + 1; ++rep) {  // the first round warms up, unrecorded
            double t0 = Now();
            {
              blas::OpenBlasThreads bt(static_cast<int>(t));
              cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(m),
                          static_cast<int>(k), static_cast<int>(n), 1.0f, dy.data(),
                          static_cast<int>(m), x.data(), static_cast<int>(k), 0.0f, dw.data(),
                          static_cast<int>(k));
            }
            const double d = Now() - t0;
            std::fill(out.begin(), out.end(), 0.0f);
            t0 = Now();
            SPARQ_RETURN_IF_ERROR(cpu::MaskedWeightGrad(dy, x, n, k, m, kept, out, &pool, cfg));
            const double s = Now() - t0;
            if (rep > 0) {
              td.push_back(d);
              ts.push_back(s);
            }
          }
          // The two must agree (a benchmark of a wrong result is no benchmark): every kept entry
          // within f32 rounding of the dense product's.
          double worst = 0, scale = 0;
          for (size_t i = 0; i < kept.size(); ++i) {
            worst = std::max(worst, static_cast<double>(std::abs(out[i] - dw[kept[i]])));
            scale = std::max(scale, static_cast<double>(std::abs(dw[kept[i]])));
          }
          if (worst > 1e-4 * scale + 1e-6) {
            return Internal("bench grad: the masked product differs from the dense one by " +
                            std::to_string(worst) + " (largest entry " + std::to_string(scale) + ")");
          }
          const double md = Median(td), ms = Median(ts);
          const double gf = 2.0 * static_cast<double>(n) * static_cast<double>(kept.size()) / ms / 1e9;
          if (text) {
            std::printf("%6lld %6lld %5lld %2lld %-18s %10.3f %10.3f %7.2fx %9.1f %10.3f %10.3f\n",
                        static_cast<long long>(m), static_cast<long long>(k),
                        static_cast<long long>(n), static_cast<long long>(t),
                        p.ToString().c_str(), md * 1e3, ms * 1e3, md / ms, gf,
                        *std::min_element(td.begin(), td.end()) * 1e3,
                        *std::min_element(ts.begin(), ts.end()) * 1e3);
            std::fflush(stdout);
          }
          rows.push_back({{"m", m}, {"k", k}, {"n", n}, {"threads", t},
                          {"pattern", p.ToString()}, {"kept", kept.size()},
                          {"dense_median_s", md}, {"sparse_median_s", ms},
                          {"speedup", md / ms}, {"isa", cfg.target_name()}});
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
