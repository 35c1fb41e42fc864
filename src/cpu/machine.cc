// Machine limits for `sparq bench machine`: peak f32 FMA rate (many independent FMA chains, the
// widest dispatched vectors), the FMA rate when each FMA loads its own vector from L1, and read
// bandwidth (a STREAM-like sum over a large array).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/cpu/machine.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "sparq/machine.h"

#ifndef SPARQ_MACHINE_CC_ONCE  // this file is compiled once per Highway target
#define SPARQ_MACHINE_CC_ONCE
namespace sparq::cpu {
// LoadFmaLoopT's buffer: 16 blocks x 16 chains x up to 64 f32 lanes.
inline constexpr int64_t kLoadFmaFloats = int64_t{kLoadFmaBlocks} * 16 * 64;
}  // namespace sparq::cpu
#endif

HWY_BEFORE_NAMESPACE();
namespace sparq::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Independent FMA chains: 16 where there are 32 vector registers, 12 where there are 16. Each
// chain starts from its own value: with one shared start GCC proved the chains equal and kept
// one (a single 4-cycle-latency chain, counted as 12: the "peak" read 1.5x the true rate on
// this AVX-512 host, 236 instead of ~160 GFLOP/s per core). Returns the sum of lane 0 of every
// chain (tests check it against a double-precision model of each chain).
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_AVX3_ZEN4 || \
    HWY_TARGET == HWY_AVX3_SPR
constexpr int kFmaChains = 16;
#else
constexpr int kFmaChains = 12;
#endif

// The chains of both loops: kLoad = false steps a <- a * kFmaMul + kFmaAdd (registers only);
// kLoad = true steps a_j <- load(block i % kLoadFmaBlocks, chain j) * kFmaMul + a_j from buf.
template <bool kLoad>
double FmaChainsT(const float* buf, int64_t iters, int64_t* flops, int* chains) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  auto a0 = hn::Set(d, FmaChainStart(0)), a1 = hn::Set(d, FmaChainStart(1));
  auto a2 = hn::Set(d, FmaChainStart(2)), a3 = hn::Set(d, FmaChainStart(3));
  auto a4 = hn::Set(d, FmaChainStart(4)), a5 = hn::Set(d, FmaChainStart(5));
  auto a6 = hn::Set(d, FmaChainStart(6)), a7 = hn::Set(d, FmaChainStart(7));
  auto a8 = hn::Set(d, FmaChainStart(8)), a9 = hn::Set(d, FmaChainStart(9));
  auto a10 = hn::Set(d, FmaChainStart(10)), a11 = hn::Set(d, FmaChainStart(11));
  auto a12 = hn::Set(d, FmaChainStart(12)), a13 = hn::Set(d, FmaChainStart(13));
  auto a14 = hn::Set(d, FmaChainStart(14)), a15 = hn::Set(d, FmaChainStart(15));
  const auto m = hn::Set(d, kFmaMul), c = hn::Set(d, kFmaAdd);
  for (int64_t i = 0; i < iters; ++i) {
    const float* p = kLoad ? buf + (i % kLoadFmaBlocks) * kFmaChains * L : buf;
#define SPARQ_CHAIN_STEP(j)                             \
  if constexpr (kLoad) {                                \
    a##j = hn::MulAdd(hn::Load(d, p + (j)*L), m, a##j); \
  } else {                                              \
    a##j = hn::MulAdd(a##j, m, c);                      \
  }
    SPARQ_CHAIN_STEP(0)
    SPARQ_CHAIN_STEP(1) SPARQ_CHAIN_STEP(2) SPARQ_CHAIN_STEP(3) SPARQ_CHAIN_STEP(4)
        SPARQ_CHAIN_STEP(5) SPARQ_CHAIN_STEP(6) SPARQ_CHAIN_STEP(7) SPARQ_CHAIN_STEP(8)
            SPARQ_CHAIN_STEP(9) SPARQ_CHAIN_STEP(10)
                SPARQ_CHAIN_STEP(11) if constexpr (kFmaChains > 12) {
      SPARQ_CHAIN_STEP(12) SPARQ_CHAIN_STEP(13) SPARQ_CHAIN_STEP(14) SPARQ_CHAIN_STEP(15)
    }
#undef SPARQ_CHAIN_STEP
  }
  *flops = iters * kFmaChains * 2 * L;
  *chains = kFmaChains;
  auto s =
      hn::Add(hn::Add(hn::Add(a0, a1), hn::Add(a2, a3)), hn::Add(hn::Add(a4, a5), hn::Add(a6, a7)));
  s = hn::Add(s, hn::Add(hn::Add(a8, a9), hn::Add(a10, a11)));
  if constexpr (kFmaChains > 12) s = hn::Add(s, hn::Add(hn::Add(a12, a13), hn::Add(a14, a15)));
  return hn::GetLane(s);
}

double FmaLoopT(int64_t iters, int64_t* flops, int* chains) {
  return FmaChainsT<false>(nullptr, iters, flops, chains);
}

