// SaveLlamaCheckpoint (sparq/model.h): a model loaded from a GGUF written as a .sparq holds it as
// loaded. With the Q4_1 / Q8_0 layers run as stored, the file keeps their codes, scales and mins,
// and the model read back is the same model bit for bit (same packed weights, so the same logits);
// with the f32 load, f32 values are the same bits and bf16 values are each f32 weight rounded.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <unistd.h>
#include <vector>

#include "model/model_testutil.h"
#include "sparq/checkpoint.h"
#include "sparq/dtype.h"
#include "sparq/model.h"
#include "sparq/thread_pool.h"

namespace sparq {
namespace {

class SaveModelTest : public testing::SharedSmolLmPair<SaveModelTest> {
 protected:
  static std::string Temp(const std::string& name) {
    return ::testing::TempDir() + "/sparq_save_" + name + "_" + std::to_string(::getpid()) +
           ".sparq";
  }
  // Last-token logits of a fixed prompt.
  static std::vector<float> Logits(const LlamaModel& m) {
    const std::vector<int32_t> tokens = {504, 2821, 282, 253, 1789, 30, 1147, 314};
    auto cache = KvCache::Create(m.config(), 16);
    EXPECT_TRUE(cache.ok());
    std::vector<float> logits(static_cast<size_t>(m.config().n_vocab));
    ThreadPool pool(2);
    EXPECT_TRUE(m.Forward(tokens, &*cache, logits.data(), false, &pool).ok());
    return logits;
  }
};

bool SameBytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

TEST_F(SaveModelTest, AsStoredLayersKeepTheirCodesAndTheModelItsBits) {
  const std::string out = Temp("stored");
  ASSERT_TRUE(SaveLlamaCheckpoint(*stored_, out).ok());
  auto back = LlamaModel::Load(out, testing::MachineConfig());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  const LlamaWeights& a = stored_->weights();
  const LlamaWeights& b = back->weights();
  ASSERT_EQ(a.blocks.size(), b.blocks.size());
  for (size_t l = 0; l < a.blocks.size(); ++l) {
    EXPECT_EQ(a.blocks[l].attn_norm, b.blocks[l].attn_norm);
    EXPECT_EQ(a.blocks[l].ffn_norm, b.blocks[l].ffn_norm);
    for (int s = 0; s < kNumSlots; ++s) {
      const auto qa = a.blocks[l].linear[s].dense_quant();
      const auto qb = b.blocks[l].linear[s].dense_quant();
      ASSERT_TRUE(qa && qb) << "block " << l << " slot " << s;
      EXPECT_EQ(qa->quant.spec.Name(), qb->quant.spec.Name());
      EXPECT_TRUE(SameBytes(qa->values, qb->values)) << "block " << l << " slot " << s;
      EXPECT_TRUE(SameBytes(qa->quant.scales, qb->quant.scales));
      EXPECT_TRUE(SameBytes(qa->quant.mins, qb->quant.mins));
    }
  }
  // The tied head stays the GGUF's Q8_0 embedding; the lookup reads its dequantization.
  const auto ha = a.output.dense_quant();
  const auto hb = b.output.dense_quant();
  ASSERT_TRUE(ha && hb);
  EXPECT_EQ(hb->quant.spec.Name(), "int8:g32");
  EXPECT_TRUE(SameBytes(ha->values, hb->values));
  EXPECT_TRUE(SameBytes(ha->quant.scales, hb->quant.scales));
  EXPECT_TRUE(SameBytes(a.token_embd, b.token_embd));
  EXPECT_EQ(a.output_norm, b.output_norm);
  EXPECT_EQ(back->config().ToJson(), stored_->config().ToJson());
  EXPECT_EQ(back->tokenizer().data().ToJson(), stored_->tokenizer().data().ToJson());
  EXPECT_EQ(back->weight_bytes(), stored_->weight_bytes());
  EXPECT_EQ(Logits(*back), Logits(*stored_));  // same packed weights, same kernels: same bits
  // About the GGUF's size (the same codes and f16 scales, plus the tokenizer as JSON).
  const auto gguf = std::filesystem::file_size(path_);
  const auto saved = std::filesystem::file_size(out);
  EXPECT_LT(saved, gguf * 1.05) << saved << " vs " << gguf;
  std::remove(out.c_str());
}

TEST_F(SaveModelTest, F32ValuesAreTheSameBitsAndBf16TheRoundedOnes) {
  const std::string out = Temp("f32");
  ASSERT_TRUE(SaveLlamaCheckpoint(*f32_, out).ok());
  {
    auto back = LlamaModel::Load(out, testing::MachineConfig());
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    for (size_t l = 0; l < back->weights().blocks.size(); ++l) {
      for (int s = 0; s < kNumSlots; ++s) {
        const LinearWeight& wa = f32_->weights().blocks[l].linear[s];
        const LinearWeight& wb = back->weights().blocks[l].linear[s];
        ASSERT_NE(wb.dense_f32(), nullptr);
        ASSERT_EQ(std::memcmp(wa.dense_f32(), wb.dense_f32(),
                              sizeof(float) * wa.rows() * wa.cols()),
                  0)
            << "block " << l << " slot " << s;
      }
    }
    EXPECT_EQ(Logits(*back), Logits(*f32_));
  }
  std::remove(out.c_str());

  const std::string out16 = Temp("bf16");
  ASSERT_TRUE(SaveLlamaCheckpoint(*f32_, out16, DType::kBF16).ok());
  auto ck = ReadCheckpoint(out16);
  ASSERT_TRUE(ck.ok()) << ck.status().ToString();
  const CheckpointTensor* m = ck->FindMatrix("blk.3.ffn_down.weight");
  ASSERT_NE(m, nullptr);
  const auto& dm = std::get<DenseMatrix>(m->matrix);
  ASSERT_EQ(dm.values.dtype(), DType::kBF16);
  const LinearWeight& w = f32_->weights().blocks[3].at(LinearSlot::kDown);
  const auto* got = dm.values.data_as<uint16_t>();
  for (int64_t i = 0; i < w.rows() * w.cols(); ++i) {
    ASSERT_EQ(got[i], F32ToBF16(w.dense_f32()[i])) << i;
  }
  const NamedTensor* te = ck->FindTensor("token_embd.weight");
  ASSERT_NE(te, nullptr);
  EXPECT_EQ(te->tensor.dtype(), DType::kBF16);
  EXPECT_EQ(ck->FindTensor("output_norm.weight")->tensor.dtype(), DType::kF32);
  EXPECT_NE(ck->metadata.count("sparq.saved"), 0u);

  // A model whose layers are bf16 (loaded from that .sparq) is not written this way.
  auto bf = LlamaModel::Load(out16, testing::MachineConfig());
  ASSERT_TRUE(bf.ok()) << bf.status().ToString();
  const Status st = SaveLlamaCheckpoint(*bf, Temp("again"));
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.ToString().find("blk.0.attn_q.weight"), std::string::npos) << st.ToString();
  EXPECT_FALSE(std::filesystem::exists(Temp("again")));
  std::remove(out16.c_str());
}

TEST_F(SaveModelTest, BadValuesAndPathsAreErrorsLeavingNoFile) {
  const Status st = SaveLlamaCheckpoint(*stored_, Temp("i8"), DType::kI8);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.ToString().find("f32, bf16 or f16"), std::string::npos) << st.ToString();
  EXPECT_FALSE(std::filesystem::exists(Temp("i8")));
  const std::string missing = Temp("no_such_dir") + "/m.sparq";
  EXPECT_FALSE(SaveLlamaCheckpoint(*stored_, missing).ok());
  EXPECT_FALSE(std::filesystem::exists(missing));
}

}  // namespace
}  // namespace sparq
