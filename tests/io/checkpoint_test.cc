// The sparq checkpoint: every format round-trips bit-exactly through a file (zero-copy views),
// plain tensors and metadata are kept, and malformed checkpoints give errors naming the tensor.
#include "sparq/checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>

#include "io/checkpoint_edit_testutil.h"
#include "io/io_testutil.h"

namespace sparq {
namespace {

using ::testing::HasSubstr;

// Random weights masked to `p` (so every format can hold them).
std::vector<float> MaskedWeights(const Pattern& p, int64_t m, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist;
  std::vector<float> w(m * k);
  for (auto& x : w) x = dist(rng);
  EXPECT_TRUE(MagnitudePrune(p, w, m, k).ok());
  return w;
}

struct Case {
  const char* pattern;
  FormatKind format;
  DType dtype;
};

const Case kCases[] = {
    {"2:4", FormatKind::kNM, DType::kBF16},        {"1:8", FormatKind::kNM, DType::kF32},
    {"vnm:4:2:4", FormatKind::kVNM, DType::kF16},  {"block:4x8:0.5", FormatKind::kBsr, DType::kF32},
    {"unstructured:0.9", FormatKind::kCsr, DType::kBF16},
    {"unstructured:0.7", FormatKind::kCoo, DType::kF32},
    {"2:4", FormatKind::kDense, DType::kBF16},     {"rows:0.25", FormatKind::kCsr, DType::kF16},
};

Checkpoint MakeCheckpoint(int64_t m, int64_t k) {
  Checkpoint ck;
  uint32_t seed = 1;
  for (const Case& c : kCases) {
    auto p = Pattern::Parse(c.pattern);
    EXPECT_TRUE(p.ok()) << c.pattern;
    auto w = MaskedWeights(*p, m, k, seed++);
    auto enc = Encode(w, m, k, c.format, *p, c.dtype);
    EXPECT_TRUE(enc.ok()) << c.pattern << ": " << enc.status().ToString();
    ck.matrices.push_back({"layer" + std::to_string(seed) + "." + std::string(FormatName(c.format)),
                           std::move(*enc), *p});
  }
  Tensor norm = Tensor::Alloc(DType::kF32, {k});
  for (int64_t i = 0; i < k; ++i) norm.mutable_data_as<float>()[i] = 0.5f + i;
  ck.tensors.push_back({"norm.weight", norm});
  ck.tensors.push_back({"ids", Tensor::Alloc(DType::kI64, {3})});
  ck.metadata["config"] = R"({"hidden": 64})";
  ck.metadata["tokenizer"] = std::string(1000, 'x');
  return ck;
}

TEST(CheckpointTest, EveryFormatRoundTripsThroughAFile) {
  const int64_t m = 26, k = 42;  // neither a multiple of 4 or 8: tail groups, partial blocks and slabs
  Checkpoint ck = MakeCheckpoint(m, k);
  const std::string path = testing::TempDir() + "/ck.sparq";
  ASSERT_TRUE(WriteCheckpoint(path, ck).ok());
  auto r = ReadCheckpoint(path);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->matrices.size(), ck.matrices.size());
  for (const auto& want : ck.matrices) {
    const CheckpointTensor* got = r->FindMatrix(want.name);
    ASSERT_NE(got, nullptr) << want.name;
    EXPECT_EQ(KindOf(got->matrix), KindOf(want.matrix)) << want.name;
    EXPECT_EQ(got->pattern, want.pattern) << want.name;
    EXPECT_EQ(ValueDType(got->matrix), ValueDType(want.matrix)) << want.name;
    EXPECT_EQ(ByteSize(got->matrix), ByteSize(want.matrix)) << want.name;
    Tensor a = ToDense(want.matrix), b = ToDense(got->matrix);
    ASSERT_EQ(a.shape(), b.shape());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0) << want.name;
    const bool is_view = std::visit([](const auto& x) { return !x.values.owned(); }, got->matrix);
    EXPECT_TRUE(is_view) << want.name << ": parts should be views into the mapping";
  }
  ASSERT_EQ(r->tensors.size(), 2u);
  const NamedTensor* norm = r->FindTensor("norm.weight");
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(norm->tensor.data_as<float>()[3], 3.5f);
  EXPECT_EQ(r->metadata, ck.metadata);  // the reserved "sparq" key is not part of it
  // A dense matrix is stored plain under its own name: any safetensors reader sees it.
  auto st = SafetensorsFile::Open(path);
  ASSERT_TRUE(st.ok());
  for (const auto& mtx : ck.matrices) {
    if (KindOf(mtx.matrix) == FormatKind::kDense) {
      EXPECT_NE(st->Find(mtx.name), nullptr);
    }
    if (KindOf(mtx.matrix) == FormatKind::kNM) {
      // 2:4 at k = 42: 11 groups' ranks (33 bits, 5 bytes a row) beat their indices (6 bytes);
      // 1:8's rank is its index (3 bits).
      const bool rank = std::get<NmMatrix>(mtx.matrix).n == 2;
      EXPECT_NE(st->Find(mtx.name + ".values"), nullptr);
      EXPECT_EQ(st->Find(mtx.name + ".meta_rank") != nullptr, rank) << mtx.name;
      EXPECT_EQ(st->Find(mtx.name + ".meta") != nullptr, !rank) << mtx.name;
    }
    if (KindOf(mtx.matrix) == FormatKind::kCsr) {
      // 26 x 42: the bit mask (6 bytes a row) beats row_ptr (8 bytes a row) + col_idx.
      EXPECT_NE(st->Find(mtx.name + ".mask"), nullptr) << mtx.name;
      EXPECT_EQ(st->Find(mtx.name + ".row_ptr"), nullptr) << mtx.name;
      EXPECT_EQ(st->Find(mtx.name + ".col_idx"), nullptr) << mtx.name;
    }
    if (KindOf(mtx.matrix) == FormatKind::kCoo) {
      EXPECT_NE(st->Find(mtx.name + ".row_idx"), nullptr);
    }
  }
  auto doc = nlohmann::json::parse(st->metadata().at("sparq"));
  EXPECT_EQ(doc["format_version"], kCheckpointFormatVersion);  // 4: nm ranks
  const auto& e = doc["tensors"]["layer2.nm"];
  EXPECT_EQ(e["format"], "nm");
  EXPECT_EQ(e["pattern"], "2:4");
  EXPECT_EQ(e["dtype"], "bf16");
  EXPECT_EQ(e["shape"], nlohmann::json({m, k}));
  EXPECT_EQ(e["n"], 2);
  EXPECT_EQ(e["m"], 4);
}

