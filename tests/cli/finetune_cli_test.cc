// `sparq finetune` as a command on tiny .sparq files (tests/train/finetune_testutil.h): a run
// prints a progress line per step on stderr and a summary on stdout, --json is the summary alone,
// --stop-at then --resume writes the same OUT as an uninterrupted run, --hidden trains, and the
// error cases exit 1 with one line naming the problem.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/cli/cli_testutil.h"
#include "tests/train/finetune_testutil.h"

namespace sparq {
namespace {

using ::testing::HasSubstr;
using testing::RunSplit;
using testing::Slurp;

class FinetuneCliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(testing::TempDir() + "/finetune_cli_" + std::to_string(::getpid()));
    std::filesystem::create_directories(*dir_);
    train::testing::WriteTinySparq(*dir_ + "/student.sparq", 1, train::testing::MixedStore);
    train::testing::WriteTinySparq(*dir_ + "/teacher.sparq", 2, train::testing::AllDense);
    train::testing::WriteTinySparq(*dir_ + "/teacher12.sparq", 3, train::testing::AllDense, 12);
    std::ofstream(*dir_ + "/text.txt") << train::testing::LetterText(2000, 7);
    std::ofstream(*dir_ + "/short.txt") << "abc";
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
  }
  // 8 steps of 2 windows of 8 tokens.
  // rate: the --lr / --warmup flags (CLI11 takes an option once).
  std::string Args(const std::string& out, const std::string& teacher = "teacher.sparq",
                   const std::string& text = "text.txt",
                   const std::string& rate = "--lr 5e-3 --warmup 2") const {
    return "finetune " + *dir_ + "/student.sparq --teacher " + *dir_ + "/" + teacher + " --text " +
           *dir_ + "/" + text + " --tokens 128 --seq-len 8 --accum 2 --ce 1 --seed 3 --threads 1 " +
           rate + " -o " + *dir_ + "/" + out;
  }
  static std::string* dir_;
};
std::string* FinetuneCliTest::dir_ = nullptr;

TEST_F(FinetuneCliTest, TrainsWithAProgressLinePerStepAndResumesToTheSameFile) {
  std::string out, err;
  ASSERT_EQ(RunSplit(Args("full.sparq"), &out, &err), 0) << err;
  EXPECT_THAT(err, HasSubstr("step 1/8  loss ")) << err;
  EXPECT_THAT(err, HasSubstr("step 8/8  loss ")) << err;
  EXPECT_THAT(err, HasSubstr("tok/s  ETA ")) << err;
  EXPECT_THAT(out, HasSubstr("trained steps 1..8 of 8")) << out;

  ASSERT_EQ(RunSplit(Args("part.sparq") + " --checkpoint-every 2 --stop-at 3", &out, &err), 0)
      << err;
  EXPECT_FALSE(std::filesystem::exists(*dir_ + "/part.sparq"));
  // Resumed recomputing the activations block by block: the same bytes as the run that kept them.
  ASSERT_EQ(RunSplit(Args("part.sparq") + " --resume --json --recompute-activations", &out, &err),
            0)
      << err;
  const auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["start_step"], 3);
  EXPECT_EQ(j["end_step"], 8);
  EXPECT_EQ(j["wrote_out"], true);
  EXPECT_TRUE(Slurp(*dir_ + "/full.sparq") == Slurp(*dir_ + "/part.sparq"));

  // Another rate on the same state: refused, naming the option.
  ASSERT_EQ(RunSplit(Args("part.sparq", "teacher.sparq", "text.txt", "--lr 1e-3 --warmup 2") +
                         " --resume",
                     &out, &err),
            1);
  EXPECT_THAT(err, HasSubstr("--resume")) << err;
  EXPECT_THAT(err, HasSubstr("--lr")) << err;
}

