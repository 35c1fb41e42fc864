// Quantized dense matrices in a .sparq (checkpoint.h): codes, scales and mins are stored as parts
// `<name>.values` / `.scales` / `.mins` with "format": "dense" and "values": "<spec>", read back
// bit for bit, and a malformed file gives an error naming the tensor and the field.
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

// 6 x 70: short last groups for g32 and g64, and whole bytes of int4 codes.
DenseMatrix Quantized(const char* spec, uint32_t seed, int64_t rows = 6, int64_t cols = 70) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist;
  std::vector<float> w(rows * cols);
  for (auto& x : w) x = dist(rng);
  auto d = DenseMatrix::FromDense(w, rows, cols, DType::kBF16);
  EXPECT_TRUE(d.ok());
  auto q = DenseMatrix::Quantize(*d, *ValueSpec::Parse(spec));
  EXPECT_TRUE(q.ok()) << q.status().ToString();
  return *q;
}

TEST(DenseQuantCheckpointTest, QuantizeSaveLoadDequantizeIsBitExact) {
  const char* specs[] = {"int8:g32", "int8:g128", "int4:g64", "int4:g32:sym", "int4:g128"};
  Checkpoint ck;
  uint32_t seed = 3;
  for (const char* s : specs) {
    ck.matrices.push_back({std::string("d.") + s, Quantized(s, seed++), Pattern::Dense()});
  }
  ck.matrices.push_back({"odd", Quantized("int4:g32", 9, 3, 37), Pattern::Dense()});
  ck.matrices.push_back(
      {"plain", *DenseMatrix::FromDense(std::vector<float>(8, 0.5f), 2, 4), Pattern::Dense()});
  const std::string path = testing::TempDir() + "/dense_quant.sparq";
  ASSERT_TRUE(WriteCheckpoint(path, ck).ok());
  auto r = ReadCheckpoint(path);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->matrices.size(), ck.matrices.size());
  EXPECT_TRUE(r->tensors.empty());  // every part was claimed by its matrix
  for (const auto& want : ck.matrices) {
    SCOPED_TRACE(want.name);
    const CheckpointTensor* got = r->FindMatrix(want.name);
    ASSERT_NE(got, nullptr);
    const auto& a = std::get<DenseMatrix>(want.matrix);
    const auto* b = std::get_if<DenseMatrix>(&got->matrix);
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(ValuesName(got->matrix), ValuesName(want.matrix));
    EXPECT_EQ(b->quant.spec.Name(), a.quant.spec.Name());
    EXPECT_EQ(ByteSize(got->matrix), ByteSize(want.matrix));
    testing::ExpectSameBytesOf(a.values, b->values, "values");
    testing::ExpectSameBytesOf(a.quant.scales, b->quant.scales, "scales");
    testing::ExpectSameBytesOf(a.quant.mins, b->quant.mins, "mins");
    const Tensor da = ToDense(want.matrix), db = ToDense(got->matrix);
    testing::ExpectSameBytesOf(da, db, "dequantized");
  }
  auto st = SafetensorsFile::Open(path);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->Find("d.int8:g32"), nullptr);  // never a plain tensor under the name
  EXPECT_NE(st->Find("d.int8:g32.values"), nullptr);
  EXPECT_NE(st->Find("d.int4:g64.mins"), nullptr);
  EXPECT_EQ(st->Find("d.int4:g32:sym.mins"), nullptr);
  EXPECT_NE(st->Find("plain"), nullptr);
  auto doc = nlohmann::json::parse(st->metadata().at("sparq"));
  EXPECT_EQ(doc["format_version"], 2);  // the oldest version that reads it: no csr mask index
  EXPECT_EQ(doc["tensors"]["d.int8:g32"]["format"], "dense");
  EXPECT_EQ(doc["tensors"]["d.int8:g32"]["values"], "int8:g32");
  EXPECT_EQ(doc["tensors"]["d.int8:g32"]["dtype"], "i8");
  EXPECT_EQ(doc["tensors"]["d.int4:g64"]["dtype"], "u8");
  EXPECT_EQ(doc["tensors"]["plain"].count("values"), 0u);
}

// ---- malformed files: edit the flattened checkpoint and read it back ---------------------------

Flat FlatOf(const char* spec) {
  Checkpoint ck;
  ck.matrices.push_back({"w", Quantized(spec, 11), Pattern::Dense()});
  return testing::Flatten(ck);
}

