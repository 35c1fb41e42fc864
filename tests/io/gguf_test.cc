// GGUF reader: metadata of every value type, tensor infos, hand-built quantized blocks, and one
// test per malformed-file kind, each expecting its specific error.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "io/io_testutil.h"
#include "sparq/dtype.h"
#include "sparq/gguf.h"

namespace sparq {
namespace {

using ::testing::HasSubstr;
using testing::Append;
using testing::Bytes;
using testing::EncArray;
using testing::EncF32;
using testing::EncF64;
using testing::EncStr;
using testing::EncU16;
using testing::EncU32;
using testing::EncU64;
using testing::EncU8;
using testing::GgufBuilder;
using testing::GgufTensorSpec;

enum : uint32_t { kU8 = 0, kI8, kU16, kI16, kU32, kI32, kF32, kBool, kString, kArray, kU64, kI64, kF64 };

Bytes F32Data(std::initializer_list<float> v) {
  Bytes b;
  for (float f : v) Append(b, EncF32(f));
  return b;
}

Result<GgufFile> Parse(const Bytes& b) { return GgufFile::FromMemory(b.data(), b.size(), "t.gguf"); }

std::string ErrorOf(const Bytes& b) {
  auto r = Parse(b);
  EXPECT_FALSE(r.ok()) << "expected a parse error";
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidInput);
  return r.ok() ? "" : r.status().message();
}

TEST(GgufTest, MetadataOfEveryValueType) {
  Bytes nested;  // array of 2 arrays of i16: [[1, -2], [3]]
  Append(nested, EncArray(kI16, 2, [] { Bytes e = EncU16(1); Append(e, EncU16(0xfffe)); return e; }()));
  Append(nested, EncArray(kI16, 1, EncU16(3)));
  Bytes strs = EncStr("a");
  Append(strs, EncStr(""));
  Append(strs, EncStr("xyz"));
  GgufBuilder g;
  g.Kv("u8", kU8, EncU8(200))
      .Kv("i8", kI8, EncU8(0x80))
      .Kv("u16", kU16, EncU16(65535))
      .Kv("i16", kI16, EncU16(0x8000))
      .Kv("u32", kU32, EncU32(4000000000u))
      .Kv("i32", kI32, EncU32(0xffffffffu))
      .Kv("f32", kF32, EncF32(1.5f))
      .Kv("bool", kBool, EncU8(1))
      .Kv("str", kString, EncStr("hello"))
      .Kv("arr", kArray, EncArray(kU32, 3, [] { Bytes e = EncU32(7); Append(e, EncU32(8)); Append(e, EncU32(9)); return e; }()))
      .Kv("strs", kArray, EncArray(kString, 3, strs))
      .Kv("nested", kArray, EncArray(kArray, 2, nested))
      .Kv("u64", kU64, EncU64(~uint64_t{0}))
      .Kv("i64", kI64, EncU64(static_cast<uint64_t>(int64_t{-5})))
      .Kv("f64", kF64, EncF64(-0.25));
  for (uint32_t version : {2u, 3u}) {
    g.version = version;
    const Bytes b = g.Build();
    auto r = Parse(b);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    const GgufFile& f = *r;
    EXPECT_EQ(f.version(), version);
    EXPECT_EQ(f.metadata().size(), 15u);
    using T = GgufValue::Type;
    EXPECT_EQ(f.Find("u8")->type, T::kU8);
    EXPECT_EQ(*f.Find("u8")->AsInt(), 200);
    EXPECT_EQ(*f.Find("i8")->AsInt(), -128);
    EXPECT_EQ(*f.Find("u16")->AsInt(), 65535);
    EXPECT_EQ(*f.Find("i16")->AsInt(), -32768);
    EXPECT_EQ(*f.Find("u32")->AsInt(), 4000000000);
    EXPECT_EQ(*f.Find("i32")->AsInt(), -1);
    EXPECT_EQ(f.Find("f32")->type, T::kF32);
    EXPECT_EQ(*f.Find("f32")->AsFloat(), 1.5);
    EXPECT_FALSE(f.Find("f32")->AsInt());
    EXPECT_EQ(std::get<bool>(f.Find("bool")->v), true);
    EXPECT_EQ(*f.Find("str")->AsString(), "hello");
    EXPECT_EQ(f.Find("u8")->AsString(), nullptr);
    const GgufArray* arr = f.Find("arr")->AsArray();
    ASSERT_NE(arr, nullptr);
    EXPECT_EQ(f.Find("arr")->array_type, T::kU32);
    ASSERT_EQ(arr->size(), 3u);
    EXPECT_EQ(*(*arr)[2].AsInt(), 9);
    const GgufArray* strs_v = f.Find("strs")->AsArray();
    ASSERT_EQ(strs_v->size(), 3u);
    EXPECT_EQ(*(*strs_v)[0].AsString(), "a");
    EXPECT_EQ(*(*strs_v)[1].AsString(), "");
    EXPECT_EQ(*(*strs_v)[2].AsString(), "xyz");
    const GgufArray* nest = f.Find("nested")->AsArray();
    ASSERT_EQ(nest->size(), 2u);
    ASSERT_EQ((*nest)[0].AsArray()->size(), 2u);
    EXPECT_EQ(*(*(*nest)[0].AsArray())[1].AsInt(), -2);
    EXPECT_EQ(*(*(*nest)[1].AsArray())[0].AsInt(), 3);
    EXPECT_FALSE(f.Find("u64")->AsInt());  // above INT64_MAX
    EXPECT_EQ(std::get<uint64_t>(f.Find("u64")->v), ~uint64_t{0});
    EXPECT_EQ(*f.Find("i64")->AsInt(), -5);
    EXPECT_EQ(*f.Find("f64")->AsFloat(), -0.25);
    EXPECT_EQ(GgufValueToString(*f.Find("arr")), "[7, 8, 9]");
    EXPECT_EQ(GgufValueToString(*f.Find("strs")), "[string x 3]");
    EXPECT_EQ(GgufValueToString(*f.Find("str")), "\"hello\"");
    EXPECT_EQ(f.Find("missing"), nullptr);
  }
}

TEST(GgufTest, TensorInfosShapesAndFloatTypes) {
  GgufBuilder g;
  Bytes f16, bf16;
  for (float v : {1.0f, -2.0f, 0.5f, 65504.0f}) Append(f16, EncU16(F32ToF16(v)));
  for (float v : {3.0f, -0.125f}) Append(bf16, EncU16(F32ToBF16(v)));
  g.Tensor({"w", {3, 2}, 0, F32Data({1, 2, 3, 4, 5, 6})})
      .Tensor({"h", {4}, 1, f16})
      .Tensor({"b", {2, 1}, 30, bf16});
  const Bytes b = g.Build();
  auto r = Parse(b);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->tensors().size(), 3u);
  const GgufTensorInfo* w = r->FindTensor("w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->ne, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(w->shape(), (std::vector<int64_t>{2, 3}));  // reversed: [m, k]
  EXPECT_EQ(w->nbytes, 24u);
  EXPECT_EQ(r->alignment(), 32u);
  EXPECT_EQ(r->data_offset() % 32, 0u);
  auto t = r->ReadF32(*w);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->shape(), (std::vector<int64_t>{2, 3}));
  for (int i = 0; i < 6; ++i) EXPECT_EQ(t->data_as<float>()[i], i + 1.0f);
  auto h = r->ReadF32(*r->FindTensor("h"));
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->data_as<float>()[1], -2.0f);
  EXPECT_EQ(h->data_as<float>()[3], 65504.0f);
  auto bt = r->ReadF32(*r->FindTensor("b"));
  ASSERT_TRUE(bt.ok());
  EXPECT_EQ(bt->shape(), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(bt->data_as<float>()[1], -0.125f);
  EXPECT_EQ(r->FindTensor("nope"), nullptr);
}

