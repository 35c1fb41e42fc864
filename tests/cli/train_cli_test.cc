// `sparq train --task fashion-mnist` as a command: the error cases exit 1 with one line naming the
// flag or file, and a 3-step 2:4 run on Debian's Fashion-MNIST writes its --json summary.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

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
  EXPECT_THAT(err, HasSubstr("--task: 'mnist' is not a task"));
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

}  // namespace
}  // namespace sparq
