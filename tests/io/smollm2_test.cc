// SmolLM2-135M-Instruct (Q4_1 GGUF, put in the cache by scripts/fetch_model.sh; missing, it fails):
// known facts, every tensor dequantized and finite, statistics equal to the independent gguf
// Python reader's (checked in, and re-run live with the .venv's gguf package). The `sparq`
// commands on the same file are in tests/cli/smollm2_cli_test.cc.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "data_testutil.h"
#include "io/io_testutil.h"
#include "sparq/checkpoint.h"
#include "sparq/gguf.h"

namespace sparq {
namespace {

using json = nlohmann::json;

class SmolLm2Test : public ::testing::Test {
 protected:
  void SetUp() override {
    SPARQ_REQUIRE_MODEL();
    path_ = testing::SmolLm2Path();
    auto f = GgufFile::Open(path_);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    file_.emplace(std::move(*f));
  }
  std::string path_;
  std::optional<GgufFile> file_;
};

json LoadJson(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

struct Stats {
  double mean = 0, std = 0;
  float min = 0, max = 0;
};

Stats StatsOf(const Tensor& t) {
  const float* x = t.data_as<float>();
  const uint64_t n = t.numel();
  Stats s{0, 0, x[0], x[0]};
  double sum = 0;
  for (uint64_t i = 0; i < n; ++i) {
    sum += x[i];
    s.min = std::min(s.min, x[i]);
    s.max = std::max(s.max, x[i]);
  }
  s.mean = sum / n;
  double ss = 0;
  for (uint64_t i = 0; i < n; ++i) ss += (x[i] - s.mean) * (x[i] - s.mean);
  s.std = std::sqrt(ss / n);
  return s;
}

// The dequantized values are identical in both readers (same f32 operations in the same order);
// only the summation order of the mean differs (numpy sums pairwise), a relative difference of
// about n * 1e-16 ~ 1e-9 at worst for 28M elements.
void ExpectStatsMatch(const GgufFile& f, const json& ref) {
  for (const auto& [name, want] : ref["stats"].items()) {
    const GgufTensorInfo* info = f.FindTensor(name);
    ASSERT_NE(info, nullptr) << name;
    auto t = f.ReadF32(*info);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    const Stats s = StatsOf(*t);
    const double sd = want["std"].get<double>();
    EXPECT_NEAR(s.mean, want["mean"].get<double>(), 1e-9 * sd) << name;
    EXPECT_NEAR(s.std, sd, 1e-9 * sd) << name;
    EXPECT_EQ(s.min, want["min"].get<float>()) << name;
    EXPECT_EQ(s.max, want["max"].get<float>()) << name;
    for (size_t i = 0; i < want["first"].size(); ++i) {
      EXPECT_EQ(t->data_as<float>()[i], want["first"][i].get<float>()) << name << "[" << i << "]";
    }
  }
}

TEST_F(SmolLm2Test, KnownFacts) {
  const json ref = LoadJson(SPARQ_SOURCE_DIR "/tests/io/smollm2_reference.json");
  const GgufFile& f = *file_;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.tensors().size(), 272u);
  EXPECT_EQ(f.tensors().size(), ref["tensor_count"].get<size_t>());
  EXPECT_EQ(*f.Find("llama.embedding_length")->AsInt(), 576);
  EXPECT_EQ(*f.Find("llama.block_count")->AsInt(), 30);
  EXPECT_EQ(*f.Find("llama.vocab_size")->AsInt(), 49152);
  EXPECT_EQ(*f.Find("general.architecture")->AsString(), "llama");
  EXPECT_EQ(f.Find("tokenizer.ggml.tokens")->AsArray()->size(), 49152u);
  for (const auto& [k, v] : ref["metadata"].items()) EXPECT_EQ(*f.Find(k)->AsInt(), v.get<int64_t>()) << k;
  EXPECT_EQ(f.FindTensor("token_embd.weight")->shape(), (std::vector<int64_t>{49152, 576}));
  EXPECT_EQ(f.FindTensor("blk.29.ffn_down.weight")->shape(), (std::vector<int64_t>{576, 1536}));
  EXPECT_EQ(f.FindTensor("blk.0.attn_k.weight")->shape(), (std::vector<int64_t>{192, 576}));
  for (const auto& t : f.tensors()) {
    ASSERT_TRUE(ref["shapes"].contains(t.name)) << t.name;
    EXPECT_EQ(t.shape(), ref["shapes"][t.name].get<std::vector<int64_t>>()) << t.name;
    EXPECT_EQ(GgmlTypeName(t.type), ref["types"][t.name].get<std::string>()) << t.name;
  }
  int layers = 0;
  for (int l = 0; l < 30; ++l) layers += f.FindTensor("blk." + std::to_string(l) + ".attn_q.weight") != nullptr;
  EXPECT_EQ(layers, 30);
}

TEST_F(SmolLm2Test, EveryTensorDequantizesToFiniteValues) {
  uint64_t params = 0;
  for (const auto& info : file_->tensors()) {
    auto t = file_->ReadF32(info);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    const float* x = t->data_as<float>();
    uint64_t bad = 0;
    for (uint64_t i = 0; i < t->numel(); ++i) bad += !std::isfinite(x[i]);
    EXPECT_EQ(bad, 0u) << info.name;
    params += t->numel();
  }
  EXPECT_EQ(params, 134515008u);
}

TEST_F(SmolLm2Test, StatsMatchCheckedInGgufPackageNumbers) {
  ExpectStatsMatch(*file_, LoadJson(SPARQ_SOURCE_DIR "/tests/io/smollm2_reference.json"));
}

TEST_F(SmolLm2Test, StatsMatchLiveGgufPackage) {
  // The interpreter of scripts/install_deps.sh's .venv (or $SPARQ_PYTHON) must have gguf: a
  // missing package is a missing file like any other (SPARQ_ALLOW_SKIP=1 makes it a skip).
  const std::string py = testing::PythonInterpreter();
  SPARQ_REQUIRE(testing::RunCommand("'" + py + "' -c 'import gguf, numpy' 2>/dev/null", nullptr) == 0,
                "'" + py + "' cannot import gguf and numpy: run scripts/install_deps.sh (it makes "
                ".venv/ with them) or set SPARQ_PYTHON to a Python that has them");
  const std::string out = testing::TempDir() + "/smollm2_live.json";
  const std::string cmd = "'" + py + "' " SPARQ_SOURCE_DIR "/scripts/gguf_reference_stats.py '" +
                          path_ + "' --out '" + out + "' 2>&1";
  std::string log;
  ASSERT_EQ(testing::RunCommand(cmd, &log), 0) << log;
  const json live = LoadJson(out);
  EXPECT_EQ(live["tensor_count"].get<size_t>(), file_->tensors().size());
  ExpectStatsMatch(*file_, live);
}

// Every Q4_0 / Q4_1 / Q8_0 tensor of the real file, read as stored (ReadQuantized), dequantizes
// to ReadF32's values bit for bit.
TEST_F(SmolLm2Test, ReadQuantizedMatchesReadF32) {
  int checked = 0;
  for (const GgufTensorInfo& t : file_->tensors()) {
    if (t.type != GgmlType::kQ4_0 && t.type != GgmlType::kQ4_1 && t.type != GgmlType::kQ8_0) {
      continue;
    }
    auto q = file_->ReadQuantized(t);
    ASSERT_TRUE(q.ok()) << q.status().ToString();
    auto ref = file_->ReadF32(t);
    ASSERT_TRUE(ref.ok()) << ref.status().ToString();
    const Tensor d = q->ToDense();
    ASSERT_EQ(d.nbytes(), ref->nbytes()) << t.name;
    EXPECT_EQ(std::memcmp(d.data(), ref->data(), d.nbytes()), 0) << t.name;
    ++checked;
  }
  EXPECT_GT(checked, 0);
}

}  // namespace
}  // namespace sparq
