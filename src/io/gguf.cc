// GGUF parsing (ggml docs/gguf.md). Every read goes through Cursor, which checks the remaining
// length first; every count is capped by the bytes left before anything is reserved.
#include "sparq/gguf.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "sparq/checked.h"
#include "src/io/mmap_file.h"

namespace sparq {

namespace {

constexpr uint32_t kMaxDims = 4;        // GGML_MAX_DIMS
constexpr int kMaxArrayNesting = 8;     // nested arrays are legal but never deep in real files
constexpr uint64_t kDefaultAlignment = 32;

std::string Quote(const std::string& s) { return "'" + s + "'"; }

// Smallest encoded size of one value of type t (used to cap counts by the bytes left).
uint64_t MinValueBytes(GgufValue::Type t) {
  using T = GgufValue::Type;
  switch (t) {
    case T::kU8: case T::kI8: case T::kBool: return 1;
    case T::kU16: case T::kI16: return 2;
    case T::kU32: case T::kI32: case T::kF32: return 4;
    case T::kU64: case T::kI64: case T::kF64: return 8;
    case T::kString: return 8;      // the length
    case T::kArray: return 12;      // element type + count
  }
  return 1;
}

bool KnownValueType(uint32_t t) { return t <= 12; }

class Cursor {
 public:
  Cursor(const uint8_t* p, uint64_t size, const std::string& file) : p_(p), size_(size), file_(file) {}
  uint64_t pos() const { return pos_; }
  uint64_t left() const { return size_ - pos_; }

  Status Need(uint64_t n, const std::string& what) const {
    if (n > left()) {
      return InvalidInput(file_ + ": truncated file: " + what + " at offset " + std::to_string(pos_) +
                          " needs " + std::to_string(n) + " bytes, only " + std::to_string(left()) +
                          " left");
    }
    return Status::Ok();
  }
  template <typename T>
  Result<T> Read(const std::string& what) {
    SPARQ_RETURN_IF_ERROR(Need(sizeof(T), what));
    T v;
    std::memcpy(&v, p_ + pos_, sizeof(T));  // GGUF v2/v3 as read here is little-endian, like x86
    pos_ += sizeof(T);
    return v;
  }
  Result<std::string> String(const std::string& what) {
    SPARQ_ASSIGN_OR_RETURN(uint64_t len, Read<uint64_t>(what + " (string length)"));
    if (len > left()) {
      return InvalidInput(file_ + ": " + what + ": string length " + std::to_string(len) +
                          " at offset " + std::to_string(pos_ - 8) +
                          " goes beyond the end of the file (" + std::to_string(left()) +
                          " bytes left)");
    }
    std::string s(reinterpret_cast<const char*>(p_ + pos_), len);
    pos_ += len;
    return s;
  }

 private:
  const uint8_t* p_;
  uint64_t size_;
  uint64_t pos_ = 0;
  const std::string& file_;
};

}  // namespace

class GgufParser {
 public:
  GgufParser(GgufFile& f, Cursor& c) : f_(f), c_(c) {}

