// safetensors reader/writer: round trips over every dtype, zero-copy views, atomic writes, and one
// test per malformed-file kind with its specific error.
#include <dirent.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>

#include "io/io_testutil.h"
#include "sparq/safetensors.h"

namespace sparq {
namespace {

using ::testing::HasSubstr;
using testing::Bytes;
using testing::MakeSafetensors;

Tensor Filled(DType dt, std::vector<int64_t> shape, uint8_t seed) {
  Tensor t = Tensor::Alloc(dt, std::move(shape));
  auto* p = static_cast<uint8_t*>(t.mutable_data());
  for (uint64_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<uint8_t>(seed + 7 * i);
  return t;
}

std::string ErrorOf(const Bytes& b) {
  auto r = SafetensorsFile::FromMemory(b.data(), b.size(), "t.safetensors");
  EXPECT_FALSE(r.ok()) << "expected a parse error";
  if (r.ok()) return "";
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidInput);
  return r.status().message();
}

TEST(SafetensorsTest, RoundTripEveryDtype) {
  const DType kTypes[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kF64, DType::kI8,
                          DType::kU8,  DType::kI16, DType::kU16,  DType::kI32, DType::kU32,
                          DType::kI64, DType::kU64, DType::kBool};
  std::vector<NamedTensor> ts;
  uint8_t seed = 1;
  for (DType dt : kTypes) {
    ts.push_back({"t_" + std::string(DTypeName(dt)), Filled(dt, {3, 5}, seed++)});
  }
  ts.push_back({"empty", Tensor::Alloc(DType::kF32, {0, 7})});
  ts.push_back({"scalar", Filled(DType::kF32, {}, 99)});
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"note", "\"quoted\"\n"}};
  const std::string path = testing::TempDir() + "/rt.safetensors";
  ASSERT_TRUE(WriteSafetensors(path, ts, meta).ok());
  auto r = SafetensorsFile::Open(path);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->metadata(), meta);
  ASSERT_EQ(r->tensors().size(), ts.size());
  for (const auto& t : ts) {
    const SafetensorsEntry* e = r->Find(t.name);
    ASSERT_NE(e, nullptr) << t.name;
    EXPECT_EQ(e->tensor.dtype(), t.tensor.dtype()) << t.name;
    EXPECT_EQ(e->tensor.shape(), t.tensor.shape()) << t.name;
    ASSERT_EQ(e->tensor.nbytes(), t.tensor.nbytes());
    if (t.tensor.nbytes()) {
      EXPECT_EQ(std::memcmp(e->tensor.data(), t.tensor.data(), t.tensor.nbytes()), 0) << t.name;
      // Zero copy: a view, naturally aligned thanks to the writer's ordering and header padding.
      EXPECT_FALSE(e->tensor.owned()) << t.name;
      EXPECT_EQ(reinterpret_cast<uintptr_t>(e->tensor.data()) % (DTypeBits(t.tensor.dtype()) / 8), 0u);
    }
  }
  EXPECT_EQ((8 + r->header_size()) % 64, 0u);
  // The bytes on disk are what SerializeSafetensors builds, and writing twice is deterministic.
  auto bytes = SerializeSafetensors(ts, meta);
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(*bytes, testing::ReadFile(path));
}

TEST(SafetensorsTest, ViewsOutliveTheFileObject) {
  const std::string path = testing::TempDir() + "/keep.safetensors";
  std::vector<NamedTensor> ts = {{"a", Filled(DType::kF32, {1000}, 3)}};
  ASSERT_TRUE(WriteSafetensors(path, ts).ok());
  Tensor view;
  {
    auto r = SafetensorsFile::Open(path);
    ASSERT_TRUE(r.ok());
    view = r->Find("a")->tensor;
  }
  EXPECT_EQ(std::memcmp(view.data(), ts[0].tensor.data(), 4000), 0);
}

TEST(SafetensorsTest, ReadsForeignLayoutAndCopiesMisalignedTensors) {
  // A u8 tensor of 3 bytes first, then an f32: the f32 lands on an odd address.
  const std::string h = R"({"b":{"dtype":"U8","shape":[3],"data_offsets":[0,3]},)"
                        R"("f":{"dtype":"F32","shape":[2],"data_offsets":[3,11]}})";
  Bytes data = {1, 2, 3};
  const float fv[2] = {1.5f, -2.0f};
  data.resize(11);
  std::memcpy(data.data() + 3, fv, 8);
  const Bytes b = MakeSafetensors(h, data);
  auto r = SafetensorsFile::FromMemory(b.data(), b.size());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const SafetensorsEntry* f = r->Find("f");
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->data_begin, 3u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(f->tensor.data()) % 4, 0u);
  EXPECT_EQ(f->tensor.data_as<float>()[1], -2.0f);
  EXPECT_EQ(r->tensors()[0].name, "b");  // data-section order
}