TEST_F(FinetuneCliTest, ErrorsExitOneWithOneLine) {
  std::string out, err;
  EXPECT_EQ(RunSplit(Args("x.sparq", "teacher12.sparq"), &out, &err), 1);
  EXPECT_THAT(err, HasSubstr("teacher12.sparq")) << err;
  EXPECT_THAT(err, HasSubstr("student.sparq")) << err;
  EXPECT_EQ(RunSplit(Args("x.sparq", "teacher.sparq", "short.txt"), &out, &err), 1);
  EXPECT_THAT(err, HasSubstr("short.txt")) << err;
  EXPECT_EQ(RunSplit(Args("x.sparq", "teacher.sparq", "text.txt", "--lr 1e30 --warmup 0") +
                         " --max-grad-norm 0",
                     &out, &err),
            1);
  EXPECT_THAT(err, HasSubstr("training stopped")) << err;
  EXPECT_THAT(err, HasSubstr("x.sparq.state")) << err;
  EXPECT_FALSE(std::filesystem::exists(*dir_ + "/x.sparq"));
  EXPECT_EQ(RunSplit(Args("y.sparq") + " --resume", &out, &err), 1);  // no state file
  EXPECT_THAT(err, HasSubstr("y.sparq.state")) << err;
  EXPECT_EQ(RunSplit(Args("z.sparq") + " --hidden -1", &out, &err), 1);
  EXPECT_THAT(err, HasSubstr("--hidden must be finite and >= 0")) << err;
  EXPECT_FALSE(std::filesystem::exists(*dir_ + "/z.sparq"));
}

// --eval-text / --eval-every: a line per point of the curve and the points in --json; an
// evaluation text without --eval-every is refused.
TEST_F(FinetuneCliTest, EvalEveryPrintsTheCurveAndWritesItToJson) {
  std::string out, err;
  std::ofstream(*dir_ + "/eval.txt") << train::testing::LetterText(200, 9);
  ASSERT_EQ(RunSplit(Args("curve.sparq") + " --eval-text " + *dir_ + "/eval.txt --eval-every 3 " +
                         "--json",
                     &out, &err),
            0)
      << err;
  EXPECT_THAT(err, HasSubstr("eval step 0 (0 tokens trained): perplexity ")) << err;
  EXPECT_THAT(err, HasSubstr("eval step 6 (96 tokens trained): perplexity ")) << err;
  const auto j = nlohmann::json::parse(out);
  ASSERT_EQ(j["curve"].size(), 4u);  // steps 0, 3, 6, 8
  EXPECT_EQ(j["curve"][3]["step"], 8);
  EXPECT_LT(j["curve"][3]["perplexity"].get<double>(), j["curve"][0]["perplexity"].get<double>());
  // Two texts: each scored on its own, named on the line and listed in the JSON.
  std::ofstream(*dir_ + "/eval2.txt") << train::testing::LetterText(120, 5);
  ASSERT_EQ(RunSplit(Args("curve3.sparq") + " --eval-text " + *dir_ + "/eval.txt --eval-text " +
                         *dir_ + "/eval2.txt --eval-every 3 --json",
                     &out, &err),
            0)
      << err;
  EXPECT_THAT(err, HasSubstr("/eval2.txt)\n")) << err;
  const auto j2 = nlohmann::json::parse(out);
  ASSERT_EQ(j2["eval_texts"].size(), 2u);
  ASSERT_EQ(j2["curve"][3]["perplexities"].size(), 2u);
  EXPECT_EQ(j2["curve"][3]["perplexities"][0], j["curve"][3]["perplexity"]);
  EXPECT_EQ(RunSplit(Args("curve2.sparq") + " --eval-text " + *dir_ + "/eval.txt", &out, &err), 1);
  EXPECT_THAT(err, HasSubstr("--eval-every")) << err;
}

// --hidden W (SquareHead) trains and is recorded in OUT's metadata; a resume with another weight
// is refused naming the flag.
// --log FILE: a CSV row per step (its loss as the progress line prints it) and per point of the
// curve (the JSON's perplexity bit for bit); a run stopped, its log given a row trained after the
// last save and a torn line (what a SIGKILL leaves), then resumed, logs as the uninterrupted run
// (all but the timing columns); a file that is not such a log is refused and left as it was.
std::vector<std::vector<std::string>> CsvRows(const std::string& path) {
  std::vector<std::vector<std::string>> rows;
  std::istringstream in(Slurp(path));
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> f;
    std::string cell;
    std::istringstream ls(line);
    while (std::getline(ls, cell, ',')) f.push_back(cell);
    if (!line.empty() && line.back() == ',') f.push_back("");
    rows.push_back(f);
  }
  return rows;
}

