// spmm_nm24_bf16_mmasp's per-lane arithmetic on the CPU: for every warp of a small GEMM, 32
// emulated lanes gather their operands exactly as the kernel does (the packing's A registers,
// metadata word MmaSpMetaWord, B words MmaSpBWord of X) and store their D registers where the
// kernel does (MmaDRow / MmaDCol); between the two, a model of mma.sp.m16n8k32 written from the
// PTX ISA's fragment tables (A and metadata: 9.7.14.6.2.2; B: four registers of two bf16, k =
// 2 t + (i & 1) + 8 (i >> 1), n = g; D: rows g and g + 8, columns 2 t + {0, 1}) forms the product.
// Small integers: the result must equal the dense product exactly. What this cannot check (that
// the hardware agrees with the model) is the GPU test's part.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <tuple>
#include <vector>

#include "sparq/dtype.h"
#include "src/cuda/mma_frag.h"
#include "src/cuda/mma_sp_pack.h"

namespace sparq::cuda {
namespace {

struct Lane {
  uint32_t a[4], b[4], e;
  float d[4];
};

// D (16 x 8) += A (16 x 32, from the lanes' A registers and metadata) * B (32 x 8), per the ISA.
void MmaSpModel(Lane (&lanes)[32]) {
  float A[16][32] = {}, B[32][8] = {}, D[16][8] = {};
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane >> 2, t = lane & 3;
    for (int i = 0; i < 8; ++i) {
      const int row = g + ((i / 2) % 2 == 1 ? 8 : 0), firstcol = 4 * t + (i >= 4 ? 16 : 0);
      const uint32_t reg = lanes[lane].a[i / 2];
      const float v = BF16ToF32(static_cast<uint16_t>(i % 2 ? reg >> 16 : reg & 0xFFFF));
      // Selector 0: the metadata of columns [16 s, 16 s + 16) is lane (g, s)'s, s = 0, 1.
      const uint32_t word = lanes[4 * g + firstcol / 16].e;
      const uint32_t half = row >= 8 ? word >> 16 : word & 0xFFFF;
      const uint32_t nibble = half >> (4 * ((firstcol % 16) / 4)) & 0xF;
      A[row][firstcol + (i % 2 ? nibble >> 2 : nibble & 3)] = v;
    }
    for (int i = 0; i < 8; ++i) {
      const uint32_t reg = lanes[lane].b[i / 2];
      B[2 * t + (i & 1) + 8 * (i >> 1)][g] =
          BF16ToF32(static_cast<uint16_t>(i % 2 ? reg >> 16 : reg & 0xFFFF));
    }
  }
  for (int r = 0; r < 16; ++r) {
    for (int c = 0; c < 8; ++c) {
      for (int k = 0; k < 32; ++k) D[r][c] += A[r][k] * B[k][c];
    }
  }
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane >> 2, t = lane & 3;
    lanes[lane].d[0] += D[g][2 * t];
    lanes[lane].d[1] += D[g][2 * t + 1];
    lanes[lane].d[2] += D[g + 8][2 * t];
    lanes[lane].d[3] += D[g + 8][2 * t + 1];
  }
}

// The kernel's loop for every (row tile, token tile), lanes emulated; y [n, m].
std::vector<float> EmulateKernel(const MmaSpPacked& p, const std::vector<uint16_t>& x, int64_t n) {
  std::vector<float> y(n * p.rows, -1.0f);
  for (int64_t tm = 0; tm < p.tiles_m; ++tm) {
    for (int64_t tn = 0; tn < (n + 7) / 8; ++tn) {
      Lane lanes[32] = {};
      for (int64_t tk = 0; tk < p.tiles_k; ++tk) {
        const int64_t tile = tm * p.tiles_k + tk;
        for (int lane = 0; lane < 32; ++lane) {
          const int g = lane >> 2, t = lane & 3;
          const int64_t tok = tn * 8 + g;
          for (int r = 0; r < 4; ++r) {
            lanes[lane].a[r] = p.a[(tile * 32 + lane) * 4 + r];
            const uint16_t* pair = x.data() + (tok < n ? tok : 0) * p.cols + 2 * MmaSpBWord(tk, r, t);
            lanes[lane].b[r] = tok < n ? (pair[0] | static_cast<uint32_t>(pair[1]) << 16) : 0u;
          }
          lanes[lane].e = p.meta[MmaSpMetaWord(tile, g, t)];
        }
        MmaSpModel(lanes);
      }
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane >> 2, t = lane & 3;
        for (int i = 0; i < 4; ++i) {
          const int64_t row = tm * 16 + MmaDRow(i, g), token = tn * 8 + MmaDCol(i, t);
          if (token < n) y[token * p.rows + row] = lanes[lane].d[i];
        }
      }
    }
  }
  return y;
}

TEST(SpmmNm24Bf16MmaSpFragments, EmulatedWarpsMatchDenseExactly) {
  for (auto [m, k, n] : {std::tuple<int64_t, int64_t, int64_t>{16, 32, 8}, {48, 96, 5},
                         {32, 64, 19}}) {
    SCOPED_TRACE(testing::Message() << m << "x" << k << ", " << n << " tokens");
    std::mt19937 rng(static_cast<uint32_t>(m * 131 + n));
    std::uniform_int_distribution<int> val(-3, 3), pos(0, 3);
    std::vector<float> w(m * k, 0.0f);
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t g = 0; g < k / 4; ++g) {
        int a = pos(rng), b = pos(rng);
        while (b == a) b = pos(rng);
        w[r * k + g * 4 + a] = static_cast<float>(val(rng));
        w[r * k + g * 4 + b] = static_cast<float>(val(rng));
      }
    }
    std::vector<uint16_t> x(n * k);
    for (auto& v : x) v = F32ToBF16(static_cast<float>(val(rng)));
    auto p = PackMmaSpFromDense(w, m, k, MmaSpShape::kM16N8K32, DType::kBF16, "w");
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    const std::vector<float> y = EmulateKernel(*p, x, n);
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t r = 0; r < m; ++r) {
        double ref = 0;
        for (int64_t c = 0; c < k; ++c) ref += w[r * k + c] * BF16ToF32(x[t * k + c]);
        ASSERT_EQ(y[t * m + r], ref) << "token " << t << " row " << r;
      }
    }
  }
}

}  // namespace
}  // namespace sparq::cuda
