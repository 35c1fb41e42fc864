// NumPy .npy reader and writer (format spec: numpy/lib/format.py). The header is a Python dict
// literal: {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), } padded with spaces and a
// final '\n' so that the data starts at a multiple of 64 (16 in old files; both are accepted).
#include "sparq/npy.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string_view>

#include "sparq/checked.h"

namespace sparq {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;
// Longest header we accept: numpy itself writes a few hundred bytes; 1 MiB is generous and keeps
// a hostile v2 header length from making us read gigabytes.
constexpr uint32_t kMaxHeaderLen = 1u << 20;

struct NpyHeader {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t numel = 0;
  uint64_t data_offset = 0;
  uint64_t data_bytes = 0;
};

// A tiny scanner over the dict literal; every failure names the file.
class DictParser {
 public:
  DictParser(std::string_view s, const std::string& name) : s_(s), name_(name) {}

  Status Parse(std::string* descr, bool* fortran, std::vector<int64_t>* shape) {
    bool have_descr = false, have_fortran = false, have_shape = false;
    Skip();
    if (!Eat('{')) return Err("header does not start with '{'");
    for (;;) {
      Skip();
      if (Eat('}')) break;
      std::string key;
      SPARQ_RETURN_IF_ERROR(String(&key));
      Skip();
      if (!Eat(':')) return Err("expected ':' after key '" + key + "'");
      Skip();
      if (key == "descr") {
        SPARQ_RETURN_IF_ERROR(String(descr));
        have_descr = true;
      } else if (key == "fortran_order") {
        if (Word("True")) {
          *fortran = true;
        } else if (Word("False")) {
          *fortran = false;
        } else {
          return Err("fortran_order is neither True nor False");
        }
        have_fortran = true;
      } else if (key == "shape") {
        SPARQ_RETURN_IF_ERROR(Tuple(shape));
        have_shape = true;
      } else {
        return Err("unexpected header key '" + key + "'");
      }
      Skip();
      if (Eat(',')) continue;
      Skip();
      if (Eat('}')) break;
      return Err("expected ',' or '}' in header");
    }
    if (!have_descr || !have_fortran || !have_shape) {
      return Err("header lacks one of 'descr', 'fortran_order', 'shape'");
    }
    return Status::Ok();
  }