// Quantized nm values (format version 2): codes, scales and mins round-trip bit for bit as views,
// and the metadata names the spec and the codes' storage.
TEST(CheckpointTest, QuantizedNmValuesRoundTripThroughAFile) {
  const int64_t m = 6, k = 70;  // 36 stored values per row: short last groups of 32 and 64
  Checkpoint ck;
  const char* specs[] = {"int8:g32", "int4:g64", "int4:g32:sym"};
  for (const char* s : specs) {
    auto w = MaskedWeights(Pattern::NM(2, 4), m, k, 21);
    auto nm = NmMatrix::FromDense(w, m, k, 2, 4);
    ASSERT_TRUE(nm.ok());
    auto q = NmMatrix::Quantize(*nm, *ValueSpec::Parse(s));
    ASSERT_TRUE(q.ok()) << q.status().ToString();
    ck.matrices.push_back({std::string("q.") + s, std::move(*q), Pattern::NM(2, 4)});
  }
  const std::string path = testing::TempDir() + "/q.sparq";
  ASSERT_TRUE(WriteCheckpoint(path, ck).ok());
  auto r = ReadCheckpoint(path);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  for (const auto& want : ck.matrices) {
    const CheckpointTensor* got = r->FindMatrix(want.name);
    ASSERT_NE(got, nullptr) << want.name;
    const auto& a = std::get<NmMatrix>(want.matrix);
    const auto* b = std::get_if<NmMatrix>(&got->matrix);
    ASSERT_NE(b, nullptr) << want.name;
    EXPECT_EQ(ValuesName(got->matrix), ValuesName(want.matrix));
    EXPECT_EQ(ByteSize(got->matrix), ByteSize(want.matrix)) << want.name;
    for (auto [x, y] : {std::pair{&a.values, &b->values}, std::pair{&a.meta, &b->meta},
                        std::pair{&a.quant.scales, &b->quant.scales}, std::pair{&a.quant.mins, &b->quant.mins}}) {
      ASSERT_EQ(x->nbytes(), y->nbytes()) << want.name;
      if (x->nbytes()) {
        EXPECT_EQ(std::memcmp(x->data(), y->data(), x->nbytes()), 0) << want.name;
      }
    }
    EXPECT_FALSE(b->values.owned() || b->quant.scales.owned()) << "parts should be views";
    Tensor da = ToDense(want.matrix), db = ToDense(got->matrix);
    EXPECT_EQ(std::memcmp(da.data(), db.data(), da.nbytes()), 0) << want.name;
  }
  auto st = SafetensorsFile::Open(path);
  ASSERT_TRUE(st.ok());
  EXPECT_NE(st->Find("q.int4:g64.scales"), nullptr);
  EXPECT_NE(st->Find("q.int4:g64.mins"), nullptr);
  EXPECT_EQ(st->Find("q.int4:g32:sym.mins"), nullptr);
  auto doc = nlohmann::json::parse(st->metadata().at("sparq"));
  EXPECT_EQ(doc["format_version"], 4);  // the meta as ranks (18 groups: 7 bytes a row, not 9)
  EXPECT_EQ(doc["tensors"]["q.int4:g64"]["meta"], "rank");
  EXPECT_EQ(doc["tensors"]["q.int4:g64"]["values"], "int4:g64");
  EXPECT_EQ(doc["tensors"]["q.int4:g64"]["dtype"], "u8");
  EXPECT_EQ(doc["tensors"]["q.int8:g32"]["dtype"], "i8");
}

TEST(CheckpointTest, DeterministicBytes) {
  auto a = SerializeCheckpoint(MakeCheckpoint(8, 16));
  auto b = SerializeCheckpoint(MakeCheckpoint(8, 16));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
  auto r = ReadCheckpointFromMemory(a->data(), a->size());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->matrices.size(), std::size(kCases));
}

