// .npy reader/writer: files written by NumPy 2.4 (bytes embedded below), round trips, and one
// test per malformed-file kind, each expecting its message.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "sparq/npy.h"

namespace sparq {
namespace {

std::string Header(const std::string& dict, int version = 1) {
  std::string d = dict;
  const size_t prefix = version == 1 ? 10 : 12;
  while ((prefix + d.size() + 1) % 64) d += ' ';
  d += '\n';
  std::string s("\x93NUMPY", 6);
  s += static_cast<char>(version);
  s += '\0';
  s += static_cast<char>(d.size() & 0xff);
  s += static_cast<char>(d.size() >> 8);
  if (version != 1) s += std::string(2, '\0');
  return s + d;
}

std::string Bytes(const void* p, size_t n) { return std::string(static_cast<const char*>(p), n); }

Result<Tensor> ParseString(const std::string& s) {
  return ParseNpy(reinterpret_cast<const uint8_t*>(s.data()), s.size(), "t.npy");
}

void ExpectError(const std::string& file, const std::string& needle) {
  auto r = ParseString(file);
  ASSERT_FALSE(r.ok()) << needle;
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidInput);
  EXPECT_NE(r.status().message().find("t.npy"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
}

TEST(Npy, ReadsNumpyV1F32) {
  // np.save(np.array([[1.5, -2.0, 3.25], [0.0, 1e-3, -7.0]], dtype=np.float32)), NumPy 2.4.6.
  std::string file("\x93NUMPY\x01\x00v\x00", 10);
  file += "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  file += std::string(58, ' ') + "\n";
  ASSERT_EQ(file.size(), 128u);
  const unsigned char data[] = {0x00, 0x00, 0xc0, 0x3f, 0x00, 0x00, 0x00, 0xc0, 0x00, 0x00, 0x50, 0x40,
                                0x00, 0x00, 0x00, 0x00, 0x6f, 0x12, 0x83, 0x3a, 0x00, 0x00, 0xe0, 0xc0};
  file += Bytes(data, sizeof(data));
  auto t = ParseString(file);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->dtype(), DType::kF32);
  EXPECT_EQ(t->shape(), (std::vector<int64_t>{2, 3}));
  const float want[] = {1.5f, -2.0f, 3.25f, 0.0f, 1e-3f, -7.0f};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(t->data_as<float>()[i], want[i]);
}

TEST(Npy, ReadsNumpyV2F64) {
  // np.lib.format.write_array(f, np.array([1.0, 2.5]), version=(2, 0)), NumPy 2.4.6.
  std::string file("\x93NUMPY\x02\x00t\x00\x00\x00", 12);
  file += "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }";
  file += std::string(58, ' ') + "\n";
  const double data[] = {1.0, 2.5};
  file += Bytes(data, sizeof(data));
  auto t = ParseString(file);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->dtype(), DType::kF64);
  EXPECT_EQ(t->shape(), (std::vector<int64_t>{2}));
  EXPECT_EQ(t->data_as<double>()[1], 2.5);
}

// The fuzz seeds were written by NumPy 2.4.6 (np.save / write_array version 2.0).
TEST(Npy, ReadsNumpyWrittenSeedFiles) {
  const std::string dir = std::string(SPARQ_SOURCE_DIR) + "/fuzz/corpus/npy/";
  auto a = ReadNpy(dir + "f32_2x3.npy");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->shape(), (std::vector<int64_t>{2, 3}));
  for (int i = 0; i < 6; ++i) EXPECT_EQ(a->data_as<float>()[i], i);
  auto b = ReadNpy(dir + "f64_4.npy");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->data_as<double>()[2], 3e300);
  auto c = ReadNpy(dir + "f32_scalar.npy");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->data_as<float>()[0], 1.5f);
  auto d = ReadNpy(dir + "f64_v2_2x1x2.npy");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->shape(), (std::vector<int64_t>{2, 1, 2}));
  auto e = ReadNpy(dir + "f32_empty_0x3.npy");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->numel(), 0u);
  auto f = ReadNpyF32(dir + "f64_4.npy");  // 3e300 does not fit in f32
  EXPECT_FALSE(f.ok());
}

