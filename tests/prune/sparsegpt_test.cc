// Method tests: SparseGPT < Wanda < magnitude on correlated inputs for every pattern, exactness
// against least squares and brute force on tiny problems, invariants, determinism, quantizer hook.
#include <cblas.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>

#include "prune/prune_testutil.h"
#include "sparq/format.h"
#include "sparq/prune.h"
#include "src/prune/prune_internal.h"
#include "sparq/synthetic.h"

namespace sparq {
namespace {

using testing::CheckPattern;
using testing::MakeProblem;
using testing::Problem;

Result<PruneReport> RunMethod(const Problem& pr, PruneMethod method, const Pattern& p,
                              std::vector<float>* out, PruneOptions opt = {}) {
  *out = pr.w;
  opt.method = method;
  return Prune(std::span<float>(*out), pr.m, pr.k, pr.h, p, opt);
}

struct Shape {
  int64_t m, k, n;
};

// Margins: SparseGPT must beat Wanda and Wanda magnitude by at least these factors. Whole-row
// pruning cannot be compensated (no weight of a removed row survives), so there SparseGPT can only
// choose better rows (it picks the rows of least error exactly), and Wanda only better rows than
// magnitude: 10% margins there.
double SgptMargin(const Pattern& p) { return p.kind == PatternKind::kRows ? 0.9 : 0.5; }
double WandaMargin(const Pattern& p) { return p.kind == PatternKind::kRows ? 0.9 : 0.8; }

TEST(PruneMethods, SparseGptBeatsWandaBeatsMagnitudeEveryPattern) {
  const uint64_t seed = 42;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  for (Shape s : {Shape{64, 200, 800}, Shape{50, 257, 1024}, Shape{32, 136, 512}}) {
    Problem pr = MakeProblem(s.m, s.k, s.n, seed + s.k);
    for (const Pattern& p : testing::AllPatterns()) {
      double err[3];
      int idx = 0;
      for (PruneMethod method :
           {PruneMethod::kMagnitude, PruneMethod::kWanda, PruneMethod::kSparseGpt}) {
        std::vector<float> w;
        auto rep = RunMethod(pr, method, p, &w);
        ASSERT_TRUE(rep.ok()) << rep.status().ToString();
        EXPECT_EQ(CheckPattern(p, w, s.m, s.k), "")
            << PruneMethodName(method) << " " << p.ToString() << " " << s.m << "x" << s.k;
        EXPECT_TRUE(Satisfies(p, w, s.m, s.k)) << PruneMethodName(method) << " " << p.ToString();
        // The report's error (from H, dgemm) equals the error computed directly from X.
        const double direct = testing::DirectError(pr, w);
        EXPECT_NEAR(rep->rel_error, direct, 1e-9 + 1e-6 * direct) << p.ToString();
        EXPECT_EQ(rep->zeros, std::count(w.begin(), w.end(), 0.0f));
        err[idx++] = rep->rel_error;
      }
      std::printf("%4lld x %4lld %-18s magnitude %.5f  wanda %.5f  sparsegpt %.5f\n",
                  static_cast<long long>(s.m), static_cast<long long>(s.k), p.ToString().c_str(),
                  err[0], err[1], err[2]);
      EXPECT_LT(err[1], WandaMargin(p) * err[0]) << p.ToString() << " " << s.m << "x" << s.k;
      EXPECT_LE(err[2], SgptMargin(p) * err[1]) << p.ToString() << " " << s.m << "x" << s.k;
    }
  }
}

// Least-squares refit of one row for a fixed mask: minimize (w - w') H (w - w')^T with w'_P = 0.
// Returns the error and writes w'. Plain Gaussian elimination in double.
double RefitRow(const std::vector<double>& h, int64_t k, const float* w, const std::vector<bool>& keep,
                std::vector<double>* wp) {
  std::vector<int64_t> K, P;
  for (int64_t j = 0; j < k; ++j) (keep[j] ? K : P).push_back(j);
  const size_t nk = K.size();
  // Solve H_KK d = H_KP w_P; w'_K = w_K + d.
  std::vector<double> a(nk * (nk + 1));
  for (size_t r = 0; r < nk; ++r) {
    for (size_t c = 0; c < nk; ++c) a[r * (nk + 1) + c] = h[K[r] * k + K[c]];
    double rhs = 0;
    for (int64_t p : P) rhs += h[K[r] * k + p] * w[p];
    a[r * (nk + 1) + nk] = rhs;
  }
  for (size_t c = 0; c < nk; ++c) {
    size_t piv = c;
    for (size_t r = c + 1; r < nk; ++r) {
      if (std::abs(a[r * (nk + 1) + c]) > std::abs(a[piv * (nk + 1) + c])) piv = r;
    }
    for (size_t j = 0; j <= nk; ++j) std::swap(a[c * (nk + 1) + j], a[piv * (nk + 1) + j]);
    for (size_t r = 0; r < nk; ++r) {
      if (r == c) continue;
      const double f = a[r * (nk + 1) + c] / a[c * (nk + 1) + c];
      for (size_t j = c; j <= nk; ++j) a[r * (nk + 1) + j] -= f * a[c * (nk + 1) + j];
    }
  }
  wp->assign(static_cast<size_t>(k), 0.0);
  for (size_t r = 0; r < nk; ++r) (*wp)[K[r]] = w[K[r]] + a[r * (nk + 1) + nk] / a[r * (nk + 1) + r];
  double e = 0;
  for (int64_t i = 0; i < k; ++i) {
    for (int64_t j = 0; j < k; ++j) e += (w[i] - (*wp)[i]) * h[i * k + j] * (w[j] - (*wp)[j]);
  }
  return e;
}

double RowError(const std::vector<double>& h, int64_t k, const float* w, const float* wp) {
  double e = 0;
  for (int64_t i = 0; i < k; ++i) {
    for (int64_t j = 0; j < k; ++j) {
      e += (static_cast<double>(w[i]) - wp[i]) * h[i * k + j] * (static_cast<double>(w[j]) - wp[j]);
    }
  }
  return e;
}

// A direct transcription of the reference algorithm (IST-DASLab/sparsegpt) in double, without
// lazy batching: every processed column updates all later columns at once. Per-row masks only
// (N:M groups chosen at each group's first column, or unstructured-row chosen per block of B
// columns at the block's start). Returns W'.
// U, the upper Cholesky factor of (H + damp * mean(diag H) I)^-1 (Hinv = U^T U), in double:
// Hinv by Gauss-Jordan, then U row by row.
std::vector<double> NaiveUpperFactor(std::vector<double> h, int64_t k, double damp) {
  double mean = 0;
  for (int64_t j = 0; j < k; ++j) mean += h[j * k + j] / k;
  for (int64_t j = 0; j < k; ++j) h[j * k + j] += damp * mean;
  std::vector<double> a(k * 2 * k, 0.0);
  for (int64_t i = 0; i < k; ++i) {
    for (int64_t j = 0; j < k; ++j) a[i * 2 * k + j] = h[i * k + j];
    a[i * 2 * k + k + i] = 1;
  }
  for (int64_t c = 0; c < k; ++c) {
    for (int64_t r = 0; r < k; ++r) {
      if (r == c) continue;
      const double f = a[r * 2 * k + c] / a[c * 2 * k + c];
      for (int64_t j = 0; j < 2 * k; ++j) a[r * 2 * k + j] -= f * a[c * 2 * k + j];
    }
  }
  std::vector<double> hinv(k * k), u(k * k, 0.0);
  for (int64_t i = 0; i < k; ++i) {
    for (int64_t j = 0; j < k; ++j) hinv[i * k + j] = a[i * 2 * k + k + j] / a[i * 2 * k + i];
  }
  for (int64_t i = 0; i < k; ++i) {  // Hinv = U^T U, row by row
    double d = hinv[i * k + i];
    for (int64_t t = 0; t < i; ++t) d -= u[t * k + i] * u[t * k + i];
    u[i * k + i] = std::sqrt(d);
    for (int64_t j = i + 1; j < k; ++j) {
      double v = hinv[i * k + j];
      for (int64_t t = 0; t < i; ++t) v -= u[t * k + i] * u[t * k + j];
      u[i * k + j] = v / u[i * k + i];
    }
  }
  return u;
}

std::vector<double> NaiveSparseGpt(const Problem& pr, const Pattern& p, int64_t bsz, double damp) {
  const int64_t k = pr.k;
  const std::vector<double> u = NaiveUpperFactor(pr.h, k, damp);
  std::vector<double> out(pr.w.begin(), pr.w.end());
  for (int64_t r = 0; r < pr.m; ++r) {
    double* w = &out[r * k];
    std::vector<bool> keep(k, true);
    for (int64_t i = 0; i < k; ++i) {
      auto score = [&](int64_t j) { return w[j] * w[j] / (u[j * k + j] * u[j * k + j]); };
      if (p.kind == PatternKind::kUnstructured && i % bsz == 0) {
        const int64_t i2 = std::min(k, i + bsz);
        const int64_t n = std::llround(p.fraction * i2) - std::llround(p.fraction * i);
        std::vector<int64_t> idx(i2 - i);
        std::iota(idx.begin(), idx.end(), i);
        std::stable_sort(idx.begin(), idx.end(), [&](int64_t x, int64_t y) { return score(x) > score(y); });
        for (int64_t t = 0; t < i2 - i; ++t) keep[idx[t]] = t < i2 - i - n;
      }
      if (p.kind == PatternKind::kNM && i % p.m == 0) {
        const int64_t g1 = std::min<int64_t>(k, i + p.m);
        std::vector<int64_t> idx(g1 - i);
        std::iota(idx.begin(), idx.end(), i);
        std::stable_sort(idx.begin(), idx.end(), [&](int64_t x, int64_t y) { return score(x) > score(y); });
        for (int64_t t = 0; t < g1 - i; ++t) keep[idx[t]] = t < p.n;
      }
      const double q = keep[i] ? w[i] : 0.0;
      const double err = (w[i] - q) / u[i * k + i];
      w[i] = q;
      for (int64_t j = i + 1; j < k; ++j) w[j] -= err * u[i * k + j];
    }
  }
  return out;
}

TEST(PruneSparseGpt, MatchesNaiveTranscriptionOfTheReference) {
  Problem pr = MakeProblem(16, 300, 1200, 17);
  for (const Pattern& p : {Pattern::NM(2, 4), Pattern::NM(4, 8), Pattern::Unstructured(0.5, true)}) {
    for (int64_t bsz : {128, 64}) {
      std::vector<float> w;
      PruneOptions opt;
      opt.blocksize = bsz;
      ASSERT_TRUE(RunMethod(pr, PruneMethod::kSparseGpt, p, &w, opt).ok());
      const std::vector<double> ref = NaiveSparseGpt(pr, p, bsz, opt.damp);
      int64_t mask_diff = 0;
      double max_diff = 0, max_abs = 0;
      for (size_t i = 0; i < w.size(); ++i) {
        mask_diff += (w[i] == 0.0f) != (ref[i] == 0.0);
        max_diff = std::max(max_diff, std::abs(w[i] - ref[i]));
        max_abs = std::max(max_abs, std::abs(ref[i]));
      }
      std::printf("%s B=%lld: mask differences %lld, max |w - ref| %.3g (max |w| %.3g)\n",
                  p.ToString().c_str(), static_cast<long long>(bsz),
                  static_cast<long long>(mask_diff), max_diff, max_abs);
      // f32 updates vs double: k = 300 sequential rank-1 updates of O(1) terms.
      EXPECT_EQ(mask_diff, 0) << p.ToString();
      EXPECT_LT(max_diff, 1e-4 * max_abs) << p.ToString();
    }
  }
}

// One pruned weight per row, in the first column SparseGPT processes: the OBS update is then the
// exact least-squares refit of the other weights.
TEST(PruneSparseGpt, OnePrunedWeightMatchesLeastSquares) {
  const int64_t m = 12, k = 8;
  Problem pr = MakeProblem(m, k, 64, 7);
  for (int64_t i = 0; i < m; ++i) pr.w[i * k] *= 1e-3f;  // make column 0 the one to prune
  std::vector<float> w;
  PruneOptions opt;
  opt.damp = 0.0;
  auto rep = RunMethod(pr, PruneMethod::kSparseGpt, Pattern::Unstructured(1.0 / k, true), &w, opt);
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  for (int64_t i = 0; i < m; ++i) {
    ASSERT_EQ(w[i * k], 0.0f) << "row " << i;
    std::vector<bool> keep(k, true);
    keep[0] = false;
    std::vector<double> ref;
    RefitRow(pr.h, k, &pr.w[i * k], keep, &ref);
    for (int64_t j = 1; j < k; ++j) {
      // f32 arithmetic on O(1) values through a k x k factor: a few hundred ulps at most.
      EXPECT_NEAR(w[i * k + j], ref[j], 2e-5 * (1 + std::abs(ref[j]))) << i << "," << j;
    }
  }
}

// k = 8: brute force over every mask of each row; the optimum (with refit) bounds every method
// from below, and SparseGPT stays within a stated factor of it. On so few columns SparseGPT's
// one-pass order is a real handicap (the last group has no later column to compensate with and
// an unstructured row's mask is fixed from OBS scores up front): measured totals here are 1.4x
// (1:4), 2.3x (2:4) and 4.0x (unstructured-row 0.5) the optimum, against 1.9x, 3.6x and 4.1x
// for Wanda and 25-150x for magnitude.
TEST(PruneSparseGpt, WithinFactorOfBruteForceOptimum) {
  const int64_t m = 16, k = 8;
  constexpr double kFactor = 5.0;  // sum of SparseGPT row errors <= 5 x sum of optimal ones
  for (const Pattern& p : {Pattern::NM(2, 4), Pattern::Unstructured(0.5, true), Pattern::NM(1, 4)}) {
    Problem pr = MakeProblem(m, k, 96, 11);
    std::vector<float> ws, ww, wm;
    PruneOptions opt;
    opt.damp = 0.0;
    ASSERT_TRUE(RunMethod(pr, PruneMethod::kSparseGpt, p, &ws, opt).ok());
    ASSERT_TRUE(RunMethod(pr, PruneMethod::kWanda, p, &ww).ok());
    ASSERT_TRUE(RunMethod(pr, PruneMethod::kMagnitude, p, &wm).ok());
    double sum_opt = 0, sum_s = 0, worst = 0;
    for (int64_t i = 0; i < m; ++i) {
      double best = INFINITY;
      for (int mask = 0; mask < (1 << k); ++mask) {
        std::vector<float> row(k);
        for (int64_t j = 0; j < k; ++j) row[j] = (mask >> j & 1) ? 1.0f : 0.0f;
        if (!testing::CheckPattern(p, row, 1, k).empty()) continue;
        std::vector<bool> keep(k);
        for (int64_t j = 0; j < k; ++j) keep[j] = mask >> j & 1;
        std::vector<double> ref;
        best = std::min(best, RefitRow(pr.h, k, &pr.w[i * k], keep, &ref));
      }
      const double es = RowError(pr.h, k, &pr.w[i * k], &ws[i * k]);
      EXPECT_GE(es, best * (1 - 1e-5) - 1e-12) << "row " << i;
      EXPECT_GE(RowError(pr.h, k, &pr.w[i * k], &ww[i * k]), best * (1 - 1e-5) - 1e-12);
      EXPECT_GE(RowError(pr.h, k, &pr.w[i * k], &wm[i * k]), best * (1 - 1e-5) - 1e-12);
      worst = std::max(worst, es / best);
      sum_opt += best;
      sum_s += es;
    }
    double sum_w = 0, sum_m = 0;
    for (int64_t i = 0; i < m; ++i) {
      sum_w += RowError(pr.h, k, &pr.w[i * k], &ww[i * k]);
      sum_m += RowError(pr.h, k, &pr.w[i * k], &wm[i * k]);
    }
    std::printf("%s: error / optimum: SparseGPT total %.3f (worst row %.3f), Wanda %.3f, "
                "magnitude %.3f\n", p.ToString().c_str(), sum_s / sum_opt, worst, sum_w / sum_opt,
                sum_m / sum_opt);
    EXPECT_LT(sum_s, sum_w) << p.ToString();
    EXPECT_LE(sum_s, kFactor * sum_opt) << p.ToString();
  }
}

// The README's promise: the same call gives the same bits, for any pool size and any OpenBLAS
// thread count. OpenBLAS's own threading changes the bits of sgemm on its Haswell / Zen kernels and
// of dgemm / dsyrk on its SkylakeX kernels (at k = 520 here), so this fails wherever a product
// is left to OpenBLAS's threads; run it under OPENBLAS_CORETYPE=Haswell, Zen and SkylakeX. The
// report's error (a dgemm with H) must not change either: checkpoints store it. Rows pattern:
// SparseGPT picks rows by w H w^T (a dgemm).
TEST(PruneSparseGpt, SameBitsOnRerunAndAcrossThreadCounts) {
  Problem pr = MakeProblem(256, 520, 1024, 5);
  openblas_set_num_threads(2);
  for (const Pattern& p : {Pattern::NM(2, 4), Pattern::Unstructured(0.5), Pattern::VNM(8, 2, 4),
                           Pattern::Block(16, 16, 0.5), Pattern::Rows(0.25)}) {
    std::vector<float> a, b, c, d;
    PruneOptions opt;
    auto ra = RunMethod(pr, PruneMethod::kSparseGpt, p, &a, opt);
    auto rb = RunMethod(pr, PruneMethod::kSparseGpt, p, &b, opt);
    ThreadPool pool(2);
    opt.pool = &pool;
    auto rc = RunMethod(pr, PruneMethod::kSparseGpt, p, &c, opt);
    openblas_set_num_threads(1);
    auto rd = RunMethod(pr, PruneMethod::kSparseGpt, p, &d, opt);
    openblas_set_num_threads(2);
    ASSERT_TRUE(ra.ok() && rb.ok() && rc.ok() && rd.ok()) << p.ToString();
    EXPECT_EQ(openblas_get_num_threads(), 2) << "OpenBLAS thread count restored";
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << "rerun " << p.ToString();
    EXPECT_EQ(0, std::memcmp(a.data(), c.data(), a.size() * 4)) << "pool 2 " << p.ToString();
    EXPECT_EQ(0, std::memcmp(a.data(), d.data(), a.size() * 4)) << "openblas 1 " << p.ToString();
    for (const auto* r : {&rb, &rc, &rd}) {
      EXPECT_EQ(0, std::memcmp(&ra->rel_error, &(*r)->rel_error, sizeof(double)))
          << "rel_error " << p.ToString() << ": " << ra->rel_error << " vs " << (*r)->rel_error;
    }
    for (PruneMethod mm : {PruneMethod::kWanda, PruneMethod::kMagnitude}) {
      std::vector<float> e, f;
      PruneOptions o1, o2;
      o2.pool = &pool;
      auto re = RunMethod(pr, mm, p, &e, o1);
      openblas_set_num_threads(1);
      auto rf = RunMethod(pr, mm, p, &f, o2);
      openblas_set_num_threads(2);
      ASSERT_TRUE(re.ok() && rf.ok());
      EXPECT_EQ(0, std::memcmp(e.data(), f.data(), e.size() * 4)) << PruneMethodName(mm);
      EXPECT_EQ(0, std::memcmp(&re->rel_error, &rf->rel_error, sizeof(double)))
          << PruneMethodName(mm) << " rel_error";
    }
  }
}

// The synthetic calibration inputs (tests, `sparq prune-layer-synth`) are deterministic for
// a seed, whatever OpenBLAS's thread count.
TEST(PruneSparseGpt, SyntheticInputsIndependentOfOpenBlasThreads) {
  openblas_set_num_threads(1);
  const std::vector<float> x1 = SyntheticInputs(700, 520, 8);
  openblas_set_num_threads(2);
  const std::vector<float> x2 = SyntheticInputs(700, 520, 8);
  EXPECT_EQ(0, std::memcmp(x1.data(), x2.data(), x1.size() * 4));
}

// OpenBLAS's parallel dpotrf/dtrtri give other bits than the serial ones (already at k = 512):
// the factor must not depend on OpenBLAS's thread count.
TEST(PruneSparseGpt, FactorIndependentOfOpenBlasThreads) {
  const int64_t k = 700;
  std::vector<float> x = SyntheticInputs(900, k, 3);
  HessianAccumulator acc(k);
  ASSERT_TRUE(acc.Add(x.data(), 900, k).ok());
  const std::vector<double> h = acc.Hessian();
  std::vector<double> u1, u2;
  openblas_set_num_threads(2);
  ASSERT_TRUE(prune_internal::InverseCholeskyUpper(h, k, 0.01, &u2));
  EXPECT_EQ(openblas_get_num_threads(), 2);  // restored
  openblas_set_num_threads(1);
  ASSERT_TRUE(prune_internal::InverseCholeskyUpper(h, k, 0.01, &u1));
  openblas_set_num_threads(2);
  EXPECT_EQ(0, std::memcmp(u1.data(), u2.data(), u1.size() * 8));
}

TEST(PruneSparseGpt, PerRowMaskAndBlocksizeOptions) {
  Problem pr = MakeProblem(40, 300, 600, 9);
  for (int64_t bs : {1, 7, 64, 128, 129, 1000}) {
    for (bool per_row : {false, true}) {
      std::vector<float> w;
      PruneOptions opt;
      opt.blocksize = bs;
      opt.per_row_mask = per_row;
      auto rep = RunMethod(pr, PruneMethod::kSparseGpt, Pattern::Unstructured(0.6), &w, opt);
      ASSERT_TRUE(rep.ok());
      EXPECT_EQ(CheckPattern(Pattern::Unstructured(0.6), w, pr.m, pr.k), "") << bs;
      if (per_row) {
        for (int64_t i = 0; i < pr.m; ++i) {
          const int64_t z = std::count(w.begin() + i * pr.k, w.begin() + (i + 1) * pr.k, 0.0f);
          EXPECT_LE(std::abs(z - 0.6 * pr.k), 1.0) << "row " << i;
        }
      }
      std::vector<float> n;
      ASSERT_TRUE(RunMethod(pr, PruneMethod::kSparseGpt, Pattern::NM(2, 4), &n, opt).ok());
      EXPECT_EQ(CheckPattern(Pattern::NM(2, 4), n, pr.m, pr.k), "") << bs;
    }
  }
}

TEST(PruneSparseGpt, DeadInputsAreZeroedAndReported) {
  Problem pr = MakeProblem(16, 24, 100, 3);
  for (int64_t t = 0; t < pr.n; ++t) pr.x[t * pr.k + 5] = 0.0f;
  for (int64_t j = 0; j < pr.k; ++j) pr.h[5 * pr.k + j] = pr.h[j * pr.k + 5] = 0.0;
  std::vector<float> w;
  auto rep = RunMethod(pr, PruneMethod::kSparseGpt, Pattern::NM(2, 4), &w);
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  EXPECT_EQ(rep->dead_inputs, 1);
  for (int64_t i = 0; i < pr.m; ++i) EXPECT_EQ(w[i * pr.k + 5], 0.0f);
  EXPECT_EQ(CheckPattern(Pattern::NM(2, 4), w, pr.m, pr.k), "");
}

TEST(PruneSparseGpt, SingularHessianRetriesWithMoreDamping) {
  Problem pr = MakeProblem(8, 32, 8, 4);  // 8 samples for 32 inputs: rank 8
  std::vector<float> w;
  PruneOptions opt;
  opt.damp = 0.0;
  auto rep = RunMethod(pr, PruneMethod::kSparseGpt, Pattern::NM(2, 4), &w, opt);
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  EXPECT_GT(rep->damp_retries, 0);
  EXPECT_GT(rep->damp_used, 0.0);
  EXPECT_EQ(CheckPattern(Pattern::NM(2, 4), w, pr.m, pr.k), "");
}

TEST(PruneSparseGpt, InverseCholeskyFactor) {
  Problem pr = MakeProblem(4, 37, 200, 8);
  const int64_t k = pr.k;
  std::vector<double> u;
  ASSERT_TRUE(prune_internal::InverseCholeskyUpper(pr.h, k, 0.01, &u));
  // U upper with positive diagonal and U^T U (H + 0.01 I) = I.
  for (int64_t i = 0; i < k; ++i) {
    EXPECT_GT(u[i * k + i], 0);
    for (int64_t j = 0; j < i; ++j) EXPECT_EQ(u[i * k + j], 0.0);
  }
  for (int64_t i = 0; i < k; ++i) {
    for (int64_t j = 0; j < k; ++j) {
      double s = 0;
      for (int64_t l = 0; l < k; ++l) {
        double hinv_il = 0;
        for (int64_t t = 0; t < k; ++t) hinv_il += u[t * k + i] * u[t * k + l];
        s += hinv_il * (pr.h[l * k + j] + (l == j ? 0.01 : 0.0));
      }
      EXPECT_NEAR(s, i == j ? 1.0 : 0.0, 1e-9) << i << "," << j;
    }
  }
}

// A quantizer on a uniform grid of step 1/32 with per-group fitting bookkeeping.
class GridQuantizer : public Quantizer {
 public:
  explicit GridQuantizer(int64_t m, int64_t g) : g_(g), fits_(static_cast<size_t>(m), 0) {}
  float Quantize(int64_t, int64_t, float w) const override { return std::nearbyint(w * 32) / 32; }
  int64_t group_size() const override { return g_; }
  void FitGroup(int64_t row, int64_t col, const float*, const uint8_t*, int64_t len) override {
    if (col != fits_[row] * g_ || len <= 0) bad_ = true;
    ++fits_[row];
  }
  int64_t g_;
  std::vector<int64_t> fits_;
  bool bad_ = false;
};

TEST(PruneSparseGpt, QuantizeWhilePruningBeatsQuantizeAfter) {
  Problem pr = MakeProblem(32, 256, 1024, 12);
  for (PruneMethod mm : {PruneMethod::kSparseGpt, PruneMethod::kWanda}) {
    GridQuantizer q(pr.m, 32);
    std::vector<float> joint;
    PruneOptions opt;
    opt.quantizer = &q;
    auto rep = RunMethod(pr, mm, Pattern::NM(2, 4), &joint, opt);
    ASSERT_TRUE(rep.ok());
    EXPECT_FALSE(q.bad_);
    for (int64_t r = 0; r < pr.m; ++r) EXPECT_EQ(q.fits_[r], pr.k / 32);
    for (float v : joint) EXPECT_EQ(v, std::nearbyint(v * 32) / 32);
    // Kept weights may round to 0 on the grid, so "at most 2 of 4" rather than exactly 2.
    EXPECT_TRUE(Satisfies(Pattern::NM(2, 4), joint, pr.m, pr.k));
    if (mm == PruneMethod::kSparseGpt) {
      std::vector<float> after;
      ASSERT_TRUE(RunMethod(pr, mm, Pattern::NM(2, 4), &after).ok());
      for (float& v : after) v = std::nearbyint(v * 32) / 32;
      const double e_joint = testing::DirectError(pr, joint), e_after = testing::DirectError(pr, after);
      std::printf("2:4 + grid 1/32: joint %.5f, quantize after %.5f\n", e_joint, e_after);
      EXPECT_LT(e_joint, e_after);
    }
  }
}

// Joint SparseGPT + GPTQ on sparq's stored grid (GroupQuantizer): SmolLM2's k = 576 under 2:4
// keeps 288 values a row, 4.5 groups of 64 (a short last group of 32). The swept weights must be
// exactly what the quantized N:M matrix stores with the fitted groups, keep the 2:4 mask, and
// reconstruct better than pruning first and rounding to nearest after.
TEST(PruneSparseGpt, JointGroupQuantizerStoresExactlyWhatItSwept) {
  Problem pr = MakeProblem(32, 576, 1024, 13);
  const Pattern p = Pattern::NM(2, 4);
  std::vector<float> pruned;
  ASSERT_TRUE(RunMethod(pr, PruneMethod::kSparseGpt, p, &pruned).ok());
  const NmMatrix pruned_nm = *NmMatrix::FromDense(pruned, pr.m, pr.k, 2, 4);
  for (const char* text : {"int4:g64", "int4:g64:sym", "int4:g32", "int8:g64"}) {
    SCOPED_TRACE(text);
    const ValueSpec spec = *ValueSpec::Parse(text);
    auto q = GroupQuantizer::Make(spec, p, pr.m, pr.k);
    ASSERT_TRUE(q.ok()) << q.status().ToString();
    EXPECT_EQ(q->group_size(), spec.group * 2);
    EXPECT_EQ(q->groups_per_row(), (288 + spec.group - 1) / spec.group);
    std::vector<float> joint;
    PruneOptions opt;
    opt.quantizer = &*q;
    ASSERT_TRUE(RunMethod(pr, PruneMethod::kSparseGpt, p, &joint, opt).ok());
    ASSERT_TRUE(q->status().ok()) << q->status().ToString();
    EXPECT_TRUE(Satisfies(p, joint, pr.m, pr.k));
    for (const QuantGroup& g : q->groups()) EXPECT_GT(g.scale, 0.0f) << "a group was never fitted";

    auto nm = NmMatrix::FromDense(joint, pr.m, pr.k, 2, 4);
    ASSERT_TRUE(nm.ok());
    auto stored = NmMatrix::Quantize(*nm, spec, q->groups());
    ASSERT_TRUE(stored.ok()) << stored.status().ToString();
    const Tensor back = stored->ToDense();
    EXPECT_EQ(std::memcmp(back.data_as<float>(), joint.data(), joint.size() * 4), 0)
        << "the stored codes do not reproduce the swept weights";

    auto rtn = NmMatrix::Quantize(pruned_nm, spec);
    ASSERT_TRUE(rtn.ok());
    const Tensor after = rtn->ToDense();
    const double e_joint = testing::DirectError(pr, joint);
    const double e_after = testing::DirectError(
        pr, std::vector<float>(after.data_as<float>(), after.data_as<float>() + joint.size()));
    const double e_f32 = testing::DirectError(pr, pruned);
    std::printf("2:4 %s: f32 %.5f, joint %.5f, round to nearest after %.5f\n", text, e_f32,
                e_joint, e_after);
    if (spec.dtype == DType::kI4) {
      EXPECT_LT(e_joint, e_after);
    } else {
      // int8's rounding adds under 1% to the pruning error here (0.00533 after vs 0.00530 f32):
      // GPTQ has nothing to win back, and the two differ by the sweep's noise (measured 0.3%).
      EXPECT_LT(e_joint, 1.01 * e_after);
    }
  }
}

TEST(PruneSparseGpt, GroupQuantizerGroupsEveryPatternOrRefusesIt) {
  const ValueSpec spec = *ValueSpec::Parse("int4:g64");
  auto odd = GroupQuantizer::Make(spec, Pattern::NM(3, 8), 4, 64);
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(odd.status().message().find("not a whole number of 3:8 groups"), std::string::npos);
  auto bsr = GroupQuantizer::Make(spec, Pattern::Block(4, 4, 0.5), 4, 100);
  ASSERT_TRUE(bsr.ok());
  EXPECT_EQ(bsr->group_size(), 64);  // BSR groups are column ranges too, all of a block kept
  EXPECT_EQ(bsr->groups_per_row(), 2);
  EXPECT_TRUE(bsr->kept().empty());
  auto csr = GroupQuantizer::Make(spec, Pattern::Unstructured(0.5), 4, 100);
  ASSERT_TRUE(csr.ok());
  EXPECT_EQ(csr->group_size(), 64);  // CSR groups are column ranges (format.h)
  EXPECT_EQ(csr->groups_per_row(), 2);
  EXPECT_EQ(csr->kept().size(), 400u);
  auto f32 = GroupQuantizer::Make(*ValueSpec::Parse("bf16"), Pattern::NM(2, 4), 4, 64);
  EXPECT_FALSE(f32.ok());
  auto dense = GroupQuantizer::Make(spec, Pattern::Dense(), 4, 100);
  ASSERT_TRUE(dense.ok());
  EXPECT_EQ(dense->group_size(), 64);
  EXPECT_EQ(dense->groups_per_row(), 2);
}

// ---- act-order --------------------------------------------------------------------------------

// Input channels of very different energy (a few LLM-like outlier features): column j of X scaled
// by s_j in [0.25, 8] (log-uniform, seeded), W's column divided by it so the outputs keep their
// scale; H follows exactly.
Problem OutlierProblem(int64_t m, int64_t k, int64_t n, uint64_t seed) {
  Problem pr = MakeProblem(m, k, n, seed);
  std::vector<double> s(static_cast<size_t>(k));
  uint64_t st = seed * 2654435761u + 1;
  for (int64_t j = 0; j < k; ++j) {
    st = st * 6364136223846793005ull + 1442695040888963407ull;
    const double u = static_cast<double>(st >> 11) / 9007199254740992.0;
    s[j] = std::exp2(-2.0 + 5.0 * u);
  }
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < k; ++j) pr.x[t * k + j] = static_cast<float>(pr.x[t * k + j] * s[j]);
  }
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < k; ++j) pr.w[i * k + j] = static_cast<float>(pr.w[i * k + j] / s[j]);
  }
  for (int64_t i = 0; i < k; ++i) {
    for (int64_t j = 0; j < k; ++j) pr.h[i * k + j] *= s[i] * s[j];
  }
  return pr;
}