TEST(CheckpointTest, EmptyAndAllZeroMatrices) {
  Checkpoint ck;
  std::vector<float> zeros(6 * 8, 0.0f);
  for (FormatKind f : {FormatKind::kCsr, FormatKind::kCoo, FormatKind::kBsr, FormatKind::kNM}) {
    auto enc = Encode(zeros, 6, 8, f, f == FormatKind::kBsr ? Pattern::Block(2, 4, 0.5) : Pattern::NM(2, 4),
                      DType::kF32);
    ASSERT_TRUE(enc.ok()) << enc.status().ToString();
    ck.matrices.push_back({"z." + std::string(FormatName(f)), std::move(*enc), Pattern::NM(2, 4)});
  }
  auto bytes = SerializeCheckpoint(ck);
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  auto r = ReadCheckpointFromMemory(bytes->data(), bytes->size());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  for (const auto& m : r->matrices) {
    Tensor d = ToDense(m.matrix);
    for (uint64_t i = 0; i < d.numel(); ++i) ASSERT_EQ(d.data_as<float>()[i], 0.0f);
  }
}

TEST(CheckpointTest, PlainSafetensorsReadsAsCheckpointWithoutMatrices) {
  std::vector<NamedTensor> ts = {{"a", Tensor::Alloc(DType::kF16, {2, 2})}};
  auto bytes = SerializeSafetensors(ts, {{"k", "v"}});
  ASSERT_TRUE(bytes.ok());
  auto r = ReadCheckpointFromMemory(bytes->data(), bytes->size());
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->matrices.empty());
  ASSERT_EQ(r->tensors.size(), 1u);
  EXPECT_EQ(r->metadata.at("k"), "v");
}

TEST(CheckpointTest, WriterRejectsCollisionsAndReservedKey) {
  Checkpoint ck = MakeCheckpoint(8, 16);
  ck.metadata["sparq"] = "x";
  EXPECT_THAT(SerializeCheckpoint(ck).status().message(), HasSubstr("'sparq' is reserved"));
  ck = MakeCheckpoint(8, 16);
  ck.tensors.push_back({ck.matrices[0].name + ".values", Tensor::Alloc(DType::kF32, {1})});
  EXPECT_THAT(SerializeCheckpoint(ck).status().message(), HasSubstr("duplicate tensor name"));
  ck = MakeCheckpoint(8, 16);
  ck.matrices.push_back(ck.matrices[0]);
  EXPECT_THAT(SerializeCheckpoint(ck).status().message(), HasSubstr("duplicate matrix"));
}

// ---- malformed checkpoints: edit the flattened file and read it back -------------------------

using testing::ErrorOf;
using testing::Flat;

// The malformed tests below edit row_ptr / col_idx: csr indices written as such (the mask
// encoding has its own tests).
Flat FlatOf(const Checkpoint& ck, CheckpointWriteOptions opt = {.csr_mask_index = false}) {
  return testing::Flatten(ck, opt);
}

// ck as written by default, with the part `name` (a copy) changed by fn.
Flat EditPart(const Checkpoint& ck, const std::string& name,
              const std::function<void(Tensor*)>& fn) {
  Flat f = FlatOf(ck, {});
  for (auto& t : f.tensors) {
    if (t.name == name) {
      t.tensor = t.tensor.Clone();
      fn(&t.tensor);
    }
  }
  return f;
}

Checkpoint OneNm() {
  Checkpoint ck;
  auto w = MaskedWeights(Pattern::NM(2, 4), 4, 8, 7);
  auto enc = Encode(w, 4, 8, FormatKind::kNM, Pattern::NM(2, 4), DType::kF32);
  EXPECT_TRUE(enc.ok());
  ck.matrices.push_back({"w", std::move(*enc), Pattern::NM(2, 4)});
  return ck;
}

