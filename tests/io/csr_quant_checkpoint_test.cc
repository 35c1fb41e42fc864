// Quantized CSR matrices in a .sparq (checkpoint.h): row_ptr, col_idx, codes, scales and mins are
// stored as parts `<name>.row_ptr` / `.col_idx` / `.values` / `.scales` / `.mins` with "format":
// "csr" and "values": "<spec>", read back bit for bit (quantize -> save -> load -> dequantize),
// and a malformed file gives an error naming the file, the tensor and the field.
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

// 6 x 150 at about half kept: short last groups for g32 / g64 / g128, odd nnz in some cases.
CsrMatrix Quantized(const char* spec, uint32_t seed, int64_t rows = 6, int64_t cols = 150) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist;
  std::bernoulli_distribution kept(0.5);
  std::vector<float> w(rows * cols);
  for (auto& x : w) x = kept(rng) ? dist(rng) : 0.0f;
  auto c = CsrMatrix::FromDense(w, rows, cols, DType::kBF16);
  EXPECT_TRUE(c.ok());
  auto q = CsrMatrix::Quantize(*c, *ValueSpec::Parse(spec));
  EXPECT_TRUE(q.ok()) << q.status().ToString();
  return *q;
}

TEST(CsrQuantCheckpointTest, QuantizeSaveLoadDequantizeIsBitExact) {
  const char* specs[] = {"int8:g32", "int8:g128", "int4:g64", "int4:g32:sym", "int4:g128"};
  Checkpoint ck;
  uint32_t seed = 3;
  for (const char* s : specs) {
    ck.matrices.push_back({std::string("c.") + s, Quantized(s, seed++), Pattern::Unstructured(0.5)});
  }
  ck.matrices.push_back({"odd", Quantized("int4:g32", 9, 3, 37), Pattern::Unstructured(0.5)});
  const std::string path = testing::TempDir() + "/csr_quant.sparq";
  ASSERT_TRUE(WriteCheckpoint(path, ck).ok());
  auto r = ReadCheckpoint(path);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->matrices.size(), ck.matrices.size());
  EXPECT_TRUE(r->tensors.empty());  // every part was claimed by its matrix
  for (const auto& want : ck.matrices) {
    SCOPED_TRACE(want.name);
    const CheckpointTensor* got = r->FindMatrix(want.name);
    ASSERT_NE(got, nullptr);
    const auto& a = std::get<CsrMatrix>(want.matrix);
    const auto* b = std::get_if<CsrMatrix>(&got->matrix);
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(ValuesName(got->matrix), ValuesName(want.matrix));
    EXPECT_EQ(ByteSize(got->matrix), ByteSize(want.matrix));
    testing::ExpectSameQuantizedRowParts(a, *b);
    testing::ExpectSameBytesOf(ToDense(want.matrix), ToDense(got->matrix), "dequantized");
  }
  auto st = SafetensorsFile::Open(path);
  ASSERT_TRUE(st.ok());
  EXPECT_NE(st->Find("c.int4:g64.mins"), nullptr);
  EXPECT_EQ(st->Find("c.int4:g32:sym.mins"), nullptr);
  auto doc = nlohmann::json::parse(st->metadata().at("sparq"));
  EXPECT_EQ(doc["tensors"]["c.int8:g32"]["format"], "csr");
  EXPECT_EQ(doc["tensors"]["c.int8:g32"]["values"], "int8:g32");
  EXPECT_EQ(doc["tensors"]["c.int8:g32"]["dtype"], "i8");
  EXPECT_EQ(doc["tensors"]["c.int4:g64"]["dtype"], "u8");
}

// ---- malformed files: edit the flattened checkpoint and read it back ---------------------------

Flat FlatOf(const char* spec) {
  Checkpoint ck;
  ck.matrices.push_back({"w", Quantized(spec, 11), Pattern::Unstructured(0.5)});
  return testing::Flatten(ck, {.csr_mask_index = false});
}

TEST(CsrQuantCheckpointMalformedTest, NonFiniteOrNegativeScaleOrMin) {
  Flat f = FlatOf("int4:g32");  // 5 groups per row
  EditPart(f, "w.scales", [](Tensor& t) {
    t.mutable_data_as<uint16_t>()[6] = F32ToF16(std::numeric_limits<float>::quiet_NaN());
  });
  EXPECT_THAT(ErrorOf(f), HasSubstr("c.sparq: w.scales: row 1 group 1 has scale"));
  f = FlatOf("int8:g64");
  EditPart(f, "w.scales", [](Tensor& t) { t.mutable_data_as<uint16_t>()[0] = 0xBC00; });
  EXPECT_THAT(ErrorOf(f), HasSubstr("w.scales: row 0 group 0 has scale -1"));
  f = FlatOf("int4:g64");
  EditPart(f, "w.mins", [](Tensor& t) { t.mutable_data_as<uint16_t>()[1] = 0xfe00; });
  EXPECT_THAT(ErrorOf(f), HasSubstr("w.mins: row 0 group 1 has a non-finite min"));
}