  Result<GgufValue> Value(uint32_t type, const std::string& what, int depth) {
    using T = GgufValue::Type;
    if (!KnownValueType(type)) {
      return InvalidInput(f_.path_ + ": " + what + ": unknown value type " + std::to_string(type));
    }
    GgufValue v;
    v.type = static_cast<T>(type);
    switch (v.type) {
      case T::kU8: { SPARQ_ASSIGN_OR_RETURN(uint8_t x, c_.Read<uint8_t>(what)); v.v = uint64_t{x}; break; }
      case T::kI8: { SPARQ_ASSIGN_OR_RETURN(int8_t x, c_.Read<int8_t>(what)); v.v = int64_t{x}; break; }
      case T::kU16: { SPARQ_ASSIGN_OR_RETURN(uint16_t x, c_.Read<uint16_t>(what)); v.v = uint64_t{x}; break; }
      case T::kI16: { SPARQ_ASSIGN_OR_RETURN(int16_t x, c_.Read<int16_t>(what)); v.v = int64_t{x}; break; }
      case T::kU32: { SPARQ_ASSIGN_OR_RETURN(uint32_t x, c_.Read<uint32_t>(what)); v.v = uint64_t{x}; break; }
      case T::kI32: { SPARQ_ASSIGN_OR_RETURN(int32_t x, c_.Read<int32_t>(what)); v.v = int64_t{x}; break; }
      case T::kU64: { SPARQ_ASSIGN_OR_RETURN(uint64_t x, c_.Read<uint64_t>(what)); v.v = x; break; }
      case T::kI64: { SPARQ_ASSIGN_OR_RETURN(int64_t x, c_.Read<int64_t>(what)); v.v = x; break; }
      case T::kF32: { SPARQ_ASSIGN_OR_RETURN(float x, c_.Read<float>(what)); v.v = double{x}; break; }
      case T::kF64: { SPARQ_ASSIGN_OR_RETURN(double x, c_.Read<double>(what)); v.v = x; break; }
      case T::kBool: {
        SPARQ_ASSIGN_OR_RETURN(uint8_t x, c_.Read<uint8_t>(what));
        if (x > 1) {
          return InvalidInput(f_.path_ + ": " + what + ": bool value " + std::to_string(x) +
                              " at offset " + std::to_string(c_.pos() - 1) + " is not 0 or 1");
        }
        v.v = x != 0;
        break;
      }
      case T::kString: { SPARQ_ASSIGN_OR_RETURN(std::string s, c_.String(what)); v.v = std::move(s); break; }
      case T::kArray: {
        if (depth >= kMaxArrayNesting) {
          return InvalidInput(f_.path_ + ": " + what + ": arrays nested deeper than " +
                              std::to_string(kMaxArrayNesting));
        }
        SPARQ_ASSIGN_OR_RETURN(uint32_t et, c_.Read<uint32_t>(what + " (array element type)"));
        if (!KnownValueType(et)) {
          return InvalidInput(f_.path_ + ": " + what + ": unknown array element type " +
                              std::to_string(et));
        }
        const uint64_t count_pos = c_.pos();
        SPARQ_ASSIGN_OR_RETURN(uint64_t count, c_.Read<uint64_t>(what + " (array length)"));
        const auto elem_min = MinValueBytes(static_cast<T>(et));
        if (count > c_.left() / elem_min) {
          return InvalidInput(f_.path_ + ": " + what + ": array length " + std::to_string(count) +
                              " at offset " + std::to_string(count_pos) +
                              " goes beyond the end of the file (" + std::to_string(c_.left()) +
                              " bytes left)");
        }
        auto arr = std::make_shared<GgufArray>();
        arr->reserve(count);
        for (uint64_t i = 0; i < count; ++i) {
          SPARQ_ASSIGN_OR_RETURN(GgufValue e, Value(et, what + "[" + std::to_string(i) + "]", depth + 1));
          arr->push_back(std::move(e));
        }
        v.array_type = static_cast<T>(et);
        v.v = std::move(arr);
        break;
      }
    }
    return v;
  }

