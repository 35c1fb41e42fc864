// MaskedWeightGrad (sparq/sddmm.h) against a double dot product per kept weight, on every target
// this host runs, for 2:4, 50% and 90% masks, full and empty rows, token counts that do not fill a
// tile; bits equal for 1 and 3 threads; bad input refused.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "sparq/kernel_config.h"
#include "sparq/sddmm.h"
#include "sparq/thread_pool.h"

namespace sparq {
namespace {

struct Case {
  int64_t n, k, m;
  std::vector<float> dy, x;
  std::vector<int64_t> kept;
};

// dY [n, m] and X [n, k] of standard normals, no mask yet.
Case RandomOperands(int64_t n, int64_t k, int64_t m, std::mt19937& rng) {
  Case c{n, k, m, {}, {}, {}};
  std::normal_distribution<float> nd;
  c.dy.resize(static_cast<size_t>(n * m));
  c.x.resize(static_cast<size_t>(n * k));
  for (float& v : c.dy) v = nd(rng);
  for (float& v : c.x) v = nd(rng);
  return c;
}

// mode: "2:4", or a kept fraction; row 1 keeps every weight, row 2 none (where m > 2).
Case MakeCase(int64_t n, int64_t k, int64_t m, const std::string& mode, uint32_t seed) {
  std::mt19937 rng(seed);
  Case c = RandomOperands(n, k, m, rng);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const double keep = mode == "2:4" ? 0.5 : std::stod(mode);
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t g = 0; g < k; g += 4) {
      int kept_here = 0;
      for (int64_t j = g; j < std::min(k, g + 4); ++j) {
        bool on;
        if (r == 1) {
          on = true;
        } else if (r == 2) {
          on = false;
        } else if (mode == "2:4") {
          on = kept_here < 2 && (u(rng) < 0.5 || (j - g) - kept_here >= 2);
        } else {
          on = u(rng) < keep;
        }
        kept_here += on;
        if (on) c.kept.push_back(r * k + j);
      }
    }
  }
  return c;
}

// The double sums, and the bound on f32's error: each of the n products and n - 1 additions
// rounds once (relative 2^-24), so |err| <= n * 2^-24 * sum |dy x| (a generous form of
// the gamma_n bound; the tree in a tile does better).
void Reference(const Case& c, const std::vector<float>& start, std::vector<double>* ref,
               std::vector<double>* bound) {
  ref->assign(c.kept.size(), 0.0);
  bound->assign(c.kept.size(), 0.0);
  for (size_t i = 0; i < c.kept.size(); ++i) {
    const int64_t r = c.kept[i] / c.k, col = c.kept[i] % c.k;
    double s = 0, a = 0;
    for (int64_t t = 0; t < c.n; ++t) {
      const double p = static_cast<double>(c.dy[t * c.m + r]) * c.x[t * c.k + col];
      s += p;
      a += std::abs(p);
    }
    (*ref)[i] = start[i] + s;
    (*bound)[i] = static_cast<double>(c.n + 2) * 0x1p-24 * (a + std::abs(start[i])) + 1e-30;
  }
}

// c against the double reference (from `start`) on every target this host runs, with pool and
// with no pool: within the bound, and the same bits.
void ExpectMatchesOnEveryTarget(const Case& c, const std::vector<float>& start, ThreadPool* pool) {
  const KernelConfig machine = KernelConfig::FromMachine().value();
  std::vector<double> ref, bound;
  Reference(c, start, &ref, &bound);
  for (int64_t t : KernelConfig::SupportedTargets()) {
    SCOPED_TRACE(hwy::TargetName(t));
    const KernelConfig cfg = machine.WithTarget(t);
    std::vector<float> out = start;
    ASSERT_TRUE(cpu::MaskedWeightGrad(c.dy, c.x, c.n, c.k, c.m, c.kept, out, pool, cfg).ok());
    int64_t bad = 0;
    size_t first = 0;
    for (size_t i = 0; i < out.size(); ++i) {
      const bool miss = !(std::abs(out[i] - ref[i]) <= bound[i]);
      if (miss && bad++ == 0) first = i;
    }
    EXPECT_EQ(bad, 0) << "first at kept " << first << ": " << out[first] << " vs " << ref[first];
    std::vector<float> one = start;
    ASSERT_TRUE(cpu::MaskedWeightGrad(c.dy, c.x, c.n, c.k, c.m, c.kept, one, nullptr, cfg).ok());
    EXPECT_EQ(one, out) << "the bits depend on the threads";
  }
}

TEST(SddmmTest, KeptDotProductsMatchDoubleOnEveryTarget) {
  ThreadPool pool(3);
  for (const std::string mode : {"2:4", "0.5", "0.1", "1.0"}) {
    for (const int64_t n : {1, 37, 300}) {
      SCOPED_TRACE(mode + " n=" + std::to_string(n));
      const Case c = MakeCase(n, 200, 24, mode, 7 + static_cast<uint32_t>(n));
      std::vector<float> start(c.kept.size());
      for (size_t i = 0; i < start.size(); ++i) start[i] = 0.25f * static_cast<float>(i % 7);
      ExpectMatchesOnEveryTarget(c, start, &pool);
    }
  }
}

