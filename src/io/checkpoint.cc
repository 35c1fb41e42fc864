// The sparq checkpoint (see include/sparq/checkpoint.h for the layout).
#include "sparq/checkpoint.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <variant>

#include "sparq/checked.h"
#include "src/formats/nm_codec.h"
#include "src/io/json_strict.h"
#include "src/io/mmap_file.h"

namespace sparq {

namespace {

using json = nlohmann::json;

std::string Quote(const std::string& s) { return "'" + s + "'"; }

// Parts of a matrix as (suffix, tensor); suffix "" means the tensor is stored under the name.
std::vector<std::pair<std::string, const Tensor*>> PartsOf(const SparseMatrix& s) {
  struct V {
    std::vector<std::pair<std::string, const Tensor*>> operator()(const DenseMatrix& x) const {
      // Quantized: codes, scales and mins are parts like N:M's, never a plain `<name>` tensor
      // that a reader unaware of "values" would take for the weights.
      if (!x.quant.quantized()) return {{"", &x.values}};
      std::vector<std::pair<std::string, const Tensor*>> p = {{"values", &x.values},
                                                              {"scales", &x.quant.scales}};
      if (x.quant.spec.has_min()) p.push_back({"mins", &x.quant.mins});
      return p;
    }
    std::vector<std::pair<std::string, const Tensor*>> operator()(const CooMatrix& x) const {
      return {{"row_idx", &x.row_idx}, {"col_idx", &x.col_idx}, {"values", &x.values}};
    }
    std::vector<std::pair<std::string, const Tensor*>> operator()(const CsrMatrix& x) const {
      std::vector<std::pair<std::string, const Tensor*>> p = {
          {"row_ptr", &x.row_ptr}, {"col_idx", &x.col_idx}, {"values", &x.values}};
      if (x.quant.quantized()) p.push_back({"scales", &x.quant.scales});
      if (x.quant.quantized() && x.quant.spec.has_min()) p.push_back({"mins", &x.quant.mins});
      return p;
    }
    std::vector<std::pair<std::string, const Tensor*>> operator()(const BsrMatrix& x) const {
      std::vector<std::pair<std::string, const Tensor*>> p = {
          {"row_ptr", &x.row_ptr}, {"col_idx", &x.col_idx}, {"values", &x.values}};
      if (x.quant.quantized()) p.push_back({"scales", &x.quant.scales});
      if (x.quant.quantized() && x.quant.spec.has_min()) p.push_back({"mins", &x.quant.mins});
      return p;
    }
    std::vector<std::pair<std::string, const Tensor*>> operator()(const NmMatrix& x) const {
      if (!x.quant.quantized()) return {{"values", &x.values}, {"meta", &x.meta}};
      std::vector<std::pair<std::string, const Tensor*>> p = {
          {"values", &x.values}, {"meta", &x.meta}, {"scales", &x.quant.scales}};
      if (x.quant.spec.has_min()) p.push_back({"mins", &x.quant.mins});
      return p;
    }
    std::vector<std::pair<std::string, const Tensor*>> operator()(const VnmMatrix& x) const {
      if (!x.quant.quantized()) return {{"values", &x.values}, {"meta", &x.meta}};
      std::vector<std::pair<std::string, const Tensor*>> p = {
          {"values", &x.values}, {"meta", &x.meta}, {"scales", &x.quant.scales}};
      if (x.quant.spec.has_min()) p.push_back({"mins", &x.quant.mins});
      return p;
    }
  };
  return std::visit(V{}, s);
}

// ---- the csr bit-mask index (format version 3) ----------------------------------------------

int64_t MaskRowBytes(int64_t cols) { return (cols + 7) / 8; }

// Whether the mask is the smaller index of c (row_ptr i64 + col_idx against the mask's bytes).
bool UseCsrMask(const CsrMatrix& c, const CheckpointWriteOptions& opt) {
  if (!opt.csr_mask_index) return false;
  const uint64_t index = c.row_ptr.nbytes() + c.col_idx.nbytes();
  return static_cast<uint64_t>(c.rows * MaskRowBytes(c.cols)) < index;
}

Tensor CsrMask(const CsrMatrix& c) {
  const int64_t rb = MaskRowBytes(c.cols);
  Tensor mask = Tensor::Alloc(DType::kU8, {c.rows, rb});
  uint8_t* m = mask.mutable_data_as<uint8_t>();
  std::fill(m, m + c.rows * rb, uint8_t{0});
  const auto* rp = c.row_ptr.data_as<int64_t>();
  const bool u16 = c.col_idx.dtype() == DType::kU16;
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t p = rp[r]; p < rp[r + 1]; ++p) {
      const int64_t col = u16 ? c.col_idx.data_as<uint16_t>()[p] : c.col_idx.data_as<uint32_t>()[p];
      m[r * rb + col / 8] |= static_cast<uint8_t>(1u << (col % 8));
    }
  }
  return mask;
}