  Status Parse() {
    const std::string& file = f_.path_;
    SPARQ_ASSIGN_OR_RETURN(uint32_t magic, c_.Read<uint32_t>("magic"));
    if (magic != 0x46554747u) {  // "GGUF" little-endian
      return InvalidInput(file + ": not a GGUF file (bad magic)");
    }
    SPARQ_ASSIGN_OR_RETURN(uint32_t version, c_.Read<uint32_t>("version"));
    if (version == 1) return InvalidInput(file + ": GGUF version 1 is not supported (only 2 and 3)");
    if (version != 2 && version != 3) {
      return InvalidInput(file + ": unsupported GGUF version " + std::to_string(version) +
                          " (only 2 and 3, little-endian)");
    }
    f_.version_ = version;
    const uint64_t nt_pos = c_.pos();
    SPARQ_ASSIGN_OR_RETURN(uint64_t n_tensors, c_.Read<uint64_t>("tensor count"));
    const uint64_t nkv_pos = c_.pos();
    SPARQ_ASSIGN_OR_RETURN(uint64_t n_kv, c_.Read<uint64_t>("metadata count"));
    // Cheapest possible entries: key "" + type + 1-byte value = 13 bytes; tensor info with empty
    // name and 0 dims = 8 + 4 + 4 + 8 = 24 bytes.
    if (n_kv > c_.left() / 13) {
      return InvalidInput(file + ": metadata count " + std::to_string(n_kv) + " at offset " +
                          std::to_string(nkv_pos) + " goes beyond the end of the file");
    }
    if (n_tensors > c_.left() / 24) {
      return InvalidInput(file + ": tensor count " + std::to_string(n_tensors) + " at offset " +
                          std::to_string(nt_pos) + " goes beyond the end of the file");
    }
    for (uint64_t i = 0; i < n_kv; ++i) {
      const std::string where = "metadata entry " + std::to_string(i);
      SPARQ_ASSIGN_OR_RETURN(std::string key, c_.String(where + " key"));
      SPARQ_ASSIGN_OR_RETURN(uint32_t type, c_.Read<uint32_t>("metadata " + Quote(key) + " type"));
      SPARQ_ASSIGN_OR_RETURN(GgufValue v, Value(type, "metadata " + Quote(key), 0));
      if (f_.metadata_.count(key)) return InvalidInput(file + ": duplicate metadata key " + Quote(key));
      f_.metadata_.emplace(std::move(key), std::move(v));
    }
    if (const GgufValue* a = f_.Find("general.alignment")) {
      if (a->type != GgufValue::Type::kU32) {
        return InvalidInput(file + ": general.alignment has type " + GgufValueTypeName(a->type) +
                            ", expected u32");
      }
      const uint64_t al = std::get<uint64_t>(a->v);
      if (al == 0 || (al & (al - 1)) != 0) {
        return InvalidInput(file + ": bad alignment: general.alignment " + std::to_string(al) +
                            " is not a nonzero power of two");
      }
      f_.alignment_ = al;
    } else {
      f_.alignment_ = kDefaultAlignment;
    }

    f_.tensors_.reserve(n_tensors);
    for (uint64_t i = 0; i < n_tensors; ++i) {
      GgufTensorInfo t;
      SPARQ_ASSIGN_OR_RETURN(t.name, c_.String("tensor info " + std::to_string(i) + " name"));
      const std::string what = file + ": tensor " + Quote(t.name);
      SPARQ_ASSIGN_OR_RETURN(uint32_t n_dims, c_.Read<uint32_t>("tensor " + Quote(t.name) + " n_dims"));
      if (n_dims > kMaxDims) {
        return InvalidInput(what + ": " + std::to_string(n_dims) + " dimensions, at most " +
                            std::to_string(kMaxDims));
      }
      for (uint32_t d = 0; d < n_dims; ++d) {
        SPARQ_ASSIGN_OR_RETURN(int64_t ne, c_.Read<int64_t>("tensor " + Quote(t.name) + " dimension"));
        if (ne < 0) {
          return InvalidInput(what + ": negative dimension " + std::to_string(ne) + " at ne[" +
                              std::to_string(d) + "]");
        }
        if (ne == 0) return InvalidInput(what + ": zero dimension at ne[" + std::to_string(d) + "]");
        t.ne.push_back(ne);
      }
      SPARQ_ASSIGN_OR_RETURN(uint32_t type, c_.Read<uint32_t>("tensor " + Quote(t.name) + " type"));
      SPARQ_ASSIGN_OR_RETURN(t.offset, c_.Read<uint64_t>("tensor " + Quote(t.name) + " offset"));
      const auto info = GgmlTypeBlock(type);
      if (!info) return InvalidInput(what + ": unknown ggml type " + std::to_string(type));
      t.type = static_cast<GgmlType>(type);
      SPARQ_ASSIGN_OR_RETURN(uint64_t numel, CheckedNumel(std::span<const int64_t>(t.ne), what));
      (void)numel;
      const int64_t ne0 = t.ne.empty() ? 1 : t.ne[0];
      if (ne0 % info->block != 0) {
        return InvalidInput(what + ": row length ne[0] = " + std::to_string(ne0) +
                            " is not a multiple of the block size " + std::to_string(info->block) +
                            " of " + GgmlTypeName(t.type));
      }
      std::optional<uint64_t> bytes = CheckedMul(static_cast<uint64_t>(ne0 / info->block),
                                                 static_cast<uint64_t>(info->bytes));
      for (size_t d = 1; d < t.ne.size() && bytes; ++d) bytes = CheckedMul(*bytes, t.ne[d]);
      if (!bytes) return InvalidInput(what + ": byte size overflows");
      t.nbytes = *bytes;
      if (t.offset % f_.alignment_ != 0) {
        return InvalidInput(what + ": data offset " + std::to_string(t.offset) +
                            " is not a multiple of the alignment " + std::to_string(f_.alignment_));
      }
      if (f_.tensor_index_.count(t.name)) return InvalidInput(file + ": duplicate tensor name " + Quote(t.name));
      f_.tensor_index_[t.name] = f_.tensors_.size();
      f_.tensors_.push_back(std::move(t));
    }

    // The data section starts at the next multiple of the alignment.
    const uint64_t end_of_infos = c_.pos();
    const uint64_t pad = (f_.alignment_ - end_of_infos % f_.alignment_) % f_.alignment_;
    const auto data_offset = CheckedAdd(end_of_infos, pad);
    if (!data_offset || (*data_offset > f_.size_ && !f_.tensors_.empty())) {
      return InvalidInput(file + ": data section at offset " + std::to_string(end_of_infos + pad) +
                          " goes beyond the end of the file (" + std::to_string(f_.size_) + " bytes)");
    }
    f_.data_offset_ = std::min(*data_offset, f_.size_);
    const uint64_t data_size = f_.size_ - f_.data_offset_;
    std::vector<const GgufTensorInfo*> by_offset;
    for (const auto& t : f_.tensors_) {
      const auto end = CheckedAdd(t.offset, t.nbytes);
      if (!end || *end > data_size) {
        return InvalidInput(file + ": tensor " + Quote(t.name) + ": data [" +
                            std::to_string(t.offset) + ", +" + std::to_string(t.nbytes) +
                            ") goes beyond the end of the file (data section is " +
                            std::to_string(data_size) + " bytes)");
      }
      by_offset.push_back(&t);
    }
    std::sort(by_offset.begin(), by_offset.end(),
              [](auto* a, auto* b) { return a->offset < b->offset; });
    for (size_t i = 1; i < by_offset.size(); ++i) {
      const auto* a = by_offset[i - 1];
      const auto* b = by_offset[i];
      if (a->offset + a->nbytes > b->offset) {
        return InvalidInput(file + ": tensors " + Quote(a->name) + " and " + Quote(b->name) +
                            " overlap (offsets " + std::to_string(a->offset) + " + " +
                            std::to_string(a->nbytes) + " > " + std::to_string(b->offset) + ")");
      }
    }
    return Status::Ok();
  }

