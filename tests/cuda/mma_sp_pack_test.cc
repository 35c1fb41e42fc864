// The mma.sp A-operand packer (src/cuda/mma_sp_pack.h) against the PTX ISA's description, on the
// CPU: an independent decoder walks every lane's registers the way the ISA assigns them
// (9.7.14.6.2.1 / .2 for .f16/.bf16: fragment rows/columns by groupID and threadID_in_group;
// metadata supplied, with sparsity selector 0, by threads 0 (k16) or 0 and 1 (k32) of each group,
// row groupID in bits [15:0] and row groupID + 8 in bits [31:16]) and rebuilds the dense tile,
// which must equal the input bit for bit. Hand-computed words pin the same mapping by example.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "sparq/dtype.h"
#include "sparq/format.h"
#include "src/cuda/mma_sp_pack.h"

namespace sparq::cuda {
namespace {

// Rebuilds dense W [rows, cols] as 16-bit bits from the packed registers, reading them as the
// hardware does. Fails the test (and leaves a position unwritten) on an illegal metadata nibble:
// equal indices, or (::ordered_metadata) a descending pair.
std::vector<uint16_t> DecodeAsIsa(const MmaSpPacked& p) {
  const int k = p.shape == MmaSpShape::kM16N8K16 ? 16 : 32;
  const int regs = k / 8;           // A: two .b32 (k16) or four (k32), two values each
  const int meta_lanes = k / 16;    // selector 0: threads 0 (k16) or 0, 1 (k32) of each group
  std::vector<uint16_t> dense(static_cast<size_t>(p.rows * p.cols), 0);
  for (int64_t tm = 0; tm < p.tiles_m; ++tm) {
    for (int64_t tk = 0; tk < p.tiles_k; ++tk) {
      const int64_t tile = tm * p.tiles_k + tk;
      for (int lane = 0; lane < 32; ++lane) {
        const int group_id = lane >> 2, tid = lane % 4;
        for (int i = 0; i < 2 * regs; ++i) {  // a_i: element i of the fragment
          // ISA: row = groupID for a0,a1 (k32: also a4,a5), groupID + 8 otherwise;
          // firstcol = threadID_in_group * 4 (+ 16 for a_i, i >= 4).
          const bool upper = (i / 2) % 2 == 1;
          const int row = group_id + (upper ? 8 : 0);
          const int firstcol = tid * 4 + (i >= 4 ? 16 : 0);
          const uint32_t reg = p.a[(tile * 32 + lane) * regs + i / 2];
          const uint16_t value = static_cast<uint16_t>(i % 2 == 0 ? reg & 0xFFFF : reg >> 16);
          // The metadata of this chunk: held by the lane of the same group whose 16-column span
          // covers it, in the half of its word that belongs to this row.
          const int span = firstcol / 16;
          const uint32_t word = p.meta[tile * 8 * meta_lanes + group_id * meta_lanes + span];
          const uint32_t half = upper ? word >> 16 : word & 0xFFFF;
          const uint32_t nibble = (half >> (4 * ((firstcol % 16) / 4))) & 0xF;
          const uint32_t first = nibble & 3, second = nibble >> 2;
          EXPECT_LT(first, second) << "tile " << tile << " lane " << lane << ": nibble " << nibble;
          const uint32_t idx = i % 2 == 0 ? first : second;
          const int64_t r = tm * 16 + row, c = tk * k + firstcol + idx;
          dense[r * p.cols + c] = value;
        }
      }
    }
  }
  return dense;
}

// A random 2:4 matrix with bf16-exact values: per group of 4, 0, 1 or 2 nonzeros at random
// positions, some of them -0 (a kept -0 must survive: its position is kept too).
std::vector<float> Random24(int64_t rows, int64_t cols, std::mt19937& rng) {
  std::uniform_real_distribution<float> val(-4.0f, 4.0f);
  std::uniform_int_distribution<int> pos(0, 3), count(0, 5);
  std::vector<float> w(static_cast<size_t>(rows * cols), 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < cols / 4; ++g) {
      const int n = std::min(count(rng), 2);  // mostly 2 kept, sometimes 0 or 1
      int a = pos(rng), b = pos(rng);
      while (b == a) b = pos(rng);
      const int at[2] = {a, b};
      for (int j = 0; j < n; ++j) {
        float v = BF16ToF32(F32ToBF16(val(rng)));
        if (count(rng) == 0) v = -0.0f;
        w[r * cols + g * 4 + at[j]] = v;
      }
    }
  }
  return w;
}

void ExpectRoundTrip(int64_t rows, int64_t cols, MmaSpShape shape, uint32_t seed) {
  std::printf("seed %u, %lld x %lld, %s\n", seed, static_cast<long long>(rows),
              static_cast<long long>(cols), MmaSpShapeName(shape));
  std::mt19937 rng(seed);
  const std::vector<float> w = Random24(rows, cols, rng);
  auto p = PackMmaSpFromDense(w, rows, cols, shape, DType::kBF16, "w");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->tiles_m, rows / 16);
  EXPECT_EQ(p->tiles_k, cols / MmaSpTileK(shape));
  const std::vector<uint16_t> got = DecodeAsIsa(*p);
  for (int64_t i = 0; i < rows * cols; ++i) {
    ASSERT_EQ(got[i], F32ToBF16(w[i])) << "row " << i / cols << " col " << i % cols;
  }
}

