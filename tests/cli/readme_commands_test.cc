// The README's commands, end to end at a small size (issue 25, section 2): the ones no other CLI
// test runs. The README's worked example (`prune` with SparseGPT to 2:4 with bf16 values on the
// repo's calibration text, then `inspect`, `eval` and `generate` on the result), `sparq demo
// --quick` (from a folder outside the checkout: it finds data/text/ itself; its table, its dense
// bf16 row and its checkpoints), `demo --formats`, `bench kernels --plot` (the PNG exists and
// decodes) with bench/peers/targets_table.py on its rows, `bench machine`, and `sparq bench MODEL`
// (the short spelling of `bench model`).
// Run elsewhere: convert (ConvertTest), prune-layer (PruneLayerCli), every output mode of inspect,
// eval and prune, generate's chat template and bench model's rows (CliModelTest), bench kernels
// --json (JsonFlagTest).
//
// Every output goes to one folder per process under the system temp folder, removed at exit.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "data_testutil.h"

namespace sparq {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;
using json = nlohmann::json;

constexpr const char* kCalibText = "sherlock-holmes-pg1661.txt";
constexpr const char* kEvalText = "wikitext-2-raw-test.txt";

// SmolLM2-135M: 30 blocks of 7 linear layers, 106,168,320 block-linear parameters.
constexpr int kBlockLinears = 30 * 7;
constexpr int64_t kBlockLinearParams = 106168320;

// This process's output folder (created on first use, removed by the environment below).
const std::string& OutDir() {
  static const std::string dir = [] {
    const fs::path d = fs::temp_directory_path() / ("sparq_readme_" + std::to_string(::getpid()));
    fs::remove_all(d);
    fs::create_directories(d);
    return d.string();
  }();
  return dir;
}

class RemoveOutDir : public ::testing::Environment {
 public:
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(OutDir(), ec);
  }
};
const auto* const kRemoveOutDir = ::testing::AddGlobalTestEnvironment(new RemoveOutDir);

