// IDX reader (sparq/idx.h): hand-made files, good and malformed (one test per kind, each expecting
// its message), plain and gzip-compressed, and the real Fashion-MNIST files of Debian's package.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "sparq/idx.h"
#include "tests/data_testutil.h"

namespace sparq {
namespace {

std::string Be32(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
          static_cast<char>(v)};
}

std::string Images(uint32_t count, uint32_t rows, uint32_t cols, size_t pixel_bytes) {
  std::string s = Be32(0x803) + Be32(count) + Be32(rows) + Be32(cols);
  for (size_t i = 0; i < pixel_bytes; ++i) s += static_cast<char>(i * 7);
  return s;
}

std::string Labels(const std::vector<uint8_t>& labels, uint32_t count) {
  std::string s = Be32(0x801) + Be32(count);
  for (uint8_t l : labels) s += static_cast<char>(l);
  return s;
}

Result<IdxImages> ParseImages(const std::string& s) {
  return ParseIdxImages(reinterpret_cast<const uint8_t*>(s.data()), s.size(), "x.idx");
}
Result<std::vector<uint8_t>> ParseLabels(const std::string& s) {
  return ParseIdxLabels(reinterpret_cast<const uint8_t*>(s.data()), s.size(), "y.idx", 10);
}

template <typename R>
void ExpectError(const R& r, const std::string& needle) {
  ASSERT_FALSE(r.ok()) << needle;
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidInput);
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
}

TEST(IdxTest, ParsesImagesAndLabels) {
  auto im = ParseImages(Images(2, 3, 4, 24));
  ASSERT_TRUE(im.ok()) << im.status().ToString();
  EXPECT_EQ(im->count, 2);
  EXPECT_EQ(im->rows, 3);
  EXPECT_EQ(im->cols, 4);
  ASSERT_EQ(im->pixels.size(), 24u);
  EXPECT_EQ(im->pixels[5], 35);
  auto lb = ParseLabels(Labels({0, 9, 3}, 3));
  ASSERT_TRUE(lb.ok()) << lb.status().ToString();
  EXPECT_EQ(*lb, (std::vector<uint8_t>{0, 9, 3}));
}

TEST(IdxTest, RejectsWrongMagic) {
  ExpectError(ParseImages(Labels(std::vector<uint8_t>(16, 1), 16)),
              "x.idx: magic 0x00000801, not that of IDX images");
  ExpectError(ParseLabels(Images(1, 1, 1, 1)), "y.idx: magic 0x00000803, not that of IDX labels");
}

TEST(IdxTest, RejectsShortHeaders) {
  ExpectError(ParseImages(Images(1, 1, 1, 0).substr(0, 15)), "x.idx: 15 bytes, shorter");
  ExpectError(ParseLabels(Be32(0x801)), "y.idx: 4 bytes, shorter");
}

TEST(IdxTest, RejectsTruncatedAndTrailingData) {
  ExpectError(ParseImages(Images(2, 3, 4, 23)), "23 (truncated)");
  ExpectError(ParseImages(Images(2, 3, 4, 25)), "25 (trailing bytes)");
  ExpectError(ParseLabels(Labels({1, 2}, 3)), "3 labels, the file holds 2 (truncated)");
  ExpectError(ParseLabels(Labels({1, 2, 3}, 2)), "(trailing bytes)");
}

TEST(IdxTest, RejectsZeroAndHugeDimensions) {
  ExpectError(ParseImages(Images(0, 28, 28, 0)), "zero dimension");
  ExpectError(ParseImages(Images(1, 0, 28, 0)), "zero dimension");
  ExpectError(ParseLabels(Labels({}, 0)), "zero labels");
  // 2^32-1 cubed overflows 64 bits; 65536^2 * 1024 passes it but exceeds kIdxMaxBytes.
  ExpectError(ParseImages(Images(0xffffffffu, 0xffffffffu, 0xffffffffu, 4)), "too large");
  ExpectError(ParseImages(Images(1024, 65536, 65536, 4)), "too large");
}

TEST(IdxTest, RejectsLabelOutOfRange) {
  ExpectError(ParseLabels(Labels({1, 10, 2}, 3)), "y.idx: label 1 is 10, not below 10");
  ExpectError(ParseLabels(Labels({255}, 1)), "label 0 is 255");
}

class IdxFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("sparq_idx_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& bytes) {
    const std::string p = (dir_ / name).string();
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }
  std::string WriteGz(const std::string& name, const std::string& bytes) {
    const std::string p = (dir_ / name).string();
    gzFile f = gzopen(p.c_str(), "wb");
    EXPECT_NE(f, nullptr);
    EXPECT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())),
              static_cast<int>(bytes.size()));
    gzclose(f);
    return p;
  }
  std::filesystem::path dir_;
};

TEST_F(IdxFileTest, ReadsPlainAndGzipFilesAlike) {
  const std::string im = Images(3, 28, 28, 3 * 784);
  auto a = ReadIdxImages(Write("a", im));
  auto b = ReadIdxImages(WriteGz("b.gz", im));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(a->pixels, b->pixels);
}

TEST_F(IdxFileTest, RejectsTruncatedGzipNamingTheFile) {
  const std::string gz = WriteGz("full.gz", Images(50, 28, 28, 50 * 784));
  std::string bytes;
  {
    std::ifstream in(gz, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const std::string cut = Write("cut.gz", bytes.substr(0, bytes.size() / 2));
  auto r = ReadIdxImages(cut);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(cut), std::string::npos) << r.status().message();
}

TEST_F(IdxFileTest, MissingFolderSaysHowToInstall) {
  auto r = LoadFashionMnist((dir_ / "nowhere").string());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kIoError);
  EXPECT_NE(r.status().message().find("train-images-idx3-ubyte"), std::string::npos);
  EXPECT_NE(r.status().message().find("apt-get install dataset-fashion-mnist"), std::string::npos);
}

TEST_F(IdxFileTest, LoadChecksCountsAndShapes) {
  Write("train-images-idx3-ubyte", Images(2, 28, 28, 2 * 784));
  Write("train-labels-idx1-ubyte", Labels({1, 2, 3}, 3));
  Write("t10k-images-idx3-ubyte", Images(1, 28, 28, 784));
  WriteGz("t10k-labels-idx1-ubyte.gz", Labels({4}, 1));
  auto r = LoadFashionMnist(dir_.string());
  ExpectError(r, "2 images, but");
  Write("train-labels-idx1-ubyte", Labels({1, 2}, 2));
  auto ok = LoadFashionMnist(dir_.string());
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->test_labels, std::vector<uint8_t>{4});
  Write("t10k-images-idx3-ubyte", Images(1, 14, 56, 784));
  ExpectError(LoadFashionMnist(dir_.string()), "Fashion-MNIST's are 28 x 28");
}

// The real data set (Debian's dataset-fashion-mnist, installed by scripts/install_deps.sh).
TEST(IdxTest, ReadsDebiansFashionMnist) {
  SPARQ_REQUIRE_FILE(std::string(kFashionMnistDefaultDir) + "/train-images-idx3-ubyte.gz",
                     "apt-get install dataset-fashion-mnist (or scripts/install_deps.sh)");
  auto r = LoadFashionMnist(kFashionMnistDefaultDir);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->train_images.count, 60000);
  EXPECT_EQ(r->test_images.count, 10000);
  std::vector<int> per_class(10);
  for (uint8_t l : r->test_labels) ++per_class[l];
  for (int c : per_class) EXPECT_EQ(c, 1000);  // the test set is balanced
}

}  // namespace
}  // namespace sparq