// Hand-built blocks; expected values written out from the block definitions, all exact in f32.
TEST(GgufTest, DequantizeQ8_0Block) {
  Bytes blk = EncU16(0x3800);  // d = 0.5
  for (int j = 0; j < 32; ++j) blk.push_back(static_cast<uint8_t>(static_cast<int8_t>(j * 8 - 128)));
  float y[32];
  ASSERT_TRUE(DequantizeGgml(GgmlType::kQ8_0, blk.data(), 32, y).ok());
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], (j * 8 - 128) * 0.5f) << j;
  EXPECT_EQ(y[0], -64.0f);
  EXPECT_EQ(y[31], 60.0f);
}

TEST(GgufTest, DequantizeQ4_0Block) {
  Bytes blk = EncU16(0x4000);  // d = 2
  for (int j = 0; j < 16; ++j) blk.push_back(static_cast<uint8_t>(j | ((15 - j) << 4)));
  float y[32];
  ASSERT_TRUE(DequantizeGgml(GgmlType::kQ4_0, blk.data(), 32, y).ok());
  // low nibble j -> element j, high nibble (15 - j) -> element j + 16; value (q - 8) * d
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], (j - 8) * 2.0f) << j;
    EXPECT_EQ(y[j + 16], (7 - j) * 2.0f) << j;
  }
  EXPECT_EQ(y[0], -16.0f);
  EXPECT_EQ(y[16], 14.0f);
}