TEST(CsrQuantCheckpointMalformedTest, WrongOrMissingParts) {
  Flat f = FlatOf("int8:g32");
  EditPart(f, "w.values", [](Tensor& t) { t = Tensor::Alloc(DType::kI8, {int64_t(t.numel()) - 1}); });
  EXPECT_THAT(ErrorOf(f), HasSubstr("w.values: expected i8["));
  f = FlatOf("int4:g32");
  EditPart(f, "w.scales", [](Tensor& t) { t = Tensor::Alloc(DType::kF16, {6, 4}); });
  EXPECT_THAT(ErrorOf(f), HasSubstr("w.scales: expected f16[6, 5]"));
  f = FlatOf("int4:g32");
  std::erase_if(f.tensors, [](const NamedTensor& t) { return t.name == "w.mins"; });
  EXPECT_THAT(ErrorOf(f), HasSubstr("c.sparq: matrix 'w': part 'w.mins' is missing"));
  f = FlatOf("int4:g32:sym");
  std::erase_if(f.tensors, [](const NamedTensor& t) { return t.name == "w.scales"; });
  EXPECT_THAT(ErrorOf(f), HasSubstr("part 'w.scales' is missing"));
  f = FlatOf("int8:g32");
  EditPart(f, "w.values", [](Tensor& t) { t.mutable_data_as<int8_t>()[2] = -128; });
  EXPECT_THAT(ErrorOf(f), HasSubstr("w.values: value 2 has code -128"));
  f = FlatOf("int8:g32");
  EditPart(f, "w.col_idx", [](Tensor& t) { t.mutable_data_as<uint16_t>()[0] = 999; });
  EXPECT_THAT(ErrorOf(f), HasSubstr("w.col_idx[0] = 999"));
}

TEST(CsrQuantCheckpointMalformedTest, SpecOrDtypeDisagreesWithTheParts) {
  Flat f = FlatOf("int8:g32");  // 150 columns: 5 groups of 32, g64 would have 3
  f.doc["tensors"]["w"]["values"] = "int8:g64";
  EXPECT_THAT(ErrorOf(f), HasSubstr("w.scales"));
  f = FlatOf("int8:g32");
  f.doc["tensors"]["w"]["dtype"] = "u8";
  EXPECT_THAT(ErrorOf(f), HasSubstr("int8:g32 codes are stored as i8, the metadata says dtype 'u8'"));
  f = FlatOf("int8:g32");
  f.doc["tensors"]["w"].erase("values");  // i8 codes read as numbers
  EXPECT_THAT(ErrorOf(f), HasSubstr("value dtype 'i8' is not f32, bf16 or f16"));
  f = FlatOf("int4:g64");
  f.doc["tensors"]["w"]["values"] = "int8:g64";  // u8 codes under an int8 spec
  EXPECT_THAT(ErrorOf(f), HasSubstr("codes are stored as i8"));
}

// The fuzz seeds of scripts/make_fuzz_seeds.py: the valid ones read, the broken one names its
// NaN scale.
TEST(CsrQuantCheckpointTest, FuzzSeedsRead) {
  const std::string dir = std::string(SPARQ_SOURCE_DIR) + "/fuzz/corpus/checkpoint/";
  for (const char* name : {"csr_int8_g32", "csr_int4_g32", "csr_int4_g64_sym"}) {
    auto r = ReadCheckpoint(dir + name + ".sparq");
    ASSERT_TRUE(r.ok()) << name << ": " << r.status().ToString();
    ASSERT_EQ(r->matrices.size(), 1u);
    EXPECT_TRUE(IsQuantized(r->matrices[0].matrix)) << name;
  }
  // The version-3 seeds hold the same matrices with the index as a bit mask.
  for (const char* name : {"csr_int8_g32", "csr_int4_g32"}) {
    auto a = ReadCheckpoint(dir + name + ".sparq");
    auto b = ReadCheckpoint(dir + name + "_mask.sparq");
    ASSERT_TRUE(a.ok() && b.ok()) << name << ": " << b.status().ToString();
    const auto& x = std::get<CsrMatrix>(a->matrices[0].matrix);
    const auto& y = std::get<CsrMatrix>(b->matrices[0].matrix);
    for (auto [p, q] : {std::pair{&x.row_ptr, &y.row_ptr}, {&x.col_idx, &y.col_idx},
                        {&x.values, &y.values}, {&x.quant.scales, &y.quant.scales}}) {
      ASSERT_EQ(p->nbytes(), q->nbytes()) << name;
      EXPECT_EQ(std::memcmp(p->data(), q->data(), p->nbytes()), 0) << name;
    }
  }
  auto bad = ReadCheckpoint(dir + "broken_csr_nan_scale.sparq");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("w.scales: row 0 group 0 has scale"));
}

}  // namespace
}  // namespace sparq
