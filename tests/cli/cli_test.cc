// `sparq inspect` and `sparq convert` on small hand-built files: every pattern family and format
// through convert -> inspect -> convert --format dense, compared bit-exactly with sparq's own
// MagnitudePrune plus rounding; exit codes 0 / 1 with one-line messages; truncated copies of each
// file type.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "io/io_testutil.h"
#include "sparq/checkpoint.h"
#include "sparq/gguf.h"

namespace sparq {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

std::string Cli() { return SPARQ_CLI_PATH; }

int RunCli(const std::string& args, std::string* out) {
  return testing::RunCommand(Cli() + " " + args + " 2>&1", out);
}

Tensor Random(DType dt, std::vector<int64_t> shape, uint32_t seed) {
  Tensor f = Tensor::Alloc(DType::kF32, shape);
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist;
  for (uint64_t i = 0; i < f.numel(); ++i) f.mutable_data_as<float>()[i] = dist(rng);
  return *FromF32(f, dt);
}

// A small "model": embedding, two block weights (k = 40 and 70: not multiples of 8 or 16),
// a norm vector, metadata.
std::string MakeModel() {
  const std::string path = testing::TempDir() + "/model.safetensors";
  std::vector<NamedTensor> ts = {
      {"token_embd.weight", Random(DType::kF32, {64, 32}, 1)},
      {"blk.0.attn_q.weight", Random(DType::kF32, {48, 40}, 2)},
      {"blk.0.ffn_up.weight", Random(DType::kBF16, {36, 70}, 3)},
      {"blk.0.attn_norm.weight", Random(DType::kF32, {32}, 4)},
  };
  EXPECT_TRUE(WriteSafetensors(path, ts, {{"config", "{\"hidden\": 32}"}}).ok());
  return path;
}

struct Case {
  std::string pattern, format, dtype;
  std::string want_format;
};

class ConvertTest : public ::testing::TestWithParam<Case> {};

TEST_P(ConvertTest, ConvertInspectAndBackToDense) {
  const Case& c = GetParam();
  const std::string model = MakeModel();
  const std::string sparq = testing::TempDir() + "/c.sparq";
  const std::string dense = testing::TempDir() + "/c_dense.safetensors";
  std::string out;
  ASSERT_EQ(RunCli("convert " + model + " " + sparq + " --pattern " + c.pattern + " --format " + c.format +
                    " --dtype " + c.dtype + " --include 'blk\\..*\\.weight'",
                &out),
            0)
      << out;
  ASSERT_EQ(testing::RunCommand(Cli() + " inspect " + sparq + " --json", &out), 0) << out;
  const json j = json::parse(out);
  // --format dense writes plain safetensors (no sparq matrix table), still masked.
  const bool plain = c.format == "dense";
  EXPECT_EQ(j["kind"], plain ? "safetensors" : "sparq");
  EXPECT_EQ(j["metadata"]["config"], "{\"hidden\": 32}");
  const Pattern p = *Pattern::Parse(c.pattern);
  auto ck = ReadCheckpoint(sparq);
  ASSERT_TRUE(ck.ok()) << ck.status().ToString();
  // The two 2-D block weights are converted; the norm is 1-D and stays plain.
  ASSERT_EQ(ck->matrices.size(), plain ? 0u : 2u);
  for (const auto& t : j["tensors"]) {
    const std::string name = t["name"];
    if (name.rfind("blk.0.attn_q", 0) == 0 || name.rfind("blk.0.ffn_up", 0) == 0) {
      EXPECT_EQ(t["format"], c.want_format) << name;
      EXPECT_EQ(t["dtype"], c.dtype) << name;
      Tensor d;
      if (plain) {
        d = *ToF32(ck->FindTensor(name)->tensor);
      } else {
        EXPECT_EQ(t["recorded_pattern"], p.ToString()) << name;
        const CheckpointTensor* m = ck->FindMatrix(name);
        ASSERT_NE(m, nullptr);
        d = ToDense(m->matrix);
      }
      EXPECT_TRUE(Satisfies(p, std::span<const float>(d.data_as<float>(), d.numel()), d.dim(0), d.dim(1)))
          << name << " does not satisfy " << c.pattern;
    } else {
      EXPECT_EQ(t["format"], "dense") << name;
    }
  }
  ASSERT_EQ(RunCli("convert " + sparq + " " + dense + " --format dense", &out), 0) << out;
  auto back = SafetensorsFile::Open(dense);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->metadata().count("sparq"), 0u);  // plain safetensors
  EXPECT_EQ(back->metadata().at("config"), "{\"hidden\": 32}");
  auto in = SafetensorsFile::Open(model);
  ASSERT_TRUE(in.ok());
  const DType vt = *ParseDType(c.dtype);
  for (const auto& e : in->tensors()) {
    const SafetensorsEntry* b = back->Find(e.name);
    ASSERT_NE(b, nullptr) << e.name;
    if (e.name.rfind("blk.0.attn_norm", 0) == 0 || e.name.rfind("token_embd", 0) == 0) {
      ASSERT_EQ(b->tensor.dtype(), e.tensor.dtype());
      EXPECT_EQ(std::memcmp(b->tensor.data(), e.tensor.data(), e.tensor.nbytes()), 0) << e.name;
      continue;
    }
    // Independent expectation: f32 input, MagnitudePrune, round to the value dtype.
    Tensor w = *ToF32(e.tensor);
    const int64_t m = e.tensor.dim(0), k = e.tensor.dim(1);
    ASSERT_TRUE(MagnitudePrune(p, std::span<float>(w.mutable_data_as<float>(), w.numel()), m, k).ok());
    Tensor want = *FromF32(w, vt);
    ASSERT_EQ(b->tensor.dtype(), vt) << e.name;
    ASSERT_EQ(b->tensor.shape(), e.tensor.shape());
    EXPECT_EQ(std::memcmp(b->tensor.data(), want.data(), want.nbytes()), 0) << e.name;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Patterns, ConvertTest,
    ::testing::Values(Case{"2:4", "auto", "bf16", "nm"}, Case{"2:4", "nm", "f32", "nm"},
                      Case{"4:8", "auto", "f16", "nm"}, Case{"1:4", "csr", "f32", "csr"},
                      Case{"vnm:4:2:4", "auto", "bf16", "vnm"},
                      Case{"block:4x4:0.5", "auto", "f32", "bsr"},
                      Case{"unstructured:0.9", "auto", "bf16", "csr"},
                      Case{"unstructured:0.5", "coo", "f32", "coo"}, Case{"rows:0.3", "csr", "f32", "csr"},
                      Case{"2:4", "dense", "bf16", "dense"}),
    [](const auto& info) {
      std::string s = info.param.pattern + "_" + info.param.format + "_" + info.param.dtype;
      for (char& ch : s) ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
      return s;
    });

TEST(ConvertCliTest, DefaultSelectionSkipsEmbeddings) {
  const std::string model = MakeModel();
  const std::string sparq = testing::TempDir() + "/default.sparq";
  std::string out;
  ASSERT_EQ(RunCli("convert " + model + " " + sparq + " --pattern 2:4", &out), 0) << out;
  auto ck = ReadCheckpoint(sparq);
  ASSERT_TRUE(ck.ok());
  EXPECT_EQ(ck->FindMatrix("token_embd.weight"), nullptr);
  EXPECT_NE(ck->FindTensor("token_embd.weight"), nullptr);
  EXPECT_NE(ck->FindMatrix("blk.0.attn_q.weight"), nullptr);
  EXPECT_EQ(ValueDType(ck->FindMatrix("blk.0.attn_q.weight")->matrix), DType::kF32);
}

// --values int4 / int8: the nm matrices hold codes, scales (and mins) that inspect names and that
// --format dense turns back into their dequantized f32 values; --values and --dtype are one flag.
TEST(ConvertCliTest, QuantizedValuesAndBackToDense) {
  const std::string model = MakeModel();
  const std::string q = testing::TempDir() + "/cq.sparq", q2 = testing::TempDir() + "/cq2.sparq";
  const std::string d = testing::TempDir() + "/cq_dense.safetensors";
  const std::string sel = " --include 'blk\\..*\\.weight'";
  std::string out;
  ASSERT_EQ(RunCli("convert " + model + " " + q + " --pattern 2:4 --values int4:g32" + sel, &out), 0) << out;
  ASSERT_EQ(RunCli("convert " + model + " " + q2 + " --pattern 2:4 --dtype int4:g32" + sel, &out), 0) << out;
  EXPECT_TRUE(testing::ReadFile(q) == testing::ReadFile(q2)) << "--values and --dtype differ";
  auto ck = ReadCheckpoint(q);
  ASSERT_TRUE(ck.ok()) << ck.status().ToString();
  for (const char* name : {"blk.0.attn_q.weight", "blk.0.ffn_up.weight"}) {
    const CheckpointTensor* m = ck->FindMatrix(name);
    ASSERT_NE(m, nullptr) << name;
    EXPECT_EQ(ValuesName(m->matrix), "int4:g32") << name;
  }
  ASSERT_EQ(testing::RunCommand(Cli() + " inspect " + q + " --json", &out), 0) << out;
  const json j = json::parse(out);
  for (const auto& t : j["tensors"]) {
    if (t["name"] == "blk.0.attn_q.weight") {
      EXPECT_EQ(t["dtype"], "int4:g32");
    }
  }
  ASSERT_EQ(RunCli("convert " + q + " " + d + " --format dense", &out), 0) << out;
  auto back = SafetensorsFile::Open(d);
  ASSERT_TRUE(back.ok());
  const SafetensorsEntry* e = back->Find("blk.0.attn_q.weight");
  ASSERT_NE(e, nullptr);
  const Tensor want = ToDense(ck->FindMatrix("blk.0.attn_q.weight")->matrix);
  ASSERT_EQ(e->tensor.dtype(), DType::kF32);
  ASSERT_EQ(e->tensor.nbytes(), want.nbytes());
  EXPECT_EQ(std::memcmp(e->tensor.data(), want.data(), want.nbytes()), 0);
  // V:N:M the same way: vnm matrices of codes whose dequantized values keep the pattern, and
  // --format dense gives those values back.
  const std::string v = testing::TempDir() + "/cv.sparq",
                    vd = testing::TempDir() + "/cv.safetensors";
  ASSERT_EQ(
      RunCli("convert " + model + " " + v + " --pattern vnm:4:2:4 --values int8:g32" + sel, &out),
      0)
      << out;
  auto cv = ReadCheckpoint(v);
  ASSERT_TRUE(cv.ok()) << cv.status().ToString();
  const CheckpointTensor* vq = cv->FindMatrix("blk.0.ffn_up.weight");
  ASSERT_NE(vq, nullptr);
  ASSERT_NE(std::get_if<VnmMatrix>(&vq->matrix), nullptr);
  EXPECT_EQ(ValuesName(vq->matrix), "int8:g32");
  const Tensor vw = ToDense(vq->matrix);
  EXPECT_TRUE(Satisfies(Pattern::VNM(4, 2, 4),
                        std::span<const float>(vw.data_as<float>(), vw.numel()), Rows(vq->matrix),
                        Cols(vq->matrix)));
  ASSERT_EQ(RunCli("convert " + v + " " + vd + " --format dense", &out), 0) << out;
  auto vback = SafetensorsFile::Open(vd);
  ASSERT_TRUE(vback.ok());
  const SafetensorsEntry* ve = vback->Find("blk.0.ffn_up.weight");
  ASSERT_NE(ve, nullptr);
  ASSERT_EQ(ve->tensor.nbytes(), vw.nbytes());
  EXPECT_EQ(std::memcmp(ve->tensor.data(), vw.data(), vw.nbytes()), 0);
}

TEST(ConvertCliTest, BadFlagsExit1WithAMessage) {
  const std::string model = MakeModel();
  const std::string o = testing::TempDir() + "/x.sparq";
  std::string out;
  EXPECT_EQ(RunCli("convert " + model + " " + o + " --pattern 5:4", &out), 1);
  EXPECT_THAT(out, HasSubstr("--pattern"));
  EXPECT_EQ(RunCli("convert " + model + " " + o, &out), 1);
  EXPECT_THAT(out, HasSubstr("--pattern is required"));
  EXPECT_EQ(RunCli("convert " + model + " " + o + " --pattern 2:4 --format zip", &out), 1);
  EXPECT_THAT(out, HasSubstr("unknown --format 'zip'"));
  EXPECT_EQ(RunCli("convert " + model + " " + o + " --pattern 2:4 --dtype i8", &out), 1);
  EXPECT_THAT(out, HasSubstr("convert: --values: values 'i8': unknown type 'i8'"));
  EXPECT_EQ(
      RunCli("convert " + model + " " + o + " --pattern 2:4 --format coo --values int4:g64", &out),
      1);
  EXPECT_THAT(
      out, HasSubstr("int4:g64 values are stored for nm, vnm, bsr and csr matrices, not coo ones"));
  EXPECT_EQ(RunCli("convert " + model + " " + o + " --pattern 2:4 --include '('", &out), 1);
  EXPECT_THAT(out, HasSubstr("bad --include regex"));
  EXPECT_EQ(RunCli("convert /nonexistent.gguf " + o + " --pattern 2:4", &out), 1);
  EXPECT_THAT(out, HasSubstr("/nonexistent.gguf"));
  EXPECT_EQ(RunCli("convert " + model + " /nonexistent_dir/o.sparq --pattern 2:4", &out), 1);
  EXPECT_THAT(out, HasSubstr("/nonexistent_dir/o.sparq"));
  EXPECT_EQ(RunCli("inspect /nonexistent.gguf", &out), 1);
  EXPECT_EQ(RunCli("inspect", &out), 1);  // CLI11 parse error
}

// `bench kernels --plot` needs its plot script (next to the peer script) and matplotlib; both are
// checked before the benchmark runs, not after minutes of it.
TEST(BenchCliTest, PlotWithoutItsScriptFailsBeforeTheRun) {
  const std::string json_out = testing::TempDir() + "/bench_rows.json";
  std::remove(json_out.c_str());
  std::string out;
  EXPECT_EQ(RunCli("bench kernels --shapes 64x64 --n 1 --patterns 2:4 --threads 1 --repeats 1 "
                   "--py-peers /nonexistent_dir/sparse_peers.py --plot " + testing::TempDir() +
                       "/p.png --json " + json_out, &out),
            1);
  EXPECT_THAT(out, HasSubstr("plot script '/nonexistent_dir/plot_speedup.py' not found"));
  // No benchmark row was printed: neither the table's header nor a kernel (whose name depends on
  // the target: f32_nm24_decode_4xT__avx2 on AVX2, f32_nm_m4_window_decode_4xT elsewhere).
  EXPECT_THAT(out, ::testing::Not(HasSubstr("GFLOP/s")));
  EXPECT_THAT(out, ::testing::Not(HasSubstr("decode_4xT")));
  EXPECT_FALSE(std::ifstream(json_out).good());
}

// A bare --py-peers file name means the current folder: the plot script is looked for there (it
// was looked for inside a folder named like the file).
TEST(BenchCliTest, BarePeerScriptNameMeansTheCurrentFolder) {
  std::string out;
  EXPECT_EQ(
      testing::RunCommand("cd " + testing::TempDir() + " && " + Cli() +
                              " bench kernels --shapes 64x64 --n 1 --patterns 2:4 --threads 1 "
                              "--repeats 1 --py-peers no_such_peers.py --plot p.png 2>&1",
                          &out),
      1);
  EXPECT_THAT(out, HasSubstr("plot script './plot_speedup.py' not found"));
}

testing::Bytes SmallGguf() {
  testing::GgufBuilder g;
  g.Kv("general.architecture", 8, testing::EncStr("llama"));
  testing::Bytes q8;  // two rows of one Q8_0 block; row r has zeros at j % 4 in {r, r + 1}: 2:4
  for (int r = 0; r < 2; ++r) {
    testing::Append(q8, testing::EncU16(0x3c00));
    for (int j = 0; j < 32; ++j) q8.push_back(static_cast<uint8_t>(j % 4 == r || j % 4 == r + 1 ? 0 : j + 1));
  }
  testing::Bytes f32;
  for (int i = 0; i < 8; ++i) testing::Append(f32, testing::EncF32(i == 3 ? 0.0f : 1.0f + i));
  g.Tensor({"w", {32, 2}, 8, q8}).Tensor({"n", {8}, 0, f32}).Tensor({"iq2", {256}, 16, testing::Bytes(66)});
  return g.Build();
}

TEST(InspectCliTest, GgufTableAndJson) {
  const std::string path = testing::TempDir() + "/small.gguf";
  testing::WriteFile(path, SmallGguf());
  std::string out;
  ASSERT_EQ(testing::RunCommand(Cli() + " inspect " + path + " --json", &out), 0) << out;
  const json j = json::parse(out);
  EXPECT_EQ(j["kind"], "gguf");
  EXPECT_EQ(j["metadata"]["general.architecture"], "\"llama\"");
  ASSERT_EQ(j["tensors"].size(), 3u);
  EXPECT_EQ(j["tensors"][0]["name"], "w");
  EXPECT_EQ(j["tensors"][0]["dtype"], "Q8_0");
  EXPECT_EQ(j["tensors"][0]["shape"], json({2, 32}));
  EXPECT_DOUBLE_EQ(j["tensors"][0]["density"].get<double>(), 0.5);
  EXPECT_EQ(j["tensors"][0]["pattern"], "2:4");
  EXPECT_EQ(j["tensors"][0]["stored_bytes"], 68);
  EXPECT_EQ(j["tensors"][0]["dense_f32_bytes"], 256);
  EXPECT_EQ(j["tensors"][1]["pattern"], "-");
  EXPECT_DOUBLE_EQ(j["tensors"][1]["density"].get<double>(), 7.0 / 8);
  EXPECT_FALSE(j["tensors"][2]["supported"].get<bool>());
  EXPECT_THAT(j["tensors"][2]["error"].get<std::string>(), HasSubstr("IQ2_XXS"));
  EXPECT_EQ(j["totals"]["unsupported"], 1);
  ASSERT_EQ(testing::RunCommand(Cli() + " inspect " + path, &out), 0);
  EXPECT_THAT(out, HasSubstr("total: 3 tensors"));
  EXPECT_THAT(out, HasSubstr("(unsupported type)"));
}

TEST(InspectCliTest, TruncatedCopiesOfEachFileTypeExit1) {
  const std::string dir = testing::TempDir();
  const std::string model = MakeModel();
  const std::string sparq = dir + "/t.sparq";
  std::string out;
  ASSERT_EQ(RunCli("convert " + model + " " + sparq + " --pattern 2:4", &out), 0) << out;
  testing::WriteFile(dir + "/t.gguf", SmallGguf());
  for (const std::string& src : {dir + "/t.gguf", model, sparq}) {
    const testing::Bytes all = testing::ReadFile(src);
    for (size_t n : {size_t{0}, size_t{5}, size_t{30}, all.size() / 2, all.size() - 1}) {
      const std::string cut = dir + "/cut_" + std::to_string(n) + src.substr(src.rfind('.'));
      testing::WriteFile(cut, testing::Bytes(all.begin(), all.begin() + n));
      ASSERT_EQ(RunCli("inspect " + cut, &out), 1) << src << " cut at " << n << ": " << out;
      EXPECT_THAT(out, HasSubstr("sparq: invalid input: " + cut)) << out;
      EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << "one line: " << out;
    }
  }
}

}  // namespace
}  // namespace sparq
