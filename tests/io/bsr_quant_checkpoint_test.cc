// Quantized BSR matrices in a .sparq (checkpoint.h): row_ptr, col_idx, codes, scales and mins are
// stored as parts `<name>.row_ptr` / `.col_idx` / `.values` / `.scales` / `.mins` with "format":
// "bsr" and "values": "<spec>", read back bit for bit (quantize -> save -> load -> dequantize),
// and a malformed file gives an error naming the file, the tensor and the part.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>

#include "io/checkpoint_edit_testutil.h"
#include "io/io_testutil.h"
#include "sparq/checkpoint.h"

namespace sparq {
namespace {

using testing::EditPart;
using testing::ErrorOf;
using testing::Flat;
using ::testing::HasSubstr;

// rows x cols in blocks of bh x bw, about half of them kept.
BsrMatrix Quantized(const char* spec, uint32_t seed, int64_t rows = 10, int64_t cols = 150,
                    int bh = 4, int bw = 16) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist;
  std::vector<float> w(rows * cols, 0.0f);
  for (int64_t r0 = 0; r0 < rows; r0 += bh) {
    for (int64_t c0 = 0; c0 < cols; c0 += bw) {
      if (rng() % 2) continue;
      for (int64_t r = r0; r < std::min(rows, r0 + bh); ++r) {
        for (int64_t c = c0; c < std::min(cols, c0 + bw); ++c) w[r * cols + c] = dist(rng) + 4.0f;
      }
    }
  }
  auto x = BsrMatrix::FromDense(w, rows, cols, bh, bw, DType::kBF16);
  EXPECT_TRUE(x.ok()) << x.status().ToString();
  auto q = BsrMatrix::Quantize(*x, *ValueSpec::Parse(spec));
  EXPECT_TRUE(q.ok()) << q.status().ToString();
  return *q;
}

TEST(BsrQuantCheckpointTest, QuantizeSaveLoadDequantizeIsBitExact) {
  Checkpoint ck;
  uint32_t seed = 3;
  for (const char* s : {"int8:g32", "int8:g128", "int4:g64", "int4:g32:sym", "int4:g128"}) {
    ck.matrices.push_back(
        {std::string("b.") + s, Quantized(s, seed++), Pattern::Block(4, 16, 0.5)});
  }
  ck.matrices.push_back({"odd", Quantized("int4:g32", 9, 7, 37, 3, 5), Pattern::Block(3, 5, 0.5)});
  const std::string path = testing::TempDir() + "/bsr_quant.sparq";
  ASSERT_TRUE(WriteCheckpoint(path, ck).ok());
  auto r = ReadCheckpoint(path);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->matrices.size(), ck.matrices.size());
  EXPECT_TRUE(r->tensors.empty());  // every part was claimed by its matrix
  for (const auto& want : ck.matrices) {
    SCOPED_TRACE(want.name);
    const CheckpointTensor* got = r->FindMatrix(want.name);
    ASSERT_NE(got, nullptr);
    const auto& a = std::get<BsrMatrix>(want.matrix);
    const auto* b = std::get_if<BsrMatrix>(&got->matrix);
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(ValuesName(got->matrix), ValuesName(want.matrix));
    EXPECT_EQ(ByteSize(got->matrix), ByteSize(want.matrix));
    testing::ExpectSameQuantizedRowParts(a, *b);
    testing::ExpectSameBytesOf(ToDense(want.matrix), ToDense(got->matrix), "dequantized");
  }
  auto st = SafetensorsFile::Open(path);
  ASSERT_TRUE(st.ok());
  auto doc = nlohmann::json::parse(st->metadata().at("sparq"));
  EXPECT_EQ(doc["tensors"]["b.int8:g32"]["format"], "bsr");
  EXPECT_EQ(doc["tensors"]["b.int8:g32"]["values"], "int8:g32");
  EXPECT_EQ(doc["tensors"]["b.int4:g64"]["dtype"], "u8");
  EXPECT_NE(st->Find("b.int4:g64.mins"), nullptr);
}

Flat FlatOf(const char* spec) {
  Checkpoint ck;
  ck.matrices.push_back({"w", Quantized(spec, 11), Pattern::Block(4, 16, 0.5)});
  return testing::Flatten(ck);
}

// 10 x 150: 5 groups of 32 columns, 3 of 64.
TEST(BsrQuantCheckpointMalformedTest, NamesTheTensorAndThePart) {
  Flat f = FlatOf("int4:g32");
  EditPart(f, "w.scales", [](Tensor& t) {
    t.mutable_data_as<uint16_t>()[6] = F32ToF16(std::numeric_limits<float>::quiet_NaN());
  });
  EXPECT_THAT(ErrorOf(f), HasSubstr("c.sparq: w.scales: row 1 group 1 has scale"));
  f = FlatOf("int4:g64");
  EditPart(f, "w.mins", [](Tensor& t) { t.mutable_data_as<uint16_t>()[1] = 0xfe00; });
  EXPECT_THAT(ErrorOf(f), HasSubstr("w.mins: row 0 group 1 has a non-finite min"));
  f = FlatOf("int4:g32");
  EditPart(f, "w.scales", [](Tensor& t) { t = Tensor::Alloc(DType::kF16, {10, 4}); });
  EXPECT_THAT(ErrorOf(f), HasSubstr("w.scales: expected f16[10, 5]"));
  f = FlatOf("int4:g32");
  std::erase_if(f.tensors, [](const NamedTensor& t) { return t.name == "w.mins"; });
  EXPECT_THAT(ErrorOf(f), HasSubstr("c.sparq: matrix 'w': part 'w.mins' is missing"));
  f = FlatOf("int8:g32");
  EditPart(f, "w.values", [](Tensor& t) { t.mutable_data_as<int8_t>()[2] = -128; });
  EXPECT_THAT(ErrorOf(f), HasSubstr("w.values: block 0 row 0 value 2 has code -128"));
  f = FlatOf("int8:g32");
  f.doc["tensors"]["w"]["dtype"] = "u8";
  EXPECT_THAT(ErrorOf(f),
              HasSubstr("int8:g32 codes are stored as i8, the metadata says dtype 'u8'"));
  f = FlatOf("int8:g32");
  f.doc["tensors"]["w"].erase("values");  // i8 codes read as numbers
  EXPECT_THAT(ErrorOf(f), HasSubstr("value dtype 'i8' is not f32, bf16 or f16"));
}

TEST(BsrQuantCheckpointTest, FuzzSeedsRead) {
  const std::string dir = std::string(SPARQ_SOURCE_DIR) + "/fuzz/corpus/checkpoint/";
  for (const char* name : {"bsr_int8_g32", "bsr_int4_g64", "block_2x4_05_auto_int4_g32"}) {
    auto r = ReadCheckpoint(dir + name + ".sparq");
    ASSERT_TRUE(r.ok()) << name << ": " << r.status().ToString();
    ASSERT_FALSE(r->matrices.empty());
    EXPECT_TRUE(IsQuantized(r->matrices[0].matrix)) << name;
    EXPECT_EQ(KindOf(r->matrices[0].matrix), FormatKind::kBsr) << name;
  }
  auto bad = ReadCheckpoint(dir + "broken_bsr_nan_scale.sparq");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("w.scales: row 0 group 0 has scale"));
}

}  // namespace
}  // namespace sparq
