// Google Benchmark of every registry kernel (src/cpu/spmm.h) on model shapes, beside OpenBLAS.
// Counters: useful GFLOP/s (2 * n * nonzeros) and weight bytes/s. The user-facing comparison
// table (peers, JSON, plot) is `sparq bench kernels`; this is for kernel development:
//   spmm_bench --benchmark_filter='SpmmNm_tiled/2:4' --benchmark_repetitions=5
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <random>
#include <string>
#include <vector>

#include "sparq/format.h"
#include "sparq/pattern.h"
#include "sparq/quant.h"
#include "sparq/blas_threads.h"
#include "src/cpu/spmm.h"

namespace sparq {
namespace {

struct Shape {
  int64_t m, k;
};
const Shape kShapes[] = {{4096, 4096}, {11008, 4096}, {4096, 11008}, {576, 576}, {1536, 576}, {576, 1536}};
const char* kPatterns[] = {"dense", "2:4", "vnm:16:2:4", "unstructured:0.5", "unstructured:0.9",
                           "block:32x32:0.9"};
const int64_t kNs[] = {1, 16, 512};

std::vector<float> Random(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> v(n);
  for (auto& e : v) e = u(rng);
  return v;
}

void BM_Kernel(benchmark::State& state, const cpu::KernelRow* kern, Shape s, std::string pattern,
               ValueSpec values, int64_t n) {
  const DType dt = values.quantized() ? DType::kF32 : values.dtype;
  const Pattern p = *Pattern::Parse(pattern);
  std::vector<float> w = Random(s.m * s.k, 1);
  if (p.kind != PatternKind::kDense) (void)MagnitudePrune(p, w, s.m, s.k, "bench");
  int64_t nnz = 0;
  for (float v : w) nnz += v != 0;
  auto enc = Encode(w, s.m, s.k, PickFormat(p), p, dt);
  cpu::PackOptions options;
  options.values = values;
  auto packed = cpu::Pack(*enc, "w", options);
  static const KernelConfig cfg = KernelConfig::FromMachine().value();
  if (!packed.ok() || !cpu::Declines(*kern, *packed, n, cfg, true).empty()) {
    state.SkipWithError("kernel does not take this format");
    return;
  }
  const std::vector<float> x = Random(n * s.k, 2);
  std::vector<float> y(n * s.m);
  ThreadPool pool(static_cast<int>(state.range(0)));
  blas::OpenBlasThreads pin(static_cast<int>(state.range(0)));  // restored after the run
  cpu::SpmmArgs a;
  a.x = x.data();
  a.n = n;
  a.ldx = s.k;
  a.y = y.data();
  a.ldy = s.m;
  a.cfg = &cfg;
  for (auto _ : state) {
    kern->Run(*packed, a, &pool);
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * n * nnz * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["bytes/s"] = benchmark::Counter(double(packed->weight_bytes), benchmark::Counter::kIsIterationInvariantRate);
}

void BM_OpenBlas(benchmark::State& state, Shape s, int64_t n) {
  const std::vector<float> w = Random(s.m * s.k, 1), x = Random(n * s.k, 2);
  std::vector<float> y(n * s.m);
  blas::OpenBlasThreads pin(static_cast<int>(state.range(0)));  // restored after the run
  for (auto _ : state) {
    if (n == 1) {
      cblas_sgemv(CblasRowMajor, CblasNoTrans, s.m, s.k, 1, w.data(), s.k, x.data(), 1, 0, y.data(), 1);
    } else {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, s.m, s.k, 1, x.data(), s.k, w.data(), s.k, 0,
                  y.data(), s.m);
    }
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * n * s.m * s.k * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["bytes/s"] = benchmark::Counter(4.0 * s.m * s.k, benchmark::Counter::kIsIterationInvariantRate);
}

int Register() {
  for (const Shape& s : kShapes) {
    for (int64_t n : kNs) {
      const std::string shape = std::to_string(s.m) + "x" + std::to_string(s.k) + "/n" + std::to_string(n);
      benchmark::RegisterBenchmark(("OpenBlas/" + shape).c_str(), BM_OpenBlas, s, n)->Arg(1)->Arg(2)->UseRealTime();
      for (const auto& kern : cpu::KernelTable()) {
        if (n < kern.min_n || n > kern.max_n) continue;
        for (const char* pat : kPatterns) {
          for (const char* spec : {"f32", "bf16", "int8:g64", "int4:g64"}) {
            const ValueSpec values = *ValueSpec::Parse(spec);
            // Rows that decline this pattern's packed layout report it as a skipped run.
            if (kern.values != cpu::ValueKindOf(values) && kern.layout != cpu::KernelLayout::kDenseF32) continue;
            const std::string name = std::string(kern.name) + "/" + pat + "/" + spec + "/" + shape;
            benchmark::RegisterBenchmark(name.c_str(), BM_Kernel, &kern, s, std::string(pat), values, n)
                ->Arg(1)->Arg(2)->UseRealTime();
          }
        }
      }
    }
  }
  return 0;
}
const int kRegistered = Register();

}  // namespace
}  // namespace sparq

BENCHMARK_MAIN();