TEST(DenseQuantCheckpointMalformedTest, NonFiniteScaleOrMin) {
  Flat f = FlatOf("int4:g32");  // 3 groups per row
  EditPart(f, "w.scales", [](Tensor& t) {
    t.mutable_data_as<uint16_t>()[4] = F32ToF16(std::numeric_limits<float>::quiet_NaN());
  });
  EXPECT_THAT(ErrorOf(f), HasSubstr("c.sparq: w.scales: row 1 group 1 has scale"));
  f = FlatOf("int8:g64");
  EditPart(f, "w.scales", [](Tensor& t) { t.mutable_data_as<uint16_t>()[0] = 0x7c00; });
  EXPECT_THAT(ErrorOf(f), HasSubstr("w.scales: row 0 group 0"));
  f = FlatOf("int4:g64");
  EditPart(f, "w.mins", [](Tensor& t) { t.mutable_data_as<uint16_t>()[1] = 0xfe00; });
  EXPECT_THAT(ErrorOf(f), HasSubstr("w.mins: row 0 group 1 has a non-finite min"));
}

TEST(DenseQuantCheckpointMalformedTest, WrongPartLengths) {
  Flat f = FlatOf("int8:g32");
  for (auto& t : f.tensors) {
    if (t.name == "w.values") t.tensor = Tensor::Alloc(DType::kI8, {6, 69});  // short codes
  }
  EXPECT_THAT(ErrorOf(f), HasSubstr("w.values: expected"));
  f = FlatOf("int4:g32");
  for (auto& t : f.tensors) {
    if (t.name == "w.scales") t.tensor = Tensor::Alloc(DType::kF16, {6, 2});
  }
  EXPECT_THAT(ErrorOf(f), HasSubstr("w.scales: expected"));
  f = FlatOf("int4:g32");
  std::erase_if(f.tensors, [](const NamedTensor& t) { return t.name == "w.mins"; });
  EXPECT_THAT(ErrorOf(f), HasSubstr("c.sparq: matrix 'w': part 'w.mins' is missing"));
  f = FlatOf("int4:g32:sym");
  std::erase_if(f.tensors, [](const NamedTensor& t) { return t.name == "w.scales"; });
  EXPECT_THAT(ErrorOf(f), HasSubstr("part 'w.scales' is missing"));
}

TEST(DenseQuantCheckpointMalformedTest, GroupOrSpecDisagreesWithTheParts) {
  Flat f = FlatOf("int8:g32");  // 70 columns: 3 groups of 32, g64 would have 2
  f.doc["tensors"]["w"]["values"] = "int8:g64";
  EXPECT_THAT(ErrorOf(f), HasSubstr("w.scales"));
  f = FlatOf("int8:g32");
  f.doc["tensors"]["w"]["values"] = "int8:g48";
  EXPECT_THAT(ErrorOf(f), HasSubstr("matrix 'w'"));
  f = FlatOf("int8:g32");
  f.doc["tensors"]["w"]["dtype"] = "u8";
  EXPECT_THAT(ErrorOf(f),
              HasSubstr("int8:g32 codes are stored as i8, the metadata says dtype 'u8'"));
  f = FlatOf("int8:g32");
  f.doc["tensors"]["w"].erase("values");  // the codes alone would be read as a plain `w`
  EXPECT_THAT(ErrorOf(f), HasSubstr("value dtype 'i8' is not f32, bf16 or f16"));
  f = FlatOf("int8:g32");
  EditPart(f, "w.values", [](Tensor& t) { t.mutable_data_as<int8_t>()[71] = -128; });
  EXPECT_THAT(ErrorOf(f), HasSubstr("w.values: row 1 column 1 has code -128"));
}

// The fuzz seeds of scripts/make_fuzz_seeds.py: the valid ones read (symmetric int4 seed with
// a negative scale and code 0), the broken one names its NaN scale.
TEST(DenseQuantCheckpointTest, FuzzSeedsRead) {
  const std::string dir = std::string(SPARQ_SOURCE_DIR) + "/fuzz/corpus/checkpoint/";
  for (const char* name : {"dense_int8_g32", "dense_int4_g32", "dense_int4_g32_sym"}) {
    auto r = ReadCheckpoint(dir + name + ".sparq");
    ASSERT_TRUE(r.ok()) << name << ": " << r.status().ToString();
    ASSERT_EQ(r->matrices.size(), 1u);
    EXPECT_TRUE(IsQuantized(r->matrices[0].matrix)) << name;
  }
  auto bad = ReadCheckpoint(dir + "broken_dense_nan_scale.sparq");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("w.scales: row 0 group 0 has scale"));
}

}  // namespace
}  // namespace sparq
