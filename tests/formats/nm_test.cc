// N:M metadata bytes checked by hand against the NVIDIA 2:4 encoding, other bit widths, the
// padded tail and V:N:M sharing.
#include <gtest/gtest.h>

#include <vector>

#include "formats/formats_testutil.h"
#include "sparq/format.h"

namespace sparq {
namespace {

using testing_formats::BitEqual;

TEST(NmMeta, TwoFourMatchesNvidiaEncoding) {
  // Row [0, a, 0, b | c, 0, d, 0]: group 0 keeps (1, 3) -> 0b11'01 = 0xD; group 1 keeps (0, 2)
  // -> 0b10'00 = 0x8; group 0 in the low nibble -> byte 0x8D.
  const float a = 1.5f, b = -2.0f, c = 3.25f, d = 4.0f;
  const std::vector<float> w = {0, a, 0, b, c, 0, d, 0};
  auto s = NmMatrix::FromDense(w, 1, 8, 2, 4);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->index_bits(), 2);
  EXPECT_EQ(s->meta_row_bytes(), 1);
  ASSERT_EQ(s->meta.shape(), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(s->meta.data_as<uint8_t>()[0], 0x8D);
  ASSERT_EQ(s->values.shape(), (std::vector<int64_t>{1, 4}));
  const float* v = s->values.data_as<float>();
  EXPECT_EQ(v[0], a);
  EXPECT_EQ(v[1], b);
  EXPECT_EQ(v[2], c);
  EXPECT_EQ(v[3], d);
  EXPECT_EQ(s->Index(0, 0), 1);
  EXPECT_EQ(s->Index(0, 3), 2);
  EXPECT_EQ(s->ByteSize(), 4u * 4 + 1);
}

TEST(NmMeta, FourGroupsFillAU16LowGroupFirst) {
  // 16 columns = 4 groups -> 2 bytes per row; as a little-endian u16 group g sits in bits
  // [4g, 4g + 4). Groups keep (0,1), (2,3), (1,2), (0,3): nibbles 0x4, 0xE, 0x9, 0xC.
  std::vector<float> w(16, 0.0f);
  for (int j : {0, 1, 4 + 2, 4 + 3, 8 + 1, 8 + 2, 12 + 0, 12 + 3}) w[j] = 1.0f + j;
  auto s = NmMatrix::FromDense(w, 1, 16, 2, 4, DType::kBF16);
  ASSERT_TRUE(s.ok());
  const uint8_t* meta = s->meta.data_as<uint8_t>();
  const uint16_t word = static_cast<uint16_t>(meta[0] | (meta[1] << 8));
  EXPECT_EQ(word, 0xC9E4);
  EXPECT_TRUE(BitEqual(s->ToDense(), w, 1, 16));
}

TEST(NmMeta, EmptyGroupsUseTheLowestPositions) {
  // 1:4: group 0 keeps 2, group 1 keeps 0, group 2 keeps 3, group 3 is empty -> 0.
  // Stream (2 bits each): 2 | 0 << 2 | 3 << 4 | 0 << 6 = 0x32.
  std::vector<float> w(16, 0.0f);
  w[2] = 1;
  w[4] = 2;
  w[11] = 3;
  auto s = NmMatrix::FromDense(w, 1, 16, 1, 4);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->meta.data_as<uint8_t>()[0], 0x32);
  // 2:4 with an all-zero group stores positions (0, 1) -> nibble 0b0100.
  std::vector<float> z(4, 0.0f);
  auto e = NmMatrix::FromDense(z, 1, 4, 2, 4);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->meta.data_as<uint8_t>()[0], 0x4);
}