TEST_F(FinetuneCliTest, LogWritesACsvRowPerStepAndPointAndKeepsItWholeAcrossResume) {
  std::string out, err;
  std::ofstream(*dir_ + "/evlog.txt") << train::testing::LetterText(200, 9);
  const std::string curve = " --eval-text " + *dir_ + "/evlog.txt --eval-every 3";
  const std::string full_log = *dir_ + "/full.csv";
  ASSERT_EQ(RunSplit(Args("logfull.sparq") + curve + " --log " + full_log + " --json", &out, &err),
            0)
      << err;
  const auto j = nlohmann::json::parse(out);
  const auto full = CsvRows(full_log);
  ASSERT_EQ(full.size(), 1u + 8 + 4);  // header, steps 1..8, points at 0, 3, 6, 8
  EXPECT_EQ(full[0], (std::vector<std::string>{"kind", "step", "tokens", "loss", "lr", "grad_norm",
                                                "tokens_per_s", "seconds", "text", "perplexity"}));
  int steps = 0, points = 0;
  double last_seconds = 0;
  for (size_t i = 1; i < full.size(); ++i) {
    const auto& r = full[i];
    ASSERT_EQ(r.size(), 10u) << i;
    EXPECT_GE(std::stod(r[7]), last_seconds) << i;
    last_seconds = std::stod(r[7]);
    if (r[0] == "step") {
      ++steps;
      EXPECT_EQ(std::stoll(r[1]), steps);
      EXPECT_EQ(std::stoll(r[2]), steps * 16);
      char line[64];
      std::snprintf(line, sizeof line, "step %d/8  loss %.4f  ", steps, std::stod(r[3]));
      EXPECT_THAT(err, HasSubstr(line)) << r[3];
    } else {
      ASSERT_EQ(r[0], "eval");
      EXPECT_EQ(r[8], "\"" + *dir_ + "/evlog.txt\"");
      EXPECT_EQ(std::stod(r[9]), j["curve"][points]["perplexity"].get<double>()) << r[1];
      EXPECT_EQ(std::stoll(r[1]), j["curve"][points]["step"].get<int64_t>());
      ++points;
    }
  }
  EXPECT_EQ(steps, 8);
  EXPECT_EQ(points, 4);

  // Stopped after step 4 (saved there), then the rows a killed run would have left past it.
  const std::string part_log = *dir_ + "/part.csv";
  ASSERT_EQ(RunSplit(Args("logpart.sparq") + curve + " --log " + part_log +
                         " --checkpoint-every 2 --stop-at 4",
                     &out, &err),
            0)
      << err;
  EXPECT_EQ(CsvRows(part_log).size(), 1u + 4 + 2);
  std::ofstream(part_log, std::ios::app) << "step,5,80,9,9,9,1,1,,\nstep,6,9";
  ASSERT_EQ(RunSplit(Args("logpart.sparq") + curve + " --log " + part_log + " --resume", &out,
                     &err),
            0)
      << err;
  const auto part = CsvRows(part_log);
  ASSERT_EQ(part.size(), full.size());
  for (size_t i = 0; i < full.size(); ++i) {
    for (size_t c : {0, 1, 2, 3, 4, 5, 8, 9}) EXPECT_EQ(part[i][c], full[i][c]) << i << "," << c;
  }

  // Not a finetune log: refused before training, the file as it was.
  std::ofstream(*dir_ + "/mine.csv") << "a,b\n1,2\n";
  EXPECT_EQ(RunSplit(Args("logx.sparq") + " --log " + *dir_ + "/mine.csv", &out, &err), 1);
  EXPECT_THAT(err, HasSubstr("mine.csv exists and is not a finetune log")) << err;
  EXPECT_EQ(Slurp(*dir_ + "/mine.csv"), "a,b\n1,2\n");
  EXPECT_FALSE(std::filesystem::exists(*dir_ + "/logx.sparq.state"));
}

// --stop-at N --snapshot writes OUT as of step N (marked in its metadata) and keeps the state:
// the resumed run ends in the uninterrupted run's bytes; a snapshot of a state already at N (no
// training) is the same file; --snapshot without --stop-at is refused.
TEST_F(FinetuneCliTest, SnapshotWritesOutAtTheStopAndTheRunResumesUnchanged) {
  std::string out, err;
  ASSERT_EQ(RunSplit(Args("snapfull.sparq"), &out, &err), 0) << err;
  ASSERT_EQ(RunSplit(Args("snap.sparq") + " --stop-at 4 --snapshot", &out, &err), 0) << err;
  EXPECT_THAT(out, HasSubstr("trained steps 1..4 of 8")) << out;
  EXPECT_THAT(out, HasSubstr("snap.sparq, a snapshot at step 4 of 8 (the state is in ")) << out;
  const std::string snap4 = Slurp(*dir_ + "/snap.sparq");
  auto ck = ReadCheckpoint(*dir_ + "/snap.sparq");
  ASSERT_TRUE(ck.ok()) << ck.status().ToString();
  EXPECT_THAT(ck->metadata.at("sparq.finetune"), HasSubstr("\"snapshot_step\":4")) << out;
  EXPECT_NE(snap4, Slurp(*dir_ + "/student.sparq"));
  ASSERT_EQ(RunSplit(Args("snap.sparq") + " --resume --stop-at 4 --snapshot", &out, &err), 0)
      << err;
  EXPECT_THAT(out, HasSubstr("a snapshot at step 4 of 8")) << out;
  EXPECT_TRUE(Slurp(*dir_ + "/snap.sparq") == snap4);
  ASSERT_EQ(RunSplit(Args("snap.sparq") + " --resume", &out, &err), 0) << err;
  EXPECT_THAT(out, HasSubstr("trained steps 5..8 of 8")) << out;
  EXPECT_TRUE(Slurp(*dir_ + "/snap.sparq") == Slurp(*dir_ + "/snapfull.sparq"));
  EXPECT_EQ(RunSplit(Args("snapx.sparq") + " --snapshot", &out, &err), 1);
  EXPECT_THAT(err, HasSubstr("--snapshot writes OUT at --stop-at N")) << err;
}

