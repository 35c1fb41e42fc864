// IDX reader: sparq/idx.h.

#include "sparq/idx.h"

#include <sys/stat.h>
#include <zlib.h>

#include <cstdio>
#include <memory>

#include "sparq/checked.h"

namespace sparq {
namespace {

constexpr uint32_t kMagicImages = 0x00000803;  // unsigned byte, 3 dimensions
constexpr uint32_t kMagicLabels = 0x00000801;  // unsigned byte, 1 dimension

uint32_t BigEndian32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

std::string Hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

}  // namespace

Result<IdxImages> ParseIdxImages(const uint8_t* bytes, size_t size, const std::string& name) {
  if (size < 16) {
    return InvalidInput(name + ": " + std::to_string(size) +
                        " bytes, shorter than an IDX image header (16)");
  }
  const uint32_t magic = BigEndian32(bytes);
  if (magic != kMagicImages) {
    return InvalidInput(name + ": magic " + Hex(magic) + ", not that of IDX images (" +
                        Hex(kMagicImages) + ")");
  }
  IdxImages out;
  out.count = BigEndian32(bytes + 4);
  out.rows = BigEndian32(bytes + 8);
  out.cols = BigEndian32(bytes + 12);
  if (out.count == 0 || out.rows == 0 || out.cols == 0) {
    return InvalidInput(name + ": zero dimension (" + std::to_string(out.count) + " images of " +
                        std::to_string(out.rows) + " x " + std::to_string(out.cols) + ")");
  }
  // u32 * u32 * u32 may overflow 64 bits: checked.
  const auto per = CheckedMul(static_cast<uint64_t>(out.rows), static_cast<uint64_t>(out.cols));
  const auto total = per ? CheckedMul(*per, static_cast<uint64_t>(out.count)) : std::nullopt;
  if (!total || *total > kIdxMaxBytes) {
    return InvalidInput(name + ": " + std::to_string(out.count) + " images of " +
                        std::to_string(out.rows) + " x " + std::to_string(out.cols) +
                        " is too large");
  }
  if (size - 16 != *total) {
    return InvalidInput(name + ": the header says " + std::to_string(*total) +
                        " pixel bytes, the file holds " + std::to_string(size - 16) +
                        (size - 16 < *total ? " (truncated)" : " (trailing bytes)"));
  }
  out.pixels.assign(bytes + 16, bytes + size);
  return out;
}

Result<std::vector<uint8_t>> ParseIdxLabels(const uint8_t* bytes, size_t size,
                                            const std::string& name, int num_classes) {
  if (size < 8) {
    return InvalidInput(name + ": " + std::to_string(size) +
                        " bytes, shorter than an IDX label header (8)");
  }
  const uint32_t magic = BigEndian32(bytes);
  if (magic != kMagicLabels) {
    return InvalidInput(name + ": magic " + Hex(magic) + ", not that of IDX labels (" +
                        Hex(kMagicLabels) + ")");
  }
  const uint64_t count = BigEndian32(bytes + 4);
  if (count == 0) return InvalidInput(name + ": zero labels");
  if (size - 8 != count) {
    return InvalidInput(name + ": the header says " + std::to_string(count) +
                        " labels, the file holds " + std::to_string(size - 8) +
                        (size - 8 < count ? " (truncated)" : " (trailing bytes)"));
  }
  for (uint64_t i = 0; i < count; ++i) {
    if (bytes[8 + i] >= num_classes) {
      return InvalidInput(name + ": label " + std::to_string(i) + " is " +
                          std::to_string(bytes[8 + i]) + ", not below " +
                          std::to_string(num_classes));
    }
  }
  return std::vector<uint8_t>(bytes + 8, bytes + size);
}

Result<std::vector<uint8_t>> ReadMaybeGzip(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return IoError(path + ": cannot open (no such file)");
  // gzopen reads a plain file transparently and gunzips a gzip one.
  std::unique_ptr<gzFile_s, int (*)(gzFile)> f(gzopen(path.c_str(), "rb"), gzclose);
  if (f == nullptr) return IoError(path + ": cannot open");
  std::vector<uint8_t> out;
  constexpr size_t kChunk = size_t{1} << 20;
  for (;;) {
    if (out.size() > kIdxMaxBytes) {
      return InvalidInput(path + ": larger than " + std::to_string(kIdxMaxBytes) +
                          " bytes once decompressed");
    }
    const size_t at = out.size();
    out.resize(at + kChunk);
    const int got = gzread(f.get(), out.data() + at, static_cast<unsigned>(kChunk));
    if (got < 0) {
      int errnum = 0;
      const char* msg = gzerror(f.get(), &errnum);
      return InvalidInput(path + ": corrupt gzip stream (" + (msg ? msg : "?") + ")");
    }
    out.resize(at + static_cast<size_t>(got));
    if (got == 0) break;
  }
  // A truncated gzip stream reads to its end without an error from gzread but sets one here.
  int errnum = 0;
  const char* msg = gzerror(f.get(), &errnum);
  if (errnum != Z_OK && errnum != Z_STREAM_END) {
    return InvalidInput(path + ": corrupt or truncated gzip stream (" + (msg ? msg : "?") + ")");
  }
  return out;
}

Result<IdxImages> ReadIdxImages(const std::string& path) {
  SPARQ_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, ReadMaybeGzip(path));
  return ParseIdxImages(bytes.data(), bytes.size(), path);
}