TEST(NmMeta, ThreeBitIndicesCrossByteBoundaries) {
  // 2:8, two groups: (1, 6), (0, 7) -> 1 | 6 << 3 | 0 << 6 | 7 << 9 = 0x0E31.
  std::vector<float> w(16, 0.0f);
  w[1] = 1;
  w[6] = 2;
  w[8] = 3;
  w[15] = 4;
  auto s = NmMatrix::FromDense(w, 1, 16, 2, 8);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->index_bits(), 3);
  EXPECT_EQ(s->meta_row_bytes(), 2);
  EXPECT_EQ(s->meta.data_as<uint8_t>()[0], 0x31);
  EXPECT_EQ(s->meta.data_as<uint8_t>()[1], 0x0E);
  // Rows start on byte boundaries: 1:8 over 8 columns uses 3 bits, padded to one byte per row.
  std::vector<float> two(16, 0.0f);
  two[5] = 1;
  two[8 + 7] = 1;
  auto t = NmMatrix::FromDense(two, 2, 8, 1, 8);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->meta.shape(), (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(t->meta.data_as<uint8_t>()[0], 5);
  EXPECT_EQ(t->meta.data_as<uint8_t>()[1], 7);
}

TEST(NmMeta, IndexBitsPerM) {
  const int want[17] = {0, 0, 1, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 4, 4, 4, 4};
  for (int m = 2; m <= 16; ++m) {
    std::vector<float> w(m, 0.0f);
    auto s = NmMatrix::FromDense(w, 1, m, 1, m);
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(s->index_bits(), want[m]) << "m = " << m;
  }
}

TEST(NmTail, ShortTailGroupIsPaddedWithZeros) {
  // 2:4 over 5 columns: the tail group has one real column; its second slot points into the
  // padding (index 1 = column 5, beyond cols) and holds +0.
  const std::vector<float> w = {0, 1, 2, 0, 3};
  auto s = NmMatrix::FromDense(w, 1, 5, 2, 4);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->groups(), 2);
  EXPECT_EQ(s->values.shape(), (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(s->Index(0, 2), 0);
  EXPECT_EQ(s->Index(0, 3), 1);
  EXPECT_EQ(s->values.data_as<float>()[3], 0.0f);
  EXPECT_TRUE(s->Validate("w").ok());
  EXPECT_TRUE(BitEqual(s->ToDense(), w, 1, 5));
  // A tail of 3 columns holds 2 real positions and never needs the padding.
  const std::vector<float> w7 = {1, 0, 0, 2, 0, 0, 0};
  auto t = NmMatrix::FromDense(w7, 1, 7, 2, 4);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->Index(0, 2), 0);
  EXPECT_EQ(t->Index(0, 3), 1);
}

TEST(Vnm, SlabsShareIndicesStoredOnce) {
  // v = 2, 2:4, 3 rows (the last slab has one row), 8 columns.
  const std::vector<float> w = {1, 0, 2, 0, 0, 3, 0, 4,   // slab 0
                                5, 0, 6, 0, 0, 0, 0, 7,   // slab 0 (same columns)
                                0, 8, 0, 0, 9, 0, 0, 0};  // slab 1
  auto s = VnmMatrix::FromDense(w, 3, 8, 2, 2, 4);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->slabs(), 2);
  EXPECT_EQ(s->meta.shape(), (std::vector<int64_t>{2, 1}));
  // Slab 0: group 0 (0, 2) -> 0b1000, group 1 (1, 3) -> 0b1101: 0xD8.
  EXPECT_EQ(s->meta.data_as<uint8_t>()[0], 0xD8);
  // Slab 1: group 0 (1) + lowest free (0) -> (0, 1) = 0b0100; group 1 (0) + (1) -> 0b0100.
  EXPECT_EQ(s->meta.data_as<uint8_t>()[1], 0x44);
  EXPECT_EQ(s->Index(1, 1), 1);
  const float* v = s->values.data_as<float>();
  EXPECT_EQ(std::vector<float>(v + 4, v + 8), (std::vector<float>{5, 6, 0, 7}));
  EXPECT_TRUE(BitEqual(s->ToDense(), w, 3, 8));
  EXPECT_EQ(s->ByteSize(), 3u * 4 * 4 + 2);
}

}  // namespace
}  // namespace sparq