std::string Quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs `cmd` with /bin/sh, stdout and stderr captured apart; returns the exit code (-1 if it did
// not exit normally).
int Shell(const std::string& cmd, std::string* out, std::string* err) {
  static int serial = 0;
  const std::string base = OutDir() + "/run" + std::to_string(++serial);
  const int status = std::system(("{ " + cmd + "; } >" + base + ".out 2>" + base + ".err").c_str());
  *out = Slurp(base + ".out");
  *err = Slurp(base + ".err");
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// The sparq CLI with `args` (already quoted where needed).
int Sparq(const std::string& args, std::string* out, std::string* err) {
  return Shell(Quote(SPARQ_CLI_PATH) + " " + args, out, err);
}

std::string Model() { return Quote(testing::SmolLmModelPath()); }

double Number(const std::string& s) {
  try {
    return std::stod(s);
  } catch (...) {
    return std::nan("");
  }
}

// ---- the README's worked example: prune, then inspect / eval / generate the checkpoint --------

class ReadmeExample : public ::testing::Test {
 protected:
  // Prunes once for the suite: the README's `prune` line with a short calibration (2 x 64 tokens)
  // and block 0 only.
  static void SetUpTestSuite() {
    if (!testing::FileExists(testing::SmolLmModelPath()) ||
        !testing::FileExists(testing::DataText(kCalibText))) {
      return;
    }
    pruned_ = new std::string(OutDir() + "/pruned-2of4-bf16.sparq");
    log_ = new std::string();
    std::string out, err;
    rc_ = Sparq("prune " + Model() + " --method sparsegpt --pattern 2:4 --dtype bf16 --calib " +
                    Quote(testing::DataText(kCalibText)) +
                    " --calib-samples 2 --calib-len 64 --blocks 1 --threads 2 -o " + Quote(*pruned_),
                &out, &err);
    *log_ = out + err;
  }
  static void TearDownTestSuite() {
    delete pruned_;
    delete log_;
    pruned_ = log_ = nullptr;
  }
  void SetUp() override {
    SPARQ_REQUIRE_MODEL();
    SPARQ_REQUIRE_TEXT(kCalibText);
    SPARQ_REQUIRE_TEXT(kEvalText);
    ASSERT_EQ(rc_, 0) << *log_;
    ASSERT_TRUE(testing::FileExists(*pruned_)) << *log_;
  }
  static std::string* pruned_;
  static std::string* log_;
  static int rc_;
};
std::string* ReadmeExample::pruned_ = nullptr;
std::string* ReadmeExample::log_ = nullptr;
int ReadmeExample::rc_ = -1;

// The checkpoint holds what the flags asked for: block 0's seven linears stored as 2:4 with bf16
// values (every group of 4 keeps 2: density exactly 0.5), the other blocks untouched.
TEST_F(ReadmeExample, InspectShowsTwoFourBf16InBlockZeroOnly) {
  std::string out, err;
  ASSERT_EQ(Sparq("inspect " + Quote(*pruned_) + " --json", &out, &err), 0) << err;
  const json j = json::parse(out);
  EXPECT_EQ(j["kind"], "sparq");
  int pruned = 0, dense_linears = 0;
  for (const auto& t : j["tensors"]) {
    const std::string name = t["name"];
    if (t["shape"].size() != 2 || name.find("token_embd") != std::string::npos) continue;
    if (name.rfind("blk.0.", 0) == 0) {
      EXPECT_EQ(t["recorded_pattern"], "2:4") << name;
      EXPECT_EQ(t["dtype"], "bf16") << name;
      EXPECT_DOUBLE_EQ(t["density"].get<double>(), 0.5) << name;
      ++pruned;
    } else if (name.rfind("blk.", 0) == 0) {
      EXPECT_GT(t["density"].get<double>(), 0.99) << name;
      ++dense_linears;
    }
  }
  EXPECT_EQ(pruned, 7);
  EXPECT_EQ(dense_linears, kBlockLinears - 7);
}

// `eval` on the same 512 WikiText tokens: the dense GGUF, then the checkpoint. Pruning block 0 to
// 2:4 costs perplexity (the CLI-default table has 2:4 on every block at 5x dense; one block is
// still well above the reruns' noise of ~1%), and both figures are sane.
TEST_F(ReadmeExample, EvalCheckpointAgainstTheDenseModel) {
  const std::string flags = " --text " + Quote(testing::DataText(kEvalText)) +
                            " --max-tokens 512 --ctx 256 --threads 2 --json";
  std::string out, err;
  ASSERT_EQ(Sparq("eval " + Model() + flags, &out, &err), 0) << err;
  const json dense = json::parse(out);
  ASSERT_EQ(Sparq("eval " + Quote(*pruned_) + flags, &out, &err), 0) << err;
  const json pruned = json::parse(out);
  EXPECT_EQ(dense["ctx"], 256);
  EXPECT_EQ(pruned["tokens"], dense["tokens"]);
  const double d = dense["perplexity"], p = pruned["perplexity"];
  EXPECT_GT(d, 5.0);   // SmolLM2 on WikiText: ~27-36 on short slices
  EXPECT_LT(d, 100.0);
  EXPECT_GT(p, d * 1.01) << "dense " << d << ", block 0 at 2:4 " << p;
  EXPECT_LT(p, d * 3.0) << "dense " << d << ", block 0 at 2:4 " << p;
}

// `generate` on the checkpoint: the model's chat template (it travels in the checkpoint), the
// generated text alone on stdout, the speed line on stderr.
TEST_F(ReadmeExample, GenerateFromTheCheckpoint) {
  std::string out, err;
  ASSERT_EQ(Sparq("generate " + Quote(*pruned_) +
                      " --prompt 'What is the capital of France?' --max-new 8 --threads 2",
                  &out, &err),
            0)
      << err;
  EXPECT_THAT(err, HasSubstr("template: chatml"));
  std::smatch m;
  ASSERT_TRUE(std::regex_search(err, m, std::regex("decode: ([0-9]+) tokens"))) << err;
  EXPECT_GE(std::stoi(m[1]), 1);
  EXPECT_LE(std::stoi(m[1]), 8);
  EXPECT_FALSE(out.empty());
  EXPECT_THAT(out, Not(HasSubstr("What is the capital")));
  EXPECT_THAT(out, Not(HasSubstr("decode:")));
}

// `sparq bench MODEL` is `sparq bench model MODEL`: the same rows, the named model first.
TEST_F(ReadmeExample, BenchModelShortSpelling) {
  std::string out, err;
  ASSERT_EQ(Sparq("bench " + Quote(*pruned_) +
                      " --threads 1 --prompt 8 --decode 2 --repeats 1 --json",
                  &out, &err),
            0)
      << err;
  const json rows = json::parse(out);
  ASSERT_TRUE(rows.is_array());
  ASSERT_EQ(rows.size(), 1u) << out;  // a pruned first model has no dense bf16 row
  EXPECT_EQ(rows[0]["model"], "pruned-2of4-bf16.sparq");
  EXPECT_EQ(rows[0]["decode_tokens"], 2);
  EXPECT_GT(rows[0]["decode_tok_s"].get<double>(), 0.0);
  EXPECT_EQ(rows[0]["block_linear_bytes"].get<int64_t>() % 2, 0);
}

// ---- sparq demo ------------------------------------------------------------------------------

struct DemoTableRow {
  double ppl = 0, decode = 0, prefill = 0, weights_mb = 0, linears_mb = 0;
};

// The row of the demo's table that starts with `label`.
bool FindDemoRow(const std::string& table, const std::string& label, DemoTableRow* row) {
  std::istringstream in(table);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(label, 0) != 0 || line.find('"') != std::string::npos) continue;
    std::istringstream rest(line.substr(label.size()));
    std::vector<std::string> f;
    for (std::string w; rest >> w;) f.push_back(w);
    if (f.size() != 6) continue;
    *row = {Number(f[0]), Number(f[1]), Number(f[2]), Number(f[3]), Number(f[4])};
    return true;
  }
  return false;
}