TEST(GgufTest, DequantizeQ4_1Block) {
  Bytes blk = EncU16(0x3400);  // d = 0.25
  Append(blk, EncU16(0xbc00));  // m = -1
  for (int j = 0; j < 16; ++j) blk.push_back(static_cast<uint8_t>(j | ((15 - j) << 4)));
  float y[32];
  ASSERT_TRUE(DequantizeGgml(GgmlType::kQ4_1, blk.data(), 32, y).ok());
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], j * 0.25f - 1.0f) << j;
    EXPECT_EQ(y[j + 16], (15 - j) * 0.25f - 1.0f) << j;
  }
  EXPECT_EQ(y[0], -1.0f);
  EXPECT_EQ(y[16], 2.75f);
}

TEST(GgufTest, QuantizedTensorsThroughTheFile) {
  Bytes q8 = EncU16(0x3c00);  // d = 1, two blocks, a 2 x 32 tensor
  for (int j = 0; j < 32; ++j) q8.push_back(static_cast<uint8_t>(j));
  Append(q8, EncU16(0xc000));  // d = -2
  for (int j = 0; j < 32; ++j) q8.push_back(static_cast<uint8_t>(j));
  GgufBuilder g;
  g.Kv("general.alignment", kU32, EncU32(64)).alignment = 64;
  g.Tensor({"q", {32, 2}, 8, q8});
  const Bytes b = g.Build();
  auto r = Parse(b);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->alignment(), 64u);
  auto t = r->ReadF32(r->tensors()[0]);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->shape(), (std::vector<int64_t>{2, 32}));
  EXPECT_EQ(t->data_as<float>()[5], 5.0f);
  EXPECT_EQ(t->data_as<float>()[32 + 5], -10.0f);
}

TEST(GgufTest, BlockTableMatchesGgml) {
  EXPECT_EQ(GgmlTypeBlock(2)->bytes, 18);
  EXPECT_EQ(GgmlTypeBlock(3)->bytes, 20);
  EXPECT_EQ(GgmlTypeBlock(8)->bytes, 34);
  EXPECT_EQ(GgmlTypeBlock(12)->block, 256);
  EXPECT_FALSE(GgmlTypeBlock(4));
  EXPECT_EQ(GgmlTypeName(GgmlType::kQ4_1), "Q4_1");
  EXPECT_EQ(GgmlTypeName(static_cast<GgmlType>(12)), "Q4_K");
  EXPECT_TRUE(GgmlTypeCanDequantize(static_cast<GgmlType>(12)));
  EXPECT_FALSE(GgmlTypeCanDequantize(static_cast<GgmlType>(16)));  // IQ2_XXS
  float y[32];
  Bytes blk(18);
  EXPECT_EQ(DequantizeGgml(GgmlType::kQ4_0, blk.data(), 31, y).code(), StatusCode::kInvalidInput);
}

// ---- malformed files: one test per kind ---------------------------------------------------------

Bytes ValidFile() {
  GgufBuilder g;
  g.Kv("general.name", kString, EncStr("x")).Kv("n", kArray, EncArray(kU8, 2, Bytes{1, 2}));
  g.Tensor({"a", {4}, 0, F32Data({1, 2, 3, 4})}).Tensor({"b", {2}, 0, F32Data({5, 6})});
  return g.Build();
}

TEST(GgufMalformedTest, TruncatedHeader) {
  Bytes b = ValidFile();
  b.resize(12);
  EXPECT_THAT(ErrorOf(b), HasSubstr("truncated file: tensor count at offset 8"));
}

TEST(GgufMalformedTest, EveryTruncationFailsCleanly) {
  const Bytes full = ValidFile();
  for (size_t n = 0; n < full.size(); ++n) {
    Bytes b(full.begin(), full.begin() + n);
    auto r = Parse(b);
    EXPECT_FALSE(r.ok()) << "prefix of " << n << " bytes parsed";
  }
  EXPECT_TRUE(Parse(full).ok());
}

TEST(GgufMalformedTest, BadMagicAndVersion) {
  Bytes b = ValidFile();
  b[0] = 'X';
  EXPECT_THAT(ErrorOf(b), HasSubstr("bad magic"));
  b = ValidFile();
  b[4] = 1;
  EXPECT_THAT(ErrorOf(b), HasSubstr("version 1 is not supported"));
  b[4] = 0;
  b[7] = 3;  // big-endian 3
  EXPECT_THAT(ErrorOf(b), HasSubstr("unsupported GGUF version"));
}