TEST(Npy, RoundTripsThroughFilesAtomically) {
  const auto dir = std::filesystem::temp_directory_path() / ("sparq_npy_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "a.npy").string();
  for (std::vector<int64_t> shape : {std::vector<int64_t>{}, {0}, {5}, {3, 4}, {2, 0, 3}, {2, 3, 4}}) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> f(n);
    std::vector<double> d(n);
    for (int64_t i = 0; i < n; ++i) {
      f[i] = 0.5f * i - 3;
      d[i] = 1.0 / (i + 1);
    }
    ASSERT_TRUE(WriteNpy(path, f.data(), shape).ok());
    auto t = ReadNpy(path);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    EXPECT_EQ(t->shape(), shape);
    EXPECT_EQ(0, n ? std::memcmp(t->data(), f.data(), n * 4) : 0);
    ASSERT_TRUE(WriteNpy(path, d.data(), shape).ok());
    auto t64 = ReadNpy(path);
    ASSERT_TRUE(t64.ok());
    EXPECT_EQ(t64->dtype(), DType::kF64);
    EXPECT_EQ(0, n ? std::memcmp(t64->data(), d.data(), n * 8) : 0);
    auto t32 = ReadNpyF32(path);
    ASSERT_TRUE(t32.ok());
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(t32->data_as<float>()[i], static_cast<float>(d[i]));
  }
  // Header is what NumPy writes (so np.load reads it) and the data is 64-byte aligned.
  std::ifstream in(path, std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), {});
  const std::string want = "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3, 4), }";
  EXPECT_EQ(all.substr(10, want.size()), want);
  EXPECT_EQ((all.size() - 24 * 8) % 64, 0u);
  // No temporary left behind; writing into a missing folder is an I/O error naming the path.
  size_t files = 0;
  for (auto& e : std::filesystem::directory_iterator(dir)) files += e.is_regular_file();
  EXPECT_EQ(files, 1u);
  auto bad = WriteNpy((dir / "missing" / "b.npy").string(), std::vector<float>{1}.data(), {1});
  EXPECT_EQ(bad.code(), StatusCode::kIoError);
  EXPECT_NE(bad.message().find("b.npy"), std::string::npos);
  EXPECT_EQ(ReadNpy((dir / "nope.npy").string()).status().code(), StatusCode::kIoError);
  std::filesystem::remove_all(dir);
}

TEST(Npy, RejectsMalformedFiles) {
  const std::string ok_dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }";
  const std::string data(16, '\0');
  ASSERT_TRUE(ParseString(Header(ok_dict) + data).ok());
  ExpectError("", "bad magic");
  ExpectError("PK\x03\x04 not numpy at all", "bad magic");
  ExpectError(std::string("\x93NUMPY\x01", 7), "bad magic");  // too short for the preamble
  std::string v4 = Header(ok_dict) + data;
  v4[6] = 4;
  ExpectError(v4, "unsupported .npy format version 4.0");
  ExpectError(Header(ok_dict).substr(0, 40), "truncated .npy header");
  ExpectError(Header(ok_dict) + data.substr(0, 15), "truncated .npy data");
  ExpectError(Header(ok_dict) + data + "x", "bytes after the data");
  ExpectError(Header("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }") + data,
              "Fortran-order");
  ExpectError(Header("{'descr': '<i4', 'fortran_order': False, 'shape': (2, 2), }") + data,
              "dtype '<i4' is not supported");
  ExpectError(Header("{'descr': '<f2', 'fortran_order': False, 'shape': (2, 2), }") + data,
              "dtype '<f2'");
  ExpectError(Header("{'descr': '>f4', 'fortran_order': False, 'shape': (2, 2), }") + data,
              "big-endian");
  ExpectError(Header("{'descr': '<f4', 'fortran_order': False, 'shape': (-2, 2), }") + data,
              "negative dimension");
  ExpectError(Header("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, "
                     "4294967296, 4294967296), }"),
              "t.npy");
  ExpectError(Header("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }"),
              "dimension too large");
  ExpectError(Header("{'descr': '<f4', 'fortran_order': False, 'shape': (1000000, 1000000), }") + data,
              "truncated .npy data");
  ExpectError(Header("{'descr': '<f4', 'shape': (2, 2), }") + data, "lacks");
  ExpectError(Header("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), 'x': 1}") + data,
              "unexpected header key");
  ExpectError(Header("{'descr': '<f4, 'fortran_order': False, 'shape': (2, 2), }") + data,
              "malformed .npy header");
  ExpectError(Header("['descr']") + data, "does not start with '{'");
  std::string huge_v2("\x93NUMPY\x02\x00\xff\xff\xff\x7f", 12);
  ExpectError(huge_v2 + "{}", "header length 2147483647 is absurd");
}

TEST(Npy, F64ToF32OverflowIsAnError) {
  const auto path = (std::filesystem::temp_directory_path() /
                     ("sparq_npy_big_" + std::to_string(getpid()) + ".npy")).string();
  const double v[] = {1.0, 1e300};
  ASSERT_TRUE(WriteNpy(path, v, {2}).ok());
  auto t = ReadNpyF32(path);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("flat index 1"), std::string::npos);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace sparq