TEST(MmaSpPack, RandomTilesDecodeBackBitForBitK32) {
  for (uint32_t seed : {1u, 2u, 3u}) ExpectRoundTrip(16, 32, MmaSpShape::kM16N8K32, seed);
  ExpectRoundTrip(48, 96, MmaSpShape::kM16N8K32, 7);
  ExpectRoundTrip(32, 256, MmaSpShape::kM16N8K32, 8);
}

TEST(MmaSpPack, RandomTilesDecodeBackBitForBitK16) {
  for (uint32_t seed : {4u, 5u}) ExpectRoundTrip(16, 16, MmaSpShape::kM16N8K16, seed);
  ExpectRoundTrip(64, 48, MmaSpShape::kM16N8K16, 9);
}

// W[r][c] = r * 32 + c + 1 where kept: every group keeps columns (0, 1) except row 0 group 0,
// which keeps (2, 3), and row 8 group 5, which keeps (1, 3).
std::vector<float> HandTile() {
  std::vector<float> w(16 * 32, 0.0f);
  for (int r = 0; r < 16; ++r) {
    for (int g = 0; g < 8; ++g) {
      int a = 0, b = 1;
      if (r == 0 && g == 0) a = 2, b = 3;
      if (r == 8 && g == 5) a = 1, b = 3;
      w[r * 32 + g * 4 + a] = static_cast<float>(r * 32 + g * 4 + a + 1);
      w[r * 32 + g * 4 + b] = static_cast<float>(r * 32 + g * 4 + b + 1);
    }
  }
  return w;
}

uint32_t Pair(float lo, float hi) { return F32ToBF16(lo) | static_cast<uint32_t>(F32ToBF16(hi)) << 16; }

TEST(MmaSpPack, HandComputedK32Words) {
  const std::vector<float> w = HandTile();
  auto p = PackMmaSpFromDense(w, 16, 32, MmaSpShape::kM16N8K32, DType::kBF16, "hand");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  ASSERT_EQ(p->meta.size(), 16u);
  ASSERT_EQ(p->a.size(), 32u * 4);
  // Nibbles: (0,1) -> 0b01'00 = 0x4, (2,3) -> 0b11'10 = 0xE, (1,3) -> 0b11'01 = 0xD.
  // Lane 0 (group 0, thread 0): columns 0..15 of row 0 (group 0 = 0xE) low, of row 8 high.
  EXPECT_EQ(p->meta[0], 0x4444444Eu);
  // Lane 1: columns 16..31; row 8's group 5 is the second group of that span.
  EXPECT_EQ(p->meta[1], 0x44D44444u);
  // Group 3 (rows 3 and 11), both spans: all (0,1).
  EXPECT_EQ(p->meta[3 * 2 + 0], 0x44444444u);
  EXPECT_EQ(p->meta[3 * 2 + 1], 0x44444444u);
  // Lane 0's A: row 0 chunk 0 (kept 2,3 -> values 3, 4), row 8 chunk 0 (257, 258), row 0 chunk 4
  // (columns 16, 17 -> 17, 18), row 8 chunk 4 (273, 274).
  EXPECT_EQ(p->a[0], Pair(3, 4));
  EXPECT_EQ(p->a[1], Pair(257, 258));
  EXPECT_EQ(p->a[2], Pair(17, 18));
  EXPECT_EQ(p->a[3], Pair(273, 274));
  // Lane 5 (group 1, thread 1): register 3 is row 9, chunk at column 4 + 16 = 20 -> 9*32+21.
  EXPECT_EQ(p->a[5 * 4 + 3], Pair(9 * 32 + 21, 9 * 32 + 22));
  // Lane 6 (group 1, thread 2): register 2 is row 1, columns 24, 25 of a (1, 3)-free row.
  EXPECT_EQ(p->a[6 * 4 + 2], Pair(32 + 25, 32 + 26));
  // Lane 1 (group 0, thread 1), register 3: row 8 chunk at column 20 = group 5, kept (1, 3).
  EXPECT_EQ(p->a[1 * 4 + 3], Pair(8 * 32 + 22, 8 * 32 + 24));
}