TEST(SafetensorsTest, AtomicWriteLeavesNoTemporaryFiles) {
  const std::string dir = testing::TempDir() + "/atomic";
  ASSERT_EQ(system(("mkdir -p " + dir).c_str()), 0);
  const std::string path = dir + "/m.safetensors";
  std::vector<NamedTensor> ts = {{"a", Filled(DType::kF32, {10}, 1)}};
  ASSERT_TRUE(WriteSafetensors(path, ts).ok());
  ts[0].tensor = Filled(DType::kF32, {20}, 2);
  ASSERT_TRUE(WriteSafetensors(path, ts).ok());  // replaces
  auto r = SafetensorsFile::Open(path);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->Find("a")->tensor.numel(), 20u);
  // A failing write (duplicate names) leaves the old file and no temporary.
  ts.push_back({"a", Filled(DType::kF32, {1}, 0)});
  EXPECT_FALSE(WriteSafetensors(path, ts).ok());
  int entries = 0;
  DIR* d = opendir(dir.c_str());
  while (dirent* e = readdir(d)) entries += e->d_name[0] != '.';
  closedir(d);
  EXPECT_EQ(entries, 1);
  EXPECT_EQ(WriteSafetensors("/nonexistent_dir/x.safetensors", {}).code(), StatusCode::kIoError);
}

TEST(SafetensorsTest, WriterRejectsBadInput) {
  std::vector<NamedTensor> ts = {{"", Tensor::Alloc(DType::kF32, {1})}};
  EXPECT_THAT(SerializeSafetensors(ts).status().message(), HasSubstr("empty tensor name"));
  ts = {{"__metadata__", Tensor::Alloc(DType::kF32, {1})}};
  EXPECT_FALSE(SerializeSafetensors(ts).ok());
  ts = {{"x", Tensor::Alloc(DType::kI4, {4})}};
  EXPECT_THAT(SerializeSafetensors(ts).status().message(), HasSubstr("has no safetensors name"));
}

// ---- malformed files --------------------------------------------------------------------------

const char kOk[] = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";

TEST(SafetensorsMalformedTest, ValidBaseline) {
  const Bytes b = MakeSafetensors(kOk, Bytes(8));
  EXPECT_TRUE(SafetensorsFile::FromMemory(b.data(), b.size()).ok());
}

TEST(SafetensorsMalformedTest, TruncatedHeader) {
  EXPECT_THAT(ErrorOf(Bytes{1, 2, 3}), HasSubstr("truncated header: 3 bytes, need at least 8"));
  EXPECT_THAT(ErrorOf(Bytes{}), HasSubstr("truncated header: 0 bytes"));
}

TEST(SafetensorsMalformedTest, EveryTruncationFailsCleanly) {
  std::vector<NamedTensor> ts = {{"a", Filled(DType::kF32, {3}, 1)}, {"b", Filled(DType::kU8, {5}, 2)}};
  auto full = SerializeSafetensors(ts, {{"k", "v"}});
  ASSERT_TRUE(full.ok());
  for (size_t n = 0; n < full->size(); ++n) {
    Bytes b(full->begin(), full->begin() + n);
    EXPECT_FALSE(SafetensorsFile::FromMemory(b.data(), b.size()).ok()) << n;
  }
}

TEST(SafetensorsMalformedTest, HeaderLengthBeyondFile) {
  Bytes b = MakeSafetensors(kOk, Bytes(8));
  b[5] = 1;  // header length += 2^40
  EXPECT_THAT(ErrorOf(b), HasSubstr("header length 1099511627830 goes beyond the end of the file (70 bytes)"));
}

TEST(SafetensorsMalformedTest, HeaderNotJson) {
  EXPECT_THAT(ErrorOf(MakeSafetensors("{\"a\":", {})), HasSubstr("header is not valid JSON"));
  EXPECT_THAT(ErrorOf(MakeSafetensors("[1,2]", {})), HasSubstr("header is not a JSON object"));
  EXPECT_THAT(ErrorOf(MakeSafetensors(std::string(100, '[') + std::string(100, ']'), {})),
              HasSubstr("nests deeper than 64"));
}

TEST(SafetensorsMalformedTest, DuplicateKeys) {
  const std::string h = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                        R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})";
  EXPECT_THAT(ErrorOf(MakeSafetensors(h, Bytes(8))), HasSubstr("header: duplicate key 'a'"));
  const std::string h2 = R"({"a":{"dtype":"F32","dtype":"F16","shape":[1],"data_offsets":[0,4]}})";
  EXPECT_THAT(ErrorOf(MakeSafetensors(h2, Bytes(4))), HasSubstr("duplicate key 'dtype'"));
}

TEST(SafetensorsMalformedTest, UnknownDtype) {
  const std::string h = R"({"a":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1]}})";
  EXPECT_THAT(ErrorOf(MakeSafetensors(h, Bytes(1))), HasSubstr("tensor 'a': unknown dtype 'F8_E4M3'"));
}

