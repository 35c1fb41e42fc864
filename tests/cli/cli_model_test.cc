// The command line on SmolLM2-135M-Instruct and on a checkpoint pruned from it by the CLI
// (magnitude, unstructured 50%, block 0 only, a short calibration: fast): `generate` with the
// model's chat template (default), `--chat`, `--raw`, and an unrecognised template; every output
// mode of `inspect`, `eval` and `prune` (table, --json on stdout, --json FILE); `bench model` with
// its dense bf16 and as-stored rows and the machine's keys, at a tiny size (rows and keys, not
// timings); `eval` and `generate` with `--gguf-values`.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "sparq/kernel_config.h"

#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "data_testutil.h"
#include "cli/cli_testutil.h"
#include "io/io_testutil.h"
#include "sparq/checkpoint.h"

namespace sparq {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using json = nlohmann::json;

using testing::Cli;
using testing::RunSplit;
using testing::Slurp;

// Decode tokens from generate's speed line on stderr.
int DecodeTokens(const std::string& err) {
  std::smatch m;
  if (!std::regex_search(err, m, std::regex("decode: ([0-9]+) tokens"))) return -1;
  return std::stoi(m[1]);
}

constexpr const char* kSmolLmSystem =
    "template: chatml, default system message \"You are a helpful AI assistant named SmolLM, "
    "trained by Hugging Face\" (the model's chat template)\n";

class CliModelTest : public ::testing::Test {
 protected:
  // Prunes once for the suite (bare --json: the report alone on stdout).
  static void SetUpTestSuite() {
    model_ = new std::string(testing::SmolLm2Path());
    if (model_->empty()) return;
    const std::string dir = testing::TempDir();
    const std::string calib = dir + "/calib.txt";
    std::string text;
    for (int i = 0; i < 40; ++i) {
      text += "Sherlock Holmes took his bottle from the corner of the mantelpiece, and his "
              "hypodermic syringe from its neat morocco case. ";
    }
    std::ofstream(calib) << text;
    pruned_ = new std::string(dir + "/pruned.sparq");
    report_ = new std::string();
    std::string err;
    prune_rc_ = RunSplit("prune '" + *model_ + "' --method magnitude --pattern unstructured:0.5 --blocks 1 "
                    "--calib " + calib + " --calib-samples 2 --calib-len 32 --threads 1 -o " +
                        *pruned_ + " --json",
                    report_, &err);
    if (prune_rc_ != 0) *report_ += err;
  }
  static void TearDownTestSuite() {
    delete model_;
    delete pruned_;
    delete report_;
  }
  void SetUp() override {
    SPARQ_REQUIRE_MODEL();
    ASSERT_EQ(prune_rc_, 0) << *report_;
  }
  static std::string* model_;
  static std::string* pruned_;
  static std::string* report_;  // prune's stdout
  static int prune_rc_;
};
std::string* CliModelTest::model_ = nullptr;
std::string* CliModelTest::pruned_ = nullptr;
std::string* CliModelTest::report_ = nullptr;
int CliModelTest::prune_rc_ = -1;

// The command: before, the raw prompt ended after one token. With the template applied by
// default the model answers (greedy: the answer names Paris), stdout holds the answer only, and
// stderr says which template was applied, then the speed. With f32 activations: with the
// default int8 ones this Q4_1 file's greedy answer is llama.cpp's own ("L'Etoile, la Cite, la
// Nation, ...", llama-cpp-python 0.3.36 and sparq alike on a Zen 5, 2026-12-07), not Paris.
TEST_F(CliModelTest, GenerateAppliesTheModelsChatTemplateByDefault) {
  const std::string cmd = "--activations f32 generate '" + *model_ +
                          "' --prompt 'What is the capital of France?' --max-new 24 --threads 1";
  std::string out, err;
  ASSERT_EQ(RunSplit(cmd, &out, &err), 0) << err;
  EXPECT_GT(DecodeTokens(err), 1) << err;
  EXPECT_THAT(out, HasSubstr("Paris")) << out;
  for (const char* s : {"prefill:", "template:", "sparq:", "<|im_start|>", "What is the capital"}) {
    EXPECT_THAT(out, Not(HasSubstr(s))) << out;
  }
  EXPECT_THAT(err, HasSubstr(kSmolLmSystem)) << err;
  EXPECT_THAT(err, Not(HasSubstr("warning"))) << err;
  // The speed line is the last line.
  const size_t speed = err.find("prefill: ");
  ASSERT_NE(speed, std::string::npos);
  EXPECT_EQ(err.find('\n', speed), err.size() - 1) << err;

  std::string chat_out;
  ASSERT_EQ(RunSplit(cmd + " --chat", &chat_out, &err), 0) << err;
  EXPECT_EQ(chat_out, out);  // --chat is the default spelled out
  EXPECT_THAT(err, HasSubstr(kSmolLmSystem));
}

TEST_F(CliModelTest, GenerateRawUsesThePromptAsItIs) {
  std::string out, err;
  ASSERT_EQ(RunSplit("generate '" + *model_ + "' --prompt 'The capital of France is' --max-new 4 "
                "--threads 1 --raw", &out, &err), 0) << err;
  EXPECT_THAT(err, HasSubstr("template: none (--raw)\n"));
  EXPECT_EQ(DecodeTokens(err), 4) << err;
  EXPECT_THAT(out, Not(HasSubstr("The capital of France is"))) << out;  // the text only
  EXPECT_EQ(out.back(), '\n');
  EXPECT_EQ(RunSplit("generate '" + *model_ + "' --prompt x --raw --chat", &out, &err), 1);
  EXPECT_THAT(err, HasSubstr("--chat"));
}

// The pruned checkpoint carries the template (in its tokenizer); one with a template of another
// layout gets the raw prompt and a warning, and still runs.
TEST_F(CliModelTest, CheckpointTemplateAndAnUnrecognisedOne) {
  std::string out, err;
  ASSERT_EQ(RunSplit("generate " + *pruned_ + " --prompt 'Hi' --max-new 2 --threads 1", &out, &err), 0) << err;
  EXPECT_THAT(err, HasSubstr(kSmolLmSystem));

  const std::string other = testing::TempDir() + "/other_template.sparq";
  {
    auto ck = ReadCheckpoint(*pruned_);
    ASSERT_TRUE(ck.ok()) << ck.status().ToString();
    json tok = json::parse(ck->metadata.at("sparq.tokenizer"));
    ASSERT_EQ(tok["chat_template"].get<std::string>().substr(0, 24), "{% for message in messag");
    tok["chat_template"] =
        "{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
        "'<|end_header_id|>\\n\\n' + message['content'] + '<|eot_id|>' }}{% endfor %}";
    ck->metadata["sparq.tokenizer"] = tok.dump();
    ASSERT_TRUE(WriteCheckpoint(other, *ck).ok());
  }
  ASSERT_EQ(RunSplit("generate " + other + " --prompt 'Hi' --max-new 2 --threads 1", &out, &err), 0) << err;
  EXPECT_THAT(err, HasSubstr("sparq: warning: chat template not recognised: no family's markers"));
  EXPECT_THAT(err, HasSubstr("template: none (the model's chat template is not recognised; raw prompt)"));
  EXPECT_THAT(out, Not(HasSubstr("warning")));
  std::remove(other.c_str());
}

// prune's bare --json (the fixture): the report alone on stdout.
TEST_F(CliModelTest, PruneJsonReport) {
  const json r = json::parse(*report_);
  ASSERT_EQ(r["layers"].size(), 7u) << *report_;  // block 0's seven linear layers
  for (const auto& l : r["layers"]) {
    EXPECT_THAT(l["name"].get<std::string>(), ::testing::StartsWith("blk.0."));
    EXPECT_DOUBLE_EQ(l["sparsity"].get<double>(), 0.5) << l;
  }
  EXPECT_EQ(r["calib_tokens"], 64);
}

// `sparq quantize` (prune with the dense pattern): block 0's linears stored as dense int4:g64,
// each with its GPTQ error in the report; the checkpoint runs (eval); a spec that is not
// quantized is refused in one line.
TEST_F(CliModelTest, QuantizeStoresDenseInt4AndRuns) {
  const std::string dir = testing::TempDir(), calib = dir + "/quant_calib.txt",
                    out = dir + "/quantized.sparq";
  std::string text;
  for (int i = 0; i < 40; ++i) text += "Sherlock Holmes took his bottle from the mantelpiece. ";
  std::ofstream(calib) << text;
  std::string rep, err;
  ASSERT_EQ(RunSplit("quantize '" + *model_ + "' --values int4:g64 --blocks 1 --calib " + calib +
                         " --calib-samples 2 --calib-len 32 --threads 1 -o " + out + " --json",
                     &rep, &err),
            0)
      << err;
  const json r = json::parse(rep);
  ASSERT_EQ(r["layers"].size(), 7u) << rep;
  for (const auto& l : r["layers"]) {
    EXPECT_EQ(l["format"], "dense") << l;
    EXPECT_GT(l["rel_error"].get<double>(), 0.0) << l;
  }
  auto ck = ReadCheckpoint(out);
  ASSERT_TRUE(ck.ok()) << ck.status().ToString();
  const CheckpointTensor* q = ck->FindMatrix("blk.0.attn_q.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(ValuesName(q->matrix), "int4:g64");
  // GPTQ in act-order is the default where it applies, recorded with the run; both flags at once
  // are refused; where it does not apply (Wanda's pattern) the default runs without it.
  EXPECT_NE(ck->metadata.at("sparq.prune").find("\"act_order\":true"), std::string::npos);
  EXPECT_EQ(RunSplit("quantize '" + *model_ + "' --values int4:g64 --act-order --no-act-order " +
                         "--calib " + calib + " -o " + out + "_x",
                     &rep, &err),
            1);
  EXPECT_THAT(err, HasSubstr("--act-order and --no-act-order exclude each other")) << err;
  EXPECT_FALSE(std::filesystem::exists(out + "_x"));
  const std::string wanda = dir + "/wanda_int4.sparq";
  ASSERT_EQ(RunSplit("prune '" + *model_ + "' --method wanda --pattern 2:4 --values int4:g64 "
                         "--blocks 1 --calib " + calib +
                         " --calib-samples 2 --calib-len 32 --threads 1 -o " + wanda,
                     &rep, &err),
            0)
      << err;
  auto ckw = ReadCheckpoint(wanda);
  ASSERT_TRUE(ckw.ok()) << ckw.status().ToString();
  EXPECT_EQ(ckw->metadata.at("sparq.prune").find("act_order"), std::string::npos);
  std::filesystem::remove(wanda);
  std::string eval_out;
  EXPECT_EQ(RunSplit("eval " + out + " --text " + calib + " --max-tokens 64 --threads 1", &eval_out,
                     &err),
            0)
      << err;
  EXPECT_EQ(RunSplit("quantize '" + *model_ + "' --values bf16 --calib " + calib + " -o " + out,
                     &eval_out, &err),
            1);
  EXPECT_THAT(err, HasSubstr("--values must be int8[:gN] or int4[:gN][:sym], not 'bf16'")) << err;
  std::filesystem::remove(out);
}

// inspect on the CLI's own pruned checkpoint in its three modes (the crash: exit 2 on
// --json, a metadata preview cut inside a character).
TEST_F(CliModelTest, InspectPrunedCheckpointEveryMode) {
  std::string table, out, err;
  ASSERT_EQ(RunSplit("inspect " + *pruned_, &table, &err), 0) << err;
  EXPECT_THAT(table, HasSubstr("blk.0.attn_q.weight"));
  EXPECT_THAT(table, HasSubstr("unstructured:0.5000"));
  EXPECT_THAT(table, HasSubstr("sparq.tokenizer = {"));
  ASSERT_EQ(RunSplit("inspect " + *pruned_ + " --json", &out, &err), 0) << err;
  const json j = json::parse(out);
  EXPECT_EQ(j["kind"], "sparq");
  EXPECT_THAT(j["metadata"]["sparq.tokenizer"].get<std::string>(), HasSubstr("bytes)"));
  EXPECT_EQ(j["totals"]["params"], 134515008u);  // every parameter of the GGUF
  int pruned = 0;
  for (const auto& t : j["tensors"]) {
    if (t["name"].get<std::string>().rfind("blk.0.", 0) == 0 && t["shape"].size() == 2) {
      EXPECT_EQ(t["recorded_pattern"], "unstructured:0.5") << t["name"];
      EXPECT_DOUBLE_EQ(t["density"].get<double>(), 0.5) << t["name"];
      ++pruned;
    }
  }
  EXPECT_EQ(pruned, 7);
  const std::string file = testing::TempDir() + "/pruned_inspect.json";
  ASSERT_EQ(RunSplit("inspect " + *pruned_ + " --json " + file, &out, &err), 0) << err;
  EXPECT_EQ(out, table);
  EXPECT_EQ(json::parse(Slurp(file)), j);
}

TEST_F(CliModelTest, EvalEveryOutputMode) {
  const std::string text = testing::TempDir() + "/eval.txt";
  std::ofstream(text) << "The quick brown fox jumps over the lazy dog. It was the best of times, it "
                         "was the worst of times, it was the age of wisdom.\n";
  const std::string cmd = "eval " + *pruned_ + " --text " + text + " --ctx 16 --threads 1";
  std::string line, out, err;
  ASSERT_EQ(RunSplit(cmd, &line, &err), 0) << err;
  EXPECT_THAT(line, ::testing::StartsWith("perplexity "));
  ASSERT_EQ(RunSplit(cmd + " --json", &out, &err), 0) << err;
  const json j = json::parse(out);
  EXPECT_EQ(j["ctx"], 16);
  EXPECT_GT(j["perplexity"].get<double>(), 1.0);
  const std::string file = testing::TempDir() + "/eval.json";
  ASSERT_EQ(RunSplit(cmd + " --json " + file, &out, &err), 0) << err;
  EXPECT_THAT(out, ::testing::StartsWith("perplexity "));
  EXPECT_EQ(json::parse(Slurp(file))["perplexity"], j["perplexity"]);  // same run, same bits
}

// bench model --ppl-text scores every row on the same ids: its perplexity is eval's on the same
// text, token count and window (the same model, the same windows, so the same bits).
TEST_F(CliModelTest, BenchModelPerplexityIsEvalsOnTheSameTokens) {
  const std::string text = testing::TempDir() + "/bench_ppl.txt";
  std::ofstream(text) << "It was the best of times, it was the worst of times, it was the age of "
                         "wisdom, it was the age of foolishness, it was the epoch of belief.\n";
  std::string out, err;
  ASSERT_EQ(RunSplit("bench model " + *pruned_ +
                         " --threads 1 --prompt 8 --decode 2 --repeats 1 --ppl-text " + text +
                         " --ppl-tokens 24 --ctx 8 --json",
                     &out, &err),
            0)
      << err;
  const json rows = json::parse(out);
  ASSERT_EQ(rows.size(), 1u) << out;
  ASSERT_EQ(RunSplit("eval " + *pruned_ + " --text " + text +
                         " --max-tokens 24 --ctx 8 --threads 1 --json",
                     &out, &err),
            0)
      << err;
  const json e = json::parse(out);
  EXPECT_EQ(e["tokens"], 21) << out;  // 3 windows of 8 predict 7 each
  EXPECT_EQ(rows[0]["perplexity"].get<double>(), e["perplexity"].get<double>());
  // A text too short to score is refused.
  std::ofstream(text) << "It";
  EXPECT_EQ(RunSplit("bench model " + *pruned_ + " --prompt 8 --decode 2 --repeats 1 --ppl-text " +
                         text,
                     &out, &err),
            1);
  EXPECT_THAT(err, HasSubstr("fewer than 2 tokens to score"));
}

// `--max-isa AVX2 eval` runs the layers and attention on AVX2 (every x86-64 host this project
// supports has it), and says so in its JSON; uncapped, attention runs the layers' target.
TEST_F(CliModelTest, EvalMaxIsaRunsAttentionOnTheCappedTarget) {
  const std::string text = testing::TempDir() + "/eval_isa.txt";
  std::ofstream(text) << "It was the best of times, it was the worst of times.\n";
  const std::string cmd = "eval " + *pruned_ + " --text " + text + " --ctx 8 --threads 1 --json";
  std::string out, err;
  ASSERT_EQ(RunSplit("--max-isa AVX2 " + cmd, &out, &err), 0) << err;
  json j = json::parse(out);
  EXPECT_EQ(j["isa"], "AVX2") << out;
  EXPECT_EQ(j["attention_isa"], "AVX2") << out;
  ASSERT_EQ(RunSplit(cmd, &out, &err), 0) << err;
  j = json::parse(out);
  EXPECT_EQ(j["attention_isa"], j["isa"]) << out;
}

// bench model at a tiny size: the dense model, its dense bf16 row right after it, its Q4_1 run as
// stored, the pruned checkpoint; every row names the CPU and the running ISA.
TEST_F(CliModelTest, BenchModelDenseBf16RowAndMachineKeys) {
  const std::string flags = " --threads 1 --prompt 8 --decode 2 --repeats 1";
  std::string out, err;
  ASSERT_EQ(RunSplit("bench model '" + *model_ + "' " + *pruned_ + flags + " --json", &out, &err), 0) << err;
  const json rows = json::parse(out);
  ASSERT_EQ(rows.size(), 4u) << out;
  EXPECT_EQ(rows[0]["model"], "SmolLM2-135M-Instruct.Q4_1.gguf");
  EXPECT_EQ(rows[0]["variant"], "as_stored");
  EXPECT_EQ(rows[1]["model"], "SmolLM2-135M-Instruct.Q4_1.gguf [dense bf16]");
  EXPECT_EQ(rows[1]["variant"], "dense_bf16");
  EXPECT_EQ(rows[2]["model"], "SmolLM2-135M-Instruct.Q4_1.gguf [as stored]");
  EXPECT_EQ(rows[2]["variant"], "as_stored_quant");
  EXPECT_EQ(rows[3]["model"], "pruned.sparq");
  EXPECT_EQ(rows[3]["variant"], "as_stored");
  // Bytes, exactly: block linears 106,168,320 parameters (all 134,515,008 less the embedding
  // 49152 x 576 and the 61 norms of 576), the tied head 49152 x 576; bf16 row: 2 bytes for those,
  // the embedding and norms stay f32.
  const int64_t linears = 106168320, embd = int64_t{49152} * 576, norms = 61 * 576;
  EXPECT_EQ(rows[0]["block_linear_bytes"].get<int64_t>(), 4 * linears);
  EXPECT_EQ(rows[1]["block_linear_bytes"].get<int64_t>(), 2 * linears);
  EXPECT_EQ(rows[1]["weight_bytes"].get<int64_t>(), 2 * (linears + embd) + 4 * (embd + norms));
  // The CLI's run inherits SPARQ_MAX_ISA, and this process's detection is capped the same way.
  const std::string running = KernelConfig::FromMachine().value().target_name();
  // Bytes a decoded token reads: every linear layer, the head, the norms and one embedding row.
  EXPECT_EQ(rows[0]["weight_bytes_per_token"].get<int64_t>(),
            4 * (linears + embd + norms) + 4 * 576);
  EXPECT_EQ(rows[1]["weight_bytes_per_token"].get<int64_t>(),
            2 * (linears + embd) + 4 * norms + 4 * 576);
  EXPECT_EQ(rows[0]["values"], "f32");  // the GGUF's Q4_1 dequantized, as sparq runs it
  EXPECT_EQ(rows[1]["values"], "bf16");
  EXPECT_EQ(rows[2]["values"], "int4:g32");  // Q4_1 as stored
  EXPECT_EQ(rows[3]["values"], "f32");       // magnitude 50%, f32 values
  // File bytes and bits per weight of the file (all parameters: linears, embedding, norms); the
  // bf16 row exists only in memory.
  const int64_t gguf = static_cast<int64_t>(std::filesystem::file_size(*model_));
  EXPECT_EQ(rows[0]["file_bytes"].get<int64_t>(), gguf);
  EXPECT_DOUBLE_EQ(rows[0]["bits_per_weight"].get<double>(),
                   8.0 * double(gguf) / double(linears + embd + norms));
  EXPECT_TRUE(rows[1]["file_bytes"].is_null());
  EXPECT_TRUE(rows[1]["bits_per_weight"].is_null());
  EXPECT_EQ(rows[2]["file_bytes"].get<int64_t>(), gguf);  // the file as it runs
  EXPECT_EQ(rows[3]["file_bytes"].get<int64_t>(),
            static_cast<int64_t>(std::filesystem::file_size(*pruned_)));
  for (const auto& r : rows) {
    EXPECT_TRUE(r["perplexity"].is_null()) << "no --ppl-text, no perplexity: " << r;
    for (const char* k : {"model", "variant", "runtime", "decode_tok_s", "prefill_tok_s", "weight_bytes",
                          "block_linear_bytes", "threads", "prompt_tokens", "decode_tokens", "cpu_model",
                          "isa", "values", "file_bytes", "bits_per_weight", "weight_bytes_per_token",
                          "perplexity"}) {
      EXPECT_TRUE(r.contains(k)) << k << " missing in " << r;
    }
    EXPECT_EQ(r["decode_tokens"], 2);
    EXPECT_GT(r["decode_tok_s"].get<double>(), 0.0);
    EXPECT_NE(r["cpu_model"].get<std::string>(), "");
    EXPECT_NE(r["cpu_model"].get<std::string>(), "unknown");
    EXPECT_EQ(running, r["isa"].get<std::string>());
  }
  // The table names the machine and shows the bf16 row; --no-dense-bf16 leaves it out (the
  // as-stored row stays).
  ASSERT_EQ(RunSplit("bench model '" + *model_ + "'" + flags, &out, &err), 0) << err;
  EXPECT_THAT(out, ::testing::StartsWith("cpu: " + rows[0]["cpu_model"].get<std::string>() +
                                         "; isa: " + rows[0]["isa"].get<std::string>() + "; 1 threads\n"));
  EXPECT_THAT(out, HasSubstr("[dense bf16]"));
  ASSERT_EQ(RunSplit("bench model '" + *model_ + "'" + flags + " --no-dense-bf16 --json", &out, &err), 0) << err;
  EXPECT_EQ(json::parse(out).size(), 2u);
  // A pruned first model has no dense bf16 form: no such row, a note naming the layer.
  ASSERT_EQ(RunSplit("bench model " + *pruned_ + flags + " --json", &out, &err), 0) << err;
  EXPECT_EQ(json::parse(out).size(), 1u);
  EXPECT_THAT(err, HasSubstr("no dense bf16 row: blk.0.attn_q.weight is stored as"));
}

// The bench: `--no-dense-bf16` still gives the [as stored] row right after the model, its
// block linears int4:g32 at 3/4 byte per weight (codes, f32 scale and min per 32) and the tied
// Q8_0 head int8:g32 at 9/8 byte, which is also the embedding: no f32 table, one head row (576 x
// 9/8 bytes) read per token for the lookup.
TEST_F(CliModelTest, BenchModelAsStoredRowOfAQ41Gguf) {
  std::string out, err;
  ASSERT_EQ(RunSplit("bench model '" + *model_ + "' --no-dense-bf16 --prompt 8 --decode 2 " +
                         "--repeats 1 --threads 1 --json",
                     &out, &err),
            0)
      << err;
  const json rows = json::parse(out);
  ASSERT_EQ(rows.size(), 2u) << out;
  EXPECT_EQ(rows[0]["variant"], "as_stored");
  EXPECT_EQ(rows[0]["values"], "f32");
  const json& r = rows[1];
  EXPECT_EQ(r["model"], "SmolLM2-135M-Instruct.Q4_1.gguf [as stored]");
  EXPECT_EQ(r["variant"], "as_stored_quant");
  EXPECT_EQ(r["values"], "int4:g32");
  EXPECT_EQ(r["runtime"], "sparq");
  EXPECT_GT(r["decode_tok_s"].get<double>(), 0.0);
  const int64_t linears = 106168320, embd = int64_t{49152} * 576, norms = 61 * 576;
  EXPECT_EQ(r["block_linear_bytes"].get<int64_t>(), linears * 3 / 4);
  EXPECT_EQ(r["weight_bytes_per_token"].get<int64_t>(),
            linears * 3 / 4 + embd * 9 / 8 + 4 * norms + 576 * 9 / 8);
  EXPECT_EQ(r["weight_bytes"].get<int64_t>(), linears * 3 / 4 + embd * 9 / 8 + 4 * norms);
  // A .sparq first model has no such row.
  ASSERT_EQ(RunSplit("bench model " + *pruned_ + " --no-dense-bf16 --prompt 8 --decode 2 " +
                         "--repeats 1 --threads 1 --json",
                     &out, &err),
            0)
      << err;
  EXPECT_EQ(json::parse(out).size(), 1u);
}

// eval --gguf-values: as-stored is the default (the same bits as no flag); f32 gives nearly the
// same perplexity (f32 summation order only; the library test bounds it on 1,024 tokens); a wrong
// value is refused, naming the choices. With f32 activations: 16-token windows are decode-sized,
// so with the default int8 ones only the as-stored weights would round X.
TEST_F(CliModelTest, EvalAndGenerateGgufValues) {
  const std::string text = testing::TempDir() + "/eval-gv.txt";
  std::ofstream(text)
      << "The quick brown fox jumps over the lazy dog. It was the best of times, it "
         "was the worst of times, it was the age of wisdom.\n";
  const std::string cmd =
      "--activations f32 eval '" + *model_ + "' --text " + text + " --ctx 16 --threads 1 --json";
  std::string out, err;
  ASSERT_EQ(RunSplit(cmd, &out, &err), 0) << err;
  const double base = json::parse(out)["perplexity"].get<double>();
  ASSERT_EQ(RunSplit(cmd + " --gguf-values as-stored", &out, &err), 0) << err;
  EXPECT_EQ(json::parse(out)["perplexity"].get<double>(), base);
  ASSERT_EQ(RunSplit(cmd + " --gguf-values f32", &out, &err), 0) << err;
  EXPECT_NEAR(json::parse(out)["perplexity"].get<double>() / base, 1.0, 1e-4);
  EXPECT_EQ(RunSplit(cmd + " --gguf-values q4", &out, &err), 1);
  EXPECT_THAT(err, HasSubstr("--gguf-values"));
  ASSERT_EQ(RunSplit("generate '" + *model_ + "' --prompt 'The capital of France is' --raw " +
                         "--max-new 4 --threads 1 --gguf-values f32",
                     &out, &err),
            0)
      << err;
  EXPECT_THAT(err, HasSubstr("decode: "));
}

}  // namespace
}  // namespace sparq
