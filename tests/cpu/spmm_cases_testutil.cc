// The kernel tests' shared cases and checks (spmm_cases_testutil.h).
#include "tests/cpu/spmm_cases_testutil.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace sparq::testing_cpu {

std::string Name(const Case& c) {
  const char* layout[] = {"", " (columns)", " (bitmask)"};
  return std::string(FormatName(c.format)) + " " + c.pattern + " " +
         std::string(DTypeName(c.dtype)) + layout[static_cast<int>(c.layout)];
}

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    cases.push_back({FormatKind::kDense, "dense", dt});
    cases.push_back({FormatKind::kNM, "2:4", dt});
    cases.push_back({FormatKind::kCsr, "unstructured:0.7", dt});
    cases.push_back({FormatKind::kBsr, "block:4x4:0.5", dt});
    cases.push_back({FormatKind::kVNM, "vnm:8:2:4", dt});
  }
  for (DType dt : {DType::kF32, DType::kBF16}) {
    cases.push_back({FormatKind::kNM, "1:4", dt});
    cases.push_back({FormatKind::kNM, "4:8", dt});
    cases.push_back({FormatKind::kNM, "8:16", dt});
    cases.push_back({FormatKind::kNM, "3:8", dt});  // packed as CSR (3 does not divide 16)
    cases.push_back({FormatKind::kCoo, "unstructured:0.9", dt});
    cases.push_back({FormatKind::kCsr, "unstructured:0.0", dt});
    cases.push_back({FormatKind::kCsr, "unstructured:1.0", dt});
    cases.push_back({FormatKind::kBsr, "block:1x8:0.5", dt});
    cases.push_back({FormatKind::kBsr, "block:8x1:0.5", dt});
    cases.push_back({FormatKind::kBsr, "block:2x3:0.5", dt});
    cases.push_back({FormatKind::kBsr, "block:3x2:0.5", dt});
    cases.push_back({FormatKind::kBsr, "block:16x16:0.7", dt});
    cases.push_back({FormatKind::kVNM, "vnm:2:2:4", dt});
    cases.push_back({FormatKind::kVNM, "vnm:6:1:4", dt});
    // Both CSR layouts at densities on either side of kMaskMinDensity, and the extremes.
    for (const char* pat :
         {"unstructured:0.0", "unstructured:0.5", "unstructured:0.95", "unstructured:1.0"}) {
      cases.push_back({FormatKind::kCsr, pat, dt, CsrLayout::kColumns});
      cases.push_back({FormatKind::kCsr, pat, dt, CsrLayout::kBitmask});
    }
    cases.push_back({FormatKind::kCoo, "unstructured:0.6", dt, CsrLayout::kBitmask});
  }
  for (DType dt : {DType::kF32, DType::kBF16})
    cases.push_back({FormatKind::kBsr, "block:2x2:0.5", dt});
  return cases;
}

Built Build(const Case& c, int64_t m, int64_t k, uint64_t seed) {
  auto p = Pattern::Parse(c.pattern);
  EXPECT_TRUE(p.ok()) << c.pattern;
  std::vector<float> w = testing_cpu::PatternWeights(*p, m, k, seed);
  auto s = Encode(w, m, k, c.format, *p, c.dtype);
  EXPECT_TRUE(s.ok()) << Name(c) << ": " << s.status().ToString();
  Built b;
  b.dense = testing_cpu::Densify(*s);
  auto pw = cpu::Pack(*s, "w", cpu::PackOptions{c.layout, {}});
  EXPECT_TRUE(pw.ok()) << Name(c) << ": " << pw.status().ToString();
  if (pw.ok() && c.layout != CsrLayout::kAuto) {
    EXPECT_EQ(pw->kind(), c.layout == CsrLayout::kBitmask ? cpu::PackedKind::kMask
                                                          : cpu::PackedKind::kRowGroups)
        << Name(c);
  }
  b.packed = std::move(pw).value();
  return b;
}

// Tolerance: the kernels sum k products in f32 in some order; each rounding is at most eps/2
// relative to a partial sum bounded by sum|w x|, so |error| <= k * eps * sum|w x| (+ a few eps for
// bias, activation and residual, whose slopes are <= 1.13). Values are exact in both (bf16 / f16
// are widened exactly), so that bound, with a factor 2 margin, is the tolerance.
void ExpectClose(const std::vector<double>& want, const std::vector<double>& abs_sum,
                 const float* y, int64_t n, int64_t m, int64_t ldy, int64_t k,
                 const std::string& what) {
  const double eps = std::numeric_limits<float>::epsilon();
  int bad = 0;
  for (int64_t t = 0; t < n && bad < 5; ++t) {
    for (int64_t r = 0; r < m && bad < 5; ++r) {
      const double tol = 2.0 * (k + 4) * eps * abs_sum[t * m + r] + 1e-30;
      const double got = y[t * ldy + r];
      if (!(std::fabs(got - want[t * m + r]) <= tol)) {
        ADD_FAILURE() << what << ": y[" << t << "][" << r << "] = " << got << ", want "
                      << want[t * m + r] << " (tol " << tol << ")";
        ++bad;
      }
    }
  }
}

std::vector<float> RunPlain(const cpu::KernelRow& kern, const Built& b, const std::vector<float>& x,
                            int64_t m, int64_t k, int64_t n, ThreadPool* pool) {
  cpu::SpmmArgs a;
  a.cfg = &Cfg();
  a.x = x.data();
  a.n = n;
  a.ldx = k;
  std::vector<float> y(size_t(n * m), kGuard);
  a.y = y.data();
  a.ldy = m;
  kern.Run(b.packed, a, pool);
  return y;
}

void RunReference(const cpu::KernelRow&, const cpu::PackedWeight& w, const cpu::SpmmArgs& a,
                  ThreadPool* pool) {
  cpu::SpmmReference(w, a, pool);
}

void RunAndCheck(const cpu::KernelRow& kern, const Built& b, int64_t m, int64_t k, int64_t n,
                 const Epilogue& ep, ThreadPool* pool, const std::string& what) {
  const int64_t ldx = k + 3, ldy = m + 2;
  std::vector<float> xbuf = RandomVector(size_t(n * ldx + 1), 7 + n);
  const float* x = xbuf.data() + 1;
  std::vector<float> ybuf(size_t(n * ldy + 2 * 16 + 1), kGuard);
  float* y = ybuf.data() + 17;
  cpu::SpmmArgs a;
  a.cfg = &Cfg();
  a.x = x;
  a.n = n;
  a.ldx = ldx;
  a.y = y;
  a.ldy = ldy;
  a.ep = ep;
  kern.Run(b.packed, a, pool);
  std::vector<double> want, abs_sum;
  testing_cpu::ReferenceForward(b.dense, m, k, x, n, ldx, ep, want, abs_sum);
  ExpectClose(want, abs_sum, y, n, m, ldy, k, what);
  for (int64_t i = 0; i < 17; ++i) ASSERT_EQ(ybuf[i], kGuard) << what << ": write before Y";
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t r = m; r < ldy; ++r)
      ASSERT_EQ(y[t * ldy + r], kGuard) << what << ": write past row";
  }
  for (size_t i = 17 + n * ldy; i < ybuf.size(); ++i)
    ASSERT_EQ(ybuf[i], kGuard) << what << ": write after Y";
}

}  // namespace sparq::testing_cpu