Result<std::vector<uint8_t>> ReadIdxLabels(const std::string& path, int num_classes) {
  SPARQ_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, ReadMaybeGzip(path));
  return ParseIdxLabels(bytes.data(), bytes.size(), path, num_classes);
}

namespace {

// `dir/name`, or `dir/name.gz` when only that exists.
Result<std::string> FindIdx(const std::string& dir, const std::string& name) {
  struct stat st {};
  const std::string plain = dir + "/" + name;
  if (::stat(plain.c_str(), &st) == 0) return plain;
  if (::stat((plain + ".gz").c_str(), &st) == 0) return plain + ".gz";
  return IoError(plain + "(.gz): not found; Fashion-MNIST is Debian's package "
                 "dataset-fashion-mnist (apt-get install dataset-fashion-mnist, or "
                 "scripts/install_deps.sh), installed in " +
                 std::string(kFashionMnistDefaultDir) + "; or pass --data DIR");
}

Result<std::pair<IdxImages, std::vector<uint8_t>>> LoadSplit(const std::string& dir,
                                                             const std::string& prefix) {
  SPARQ_ASSIGN_OR_RETURN(std::string ip, FindIdx(dir, prefix + "-images-idx3-ubyte"));
  SPARQ_ASSIGN_OR_RETURN(std::string lp, FindIdx(dir, prefix + "-labels-idx1-ubyte"));
  SPARQ_ASSIGN_OR_RETURN(IdxImages images, ReadIdxImages(ip));
  SPARQ_ASSIGN_OR_RETURN(std::vector<uint8_t> labels, ReadIdxLabels(lp, 10));
  if (images.rows != 28 || images.cols != 28) {
    return InvalidInput(ip + ": images of " + std::to_string(images.rows) + " x " +
                        std::to_string(images.cols) + ", Fashion-MNIST's are 28 x 28");
  }
  if (static_cast<size_t>(images.count) != labels.size()) {
    return InvalidInput(ip + ": " + std::to_string(images.count) + " images, but " + lp +
                        " holds " + std::to_string(labels.size()) + " labels");
  }
  return std::make_pair(std::move(images), std::move(labels));
}

}  // namespace

Result<FashionMnist> LoadFashionMnist(const std::string& dir) {
  FashionMnist d;
  SPARQ_ASSIGN_OR_RETURN(auto train, LoadSplit(dir, "train"));
  SPARQ_ASSIGN_OR_RETURN(auto test, LoadSplit(dir, "t10k"));
  d.train_images = std::move(train.first);
  d.train_labels = std::move(train.second);
  d.test_images = std::move(test.first);
  d.test_labels = std::move(test.second);
  return d;
}

}  // namespace sparq
