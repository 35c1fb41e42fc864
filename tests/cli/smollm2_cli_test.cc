// `sparq inspect`, `convert`, `bench model` and `generate` on SmolLM2-135M-Instruct (Q4_1 GGUF, put
// in the cache by scripts/fetch_model.sh; missing, it fails): the foundation issue's acceptance
// commands, checked against sparq's own GGUF reader. The reader itself is tested in
// tests/io/smollm2_test.cc.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

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

// ---- acceptance items 2-5 of the foundation issue --------------------------------------------

std::string Cli() { return SPARQ_CLI_PATH; }

TEST_F(SmolLm2Test, InspectListsEveryTensorAndJsonParses) {
  std::string out;
  ASSERT_EQ(testing::RunCommand(Cli() + " inspect '" + path_ + "' --json", &out), 0);
  const json j = json::parse(out);
  EXPECT_EQ(j["kind"], "gguf");
  ASSERT_EQ(j["tensors"].size(), 272u);
  for (const auto& t : j["tensors"]) EXPECT_TRUE(t["supported"].get<bool>()) << t["name"];
  EXPECT_EQ(j["totals"]["params"], 134515008u);
  std::string table;
  ASSERT_EQ(testing::RunCommand(Cli() + " inspect '" + path_ + "'", &table), 0);
  EXPECT_THAT(table, ::testing::HasSubstr("blk.29.ffn_down.weight"));
  EXPECT_THAT(table, ::testing::HasSubstr("total: 272 tensors"));
}

// `sparq bench model` rows as JSON (the fields the model issue names), and the issue's spelling
// `sparq bench MODEL`, which means the same; a word that is neither a bench subcommand nor a
// path gets one line naming it (exit 1).
TEST_F(SmolLm2Test, BenchModelJsonRowsAndTheBenchModelShorthand) {
  const std::string flags = " --threads 1 --prompt 8 --decode 2 --repeats 1 --json";
  // (The shorthand with an option before `bench` too: it once looked at the first word only.)
  // (--kv-cache, another option before `bench`, with its value.)
  for (const std::string sub : {"bench model '", "bench '", "--int8-activations bench '",
                                "--kv-cache f16 bench '", "--activations f32 bench '"}) {
    std::string out;
    ASSERT_EQ(testing::RunCommand(Cli() + " " + sub + path_ + "'" + flags, &out), 0) << sub << out;
    const json rows = json::parse(out);
    ASSERT_EQ(rows.size(), 3u) << out;  // the model, its dense bf16 row, its Q4_1 as stored
    EXPECT_EQ(rows[1]["variant"], "dense_bf16");
    EXPECT_EQ(rows[2]["variant"], "as_stored_quant");
    const json& r = rows[0];
    EXPECT_EQ(r["kv_cache"], sub.starts_with("--kv-cache") ? "f16" : "f32") << sub;
    // Decode rounds X to int8 by default where a kernel for it exists: the Q4_1 row as stored
    // (its int8-X rows: AVX-512 VNNI + VBMI and AVX2), never the f32 and bf16 rows.
    const std::string isa = r["isa"].get<std::string>();
    const bool x8 = !sub.starts_with("--activations f32") && (isa == "AVX3_DL" || isa == "AVX2");
    EXPECT_EQ(rows[0]["activations"], "f32") << sub;
    EXPECT_EQ(rows[1]["activations"], "f32") << sub;
    EXPECT_EQ(rows[2]["activations"], x8 ? "int8" : "f32") << sub << " on " << isa;
    EXPECT_EQ(r["model"], "SmolLM2-135M-Instruct.Q4_1.gguf");
    EXPECT_EQ(r["threads"], 1);
    EXPECT_EQ(r["prompt_tokens"], 8);
    EXPECT_EQ(r["decode_tokens"], 2);
    EXPECT_GT(r["decode_tok_s"].get<double>(), 0.0);
    EXPECT_GT(r["prefill_tok_s"].get<double>(), 0.0);
    // Dense f32: every parameter of the file (inspect's total above) plus the tied head, which
    // the runtime keeps as its own f32 copy (49152 x 576).
    EXPECT_EQ(r["weight_bytes"].get<int64_t>(), 4 * (int64_t{134515008} + int64_t{49152} * 576));
  }
  std::string out;
  EXPECT_EQ(testing::RunCommand(Cli() + " bench kernls 2>&1", &out), 1);
  EXPECT_THAT(out, ::testing::HasSubstr("bench: 'kernls' is neither a subcommand")) << out;
  EXPECT_EQ(testing::RunCommand(Cli() + " --max-isa SSE4 bench kernls 2>&1", &out), 1);
  EXPECT_THAT(out, ::testing::HasSubstr("bench: 'kernls' is neither a subcommand")) << out;
  EXPECT_EQ(testing::RunCommand(Cli() + " --kv-cache bf16 bench '" + path_ + "'" + flags + " 2>&1",
                                &out),
            1);
  EXPECT_THAT(out, ::testing::HasSubstr("--kv-cache")) << out;
}