// The README's first command in its fast mode, from a folder outside the checkout (so the texts
// are found next to the binary), with its own cache (SPARQ_CACHE) for the checkpoints. Still the
// longest test here: --quick prunes all 210 layers twice with SparseGPT (about a minute on 2 idle
// cores), which no flag shortens.
TEST(ReadmeDemo, QuickRunFindsItsTextsAndPrintsEveryRow) {
  SPARQ_REQUIRE_MODEL();
  SPARQ_REQUIRE_TEXT(kCalibText);
  SPARQ_REQUIRE_TEXT(kEvalText);
  const std::string cache = OutDir() + "/demo-cache", cwd = OutDir() + "/elsewhere";
  fs::create_directories(cwd);
  std::string out, err;
  ASSERT_EQ(Shell("cd " + Quote(cwd) + " && SPARQ_CACHE=" + Quote(cache) +
                      " SPARQ_MODEL=" + Model() + " " + Quote(SPARQ_CLI_PATH) +
                      " demo --quick --threads 2 --calib-samples 2 --calib-len 64"
                      " --eval-tokens 256 --ctx 128",
                  &out, &err),
            0)
      << out << err;
  // The texts it used, by path: the checkout's data/text/.
  const auto same_file = [](const std::string& printed, const std::string& want) {
    std::error_code ec;
    return fs::equivalent(printed, want, ec);
  };
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("calibration text: (\\S+)"))) << out;
  EXPECT_TRUE(same_file(m[1], testing::DataText(kCalibText))) << m[1];
  ASSERT_TRUE(std::regex_search(out, m, std::regex("evaluation text: +(\\S+)"))) << out;
  EXPECT_TRUE(same_file(m[1], testing::DataText(kEvalText))) << m[1];
  EXPECT_THAT(out, HasSubstr("calibration: 2 x 64 tokens; perplexity: first 256 tokens, ctx 128"));

  DemoTableRow f32, bf16, u50, nm24;
  ASSERT_TRUE(FindDemoRow(out, "dense (Q4_1 dequantized to f32)", &f32)) << out;
  ASSERT_TRUE(FindDemoRow(out, "dense, bf16 weights", &bf16)) << out;
  ASSERT_TRUE(FindDemoRow(out, "SparseGPT 50% unstructured, bf16", &u50)) << out;
  ASSERT_TRUE(FindDemoRow(out, "SparseGPT 2:4, bf16", &nm24)) << out;
  // Block linears, MB: 4 bytes per parameter dense f32, 2 in bf16; 2:4 bf16 keeps half the values
  // (2 bytes) plus 4 bits of indices per kept pair's group (1/2 byte per 4 weights): 9/32 of f32.
  EXPECT_NEAR(f32.linears_mb, 4.0 * kBlockLinearParams / 1e6, 0.051);
  EXPECT_NEAR(bf16.linears_mb, 2.0 * kBlockLinearParams / 1e6, 0.051);
  EXPECT_NEAR(nm24.linears_mb, (9.0 / 8.0) * kBlockLinearParams / 1e6, 0.051);
  EXPECT_LT(u50.linears_mb, bf16.linears_mb * 0.6);
  // Rounding the weights to bf16 moves perplexity little; pruning every block moves it a lot.
  EXPECT_GT(f32.ppl, 5.0);
  EXPECT_LT(f32.ppl, 100.0);
  EXPECT_NEAR(bf16.ppl, f32.ppl, 0.02 * f32.ppl);
  EXPECT_GT(u50.ppl, 1.2 * bf16.ppl);
  EXPECT_GT(nm24.ppl, u50.ppl);
  for (const DemoTableRow& r : {f32, bf16, u50, nm24}) {
    EXPECT_GT(r.decode, 0.0);
    EXPECT_GT(r.prefill, 0.0);
  }
  EXPECT_THAT(out, HasSubstr("what bf16 buys (vs dense f32): dense, bf16 weights: perplexity x"));
  EXPECT_THAT(out, HasSubstr("what sparsity buys (vs dense bf16):"));
  EXPECT_THAT(out, HasSubstr("\"The history of the city of London"));

  // Its checkpoints, in <cache>/demo-quick, as `inspect --json` reads them: every block linear
  // stored with its pattern.
  for (const auto& [file, pattern] : std::vector<std::pair<std::string, std::string>>{
           {"smollm2-sparsegpt-2of4-bf16.sparq", "2:4"},
           {"smollm2-sparsegpt-u50-bf16.sparq", "unstructured:0.5"}}) {
    const std::string path = cache + "/demo-quick/" + file;
    ASSERT_TRUE(testing::FileExists(path)) << path;
    std::string js, jerr;
    ASSERT_EQ(Sparq("inspect " + Quote(path) + " --json", &js, &jerr), 0) << jerr;
    const json j = json::parse(js);
    int with_pattern = 0;
    for (const auto& t : j["tensors"]) {
      if (t.contains("recorded_pattern") && t["recorded_pattern"] == pattern) ++with_pattern;
    }
    EXPECT_EQ(with_pattern, kBlockLinears) << file;
  }
}