 private:
  GgufFile& f_;
  Cursor& c_;
};

// ---- GgufValue -----------------------------------------------------------------------------

std::optional<int64_t> GgufValue::AsInt() const {
  using T = Type;
  switch (type) {
    case T::kU8: case T::kU16: case T::kU32: case T::kU64: {
      const uint64_t u = std::get<uint64_t>(v);
      if (u > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
      return static_cast<int64_t>(u);
    }
    case T::kI8: case T::kI16: case T::kI32: case T::kI64: return std::get<int64_t>(v);
    default: return std::nullopt;
  }
}

std::optional<double> GgufValue::AsFloat() const {
  if (type == Type::kF32 || type == Type::kF64) return std::get<double>(v);
  if (std::holds_alternative<uint64_t>(v)) return static_cast<double>(std::get<uint64_t>(v));
  if (std::holds_alternative<int64_t>(v)) return static_cast<double>(std::get<int64_t>(v));
  return std::nullopt;
}

const std::string* GgufValue::AsString() const {
  return type == Type::kString ? &std::get<std::string>(v) : nullptr;
}

const GgufArray* GgufValue::AsArray() const {
  return type == Type::kArray ? std::get<std::shared_ptr<GgufArray>>(v).get() : nullptr;
}

std::string GgufValueTypeName(GgufValue::Type t) {
  static const char* kNames[] = {"u8",  "i8",     "u16",   "i16", "u32", "i32", "f32",
                                 "bool", "string", "array", "u64", "i64", "f64"};
  const auto i = static_cast<uint32_t>(t);
  return i < 13 ? kNames[i] : "type" + std::to_string(i);
}

std::string GgufValueToString(const GgufValue& v) {
  using T = GgufValue::Type;
  switch (v.type) {
    case T::kBool: return std::get<bool>(v.v) ? "true" : "false";
    case T::kString: {
      const std::string& s = std::get<std::string>(v.v);
      std::string out(1, '"');
      for (size_t i = 0; i < s.size() && i < 64; ++i) {
        const unsigned char c = s[i];
        if (c == '\n') {
          out += "\\n";
        } else {
          out.push_back(c < 0x20 ? '?' : static_cast<char>(c));
        }
      }
      if (s.size() > 64) out += "...";
      out.push_back('"');
      return out;
    }
    case T::kArray: {
      const GgufArray* a = v.AsArray();
      if (a->size() > 8 || v.array_type == T::kString || v.array_type == T::kArray) {
        std::string out(1, '[');
        out += GgufValueTypeName(v.array_type);
        out += " x ";
        out += std::to_string(a->size());
        out.push_back(']');
        return out;
      }
      std::string out(1, '[');
      for (size_t i = 0; i < a->size(); ++i) {
        if (i) out += ", ";
        out += GgufValueToString((*a)[i]);
      }
      out.push_back(']');
      return out;
    }
    case T::kF32: case T::kF64: {
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%g", std::get<double>(v.v));
      return buf;
    }
    default:
      if (std::holds_alternative<uint64_t>(v.v)) return std::to_string(std::get<uint64_t>(v.v));
      return std::to_string(std::get<int64_t>(v.v));
  }
}

// ---- GgufTensorInfo / GgufFile -----------------------------------------------------------------

std::vector<int64_t> GgufTensorInfo::shape() const { return {ne.rbegin(), ne.rend()}; }

Result<GgufFile> GgufFile::Open(const std::string& path) {
  SPARQ_ASSIGN_OR_RETURN(io::ByteSource src, io::MapFile(path));
  GgufFile f;
  f.path_ = src.name;
  f.mapping_ = src.keepalive;
  f.base_ = src.data;
  f.size_ = src.size;
  Cursor c(f.base_, f.size_, f.path_);
  GgufParser p(f, c);
  SPARQ_RETURN_IF_ERROR(p.Parse());
  return f;
}

Result<GgufFile> GgufFile::FromMemory(const void* data, uint64_t size, const std::string& name) {
  GgufFile f;
  f.path_ = name;
  f.base_ = static_cast<const uint8_t*>(data);
  f.size_ = size;
  Cursor c(f.base_, f.size_, f.path_);
  GgufParser p(f, c);
  SPARQ_RETURN_IF_ERROR(p.Parse());
  return f;
}

const GgufValue* GgufFile::Find(const std::string& key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

const GgufTensorInfo* GgufFile::FindTensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const uint8_t* GgufFile::TensorData(const GgufTensorInfo& t) const {
  return base_ + data_offset_ + t.offset;
}

Result<Tensor> GgufFile::ReadF32(const GgufTensorInfo& t) const {
  const std::string what = path_ + ": tensor " + Quote(t.name);
  if (!GgmlTypeCanDequantize(t.type)) {
    return Unsupported(what + ": ggml type " + std::to_string(static_cast<uint32_t>(t.type)) +
                       " (" + GgmlTypeName(t.type) + ") cannot be dequantized by sparq");
  }
  SPARQ_ASSIGN_OR_RETURN(Tensor out, Tensor::TryAlloc(DType::kF32, t.shape(), what));
  const Status st = DequantizeGgml(t.type, TensorData(t), static_cast<int64_t>(out.numel()),
                                   out.mutable_data_as<float>());
  if (!st.ok()) return st.WithContext(what);
  return out;
}

}  // namespace sparq
