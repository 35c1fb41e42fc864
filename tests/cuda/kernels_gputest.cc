// The CUDA kernels (src/cuda/kernels.h) against a CPU reference of the expanded weights, summed in
// double. Label gpu (scripts/gpu_check.sh runs them); on a machine without a CUDA device every
// test that needs one skips, saying so.
//
// Tolerances. Products of two bf16 values are exact in f32 (8 + 8 significand bits), so the only
// error is the f32 summation of the kept terms: at most p additions on any path (p = k/2 kept
// terms + 5 butterfly steps of the warp reduction), |err| <= p * 2^-24 * sum |w x| (first-order
// gamma_p). Tensor-core accumulation is not IEEE round-to-nearest (addends are aligned to the
// largest and truncated), so the mma.sp kernel is allowed 4 ulp per addition: p * 2^-22 * sum|w x|.
// Small-integer inputs make every partial sum an exact integer below 2^24: those compare exactly.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "sparq/dtype.h"
#include "sparq/format.h"
#include "src/cuda/kernels.h"
#include "src/cuda/mma_sp_pack.h"

namespace sparq::cuda {
namespace {

#define SKIP_WITHOUT_DEVICE()                                                          \
  do {                                                                                 \
    if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA device: " << DeviceDescription(); \
  } while (0)

constexpr int kGuard = 64;  // floats after Y that no kernel may write

// A random 2:4 W [rows, cols] with bf16 values (random or small integers), as dense f32.
std::vector<float> Random24(int64_t rows, int64_t cols, bool integers, std::mt19937& rng) {
  std::uniform_real_distribution<float> val(-1.0f, 1.0f);
  std::uniform_int_distribution<int> ival(-3, 3), pos(0, 3);
  std::vector<float> w(static_cast<size_t>(rows * cols), 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < cols / 4; ++g) {
      int a = pos(rng), b = pos(rng);
      while (b == a) b = pos(rng);
      for (int at : {a, b}) {
        w[r * cols + g * 4 + at] =
            integers ? static_cast<float>(ival(rng)) : BF16ToF32(F32ToBF16(val(rng)));
      }
    }
  }
  return w;
}

std::vector<uint16_t> RandomX(int64_t n, int64_t k, bool integers, std::mt19937& rng) {
  std::uniform_real_distribution<float> val(-1.0f, 1.0f);
  std::uniform_int_distribution<int> ival(-3, 3);
  std::vector<uint16_t> x(static_cast<size_t>(n * k));
  for (auto& v : x) v = F32ToBF16(integers ? static_cast<float>(ival(rng)) : val(rng));
  return x;
}

struct Reference {
  std::vector<double> y;    // [n, m]
  std::vector<double> mag;  // [n, m]: sum |w x|
};

Reference Dense(const std::vector<float>& w, const std::vector<uint16_t>& x, int64_t m,
                int64_t k, int64_t n) {
  Reference r{std::vector<double>(n * m), std::vector<double>(n * m)};
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = 0; i < m; ++i) {
      double s = 0, a = 0;
      for (int64_t j = 0; j < k; ++j) {
        const double p = static_cast<double>(w[i * k + j]) * BF16ToF32(x[t * k + j]);
        s += p;
        a += std::fabs(p);
      }
      r.y[t * m + i] = s;
      r.mag[t * m + i] = a;
    }
  }
  return r;
}

// Runs `launch(x_dev, y_dev)` and returns Y [n, m], checking the guard floats after it.
template <typename F>
std::vector<float> RunKernel(const std::vector<uint16_t>& x, int64_t n, int64_t m, F launch) {
  auto xd = DeviceBuffer::Upload(x.data(), x.size() * 2, "x");
  EXPECT_TRUE(xd.ok()) << xd.status().ToString();
  std::vector<float> y(n * m + kGuard, std::numeric_limits<float>::quiet_NaN());
  auto yd = DeviceBuffer::Upload(y.data(), y.size() * 4, "y");
  EXPECT_TRUE(yd.ok()) << yd.status().ToString();
  if (!xd.ok() || !yd.ok()) return {};
  const Status st = launch(static_cast<const uint16_t*>(xd->get()), static_cast<float*>(yd->get()));
  EXPECT_TRUE(st.ok()) << st.ToString();
  const Status cp = yd->CopyTo(y.data(), y.size() * 4);
  EXPECT_TRUE(cp.ok()) << cp.ToString();
  for (int i = 0; i < kGuard; ++i) EXPECT_TRUE(std::isnan(y[n * m + i])) << "guard " << i;
  y.resize(n * m);
  return y;
}