// `demo --formats` on a small layer: every pattern in every format round-trips exactly.
TEST(ReadmeDemo, FormatsTableRoundTripsEveryFormat) {
  std::string out, err;
  ASSERT_EQ(Sparq("demo --formats --rows 64 --cols 128 --threads 2", &out, &err), 0) << err;
  EXPECT_THAT(out, HasSubstr("a 64 x 128 layer"));
  int rows = 0;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    std::istringstream w(line);
    std::vector<std::string> f;
    for (std::string s; w >> s;) f.push_back(s);
    if (f.size() != 8 || (f[2] != "f32" && f[2] != "bf16")) continue;
    EXPECT_EQ(f[6], "yes") << line;
    ++rows;
  }
  EXPECT_GE(rows, 20) << out;  // dense + 10 patterns, each in f32 and bf16, auto format and CSR
  for (const char* p : {"2:4", "1:4", "unstructured:0.9", "block:16x16", "vnm:16:2:4", "rows:0.3"}) {
    EXPECT_THAT(out, HasSubstr(p));
  }
}

// ---- bench kernels --plot, targets_table.py, bench machine -----------------------------------

uint32_t BigEndian32(const std::string& b, size_t at) {
  return (uint32_t{static_cast<uint8_t>(b[at])} << 24) |
         (uint32_t{static_cast<uint8_t>(b[at + 1])} << 16) |
         (uint32_t{static_cast<uint8_t>(b[at + 2])} << 8) | uint32_t{static_cast<uint8_t>(b[at + 3])};
}