TEST(GgufMalformedTest, StringLengthBeyondFile) {
  Bytes b = ValidFile();
  // First key: u64 length at offset 24 ("general.name").
  const Bytes huge = EncU64(uint64_t{1} << 40);
  std::memcpy(b.data() + 24, huge.data(), 8);
  EXPECT_THAT(ErrorOf(b), HasSubstr("string length 1099511627776 at offset 24 goes beyond the end"));
}

TEST(GgufMalformedTest, StringValueLengthBeyondFile) {
  GgufBuilder g;
  g.Kv("k", kString, EncStr("abc"));
  Bytes b = g.Build();
  // value string length sits after magic/version/counts (24), key (8 + 1) and type (4).
  const Bytes huge = EncU64(~uint64_t{0});
  std::memcpy(b.data() + 37, huge.data(), 8);
  EXPECT_THAT(ErrorOf(b), HasSubstr("metadata 'k': string length 18446744073709551615"));
}

TEST(GgufMalformedTest, ArrayLengthBeyondFile) {
  GgufBuilder g;
  g.Kv("arr", kArray, EncArray(kU32, 2, [] { Bytes e = EncU32(1); Append(e, EncU32(2)); return e; }()));
  Bytes b = g.Build();
  // count at 24 + (8 + 3) + 4 + 4 = 43
  const Bytes huge = EncU64(uint64_t{1} << 61);
  std::memcpy(b.data() + 43, huge.data(), 8);
  EXPECT_THAT(ErrorOf(b), HasSubstr("metadata 'arr': array length 2305843009213693952 at offset 43 goes beyond the end"));
}

TEST(GgufMalformedTest, ArrayOfStringsLengthBeyondFile) {
  GgufBuilder g;
  g.Kv("s", kArray, EncArray(kString, 1000, EncStr("only one")));
  EXPECT_THAT(ErrorOf(g.Build()), HasSubstr("array length 1000"));
}

TEST(GgufMalformedTest, CountsBeyondFile) {
  Bytes b = ValidFile();
  const Bytes huge = EncU64(uint64_t{1} << 50);
  std::memcpy(b.data() + 16, huge.data(), 8);
  EXPECT_THAT(ErrorOf(b), HasSubstr("metadata count 1125899906842624 at offset 16 goes beyond"));
  b = ValidFile();
  std::memcpy(b.data() + 8, huge.data(), 8);
  EXPECT_THAT(ErrorOf(b), HasSubstr("tensor count 1125899906842624 at offset 8 goes beyond"));
}

TEST(GgufMalformedTest, BadAlignment) {
  for (uint32_t al : {0u, 3u, 48u}) {
    GgufBuilder g;
    g.Kv("general.alignment", kU32, EncU32(al));
    EXPECT_THAT(ErrorOf(g.Build()), HasSubstr("bad alignment: general.alignment " + std::to_string(al) +
                                              " is not a nonzero power of two"));
  }
  GgufBuilder g;
  g.Kv("general.alignment", kU64, EncU64(32));
  EXPECT_THAT(ErrorOf(g.Build()), HasSubstr("general.alignment has type u64, expected u32"));
}

TEST(GgufMalformedTest, MisalignedTensorOffset) {
  GgufBuilder g;
  g.Tensor({"a", {4}, 0, F32Data({1, 2, 3, 4}), 16});
  EXPECT_THAT(ErrorOf(g.Build()), HasSubstr("tensor 'a': data offset 16 is not a multiple of the alignment 32"));
}

TEST(GgufMalformedTest, DuplicateKey) {
  GgufBuilder g;
  g.Kv("k", kU32, EncU32(1)).Kv("k", kU32, EncU32(2));
  EXPECT_THAT(ErrorOf(g.Build()), HasSubstr("duplicate metadata key 'k'"));
}

TEST(GgufMalformedTest, DuplicateTensorName) {
  GgufBuilder g;
  g.Tensor({"a", {4}, 0, F32Data({1, 2, 3, 4})}).Tensor({"a", {4}, 0, F32Data({1, 2, 3, 4})});
  EXPECT_THAT(ErrorOf(g.Build()), HasSubstr("duplicate tensor name 'a'"));
}

TEST(GgufMalformedTest, ZeroDimension) {
  GgufBuilder g;
  g.Tensor({"z", {4, 0}, 0, {}});
  EXPECT_THAT(ErrorOf(g.Build()), HasSubstr("tensor 'z': zero dimension at ne[1]"));
}