// row_ptr and col_idx of the mask (the dtypes CsrMatrix::FromDense picks); errors name the part.
Status CsrIndexFromMask(const Tensor& mask, const std::string& part, CsrMatrix* c) {
  const int64_t rb = MaskRowBytes(c->cols);
  if (mask.dtype() != DType::kU8 || mask.shape() != std::vector<int64_t>{c->rows, rb}) {
    return InvalidInput(part + ": expected u8[" + std::to_string(c->rows) + ", " +
                        std::to_string(rb) + "], got " + mask.ShapeString());
  }
  const uint8_t* m = mask.data_as<uint8_t>();
  int64_t nnz = 0;
  for (int64_t i = 0; i < c->rows * rb; ++i) nnz += std::popcount(static_cast<unsigned>(m[i]));
  const int tail = static_cast<int>(c->cols % 8);
  const bool u16 = c->cols <= 65536;
  c->row_ptr = Tensor::Alloc(DType::kI64, {c->rows + 1});
  c->col_idx = Tensor::Alloc(u16 ? DType::kU16 : DType::kU32, {nnz});
  auto* rp = c->row_ptr.mutable_data_as<int64_t>();
  uint16_t* idx16 = u16 ? c->col_idx.mutable_data_as<uint16_t>() : nullptr;
  uint32_t* idx32 = u16 ? nullptr : c->col_idx.mutable_data_as<uint32_t>();
  int64_t p = 0;
  rp[0] = 0;
  for (int64_t r = 0; r < c->rows; ++r) {
    const uint8_t* row = m + r * rb;
    if (tail != 0 && (row[rb - 1] >> tail) != 0) {
      return InvalidInput(part + ": row " + std::to_string(r) + " has bits set past column " +
                          std::to_string(c->cols - 1));
    }
    // Set bits a word at a time (every load of a masked checkpoint runs this over every weight).
    for (int64_t b0 = 0; b0 < rb; b0 += 8) {
      uint64_t word = 0;
      std::memcpy(&word, row + b0, static_cast<size_t>(std::min<int64_t>(8, rb - b0)));
      for (; word != 0; word &= word - 1) {
        const int64_t col = b0 * 8 + std::countr_zero(word);
        if (u16) {
          idx16[p++] = static_cast<uint16_t>(col);
        } else {
          idx32[p++] = static_cast<uint32_t>(col);
        }
      }
    }
    rp[r + 1] = p;
  }
  return Status::Ok();
}

// ---- the nm rank meta (format version 4) ------------------------------------------------------
// A group's n ascending indices c_1 < ... < c_n are one of C(m, n) subsets: stored as its rank in
// the combinatorial number system, sum over j of C(c_j, j), in ceil(log2 C(m, n)) bits. 2:4 needs
// 3 bits per group (6 subsets) where NVIDIA's encoding spends 4 (two 2-bit indices): 0.75 bits per
// dense weight instead of 1, 3.3 MB of a 2:4 SmolLM2-135M file. Kernels read the NVIDIA layout,
// so the reader rebuilds it (as it rebuilds a csr mask's row_ptr / col_idx).

using formats_internal::NmLayout;

int64_t Choose(int m, int n) {
  if (n < 0 || n > m) return 0;
  int64_t c = 1;
  for (int i = 1; i <= n; ++i) c = c * (m - n + i) / i;  // exact at every step
  return c;
}

int RankBits(int n, int m) { return std::bit_width(static_cast<uint64_t>(Choose(m, n) - 1)); }

int64_t RankRowBytes(const NmLayout& l) { return (l.groups * RankBits(l.n, l.m) + 7) / 8; }

// The layout and meta of an nm / vnm matrix; nullptr for the other formats.
const Tensor* NmMetaOf(const SparseMatrix& s, NmLayout* l) {
  if (const auto* x = std::get_if<NmMatrix>(&s)) {
    *l = formats_internal::MakeNmLayout(x->rows, x->cols, 1, x->n, x->m);
    return &x->meta;
  }
  if (const auto* x = std::get_if<VnmMatrix>(&s)) {
    *l = formats_internal::MakeNmLayout(x->rows, x->cols, x->v, x->n, x->m);
    return &x->meta;
  }
  return nullptr;
}