// The plot scripts' dependency, and the start of every PNG they write (8 signature bytes, then
// the IHDR chunk: 33 bytes at least).
bool HasMatplotlib(const std::string& py) {
  std::string out, err;
  return Shell(Quote(py) + " -c 'import matplotlib'", &out, &err) == 0;
}
constexpr const char* kGetMatplotlib = "run scripts/install_deps.sh (it installs it in .venv/)";
void ExpectPngSignature(const std::string& b) {
  ASSERT_GE(b.size(), 33u);
  EXPECT_EQ(b.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
}

// The README's `bench kernels --json out.json --plot speedup.png` at one shape and one pattern,
// run from the repository root as the README does; then `targets_table.py out.json` on its rows.
TEST(ReadmeBench, KernelsPlotIsAPngThatDecodes) {
  const std::string py = testing::PythonInterpreter();
  std::string out, err;
  SPARQ_REQUIRE(HasMatplotlib(py), "matplotlib missing in " + py + ": " + kGetMatplotlib);
  const std::string rows_path = OutDir() + "/kernels.json", png = OutDir() + "/speedup.png";
  ASSERT_EQ(Shell("cd " + Quote(SPARQ_SOURCE_DIR) + " && " + Quote(SPARQ_CLI_PATH) +
                      " bench kernels --shapes 256x256 --n 1 --patterns 2:4 --threads 1 --repeats 1"
                      " --py-peers '' --json " + Quote(rows_path) + " --plot " + Quote(png),
                  &out, &err),
            0)
      << out << err;
  const json rows = json::parse(Slurp(rows_path));
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0]["pattern"], "2:4");
  EXPECT_GT(rows[0]["speedup"].get<double>(), 0.0);

  // The PNG: signature, then the IHDR chunk with a plausible size ...
  const std::string b = Slurp(png);
  ExpectPngSignature(b);
  if (HasFatalFailure()) return;  // too short for the IHDR reads below
  EXPECT_EQ(b.substr(12, 4), "IHDR");
  const uint32_t width = BigEndian32(b, 16), height = BigEndian32(b, 20);
  EXPECT_GE(width, 200u);
  EXPECT_GE(height, 100u);
  EXPECT_LE(width, 10000u);
  EXPECT_LE(height, 10000u);
  EXPECT_FALSE(testing::FileExists(png + ".rows.json"));  // the plot's temporary input is gone
  // ... and matplotlib decodes the whole image to that size, not a blank one.
  ASSERT_EQ(Shell(Quote(py) + " -c 'import sys, matplotlib.image as m; a = m.imread(sys.argv[1]); "
                  "print(a.shape[1], a.shape[0], int(a.min() < a.max()))' " + Quote(png),
                  &out, &err),
            0)
      << err;
  EXPECT_EQ(out, std::to_string(width) + " " + std::to_string(height) + " 1\n");

  // The targets table reads the same rows (it needs no package beyond Python's own).
  ASSERT_EQ(Shell("cd " + Quote(SPARQ_SOURCE_DIR) + " && " + Quote(py) +
                      " bench/peers/targets_table.py " + Quote(rows_path) + " --threads 1",
                  &out, &err),
            0)
      << err;
  EXPECT_THAT(out, HasSubstr("|")) << out;
}

// bench/pareto.py (issue 27's picture) on hand-made `bench model` rows whose fronts are known: a
// row dominated on both axes is off both fronts, a row without perplexity is left out, llama.cpp's
// file size stands in for its bytes per token; the PNG decodes.
TEST(ReadmeBench, ParetoPlotMarksTheFront) {
  const std::string py = testing::PythonInterpreter();
  std::string out, err;
  SPARQ_REQUIRE(HasMatplotlib(py), "matplotlib missing in " + py + ": " + kGetMatplotlib);
  const std::string rows_path = OutDir() + "/model-rows.json", png = OutDir() + "/pareto.png";
  // ppl / MB per token / tok/s: a 10 / 100 / 50, b 20 / 50 / 100, c 30 / 120 / 40 (dominated by
  // a in both panels), e without perplexity, llama.cpp 11 / 98 (file) / 60.
  std::ofstream(rows_path) << R"([
    {"runtime": "sparq", "model": "a.sparq", "values": "int4:g64", "perplexity": 10,
     "weight_bytes_per_token": 100e6, "decode_tok_s": 50, "cpu_model": "X", "isa": "AVX2",
     "threads": 2},
    {"runtime": "sparq", "model": "b.sparq", "values": "int4:g64", "perplexity": 20,
     "weight_bytes_per_token": 50e6, "decode_tok_s": 100},
    {"runtime": "sparq", "model": "c.sparq", "values": "bf16", "perplexity": 30,
     "weight_bytes_per_token": 120e6, "decode_tok_s": 40},
    {"runtime": "sparq", "model": "e.sparq", "values": "bf16", "perplexity": null,
     "weight_bytes_per_token": 1e6, "decode_tok_s": 400},
    {"runtime": "llama.cpp", "model": "llama.cpp M.gguf", "perplexity": 11,
     "weight_bytes_per_token": null, "file_bytes": 98e6, "decode_tok_s": 60}])";
  ASSERT_EQ(Shell("cd " + Quote(SPARQ_SOURCE_DIR) + " && " + Quote(py) + " bench/pareto.py " +
                      Quote(rows_path) + " " + Quote(png),
                  &out, &err),
            0)
      << out << err;
  EXPECT_THAT(out, HasSubstr("(4 rows)"));
  EXPECT_THAT(out, HasSubstr("front, perplexity vs MB per token: b (int4:g64); llama.cpp M.gguf; "
                             "a (int4:g64)\n"));
  EXPECT_THAT(out, HasSubstr("front, perplexity vs decode tok/s: a (int4:g64); llama.cpp M.gguf; "
                             "b (int4:g64)\n"));
  const std::string b = Slurp(png);
  ExpectPngSignature(b);
}