// The same chains, each FMA's other factor a fresh vector from a 16 KiB buffer (L1). Kernels
// whose every FMA needs its own load (a 2:4 row's X^T vectors, which no other row shares) cannot
// beat this rate. buf: room for kLoadFmaFloats (any vector width up to 2048 bits), filled here
// (every lane of vector (block b, chain j) holds LoadFmaValue(b, j)). Returns the sum over
// chains of lane 0, like FmaLoopT.
double LoadFmaLoopT(float* buf, int64_t iters, int64_t* flops, int* chains) {
  const int64_t L = static_cast<int64_t>(hn::Lanes(hn::ScalableTag<float>()));
  for (int b = 0; b < kLoadFmaBlocks; ++b) {
    for (int j = 0; j < kFmaChains; ++j) {
      for (int64_t l = 0; l < L; ++l) buf[(b * kFmaChains + j) * L + l] = LoadFmaValue(b, j);
    }
  }
  return FmaChainsT<true>(buf, iters, flops, chains);
}

double SumT(const float* p, int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  auto s0 = hn::Zero(d), s1 = s0, s2 = s0, s3 = s0;
  int64_t i = 0;
  for (; i + 4 * L <= n; i += 4 * L) {
    s0 = hn::Add(s0, hn::Load(d, p + i));
    s1 = hn::Add(s1, hn::Load(d, p + i + L));
    s2 = hn::Add(s2, hn::Load(d, p + i + 2 * L));
    s3 = hn::Add(s3, hn::Load(d, p + i + 3 * L));
  }
  double r = hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(s0, s1), hn::Add(s2, s3))));
  for (; i < n; ++i) r += p[i];
  return r;
}

}  // namespace sparq::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <hwy/aligned_allocator.h>

namespace sparq::cpu {
HWY_EXPORT(FmaLoopT);
HWY_EXPORT(LoadFmaLoopT);
HWY_EXPORT(SumT);

namespace {
double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Runs fn(thread) on `threads` threads at once; returns the wall time of the slowest.
template <typename Fn>
double RunOnThreads(int threads, Fn fn) {
  std::vector<std::thread> ts;
  const double t0 = Now();
  for (int t = 1; t < threads; ++t) ts.emplace_back([&, t] { fn(t); });
  fn(0);
  for (auto& t : ts) t.join();
  return Now() - t0;
}
}  // namespace

double FmaLoop(int64_t iters, int64_t* flops, int* chains, const KernelConfig& cfg) {
  return HWY_DISPATCH_TABLE(FmaLoopT)[cfg.dispatch_index](iters, flops, chains);
}

// Best of three timed runs of loop(t, &flops) on each of `threads` threads, in GFLOP/s (loop
// returns its sum, kept so that the compiler cannot drop the work).
template <typename Loop>
double BestFmaGflops(int threads, const Loop& loop) {
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    std::vector<int64_t> flops(threads);
    std::vector<double> sink(threads);
    const double s = RunOnThreads(threads, [&](int t) { sink[t] = loop(t, &flops[t]); });
    int64_t total = 0;
    for (auto f : flops) total += f;
    best = std::max(best, total / s * 1e-9 + (sink[0] == 12345.0 ? 1e-30 : 0.0));
  }
  return best;
}

double MeasurePeakFmaGflops(int threads, const KernelConfig& cfg) {
  const int64_t iters = 20'000'000;
  const auto loop = HWY_DISPATCH_TABLE(FmaLoopT)[cfg.dispatch_index];
  return BestFmaGflops(threads, [&](int, int64_t* flops) {
    int chains = 0;
    return loop(iters, flops, &chains);
  });
}

double LoadFmaLoop(int64_t iters, int64_t* flops, int* chains, const KernelConfig& cfg) {
  auto buf = hwy::AllocateAligned<float>(kLoadFmaFloats);
  return HWY_DISPATCH_TABLE(LoadFmaLoopT)[cfg.dispatch_index](buf.get(), iters, flops, chains);
}

double MeasureLoadFmaGflops(int threads, const KernelConfig& cfg) {
  const int64_t iters = 20'000'000;
  std::vector<hwy::AlignedFreeUniquePtr<float[]>> bufs;
  for (int t = 0; t < threads; ++t) bufs.push_back(hwy::AllocateAligned<float>(kLoadFmaFloats));
  const auto loop = HWY_DISPATCH_TABLE(LoadFmaLoopT)[cfg.dispatch_index];
  return BestFmaGflops(threads, [&](int t, int64_t* flops) {
    int chains = 0;
    return loop(bufs[t].get(), iters, flops, &chains);
  });
}

double MeasureReadGbps(int threads, int64_t bytes, const KernelConfig& cfg) {
  const int64_t per = bytes / 4 / threads;
  std::vector<hwy::AlignedFreeUniquePtr<float[]>> bufs;
  for (int t = 0; t < threads; ++t) {
    bufs.push_back(hwy::AllocateAligned<float>(per));
    for (int64_t i = 0; i < per; ++i) bufs[t][i] = 1.0f;
  }
  double best = 0;
  std::vector<double> sink(threads);
  for (int rep = 0; rep < 5; ++rep) {
    const double s = RunOnThreads(threads, [&](int t) {
      sink[t] = HWY_DISPATCH_TABLE(SumT)[cfg.dispatch_index](bufs[t].get(), per);
    });
    best = std::max(best, per * 4.0 * threads / s * 1e-9);
  }
  return best;
}

}  // namespace sparq::cpu
#endif