// Whether s's meta is written as ranks: smaller, and every row's bits past its indices 0 (what
// the encoders write; anything else would not come back bit for bit).
bool UseNmRank(const SparseMatrix& s, const CheckpointWriteOptions& opt) {
  NmLayout l;
  const Tensor* meta = NmMetaOf(s, &l);
  if (!opt.nm_rank_meta || meta == nullptr || RankRowBytes(l) >= l.meta_row_bytes) return false;
  const int used = static_cast<int>((l.groups * l.n * l.bits) % 8);
  if (used == 0) return true;
  const uint8_t* m = meta->data_as<uint8_t>();
  for (int64_t r = 0; r < l.slabs; ++r) {
    if ((m[r * l.meta_row_bytes + l.meta_row_bytes - 1] >> used) != 0) return false;
  }
  return true;
}

// Sequential LSB-first bit streams over one row (the per-bit ReadBits / WriteBits made loading a
// 2:4 model's 26 M groups cost as much as validating them).
class BitReader {
 public:
  explicit BitReader(const uint8_t* p) : p_(p) {}
  uint32_t Read(int bits) {  // bits <= 32
    while (have_ < bits) {
      buf_ |= static_cast<uint64_t>(*p_++) << have_;
      have_ += 8;
    }
    const auto v = static_cast<uint32_t>(buf_ & ((uint64_t{1} << bits) - 1));
    buf_ >>= bits;
    have_ -= bits;
    return v;
  }

 private:
  const uint8_t* p_;
  uint64_t buf_ = 0;
  int have_ = 0;
};

class BitWriter {
 public:
  explicit BitWriter(uint8_t* p) : p_(p) {}
  ~BitWriter() {
    if (have_ > 0) *p_ = static_cast<uint8_t>(buf_);
  }
  void Write(uint32_t v, int bits) {  // bits <= 32, v < 2^bits
    buf_ |= static_cast<uint64_t>(v) << have_;
    have_ += bits;
    while (have_ >= 8) {
      *p_++ = static_cast<uint8_t>(buf_);
      buf_ >>= 8;
      have_ -= 8;
    }
  }

 private:
  uint8_t* p_;
  uint64_t buf_ = 0;
  int have_ = 0;
};

Tensor NmRankMeta(const Tensor& meta, const NmLayout& l) {
  const int rb = RankBits(l.n, l.m);
  const int64_t rrow = RankRowBytes(l);
  Tensor out = Tensor::Alloc(DType::kU8, {l.slabs, rrow});
  uint8_t* o = out.mutable_data_as<uint8_t>();
  std::fill(o, o + l.slabs * rrow, uint8_t{0});
  const uint8_t* src = meta.data_as<uint8_t>();
  int64_t choose[17][17];  // choose[c][j] = C(c, j)
  for (int c = 0; c <= 16; ++c)
    for (int j = 0; j <= 16; ++j) choose[c][j] = Choose(c, j);
  for (int64_t r = 0; r < l.slabs; ++r) {
    BitReader in(src + r * l.meta_row_bytes);
    BitWriter w(o + r * rrow);
    for (int64_t g = 0; g < l.groups; ++g) {
      int64_t rank = 0;
      for (int j = 0; j < l.n; ++j) rank += choose[in.Read(l.bits)][j + 1];  // indices < m <= 16
      w.Write(static_cast<uint32_t>(rank), rb);
    }
  }
  return out;
}

