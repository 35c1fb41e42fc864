// Quantized V:N:M matrices in a .sparq (checkpoint.h): codes, the slab meta, scales and mins are
// stored as parts `<name>.values` / `.meta` (or `.meta_rank`) / `.scales` / `.mins` with "format":
// "vnm" and "values": "<spec>", read back bit for bit (quantize -> save -> load -> dequantize),
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

// rows x cols, slabs of v rows keeping the same 2 of each 4 columns (random per slab and group).
VnmMatrix Quantized(const char* spec, uint32_t seed, int64_t rows = 6, int64_t cols = 150,
                    int v = 2) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist;
  std::vector<float> w(rows * cols, 0.0f);
  for (int64_t s0 = 0; s0 < rows; s0 += v) {
    for (int64_t g = 0; g < cols; g += 4) {
      const int64_t len = std::min<int64_t>(4, cols - g);
      const int64_t a = rng() % len, b = len > 1 ? (a + 1 + rng() % (len - 1)) % len : a;
      for (int64_t r = s0; r < std::min(rows, s0 + v); ++r) {
        w[r * cols + g + a] = dist(rng);
        w[r * cols + g + b] = dist(rng);
      }
    }
  }
  auto x = VnmMatrix::FromDense(w, rows, cols, v, 2, 4, DType::kBF16);
  EXPECT_TRUE(x.ok()) << x.status().ToString();
  auto q = VnmMatrix::Quantize(*x, *ValueSpec::Parse(spec));
  EXPECT_TRUE(q.ok()) << q.status().ToString();
  return *q;
}

TEST(VnmQuantCheckpointTest, QuantizeSaveLoadDequantizeIsBitExact) {
  const char* specs[] = {"int8:g32", "int8:g128", "int4:g64", "int4:g32:sym", "int4:g128"};
  for (const bool rank : {true, false}) {
    SCOPED_TRACE(rank ? "meta as ranks" : "meta as bits");
    Checkpoint ck;
    uint32_t seed = 3;
    for (const char* s : specs) {
      ck.matrices.push_back({std::string("v.") + s, Quantized(s, seed++), Pattern::VNM(2, 2, 4)});
    }
    ck.matrices.push_back({"odd", Quantized("int4:g32", 9, 7, 37, 4), Pattern::VNM(4, 2, 4)});
    const std::string path = testing::TempDir() + "/vnm_quant.sparq";
    ASSERT_TRUE(WriteCheckpoint(path, ck, {.nm_rank_meta = rank}).ok());
    auto r = ReadCheckpoint(path);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->matrices.size(), ck.matrices.size());
    EXPECT_TRUE(r->tensors.empty());  // every part was claimed by its matrix
    for (const auto& want : ck.matrices) {
      SCOPED_TRACE(want.name);
      const CheckpointTensor* got = r->FindMatrix(want.name);
      ASSERT_NE(got, nullptr);
      const auto& a = std::get<VnmMatrix>(want.matrix);
      const auto* b = std::get_if<VnmMatrix>(&got->matrix);
      ASSERT_NE(b, nullptr);
      EXPECT_EQ(ValuesName(got->matrix), ValuesName(want.matrix));
      EXPECT_EQ(ByteSize(got->matrix), ByteSize(want.matrix));
      EXPECT_EQ(b->v, a.v);
      testing::ExpectSameBytesOf(a.values, b->values, "values");
      testing::ExpectSameBytesOf(a.meta, b->meta, "meta");
      testing::ExpectSameBytesOf(a.quant.scales, b->quant.scales, "scales");
      testing::ExpectSameBytesOf(a.quant.mins, b->quant.mins, "mins");
      testing::ExpectSameBytesOf(ToDense(want.matrix), ToDense(got->matrix), "dequantized");
    }
    auto st = SafetensorsFile::Open(path);
    ASSERT_TRUE(st.ok());
    EXPECT_NE(st->Find("v.int4:g64.mins"), nullptr);
    EXPECT_EQ(st->Find("v.int4:g32:sym.mins"), nullptr);
    auto doc = nlohmann::json::parse(st->metadata().at("sparq"));
    EXPECT_EQ(doc["tensors"]["v.int8:g32"]["format"], "vnm");
    EXPECT_EQ(doc["tensors"]["v.int8:g32"]["values"], "int8:g32");
    EXPECT_EQ(doc["tensors"]["v.int8:g32"]["dtype"], "i8");
    EXPECT_EQ(doc["tensors"]["v.int4:g64"]["dtype"], "u8");
  }
}