 private:
  Status Err(const std::string& what) const {
    return InvalidInput(name_ + ": malformed .npy header: " + what);
  }
  void Skip() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t')) ++pos_;
  }
  bool Eat(char c) {
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool Word(std::string_view w) {
    if (s_.substr(pos_, w.size()) == w) {
      pos_ += w.size();
      return true;
    }
    return false;
  }
  Status String(std::string* out) {
    if (pos_ >= s_.size() || (s_[pos_] != '\'' && s_[pos_] != '"')) return Err("expected a string");
    const char q = s_[pos_++];
    const size_t end = s_.find(q, pos_);
    if (end == std::string_view::npos) return Err("unterminated string");
    *out = std::string(s_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return Status::Ok();
  }
  Status Tuple(std::vector<int64_t>* shape) {
    if (!Eat('(')) return Err("shape is not a tuple");
    shape->clear();
    for (;;) {
      Skip();
      if (Eat(')')) return Status::Ok();
      if (pos_ < s_.size() && s_[pos_] == '-') return Err("negative dimension in shape");
      uint64_t v = 0;
      size_t digits = 0;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
        auto next = CheckedMul(v, 10);
        if (next) next = CheckedAdd(*next, static_cast<uint64_t>(s_[pos_] - '0'));
        if (!next || *next > static_cast<uint64_t>(INT64_MAX)) return Err("dimension too large");
        v = *next;
        ++pos_;
        ++digits;
      }
      if (digits == 0) return Err("expected a dimension in shape");
      if (Eat('L')) {  // Python 2 longs
      }
      shape->push_back(static_cast<int64_t>(v));
      if (shape->size() > 32) return Err("more than 32 dimensions");
      Skip();
      if (Eat(',')) continue;
      Skip();
      if (Eat(')')) return Status::Ok();
      return Err("expected ',' or ')' in shape");
    }
  }

  std::string_view s_;
  const std::string& name_;
  size_t pos_ = 0;
};

// Parses the preamble and header dict from the first `size` bytes of the file (which must hold the
// whole header; the caller passes file_size separately for the data-length check).
Result<NpyHeader> ParseHeader(const uint8_t* bytes, size_t size, uint64_t file_size,
                              const std::string& name) {
  if (size < kMagicLen + 2 || std::memcmp(bytes, kMagic, kMagicLen) != 0) {
    return InvalidInput(name + ": not a .npy file (bad magic; expected \\x93NUMPY)");
  }
  const int major = bytes[6];
  uint64_t header_len = 0, prefix = 0;
  if (major == 1) {
    if (size < 10) return InvalidInput(name + ": truncated .npy preamble");
    header_len = bytes[8] | (uint32_t{bytes[9]} << 8);
    prefix = 10;
  } else if (major == 2 || major == 3) {
    if (size < 12) return InvalidInput(name + ": truncated .npy preamble");
    header_len = bytes[8] | (uint32_t{bytes[9]} << 8) | (uint32_t{bytes[10]} << 16) |
                 (uint32_t{bytes[11]} << 24);
    prefix = 12;
  } else {
    return InvalidInput(name + ": unsupported .npy format version " + std::to_string(major) + "." +
                        std::to_string(bytes[7]) + " (1.0, 2.0 and 3.0 are supported)");
  }
  if (header_len > kMaxHeaderLen) {
    return InvalidInput(name + ": .npy header length " + std::to_string(header_len) +
                        " is absurd (max " + std::to_string(kMaxHeaderLen) + ")");
  }
  if (prefix + header_len > size) {
    return InvalidInput(name + ": truncated .npy header (needs " +
                        std::to_string(prefix + header_len) + " bytes, file has " +
                        std::to_string(file_size) + ")");
  }
  std::string_view dict(reinterpret_cast<const char*>(bytes + prefix), header_len);
  while (!dict.empty() && (dict.back() == '\n' || dict.back() == ' ' || dict.back() == '\0')) {
    dict.remove_suffix(1);
  }
  std::string descr;
  bool fortran = false;
  NpyHeader h;
  SPARQ_RETURN_IF_ERROR(DictParser(dict, name).Parse(&descr, &fortran, &h.shape));
  if (descr == "<f4") {
    h.dtype = DType::kF32;
  } else if (descr == "<f8") {
    h.dtype = DType::kF64;
  } else if (descr == ">f4" || descr == ">f8") {
    return InvalidInput(name + ": big-endian dtype '" + descr +
                        "' is not supported (save with dtype '<f4' or '<f8')");
  } else {
    return InvalidInput(name + ": dtype '" + descr +
                        "' is not supported (only float32 '<f4' and float64 '<f8')");
  }
  if (fortran) {
    return InvalidInput(name + ": Fortran-order arrays are not supported (use np.ascontiguousarray)");
  }
  SPARQ_ASSIGN_OR_RETURN(h.numel, CheckedNumel(std::span<const int64_t>(h.shape), name));
  auto bytes_needed = CheckedMul(h.numel, h.dtype == DType::kF32 ? 4 : 8);
  if (!bytes_needed) return InvalidInput(name + ": shape is absurd (byte size overflows)");
  h.data_offset = prefix + header_len;
  h.data_bytes = *bytes_needed;
  const uint64_t have = file_size - h.data_offset;
  if (have < h.data_bytes) {
    return InvalidInput(name + ": truncated .npy data: shape needs " + std::to_string(h.data_bytes) +
                        " bytes, file has " + std::to_string(have) + " after the header");
  }
  if (have > h.data_bytes) {
    return InvalidInput(name + ": .npy file has " + std::to_string(have - h.data_bytes) +
                        " bytes after the data the shape describes");
  }
  return h;
}

struct FileCloser {
  void operator()(FILE* f) const { std::fclose(f); }
};

std::string Descr(DType t) { return t == DType::kF32 ? "<f4" : t == DType::kF64 ? "<f8" : "<i4"; }

Status WriteRaw(const std::string& path, DType dtype, const void* data,
                const std::vector<int64_t>& shape) {
  SPARQ_ASSIGN_OR_RETURN(uint64_t numel, CheckedNumel(std::span<const int64_t>(shape), path));
  std::string dict = "{'descr': '" + Descr(dtype) + "', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < shape.size(); ++i) {
    dict += std::to_string(shape[i]);
    if (shape.size() == 1 || i + 1 < shape.size()) dict += ",";
    if (i + 1 < shape.size()) dict += " ";
  }
  dict += "), }";
  // Pad so that magic + version + length + dict + '\n' is a multiple of 64.
  const bool v2 = dict.size() + 1 + 10 > 65535;
  const size_t prefix = v2 ? 12 : 10;
  size_t total = prefix + dict.size() + 1;
  total = (total + 63) / 64 * 64;
  dict.append(total - prefix - dict.size() - 1, ' ');
  dict += '\n';
  std::string pre(kMagic, kMagicLen);
  pre += static_cast<char>(v2 ? 2 : 1);
  pre += '\0';
  const uint32_t hl = static_cast<uint32_t>(dict.size());
  pre += static_cast<char>(hl & 0xff);
  pre += static_cast<char>((hl >> 8) & 0xff);
  if (v2) {
    pre += static_cast<char>((hl >> 16) & 0xff);
    pre += static_cast<char>((hl >> 24) & 0xff);
  }
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::unique_ptr<FILE, FileCloser> f(std::fopen(tmp.c_str(), "wb"));
    if (!f) return IoError(path + ": cannot create '" + tmp + "': " + std::strerror(errno));
    const uint64_t nbytes = numel * (dtype == DType::kF64 ? 8 : 4);
    bool ok = std::fwrite(pre.data(), 1, pre.size(), f.get()) == pre.size() &&
              std::fwrite(dict.data(), 1, dict.size(), f.get()) == dict.size() &&
              (nbytes == 0 || std::fwrite(data, 1, nbytes, f.get()) == nbytes);
    ok = ok && std::fflush(f.get()) == 0 && ::fsync(::fileno(f.get())) == 0;
    if (!ok) {
      const std::string err = std::strerror(errno);
      f.reset();
      std::remove(tmp.c_str());
      return IoError(path + ": write failed: " + err);
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string err = std::strerror(errno);
    std::remove(tmp.c_str());
    return IoError(path + ": rename from '" + tmp + "' failed: " + err);
  }
  return Status::Ok();
}

}  // namespace

