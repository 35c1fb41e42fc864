// `sparq train --task fashion-mnist|lm` as a command: the error cases exit 1 with one line naming
// the flag or file; a 3-step 2:4 run on Debian's Fashion-MNIST and one of a tiny Llama on the
// in-repo text (SmolLM2's tokenizer) write their --json summaries.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <unistd.h>

#include "tests/cli/cli_testutil.h"
#include "tests/data_testutil.h"

namespace sparq {
namespace {

using ::testing::HasSubstr;
using testing::RunSplit;

TEST(TrainCliTest, ErrorsNameTheFlagOrFile) {
  std::string out, err;
  EXPECT_EQ(RunSplit("train --pattern 3:4 --seed 1", &out, &err), 1);
  EXPECT_THAT(err, HasSubstr("--pattern: '3:4' is not a pattern (dense, 2:4)"));
  EXPECT_EQ(RunSplit("train --task mnist --seed 1", &out, &err), 1);
  EXPECT_THAT(err, HasSubstr("--task: 'mnist' is not a task (fashion-mnist, lm)"));
  EXPECT_EQ(RunSplit("train --task lm --seed 1 --text a.txt", &out, &err), 1);
  EXPECT_THAT(err, HasSubstr("--task lm needs --tokenizer MODEL.gguf, --text FILE and --eval-text"));
  EXPECT_EQ(RunSplit("train --pattern 2:4 --mask-every 0 --seed 1", &out, &err), 1);
  EXPECT_THAT(err, HasSubstr("--mask-every: 0, must be >= 1"));
  EXPECT_EQ(RunSplit("train --batch 0 --seed 1", &out, &err), 1);
  EXPECT_THAT(err, HasSubstr("--batch: 0"));
  EXPECT_EQ(RunSplit("train --seed 1 --data /nonexistent-sparq-dir", &out, &err), 1);
  EXPECT_THAT(err, HasSubstr("/nonexistent-sparq-dir/train-images-idx3-ubyte"));
  EXPECT_THAT(err, HasSubstr("apt-get install dataset-fashion-mnist"));
}

TEST(TrainCliTest, ShortTwoOfFourRunWritesItsSummary) {
  SPARQ_REQUIRE_FILE("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz",
                     "apt-get install dataset-fashion-mnist (or scripts/install_deps.sh)");
  std::string out, err;
  ASSERT_EQ(RunSplit("train --task fashion-mnist --pattern 2:4 --steps 3 --batch 64 --seed 2 "
                     "--threads 2 --json",
                     &out, &err),
            0)
      << err;
  const auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["pattern"], "2:4");
  EXPECT_EQ(j["steps"], 3);
  EXPECT_EQ(j["mask_every"], 1);
  EXPECT_DOUBLE_EQ(j["srste"].get<double>(), 2e-4);
  EXPECT_GT(j["test_accuracy"].get<double>(), 0.3);  // 3 steps from 10% (chance)
  // Half the hidden layers' weights: (784 + 1024) * 1024 / 2 of all 1,863,680 weights.
  EXPECT_NEAR(j["zero_weight_fraction"].get<double>(), 0.49725, 1e-5);
  EXPECT_THAT(err, HasSubstr("step 3/3"));
}

// The first `chars` bytes of an in-repo text, cut at a line end, as a temporary file.
std::string TextHead(const std::string& name, size_t chars, const std::string& tag) {
  std::ifstream in(testing::DataText(name), std::ios::binary);
  std::string s(chars, '\0');
  in.read(s.data(), static_cast<std::streamsize>(chars));
  s.resize(static_cast<size_t>(in.gcount()));
  s.resize(s.rfind('\n') + 1);
  const std::string path = ::testing::TempDir() + "/sparq_train_lm_" + std::to_string(getpid()) +
                           "_" + tag + ".txt";
  std::ofstream(path, std::ios::binary) << s;
  return path;
}

TEST(TrainCliTest, ShortLmRunWritesItsSummary) {
  SPARQ_REQUIRE_MODEL();
  SPARQ_REQUIRE_TEXT("sherlock-holmes-pg1661.txt");
  SPARQ_REQUIRE_TEXT("wikitext-2-raw-test.txt");
  const std::string train = TextHead("sherlock-holmes-pg1661.txt", 20000, "train");
  const std::string eval = TextHead("wikitext-2-raw-test.txt", 3000, "eval");
  std::string out, err;
  const std::string common = "train --task lm --tokenizer " + testing::SmolLmModelPath() +
                             " --text " + train + " --eval-text " + eval +
                             " --layers 1 --hidden 32 --heads 2 --kv-heads 1 --seq-len 32"
                             " --batch 2 --steps 3 --eval-every 2 --seed 4 --threads 2";
  ASSERT_EQ(RunSplit(common + " --ff 64 --pattern 2:4 --srste 1 --json", &out, &err), 0) << err;
  const auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["task"], "lm");
  EXPECT_EQ(j["pattern"], "2:4");
  EXPECT_EQ(j["model"]["n_vocab"], 49152);
  EXPECT_EQ(j["steps"], 3);
  EXPECT_EQ(j["trained_tokens"], 3 * 2 * 32);
  EXPECT_DOUBLE_EQ(j["srste"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(j["lr"].get<double>(), 1e-3);  // the LM's default, not the MLP's
  ASSERT_EQ(j["curve"].size(), 2u);                 // steps 2 and 3
  // Barely trained: close to a uniform guess over 49152 ids, but finite.
  EXPECT_GT(j["eval_perplexity"].get<double>(), 1000.0);
  EXPECT_LT(j["eval_perplexity"].get<double>(), 2 * 49152.0);
  EXPECT_DOUBLE_EQ(j["zero_weight_fraction"].get<double>(), 0.5);
  EXPECT_THAT(err, HasSubstr("step 3/3"));
  EXPECT_EQ(RunSplit(common + " --ff 66 --pattern 2:4", &out, &err), 1);
  EXPECT_THAT(err, HasSubstr("ffn_down has 66"));
  std::filesystem::remove(train);
  std::filesystem::remove(eval);
}

}  // namespace
}  // namespace sparq