// 50% unstructured at k = 1000 (not a multiple of 8: a partial last mask byte), f32 and int4:
// the index is written as a mask (1 bit per weight against 16 per kept one), read back to the same
// row_ptr / col_idx / values bytes; StoredByteSize is what the file holds; a 97%-sparse matrix
// keeps its col_idx (the smaller index) and a file of only such matrices stays version 2.
TEST(CheckpointTest, CsrIndexIsWrittenAsAMaskWhenSmaller) {
  const int64_t m = 9, k = 1000;
  Checkpoint ck;
  auto w = MaskedWeights(Pattern::Unstructured(0.5), m, k, 3);
  auto f32 = Encode(w, m, k, FormatKind::kCsr, Pattern::Unstructured(0.5), DType::kF32);
  ASSERT_TRUE(f32.ok());
  auto spec = ValueSpec::Parse("int4:g64");
  ASSERT_TRUE(spec.ok());
  auto q = CsrMatrix::Quantize(std::get<CsrMatrix>(*f32), *spec);
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  auto sparse_w = MaskedWeights(Pattern::Unstructured(0.97), m, k, 4);
  auto sparse = Encode(sparse_w, m, k, FormatKind::kCsr, Pattern::Unstructured(0.97), DType::kF32);
  ASSERT_TRUE(sparse.ok());
  ck.matrices.push_back({"half", *f32, Pattern::Unstructured(0.5)});
  ck.matrices.push_back({"half4", SparseMatrix(*q), Pattern::Unstructured(0.5)});
  ck.matrices.push_back({"thin", *sparse, Pattern::Unstructured(0.97)});
  auto bytes = SerializeCheckpoint(ck);
  ASSERT_TRUE(bytes.ok());
  auto st = SafetensorsFile::FromMemory(bytes->data(), bytes->size(), "c.sparq");
  ASSERT_TRUE(st.ok());
  for (const char* name : {"half", "half4"}) {
    SCOPED_TRACE(name);
    const SafetensorsEntry* mask = st->Find(std::string(name) + ".mask");
    ASSERT_NE(mask, nullptr);
    EXPECT_EQ(mask->tensor.shape(), (std::vector<int64_t>{m, 125}));
    EXPECT_EQ(st->Find(std::string(name) + ".col_idx"), nullptr);
    EXPECT_EQ(st->Find(std::string(name) + ".row_ptr"), nullptr);
  }
  EXPECT_NE(st->Find("thin.col_idx"), nullptr);
  auto doc = nlohmann::json::parse(st->metadata().at("sparq"));
  EXPECT_EQ(doc["format_version"], 3);
  EXPECT_EQ(doc["tensors"]["half"]["index"], "mask");
  EXPECT_FALSE(doc["tensors"]["thin"].contains("index"));
  uint64_t parts = 0;
  for (const SafetensorsEntry& e : st->tensors()) parts += e.tensor.nbytes();
  uint64_t stored = 0;
  for (const auto& mtx : ck.matrices) stored += StoredByteSize(mtx.matrix);
  EXPECT_EQ(parts, stored);
  // 50% int4:g64 as stored: 4 bits a kept value + 1 mask bit + f16 scale and min per 64 columns.
  EXPECT_LT(8.0 * StoredByteSize(ck.matrices[1].matrix) / double(m * k), 3.6);

  auto r = ReadCheckpointFromMemory(bytes->data(), bytes->size(), "c.sparq");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  for (const auto& want : ck.matrices) {
    SCOPED_TRACE(want.name);
    const auto& a = std::get<CsrMatrix>(want.matrix);
    const auto& b = std::get<CsrMatrix>(r->FindMatrix(want.name)->matrix);
    for (auto [x, y] : {std::pair{&a.row_ptr, &b.row_ptr}, {&a.col_idx, &b.col_idx},
                        {&a.values, &b.values}}) {
      ASSERT_EQ(x->dtype(), y->dtype());
      ASSERT_EQ(x->nbytes(), y->nbytes());
      EXPECT_EQ(std::memcmp(x->data(), y->data(), x->nbytes()), 0);
    }
    EXPECT_EQ(ValuesName(want.matrix), ValuesName(r->FindMatrix(want.name)->matrix));
  }
  Checkpoint thin_only;
  thin_only.matrices.push_back(ck.matrices[2]);
  Flat f = FlatOf(thin_only, {});
  EXPECT_EQ(f.doc["format_version"], 2);
}

// The nm meta as ranks (format version 4), against an independent reference: each group's rank
// recomputed here by listing the subsets of m in colex order (the order the ranks count in), the
// 3-bit 2:4 codes checked by hand; every N:M with M <= 8 (and V:N:M) round-trips its meta bit for
// bit, with tail groups; ranks are written only where smaller (never for 1:M); StoredByteSize is
// what the file holds; nm_rank_meta = false writes the indices and a version-3 file.
std::vector<uint32_t> ColexSubsets(int n, int m) {
  std::vector<uint32_t> sets;
  for (uint32_t s = 0; s < (1u << m); ++s)
    if (std::popcount(s) == n) sets.push_back(s);
  // Ascending as numbers is colex order (the highest differing element decides).
  return sets;
}