// The NVIDIA-layout meta of a rank part; errors name the part, slab and group.
Status NmMetaFromRank(const Tensor& rank, const NmLayout& l, const std::string& part, Tensor* meta) {
  const int rb = RankBits(l.n, l.m);
  const int64_t rrow = RankRowBytes(l);
  if (rank.dtype() != DType::kU8 || rank.shape() != std::vector<int64_t>{l.slabs, rrow}) {
    return InvalidInput(part + ": expected u8[" + std::to_string(l.slabs) + ", " +
                        std::to_string(rrow) + "], got " + rank.ShapeString());
  }
  // The indices of each rank, packed as the meta stores them (n * bits <= 15 * 4 bits): every
  // n-of-m set, ranked.
  const int64_t count = Choose(l.m, l.n);
  const int width = l.n * l.bits;
  std::vector<uint64_t> packed(static_cast<size_t>(count));
  for (uint32_t set = 0; set < (1u << l.m); ++set) {
    if (std::popcount(set) != l.n) continue;
    int64_t r = 0;
    uint64_t bits = 0;
    int j = 0;
    for (uint32_t rest = set; rest; rest &= rest - 1, ++j) {
      const int c = std::countr_zero(rest);
      r += Choose(c, j + 1);
      bits |= static_cast<uint64_t>(c) << (j * l.bits);
    }
    packed[static_cast<size_t>(r)] = bits;
  }
  *meta = Tensor::Alloc(DType::kU8, {l.slabs, l.meta_row_bytes});
  uint8_t* o = meta->mutable_data_as<uint8_t>();
  std::fill(o, o + l.slabs * l.meta_row_bytes, uint8_t{0});
  const uint8_t* src = rank.data_as<uint8_t>();
  const int tail = static_cast<int>((l.groups * rb) % 8);
  for (int64_t s = 0; s < l.slabs; ++s) {
    const uint8_t* row = src + s * rrow;
    if (tail != 0 && (row[rrow - 1] >> tail) != 0) {
      return InvalidInput(part + ": " + formats_internal::SlabText(l, s) + " has bits set past its " +
                          std::to_string(l.groups) + " groups");
    }
    BitReader in(row);
    BitWriter w(o + s * l.meta_row_bytes);
    for (int64_t g = 0; g < l.groups; ++g) {
      const uint32_t r = in.Read(rb);
      if (r >= count) {
        return InvalidInput(part + ": " + formats_internal::SlabText(l, s) + ", " +
                            formats_internal::GroupText(l, g) + ": rank " + std::to_string(r) +
                            " is not below C(" + std::to_string(l.m) + ", " + std::to_string(l.n) +
                            ") = " + std::to_string(count));
      }
      const uint64_t bits = packed[r];
      if (width <= 32) {
        w.Write(static_cast<uint32_t>(bits), width);
      } else {
        w.Write(static_cast<uint32_t>(bits), 32);
        w.Write(static_cast<uint32_t>(bits >> 32), width - 32);
      }
    }
  }
  return Status::Ok();
}

std::string PartName(const std::string& name, const std::string& suffix) {
  return suffix.empty() ? name : name + "." + suffix;
}

json MatrixJson(const CheckpointTensor& t, const CheckpointWriteOptions& opt) {
  json j = json::object();
  j["format"] = std::string(FormatName(KindOf(t.matrix)));
  j["pattern"] = t.pattern.ToString();
  j["shape"] = {Rows(t.matrix), Cols(t.matrix)};
  j["dtype"] = std::string(DTypeName(ValueDType(t.matrix)));
  if (IsQuantized(t.matrix)) j["values"] = ValuesName(t.matrix);
  if (const auto* b = std::get_if<BsrMatrix>(&t.matrix)) {
    j["bh"] = b->bh;
    j["bw"] = b->bw;
  } else if (const auto* c = std::get_if<CsrMatrix>(&t.matrix); c && UseCsrMask(*c, opt)) {
    j["index"] = "mask";
  } else if (const auto* nm = std::get_if<NmMatrix>(&t.matrix)) {
    j["n"] = nm->n;
    j["m"] = nm->m;
  } else if (const auto* v = std::get_if<VnmMatrix>(&t.matrix)) {
    j["v"] = v->v;
    j["n"] = v->n;
    j["m"] = v->m;
  }
  if (UseNmRank(t.matrix, opt)) j["meta"] = "rank";
  return j;
}

// Reads a small integer field of a matrix entry.
Result<int> IntField(const json& e, const char* key, const std::string& what) {
  auto it = e.find(key);
  if (it == e.end() || !it->is_number_integer()) {
    return InvalidInput(what + ": missing or non-integer field \"" + key + "\"");
  }
  const int64_t v = it->get<int64_t>();
  if (v < 0 || v > 1 << 20) {
    return InvalidInput(what + ": field \"" + std::string(key) + "\" = " + std::to_string(v) +
                        " out of range");
  }
  return static_cast<int>(v);
}

}  // namespace

const CheckpointTensor* Checkpoint::FindMatrix(const std::string& name) const {
  for (const auto& m : matrices)
    if (m.name == name) return &m;
  return nullptr;
}

