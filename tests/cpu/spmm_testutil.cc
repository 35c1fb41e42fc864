#include "tests/cpu/spmm_testutil.h"

#include <hwy/targets.h>

#include <cmath>
#include <random>

#include "sparq/tensor.h"

namespace sparq::testing_cpu {

std::vector<float> RandomVector(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& e : v) e = u(rng);
  return v;
}

std::vector<float> PatternWeights(const Pattern& p, int64_t rows, int64_t cols, uint64_t seed) {
  std::vector<float> w = RandomVector(size_t(rows * cols), seed);
  if (p.kind != PatternKind::kDense) {
    Status st = MagnitudePrune(p, w, rows, cols, "test weights");
    if (!st.ok()) std::abort();
  }
  return w;
}

std::vector<float> Densify(const SparseMatrix& s) {
  Tensor t = ToDense(s);
  const float* d = t.data_as<float>();
  return std::vector<float>(d, d + t.numel());
}

void ReferenceForward(const std::vector<float>& w, int64_t m, int64_t k, const float* x,
                      int64_t n, int64_t ldx, const Epilogue& ep, std::vector<double>& y,
                      std::vector<double>& abs_sum) {
  y.assign(size_t(n * m), 0.0);
  abs_sum.assign(size_t(n * m), 0.0);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t r = 0; r < m; ++r) {
      double s = 0, a = 0;
      for (int64_t c = 0; c < k; ++c) {
        s += double(w[r * k + c]) * x[t * ldx + c];
        a += std::fabs(double(w[r * k + c]) * x[t * ldx + c]);
      }
      if (ep.bias) s += ep.bias[r], a += std::fabs(ep.bias[r]);
      switch (ep.act) {
        case Activation::kNone: break;
        case Activation::kRelu: s = s > 0 ? s : 0; break;
        case Activation::kGelu: s = 0.5 * s * (1 + std::erf(s / std::sqrt(2.0))); break;
        case Activation::kSilu: s = s / (1 + std::exp(-s)); break;
      }
      if (ep.residual) {
        const double res = ep.residual[t * (ep.ld_residual ? ep.ld_residual : m) + r];
        s += res;
        a += std::fabs(res);
      }
      y[t * m + r] = s;
      abs_sum[t * m + r] = a;
    }
  }
}

namespace {
KernelConfig& CfgSlot() {
  static KernelConfig cfg = KernelConfig::FromMachine().value();
  return cfg;
}
}  // namespace

const KernelConfig& Cfg() { return CfgSlot(); }
KernelConfig& MutableCfg() { return CfgSlot(); }

int ForEachTarget(const std::function<void(const std::string&)>& fn) {
  const KernelConfig saved = CfgSlot();
  int ran = 0;
  for (int64_t t : KernelConfig::SupportedTargets()) {
    CfgSlot() = saved.WithTarget(t);
    // hwy::SupportedTargets() follows too (what FromMachine and Highway's own checks read).
    hwy::SetSupportedTargetsForTest(t);
    fn(hwy::TargetName(t));
    ++ran;
  }
  hwy::SetSupportedTargetsForTest(0);
  CfgSlot() = saved;
  return ran;
}

std::vector<float> RunRow(const cpu::KernelRow& kern, const cpu::PackedWeight& w,
                          const std::vector<float>& x, int64_t m, int64_t k, int64_t n,
                          ThreadPool* pool) {
  cpu::SpmmArgs a;
  a.cfg = &Cfg();
  a.x = x.data();
  a.n = n;
  a.ldx = k;
  std::vector<float> y(size_t(n * m), -12345.0f);
  a.y = y.data();
  a.ldy = m;
  kern.Run(w, a, pool);
  return y;
}

const cpu::KernelRow* RowNamed(const std::string& name) {
  for (const auto& kern : cpu::KernelTable()) {
    if (name == kern.name) return &kern;
  }
  return nullptr;
}

}  // namespace sparq::testing_cpu