TEST(CheckpointTest, NmMetaIsWrittenAsRanksWhenSmaller) {
  // 2:4 by hand: {0,1} {0,2} {1,2} {0,3} {1,3} {2,3} are ranks 0..5.
  std::vector<float> w = {1, 2, 0, 0,  1, 0, 2, 0,  0, 1, 2, 0,  1, 0, 0, 2,
                          0, 1, 0, 2,  0, 0, 1, 2,  3, 3, 0, 0};  // one row, seven groups
  auto enc = Encode(w, 1, 28, FormatKind::kNM, Pattern::NM(2, 4), DType::kF32);
  ASSERT_TRUE(enc.ok());
  Checkpoint one;
  one.matrices.push_back({"w", *enc, Pattern::NM(2, 4)});
  Flat f = FlatOf(one, {});
  EXPECT_EQ(f.doc["format_version"], 4);
  EXPECT_EQ(f.doc["tensors"]["w"]["meta"], "rank");
  const NamedTensor* rank = nullptr;
  for (const auto& t : f.tensors) rank = t.name == "w.meta_rank" ? &t : rank;
  ASSERT_NE(rank, nullptr);
  ASSERT_EQ(rank->tensor.shape(), (std::vector<int64_t>{1, 3}));  // 21 bits, against 28
  const uint8_t* b = rank->tensor.data_as<uint8_t>();
  const uint32_t bits = b[0] | b[1] << 8 | b[2] << 16;
  for (uint32_t g = 0; g < 7; ++g) EXPECT_EQ((bits >> (3 * g)) & 7u, g % 6) << "group " << g;
  EXPECT_EQ(bits >> 21, 0u);

  std::mt19937 rng(11);
  for (int mm = 2; mm <= 8; ++mm) {
    for (int n = 1; n < mm; ++n) {
      for (int v : {1, 3}) {
        SCOPED_TRACE(std::to_string(v) + ":" + std::to_string(n) + ":" + std::to_string(mm));
        const int64_t rows = 7, cols = 5 * mm + mm / 2 + 1;  // a tail group
        const Pattern p = v == 1 ? Pattern::NM(n, mm) : Pattern::VNM(v, n, mm);
        auto mw = MaskedWeights(p, rows, cols, rng());
        auto x = Encode(mw, rows, cols, v == 1 ? FormatKind::kNM : FormatKind::kVNM, p,
                        DType::kF32);
        ASSERT_TRUE(x.ok()) << x.status().ToString();
        Checkpoint ck;
        ck.matrices.push_back({"x", *x, p});
        Flat fl = FlatOf(ck, {});
        int bits = 1;
        while ((1 << bits) < mm) ++bits;
        const std::vector<uint32_t> sets = ColexSubsets(n, mm);
        int rbits = 0;
        while ((size_t{1} << rbits) < sets.size()) ++rbits;
        const int64_t groups = (cols + mm - 1) / mm, slabs = (rows + v - 1) / v;
        const bool want_rank = (groups * rbits + 7) / 8 < (groups * n * bits + 7) / 8;
        if (n == 1) {
          EXPECT_FALSE(want_rank);  // C(m, 1) = m: the rank is the index
        }
        EXPECT_EQ(fl.doc["tensors"]["x"].contains("meta"), want_rank);
        const Tensor& meta = v == 1 ? std::get<NmMatrix>(*x).meta : std::get<VnmMatrix>(*x).meta;
        for (const auto& t : fl.tensors) {
          if (t.name != "x.meta_rank") continue;
          ASSERT_TRUE(want_rank);
          const int64_t mrow = meta.shape()[1], rrow = t.tensor.shape()[1];
          for (int64_t s = 0; s < slabs; ++s) {
            for (int64_t g = 0; g < groups; ++g) {
              uint32_t set = 0;
              for (int j = 0; j < n; ++j) {
                uint32_t idx = 0;
                for (int q = 0; q < bits; ++q) {
                  const int64_t pos = (g * n + j) * bits + q;
                  idx |= ((meta.data_as<uint8_t>()[s * mrow + pos / 8] >> (pos % 8)) & 1u) << q;
                }
                set |= 1u << idx;
              }
              uint32_t got = 0;
              for (int q = 0; q < rbits; ++q) {
                const int64_t pos = g * rbits + q;
                got |= ((t.tensor.data_as<uint8_t>()[s * rrow + pos / 8] >> (pos % 8)) & 1u) << q;
              }
              const auto want = std::find(sets.begin(), sets.end(), set) - sets.begin();
              ASSERT_EQ(got, static_cast<uint32_t>(want)) << "slab " << s << " group " << g;
            }
          }
        }
        auto bytes = SerializeCheckpoint(ck);
        ASSERT_TRUE(bytes.ok());
        auto st = SafetensorsFile::FromMemory(bytes->data(), bytes->size(), "c.sparq");
        ASSERT_TRUE(st.ok());
        uint64_t parts = 0;
        for (const SafetensorsEntry& e : st->tensors()) parts += e.tensor.nbytes();
        EXPECT_EQ(parts, StoredByteSize(ck.matrices[0].matrix));
        auto r = ReadCheckpointFromMemory(bytes->data(), bytes->size(), "c.sparq");
        ASSERT_TRUE(r.ok()) << r.status().ToString();
        const SparseMatrix& back = r->matrices[0].matrix;
        const Tensor& meta2 = v == 1 ? std::get<NmMatrix>(back).meta : std::get<VnmMatrix>(back).meta;
        ASSERT_EQ(meta2.nbytes(), meta.nbytes());
        EXPECT_EQ(std::memcmp(meta2.data(), meta.data(), meta.nbytes()), 0);
        Tensor da = ToDense(*x), db = ToDense(back);
        EXPECT_EQ(std::memcmp(da.data(), db.data(), da.nbytes()), 0);
      }
    }
  }
  Flat plain = FlatOf(one, {.nm_rank_meta = false});
  EXPECT_EQ(plain.doc["format_version"], 2);
  EXPECT_FALSE(plain.doc["tensors"]["w"].contains("meta"));
}