const NamedTensor* Checkpoint::FindTensor(const std::string& name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

uint64_t StoredByteSize(const SparseMatrix& s, const CheckpointWriteOptions& opt) {
  NmLayout l;
  if (const Tensor* meta = NmMetaOf(s, &l); meta != nullptr && UseNmRank(s, opt)) {
    return ByteSize(s) - meta->nbytes() + static_cast<uint64_t>(l.slabs * RankRowBytes(l));
  }
  const auto* c = std::get_if<CsrMatrix>(&s);
  if (c == nullptr || !UseCsrMask(*c, opt)) return ByteSize(s);
  return ByteSize(s) - c->row_ptr.nbytes() - c->col_idx.nbytes() +
         static_cast<uint64_t>(c->rows * MaskRowBytes(c->cols));
}

uint64_t FileByteSize(const SafetensorsFile& file, const std::string& name, const SparseMatrix& s) {
  uint64_t bytes = 0;
  auto add = [&](const std::string& suffix) {
    if (const SafetensorsEntry* e = file.Find(PartName(name, suffix))) bytes += e->tensor.nbytes();
  };
  // The in-memory parts where the file holds them, and their alternative encodings.
  for (const auto& [suffix, part] : PartsOf(s)) add(suffix);
  if (std::holds_alternative<CsrMatrix>(s)) add("mask");
  NmLayout l;
  if (NmMetaOf(s, &l) != nullptr) add("meta_rank");
  return bytes;
}

Status FlattenCheckpoint(const Checkpoint& ckpt, std::vector<NamedTensor>* tensors,
                         std::map<std::string, std::string>* metadata,
                         const CheckpointWriteOptions& opt) {
  tensors->clear();
  *metadata = ckpt.metadata;
  if (metadata->count(kCheckpointMetadataKey)) {
    return InvalidInput(std::string("checkpoint metadata key '") + kCheckpointMetadataKey +
                        "' is reserved");
  }
  json entries = json::object();
  std::set<std::string> names;
  // The oldest version that reads the file: 3 when a csr index is a mask, 4 when an nm meta is
  // ranks.
  int version = 2;
  for (const auto& m : ckpt.matrices) {
    if (m.name.empty()) return InvalidInput("checkpoint: matrix with an empty name");
    if (entries.contains(m.name)) return InvalidInput("checkpoint: duplicate matrix " + Quote(m.name));
    SPARQ_RETURN_IF_ERROR(Validate(m.matrix, m.name));
    entries[m.name] = MatrixJson(m, opt);
    const auto* csr = std::get_if<CsrMatrix>(&m.matrix);
    const bool mask = csr != nullptr && UseCsrMask(*csr, opt);
    const bool rank = UseNmRank(m.matrix, opt);
    version = std::max({version, mask ? 3 : 2, rank ? 4 : 2});
    for (const auto& [suffix, part] : PartsOf(m.matrix)) {
      if (mask && (suffix == "row_ptr" || suffix == "col_idx")) continue;
      if (rank && suffix == "meta") {
        const std::string pn = PartName(m.name, "meta_rank");
        if (!names.insert(pn).second) return InvalidInput("checkpoint: duplicate tensor name " + Quote(pn));
        NmLayout l;
        tensors->push_back({pn, NmRankMeta(*NmMetaOf(m.matrix, &l), l)});
        continue;
      }
      const std::string pn = PartName(m.name, suffix);
      if (!names.insert(pn).second) return InvalidInput("checkpoint: duplicate tensor name " + Quote(pn));
      tensors->push_back({pn, *part});
    }
    if (mask) {
      const std::string pn = PartName(m.name, "mask");
      if (!names.insert(pn).second) return InvalidInput("checkpoint: duplicate tensor name " + Quote(pn));
      tensors->push_back({pn, CsrMask(*csr)});
    }
  }
  for (const auto& t : ckpt.tensors) {
    if (!names.insert(t.name).second) return InvalidInput("checkpoint: duplicate tensor name " + Quote(t.name));
    tensors->push_back(t);
  }
  json doc = json::object();
  doc["format_version"] = version;
  doc["tensors"] = std::move(entries);
  (*metadata)[kCheckpointMetadataKey] = doc.dump();
  return Status::Ok();
}

Status WriteCheckpoint(const std::string& path, const Checkpoint& ckpt,
                       const CheckpointWriteOptions& opt) {
  std::vector<NamedTensor> tensors;
  std::map<std::string, std::string> metadata;
  Status st = FlattenCheckpoint(ckpt, &tensors, &metadata, opt);
  if (!st.ok()) return st.WithContext(path);
  return WriteSafetensors(path, tensors, metadata);
}

Result<std::vector<uint8_t>> SerializeCheckpoint(const Checkpoint& ckpt,
                                                 const CheckpointWriteOptions& opt) {
  std::vector<NamedTensor> tensors;
  std::map<std::string, std::string> metadata;
  SPARQ_RETURN_IF_ERROR(FlattenCheckpoint(ckpt, &tensors, &metadata, opt));
  return SerializeSafetensors(tensors, metadata);
}

bool IsSparqCheckpoint(const SafetensorsFile& file) {
  return file.metadata().count(kCheckpointMetadataKey) > 0;
}

Result<Checkpoint> CheckpointFromSafetensors(const SafetensorsFile& file) {
  const std::string& path = file.path();
  Checkpoint ck;
  std::set<std::string> claimed;
  for (const auto& [k, v] : file.metadata()) {
    if (k != kCheckpointMetadataKey) ck.metadata[k] = v;
  }
  auto it = file.metadata().find(kCheckpointMetadataKey);
  if (it != file.metadata().end()) {
    const std::string& text = it->second;
    SPARQ_ASSIGN_OR_RETURN(json doc, io::ParseStrictJson(text.data(), text.size(),
                                                         path + ": metadata 'sparq'"));
    const std::string where = path + ": metadata 'sparq'";
    if (!doc.is_object()) return InvalidInput(where + " is not a JSON object");
    auto ver = doc.find("format_version");
    if (ver == doc.end() || !ver->is_number_integer()) {
      return InvalidInput(where + ": missing or non-integer format_version");
    }
    if (ver->get<int64_t>() < 1 || ver->get<int64_t>() > kCheckpointFormatVersion) {
      return Unsupported(where + ": format_version " + std::to_string(ver->get<int64_t>()) +
                         " (this sparq reads up to " + std::to_string(kCheckpointFormatVersion) + ")");
    }
    auto ents = doc.find("tensors");
    if (ents == doc.end() || !ents->is_object()) return InvalidInput(where + ": missing \"tensors\" object");
    for (const auto& [name, e] : ents->items()) {
      const std::string what = path + ": matrix " + Quote(name);
      if (!e.is_object()) return InvalidInput(what + ": metadata entry is not a JSON object");
      auto fmt_it = e.find("format");
      auto pat_it = e.find("pattern");
      auto dt_it = e.find("dtype");
      auto shape_it = e.find("shape");
      if (fmt_it == e.end() || !fmt_it->is_string()) return InvalidInput(what + ": missing \"format\"");
      if (pat_it == e.end() || !pat_it->is_string()) return InvalidInput(what + ": missing \"pattern\"");
      if (dt_it == e.end() || !dt_it->is_string()) return InvalidInput(what + ": missing \"dtype\"");
      const auto kind = ParseFormatName(fmt_it->get<std::string>());
      if (!kind) return InvalidInput(what + ": unknown format " + Quote(fmt_it->get<std::string>()));
      auto pattern = Pattern::Parse(pat_it->get<std::string>());
      if (!pattern.ok()) return pattern.status().WithContext(what);
      const auto dtype = ParseDType(dt_it->get<std::string>());
      // Quantized values (nm since format version 2, dense, csr, vnm and bsr too since): "values"
      // names the spec, "dtype" the codes' storage.
      ValueSpec qspec;
      if (auto vit = e.find("values"); vit != e.end()) {
        if (!vit->is_string()) return InvalidInput(what + ": \"values\" is not a string");
        auto spec = ValueSpec::Parse(vit->get<std::string>());
        if (!spec.ok()) return spec.status().WithContext(what);
        if (!spec->quantized()) {
          return InvalidInput(what + ": \"values\" " + Quote(spec->Name()) +
                              " is not a quantized type (float values are named by \"dtype\")");
        }
        if (*kind == FormatKind::kCoo) {
          return InvalidInput(what + ": quantized values (" + spec->Name() +
                              ") are stored for nm, vnm, bsr, csr and dense matrices only, not " +
                              Quote(fmt_it->get<std::string>()));
        }
        const DType want = spec->dtype == DType::kI8 ? DType::kI8 : DType::kU8;
        if (!dtype || *dtype != want) {
          return InvalidInput(what + ": " + spec->Name() + " codes are stored as " +
                              std::string(DTypeName(want)) + ", the metadata says dtype " +
                              Quote(dt_it->get<std::string>()));
        }
        qspec = *spec;
      } else if (!dtype ||
                 (*dtype != DType::kF32 && *dtype != DType::kBF16 && *dtype != DType::kF16)) {
        return InvalidInput(what + ": value dtype " + Quote(dt_it->get<std::string>()) +
                            " is not f32, bf16 or f16");
      }
      if (shape_it == e.end() || !shape_it->is_array() || shape_it->size() != 2 ||
          !(*shape_it)[0].is_number_integer() || !(*shape_it)[1].is_number_integer()) {
        return InvalidInput(what + ": \"shape\" must be [rows, cols]");
      }
      const int64_t rows = (*shape_it)[0].get<int64_t>();
      const int64_t cols = (*shape_it)[1].get<int64_t>();
      if (rows < 0 || cols < 0) {
        return InvalidInput(what + ": negative shape [" + std::to_string(rows) + ", " +
                            std::to_string(cols) + "]");
      }
      SPARQ_RETURN_IF_ERROR(CheckedNumel({rows, cols, 4}, what + ": shape").status());

      // clang 14 (the fuzz preset) cannot capture a structured binding: capture a copy.
      const std::string matrix_name = name;
      auto part = [&](const std::string& suffix) -> Result<Tensor> {
        const std::string pn = PartName(matrix_name, suffix);
        const SafetensorsEntry* t = file.Find(pn);
        if (!t) return InvalidInput(what + ": part " + Quote(pn) + " is missing");
        if (!claimed.insert(pn).second) {
          return InvalidInput(what + ": part " + Quote(pn) + " belongs to two matrices");
        }
        return t->tensor;
      };
      // An nm / vnm meta as stored: the indices, or (format version 4, "meta": "rank") their
      // groups' ranks, rebuilt into the indices.
      const json& entry = e;  // (clang 14: no structured binding in a lambda, as above)
      auto read_meta = [&](int v, int n, int m, Tensor* meta) -> Status {
        auto mt = entry.find("meta");
        if (mt == entry.end()) {
          SPARQ_ASSIGN_OR_RETURN(*meta, part("meta"));
          return Status::Ok();
        }
        if (!mt->is_string() || mt->get<std::string>() != "rank") {
          return InvalidInput(what + ": unknown nm \"meta\" " + mt->dump() +
                              " (this sparq reads \"rank\")");
        }
        // The layout's arithmetic needs legal parameters (Validate names them the same way).
        SPARQ_RETURN_IF_ERROR(formats_internal::ValidateNmParams(v, n, m, what));
        SPARQ_ASSIGN_OR_RETURN(Tensor rank, part("meta_rank"));
        return NmMetaFromRank(rank, formats_internal::MakeNmLayout(rows, cols, v, n, m),
                              PartName(matrix_name, "meta_rank"), meta)
            .WithContext(path);
      };
      SparseMatrix mat;
      switch (*kind) {
        case FormatKind::kDense: {
          DenseMatrix d{rows, cols, {}, {}};
          if (qspec.quantized()) {
            d.quant.spec = qspec;
            SPARQ_ASSIGN_OR_RETURN(d.values, part("values"));
            SPARQ_ASSIGN_OR_RETURN(d.quant.scales, part("scales"));
            if (qspec.has_min()) {
              SPARQ_ASSIGN_OR_RETURN(d.quant.mins, part("mins"));
            }
            mat = std::move(d);
            break;
          }
          SPARQ_ASSIGN_OR_RETURN(d.values, part(""));
          mat = std::move(d);
          break;
        }
        case FormatKind::kCoo: {
          CooMatrix c;
          c.rows = rows, c.cols = cols;
          SPARQ_ASSIGN_OR_RETURN(c.row_idx, part("row_idx"));
          SPARQ_ASSIGN_OR_RETURN(c.col_idx, part("col_idx"));
          SPARQ_ASSIGN_OR_RETURN(c.values, part("values"));
          mat = std::move(c);
          break;
        }
        case FormatKind::kCsr: {
          CsrMatrix c;
          c.rows = rows, c.cols = cols;
          if (auto ix = e.find("index"); ix != e.end()) {
            if (!ix->is_string() || ix->get<std::string>() != "mask") {
              return InvalidInput(what + ": unknown csr \"index\" " + ix->dump() +
                                  " (this sparq reads \"mask\")");
            }
            SPARQ_ASSIGN_OR_RETURN(Tensor mask, part("mask"));
            SPARQ_RETURN_IF_ERROR(
                CsrIndexFromMask(mask, PartName(matrix_name, "mask"), &c).WithContext(path));
          } else {
            SPARQ_ASSIGN_OR_RETURN(c.row_ptr, part("row_ptr"));
            SPARQ_ASSIGN_OR_RETURN(c.col_idx, part("col_idx"));
          }
          SPARQ_ASSIGN_OR_RETURN(c.values, part("values"));
          if (e.contains("index")) {
            // Named here: Validate would blame col_idx, a part the file does not hold.
            const auto nnz = static_cast<uint64_t>(c.col_idx.numel());
            const uint64_t want = qspec.dtype == DType::kI4 ? (nnz + 1) / 2 : nnz;
            if (c.values.rank() != 1 || c.values.numel() != want) {
              return InvalidInput(what + ": " + PartName(matrix_name, "mask") + " marks " +
                                  std::to_string(nnz) + " values, " +
                                  PartName(matrix_name, "values") + " holds " +
                                  c.values.ShapeString());
            }
          }
          if (qspec.quantized()) {
            c.quant.spec = qspec;
            SPARQ_ASSIGN_OR_RETURN(c.quant.scales, part("scales"));
            if (qspec.has_min()) {
              SPARQ_ASSIGN_OR_RETURN(c.quant.mins, part("mins"));
            }
          }
          mat = std::move(c);
          break;
        }
        case FormatKind::kBsr: {
          BsrMatrix b;
          b.rows = rows, b.cols = cols;
          SPARQ_ASSIGN_OR_RETURN(b.bh, IntField(e, "bh", what));
          SPARQ_ASSIGN_OR_RETURN(b.bw, IntField(e, "bw", what));
          SPARQ_ASSIGN_OR_RETURN(b.row_ptr, part("row_ptr"));
          SPARQ_ASSIGN_OR_RETURN(b.col_idx, part("col_idx"));
          SPARQ_ASSIGN_OR_RETURN(b.values, part("values"));
          if (qspec.quantized()) {
            b.quant.spec = qspec;
            SPARQ_ASSIGN_OR_RETURN(b.quant.scales, part("scales"));
            if (qspec.has_min()) {
              SPARQ_ASSIGN_OR_RETURN(b.quant.mins, part("mins"));
            }
          }
          mat = std::move(b);
          break;
        }
        case FormatKind::kNM: {
          NmMatrix x;
          x.rows = rows, x.cols = cols;
          SPARQ_ASSIGN_OR_RETURN(x.n, IntField(e, "n", what));
          SPARQ_ASSIGN_OR_RETURN(x.m, IntField(e, "m", what));
          SPARQ_ASSIGN_OR_RETURN(x.values, part("values"));
          SPARQ_RETURN_IF_ERROR(read_meta(1, x.n, x.m, &x.meta));
          if (qspec.quantized()) {
            x.quant.spec = qspec;
            SPARQ_ASSIGN_OR_RETURN(x.quant.scales, part("scales"));
            if (qspec.has_min()) {
              SPARQ_ASSIGN_OR_RETURN(x.quant.mins, part("mins"));
            }
          }
          mat = std::move(x);
          break;
        }
        case FormatKind::kVNM: {
          VnmMatrix x;
          x.rows = rows, x.cols = cols;
          SPARQ_ASSIGN_OR_RETURN(x.v, IntField(e, "v", what));
          SPARQ_ASSIGN_OR_RETURN(x.n, IntField(e, "n", what));
          SPARQ_ASSIGN_OR_RETURN(x.m, IntField(e, "m", what));
          SPARQ_ASSIGN_OR_RETURN(x.values, part("values"));
          SPARQ_RETURN_IF_ERROR(read_meta(x.v, x.n, x.m, &x.meta));
          if (qspec.quantized()) {
            x.quant.spec = qspec;
            SPARQ_ASSIGN_OR_RETURN(x.quant.scales, part("scales"));
            if (qspec.has_min()) {
              SPARQ_ASSIGN_OR_RETURN(x.quant.mins, part("mins"));
            }
          }
          mat = std::move(x);
          break;
        }
      }
      if (ValueDType(mat) != *dtype) {
        return InvalidInput(what + ": values have dtype " + std::string(DTypeName(ValueDType(mat))) +
                            " but the metadata says " + std::string(DTypeName(*dtype)));
      }
      if (const auto* d = std::get_if<DenseMatrix>(&mat); d != nullptr && !qspec.quantized()) {
        if (d->values.shape() != std::vector<int64_t>{rows, cols}) {
          return InvalidInput(what + ": dense tensor has shape " + d->values.ShapeString() +
                              ", metadata says [" + std::to_string(rows) + ", " +
                              std::to_string(cols) + "]");
        }
      }
      Status st = Validate(mat, name);
      if (!st.ok()) return st.WithContext(path);
      ck.matrices.push_back({name, std::move(mat), *pattern});
    }
  }
  for (const auto& t : file.tensors()) {
    if (!claimed.count(t.name)) ck.tensors.push_back({t.name, t.tensor});
  }
  return ck;
}

Result<Checkpoint> ReadCheckpoint(const std::string& path) {
  SPARQ_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::Open(path));
  return CheckpointFromSafetensors(f);
}

Result<Checkpoint> ReadCheckpointFromMemory(const void* data, uint64_t size, const std::string& name) {
  SPARQ_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::FromMemory(data, size, name));
  return CheckpointFromSafetensors(f);
}

}  // namespace sparq
