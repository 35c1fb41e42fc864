// Machine limits for `sparq bench machine`: peak f32 FMA rate (many independent FMA chains, the
// widest dispatched vectors) and read bandwidth (a STREAM-like sum over a large array).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/cpu/machine.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <chrono>
#include <thread>
#include <vector>

#include "src/cpu/machine.h"

HWY_BEFORE_NAMESPACE();
namespace sparq::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// 12 independent chains: enough to cover FMA latency (4) x 2 ports, few enough for 16 registers.
double FmaLoopT(int64_t iters, int64_t* flops) {
  const hn::ScalableTag<float> d;
  auto a0 = hn::Set(d, 1.0f), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0;
  auto a6 = a0, a7 = a0, a8 = a0, a9 = a0, a10 = a0, a11 = a0;
  const auto m = hn::Set(d, 0.999999f), c = hn::Set(d, 1e-7f);
  for (int64_t i = 0; i < iters; ++i) {
    a0 = hn::MulAdd(a0, m, c); a1 = hn::MulAdd(a1, m, c); a2 = hn::MulAdd(a2, m, c);
    a3 = hn::MulAdd(a3, m, c); a4 = hn::MulAdd(a4, m, c); a5 = hn::MulAdd(a5, m, c);
    a6 = hn::MulAdd(a6, m, c); a7 = hn::MulAdd(a7, m, c); a8 = hn::MulAdd(a8, m, c);
    a9 = hn::MulAdd(a9, m, c); a10 = hn::MulAdd(a10, m, c); a11 = hn::MulAdd(a11, m, c);
  }
  *flops = iters * 12 * 2 * static_cast<int64_t>(hn::Lanes(d));
  auto s = hn::Add(hn::Add(hn::Add(a0, a1), hn::Add(a2, a3)), hn::Add(hn::Add(a4, a5), hn::Add(a6, a7)));
  s = hn::Add(s, hn::Add(hn::Add(a8, a9), hn::Add(a10, a11)));
  return hn::GetLane(hn::SumOfLanes(d, s));
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

double MeasurePeakFmaGflops(int threads) {
  const int64_t iters = 20'000'000;
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    std::vector<int64_t> flops(threads);
    std::vector<double> sink(threads);
    const double s = RunOnThreads(threads, [&](int t) {
      sink[t] = HWY_DYNAMIC_DISPATCH(FmaLoopT)(iters, &flops[t]);
    });
    int64_t total = 0;
    for (auto f : flops) total += f;
    best = std::max(best, total / s * 1e-9 + (sink[0] == 12345.0 ? 1e-30 : 0.0));
  }
  return best;
}

double MeasureReadGbps(int threads, int64_t bytes) {
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
      sink[t] = HWY_DYNAMIC_DISPATCH(SumT)(bufs[t].get(), per);
    });
    best = std::max(best, per * 4.0 * threads / s * 1e-9);
  }
  return best;
}

}  // namespace sparq::cpu
#endif