TEST(GgufMalformedTest, NegativeDimension) {
  GgufBuilder g;
  g.Tensor({"n", {4, -3}, 0, {}});
  EXPECT_THAT(ErrorOf(g.Build()), HasSubstr("tensor 'n': negative dimension -3 at ne[1]"));
}

TEST(GgufMalformedTest, HugeDimensionBeyondFile) {
  GgufBuilder g;
  g.Tensor({"h", {int64_t{1} << 40}, 0, {}});
  EXPECT_THAT(ErrorOf(g.Build()), HasSubstr("tensor 'h': data [0, +4398046511104) goes beyond the end of the file"));
}

TEST(GgufMalformedTest, DimensionProductOverflows) {
  GgufBuilder g;
  g.Tensor({"o", {int64_t{1} << 32, int64_t{1} << 32}, 0, {}});
  EXPECT_THAT(ErrorOf(g.Build()), HasSubstr("tensor 'o': dimension product overflows"));
  GgufBuilder g2;  // numel fits in int64, bytes do not
  g2.Tensor({"o", {int64_t{1} << 31, int64_t{1} << 31}, 0, {}});
  EXPECT_THAT(ErrorOf(g2.Build()), HasSubstr("tensor 'o': byte size overflows"));
}

TEST(GgufMalformedTest, TooManyDims) {
  GgufBuilder g;
  g.Tensor({"d", {1, 1, 1, 1, 1}, 0, {}});
  EXPECT_THAT(ErrorOf(g.Build()), HasSubstr("tensor 'd': 5 dimensions, at most 4"));
}

TEST(GgufMalformedTest, UnknownGgmlType) {
  GgufBuilder g;
  g.Tensor({"u", {32}, 200, Bytes(64)});
  EXPECT_THAT(ErrorOf(g.Build()), HasSubstr("tensor 'u': unknown ggml type 200"));
}

TEST(GgufMalformedTest, UnknownValueType) {
  GgufBuilder g;
  g.Kv("k", 13, EncU32(1));
  EXPECT_THAT(ErrorOf(g.Build()), HasSubstr("metadata 'k': unknown value type 13"));
}

TEST(GgufMalformedTest, RowNotMultipleOfBlock) {
  GgufBuilder g;
  g.Tensor({"q", {33, 2}, 2, Bytes(64)});
  EXPECT_THAT(ErrorOf(g.Build()), HasSubstr("tensor 'q': row length ne[0] = 33 is not a multiple of the block size 32 of Q4_0"));
}

TEST(GgufMalformedTest, TensorDataBeyondEnd) {
  Bytes b = ValidFile();
  b.resize(b.size() - 4);  // cut into tensor 'b'
  EXPECT_THAT(ErrorOf(b), HasSubstr("tensor 'b': data [32, +8) goes beyond the end of the file"));
}

TEST(GgufMalformedTest, OverlappingTensors) {
  GgufBuilder g;
  g.Tensor({"a", {16}, 0, Bytes(64), 0}).Tensor({"b", {4}, 0, Bytes(16), 32});
  EXPECT_THAT(ErrorOf(g.Build()), HasSubstr("tensors 'a' and 'b' overlap"));
}

TEST(GgufMalformedTest, NestedArraysTooDeep) {
  Bytes v = EncArray(kU8, 0, {});
  for (int i = 0; i < 10; ++i) v = EncArray(kArray, 1, v);
  GgufBuilder g;
  g.Kv("deep", kArray, v);
  EXPECT_THAT(ErrorOf(g.Build()), HasSubstr("arrays nested deeper than 8"));
}

TEST(GgufMalformedTest, UnsupportedTypeListedButNotDequantized) {
  GgufBuilder g;
  g.Tensor({"iq2", {256}, 16, Bytes(66)});
  const Bytes b = g.Build();
  auto r = Parse(b);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->tensors()[0].nbytes, 66u);
  auto t = r->ReadF32(r->tensors()[0]);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kUnsupported);
  EXPECT_THAT(t.status().message(), HasSubstr("tensor 'iq2': ggml type 16 (IQ2_XXS) cannot be dequantized"));
}

TEST(GgufMalformedTest, MissingFileIsIoError) {
  auto r = GgufFile::Open("/nonexistent/x.gguf");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kIoError);
  EXPECT_THAT(r.status().message(), HasSubstr("/nonexistent/x.gguf"));
}

}  // namespace
}  // namespace sparq