// `sparq generate` with its output piped (stdout and stderr into one pipe): the new text first,
// then the template line and the timing line from stderr, each on a line of its own (stdout is
// flushed before them; piped stdout is block-buffered, and the final newline used to come after
// them).
TEST_F(SmolLm2Test, GenerateThroughAPipeEndsTheTextBeforeTheTimingLine) {
  std::string out;
  ASSERT_EQ(testing::RunCommand(Cli() + " generate '" + path_ +
                                    "' --prompt 'The capital of France is' --max-new 4 "
                                    "--threads 1 --raw 2>&1",
                                &out),
            0)
      << out;
  const size_t tmpl = out.find("template: none (--raw)\n");
  const size_t timing = out.find("prefill: ");
  ASSERT_NE(tmpl, std::string::npos) << out;
  ASSERT_EQ(timing, tmpl + std::string("template: none (--raw)\n").size()) << out;
  ASSERT_GT(tmpl, 0u);
  EXPECT_EQ(out[tmpl - 1], '\n') << out;
  // The timing line is the last one: nothing of stdout (its final newline) comes after it.
  const std::string tail = "tok/s); 1 threads\n";
  ASSERT_GE(out.size(), tail.size());
  EXPECT_EQ(out.substr(out.size() - tail.size()), tail) << out;
}

// One value spec from the flag to the file (issue 42): --values and its alias --dtype write the
// same bytes; a spec the pattern cannot store is refused naming both.
TEST_F(SmolLm2Test, PruneValuesAndDtypeAreOneFlag) {
  const std::string dir = testing::TempDir();
  const std::string a = dir + "/pv.sparq", b = dir + "/pd.sparq";
  const std::string common = Cli() + " prune '" + path_ + "' --method magnitude --pattern 2:4 --blocks 1 " +
                             "--calib-samples 2 --calib-len 32 --threads 2 --calib '" +
                             testing::DataText("sherlock-holmes-pg1661.txt") + "'";
  std::string log;
  ASSERT_EQ(testing::RunCommand(common + " --values bf16 -o '" + a + "' 2>&1", &log), 0) << log;
  ASSERT_EQ(testing::RunCommand(common + " --dtype bf16 -o '" + b + "' 2>&1", &log), 0) << log;
  EXPECT_TRUE(testing::ReadFile(a) == testing::ReadFile(b)) << "--values bf16 and --dtype bf16 differ";
  EXPECT_EQ(testing::RunCommand(Cli() + " prune '" + path_ + "' --method magnitude --pattern 3:8 " +
                                    "--values int4:g64 --blocks 1 --calib '" +
                                    testing::DataText("sherlock-holmes-pg1661.txt") + "' -o '" +
                                    dir + "/pu.sparq' 2>&1",
                                &log),
            1);
  EXPECT_NE(
      log.find("values int4:g64: a group of 64 kept values is not a whole number of 3:8 groups"),
      std::string::npos)
      << log;
  EXPECT_FALSE(std::filesystem::exists(dir + "/pu.sparq"));
  for (const auto& p : {a, b}) std::remove(p.c_str());
}

// --allocation owl reaches PruneLlama (the per-block sparsities in the JSON report; the library
// test checks what they are); a wrong value is refused naming the flag.
TEST_F(SmolLm2Test, PruneAllocationOwl) {
  const std::string dir = testing::TempDir();
  const std::string out = dir + "/owl.sparq";
  const std::string common = Cli() + " prune '" + path_ + "' --method magnitude --pattern " +
                             "unstructured:0.5 --blocks 2 --calib-samples 2 --calib-len 32 " +
                             "--threads 2 --calib '" +
                             testing::DataText("sherlock-holmes-pg1661.txt") + "' -o '" + out + "'";
  std::string log;
  ASSERT_EQ(testing::RunCommand(common + " --allocation owl --json", &log), 0) << log;
  const json j = json::parse(log);
  ASSERT_TRUE(j.contains("block_sparsity")) << log;
  EXPECT_EQ(j["block_sparsity"].size(), 2u);
  EXPECT_NEAR(j["block_sparsity"][0].get<double>() + j["block_sparsity"][1].get<double>(), 1.0,
              1e-9);
  EXPECT_EQ(testing::RunCommand(common + " --allocation best 2>&1", &log), 1);
  EXPECT_NE(log.find("--allocation must be uniform or owl, not 'best'"), std::string::npos) << log;
  std::remove(out.c_str());
}

