// IDX files (LeCun's MNIST format, also Fashion-MNIST's), plain or gzip-compressed, and the
// Fashion-MNIST data set read from a folder of them (`sparq train --task fashion-mnist`).
//
// Format (all integers big-endian): magic 0x00000803 (unsigned bytes, 3 dimensions) then
// count, rows, cols as u32, then count*rows*cols pixel bytes, row-major; labels: magic 0x00000801,
// count as u32, then count bytes. Rejected with a Status naming the file and the problem: bad
// magic, a zero dimension, data shorter or longer than the header says, a label >= num_classes, a
// corrupt or truncated gzip stream, a file larger than kIdxMaxBytes once decompressed (a lying
// header or a gzip bomb cannot cause a huge allocation). Nothing here aborts on file data.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sparq/status.h"

namespace sparq {

// Largest decompressed IDX file read (Fashion-MNIST's training images are 47 MB).
inline constexpr uint64_t kIdxMaxBytes = uint64_t{1} << 30;

struct IdxImages {
  int64_t count = 0, rows = 0, cols = 0;
  std::vector<uint8_t> pixels;  // [count, rows, cols], row-major
};

// Parses an in-memory (decompressed) IDX image; `name` is used in messages.
Result<IdxImages> ParseIdxImages(const uint8_t* bytes, size_t size, const std::string& name);
Result<std::vector<uint8_t>> ParseIdxLabels(const uint8_t* bytes, size_t size,
                                            const std::string& name, int num_classes);

// Reads a whole file, gunzipping it when it starts with gzip's magic (1f 8b).
Result<std::vector<uint8_t>> ReadMaybeGzip(const std::string& path);
Result<IdxImages> ReadIdxImages(const std::string& path);
Result<std::vector<uint8_t>> ReadIdxLabels(const std::string& path, int num_classes);

// Where Debian's `dataset-fashion-mnist` package installs the four files.
inline constexpr const char* kFashionMnistDefaultDir = "/usr/share/datasets/fashion-mnist";

struct FashionMnist {
  IdxImages train_images, test_images;  // 60000 and 10000 images of 28 x 28
  std::vector<uint8_t> train_labels, test_labels;
};

// Reads train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte and
// t10k-labels-idx1-ubyte from `dir` (each either as named or with ".gz"), checks 28 x 28 images,
// labels < 10 and that each image file has as many images as its label file has labels. A
// missing file gives kIoError naming the file and saying how to install the data set.
Result<FashionMnist> LoadFashionMnist(const std::string& dir);

}  // namespace sparq
