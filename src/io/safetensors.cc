#include "sparq/safetensors.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "sparq/checked.h"
#include "sparq/atomic_write.h"
#include "src/io/json_strict.h"
#include "src/io/mmap_file.h"

namespace sparq {

namespace {

using json = nlohmann::json;

std::string Quote(std::string_view s) {
  std::string q;
  q.reserve(s.size() + 2);
  q += '\'';
  q += s;
  q += '\'';
  return q;
}

Result<int64_t> ReadDim(const json& d, const std::string& what, size_t axis) {
  if (d.is_number_unsigned()) {
    const uint64_t u = d.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) {
      return InvalidInput(what + ": dimension " + std::to_string(u) + " at axis " +
                          std::to_string(axis) + " is too large");
    }
    return static_cast<int64_t>(u);
  }
  if (d.is_number_integer()) {
    const int64_t v = d.get<int64_t>();
    if (v < 0) {
      return InvalidInput(what + ": negative dimension " + std::to_string(v) + " at axis " +
                          std::to_string(axis));
    }
    return v;
  }
  return InvalidInput(what + ": dimension at axis " + std::to_string(axis) + " is not an integer");
}

Result<uint64_t> ReadOffset(const json& d, const std::string& what) {
  if (d.is_number_unsigned()) return d.get<uint64_t>();
  if (d.is_number_integer() && d.get<int64_t>() >= 0) return static_cast<uint64_t>(d.get<int64_t>());
  return InvalidInput(what + ": data_offsets must be two non-negative integers");
}

}  // namespace

const SafetensorsEntry* SafetensorsFile::Find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

Result<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  SPARQ_ASSIGN_OR_RETURN(io::ByteSource src, io::MapFile(path));
  return FromSource(src);
}

Result<SafetensorsFile> SafetensorsFile::FromMemory(const void* data, uint64_t size,
                                                    const std::string& name) {
  return FromSource(io::BorrowMemory(data, size, name));
}

