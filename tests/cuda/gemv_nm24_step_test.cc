// gemv_nm24_bf16_warp's arithmetic on the CPU: GemvNm24Step (src/cuda/gemv_nm24_step.h) is the
// code the kernel runs per lane; here 32 emulated lanes walk a row the way the kernel's loop does
// (lane l takes steps l, l + 32, ...; words loaded from sparq's stored values and metadata bytes
// in little-endian order, as a uint4 / u16 load reads them) and their sums are added as the warp's
// butterfly does. Small-integer inputs keep every partial sum exact: the result must equal the
// dense product exactly. What this cannot check (the loads themselves, the launch) is the GPU
// test's part (kernels_gputest.cc).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "sparq/dtype.h"
#include "sparq/format.h"
#include "src/cuda/gemv_nm24_step.h"

namespace sparq::cuda {
namespace {

uint32_t LoadWord(const uint8_t* p) {  // little-endian, as the GPU loads it
  return p[0] | p[1] << 8 | p[2] << 16 | static_cast<uint32_t>(p[3]) << 24;
}

// y[t][row] for all rows, the kernel's way: N tokens, W in sparq's layout, x bf16 [N, cols].
template <int N>
std::vector<float> EmulateWarps(const NmMatrix& w, const std::vector<uint16_t>& x) {
  const int64_t rows = w.rows, cols = w.cols, steps = cols / kGemvNm24StepCols;
  const auto* values = w.values.data_as<uint8_t>();  // bf16 [rows, cols / 2] as bytes
  const auto* meta = w.meta.data_as<uint8_t>();      // u8 [rows, cols / 8]
  auto load_x4 = [&](int t, int64_t c, uint32_t* lo, uint32_t* hi) {
    const auto* p = reinterpret_cast<const uint8_t*>(x.data() + t * cols + c);
    *lo = LoadWord(p);
    *hi = LoadWord(p + 4);
  };
  std::vector<float> y(N * rows);
  for (int64_t row = 0; row < rows; ++row) {
    float lane_acc[32][N] = {};
    for (int lane = 0; lane < 32; ++lane) {
      for (int64_t s = lane; s < steps; s += 32) {
        const uint8_t* v = values + (row * steps + s) * 16;  // the uint4 of step s
        const uint32_t words[4] = {LoadWord(v), LoadWord(v + 4), LoadWord(v + 8), LoadWord(v + 12)};
        const uint8_t* e = meta + (row * steps + s) * 2;   // the u16 of step s
        GemvNm24Step<N>(words, e[0] | e[1] << 8, s * kGemvNm24StepCols, load_x4, lane_acc[lane]);
      }
    }
    for (int off = 16; off > 0; off >>= 1) {  // __shfl_xor_sync butterfly
      float next[32][N];
      for (int lane = 0; lane < 32; ++lane) {
        for (int t = 0; t < N; ++t) next[lane][t] = lane_acc[lane][t] + lane_acc[lane ^ off][t];
      }
      std::memcpy(lane_acc, next, sizeof(next));
    }
    for (int t = 0; t < N; ++t) y[t * rows + row] = lane_acc[0][t];
  }
  return y;
}

template <int N>
void Check(int64_t rows, int64_t cols, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "N=" << N << " " << rows << "x" << cols << " seed " << seed);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> val(-3, 3), pos(0, 3);
  std::vector<float> dense(rows * cols, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < cols / 4; ++g) {
      int a = pos(rng), b = pos(rng);
      while (b == a) b = pos(rng);
      dense[r * cols + g * 4 + a] = static_cast<float>(val(rng));
      dense[r * cols + g * 4 + b] = static_cast<float>(val(rng));
    }
  }
  std::vector<uint16_t> x(N * cols);
  for (auto& v : x) v = F32ToBF16(static_cast<float>(val(rng)));
  auto nm = NmMatrix::FromDense(dense, rows, cols, 2, 4, DType::kBF16);
  ASSERT_TRUE(nm.ok()) << nm.status().ToString();
  const std::vector<float> y = EmulateWarps<N>(*nm, x);
  for (int t = 0; t < N; ++t) {
    for (int64_t r = 0; r < rows; ++r) {
      double ref = 0;
      for (int64_t c = 0; c < cols; ++c) ref += dense[r * cols + c] * BF16ToF32(x[t * cols + c]);
      ASSERT_EQ(y[t * rows + r], ref) << "token " << t << " row " << r;
    }
  }
}

TEST(GemvNm24Bf16Step, EmulatedWarpMatchesDenseExactly) {
  // cols: one step, below one warp sweep (512), past it, and not a multiple of it.
  Check<1>(3, 16, 1);
  Check<1>(5, 1040, 2);
  Check<4>(4, 512, 3);
  Check<16>(2, 2064, 4);
}

}  // namespace
}  // namespace sparq::cuda