// ---- malformed files: edit the flattened checkpoint and read it back ---------------------------

Flat FlatOf(const char* spec) {
  Checkpoint ck;
  ck.matrices.push_back({"w", Quantized(spec, 11), Pattern::VNM(2, 2, 4)});
  return testing::Flatten(ck, {.nm_rank_meta = false});
}

// 150 columns: 38 groups of 4, 76 kept values a row: 3 groups of 32, 2 of 64.
TEST(VnmQuantCheckpointMalformedTest, NamesTheTensorAndThePart) {
  Flat f = FlatOf("int4:g32");
  EditPart(f, "w.scales", [](Tensor& t) {
    t.mutable_data_as<uint16_t>()[4] = F32ToF16(std::numeric_limits<float>::quiet_NaN());
  });
  EXPECT_THAT(ErrorOf(f), HasSubstr("c.sparq: w.scales: row 1 group 1 has scale"));
  f = FlatOf("int4:g64");
  EditPart(f, "w.mins", [](Tensor& t) { t.mutable_data_as<uint16_t>()[1] = 0xfe00; });
  EXPECT_THAT(ErrorOf(f), HasSubstr("w.mins: row 0 group 1 has a non-finite min"));
  f = FlatOf("int4:g32");
  EditPart(f, "w.scales", [](Tensor& t) { t = Tensor::Alloc(DType::kF16, {6, 2}); });
  EXPECT_THAT(ErrorOf(f), HasSubstr("w.scales: expected f16[6, 3]"));
  f = FlatOf("int8:g32");
  EditPart(f, "w.values", [](Tensor& t) { t = Tensor::Alloc(DType::kI8, {6, 75}); });
  EXPECT_THAT(ErrorOf(f), HasSubstr("w.values: expected i8[6, 76]"));
  f = FlatOf("int4:g32");
  std::erase_if(f.tensors, [](const NamedTensor& t) { return t.name == "w.mins"; });
  EXPECT_THAT(ErrorOf(f), HasSubstr("c.sparq: matrix 'w': part 'w.mins' is missing"));
  f = FlatOf("int8:g32");
  EditPart(f, "w.values", [](Tensor& t) { t.mutable_data_as<int8_t>()[76 + 2] = -128; });
  EXPECT_THAT(ErrorOf(f), HasSubstr("w.values: row 1 value 2 has code -128"));
  f = FlatOf("int8:g32");  // g64 would have 2 groups a row
  f.doc["tensors"]["w"]["values"] = "int8:g64";
  EXPECT_THAT(ErrorOf(f), HasSubstr("w.scales"));
  f = FlatOf("int8:g32");
  f.doc["tensors"]["w"]["dtype"] = "u8";
  EXPECT_THAT(ErrorOf(f),
              HasSubstr("int8:g32 codes are stored as i8, the metadata says dtype 'u8'"));
}

// The fuzz seeds of scripts/make_fuzz_seeds.py: the valid ones read, the broken one names its
// NaN scale.
TEST(VnmQuantCheckpointTest, FuzzSeedsRead) {
  const std::string dir = std::string(SPARQ_SOURCE_DIR) + "/fuzz/corpus/checkpoint/";
  for (const char* name : {"vnm_int8_g32", "vnm_int4_g64", "vnm_2_2_4_auto_int4_g32"}) {
    auto r = ReadCheckpoint(dir + name + ".sparq");
    ASSERT_TRUE(r.ok()) << name << ": " << r.status().ToString();
    ASSERT_FALSE(r->matrices.empty());
    EXPECT_TRUE(IsQuantized(r->matrices[0].matrix)) << name;
    EXPECT_EQ(KindOf(r->matrices[0].matrix), FormatKind::kVNM) << name;
  }
  auto bad = ReadCheckpoint(dir + "broken_vnm_nan_scale.sparq");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("w.scales: row 0 group 0 has scale"));
}

}  // namespace
}  // namespace sparq