Result<SafetensorsFile> SafetensorsFile::FromSource(const io::ByteSource& src) {
  const std::string& file = src.name;
  SafetensorsFile f;
  f.path_ = file;
  f.file_size_ = src.size;
  if (src.size < 8) {
    return InvalidInput(file + ": truncated header: " + std::to_string(src.size) +
                        " bytes, need at least 8 for the header length");
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | src.data[i];
  if (n > src.size - 8) {
    return InvalidInput(file + ": header length " + std::to_string(n) +
                        " goes beyond the end of the file (" + std::to_string(src.size) + " bytes)");
  }
  if (n > kMaxSafetensorsHeader) {
    return InvalidInput(file + ": header length " + std::to_string(n) + " exceeds the limit of " +
                        std::to_string(kMaxSafetensorsHeader) + " bytes");
  }
  f.header_size_ = n;
  const char* text = reinterpret_cast<const char*>(src.data + 8);
  SPARQ_ASSIGN_OR_RETURN(json header, io::ParseStrictJson(text, n, file + ": header"));
  if (!header.is_object()) return InvalidInput(file + ": header is not a JSON object");

  const uint64_t data_start = 8 + n;
  const uint64_t data_size = src.size - data_start;
  const uint8_t* data = src.data + data_start;

  for (auto& [key, val] : header.items()) {
    if (key == "__metadata__") {
      if (!val.is_object()) return InvalidInput(file + ": __metadata__ is not a JSON object");
      for (auto& [mk, mv] : val.items()) {
        if (!mv.is_string()) {
          return InvalidInput(file + ": __metadata__ value for " + Quote(mk) + " is not a string");
        }
        f.metadata_[mk] = mv.get<std::string>();
      }
      continue;
    }
    const std::string what = file + ": tensor " + Quote(key);
    if (!val.is_object()) return InvalidInput(what + ": header entry is not a JSON object");
    auto dt = val.find("dtype");
    auto sh = val.find("shape");
    auto off = val.find("data_offsets");
    if (dt == val.end() || !dt->is_string()) return InvalidInput(what + ": missing or non-string dtype");
    if (sh == val.end() || !sh->is_array()) return InvalidInput(what + ": missing or non-array shape");
    if (off == val.end() || !off->is_array() || off->size() != 2) {
      return InvalidInput(what + ": data_offsets must be an array [begin, end]");
    }
    const std::string dtype_name = dt->get<std::string>();
    const std::optional<DType> dtype = ParseSafetensorsDType(dtype_name);
    if (!dtype) return InvalidInput(what + ": unknown dtype " + Quote(dtype_name));
    std::vector<int64_t> shape;
    shape.reserve(sh->size());
    for (size_t i = 0; i < sh->size(); ++i) {
      SPARQ_ASSIGN_OR_RETURN(int64_t d, ReadDim((*sh)[i], what, i));
      shape.push_back(d);
    }
    SPARQ_ASSIGN_OR_RETURN(uint64_t numel, CheckedNumel(std::span<const int64_t>(shape), what));
    const auto bits = CheckedMul(numel, static_cast<uint64_t>(DTypeBits(*dtype)));
    if (!bits) return InvalidInput(what + ": dimension product overflows");
    const uint64_t need = (*bits + 7) / 8;
    SPARQ_ASSIGN_OR_RETURN(uint64_t begin, ReadOffset((*off)[0], what));
    SPARQ_ASSIGN_OR_RETURN(uint64_t end, ReadOffset((*off)[1], what));
    if (begin > end) {
      return InvalidInput(what + ": data_offsets begin " + std::to_string(begin) + " > end " +
                          std::to_string(end));
    }
    if (end > data_size) {
      return InvalidInput(what + ": tensor data [" + std::to_string(begin) + ", " +
                          std::to_string(end) + ") goes beyond the end of the data section (" +
                          std::to_string(data_size) + " bytes)");
    }
    if (end - begin != need) {
      return InvalidInput(what + ": data_offsets span " + std::to_string(end - begin) +
                          " bytes but shape and dtype " + dtype_name + " need " +
                          std::to_string(need));
    }
    SafetensorsEntry e;
    e.name = key;
    e.data_begin = begin;
    e.data_end = end;
    const uint8_t* p = data + begin;
    const uint64_t elem = static_cast<uint64_t>(std::max(1, DTypeBits(*dtype) / 8));
    if (reinterpret_cast<uintptr_t>(p) % elem == 0) {
      e.tensor = Tensor::View(*dtype, std::move(shape), need ? p : nullptr, src.keepalive);
    } else {
      e.tensor = Tensor::Alloc(*dtype, std::move(shape));
      std::memcpy(e.tensor.mutable_data(), p, need);
    }
    f.tensors_.push_back(std::move(e));
  }

  // Contiguous, non-overlapping coverage of the data section. Sort by (begin, end) so that
  // zero-length tensors sit before a tensor starting at the same offset.
  std::sort(f.tensors_.begin(), f.tensors_.end(), [](const auto& a, const auto& b) {
    return a.data_begin != b.data_begin ? a.data_begin < b.data_begin : a.data_end < b.data_end;
  });
  uint64_t covered = 0;
  const SafetensorsEntry* prev = nullptr;
  for (const auto& e : f.tensors_) {
    if (e.data_begin < covered) {
      return InvalidInput(file + ": tensors " + Quote(prev->name) + " and " + Quote(e.name) +
                          " overlap (data offsets " + std::to_string(e.data_begin) + " < " +
                          std::to_string(covered) + ")");
    }
    if (e.data_begin > covered) {
      return InvalidInput(file + ": gap in the data section: bytes [" + std::to_string(covered) +
                          ", " + std::to_string(e.data_begin) + ") before tensor " +
                          Quote(e.name) + " belong to no tensor");
    }
    covered = e.data_end;
    prev = &e;
  }
  if (covered != data_size) {
    return InvalidInput(file + ": " + std::to_string(data_size - covered) +
                        " trailing bytes after the last tensor's data");
  }
  for (size_t i = 0; i < f.tensors_.size(); ++i) f.index_[f.tensors_[i].name] = i;
  return f;
}

// ---- writer ------------------------------------------------------------------------------------

namespace {

struct Layout {
  std::string header;            // JSON padded with spaces
  std::vector<size_t> order;     // tensor indices in data order
  uint64_t data_size = 0;
};

Result<Layout> PlanLayout(std::span<const NamedTensor> tensors,
                          const std::map<std::string, std::string>& metadata) {
  Layout L;
  std::set<std::string_view> names;
  for (const auto& t : tensors) {
    if (t.name.empty()) return InvalidInput("safetensors writer: empty tensor name");
    if (t.name == "__metadata__") return InvalidInput("safetensors writer: tensor named __metadata__");
    if (!names.insert(t.name).second) {
      return InvalidInput("safetensors writer: duplicate tensor name " + Quote(t.name));
    }
    if (!SafetensorsDTypeName(t.tensor.dtype())) {
      return InvalidInput("safetensors writer: tensor " + Quote(t.name) + ": dtype " +
                          std::string(DTypeName(t.tensor.dtype())) + " has no safetensors name");
    }
    if (t.tensor.nbytes() > 0 && t.tensor.data() == nullptr) {
      return InvalidInput("safetensors writer: tensor " + Quote(t.name) + " has no data");
    }
  }
  L.order.resize(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) L.order[i] = i;
  std::stable_sort(L.order.begin(), L.order.end(), [&](size_t a, size_t b) {
    return DTypeBits(tensors[a].tensor.dtype()) > DTypeBits(tensors[b].tensor.dtype());
  });
  json header = json::object();
  if (!metadata.empty()) {
    json m = json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = std::move(m);
  }
  uint64_t off = 0;
  for (size_t i : L.order) {
    const Tensor& t = tensors[i].tensor;
    json e = json::object();
    e["dtype"] = std::string(*SafetensorsDTypeName(t.dtype()));
    e["shape"] = t.shape();
    e["data_offsets"] = {off, off + t.nbytes()};
    off += t.nbytes();
    header[tensors[i].name] = std::move(e);
  }
  L.data_size = off;
  L.header = header.dump();
  const uint64_t padded = (8 + L.header.size() + 63) / 64 * 64 - 8;
  L.header.append(padded - L.header.size(), ' ');
  return L;
}

void PutU64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

}  // namespace

Result<std::vector<uint8_t>> SerializeSafetensors(std::span<const NamedTensor> tensors,
                                                  const std::map<std::string, std::string>& metadata) {
  SPARQ_ASSIGN_OR_RETURN(Layout L, PlanLayout(tensors, metadata));
  std::vector<uint8_t> out(8 + L.header.size() + L.data_size);
  PutU64(out.data(), L.header.size());
  std::memcpy(out.data() + 8, L.header.data(), L.header.size());
  uint8_t* p = out.data() + 8 + L.header.size();
  for (size_t i : L.order) {
    const Tensor& t = tensors[i].tensor;
    if (t.nbytes()) std::memcpy(p, t.data(), t.nbytes());
    p += t.nbytes();
  }
  return out;
}

Status WriteSafetensors(const std::string& path, std::span<const NamedTensor> tensors,
                        const std::map<std::string, std::string>& metadata) {
  auto L = PlanLayout(tensors, metadata);
  if (!L.ok()) return L.status().WithContext(path);
  io::AtomicWriter w;
  SPARQ_RETURN_IF_ERROR(w.Open(path));
  uint8_t len[8];
  PutU64(len, L->header.size());
  SPARQ_RETURN_IF_ERROR(w.Write(len, 8));
  SPARQ_RETURN_IF_ERROR(w.Write(L->header.data(), L->header.size()));
  for (size_t i : L->order) {
    const Tensor& t = tensors[i].tensor;
    if (t.nbytes()) SPARQ_RETURN_IF_ERROR(w.Write(t.data(), t.nbytes()));
  }
  return w.Commit();
}

}  // namespace sparq