// GPTQ with act-order transcribed in double: columns in order of decreasing H_jj (ties in column
// order), the factor of the permuted damped H, every row swept column by column with each value
// rounded by `grid` (of its original column), no lazy batching.
template <class Grid>
std::vector<double> NaiveActOrder(const Problem& pr, double damp, const Grid& grid) {
  const int64_t k = pr.k;
  std::vector<int64_t> order(static_cast<size_t>(k));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return pr.h[a * k + a] > pr.h[b * k + b];
  });
  std::vector<double> hp(pr.h.size());
  for (int64_t i = 0; i < k; ++i) {
    for (int64_t j = 0; j < k; ++j) hp[i * k + j] = pr.h[order[i] * k + order[j]];
  }
  const std::vector<double> u = NaiveUpperFactor(std::move(hp), k, damp);
  std::vector<double> out(pr.w.size());
  for (int64_t r = 0; r < pr.m; ++r) {
    std::vector<double> w(static_cast<size_t>(k));
    for (int64_t i = 0; i < k; ++i) w[i] = pr.w[r * k + order[i]];
    for (int64_t i = 0; i < k; ++i) {
      const double q = grid(r, order[i], w[i]);
      const double err = (w[i] - q) / u[i * k + i];
      w[i] = q;
      for (int64_t j = i + 1; j < k; ++j) w[j] -= err * u[i * k + j];
    }
    for (int64_t i = 0; i < k; ++i) out[r * k + order[i]] = w[i];
  }
  return out;
}

