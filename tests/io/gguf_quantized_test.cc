// GGUF Q4_0 / Q4_1 / Q8_0 tensors read as stored (gguf.h ReadQuantized): a quantized DenseMatrix
// whose ToDense equals ReadF32 (ggml's own dequantization, gguf_dequant.cc) bit for bit, with the
// nibbles repacked into sparq's order; other types and bad blocks give errors naming them.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "io/io_testutil.h"
#include "sparq/checkpoint.h"
#include "sparq/dtype.h"
#include "sparq/gguf.h"

namespace sparq {
namespace {

using testing::Append;
using testing::Bytes;
using testing::EncU16;
using testing::GgufBuilder;
using ::testing::HasSubstr;

constexpr uint32_t kQ4_0 = 2, kQ4_1 = 3, kQ8_0 = 8, kQ4_K = 12, kF16 = 1;

// An f16 scale: mostly normal values of both signs, some zero, subnormal and tiny ones.
uint16_t RandomScale(std::mt19937& rng, bool allow_negative) {
  const uint32_t kind = rng() % 8;
  if (kind == 0) return 0x0000;
  if (kind == 1) return static_cast<uint16_t>(1 + rng() % 0x3ff);  // subnormal
  const float mag = std::ldexp(1.0f + (rng() % 1000) / 1000.0f, -int(rng() % 12));
  return F32ToF16(allow_negative && rng() % 2 ? -mag : mag);
}

// `blocks` random blocks of a type: finite scales, Q8_0 codes in -127..127.
Bytes RandomBlocks(uint32_t type, int64_t blocks, uint32_t seed) {
  std::mt19937 rng(seed);
  Bytes b;
  for (int64_t i = 0; i < blocks; ++i) {
    Append(b, EncU16(RandomScale(rng, type != kQ4_1)));
    if (type == kQ4_1) Append(b, EncU16(RandomScale(rng, true)));  // m
    const int n = type == kQ8_0 ? 32 : 16;
    for (int j = 0; j < n; ++j) {
      b.push_back(type == kQ8_0 ? static_cast<uint8_t>(int8_t(int(rng() % 255) - 127))
                                : static_cast<uint8_t>(rng()));
    }
  }
  return b;
}

Bytes SmallGguf() {
  GgufBuilder g;
  g.Tensor({"q8", {64, 3}, kQ8_0, RandomBlocks(kQ8_0, 6, 1)});
  g.Tensor({"q40", {96, 2}, kQ4_0, RandomBlocks(kQ4_0, 6, 2)});
  g.Tensor({"q41", {32, 4}, kQ4_1, RandomBlocks(kQ4_1, 4, 3)});
  g.Tensor({"q40_3d", {32, 2, 2}, kQ4_0, RandomBlocks(kQ4_0, 4, 4)});
  g.Tensor({"q8_1d", {128}, kQ8_0, RandomBlocks(kQ8_0, 4, 5)});
  g.Tensor({"half", {4}, kF16, Bytes(8, 0)});
  g.Tensor({"k4", {256}, kQ4_K, Bytes(144, 0)});
  return g.Build();
}

TEST(GgufQuantizedTest, ToDenseEqualsReadF32BitForBit) {
  const Bytes b = SmallGguf();
  auto f = GgufFile::FromMemory(b.data(), b.size(), "t.gguf");
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  int checked = 0;
  for (const GgufTensorInfo& t : f->tensors()) {
    if (t.type != GgmlType::kQ4_0 && t.type != GgmlType::kQ4_1 && t.type != GgmlType::kQ8_0) {
      continue;
    }
    SCOPED_TRACE(t.name);
    auto q = f->ReadQuantized(t);
    ASSERT_TRUE(q.ok()) << q.status().ToString();
    auto ref = f->ReadF32(t);
    ASSERT_TRUE(ref.ok());
    EXPECT_EQ(q->cols, t.ne[0]);
    EXPECT_EQ(q->rows * q->cols, int64_t(ref->numel()));
    EXPECT_EQ(q->quant.spec.Name(), t.type == GgmlType::kQ8_0   ? "int8:g32"
                                    : t.type == GgmlType::kQ4_0 ? "int4:g32:sym"
                                                                : "int4:g32");
    EXPECT_TRUE(q->Validate("x").ok());
    const Tensor d = q->ToDense();
    ASSERT_EQ(d.nbytes(), ref->nbytes());
    const float* x = d.data_as<float>();
    const float* y = ref->data_as<float>();
    for (uint64_t i = 0; i < ref->numel(); ++i) {
      ASSERT_EQ(F32Bits(x[i]), F32Bits(y[i])) << "element " << i << ": " << x[i] << " vs " << y[i];
    }
    ++checked;
  }
  EXPECT_EQ(checked, 5);
}

// One hand-built Q4_1 block, nibbles j | (15 - j) << 4: ggml's value k is the low nibble of
// qs[k] for k < 16 and the high nibble of qs[k - 16] after, so code(k) = k, then 31 - k.
TEST(GgufQuantizedTest, NibblesAreRepackedIntoSparqOrder) {
  Bytes blk = EncU16(0x3400);   // d = 0.25
  Append(blk, EncU16(0xbc00));  // m = -1
  for (int j = 0; j < 16; ++j) blk.push_back(static_cast<uint8_t>(j | ((15 - j) << 4)));
  auto q = GgmlToQuantizedDense(GgmlType::kQ4_1, blk.data(), 1, 32, "blk");
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  const uint8_t* c = q->values.data_as<uint8_t>();
  for (int k = 0; k < 32; ++k) {
    const int code = (c[k / 2] >> (k % 2 ? 4 : 0)) & 15;
    EXPECT_EQ(code, k < 16 ? k : 31 - k) << k;
  }
  EXPECT_EQ(q->quant.scales.data_as<uint16_t>()[0], 0x3400);
  EXPECT_EQ(q->quant.mins.data_as<uint16_t>()[0], 0xbc00);
  EXPECT_EQ(q->ToDense().data_as<float>()[17], 14 * 0.25f - 1.0f);
}

TEST(GgufQuantizedTest, OtherTypesAndBadBlocksAreErrors) {
  const Bytes b = SmallGguf();
  auto f = GgufFile::FromMemory(b.data(), b.size(), "t.gguf");
  ASSERT_TRUE(f.ok());
  auto half = f->ReadQuantized(*f->FindTensor("half"));
  EXPECT_EQ(half.status().code(), StatusCode::kUnsupported);
  EXPECT_THAT(half.status().message(), HasSubstr("t.gguf: tensor 'half': ggml type F16 has no"));
  EXPECT_THAT(f->ReadQuantized(*f->FindTensor("k4")).status().message(), HasSubstr("type Q4_K"));

  Bytes q41 = RandomBlocks(kQ4_1, 2, 7);
  q41[20 + 2] = 0x00, q41[20 + 3] = 0x7e;  // block 1: m = NaN
  EXPECT_THAT(GgmlToQuantizedDense(GgmlType::kQ4_1, q41.data(), 1, 64, "w").status().message(),
              HasSubstr("w: block 1: f16 min m = 0x7e00 is not finite"));
  Bytes q40 = RandomBlocks(kQ4_0, 2, 8);
  q40[0] = 0x00, q40[1] = 0x7c;  // block 0: d = +inf
  EXPECT_THAT(GgmlToQuantizedDense(GgmlType::kQ4_0, q40.data(), 2, 32, "w").status().message(),
              HasSubstr("w: block 0: f16 scale d = 0x7c00 is not finite"));
  Bytes q8 = RandomBlocks(kQ8_0, 1, 9);
  q8[2 + 5] = 0x80;  // code -128
  EXPECT_THAT(GgmlToQuantizedDense(GgmlType::kQ8_0, q8.data(), 1, 32, "w").status().message(),
              HasSubstr("w: block 0 value 5 has code -128"));
  EXPECT_FALSE(GgmlToQuantizedDense(GgmlType::kQ8_0, q8.data(), 1, 16, "w").ok());
}

// GGUF -> .sparq -> load: the stored codes survive, and still dequantize to ggml's values.
TEST(GgufQuantizedTest, ThroughACheckpoint) {
  const Bytes b = SmallGguf();
  auto f = GgufFile::FromMemory(b.data(), b.size(), "t.gguf");
  ASSERT_TRUE(f.ok());
  Checkpoint ck;
  for (const char* name : {"q8", "q40", "q41"}) {
    auto q = f->ReadQuantized(*f->FindTensor(name));
    ASSERT_TRUE(q.ok());
    ck.matrices.push_back({name, std::move(*q), Pattern::Dense()});
  }
  auto bytes = SerializeCheckpoint(ck);
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  auto r = ReadCheckpointFromMemory(bytes->data(), bytes->size(), "c.sparq");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  for (const char* name : {"q8", "q40", "q41"}) {
    SCOPED_TRACE(name);
    const Tensor got = ToDense(r->FindMatrix(name)->matrix);
    auto ref = f->ReadF32(*f->FindTensor(name));
    ASSERT_TRUE(ref.ok());
    ASSERT_EQ(got.nbytes(), ref->nbytes());
    EXPECT_EQ(std::memcmp(got.data(), ref->data(), got.nbytes()), 0);
  }
}

}  // namespace
}  // namespace sparq