void ExpectClose(const std::vector<float>& got, const Reference& ref, int64_t k, double ulp_per_add,
                 bool exact, const std::string& what) {
  ASSERT_EQ(got.size(), ref.y.size()) << what;
  const double p = static_cast<double>(k) / 2 + 5;
  for (size_t i = 0; i < got.size(); ++i) {
    if (exact) {
      ASSERT_EQ(static_cast<double>(got[i]), ref.y[i]) << what << " at " << i;
    } else {
      const double tol = p * ulp_per_add * std::ldexp(1.0, -24) * ref.mag[i] + 1e-30;
      ASSERT_NEAR(got[i], ref.y[i], tol) << what << " at " << i;
    }
  }
}

TEST(CudaDevice, RunsTheCubinOfItsArch) {
  SKIP_WITHOUT_DEVICE();
  std::printf("device: %s\n", DeviceDescription().c_str());
  auto arch = DeviceCodeArch();
  ASSERT_TRUE(arch.ok()) << arch.status().ToString();
  std::printf("device code: %d\n", *arch);
  // The build carries sm_80 and sm_90a cubins: a 9.0 device runs the arch-specific one.
  EXPECT_TRUE(*arch == 800 || *arch == 901) << *arch;
}

void CheckGemv(int64_t m, int64_t k, int64_t n, bool integers, uint32_t seed) {
  const std::string what = "gemv_nm24_bf16 m=" + std::to_string(m) + " k=" + std::to_string(k) +
                           " n=" + std::to_string(n) + " seed " + std::to_string(seed);
  std::mt19937 rng(seed);
  const std::vector<float> w = Random24(m, k, integers, rng);
  const std::vector<uint16_t> x = RandomX(n, k, integers, rng);
  auto nm = NmMatrix::FromDense(w, m, k, 2, 4, DType::kBF16);
  ASSERT_TRUE(nm.ok()) << nm.status().ToString();
  auto dev = Nm24Bf16Device::Upload(*nm, "w");
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  const std::vector<float> y = RunKernel(x, n, m, [&](const uint16_t* xd, float* yd) {
    return GemvNm24Bf16(*dev, xd, n, yd);
  });
  ExpectClose(y, Dense(w, x, m, k, n), k, 1.0, integers, what);
}

TEST(GemvNm24Bf16, MatchesDenseReference) {
  SKIP_WITHOUT_DEVICE();
  // k below, at and past one warp's 512-column sweep; m not a multiple of the 8 rows per block.
  for (int64_t n : {1, 2, 3, 8, 15, 16}) {
    CheckGemv(16, 16, n, false, 1);
    CheckGemv(40, 528, n, false, 2);
    CheckGemv(257, 4096, n, false, 3);
  }
}

TEST(GemvNm24Bf16, SmallIntegersExact) {
  SKIP_WITHOUT_DEVICE();
  for (int64_t n : {1, 5, 16}) CheckGemv(96, 1024, n, true, 4);
}

TEST(GemvNm24Bf16, BadShapesAreErrors) {
  std::vector<float> w(16 * 24, 0.0f);
  auto nm = NmMatrix::FromDense(w, 16, 24, 2, 4, DType::kBF16);
  ASSERT_TRUE(nm.ok());
  auto dev = Nm24Bf16Device::Upload(*nm, "w24");
  ASSERT_FALSE(dev.ok());
  EXPECT_NE(dev.status().ToString().find("multiple of 16, not 24"), std::string::npos);
  SKIP_WITHOUT_DEVICE();
  auto nm32 = NmMatrix::FromDense(std::vector<float>(16 * 32, 0.0f), 16, 32, 2, 4, DType::kBF16);
  ASSERT_TRUE(nm32.ok());
  auto ok = Nm24Bf16Device::Upload(*nm32, "w");
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  const Status st = GemvNm24Bf16(*ok, nullptr, 17, nullptr);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.ToString().find("17 tokens"), std::string::npos) << st.ToString();
}