// Against the double transcription, on a grid of step 1/32 (no fitting: the grid is fixed, so the
// only difference is f32 against double arithmetic). A value within rounding of a grid midpoint
// can round the other way and move the rest of its row; measured: every value equal.
TEST(PruneSparseGpt, ActOrderMatchesNaiveTranscription) {
  Problem pr = OutlierProblem(16, 200, 800, 21);
  GridQuantizer q(pr.m, 0);
  std::vector<float> w;
  PruneOptions opt;
  opt.quantizer = &q;
  opt.act_order = true;
  opt.blocksize = 64;  // several lazy blocks over the permuted columns
  auto rep = RunMethod(pr, PruneMethod::kSparseGpt, Pattern::Dense(), &w, opt);
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  const std::vector<double> ref =
      NaiveActOrder(pr, opt.damp, [](int64_t, int64_t, double x) { return std::nearbyint(x * 32) / 32; });
  int64_t differ = 0;
  for (size_t i = 0; i < w.size(); ++i) differ += w[i] != ref[i];
  std::printf("act-order vs double transcription: %lld of %zu values differ\n",
              static_cast<long long>(differ), w.size());
  EXPECT_LE(differ, static_cast<int64_t>(w.size() / 100));
  // The plain sweep is another result: the order is what the test pins.
  std::vector<float> plain;
  opt.act_order = false;
  ASSERT_TRUE(RunMethod(pr, PruneMethod::kSparseGpt, Pattern::Dense(), &plain, opt).ok());
  int64_t differ_plain = 0;
  for (size_t i = 0; i < w.size(); ++i) differ_plain += plain[i] != ref[i];
  EXPECT_GT(differ_plain, static_cast<int64_t>(w.size() / 10));
}

