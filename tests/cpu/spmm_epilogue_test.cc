// The fused epilogues (bias, activation, residual) of every kernel row against the double
// reference, on every compiled target.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <set>

#include "src/cpu/kernel_entry.h"
#include "src/cpu/spmm.h"
#include "tests/cpu/spmm_cases_testutil.h"
#include "tests/cpu/spmm_testutil.h"

namespace sparq {
namespace {

using testing_cpu::Build;
using testing_cpu::Built;
using testing_cpu::Case;
using testing_cpu::Cfg;
using testing_cpu::ForEachTarget;
using testing_cpu::Name;
using testing_cpu::RandomVector;
using testing_cpu::RunAndCheck;

TEST(SpmmTest, EpilogueBiasActivationResidual) {
  const int64_t m = 19, k = 40;
  const std::vector<float> bias = RandomVector(m, 3);
  const std::vector<float> residual = RandomVector(70 * (m + 5), 4);
  for (const Case& c :
       {Case{FormatKind::kNM, "2:4", DType::kF32}, Case{FormatKind::kDense, "dense", DType::kF32},
        Case{FormatKind::kDense, "dense", DType::kBF16},
        Case{FormatKind::kCsr, "unstructured:0.8", DType::kBF16},
        Case{FormatKind::kCsr, "unstructured:0.5", DType::kF32, CsrLayout::kBitmask},
        Case{FormatKind::kBsr, "block:2x2:0.5", DType::kF32}}) {
    const Built b = Build(c, m, k, 9);
    int calls = 0;
    for (Activation act :
         {Activation::kNone, Activation::kRelu, Activation::kGelu, Activation::kSilu}) {
      for (bool with_bias : {false, true}) {
        for (bool with_res : {false, true}) {
          Epilogue ep;
          ep.act = act;
          ep.bias = with_bias ? bias.data() : nullptr;
          ep.residual = with_res ? residual.data() : nullptr;
          ep.ld_residual = with_res ? m + 5 : 0;
          for (const auto& kern : cpu::KernelTable()) {
            if (!cpu::Declines(kern, b.packed, 0, Cfg(), true).empty()) continue;
            for (int64_t n : {1, 5, 70}) {
              ++calls;
              RunAndCheck(kern, b, m, k, n, ep, nullptr,
                          Name(c) + " " + kern.name + " act=" + std::to_string(int(act)) +
                              " bias=" + std::to_string(with_bias) +
                              " res=" + std::to_string(with_res));
            }
          }
        }
      }
    }
    EXPECT_GT(calls, 0) << Name(c) << ": no kernel ran";
  }
}

// The kernels' vector epilogue against double-precision math on every target: SiLU within 4 ulp
// (Highway's Exp is 1 ulp; the sigmoid's divide and the product round twice more) or within
// FLT_MIN where the result underflows, including the arguments where exp(-v) overflows; ReLU,
// bias and residual exactly as the scalar reference; NaN and infinities as v / (1 + exp(-v))
// gives them; and an element's bits the same whether it sits in a full vector or in the tail.
TEST(SpmmTest, VectorEpilogueMatchesDoubleOnEveryTarget) {
  std::vector<float> v = {0.0f,   -0.0f,   1e-30f, -1e-30f, 1e-7f, -1e-7f, 0.5f,   -0.5f,
                          1.0f,   -1.0f,   3.0f,   -3.0f,   15.0f, -15.0f, 80.0f,  -80.0f,
                          87.0f,  -87.0f,  88.5f,  -88.5f,  89.0f, -89.0f, 103.0f, -103.0f,
                          105.0f, -105.0f, 200.0f, -200.0f, 3e38f, -3e38f};
  for (int i = 0; i < 301; ++i) v.push_back(-30.0f + 0.2f * static_cast<float>(i) + 1e-3f);
  const auto m = static_cast<int64_t>(v.size());
  const std::vector<float> bias = RandomVector(m, 5);
  const std::vector<float> residual = RandomVector(m, 6);
  const int targets = ForEachTarget([&](const std::string& target) {
    Epilogue silu;
    silu.act = Activation::kSilu;
    std::vector<float> y = v;
    cpu::ApplyEpilogueRow(Cfg(), y.data(), 0, 0, m, m, silu);
    for (int64_t i = 0; i < m; ++i) {
      const double x = v[i];
      const double want = x / (1.0 + std::exp(-x));
      const double ulp = std::nextafter(static_cast<float>(std::fabs(want)), INFINITY) -
                         static_cast<float>(std::fabs(want));
      const double err = std::fabs(y[i] - want);
      EXPECT_TRUE(err <= 4 * ulp || err <= std::numeric_limits<float>::min())
          << target << " silu(" << v[i] << ") = " << y[i] << ", want " << want;
    }
    // Specials: NaN stays NaN, silu(+inf) = +inf, silu(-inf) = -inf / inf = NaN (as the reference).
    std::vector<float> sp = {std::numeric_limits<float>::quiet_NaN(), INFINITY, -INFINITY};
    cpu::ApplyEpilogueRow(Cfg(), sp.data(), 0, 0, 3, 3, silu);
    EXPECT_TRUE(std::isnan(sp[0])) << target;
    EXPECT_EQ(sp[1], INFINITY) << target;
    EXPECT_TRUE(std::isnan(sp[2])) << target;
    // Element by element (every element in a tail) gives the whole row's bits.
    for (Activation act :
         {Activation::kNone, Activation::kRelu, Activation::kGelu, Activation::kSilu}) {
      Epilogue ep;
      ep.act = act;
      ep.bias = bias.data();
      ep.residual = residual.data();
      std::vector<float> whole = v, single = v;
      cpu::ApplyEpilogueRow(Cfg(), whole.data(), 0, 0, m, m, ep);
      for (int64_t r = 0; r < m; ++r)
        cpu::ApplyEpilogueRow(Cfg(), single.data(), 0, r, r + 1, m, ep);
      EXPECT_EQ(std::memcmp(whole.data(), single.data(), sizeof(float) * m), 0)
          << target << " act " << static_cast<int>(act);
      if (act == Activation::kSilu) continue;
      for (int64_t r = 0; r < m; ++r) {  // no transcendental: the scalar reference's exact bits
        const float want = cpu::ApplyEpilogue(v[r], 0, r, m, ep);
        EXPECT_TRUE(std::memcmp(&whole[r], &want, sizeof(float)) == 0 ||
                    (std::isnan(whole[r]) && std::isnan(want)))
            << target << " act " << static_cast<int>(act) << " r " << r << ": " << whole[r]
            << " vs " << want;
      }
    }
  });
  EXPECT_GE(targets, 2);
}

}  // namespace
}  // namespace sparq