TEST(SafetensorsMalformedTest, NegativeDimension) {
  const std::string h = R"({"a":{"dtype":"F32","shape":[2,-1],"data_offsets":[0,8]}})";
  EXPECT_THAT(ErrorOf(MakeSafetensors(h, Bytes(8))), HasSubstr("tensor 'a': negative dimension -1 at axis 1"));
}

TEST(SafetensorsMalformedTest, HugeDimension) {
  const std::string h = R"({"a":{"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,8]}})";
  EXPECT_THAT(ErrorOf(MakeSafetensors(h, Bytes(8))),
              HasSubstr("tensor 'a': dimension 18446744073709551615 at axis 0 is too large"));
  const std::string h2 = R"({"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})";
  EXPECT_THAT(ErrorOf(MakeSafetensors(h2, Bytes(8))), HasSubstr("dimension at axis 0 is not an integer"));
}

TEST(SafetensorsMalformedTest, ZeroDimensionWithNonzeroSpan) {
  // Zero dims are legal (empty tensors) but then the tensor spans zero bytes.
  const std::string h = R"({"a":{"dtype":"F32","shape":[0,4],"data_offsets":[0,16]}})";
  EXPECT_THAT(ErrorOf(MakeSafetensors(h, Bytes(16))),
              HasSubstr("tensor 'a': data_offsets span 16 bytes but shape and dtype F32 need 0"));
}

TEST(SafetensorsMalformedTest, DimensionProductOverflows) {
  const std::string h = R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})";
  EXPECT_THAT(ErrorOf(MakeSafetensors(h, Bytes(8))), HasSubstr("tensor 'a': dimension product overflows"));
  const std::string h2 = R"({"a":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,8]}})";
  EXPECT_THAT(ErrorOf(MakeSafetensors(h2, Bytes(8))), HasSubstr("tensor 'a': dimension product overflows"));
}

TEST(SafetensorsMalformedTest, SpanDoesNotMatchShape) {
  const std::string h = R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})";
  EXPECT_THAT(ErrorOf(MakeSafetensors(h, Bytes(8))), HasSubstr("data_offsets span 8 bytes but shape and dtype F32 need 12"));
  const std::string h2 = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})";
  EXPECT_THAT(ErrorOf(MakeSafetensors(h2, Bytes(8))), HasSubstr("data_offsets begin 8 > end 0"));
  const std::string h3 = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})";
  EXPECT_THAT(ErrorOf(MakeSafetensors(h3, Bytes(8))), HasSubstr("data_offsets must be an array [begin, end]"));
  const std::string h4 = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}})";
  EXPECT_THAT(ErrorOf(MakeSafetensors(h4, Bytes(8))), HasSubstr("non-negative integers"));
}

TEST(SafetensorsMalformedTest, TensorDataBeyondEnd) {
  const std::string h = R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";
  EXPECT_THAT(ErrorOf(MakeSafetensors(h, Bytes(12))),
              HasSubstr("tensor 'a': tensor data [0, 16) goes beyond the end of the data section (12 bytes)"));
  const std::string h2 = R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[18446744073709551615,18446744073709551615]}})";
  EXPECT_THAT(ErrorOf(MakeSafetensors(h2, {})), HasSubstr("goes beyond the end of the data section"));
}

TEST(SafetensorsMalformedTest, OverlappingTensors) {
  const std::string h = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                        R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
  EXPECT_THAT(ErrorOf(MakeSafetensors(h, Bytes(12))), HasSubstr("tensors 'a' and 'b' overlap"));
}

TEST(SafetensorsMalformedTest, GapAndTrailingBytes) {
  const std::string h = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                        R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})";
  EXPECT_THAT(ErrorOf(MakeSafetensors(h, Bytes(12))), HasSubstr("gap in the data section: bytes [4, 8)"));
  EXPECT_THAT(ErrorOf(MakeSafetensors(kOk, Bytes(9))), HasSubstr("1 trailing bytes after the last tensor"));
}

TEST(SafetensorsMalformedTest, BadEntriesAndMetadata) {
  EXPECT_THAT(ErrorOf(MakeSafetensors(R"({"a":3})", {})), HasSubstr("tensor 'a': header entry is not a JSON object"));
  EXPECT_THAT(ErrorOf(MakeSafetensors(R"({"a":{"shape":[],"data_offsets":[0,0]}})", {})),
              HasSubstr("missing or non-string dtype"));
  EXPECT_THAT(ErrorOf(MakeSafetensors(R"({"__metadata__":{"k":1}})", {})),
              HasSubstr("__metadata__ value for 'k' is not a string"));
  EXPECT_THAT(ErrorOf(MakeSafetensors(R"({"__metadata__":[]})", {})), HasSubstr("__metadata__ is not a JSON object"));
}

TEST(SafetensorsMalformedTest, MissingFileIsIoError) {
  auto r = SafetensorsFile::Open("/nonexistent/x.safetensors");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kIoError);
}

}  // namespace
}  // namespace sparq