Result<Tensor> ParseNpy(const uint8_t* bytes, size_t size, const std::string& name) {
  SPARQ_ASSIGN_OR_RETURN(NpyHeader h, ParseHeader(bytes, size, size, name));
  SPARQ_ASSIGN_OR_RETURN(Tensor t, Tensor::TryAlloc(h.dtype, h.shape, name));
  if (h.data_bytes) std::memcpy(t.mutable_data(), bytes + h.data_offset, h.data_bytes);
  return t;
}

Result<Tensor> ReadNpy(const std::string& path) {
  std::unique_ptr<FILE, FileCloser> f(std::fopen(path.c_str(), "rb"));
  if (!f) return IoError(path + ": cannot open: " + std::strerror(errno));
  if (std::fseek(f.get(), 0, SEEK_END) != 0) return IoError(path + ": cannot seek");
  const long end = std::ftell(f.get());
  if (end < 0) return IoError(path + ": cannot tell file size");
  std::rewind(f.get());
  const uint64_t file_size = static_cast<uint64_t>(end);
  // Read the preamble, then exactly the header it announces (bounded by kMaxHeaderLen).
  std::vector<uint8_t> head(std::min<uint64_t>(file_size, 12));
  if (std::fread(head.data(), 1, head.size(), f.get()) != head.size()) {
    return IoError(path + ": read failed");
  }
  if (head.size() >= 12 && std::memcmp(head.data(), kMagic, kMagicLen) == 0) {
    const uint64_t hl = head[6] == 1 ? 10 + (head[8] | (uint32_t{head[9]} << 8))
                                     : 12 + (head[8] | (uint32_t{head[9]} << 8) |
                                             (uint32_t{head[10]} << 16) | (uint32_t{head[11]} << 24));
    const uint64_t want = std::min<uint64_t>(std::min<uint64_t>(hl, file_size), kMaxHeaderLen + 12);
    if (want > head.size()) {
      const size_t old = head.size();
      head.resize(want);
      if (std::fread(head.data() + old, 1, want - old, f.get()) != want - old) {
        return IoError(path + ": read failed");
      }
    }
  }
  SPARQ_ASSIGN_OR_RETURN(NpyHeader h, ParseHeader(head.data(), head.size(), file_size, path));
  SPARQ_ASSIGN_OR_RETURN(Tensor t, Tensor::TryAlloc(h.dtype, h.shape, path));
  if (std::fseek(f.get(), static_cast<long>(h.data_offset), SEEK_SET) != 0) {
    return IoError(path + ": cannot seek to data");
  }
  if (h.data_bytes && std::fread(t.mutable_data(), 1, h.data_bytes, f.get()) != h.data_bytes) {
    return IoError(path + ": short read of data");
  }
  return t;
}