TEST(MmaSpPack, HandComputedK16Words) {
  const std::vector<float> w = HandTile();
  auto p = PackMmaSpFromDense(w, 16, 32, MmaSpShape::kM16N8K16, DType::kBF16, "hand");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  ASSERT_EQ(p->tiles_k, 2);
  ASSERT_EQ(p->meta.size(), 2u * 8);
  // Tile 0 (columns 0..15): group 0's word, from thread 0; tile 1: row 8's group 5 is group 1.
  EXPECT_EQ(p->meta[0], 0x4444444Eu);
  EXPECT_EQ(p->meta[8 + 0], 0x44D44444u);
  // Tile 1, lane 1: register 1 is row 8, chunk at column 16 + 4 = group 5.
  EXPECT_EQ(p->a[(32 + 1) * 2 + 1], Pair(8 * 32 + 22, 8 * 32 + 24));
}

TEST(MmaSpPack, F16AndF32ValuesKeepOrRoundBits) {
  std::mt19937 rng(11);
  std::vector<float> w = Random24(16, 32, rng);
  for (float& v : w) v = F16ToF32(F32ToF16(v));  // f16-exact too (|v| <= 4, 8-bit mantissa)
  auto p16 = PackMmaSpFromDense(w, 16, 32, MmaSpShape::kM16N8K32, DType::kF16, "w16");
  ASSERT_TRUE(p16.ok()) << p16.status().ToString();
  EXPECT_EQ(p16->dtype, DType::kF16);
  const std::vector<uint16_t> got = DecodeAsIsa(*p16);
  for (size_t i = 0; i < w.size(); ++i) ASSERT_EQ(got[i], F32ToF16(w[i])) << i;
  // f32 values (sparq's prune default) are rounded to bf16.
  auto nm = NmMatrix::FromDense(w, 16, 32, 2, 4, DType::kF32);
  ASSERT_TRUE(nm.ok());
  auto pf = PackMmaSp(*nm, MmaSpShape::kM16N8K32, "w32");
  ASSERT_TRUE(pf.ok()) << pf.status().ToString();
  EXPECT_EQ(pf->dtype, DType::kBF16);
  const std::vector<uint16_t> gotf = DecodeAsIsa(*pf);
  for (size_t i = 0; i < w.size(); ++i) ASSERT_EQ(gotf[i], F32ToBF16(w[i])) << i;
}

TEST(MmaSpPack, NotTwoFourIsAnErrorNamingRowAndColumns) {
  std::vector<float> w(16 * 32, 0.0f);
  w[5 * 32 + 8] = w[5 * 32 + 9] = w[5 * 32 + 11] = 1.0f;  // row 5, group 2: three nonzeros
  auto p = PackMmaSpFromDense(w, 16, 32, MmaSpShape::kM16N8K32, DType::kBF16, "layer.w");
  ASSERT_FALSE(p.ok());
  const std::string msg = p.status().ToString();
  EXPECT_NE(msg.find("layer.w"), std::string::npos) << msg;
  EXPECT_NE(msg.find("row 5"), std::string::npos) << msg;
  EXPECT_NE(msg.find("columns 8..11"), std::string::npos) << msg;
}

TEST(MmaSpPack, ShapesOffTheTileAreErrors) {
  std::vector<float> w(24 * 64, 0.0f);
  auto rows = PackMmaSpFromDense(std::span<const float>(w).first(24 * 32), 24, 32,
                                 MmaSpShape::kM16N8K32, DType::kBF16, "w");
  ASSERT_FALSE(rows.ok());
  EXPECT_NE(rows.status().ToString().find("rows 24 is not a multiple of the tile's 16"),
            std::string::npos)
      << rows.status().ToString();
  auto cols = PackMmaSpFromDense(std::span<const float>(w).first(16 * 48), 16, 48,
                                 MmaSpShape::kM16N8K32, DType::kBF16, "w");
  ASSERT_FALSE(cols.ok());
  EXPECT_NE(cols.status().ToString().find("cols 48 is not a multiple of the tile's 32"),
            std::string::npos)
      << cols.status().ToString();
  // 48 columns are whole k16 tiles.
  EXPECT_TRUE(PackMmaSpFromDense(std::span<const float>(w).first(16 * 48), 16, 48,
                                 MmaSpShape::kM16N8K16, DType::kBF16, "w")
                  .ok());
}

TEST(MmaSpPack, OtherPatternsAndValueTypesAreErrors) {
  std::vector<float> w(16 * 32, 0.0f);
  auto nm14 = NmMatrix::FromDense(w, 16, 32, 1, 4, DType::kBF16);
  ASSERT_TRUE(nm14.ok());
  auto p = PackMmaSp(*nm14, MmaSpShape::kM16N8K32, "w");
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().ToString().find("take 2:4, the matrix is 1:4"), std::string::npos)
      << p.status().ToString();
  auto f32 = PackMmaSpFromDense(w, 16, 32, MmaSpShape::kM16N8K32, DType::kF32, "w");
  ASSERT_FALSE(f32.ok());
  EXPECT_NE(f32.status().ToString().find("bf16 or f16"), std::string::npos);
}

}  // namespace
}  // namespace sparq::cuda