void CheckMmaSp(int64_t m, int64_t k, int64_t n, bool integers, uint32_t seed) {
  const std::string what = "spmm_nm24_bf16_mmasp m=" + std::to_string(m) + " k=" +
                           std::to_string(k) + " n=" + std::to_string(n) + " seed " +
                           std::to_string(seed);
  std::mt19937 rng(seed);
  const std::vector<float> w = Random24(m, k, integers, rng);
  const std::vector<uint16_t> x = RandomX(n, k, integers, rng);
  auto packed = PackMmaSpFromDense(w, m, k, MmaSpShape::kM16N8K32, DType::kBF16, "w");
  ASSERT_TRUE(packed.ok()) << packed.status().ToString();
  auto dev = MmaSpDevice::Upload(*packed, "w");
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  const std::vector<float> y = RunKernel(x, n, m, [&](const uint16_t* xd, float* yd) {
    return SpmmNm24Bf16MmaSp(*dev, xd, n, yd);
  });
  ExpectClose(y, Dense(w, x, m, k, n), k, 4.0, integers, what);
}

TEST(SpmmNm24Bf16MmaSp, MatchesDenseReference) {
  SKIP_WITHOUT_DEVICE();
  // Partial token tiles (n % 8), one and several k tiles, m past the 4 row tiles of a block.
  for (int64_t n : {1, 7, 8, 9, 64}) {
    CheckMmaSp(16, 32, n, false, 5);
    CheckMmaSp(80, 96, n, false, 6);
    CheckMmaSp(256, 2048, n, false, 7);
  }
}

TEST(SpmmNm24Bf16MmaSp, SmallIntegersExact) {
  SKIP_WITHOUT_DEVICE();
  for (int64_t n : {3, 16, 40}) CheckMmaSp(64, 512, n, true, 8);
}

// The packed tile through mma.sp equals its expansion through dense mma.sync, exactly (small
// integers): the hardware reads PackMmaSp's registers and metadata as the layout tests assume.
TEST(SpmmNm24Bf16MmaSp, PackedTileMultipliesLikeDenseMmaOfItsExpansion) {
  SKIP_WITHOUT_DEVICE();
  for (uint32_t seed : {9u, 10u, 11u}) {
    std::mt19937 rng(seed);
    const std::vector<float> w = Random24(16, 32, true, rng);
    const std::vector<uint16_t> x = RandomX(8, 32, true, rng);
    std::vector<uint16_t> wb(w.size());
    for (size_t i = 0; i < w.size(); ++i) wb[i] = F32ToBF16(w[i]);
    auto wd = DeviceBuffer::Upload(wb.data(), wb.size() * 2, "w tile");
    ASSERT_TRUE(wd.ok());
    const std::vector<float> dense = RunKernel(x, 8, 16, [&](const uint16_t* xd, float* yd) {
      return DenseMmaTileBf16(static_cast<const uint16_t*>(wd->get()), xd, yd);
    });
    auto packed = PackMmaSpFromDense(w, 16, 32, MmaSpShape::kM16N8K32, DType::kBF16, "w");
    ASSERT_TRUE(packed.ok());
    auto dev = MmaSpDevice::Upload(*packed, "w");
    ASSERT_TRUE(dev.ok());
    const std::vector<float> sparse = RunKernel(x, 8, 16, [&](const uint16_t* xd, float* yd) {
      return SpmmNm24Bf16MmaSp(*dev, xd, 8, yd);
    });
    const Reference ref = Dense(w, x, 16, 32, 8);
    ExpectClose(dense, ref, 32, 0, true, "dense mma.sync, seed " + std::to_string(seed));
    ASSERT_EQ(sparse, dense) << "seed " << seed;
  }
}

TEST(SpmmNm24Bf16MmaSp, OtherPackingsAreErrors) {
  std::vector<float> w(16 * 32, 0.0f);
  auto k16 = PackMmaSpFromDense(w, 16, 32, MmaSpShape::kM16N8K16, DType::kBF16, "w");
  ASSERT_TRUE(k16.ok());
  auto dev = MmaSpDevice::Upload(*k16, "w");
  ASSERT_FALSE(dev.ok());
  EXPECT_NE(dev.status().ToString().find("m16n8k32 bf16 packing, not m16n8k16 bf16"),
            std::string::npos)
      << dev.status().ToString();
}

}  // namespace
}  // namespace sparq::cuda