Result<Tensor> ReadNpyF32(const std::string& path) {
  SPARQ_ASSIGN_OR_RETURN(Tensor t, ReadNpy(path));
  if (t.dtype() == DType::kF32) return t;
  Tensor out = Tensor::Alloc(DType::kF32, t.shape());
  const double* src = t.data_as<double>();
  float* dst = out.mutable_data_as<float>();
  for (uint64_t i = 0; i < t.numel(); ++i) {
    dst[i] = static_cast<float>(src[i]);
    if (std::isfinite(src[i]) && !std::isfinite(dst[i])) {
      return InvalidInput(path + ": value " + std::to_string(src[i]) + " at flat index " +
                          std::to_string(i) + " does not fit in float32");
    }
  }
  return out;
}

Result<std::vector<double>> ReadNpyF64(const std::string& path, std::vector<int64_t>* shape) {
  SPARQ_ASSIGN_OR_RETURN(Tensor t, ReadNpy(path));
  std::vector<double> out(t.numel());
  if (t.dtype() == DType::kF64) {
    if (t.numel()) std::memcpy(out.data(), t.data(), t.nbytes());
  } else {
    const float* src = t.data_as<float>();
    for (uint64_t i = 0; i < t.numel(); ++i) out[i] = src[i];
  }
  if (shape) *shape = t.shape();
  return out;
}

Status WriteNpy(const std::string& path, const Tensor& t) {
  if (t.dtype() != DType::kF32 && t.dtype() != DType::kF64) {
    return Unsupported(path + ": only f32 and f64 tensors can be written as .npy");
  }
  return WriteRaw(path, t.dtype(), t.data(), t.shape());
}
Status WriteNpy(const std::string& path, const float* data, const std::vector<int64_t>& shape) {
  return WriteRaw(path, DType::kF32, data, shape);
}
Status WriteNpy(const std::string& path, const double* data, const std::vector<int64_t>& shape) {
  return WriteRaw(path, DType::kF64, data, shape);
}
Status WriteNpy(const std::string& path, const int32_t* data, const std::vector<int64_t>& shape) {
  return WriteRaw(path, DType::kI32, data, shape);
}

}  // namespace sparq
