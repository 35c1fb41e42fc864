// `sparq prune-layer` end to end on small .npy files, and bad inputs through the library and CLI.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "prune/prune_testutil.h"
#include "sparq/npy.h"
#include "sparq/prune.h"

namespace sparq {
namespace {

struct CliResult {
  int code;
  std::string output;
};

CliResult RunCli(const std::string& args) {
  const std::string cmd = std::string(SPARQ_CLI_PATH) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int st = pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

class PruneLayerCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("sparq_prune_cli_" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
    pr_ = testing::MakeProblem(24, 40, 160, 5);
    ASSERT_TRUE(WriteNpy(P("W.npy"), pr_.w.data(), {pr_.m, pr_.k}).ok());
    ASSERT_TRUE(WriteNpy(P("X.npy"), pr_.x.data(), {pr_.n, pr_.k}).ok());
    ASSERT_TRUE(WriteNpy(P("H.npy"), pr_.h.data(), {pr_.k, pr_.k}).ok());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string P(const std::string& name) const { return (dir_ / name).string(); }
  std::vector<float> Load(const std::string& name) {
    auto t = ReadNpyF32(P(name));
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return std::vector<float>(t->data_as<float>(), t->data_as<float>() + t->numel());
  }
  std::filesystem::path dir_;
  testing::Problem pr_;
};

TEST_F(PruneLayerCli, EveryMethodWritesPatternAndReport) {
  for (std::string method : {"magnitude", "wanda", "sparsegpt"}) {
    for (std::string pattern : {"2:4", "unstructured:0.5", "vnm:8:2:4", "block:4x4:0.5"}) {
      auto r = RunCli("prune-layer --weight " + P("W.npy") + " --inputs " + P("X.npy") +
                      " --method " + method + " --pattern " + pattern + " --threads 2 -o " +
                      P("Wp.npy") + " --report " + P("r.json"));
      ASSERT_EQ(r.code, 0) << r.output;
      EXPECT_NE(r.output.find(method + " "), std::string::npos) << r.output;
      auto p = Pattern::Parse(pattern);
      ASSERT_TRUE(p.ok());
      auto wp = Load("Wp.npy");
      EXPECT_EQ(testing::CheckPattern(*p, wp, pr_.m, pr_.k), "") << method << " " << pattern;
      std::ifstream in(P("r.json"));
      auto j = nlohmann::json::parse(in);
      EXPECT_EQ(j["method"], method);
      EXPECT_EQ(j["calibration_rows"], pr_.n);
      EXPECT_NEAR(j["rel_error"].get<double>(), testing::DirectError(pr_, wp),
                  1e-6 * testing::DirectError(pr_, wp));
      EXPECT_NEAR(j["sparsity"].get<double>(), 0.5, 1e-9);
    }
  }
}

TEST_F(PruneLayerCli, HessianInputGivesTheSameResult) {
  for (std::string method : {"wanda", "sparsegpt"}) {
    ASSERT_EQ(RunCli("prune-layer --weight " + P("W.npy") + " --inputs " + P("X.npy") +
                     " --method " + method + " --pattern 2:4 -o " + P("a.npy")).code, 0);
    ASSERT_EQ(RunCli("prune-layer --weight " + P("W.npy") + " --hessian " + P("H.npy") +
                     " --method " + method + " --pattern 2:4 -o " + P("b.npy")).code, 0);
    auto a = Load("a.npy"), b = Load("b.npy");
    // H from X (dsyrk) and H from the test's loop differ by rounding only.
    double diff = 0, norm = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      diff += std::abs(a[i] - b[i]);
      norm += std::abs(a[i]);
    }
    EXPECT_LT(diff, 1e-4 * norm) << method;
  }
  // Magnitude needs no calibration data at all.
  EXPECT_EQ(RunCli("prune-layer --weight " + P("W.npy") + " --method magnitude --pattern 4:8 -o " +
                   P("c.npy")).code, 0);
}

TEST_F(PruneLayerCli, PermuteWritesOriginalOrderAndPermutation) {
  auto r = RunCli("prune-layer --weight " + P("W.npy") + " --inputs " + P("X.npy") +
                  " --method sparsegpt --pattern 2:4 --permute -o " + P("Wp.npy") + " --perm-out " +
                  P("perm.npy") + " --report " + P("r.json"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("permuted"), std::string::npos);
  std::ifstream in(P("r.json"));
  auto j = nlohmann::json::parse(in);
  std::vector<int32_t> perm = j["permutation"].get<std::vector<int32_t>>();
  ASSERT_TRUE(ValidatePermutation(perm, pr_.k, "perm").ok());
  auto wp = Load("Wp.npy");
  std::vector<float> wperm(wp.size());
  PermuteColumns(wp, wperm, pr_.m, pr_.k, perm);
  EXPECT_EQ(testing::CheckPattern(Pattern::NM(2, 4), wperm, pr_.m, pr_.k), "");
  EXPECT_NEAR(j["rel_error"].get<double>(), testing::DirectError(pr_, wp), 1e-6);
}

TEST_F(PruneLayerCli, BadInputsExitOneWithAMessage) {
  const std::string w = " --weight " + P("W.npy"), x = " --inputs " + P("X.npy");
  const std::string o = " -o " + P("o.npy");
  // Wrong dtype (int32 .npy), truncated .npy, shapes that do not match, bad pattern/method.
  std::vector<int32_t> ints(6, 1);
  ASSERT_TRUE(WriteNpy(P("int.npy"), ints.data(), {2, 3}).ok());
  auto r = RunCli("prune-layer --weight " + P("int.npy") + x + " --pattern 2:4" + o);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("int.npy: dtype '<i4' is not supported"), std::string::npos) << r.output;
  std::filesystem::copy_file(P("X.npy"), P("trunc.npy"));
  std::filesystem::resize_file(P("trunc.npy"), std::filesystem::file_size(P("trunc.npy")) - 5);
  r = RunCli("prune-layer" + w + " --inputs " + P("trunc.npy") + " --pattern 2:4" + o);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("trunc.npy: truncated .npy data"), std::string::npos) << r.output;
  ASSERT_TRUE(WriteNpy(P("X7.npy"), pr_.x.data(), {pr_.n / 7 * 1, 7}).ok());
  r = RunCli("prune-layer" + w + " --inputs " + P("X7.npy") + " --pattern 2:4" + o);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("X7.npy: inputs must be [N, 40]"), std::string::npos) << r.output;
  r = RunCli("prune-layer" + w + x + " --pattern block:64x64:0.5" + o);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("larger than the weight"), std::string::npos) << r.output;
  r = RunCli("prune-layer" + w + x + " --pattern 5:4" + o);
  EXPECT_EQ(r.code, 1) << r.output;
  r = RunCli("prune-layer" + w + x + " --method obs --pattern 2:4" + o);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("unknown pruning method 'obs'"), std::string::npos) << r.output;
  r = RunCli("prune-layer" + w + " --method wanda --pattern 2:4" + o);
  EXPECT_EQ(r.code, 1);
  r = RunCli("prune-layer" + w + x + " --pattern unstructured:0.5 --permute" + o);
  EXPECT_EQ(r.code, 1);
  // NaN in W, Inf in X.
  std::vector<float> bad = pr_.w;
  bad[3 * pr_.k + 7] = NAN;
  ASSERT_TRUE(WriteNpy(P("Wnan.npy"), bad.data(), {pr_.m, pr_.k}).ok());
  r = RunCli("prune-layer --weight " + P("Wnan.npy") + x + " --pattern 2:4" + o);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("non-finite weight at (3, 7)"), std::string::npos) << r.output;
  std::vector<float> badx = pr_.x;
  badx[9 * pr_.k + 2] = INFINITY;
  ASSERT_TRUE(WriteNpy(P("Xinf.npy"), badx.data(), {pr_.n, pr_.k}).ok());
  r = RunCli("prune-layer" + w + " --inputs " + P("Xinf.npy") + " --pattern 2:4" + o);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("Xinf.npy: non-finite value at row 9, column 2"), std::string::npos)
      << r.output;
  EXPECT_FALSE(std::filesystem::exists(P("o.npy")));
}