// A shape past the column blocks and several tiles, the case the training step runs (SmolLM2's
// attention output: 576 x 576, 2:4), checked the same way on the machine's target.
TEST(SddmmTest, LayerShapeTwoFour) {
  const KernelConfig cfg = KernelConfig::FromMachine().value();
  ThreadPool pool(2);
  const Case c = MakeCase(512, 576, 96, "2:4", 3);
  const std::vector<float> start(c.kept.size(), 0.0f);
  std::vector<double> ref, bound;
  Reference(c, start, &ref, &bound);
  std::vector<float> out = start;
  ASSERT_TRUE(cpu::MaskedWeightGrad(c.dy, c.x, c.n, c.k, c.m, c.kept, out, &pool, cfg).ok());
  double worst = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_LE(std::abs(out[i] - ref[i]), bound[i]) << i;
    worst = std::max(worst, std::abs(out[i] - ref[i]) / bound[i]);
  }
  std::printf("worst error / bound: %.3g\n", worst);
}

// Exact N:M masks (every row keeps nk of every mk columns) on shapes whose rows and columns fill
// the targets' vectors: the windowed form (sddmm.cc: lanes are rows, a table lookup per kept
// weight) wherever each window of L columns holds the same count; the dot-product form elsewhere
// (1:8 on 4 lanes, one row off the pattern). Checked as above, on every target, 1 and 3 threads.
Case MakeNmCase(int64_t n, int64_t k, int64_t m, int nk, int mk, bool one_row_off, uint32_t seed) {
  std::mt19937 rng(seed);
  Case c = RandomOperands(n, k, m, rng);
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t g = 0; g < k; g += mk) {
      std::vector<int> pos(static_cast<size_t>(mk));
      for (int j = 0; j < mk; ++j) pos[static_cast<size_t>(j)] = j;
      std::shuffle(pos.begin(), pos.end(), rng);
      const int keep = one_row_off && r == m / 2 && g == 0 ? nk + 1 : nk;
      std::sort(pos.begin(), pos.begin() + keep);
      for (int j = 0; j < keep; ++j) c.kept.push_back(r * k + g + pos[static_cast<size_t>(j)]);
    }
  }
  return c;
}

TEST(SddmmTest, NmMasksMatchDoubleOnEveryTarget) {
  ThreadPool pool(3);
  struct Nm {
    int n, m;
    bool off;
  };
  for (const Nm p : {Nm{2, 4, false}, Nm{1, 4, false}, Nm{4, 8, false}, Nm{1, 2, false},
                     Nm{1, 8, false}, Nm{2, 4, true}}) {
    for (const int64_t n : {1, 37, 300}) {
      for (const auto& [k, m] : {std::pair<int64_t, int64_t>{64, 32}, {192, 48}}) {
        SCOPED_TRACE(std::to_string(p.n) + ":" + std::to_string(p.m) + (p.off ? " one row off" : "") +
                     " n=" + std::to_string(n) + " k=" + std::to_string(k));
        const Case c = MakeNmCase(n, k, m, p.n, p.m, p.off, 11 + static_cast<uint32_t>(n + k));
        std::vector<float> start(c.kept.size());
        for (size_t i = 0; i < start.size(); ++i) start[i] = 0.5f * static_cast<float>(i % 5);
        ExpectMatchesOnEveryTarget(c, start, &pool);
      }
    }
  }
}

TEST(SddmmTest, BadInputIsRefused) {
  const KernelConfig cfg = KernelConfig::FromMachine().value();
  std::vector<float> dy(4 * 3), x(4 * 5), out(2);
  auto msg = [&](std::vector<int64_t> kept, std::span<const float> d) {
    std::vector<float> o(kept.size());
    const Status s = cpu::MaskedWeightGrad(d, x, 4, 5, 3, kept, o, nullptr, cfg);
    return s.ok() ? std::string("ok") : s.message();
  };
  EXPECT_NE(msg({3, 2}, dy).find("kept[1] = 2 is not above"), std::string::npos);
  EXPECT_NE(msg({0, 15}, dy).find("kept[1] = 15 is outside W[3, 5]"), std::string::npos);
  EXPECT_NE(msg({-1}, dy).find("is outside"), std::string::npos);
  EXPECT_NE(msg({1}, std::span<const float>(dy).first(11)).find("dy has 11 values"),
            std::string::npos);
  EXPECT_EQ(msg({}, dy), "ok");
  // dw_kept shorter than kept.
  const std::vector<int64_t> two = {1, 2};
  const Status s =
      cpu::MaskedWeightGrad(dy, x, 4, 5, 3, two, std::span<float>(out).first(1), nullptr, cfg);
  EXPECT_NE(s.message().find("dw_kept has 1 values"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace sparq
