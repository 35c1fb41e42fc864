// `sparq finetune` on SmolLM2-135M (slow tier: the plain f32 training code takes ~10 s per step of
// 32 tokens here, and the state file is 1.6 GB): block 0 pruned 2:4 with bf16 values by the CLI,
// two steps of distillation from the GGUF teacher; OUT keeps block 0's nm bf16 2:4 and the
// dense rest, loads and evaluates.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "data_testutil.h"
#include "tests/cli/cli_testutil.h"

namespace sparq {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using testing::RunSplit;

// `sparq inspect` lines of block 0's linear layers, each expected to match `re`; returns how many.
int Block0Linears(const std::string& inspect, const char* re) {
  std::istringstream lines(inspect);
  int n = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("blk.0.", 0) == 0 && line.find("_norm") == std::string::npos) {
      EXPECT_THAT(line, MatchesRegex(re)) << line;
      ++n;
    }
  }
  return n;
}

TEST(FinetuneSmolLm2, TwoStepsKeepTheStudentsFormatsAndRun) {
  SPARQ_REQUIRE_MODEL();
  const std::string model = testing::SmolLm2Path();
  const std::string dir = testing::TempDir() + "/finetune_smollm2_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  std::string text;
  for (int i = 0; i < 40; ++i) {
    text +=
        "Sherlock Holmes took his bottle from the corner of the mantelpiece, and his "
        "hypodermic syringe from its neat morocco case. ";
  }
  std::ofstream(dir + "/text.txt") << text;
  std::string out, err;
  ASSERT_EQ(RunSplit("prune '" + model +
                         "' --method magnitude --pattern 2:4 --dtype bf16 "
                         "--blocks 1 --calib " +
                         dir +
                         "/text.txt --calib-samples 2 --calib-len 32 "
                         "--threads 2 -o " +
                         dir + "/pruned.sparq",
                     &out, &err),
            0)
      << err;
  ASSERT_EQ(
      RunSplit("finetune " + dir + "/pruned.sparq --teacher '" + model + "' --text " + dir +
                   "/text.txt --tokens 64 --seq-len 32 --threads 2 -o " + dir + "/tuned.sparq",
               &out, &err),
      0)
      << err;
  EXPECT_THAT(err, HasSubstr("step 2/2  loss ")) << err;
  ASSERT_EQ(RunSplit("inspect " + dir + "/tuned.sparq", &out, &err), 0) << err;
  EXPECT_THAT(out, HasSubstr("sparq.finetune"));
  EXPECT_EQ(Block0Linears(out, ".*bf16 +nm +0\\.5000 +2:4.*"), 7) << out;
  ASSERT_EQ(RunSplit("eval " + dir + "/tuned.sparq --text " + dir +
                         "/text.txt --ctx 128 --max-tokens 256 --threads 2",
                     &out, &err),
            0)
      << err;
  EXPECT_THAT(out, HasSubstr("perplexity")) << out;

  // The recovered student quantized keeping its masks: block 0 becomes int4 2:4.
  ASSERT_EQ(RunSplit("quantize " + dir + "/tuned.sparq --values int4:g64 --blocks 1 --calib " +
                         dir + "/text.txt --calib-samples 2 --calib-len 32 --threads 2 -o " + dir +
                         "/tuned-int4.sparq",
                     &out, &err),
            0)
      << err;
  ASSERT_EQ(RunSplit("inspect " + dir + "/tuned-int4.sparq", &out, &err), 0) << err;
  EXPECT_EQ(Block0Linears(out, ".*int4:g64 +nm +0\\.[45][0-9]+ +2:4.*"), 7) << out;

  // Self-distillation: text sampled from the teacher, cached, reused with the same options.
  const std::string sd = "finetune " + dir + "/pruned.sparq --teacher '" + model +
                         "' --self-distill --distill-tokens 40 --distill-len 20 --distill-batch 2 "
                         "--tokens 32 --seq-len 16 --threads 2 -o " + dir + "/sd.sparq";
  ASSERT_EQ(RunSplit(sd, &out, &err), 0) << err;
  EXPECT_THAT(err, HasSubstr("self-distill: 40/40 tokens")) << err;
  std::ifstream cache(dir + "/sd.sparq.distill.txt");
  std::string first;
  std::getline(cache, first);
  EXPECT_THAT(first, HasSubstr("# sparq self-distill: teacher SmolLM2")) << first;
  ASSERT_EQ(RunSplit(sd + " --distill-cache " + dir + "/sd.sparq.distill.txt", &out, &err), 0)
      << err;
  EXPECT_THAT(err, HasSubstr("self-distill: using")) << err;
  EXPECT_EQ(RunSplit("finetune " + dir + "/pruned.sparq --teacher '" + model +
                         "' --tokens 32 -o " + dir + "/none.sparq",
                     &out, &err),
            1);
  EXPECT_THAT(err, HasSubstr("--text FILE) or --self-distill")) << err;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace sparq