TEST(PruneBadInput, LibraryErrorsLeaveWUntouched) {
  testing::Problem pr = testing::MakeProblem(8, 12, 40, 3);
  auto expect_error = [&](std::vector<float> w, std::vector<double> h, const Pattern& p,
                          PruneMethod method, const std::string& needle) {
    const std::vector<float> before = w;
    PruneOptions opt;
    opt.method = method;
    opt.what = "blk.0.q";
    auto r = Prune(w, 8, 12, h, p, opt);
    ASSERT_FALSE(r.ok()) << needle;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidInput);
    EXPECT_NE(r.status().message().find("blk.0.q"), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
    EXPECT_EQ(0, std::memcmp(w.data(), before.data(), w.size() * 4));
  };
  const auto sg = PruneMethod::kSparseGpt;
  std::vector<float> w = pr.w;
  w[13] = INFINITY;
  expect_error(w, pr.h, Pattern::NM(2, 4), sg, "non-finite weight at (1, 1)");
  std::vector<double> h = pr.h;
  h[5] = NAN;
  expect_error(pr.w, h, Pattern::NM(2, 4), sg, "non-finite value at (0, 5)");
  h = pr.h;
  h[1 * 12 + 1] = -1;
  expect_error(pr.w, h, Pattern::NM(2, 4), sg, "not positive semi-definite");
  // Indefinite but with a valid diagonal and 2x2 minors: caught by the eigenvalue check.
  h.assign(144, 0.0);
  for (int i = 0; i < 12; ++i) {
    for (int j = 0; j < 12; ++j) h[i * 12 + j] = i == j ? 1.0 : -0.5;
  }
  expect_error(pr.w, h, Pattern::NM(2, 4), sg, "not positive semi-definite (smallest eigenvalue");
  expect_error(pr.w, pr.h, Pattern::NM(2, 16), sg, "needs at least 16 columns");
  expect_error(pr.w, pr.h, Pattern::VNM(16, 2, 4), sg, "needs at least 16 rows");
  expect_error(pr.w, pr.h, Pattern::Block(16, 4, 0.5), sg, "larger than the weight");
  expect_error(pr.w, {}, Pattern::NM(2, 4), PruneMethod::kWanda, "needs calibration");
  expect_error(pr.w, std::vector<double>(10, 1.0), Pattern::NM(2, 4), sg, "expected 12 x 12");
  Pattern bad;
  bad.kind = PatternKind::kNM;
  bad.n = 5;
  bad.m = 4;
  expect_error(pr.w, pr.h, bad, sg, "");
}

}  // namespace
}  // namespace sparq