// sparq's stored grids with act-order: dense int4:g64 and int4:g64 on a fixed 2:4 mask (quantizing
// a pruned layer). Groups are fitted before the sweep; the stored codes give the swept weights
// back exactly, the mask survives bit for bit, and on inputs of uneven energy act-order
// reconstructs better than the column-order sweep.
TEST(PruneSparseGpt, ActOrderKeepsTheMaskAndStoresWhatItSwept) {
  Problem pr = OutlierProblem(32, 576, 1024, 22);
  const ValueSpec spec = *ValueSpec::Parse("int4:g64");
  std::vector<float> pruned;
  ASSERT_TRUE(RunMethod(pr, PruneMethod::kSparseGpt, Pattern::NM(2, 4), &pruned).ok());
  std::vector<uint8_t> mask(pruned.size());
  for (size_t i = 0; i < mask.size(); ++i) mask[i] = pruned[i] != 0.0f;
  for (const Pattern& p : {Pattern::Dense(), Pattern::NM(2, 4)}) {
    SCOPED_TRACE(p.ToString());
    const bool nm = p.kind == PatternKind::kNM;
    double err[2] = {0, 0};
    for (int act = 0; act < 2; ++act) {
      auto q = GroupQuantizer::Make(spec, p, pr.m, pr.k);
      ASSERT_TRUE(q.ok()) << q.status().ToString();
      PruneOptions opt;
      opt.quantizer = &*q;
      opt.act_order = act == 1;
      if (nm) opt.fixed_mask = mask;
      std::vector<float> w;
      ASSERT_TRUE(RunMethod(pr, PruneMethod::kSparseGpt, p, &w, opt).ok());
      ASSERT_TRUE(q->status().ok()) << q->status().ToString();
      Tensor back;
      if (nm) {
        for (size_t i = 0; i < w.size(); ++i) {
          if (!mask[i]) {
            ASSERT_EQ(w[i], 0.0f) << "pruned weight " << i << " became nonzero";
          }
        }
        auto stored = NmMatrix::Quantize(*NmMatrix::FromDense(w, pr.m, pr.k, 2, 4), spec, q->groups());
        ASSERT_TRUE(stored.ok()) << stored.status().ToString();
        back = stored->ToDense();
      } else {
        auto dm = DenseMatrix::FromDense(w, pr.m, pr.k, DType::kF32);
        ASSERT_TRUE(dm.ok());
        auto stored = DenseMatrix::Quantize(*dm, spec, q->groups(), "w");
        ASSERT_TRUE(stored.ok()) << stored.status().ToString();
        back = stored->ToDense();
      }
      EXPECT_EQ(std::memcmp(back.data_as<float>(), w.data(), w.size() * 4), 0)
          << "the stored codes do not reproduce the swept weights (act_order " << act << ")";
      err[act] = testing::DirectError(pr, w);
    }
    std::printf("%s int4:g64 on uneven inputs: column order %.5f, act-order %.5f\n",
                p.ToString().c_str(), err[0], err[1]);
    EXPECT_LT(err[1], err[0]);
  }
}

TEST(PruneSparseGpt, ActOrderRefusesWhatItCannotOrder) {
  Problem pr = MakeProblem(16, 64, 256, 23);
  GridQuantizer q(pr.m, 0);
  std::vector<float> w;
  PruneOptions opt;
  opt.act_order = true;
  auto no_quant = RunMethod(pr, PruneMethod::kSparseGpt, Pattern::Dense(), &w, opt);
  ASSERT_FALSE(no_quant.ok());
  EXPECT_NE(no_quant.status().message().find("needs SparseGPT's sweep with quantized values"),
            std::string::npos) << no_quant.status().ToString();
  opt.quantizer = &q;
  auto chosen = RunMethod(pr, PruneMethod::kSparseGpt, Pattern::NM(2, 4), &w, opt);
  ASSERT_FALSE(chosen.ok());
  EXPECT_NE(chosen.status().message().find("act-order needs a dense pattern or a fixed mask"),
            std::string::npos) << chosen.status().ToString();
  auto wanda = RunMethod(pr, PruneMethod::kWanda, Pattern::Dense(), &w, opt);
  EXPECT_FALSE(wanda.ok());
}

}  // namespace
}  // namespace sparq