// What `inspect` reports as a matrix's stored bytes: the bytes of its parts in the file at hand,
// counted here from the file's own entries, for a file written today (csr mask, nm ranks) and
// one written as versions 2 / 3 were (indices); the two differ, and each matches its writer.
TEST(CheckpointTest, FileByteSizeIsWhatTheFileHolds) {
  Checkpoint ck;
  const int64_t m = 8, k = 64;
  auto nm = Encode(MaskedWeights(Pattern::NM(2, 4), m, k, 11), m, k, FormatKind::kNM,
                   Pattern::NM(2, 4), DType::kF32);
  auto csr = Encode(MaskedWeights(Pattern::Unstructured(0.5), m, k, 12), m, k, FormatKind::kCsr,
                    Pattern::Unstructured(0.5), DType::kF32);
  ASSERT_TRUE(nm.ok() && csr.ok());
  ck.matrices.push_back({"a", std::move(*nm), Pattern::NM(2, 4)});
  ck.matrices.push_back({"b", std::move(*csr), Pattern::Unstructured(0.5)});
  std::vector<uint64_t> sizes;
  for (const CheckpointWriteOptions opt : {CheckpointWriteOptions{},
                                           CheckpointWriteOptions{.csr_mask_index = false,
                                                                  .nm_rank_meta = false}}) {
    auto bytes = SerializeCheckpoint(ck, opt);
    ASSERT_TRUE(bytes.ok());
    auto st = SafetensorsFile::FromMemory(bytes->data(), bytes->size(), "c.sparq");
    ASSERT_TRUE(st.ok());
    auto back = CheckpointFromSafetensors(*st);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    for (size_t i = 0; i < 2; ++i) {
      const std::string& name = back->matrices[i].name;
      uint64_t parts = 0;
      for (const SafetensorsEntry& e : st->tensors()) {
        if (e.name.rfind(name + ".", 0) == 0) parts += e.data_end - e.data_begin;
      }
      const uint64_t got = FileByteSize(*st, name, back->matrices[i].matrix);
      EXPECT_EQ(got, parts) << name;
      EXPECT_EQ(got, StoredByteSize(ck.matrices[i].matrix, opt)) << name;
      sizes.push_back(got);
    }
  }
  EXPECT_LT(sizes[0], sizes[2]);  // 2:4: 3-bit ranks against 4 bits of indices per group
  EXPECT_LT(sizes[1], sizes[3]);  // 50%: a bit mask against u16 column indices
}

TEST(CheckpointMalformedTest, BadNmRanks) {
  Checkpoint ck;
  auto w = MaskedWeights(Pattern::NM(2, 4), 3, 20, 5);  // 5 groups: 15 bits of ranks, 2 bytes
  auto enc = Encode(w, 3, 20, FormatKind::kNM, Pattern::NM(2, 4), DType::kF32);
  ASSERT_TRUE(enc.ok());
  ck.matrices.push_back({"w", std::move(*enc), Pattern::NM(2, 4)});
  auto edit = [&](auto fn) { return EditPart(ck, "w.meta_rank", fn); };
  Flat f = edit([](Tensor* t) { t->mutable_data_as<uint8_t>()[2] |= 0x07; });  // row 1, rank 7
  EXPECT_THAT(ErrorOf(f), HasSubstr("c.sparq: w.meta_rank: row 1, group 0 (columns 0..3): rank "));
  EXPECT_THAT(ErrorOf(f), HasSubstr("is not below C(4, 2) = 6"));
  f = edit([](Tensor* t) { t->mutable_data_as<uint8_t>()[5] |= 0x80; });  // bit 15 of row 2
  EXPECT_THAT(ErrorOf(f), HasSubstr("w.meta_rank: row 2 has bits set past its 5 groups"));
  f = edit([](Tensor* t) { *t = Tensor::Alloc(DType::kU8, {3, 3}); });
  EXPECT_THAT(ErrorOf(f), HasSubstr("w.meta_rank: expected u8[3, 2], got u8[3, 3]"));
  f = FlatOf(ck, {});
  f.doc["tensors"]["w"]["meta"] = "huffman";
  EXPECT_THAT(ErrorOf(f), HasSubstr("matrix 'w': unknown nm \"meta\" \"huffman\""));
  f = FlatOf(ck, {});
  f.doc["tensors"]["w"]["m"] = 17;
  EXPECT_THAT(ErrorOf(f), HasSubstr("N:M = 2:17 is outside"));
  f = FlatOf(ck, {});
  std::erase_if(f.tensors, [](const NamedTensor& t) { return t.name == "w.meta_rank"; });
  EXPECT_THAT(ErrorOf(f), HasSubstr("part 'w.meta_rank' is missing"));
  // A rank that decodes to a padding position with a value: Validate's message, as for indices.
  std::vector<float> tw(17, 0.0f);  // 5 groups, the tail (column 16) holds 1 real column
  tw[0] = 1, tw[2] = 2, tw[5] = 3, tw[16] = 5;
  auto tenc = Encode(tw, 1, 17, FormatKind::kNM, Pattern::NM(2, 4), DType::kF32);
  ASSERT_TRUE(tenc.ok()) << tenc.status().ToString();
  Checkpoint tail;
  tail.matrices.push_back({"t", *tenc, Pattern::NM(2, 4)});
  int edited = 0;
  Flat tf = EditPart(tail, "t.meta_rank", [&](Tensor* t) {
    // The tail group holds {0, 1} (rank 0: column 16 and the padding); {1, 2} (rank 2, bits
    // 12..14) puts its value 5 at padding column 17.
    uint8_t* r = t->mutable_data_as<uint8_t>();
    EXPECT_EQ((r[1] >> 4) & 7, 0);
    r[1] = static_cast<uint8_t>((r[1] & ~0x70) | (2 << 4));
    ++edited;
  });
  ASSERT_EQ(edited, 1);
  EXPECT_THAT(ErrorOf(tf), HasSubstr("points into the padded tail beyond cols = 17"));
}

