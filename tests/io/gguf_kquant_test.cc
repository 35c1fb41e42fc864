// GGUF K-quants (Q2_K .. Q6_K): sparq's dequantization against gguf-py's on random super-blocks
// (bit for bit), a hand-packed Q4_K block, and the malformed-file kinds: shape not a multiple of
// 256, data short of blocks * block bytes, non-finite f16 scales.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <map>

#include "data_testutil.h"
#include "io/io_testutil.h"
#include "sparq/gguf.h"

namespace sparq {
namespace {

using testing::Append;
using testing::Bytes;
using testing::EncU16;
using testing::GgufBuilder;
using ::testing::HasSubstr;

constexpr uint32_t kQ2K = 10, kQ3K = 11, kQ4K = 12, kQ5K = 13, kQ6K = 14;

// Dequantization is a product and a difference of exactly the same f32 operands in the same
// order as gguf-py's numpy code, so no tolerance is needed: the bits must agree.
TEST(GgufKQuantTest, MatchesGgufPyBitForBit) {
  const std::string py = testing::PythonInterpreter();
  SPARQ_REQUIRE(
      testing::RunCommand("'" + py + "' -c 'import gguf, numpy' 2>/dev/null", nullptr) == 0,
      "'" + py +
          "' cannot import gguf and numpy: run scripts/install_deps.sh (it makes "
          ".venv/ with them) or set SPARQ_PYTHON to a Python that has them");
  const std::string path = testing::TempDir() + "/kquants.gguf";
  std::string log;
  ASSERT_EQ(testing::RunCommand("'" + py + "' " SPARQ_SOURCE_DIR "/scripts/make_kquant_gguf.py '" +
                                    path + "' --seed 27 2>&1",
                                &log),
            0)
      << log;
  std::cout << log;  // the seed
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  std::map<std::string, int> compared;  // type name -> tensors compared
  int64_t elements = 0;
  for (const auto& t : f->tensors()) {
    if (t.type == GgmlType::kF32) continue;
    const GgufTensorInfo* ref_info = f->FindTensor(t.name + ".ref");
    ASSERT_NE(ref_info, nullptr) << t.name;
    auto got = f->ReadF32(t);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    auto ref = f->ReadF32(*ref_info);
    ASSERT_TRUE(ref.ok()) << ref.status().ToString();
    ASSERT_EQ(got->shape(), ref->shape()) << t.name;
    const auto* g = got->data_as<float>();
    const auto* r = ref->data_as<float>();
    int64_t differ = 0, nonzero = 0;
    for (uint64_t i = 0; i < got->numel(); ++i) {
      differ += std::memcmp(&g[i], &r[i], 4) != 0;
      nonzero += g[i] != 0;
      if (differ == 1 && std::memcmp(&g[i], &r[i], 4) != 0) {
        ADD_FAILURE() << t.name << "[" << i << "]: sparq " << g[i] << ", gguf-py " << r[i];
      }
    }
    EXPECT_EQ(differ, 0) << t.name << ": " << differ << " of " << got->numel()
                         << " elements differ";
    EXPECT_GT(nonzero, static_cast<int64_t>(got->numel()) / 2)
        << t.name << ": mostly zeros, a weak test";
    compared[GgmlTypeName(t.type)]++;
    elements += static_cast<int64_t>(got->numel());
  }
  EXPECT_EQ(compared, (std::map<std::string, int>{
                          {"Q2_K", 3}, {"Q3_K", 3}, {"Q4_K", 3}, {"Q5_K", 3}, {"Q6_K", 3}}));
  EXPECT_EQ(elements, 5 * (3 * 512 + 256 + 2 * 768));
}

// Packs 8 (scale, min) 6-bit pairs the way Q4_K / Q5_K store them (the inverse of the reader's
// unpacking, written from the layout description, not from the reader).
Bytes PackScaleMin(const int sc[8], const int m[8]) {
  Bytes s(12);
  for (int j = 0; j < 4; ++j) {
    s[j] = static_cast<uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    s[j + 4] = static_cast<uint8_t>((m[j] & 63) | ((m[j + 4] >> 4) << 6));
    s[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | ((m[j + 4] & 15) << 4));
  }
  return s;
}

TEST(GgufKQuantTest, HandPackedQ4_K) {
  const int sc[8] = {1, 2, 3, 63, 17, 33, 48, 63};  // pairs 4..7 need the spare top bits
  const int m[8] = {0, 5, 63, 7, 16, 40, 1, 62};
  Bytes blk = EncU16(0x3800);   // d = 0.5
  Append(blk, EncU16(0x3400));  // dmin = 0.25
  Append(blk, PackScaleMin(sc, m));
  for (int p = 0; p < 4; ++p)
    for (int l = 0; l < 32; ++l)
      blk.push_back(static_cast<uint8_t>((l % 16) | ((15 - l % 16) << 4)));
  ASSERT_EQ(blk.size(), 144u);
  float y[256];
  ASSERT_TRUE(DequantizeGgml(GgmlType::kQ4_K, blk.data(), 256, y).ok());
  // Sub-block j: low nibbles for even j, high for odd; every value is exact in f32.
  for (int j = 0; j < 8; ++j) {
    for (int l = 0; l < 32; ++l) {
      const int q = j % 2 == 0 ? l % 16 : 15 - l % 16;
      EXPECT_EQ(y[32 * j + l], 0.5f * sc[j] * q - 0.25f * m[j]) << j << " " << l;
    }
  }
}

// A view of b (GgufFile::FromMemory does not copy): b must outlive the result.
Result<GgufFile> Parse(const Bytes& b) {
  return GgufFile::FromMemory(b.data(), b.size(), "k.gguf");
}

std::string ParseError(const Bytes& b) {
  auto r = Parse(b);
  EXPECT_FALSE(r.ok()) << "expected a parse error";
  return r.ok() ? "" : r.status().message();
}

TEST(GgufKQuantMalformedTest, RowNotMultipleOf256) {
  GgufBuilder g;
  g.Tensor({"k", {128, 2}, kQ4K, Bytes(144)});
  EXPECT_THAT(
      ParseError(g.Build()),
      HasSubstr(
          "tensor 'k': row length ne[0] = 128 is not a multiple of the block size 256 of Q4_K"));
  GgufBuilder g6;
  g6.Tensor({"k6", {300}, kQ6K, Bytes(420)});
  EXPECT_THAT(ParseError(g6.Build()),
              HasSubstr("ne[0] = 300 is not a multiple of the block size 256 of Q6_K"));
}

// The byte size is not stored but derived (blocks * block bytes); data shorter than that runs
// into the next tensor or past the end of the file.
TEST(GgufKQuantMalformedTest, DataShorterThanBlocksTimesBlockBytes) {
  GgufBuilder last;
  last.Tensor({"k5", {512}, kQ5K, Bytes(176)});  // 2 super-blocks need 352 bytes
  EXPECT_THAT(ParseError(last.Build()),
              HasSubstr("tensor 'k5': data [0, +352) goes beyond the end of the file"));
  GgufBuilder mid;
  mid.Tensor({"k2", {256, 2}, kQ2K, Bytes(96)}).Tensor({"n", {64}, 0, Bytes(256)});  // needs 168
  EXPECT_THAT(ParseError(mid.Build()), HasSubstr("tensors 'k2' and 'n' overlap"));
}

// A super-block with the f16 pattern `bad` at byte `at`, the rest zero.
Bytes BadBlock(size_t bytes, size_t at, uint16_t bad) {
  Bytes b(bytes);
  std::memcpy(b.data() + at, &bad, 2);
  return b;
}

TEST(GgufKQuantMalformedTest, NonFiniteScaleNamesTensorAndBlock) {
  struct Case {
    uint32_t type;
    size_t bytes, at;
    uint16_t bad;
    const char* message;
  };
  const Case cases[] = {
      {kQ2K, 84, 80, 0x7e00, "super-block 1: f16 scale d = 0x7e00 is not finite"},
      {kQ2K, 84, 82, 0xfc00, "super-block 1: f16 min scale dmin = 0xfc00 is not finite"},
      {kQ3K, 110, 108, 0x7c00, "super-block 1: f16 scale d = 0x7c00 is not finite"},
      {kQ4K, 144, 0, 0x7e01, "super-block 1: f16 scale d = 0x7e01 is not finite"},
      {kQ4K, 144, 2, 0x7c00, "super-block 1: f16 min scale dmin = 0x7c00 is not finite"},
      {kQ5K, 176, 2, 0xfe00, "super-block 1: f16 min scale dmin = 0xfe00 is not finite"},
      {kQ6K, 210, 208, 0x7e00, "super-block 1: f16 scale d = 0x7e00 is not finite"},
  };
  for (const Case& c : cases) {
    Bytes data(c.bytes);  // super-block 0 all zero (d = 0: legal), super-block 1 bad
    Append(data, BadBlock(c.bytes, c.at, c.bad));
    GgufBuilder g;
    g.Tensor({"w", {512}, c.type, data});
    const Bytes file = g.Build();  // FromMemory reads it in place: it must outlive f
    auto f = Parse(file);
    ASSERT_TRUE(f.ok()) << f.status().ToString();  // the header is fine; the data is not
    auto t = f->ReadF32(f->tensors()[0]);
    ASSERT_FALSE(t.ok()) << c.message;
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidInput);
    EXPECT_THAT(t.status().message(), HasSubstr(std::string("k.gguf: tensor 'w': ") + c.message));
  }
}

// Q4_0 / Q4_1 / Q8_0 get the same check as the K-quants.
TEST(GgufKQuantMalformedTest, NonFiniteScaleInLegacyBlocks) {
  float y[64];
  Bytes q4_0(18);
  Append(q4_0, BadBlock(18, 0, 0x7e00));
  EXPECT_THAT(DequantizeGgml(GgmlType::kQ4_0, q4_0.data(), 64, y).message(),
              HasSubstr("block 1: f16 scale d = 0x7e00 is not finite"));
  const Bytes q4_1 = BadBlock(20, 2, 0x7c00);
  EXPECT_THAT(DequantizeGgml(GgmlType::kQ4_1, q4_1.data(), 32, y).message(),
              HasSubstr("block 0: f16 min m = 0x7c00 is not finite"));
  const Bytes q8_0 = BadBlock(34, 0, 0xfc00);
  EXPECT_EQ(DequantizeGgml(GgmlType::kQ8_0, q8_0.data(), 32, y).code(), StatusCode::kInvalidInput);
}

TEST(GgufKQuantMalformedTest, DequantizeCountNotMultipleOf256) {
  Bytes blk(210);
  float y[256];
  const Status st = DequantizeGgml(GgmlType::kQ6_K, blk.data(), 255, y);
  EXPECT_EQ(st.code(), StatusCode::kInvalidInput);
  EXPECT_THAT(st.message(),
              HasSubstr("element count 255 is not a multiple of the block size 256 of Q6_K"));
  EXPECT_TRUE(DequantizeGgml(GgmlType::kQ6_K, blk.data(), 256, y).ok());
}

}  // namespace
}  // namespace sparq
