// Slow tier of the end-to-end pruning tests (2 blocks of SmolLM2-135M each): SparseGPT vs
// magnitude on perplexity, and channel-permuted 2:4 with bf16 values.

#include "model/prune_model_fixture.h"

namespace sparq {
namespace {
TEST_F(PruneModelTest, SparseGptBeatsMagnitudeOnPerplexity) {
  ThreadPool pool(2);
  const std::string out_sgpt = Out("sgpt.sparq"), out_mag = Out("mag.sparq");
  ASSERT_TRUE(
      PruneLlama(path_, calib_, SmallOptions(PruneMethod::kSparseGpt, "2:4"), out_sgpt, testing::MachineConfig(), &pool).ok());
  ASSERT_TRUE(
      PruneLlama(path_, calib_, SmallOptions(PruneMethod::kMagnitude, "2:4"), out_mag, testing::MachineConfig(), &pool).ok());
  auto m_sgpt = LlamaModel::Load(out_sgpt, testing::MachineConfig());
  auto m_mag = LlamaModel::Load(out_mag, testing::MachineConfig());
  ASSERT_TRUE(m_sgpt.ok() && m_mag.ok());
  const double dense = Ppl(*dense_), sgpt = Ppl(*m_sgpt), mag = Ppl(*m_mag);
  std::printf("perplexity (1024 WikiText tokens): dense %.3f, sparsegpt 2:4 (2 blocks) %.3f, "
              "magnitude 2:4 (2 blocks) %.3f\n",
              dense, sgpt, mag);
  EXPECT_GT(sgpt, dense);
  EXPECT_LT(sgpt, mag);
  for (const auto& p : {out_sgpt, out_mag}) std::remove(p.c_str());
}

TEST_F(PruneModelTest, PermutedTwoFourStoresPermutationAndRuns) {
  ThreadPool pool(2);
  ModelPruneOptions o = SmallOptions(PruneMethod::kWanda, "2:4");
  o.max_blocks = 1;
  o.permute = true;
  o.permute_max_rounds = 4;
  o.values.dtype = DType::kBF16;
  const std::string out = Out("perm.sparq");
  auto r = PruneLlama(path_, calib_, o, out, testing::MachineConfig(), &pool);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  int permuted = 0;
  for (const LayerPruneResult& l : r->layers) {
    permuted += l.report.permutation.empty() ? 0 : 1;
    EXPECT_GE(l.report.saliency_kept_permuted, l.report.saliency_kept_identity) << l.name;
  }
  EXPECT_EQ(permuted, 7);
  auto m = LlamaModel::Load(out, testing::MachineConfig());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->weights().blocks[0].perm[0].size(), 576u);
  const double ppl = Ppl(*m);
  EXPECT_TRUE(std::isfinite(ppl));
  EXPECT_LT(ppl, 3.0 * Ppl(*dense_));
  std::remove(out.c_str());
}

// --embedding-values int4 (int8: prune_model_test.cc). Measured on 1,024 WikiText tokens (8 x 256
// calibration tokens, Intel Xeon): int4:g64 RTN +8.49%, GPTQ +7.96% (head error 0.00082 vs RTN's
// 0.00686); int4:g32 GPTQ +3.53%. int4 misses issue 27's 2%: these bounds only guard against a
// broken head (a wrong group or nibble costs far more).
TEST_F(PruneModelTest, Int4EmbeddingRunsTheTiedHeadAsStored) {
  using QM = ModelPruneOptions::QuantMethod;
  const EmbeddingCase wants[] = {{"int4:g64", QM::kRtn, 0.10},
                                 {"int4:g64", QM::kGptq, 0.10},
                                 {"int4:g32", QM::kGptq, 0.10}};
  const std::vector<double> head_error = CheckQuantizedEmbeddings(wants);
  EXPECT_LT(head_error[1], head_error[0]) << "GPTQ's head error is not below round to nearest's";
}

}  // namespace
}  // namespace sparq