TEST(CheckpointMalformedTest, BadCsrMask) {
  Checkpoint ck;
  auto w = MaskedWeights(Pattern::Unstructured(0.5), 3, 12, 5);  // 2 mask bytes a row
  auto enc = Encode(w, 3, 12, FormatKind::kCsr, Pattern::Unstructured(0.5), DType::kF32);
  ASSERT_TRUE(enc.ok());
  ck.matrices.push_back({"c", std::move(*enc), Pattern::Unstructured(0.5)});
  auto edit_mask = [&](auto fn) { return EditPart(ck, "c.mask", fn); };
  Flat f = edit_mask([](Tensor* t) { t->mutable_data_as<uint8_t>()[3] |= 0x80; });  // column 15
  EXPECT_THAT(ErrorOf(f), HasSubstr("c.mask: row 1 has bits set past column 11"));
  f = edit_mask([](Tensor* t) { t->mutable_data_as<uint8_t>()[0] ^= 0x01; });  // one more or less
  EXPECT_THAT(ErrorOf(f), HasSubstr("c.mask marks 19 values, c.values holds f32[18]"));
  f = edit_mask([](Tensor* t) { *t = Tensor::Alloc(DType::kU8, {3, 1}); });
  EXPECT_THAT(ErrorOf(f), HasSubstr("c.mask: expected u8[3, 2], got u8[3, 1]"));
  f = FlatOf(ck, {});
  f.doc["tensors"]["c"]["index"] = "zip";
  EXPECT_THAT(ErrorOf(f), HasSubstr("unknown csr \"index\" \"zip\""));
  f = FlatOf(ck, {});
  std::erase_if(f.tensors, [](const NamedTensor& t) { return t.name == "c.mask"; });
  EXPECT_THAT(ErrorOf(f), HasSubstr("part 'c.mask' is missing"));
}

TEST(CheckpointMalformedTest, MissingPart) {
  Flat f = FlatOf(OneNm());
  std::erase_if(f.tensors, [](const NamedTensor& t) { return t.name == "w.meta"; });
  EXPECT_THAT(ErrorOf(f), HasSubstr("c.sparq: matrix 'w': part 'w.meta' is missing"));
}

TEST(CheckpointMalformedTest, DtypeDisagreesWithMetadata) {
  Flat f = FlatOf(OneNm());
  f.doc["tensors"]["w"]["dtype"] = "bf16";
  EXPECT_THAT(ErrorOf(f), HasSubstr("matrix 'w': values have dtype f32 but the metadata says bf16"));
}

TEST(CheckpointMalformedTest, ShapeDisagreesWithParts) {
  Flat f = FlatOf(OneNm());
  f.doc["tensors"]["w"]["shape"] = {4, 12};
  EXPECT_THAT(ErrorOf(f), HasSubstr("c.sparq: w"));
  f.doc["tensors"]["w"]["shape"] = {4, -1};
  EXPECT_THAT(ErrorOf(f), HasSubstr("matrix 'w': negative shape"));
  f.doc["tensors"]["w"]["shape"] = {int64_t{1} << 40, int64_t{1} << 40};
  EXPECT_THAT(ErrorOf(f), HasSubstr("overflows"));
}

TEST(CheckpointMalformedTest, BadIndicesFailValidate) {
  Checkpoint ck;
  std::vector<float> w = {1, 0, 2, 0, 0, 3, 0, 0};
  auto enc = Encode(w, 2, 4, FormatKind::kCsr, Pattern::Unstructured(0.5), DType::kF32);
  ASSERT_TRUE(enc.ok());
  ck.matrices.push_back({"c", std::move(*enc), Pattern::Unstructured(0.5)});
  Flat f = FlatOf(ck);
  for (auto& t : f.tensors) {
    if (t.name == "c.col_idx") {
      Tensor bad = t.tensor.Clone();
      if (bad.dtype() == DType::kU16) bad.mutable_data_as<uint16_t>()[0] = 9;
      else bad.mutable_data_as<uint32_t>()[0] = 9;
      t.tensor = bad;
    }
  }
  EXPECT_THAT(ErrorOf(f), HasSubstr("c.col_idx[0] = 9"));
}