// bench/finetune_curve.py (issue 28's curve plot) on a hand-made `finetune --log` file: the
// points of two texts in one table with their wall time and the ratio to a reference, a text
// named by its file name, a torn-free log of steps and points; the PNG decodes.
TEST(ReadmeBench, FinetuneCurvePlotsTheLog) {
  const std::string py = testing::PythonInterpreter();
  std::string out, err;
  SPARQ_REQUIRE(HasMatplotlib(py), "matplotlib missing in " + py + ": " + kGetMatplotlib);
  const std::string log = OutDir() + "/run.csv", png = OutDir() + "/curve.png";
  std::ofstream(log) << "kind,step,tokens,loss,lr,grad_norm,tokens_per_s,seconds,text,perplexity\n"
                        "eval,0,0,,,,,12.0,\"/d/wiki.txt\",60\n"
                        "eval,0,0,,,,,12.0,\"/d/book, part 2.txt\",30\n"
                        "step,1,512,1.5,1e-4,2,50,22.0,,\n"
                        "step,2,1024,1.25,2e-4,2,50,32.0,,\n"
                        "eval,2,1024,,,,,3725.4,\"/d/wiki.txt\",45\n"
                        "eval,2,1024,,,,,3725.4,\"/d/book, part 2.txt\",25\n";
  ASSERT_EQ(Shell("cd " + Quote(SPARQ_SOURCE_DIR) + " && " + Quote(py) +
                      " bench/finetune_curve.py " + Quote(log) + " " + Quote(png) +
                      " --ref wiki.txt=30",
                  &out, &err),
            0)
      << out << err;
  EXPECT_THAT(out, HasSubstr("2 steps, 4 points of the curve")) << out;
  EXPECT_THAT(out, HasSubstr("| step | tokens | wall time | wiki.txt | book, part 2.txt |")) << out;
  EXPECT_THAT(out, HasSubstr("| 0 | 0 | 0:00:12 | 60.000 (2.000x) | 30.000 |")) << out;
  EXPECT_THAT(out, HasSubstr("| 2 | 1024 | 1:02:05 | 45.000 (1.500x) | 25.000 |")) << out;
  const std::string b = Slurp(png);
  ExpectPngSignature(b);
}

// `bench machine`: the limits the kernel tables are measured against, for 1 and 2 threads.
TEST(ReadmeBench, MachineLimits) {
  std::string out, err;
  ASSERT_EQ(Sparq("bench machine", &out, &err), 0) << err;
  const std::regex line(
      "threads ([12]): peak FMA ([0-9.]+) GFLOP/s \\(([0-9.]+) with one L1 load per FMA\\), "
      "read bandwidth ([0-9.]+) GB/s \\(64 MiB\\) ([0-9.]+) GB/s \\(1 GiB\\)");
  int seen = 0;
  for (auto it = std::sregex_iterator(out.begin(), out.end(), line); it != std::sregex_iterator();
       ++it, ++seen) {
    const std::smatch& m = *it;
    EXPECT_EQ(std::stoi(m[1]), seen + 1) << out;
    const double peak = Number(m[2]), load_fma = Number(m[3]);
    EXPECT_GT(peak, 1.0) << out;              // any x86-64 core: GFLOP/s, not FLOP/s
    EXPECT_GT(load_fma, 1.0) << out;  // (no order between the two: timed apart on a shared core)
    EXPECT_GT(Number(m[4]), 0.1) << out;
    EXPECT_GT(Number(m[5]), 0.1) << out;
  }
  EXPECT_EQ(seen, 2) << out;
}

}  // namespace
}  // namespace sparq