TEST_F(SmolLm2Test, ConvertTo24Bf16AndBackGivesExactlyTheMaskedWeights) {
  const std::string dir = testing::TempDir();
  const std::string sparq = dir + "/s.sparq", dense = dir + "/d.safetensors";
  const std::string include = R"(blk\..*\.(attn_q|attn_k|attn_v|attn_output|ffn_gate|ffn_up|ffn_down)\.weight)";
  std::string log;
  ASSERT_EQ(testing::RunCommand(Cli() + " convert '" + path_ + "' '" + sparq + "' --pattern 2:4 --include '" +
                                    include + "' --dtype bf16 2>&1",
                                &log),
            0)
      << log;
  std::string out;
  ASSERT_EQ(testing::RunCommand(Cli() + " inspect '" + sparq + "' --json", &out), 0);
  const json j = json::parse(out);
  EXPECT_EQ(j["kind"], "sparq");
  int converted = 0;
  for (const auto& t : j["tensors"]) {
    if (t["format"] == "dense") continue;
    ++converted;
    EXPECT_EQ(t["format"], "nm");
    EXPECT_EQ(t["recorded_pattern"], "2:4");
    const auto finest = t["pattern"].get<std::string>();
    EXPECT_TRUE(finest == "2:4" || finest == "1:4") << t["name"] << " finest " << finest;
    const uint64_t bf16_dense = t["dense_f32_bytes"].get<uint64_t>() / 2;
    EXPECT_LE(t["stored_bytes"].get<uint64_t>() * 16, bf16_dense * 9) << t["name"];
  }
  EXPECT_EQ(converted, 30 * 7);

  ASSERT_EQ(testing::RunCommand(Cli() + " convert '" + sparq + "' '" + dense + "' --format dense 2>&1", &log), 0)
      << log;
  auto back = SafetensorsFile::Open(dense);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->tensors().size(), 272u);
  const std::regex re(include);
  int compared = 0;
  for (const auto& info : file_->tensors()) {
    const SafetensorsEntry* e = back->Find(info.name);
    ASSERT_NE(e, nullptr) << info.name;
    auto w = file_->ReadF32(info);
    ASSERT_TRUE(w.ok());
    if (!std::regex_match(info.name, re)) {
      // Untouched: F32 stays F32 with the same bits; Q8_0 / Q4_1 are dequantized to f32.
      ASSERT_EQ(e->tensor.dtype(), DType::kF32) << info.name;
      ASSERT_EQ(std::memcmp(e->tensor.data(), w->data(), w->nbytes()), 0) << info.name;
      continue;
    }
    const int64_t m = info.shape()[0], k = info.shape()[1];
    float* x = w->mutable_data_as<float>();
    ASSERT_TRUE(MagnitudePrune(Pattern::NM(2, 4), std::span<float>(x, w->numel()), m, k).ok());
    ASSERT_EQ(e->tensor.dtype(), DType::kBF16) << info.name;
    ASSERT_EQ(e->tensor.shape(), info.shape());
    const uint16_t* got = e->tensor.data_as<uint16_t>();
    uint64_t diff = 0;
    for (uint64_t i = 0; i < w->numel(); ++i) diff += got[i] != F32ToBF16(x[i]);
    EXPECT_EQ(diff, 0u) << info.name;
    ++compared;
  }
  EXPECT_EQ(compared, 210);
}

// `convert --model`: the GGUF as a .sparq model every command loads, its Q4_1 / Q8_0 codes kept,
// so evaluating it gives the GGUF's perplexity to the last digit printed; flags that would change
// the model are refused and leave no file.
TEST_F(SmolLm2Test, ConvertModelKeepsTheGgufsCodesAndPerplexity) {
  const std::string out = testing::TempDir() + "/conv_model.sparq";
  std::string log;
  ASSERT_EQ(testing::RunCommand(Cli() + " convert '" + path_ + "' '" + out + "' --model 2>&1", &log),
            0)
      << log;
  EXPECT_THAT(log, ::testing::HasSubstr("int4:g32"));
  const std::string text = std::string(SPARQ_SOURCE_DIR) + "/data/text/wikitext-2-raw-test.txt";
  auto ppl = [&](const std::string& model) {
    std::string j;
    EXPECT_EQ(testing::RunCommand(Cli() + " eval '" + model + "' --text '" + text +
                                      "' --max-tokens 600 --threads 1 --json",
                                  &j),
              0);
    return json::parse(j)["perplexity"].get<double>();
  };
  EXPECT_EQ(ppl(out), ppl(path_));
  const auto size = std::filesystem::file_size(out);
  EXPECT_LT(size, std::filesystem::file_size(path_));  // the same codes; a tokenizer as JSON
  std::remove(out.c_str());
  for (const std::string bad : {" --pattern 2:4", " --values int4:g64", " --format nm"}) {
    EXPECT_EQ(testing::RunCommand(Cli() + " convert '" + path_ + "' '" + out + "' --model" + bad +
                                      " 2>&1",
                                  &log),
              1)
        << bad;
    EXPECT_FALSE(std::filesystem::exists(out)) << bad;
  }
}

TEST_F(SmolLm2Test, TruncatedCopyMakesInspectExit1) {
  const testing::Bytes all = testing::ReadFile(path_);
  const std::string cut = testing::TempDir() + "/cut.gguf";
  for (size_t n : {size_t{100}, all.size() / 100, all.size() / 2, all.size() - 1}) {
    testing::WriteFile(cut, testing::Bytes(all.begin(), all.begin() + n));
    std::string out;
    EXPECT_EQ(testing::RunCommand(Cli() + " inspect '" + cut + "' 2>&1", &out), 1) << n;
    EXPECT_THAT(out, ::testing::HasSubstr("cut.gguf")) << n;
  }
}

}  // namespace
}  // namespace sparq
