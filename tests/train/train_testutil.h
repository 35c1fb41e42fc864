// Helpers of the gradient tests: seeded inputs, central finite differences in double, and the
// error measure. The f64 forwards the differences run on live in the tests themselves, written
// independently of src/train (a transcription of the math, not of the f32 code).
//
// Error measure: err = max_i |g_i - fd_i| / max_i |fd_i| (relative to the gradient's largest
// component, so near-zero components do not blow it up).
//
// Tolerance (kGradTol): the f32 backward keeps its long sums in double, so its error is the f32
// rounding of its stored intermediates and of its output, eps = 2^-24 ~ 6e-8 each: at most ~10
// roundings along a path (RMSNorm: r, xhat, dy*g, the difference, the output; attention: the
// stored out / dq / dk / dv), each amplified at most ~10x by cancellation (dx = r (dy g - xhat
// dot) subtracts terms of the gradient's size; the softmax Jacobian's p (dp - p.dp) likewise),
// plus sqrt(K) ~ 4 for the rows of K ~ 16 that a sum of rounded products meets in these shapes:
// 10 * 10 * 4 * 6e-8 ~ 2.4e-5. The FD side: central differences with h = 1e-3 on the f64
// forward err by h^2 |f'''| / 6 ~ 2e-7 for |f'''| ~ 1 (inputs ~N(0, 1), smooth ops), and by
// the f64 rounding of the loss eps64 |L| / h ~ 1e-13: both negligible beside the f32 side.
// So kGradTol = 3e-5; the tests print the measured err, typically ~1e-7.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <random>
#include <span>
#include <utility>
#include <vector>

namespace sparq::train::testing {

inline constexpr double kGradTol = 3e-5;
inline constexpr double kFdStep = 1e-3;

inline std::vector<float> RandomNormal(std::mt19937_64* gen, size_t count, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(count);
  for (float& x : v) x = dist(*gen);
  return v;
}

inline std::vector<double> ToDouble(std::span<const float> v) {
  return std::vector<double>(v.begin(), v.end());
}

// Central differences of f at x: (f(x + h e_i) - f(x - h e_i)) / 2h for every i.
inline std::vector<double> FdGrad(const std::function<double(const std::vector<double>&)>& f,
                                  std::vector<double> x, double h = kFdStep) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double fp = f(x);
    x[i] = x0 - h;
    const double fm = f(x);
    x[i] = x0;
    g[i] = (fp - fm) / (2 * h);
  }
  return g;
}

// max |got - want| / max |want|.
inline double MaxRelErr(std::span<const float> got, std::span<const double> want) {
  EXPECT_EQ(got.size(), want.size());
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    num = std::max(num, std::abs(static_cast<double>(got[i]) - want[i]));
    den = std::max(den, std::abs(want[i]));
  }
  return den > 0 ? num / den : num;
}

// Checks got against want at kGradTol and prints the measured error (the report's number).
inline void ExpectGradNear(const char* what, std::span<const float> got,
                           std::span<const double> want, double tol = kGradTol) {
  const double err = MaxRelErr(got, want);
  std::printf("  grad %-28s max rel err %.3g (tol %.1g)\n", what, err, tol);
  EXPECT_LE(err, tol) << what;
}

// sum_i y_i r_i: the scalar loss that turns an op with a tensor output into a gradient check
// (its dy is r).
inline double Project(std::span<const double> y, std::span<const float> r) {
  double s = 0.0;
  for (size_t i = 0; i < y.size(); ++i) s += y[i] * r[i];
  return s;
}

// A generator seeded with `seed`, printed so that a failure can be rerun.
// The means of the first and the last `k` entries of a loss curve (k <= size).
inline std::pair<double, double> HeadTailMeans(std::span<const double> v, size_t k = 5) {
  double head = 0, tail = 0;
  for (size_t i = 0; i < k; ++i) {
    head += v[i] / static_cast<double>(k);
    tail += v[v.size() - 1 - i] / static_cast<double>(k);
  }
  return {head, tail};
}

inline std::mt19937_64 Seeded(uint64_t seed) {
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  return std::mt19937_64(seed);
}

}  // namespace sparq::train::testing