TEST_F(FinetuneCliTest, HiddenTrainsAndAResumeWithAnotherWeightIsRefused) {
  std::string out, err;
  ASSERT_EQ(RunSplit(Args("hidden.sparq") + " --hidden 0.5", &out, &err), 0) << err;
  EXPECT_THAT(out, HasSubstr("trained steps 1..8 of 8")) << out;
  auto ck = ReadCheckpoint(*dir_ + "/hidden.sparq");
  ASSERT_TRUE(ck.ok()) << ck.status().ToString();
  EXPECT_THAT(ck->metadata.at("sparq.finetune"), HasSubstr("\"hidden\":0.5"));
  EXPECT_EQ(RunSplit(Args("hidden.sparq") + " --hidden 1 --resume", &out, &err), 1);
  EXPECT_THAT(err, HasSubstr("--hidden 0.5, this run asks for 1")) << err;
}

// A quantized student (int8 / int4 on N:M, CSR and dense, tests/train/finetune_testutil.h):
// --requant gptq (the default) re-quantizes every trained block matrix by GPTQ, --requant rtn by
// round to nearest, both into the student's formats and value specs; OUT runs (`sparq generate`).
TEST_F(FinetuneCliTest, AQuantizedStudentTrainsWithGptqOrRoundToNearest) {
  const std::string q = *dir_ + "/quant.sparq";
  train::testing::WriteTinySparq(q, 1, train::testing::QuantStoreNoPerm, 11, 2, "int8:g32");
  auto args = [&](const std::string& out) {
    return "finetune " + q + " --teacher " + *dir_ + "/teacher.sparq --text " + *dir_ +
           "/text.txt --tokens 64 --seq-len 8 --accum 2 --ce 1 --seed 3 --threads 1 --lr 5e-3 "
           "--warmup 1 --json -o " +
           *dir_ + "/" + out;
  };
  std::string out, err;
  ASSERT_EQ(RunSplit(args("qg.sparq"), &out, &err), 0) << err;
  auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["requant_gptq"], 12) << out;
  EXPECT_EQ(j["requant_rtn"], 0) << out;
  ASSERT_EQ(RunSplit(args("qr.sparq") + " --requant rtn", &out, &err), 0) << err;
  j = nlohmann::json::parse(out);
  EXPECT_EQ(j["requant_gptq"], 0) << out;
  EXPECT_EQ(j["requant_rtn"], 12) << out;
  ASSERT_EQ(RunSplit(args("qs.sparq").substr(0, args("qs.sparq").find(" --json")) + " -o " + *dir_ +
                         "/qs.sparq",
                     &out, &err),
            0)
      << err;
  EXPECT_THAT(out, HasSubstr("quantized matrices written back: 12 by GPTQ, 0 by round to nearest"))
      << out;
  for (const char* f : {"qg.sparq", "qr.sparq"}) {
    ASSERT_EQ(RunSplit(std::string("inspect ") + *dir_ + "/" + f, &out, &err), 0) << err;
    EXPECT_THAT(out, HasSubstr("int4:g32:sym")) << out;
    ASSERT_EQ(RunSplit(std::string("generate ") + *dir_ + "/" + f +
                           " --prompt abc --raw --max-new 3 --threads 1",
                       &out, &err),
              0)
        << err;
  }
  EXPECT_NE(RunSplit(args("qx.sparq") + " --requant nearest", &out, &err), 0);
}

}  // namespace
}  // namespace sparq