TEST(CheckpointMalformedTest, BadMetadataDocument) {
  Flat f = FlatOf(OneNm());
  f.doc["tensors"]["w"]["format"] = "zip";
  EXPECT_THAT(ErrorOf(f), HasSubstr("matrix 'w': unknown format 'zip'"));
  f = FlatOf(OneNm());
  f.doc["tensors"]["w"]["pattern"] = "3:2";
  EXPECT_THAT(ErrorOf(f), HasSubstr("matrix 'w'"));
  f = FlatOf(OneNm());
  f.doc["tensors"]["w"].erase("n");
  EXPECT_THAT(ErrorOf(f), HasSubstr("matrix 'w': missing or non-integer field \"n\""));
  f = FlatOf(OneNm());
  f.doc["tensors"]["w"]["m"] = 17;
  EXPECT_THAT(ErrorOf(f), HasSubstr("w"));
  f = FlatOf(OneNm());
  f.doc.erase("tensors");
  EXPECT_THAT(ErrorOf(f), HasSubstr("missing \"tensors\" object"));
  f = FlatOf(OneNm());
  f.doc["format_version"] = 99;
  auto fb = f;
  fb.meta["sparq"] = fb.doc.dump();
  auto bytes = SerializeSafetensors(fb.tensors, fb.meta);
  auto r = ReadCheckpointFromMemory(bytes->data(), bytes->size());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnsupported);
  Flat g = FlatOf(OneNm());
  g.meta["sparq"] = "{not json";
  auto gb = SerializeSafetensors(g.tensors, g.meta);
  auto gr = ReadCheckpointFromMemory(gb->data(), gb->size(), "c.sparq");
  ASSERT_FALSE(gr.ok());
  EXPECT_THAT(gr.status().message(), HasSubstr("c.sparq: metadata 'sparq' is not valid JSON"));
}

Checkpoint OneQuantizedNm(const char* spec) {
  Checkpoint ck;
  auto w = MaskedWeights(Pattern::NM(2, 4), 4, 72, 7);
  auto q = NmMatrix::Quantize(*NmMatrix::FromDense(w, 4, 72, 2, 4), *ValueSpec::Parse(spec));
  EXPECT_TRUE(q.ok());
  ck.matrices.push_back({"w", std::move(*q), Pattern::NM(2, 4)});
  return ck;
}

TEST(CheckpointMalformedTest, QuantizedValues) {
  Flat f = FlatOf(OneQuantizedNm("int4:g32"));
  std::erase_if(f.tensors, [](const NamedTensor& t) { return t.name == "w.scales"; });
  EXPECT_THAT(ErrorOf(f), HasSubstr("c.sparq: matrix 'w': part 'w.scales' is missing"));
  f = FlatOf(OneQuantizedNm("int4:g32"));
  std::erase_if(f.tensors, [](const NamedTensor& t) { return t.name == "w.mins"; });
  EXPECT_THAT(ErrorOf(f), HasSubstr("part 'w.mins' is missing"));
  f = FlatOf(OneQuantizedNm("int4:g32"));
  for (auto& t : f.tensors) {
    if (t.name == "w.scales") {
      Tensor bad = t.tensor.Clone();
      bad.mutable_data_as<uint16_t>()[3] = F32ToF16(std::numeric_limits<float>::quiet_NaN());
      t.tensor = bad;
    }
  }
  EXPECT_THAT(ErrorOf(f), HasSubstr("w.scales: row 1 group 1 has scale"));
  f = FlatOf(OneQuantizedNm("int8:g64"));
  f.doc["tensors"]["w"]["dtype"] = "u8";
  EXPECT_THAT(ErrorOf(f), HasSubstr("matrix 'w': int8:g64 codes are stored as i8, the metadata says dtype 'u8'"));
  f = FlatOf(OneQuantizedNm("int8:g64"));
  f.doc["tensors"]["w"]["values"] = "bf16";
  EXPECT_THAT(ErrorOf(f), HasSubstr("is not a quantized type"));
  f = FlatOf(OneQuantizedNm("int8:g64"));
  f.doc["tensors"]["w"]["values"] = "int5";
  EXPECT_THAT(ErrorOf(f), HasSubstr("matrix 'w'"));
  f = FlatOf(OneQuantizedNm("int8:g64"));
  f.doc["tensors"]["w"]["values"] = "int8:g32";  // 36 values per row: 2 groups, the file has 1
  EXPECT_THAT(ErrorOf(f), HasSubstr("w.scales"));
  f = FlatOf(OneQuantizedNm("int8:g64"));
  f.doc["tensors"]["w"].erase("values");  // i8 codes read as numbers
  EXPECT_THAT(ErrorOf(f), HasSubstr("value dtype 'i8' is not f32, bf16 or f16"));
  f = FlatOf(OneNm());
  f.doc["tensors"]["w"]["format"] = "coo";
  f.doc["tensors"]["w"]["values"] = "int8:g64";
  f.doc["tensors"]["w"]["dtype"] = "i8";
  EXPECT_THAT(ErrorOf(f),
              HasSubstr("stored for nm, vnm, bsr, csr and dense matrices only, not 'coo'"));
}

TEST(CheckpointMalformedTest, PartClaimedTwice) {
  Checkpoint ck = OneNm();
  Flat f = FlatOf(ck);
  // A dense matrix named "w.values" would reuse the nm matrix's part.
  f.doc["tensors"]["w.values"] = {{"format", "dense"}, {"pattern", "dense"}, {"shape", {4, 4}}, {"dtype", "f32"}};
  EXPECT_THAT(ErrorOf(f), HasSubstr("belongs to two matrices"));
}

}  // namespace
}  // namespace sparq
