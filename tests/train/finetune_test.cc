// `sparq finetune` below the command line (sparq/finetune.h) on tiny .sparq files: the loss falls;
// OUT keeps every matrix's format, structure, pattern and value dtype, its permutations, and every
// pruned weight is 0; OUT holds the trained weights (bf16 rounded); a run stopped and resumed
// writes the same bytes as an uninterrupted one; the error cases name what is wrong.
#include "sparq/finetune.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "sparq/checkpoint.h"
#include "sparq/dtype.h"
#include "sparq/format.h"
#include "sparq/kernel_config.h"
#include "sparq/model.h"
#include "sparq/train_loop.h"
#include "src/train/stored_slots.h"
#include "tests/train/finetune_testutil.h"
#include "tests/train/train_testutil.h"

namespace sparq::train {
namespace {

using testing::AllDense;
using testing::LetterText;
using testing::MixedStore;
using testing::TinyStore;
using testing::WriteTinySparq;

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/sparq_finetune_" + std::to_string(::getpid()) + "_" + name;
}

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

class FinetuneTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    student_ = new std::string(TempPath("student.sparq"));
    teacher_ = new std::string(TempPath("teacher.sparq"));
    WriteTinySparq(*student_, 1, MixedStore);
    WriteTinySparq(*teacher_, 2, AllDense);
  }
  static void TearDownTestSuite() {
    std::filesystem::remove(*student_);
    std::filesystem::remove(*teacher_);
    delete student_;
    delete teacher_;
  }
  // 30 steps of 2 windows of 8 tokens, KL + CE.
  FinetuneOptions Options(const std::string& out) const {
    FinetuneOptions o;
    o.student = *student_;
    o.teacher = *teacher_;
    o.texts = {{"letters.txt", LetterText(2000, 7)}};
    o.out = out;
    o.tokens = 30 * 16;
    o.seq_len = 8;
    o.accum = 2;
    o.lr = 5e-3;
    o.warmup = 3;
    o.kl = 1.0;
    o.ce = 1.0;
    o.seed = 11;
    return o;
  }
  Result<FinetuneResult> Run(const FinetuneOptions& o) { return Finetune(o, cfg_, &pool_); }

  static std::string* student_;
  static std::string* teacher_;
  KernelConfig cfg_ = KernelConfig::FromMachine().value();
  ThreadPool pool_{1};
};
std::string* FinetuneTest::student_ = nullptr;
std::string* FinetuneTest::teacher_ = nullptr;

TEST_F(FinetuneTest, LossFallsAndOutKeepsFormatsPatternsAndMasks) {
  const std::string out = TempPath("out.sparq");
  FinetuneOptions o = Options(out);
  std::vector<double> losses;
  o.progress = [&](const TrainProgress& p) { losses.push_back(p.loss); };
  auto r = Run(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->steps, 30);
  EXPECT_TRUE(r->wrote_out);
  ASSERT_EQ(losses.size(), 30u);
  const auto [head, tail] = testing::HeadTailMeans(losses);
  std::printf("  loss: first 5 steps %.4f, last 5 steps %.4f\n", head, tail);
  EXPECT_LT(tail, 0.8 * head);

  auto a = ReadCheckpoint(*student_);
  auto b = ReadCheckpoint(out);
  ASSERT_TRUE(a.ok() && b.ok()) << b.status().ToString();
  ASSERT_EQ(a->matrices.size(), b->matrices.size());
  auto state = LoadTrainState(out + ".state");
  ASSERT_TRUE(state.ok()) << state.status().ToString();
  int changed = 0;
  for (size_t i = 0; i < a->matrices.size(); ++i) {
    const CheckpointTensor& x = a->matrices[i];
    const CheckpointTensor& y = b->matrices[i];
    SCOPED_TRACE(x.name);
    ASSERT_EQ(x.name, y.name);
    EXPECT_EQ(KindOf(x.matrix), KindOf(y.matrix));
    EXPECT_EQ(x.pattern.ToString(), y.pattern.ToString());
    EXPECT_EQ(ValueDType(x.matrix), ValueDType(y.matrix));
    ASSERT_EQ(Rows(x.matrix), Rows(y.matrix));
    ASSERT_EQ(Cols(x.matrix), Cols(y.matrix));
    if (KindOf(x.matrix) == FormatKind::kNM) {  // the structure is kept bit for bit
      const Tensor& mx = std::get<NmMatrix>(x.matrix).meta;
      const Tensor& my = std::get<NmMatrix>(y.matrix).meta;
      ASSERT_EQ(mx.nbytes(), my.nbytes());
      EXPECT_EQ(std::memcmp(mx.data(), my.data(), mx.nbytes()), 0);
    }
    if (KindOf(x.matrix) == FormatKind::kCsr) {
      const auto& cx = std::get<CsrMatrix>(x.matrix);
      const auto& cy = std::get<CsrMatrix>(y.matrix);
      EXPECT_EQ(std::memcmp(cx.col_idx.data(), cy.col_idx.data(), cx.col_idx.nbytes()), 0);
      EXPECT_EQ(std::memcmp(cx.row_ptr.data(), cy.row_ptr.data(), cx.row_ptr.nbytes()), 0);
    }
    const Tensor dx = ToDense(x.matrix), dy = ToDense(y.matrix);
    const float* px = dx.data_as<float>();
    const float* py = dy.data_as<float>();
    const int64_t m = Rows(x.matrix), k = Cols(x.matrix);
    // The trained weights in the stored column order, rounded as stored.
    const int64_t l = x.name[4] - '0';
    int slot = 0;
    while (x.name != "blk." + std::to_string(l) + "." +
                         std::string(SlotName(static_cast<LinearSlot>(slot))) + ".weight") {
      ++slot;
    }
    const std::vector<float>& tw = state->weights.blocks[l].linear[slot];
    const NamedTensor* perm = a->FindTensor(x.name + ".perm");
    const NamedTensor* perm_out = b->FindTensor(x.name + ".perm");
    ASSERT_EQ(perm == nullptr, perm_out == nullptr);
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t j = 0; j < k; ++j) {
        const int64_t src = perm ? perm->tensor.data_as<int32_t>()[j] : j;
        if (perm) {
          EXPECT_EQ(perm->tensor.data_as<int32_t>()[j], perm_out->tensor.data_as<int32_t>()[j]);
        }
        float want = tw[r * k + src];
        if (ValueDType(x.matrix) == DType::kBF16) want = BF16ToF32(F32ToBF16(want));
        if (KindOf(x.matrix) == FormatKind::kDense && r * k + j == 1) {
          EXPECT_NE(py[1], 0.0f) << "a dense slot's exact 0 trains";
        } else if (px[r * k + j] == 0.0f) {
          ASSERT_EQ(py[r * k + j], 0.0f) << "pruned weight (" << r << ", " << j << ")";
        }
        ASSERT_EQ(py[r * k + j], want) << "(" << r << ", " << j << ")";
        changed += py[r * k + j] != px[r * k + j];
      }
    }
  }
  EXPECT_GT(changed, 100);
  // Plain tensors keep their dtypes and hold the trained values.
  const NamedTensor* emb = b->FindTensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(std::memcmp(emb->tensor.data(), state->weights.token_embd.data(), emb->tensor.nbytes()),
            0);
  EXPECT_EQ(b->metadata.at("sparq.model"), a->metadata.at("sparq.model"));
  EXPECT_EQ(b->metadata.at("sparq.tokenizer"), a->metadata.at("sparq.tokenizer"));
  EXPECT_NE(b->metadata.find("sparq.finetune"), b->metadata.end());
  // OUT loads and runs.
  auto model = LlamaModel::Load(out, cfg_);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  std::filesystem::remove(out);
  std::filesystem::remove(out + ".state");
}

TEST_F(FinetuneTest, StoppedAndResumedEqualsAnUninterruptedRunBitForBit) {
  const std::string full = TempPath("full.sparq"), part = TempPath("part.sparq");
  FinetuneOptions o = Options(full);
  o.tokens = 10 * 16;
  o.checkpoint_every = 3;
  ASSERT_TRUE(Run(o).ok());
  o.out = part;
  o.stop_at = 4;
  auto r = Run(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->wrote_out);
  EXPECT_FALSE(std::filesystem::exists(part));
  ASSERT_TRUE(std::filesystem::exists(part + ".state"));

  // A resume with other options or data is refused, naming the difference.
  FinetuneOptions bad = o;
  bad.stop_at = -1;
  bad.resume = true;
  bad.lr = 1e-3;
  auto e = Run(bad);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("--lr"), std::string::npos) << e.status().ToString();
  bad = o;
  bad.stop_at = -1;
  bad.resume = true;
  bad.texts = {{"other.txt", LetterText(2000, 8)}};
  e = Run(bad);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("same data"), std::string::npos) << e.status().ToString();

  // ... or with another student (other masks).
  const std::string other = TempPath("other_student.sparq");
  WriteTinySparq(other, 5, MixedStore);
  bad = o;
  bad.stop_at = -1;
  bad.resume = true;
  bad.student = other;
  e = Run(bad);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("another student"), std::string::npos)
      << e.status().ToString();
  std::filesystem::remove(other);

  o.stop_at = -1;
  o.resume = true;
  r = Run(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->start_step, 4);
  EXPECT_EQ(r->end_step, 10);
  const std::string a = ReadAll(full), b = ReadAll(part);
  ASSERT_FALSE(a.empty());
  EXPECT_TRUE(a == b) << "resumed OUT differs from the uninterrupted run's";
  for (const std::string& p : {full, part, full + ".state", part + ".state"}) {
    std::filesystem::remove(p);
  }
}

// --eval-every (the curve): its points are the runtime's perplexity (`sparq eval`'s windows) of
// the student before the first step and of OUT after the last (an all-f32 student, so OUT holds
// the masters unrounded); a run stopped between points and resumed gives the same points, bit
// for bit; eval_every without an eval text is refused.
TinyStore F32Store(int64_t l, int s) {
  static constexpr TinyStore kKinds[] = {TinyStore::kNm24F32, TinyStore::kCsrF32,
                                         TinyStore::kNm24PermF32, TinyStore::kDenseF32};
  return kKinds[(l * kNumSlots + s) % 4];
}

double RuntimePerplexity(const std::string& model_path, const std::string& text, int64_t ctx) {
  auto m = LlamaModel::Load(model_path, KernelConfig::FromMachine().value());
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  auto ids = m->tokenizer().Encode(text);
  EXPECT_TRUE(ids.ok());
  auto p = Perplexity(*m, *ids, ctx, nullptr);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return p->perplexity;
}

TEST_F(FinetuneTest, TheCurveIsTheRuntimesPerplexityAndAResumeGivesTheSamePoints) {
  const std::string student = TempPath("f32_student.sparq");
  WriteTinySparq(student, 6, F32Store);
  const std::string full = TempPath("curve_full.sparq"), part = TempPath("curve_part.sparq");
  const std::string eval_text = LetterText(300, 9);
  FinetuneOptions o = Options(full);
  o.student = student;
  o.tokens = 10 * 16;  // 10 steps: points at 0, 4, 8 and 10
  o.eval_every = 4;
  o.eval_texts = {{"eval.txt", eval_text}};
  std::vector<int64_t> seen;
  o.on_eval = [&](const FinetuneCurvePoint& p) { seen.push_back(p.step); };
  auto r = Run(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->curve.size(), 4u);
  EXPECT_EQ(seen, (std::vector<int64_t>{0, 4, 8, 10}));
  EXPECT_EQ(r->curve[1].tokens, 4 * 16);
  // Two f32 forwards rounding differently: logits within 1e-5 of their largest
  // (from_model_test), a log-softmax moves by at most twice the largest logit change, and this
  // model's logits stay below ~5 in size: ln(perplexity) within 1e-4.
  const double at0 = RuntimePerplexity(student, eval_text, o.seq_len);
  const double atN = RuntimePerplexity(full, eval_text, o.seq_len);
  std::printf("  curve %.5f %.5f %.5f %.5f; runtime before %.5f, OUT %.5f\n",
              r->curve[0].perplexity, r->curve[1].perplexity, r->curve[2].perplexity,
              r->curve[3].perplexity, at0, atN);
  EXPECT_NEAR(std::log(r->curve[0].perplexity), std::log(at0), 1e-4);
  EXPECT_NEAR(std::log(r->curve[3].perplexity), std::log(atN), 1e-4);
  EXPECT_LT(r->curve[3].perplexity, r->curve[0].perplexity);
  EXPECT_EQ(r->eval_predicted, 37 * 7 + 3);  // 300 letters: 37 windows of 8, then 4 tokens

  o.out = part;
  o.stop_at = 6;
  auto a = Run(o);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_EQ(a->curve.size(), 2u);  // 0 and 4
  o.stop_at = -1;
  o.resume = true;
  auto b = Run(o);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ASSERT_EQ(b->curve.size(), 2u);  // 8 and 10
  EXPECT_EQ(a->curve[0].perplexity, r->curve[0].perplexity);
  EXPECT_EQ(a->curve[1].perplexity, r->curve[1].perplexity);
  EXPECT_EQ(b->curve[0].perplexity, r->curve[2].perplexity);
  EXPECT_EQ(b->curve[1].perplexity, r->curve[3].perplexity);

  // A second eval text is scored on its own: the first text's points do not move, the second's
  // are its own runtime perplexity, and the predicted tokens add up.
  const std::string other = LetterText(150, 4);
  o.out = TempPath("curve_two.sparq");
  o.resume = false;
  o.eval_texts = {{"eval.txt", eval_text}, {"other.txt", other}};
  auto two = Run(o);
  ASSERT_TRUE(two.ok()) << two.status().ToString();
  ASSERT_EQ(two->curve.size(), 4u);
  EXPECT_EQ(two->eval_names, (std::vector<std::string>{"eval.txt", "other.txt"}));
  for (size_t i = 0; i < 4; ++i) {
    ASSERT_EQ(two->curve[i].perplexities.size(), 2u);
    EXPECT_EQ(two->curve[i].perplexity, r->curve[i].perplexity);
    EXPECT_EQ(two->curve[i].perplexities[0], r->curve[i].perplexity);
  }
  EXPECT_NEAR(std::log(two->curve[0].perplexities[1]),
              std::log(RuntimePerplexity(student, other, o.seq_len)), 1e-4);
  EXPECT_NEAR(std::log(two->curve[3].perplexities[1]),
              std::log(RuntimePerplexity(o.out, other, o.seq_len)), 1e-4);
  EXPECT_EQ(two->eval_predicted, 37 * 7 + 3 + 18 * 7 + 5);  // + 150 letters: 18 windows, 6 tokens

  FinetuneOptions bad = Options(full);
  bad.eval_every = 4;
  auto e = Run(bad);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("--eval-text"), std::string::npos) << e.status().ToString();
  for (const std::string& p : {student, full, part, full + ".state", part + ".state"}) {
    std::filesystem::remove(p);
  }
}

// --train norms: OUT differs from the student in the RMSNorm gains alone (every matrix and the
// embedding bit for bit), the loss still falls, and a resume asking for --train all is refused.
TEST_F(FinetuneTest, NormsOnlyChangesTheGainsAlone) {
  const std::string out = TempPath("norms.sparq");
  FinetuneOptions o = Options(out);
  o.norms_only = true;
  o.lr = 5e-2;
  std::vector<double> losses;
  o.progress = [&](const TrainProgress& p) { losses.push_back(p.loss); };
  auto r = Run(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(losses.size(), 30u);
  std::printf("  norms only: loss %.4f -> %.4f\n", losses.front(), losses.back());
  EXPECT_LT(losses.back(), losses.front());
  auto a = ReadCheckpoint(*student_);
  auto b = ReadCheckpoint(out);
  ASSERT_TRUE(a.ok() && b.ok()) << b.status().ToString();
  ASSERT_EQ(a->matrices.size(), b->matrices.size());
  for (size_t i = 0; i < a->matrices.size(); ++i) {
    const Tensor x = ToDense(a->matrices[i].matrix), y = ToDense(b->matrices[i].matrix);
    ASSERT_EQ(x.nbytes(), y.nbytes());
    EXPECT_EQ(std::memcmp(x.data(), y.data(), x.nbytes()), 0) << a->matrices[i].name;
  }
  int norms = 0;
  for (const NamedTensor& t : a->tensors) {
    const NamedTensor* u = b->FindTensor(t.name);
    ASSERT_NE(u, nullptr) << t.name;
    ASSERT_EQ(t.tensor.nbytes(), u->tensor.nbytes()) << t.name;
    const bool same = std::memcmp(t.tensor.data(), u->tensor.data(), t.tensor.nbytes()) == 0;
    if (t.name.ends_with("norm.weight")) {
      ++norms;
      EXPECT_FALSE(same) << t.name << " did not train";
    } else {
      EXPECT_TRUE(same) << t.name << " changed";
    }
  }
  EXPECT_GT(norms, 0);
  FinetuneOptions bad = Options(out);
  bad.lr = o.lr;
  bad.resume = true;
  auto e = Run(bad);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("--train norms"), std::string::npos)
      << e.status().ToString();
  std::filesystem::remove(out);
  std::filesystem::remove(out + ".state");
}

// --hidden (SquareHead): a run with the term trains (the loss falls), its first loss is above the
// KL + CE run's by the term (>= 0), the weight is saved in the state, and a resume asking for
// another --hidden is refused naming the flag. Weights below 0 or not finite are refused.
TEST_F(FinetuneTest, SquareHeadTrainsAndAResumeWithAnotherHiddenIsRefused) {
  const std::string out = TempPath("hidden.sparq");
  FinetuneOptions o = Options(out);
  o.hidden = 0.5;
  std::vector<double> losses;
  o.progress = [&](const TrainProgress& p) { losses.push_back(p.loss); };
  auto r = Run(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->wrote_out);
  ASSERT_EQ(losses.size(), 30u);
  const auto [head, tail] = testing::HeadTailMeans(losses);
  std::printf("  with --hidden 0.5: loss first 5 steps %.4f, last 5 steps %.4f\n", head, tail);
  EXPECT_LT(tail, 0.8 * head);
  auto state = LoadTrainState(out + ".state");
  ASSERT_TRUE(state.ok()) << state.status().ToString();
  EXPECT_EQ(state->options.hidden_weight, 0.5);
  auto written = ReadCheckpoint(out);
  ASSERT_TRUE(written.ok());
  EXPECT_NE(written->metadata.at("sparq.finetune").find("\"hidden\":0.5"), std::string::npos);

  // The same first step without the term: a smaller loss (the term is a sum of squares > 0 for a
  // student that is not its teacher).
  FinetuneOptions plain = Options(TempPath("plain.sparq"));
  plain.stop_at = 1;
  auto rp = Run(plain);
  ASSERT_TRUE(rp.ok()) << rp.status().ToString();
  std::printf("  first loss: %.4f with the term, %.4f without\n", r->first_loss, rp->first_loss);
  EXPECT_GT(r->first_loss, rp->first_loss);
  std::filesystem::remove(plain.out + ".state");

  // SquareHead alone (no KL, no CE) is a loss that trains too.
  FinetuneOptions alone = Options(TempPath("alone.sparq"));
  alone.kl = 0.0;
  alone.ce = 0.0;
  alone.hidden = 1.0;
  losses.clear();
  alone.progress = [&](const TrainProgress& p) { losses.push_back(p.loss); };
  auto ra = Run(alone);
  ASSERT_TRUE(ra.ok()) << ra.status().ToString();
  std::printf("  --hidden alone: loss %.4f -> %.4f\n", losses.front(), losses.back());
  EXPECT_LT(losses.back(), 0.9 * losses.front());  // measured 0.79x
  std::filesystem::remove(alone.out);
  std::filesystem::remove(alone.out + ".state");

  // A resume must ask for the same weight.
  FinetuneOptions bad = Options(out);
  bad.hidden = 0.25;
  bad.resume = true;
  auto e = Run(bad);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidInput);
  EXPECT_NE(e.status().message().find("--hidden 0.5, this run asks for 0.25"), std::string::npos)
      << e.status().ToString();
  bad.hidden = 0.0;  // a state with the term resumed without it
  e = Run(bad);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("--hidden"), std::string::npos) << e.status().ToString();

  for (const double w : {-1.0, std::nan(""), static_cast<double>(INFINITY)}) {
    FinetuneOptions neg = Options(TempPath("never.sparq"));
    neg.hidden = w;
    auto en = Run(neg);
    ASSERT_FALSE(en.ok()) << w;
    EXPECT_EQ(en.status().code(), StatusCode::kInvalidInput);
    EXPECT_NE(en.status().message().find("--hidden must be finite and >= 0"), std::string::npos)
        << en.status().ToString();
  }
  FinetuneOptions no_teacher = Options(TempPath("never.sparq"));
  no_teacher.teacher.clear();
  no_teacher.kl = 0.0;
  no_teacher.hidden = 1.0;
  auto et = Run(no_teacher);
  ASSERT_FALSE(et.ok());
  EXPECT_NE(et.status().message().find("--teacher"), std::string::npos) << et.status().ToString();
  std::filesystem::remove(out);
  std::filesystem::remove(out + ".state");
}

// SquareHead pairs the blocks one to one: a teacher of another depth is refused with --hidden
// (naming both files and depths), while KL alone accepts it (it compares logits only).
TEST_F(FinetuneTest, HiddenRefusesATeacherOfAnotherDepth) {
  const std::string deep = TempPath("teacher3.sparq");
  WriteTinySparq(deep, 4, AllDense, /*n_vocab=*/11, /*n_layer=*/3);
  FinetuneOptions o = Options(TempPath("deep.sparq"));
  o.teacher = deep;
  o.hidden = 1.0;
  auto r = Run(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidInput);
  EXPECT_NE(r.status().message().find("has 3 blocks of width 16"), std::string::npos)
      << r.status().ToString();
  EXPECT_NE(r.status().message().find(*student_ + " 2 of width 16"), std::string::npos)
      << r.status().ToString();
  o.hidden = 0.0;
  o.stop_at = 1;
  auto ok = Run(o);
  EXPECT_TRUE(ok.ok()) << ok.status().ToString();
  std::filesystem::remove(o.out + ".state");
  std::filesystem::remove(deep);
}

TEST_F(FinetuneTest, ATeacherWithAnotherVocabularyIsRefusedNamingBothFiles) {
  const std::string other = TempPath("teacher12.sparq");
  WriteTinySparq(other, 3, AllDense, /*n_vocab=*/12);
  FinetuneOptions o = Options(TempPath("never.sparq"));
  o.teacher = other;
  auto r = Run(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidInput);
  EXPECT_NE(r.status().message().find(other), std::string::npos) << r.status().ToString();
  EXPECT_NE(r.status().message().find(*student_), std::string::npos) << r.status().ToString();
  std::filesystem::remove(other);
}

TEST_F(FinetuneTest, TooFewTokensIsRefused) {
  FinetuneOptions o = Options(TempPath("never.sparq"));
  o.texts = {{"short.txt", "abcd"}};
  auto r = Run(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidInput);
  EXPECT_NE(r.status().message().find("short.txt"), std::string::npos) << r.status().ToString();
  EXPECT_NE(r.status().message().find("--seq-len + 1 = 9"), std::string::npos);
}

// A diverging run (an absurd rate): the first update blows the weights up, the next loss is not
// finite; the run stops with an error and the state of the last good step is kept.
TEST_F(FinetuneTest, ANonFiniteLossStopsAndKeepsTheLastGoodState) {
  const std::string out = TempPath("nan.sparq");
  FinetuneOptions o = Options(out);
  o.lr = 1e30;
  o.warmup = 0;
  o.max_grad_norm = 0;
  auto r = Run(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidInput);
  EXPECT_NE(r.status().message().find("training stopped"), std::string::npos)
      << r.status().ToString();
  EXPECT_FALSE(std::filesystem::exists(out));
  auto s = LoadTrainState(out + ".state");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_GE(s->step(), 1);
  std::filesystem::remove(out + ".state");
}

TEST_F(FinetuneTest, AStudentThatIsNotASparqModelIsRefused) {
  const std::string bad = TempPath("not_a_model.sparq");
  std::ofstream(bad) << "not a checkpoint";
  FinetuneOptions o = Options(TempPath("never.sparq"));
  o.student = bad;
  auto r = Run(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(bad), std::string::npos) << r.status().ToString();
  std::filesystem::remove(bad);
}

// The slot (l, s) of a block matrix's name "blk.L.SLOT.weight".
std::pair<int64_t, int> SlotOfName(const std::string& name) {
  const int64_t l = name[4] - '0';
  for (int s = 0; s < kNumSlots; ++s) {
    if (name == "blk." + std::to_string(l) + "." +
                    std::string(SlotName(static_cast<LinearSlot>(s))) + ".weight") {
      return {l, s};
    }
  }
  return {l, -1};
}

// The largest scale of row r of a quantized matrix (f16 [rows, groups]).
float MaxRowScale(const SparseMatrix& sm, int64_t r) {
  const QuantParts* q = QuantOf(sm);
  const int64_t g = q->scales.dim(1);
  const auto* p = q->scales.data_as<uint16_t>();
  float mx = 0.0f;
  for (int64_t j = 0; j < g; ++j) mx = std::max(mx, std::fabs(F16ToF32(p[r * g + j])));
  return mx;
}

// A quantized student (int4:g32:sym and int8:g32 2:4, permuted 2:4 int4, int8:g32 CSR, V:N:M
// 2:2:4 and BSR 2 x 4, int4:g32 dense, an int8 embedding, one f32 2:4 slot) trains: OUT has the
// same formats, value specs, structure (N:M metadata, CSR indices, permutations) bit for bit, every
// stored value is the trained weight rounded to nearest in its group (within half a step; --requant
// rtn), nothing is stored outside the structure, a kept weight whose code meant 0 is kept and
// trains, and OUT loads and runs.
TEST_F(FinetuneTest, AQuantizedStudentTrainsAndKeepsItsStructureAndValueSpecs) {
  const std::string q = TempPath("quant_student.sparq"), out = TempPath("quant_out.sparq");
  WriteTinySparq(q, 1, testing::QuantStore, 11, 2, "int8:g32");
  FinetuneOptions o = Options(out);
  o.student = q;
  o.gptq = false;
  std::vector<double> losses;
  o.progress = [&](const TrainProgress& p) { losses.push_back(p.loss); };
  auto r = Run(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE(r->wrote_out);
  ASSERT_EQ(losses.size(), 30u);
  EXPECT_LT(losses.back(), losses.front());
  auto a = ReadCheckpoint(q);
  auto b = ReadCheckpoint(out);
  ASSERT_TRUE(a.ok() && b.ok()) << b.status().ToString();
  auto state = LoadTrainState(out + ".state");
  ASSERT_TRUE(state.ok()) << state.status().ToString();
  ASSERT_EQ(a->matrices.size(), b->matrices.size());
  int quantized = 0, kept_zeros_trained = 0, changed = 0;
  for (size_t i = 0; i < a->matrices.size(); ++i) {
    const CheckpointTensor& x = a->matrices[i];
    const CheckpointTensor& y = b->matrices[i];
    SCOPED_TRACE(x.name);
    ASSERT_EQ(x.name, y.name);
    EXPECT_EQ(KindOf(x.matrix), KindOf(y.matrix));
    EXPECT_EQ(ValuesName(x.matrix), ValuesName(y.matrix));
    EXPECT_EQ(x.pattern.ToString(), y.pattern.ToString());
    ASSERT_TRUE(Validate(y.matrix, y.name).ok());
    if (const auto* nx = std::get_if<NmMatrix>(&x.matrix)) {
      const Tensor& my = std::get<NmMatrix>(y.matrix).meta;
      ASSERT_EQ(nx->meta.nbytes(), my.nbytes());
      EXPECT_EQ(std::memcmp(nx->meta.data(), my.data(), my.nbytes()), 0);
    }
    if (const auto* vx = std::get_if<VnmMatrix>(&x.matrix)) {
      const Tensor& my = std::get<VnmMatrix>(y.matrix).meta;
      ASSERT_EQ(vx->meta.nbytes(), my.nbytes());
      EXPECT_EQ(std::memcmp(vx->meta.data(), my.data(), my.nbytes()), 0);
    }
    if (const auto* bx = std::get_if<BsrMatrix>(&x.matrix)) {
      const auto& by = std::get<BsrMatrix>(y.matrix);
      ASSERT_EQ(bx->col_idx.nbytes(), by.col_idx.nbytes());
      EXPECT_EQ(std::memcmp(bx->col_idx.data(), by.col_idx.data(), bx->col_idx.nbytes()), 0);
      EXPECT_EQ(std::memcmp(bx->row_ptr.data(), by.row_ptr.data(), bx->row_ptr.nbytes()), 0);
    }
    if (const auto* cx = std::get_if<CsrMatrix>(&x.matrix)) {
      const auto& cy = std::get<CsrMatrix>(y.matrix);
      ASSERT_EQ(cx->col_idx.nbytes(), cy.col_idx.nbytes());
      EXPECT_EQ(std::memcmp(cx->col_idx.data(), cy.col_idx.data(), cx->col_idx.nbytes()), 0);
      EXPECT_EQ(std::memcmp(cx->row_ptr.data(), cy.row_ptr.data(), cx->row_ptr.nbytes()), 0);
    }
    if (!IsQuantized(x.matrix)) continue;  // the f32 slot: LossFalls... checks numbers
    ++quantized;
    const bool embd = x.name == "token_embd.weight";
    const int64_t m = Rows(x.matrix), k = Cols(x.matrix);
    const NamedTensor* perm = a->FindTensor(x.name + ".perm");
    const NamedTensor* perm_out = b->FindTensor(x.name + ".perm");
    ASSERT_EQ(perm == nullptr, perm_out == nullptr);
    if (perm) {
      EXPECT_EQ(std::memcmp(perm->tensor.data(), perm_out->tensor.data(), perm->tensor.nbytes()),
                0);
    }
    const auto [l, slot] = embd ? std::pair<int64_t, int>{0, 0} : SlotOfName(x.name);
    const std::vector<float>& tw =
        embd ? state->weights.token_embd : state->weights.blocks[l].linear[slot];
    // Which stored positions hold a slot (the structure), and the kept-zero position.
    std::vector<bool> stored(m * k, false);
    const std::vector<int64_t> pos = SlotPositions(x.matrix);
    for (int64_t p : pos) {
      if (p >= 0) stored[p] = true;
    }
    const Tensor dx = ToDense(x.matrix), dy = ToDense(y.matrix);
    const float* px = dx.data_as<float>();
    const float* py = dy.data_as<float>();
    for (int64_t rr = 0; rr < m; ++rr) {
      // Half a step, plus the clamp an f16-rounded scale may add at a group's ends.
      const float tol = 0.52f * MaxRowScale(y.matrix, rr) + 1e-6f;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t src = perm ? perm->tensor.data_as<int32_t>()[j] : j;
        const float want = tw[rr * k + src];
        if (!stored[rr * k + j]) {
          ASSERT_EQ(py[rr * k + j], 0.0f) << "pruned (" << rr << ", " << j << ")";
          ASSERT_EQ(want, 0.0f) << "pruned master (" << rr << ", " << j << ")";
          continue;
        }
        ASSERT_LE(std::fabs(py[rr * k + j] - want), tol) << "(" << rr << ", " << j << ")";
        changed += py[rr * k + j] != px[rr * k + j];
      }
    }
    // Row 1's first stored value of a sparse slot was a code meaning 0: still kept, trained.
    if (KindOf(x.matrix) != FormatKind::kDense) {
      int64_t p0 = -1;
      for (int64_t p : pos) {
        if (p >= k) {
          p0 = p;
          break;
        }
      }
      ASSERT_GE(p0, k);
      ASSERT_LT(p0, 2 * k);
      EXPECT_EQ(px[p0], 0.0f);
      const int64_t model_pos =
          (p0 / k) * k + (perm ? perm->tensor.data_as<int32_t>()[p0 % k] : p0 % k);
      const std::vector<int64_t>& kept = state->masks[l].kept[slot];
      EXPECT_TRUE(std::find(kept.begin(), kept.end(), model_pos) != kept.end());
      EXPECT_NE(tw[model_pos], 0.0f) << "the kept zero trained";
      kept_zeros_trained += tw[model_pos] != 0.0f;
    }
  }
  EXPECT_EQ(quantized, 13);           // 12 of the 14 block slots, and the embedding
  EXPECT_EQ(kept_zeros_trained, 10);  // the N:M, V:N:M, BSR and CSR quantized slots
  EXPECT_GT(changed, 100);
  // OUT loads and runs.
  auto model = LlamaModel::Load(out, cfg_);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto kv = KvCache::Create(model->config(), 4);
  ASSERT_TRUE(kv.ok());
  std::vector<float> logits(4 * model->config().n_vocab);
  const std::vector<int32_t> in = {1, 4, 2, 7};
  ASSERT_TRUE(model->Forward(in, &*kv, logits.data(), true, &pool_).ok());
  for (float v : logits) ASSERT_TRUE(std::isfinite(v));
  for (const std::string& p : {q, out, out + ".state"}) std::filesystem::remove(p);
}

// A student whose int8 head keeps rows apart (token_embd.rows.*, `--embedding-int8-rows`): OUT's
// rows are the trained embedding's rows at those ids (within half a step of their int8 groups),
// not the student's, and OUT loads with them.
TEST_F(FinetuneTest, HeadRowsStoredApartAreRefittedFromTheTrainedEmbedding) {
  const std::string q = TempPath("rows_student.sparq"), out = TempPath("rows_out.sparq");
  WriteTinySparq(q, 1, testing::QuantStore, 11, 2, "int8:g32");
  auto ck = ReadCheckpoint(q);
  ASSERT_TRUE(ck.ok()) << ck.status().ToString();
  const Tensor embd = ToDense(ck->FindMatrix("token_embd.weight")->matrix);
  const int64_t d = embd.dim(1);
  const std::vector<int32_t> ids = {1, 4, 7};
  std::vector<float> rows;
  for (int32_t id : ids) {
    rows.insert(rows.end(), embd.data_as<float>() + id * d, embd.data_as<float>() + (id + 1) * d);
  }
  auto f = DenseMatrix::FromDense(rows, 3, d);
  ASSERT_TRUE(f.ok());
  auto rq = DenseMatrix::Quantize(*f, *ValueSpec::Parse("int8:g32"));
  ASSERT_TRUE(rq.ok()) << rq.status().ToString();
  ck->matrices.push_back({"token_embd.rows.weight", std::move(*rq), Pattern::Dense()});
  ck->tensors.push_back(
      {"token_embd.rows.ids", Tensor::View(DType::kI32, {3}, ids.data()).Clone()});
  ASSERT_TRUE(WriteCheckpoint(q, *ck).ok());
  FinetuneOptions o = Options(out);
  o.student = q;
  o.gptq = false;
  auto r = Run(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto b = ReadCheckpoint(out);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  auto state = LoadTrainState(out + ".state");
  ASSERT_TRUE(state.ok()) << state.status().ToString();
  const CheckpointTensor* y = b->FindMatrix("token_embd.rows.weight");
  ASSERT_NE(y, nullptr);
  ASSERT_NE(b->FindTensor("token_embd.rows.ids"), nullptr);
  const Tensor dy = ToDense(y->matrix);
  const Tensor dx = ToDense(ck->FindMatrix("token_embd.rows.weight")->matrix);
  int changed = 0;
  for (int64_t j = 0; j < 3; ++j) {
    const float tol = 0.52f * MaxRowScale(y->matrix, j) + 1e-6f;
    for (int64_t i = 0; i < d; ++i) {
      const float want = state->weights.token_embd[ids[j] * d + i];
      ASSERT_LE(std::fabs(dy.data_as<float>()[j * d + i] - want), tol) << j << ", " << i;
      changed += dy.data_as<float>()[j * d + i] != dx.data_as<float>()[j * d + i];
    }
  }
  EXPECT_GT(changed, 0) << "the rows apart kept the student's values";
  auto model = LlamaModel::Load(out, cfg_);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  EXPECT_EQ(model->weights().output_row_ids, ids);
  for (const std::string& p : {q, out, out + ".state"}) std::filesystem::remove(p);
}

// GPTQ re-quantization (the default): a stopped and resumed run ends with the same OUT, bit for
// bit; OUT keeps every matrix's format, value spec and structure (kept weights GPTQ rounds to 0
// included: int4:g32:sym 2:4 has many); GPTQ wrote every trained block matrix, and its matrices
// differ from round to nearest's; OUT loads.
TEST_F(FinetuneTest, AQuantizedStudentStoppedAndResumedEqualsAnUninterruptedRunBitForBit) {
  const std::string q = TempPath("quant_student2.sparq");
  WriteTinySparq(q, 3, testing::QuantStoreNoPerm, 11, 2, "int8:g32");
  const std::string full = TempPath("qfull.sparq"), part = TempPath("qpart.sparq");
  FinetuneOptions o = Options(full);
  o.student = q;
  o.tokens = 10 * 16;
  o.checkpoint_every = 3;
  auto whole = Run(o);
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  std::printf("  requantized: %lld by GPTQ, %lld by round to nearest\n",
              static_cast<long long>(whole->requant_gptq),
              static_cast<long long>(whole->requant_rtn));
  EXPECT_EQ(whole->requant_gptq + whole->requant_rtn, 12);  // the trained quantized block slots
  EXPECT_EQ(whole->requant_gptq, 12);  // every one in the student's structure (none fell back)
  {
    auto a = ReadCheckpoint(q);
    auto b = ReadCheckpoint(full);
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_EQ(a->matrices.size(), b->matrices.size());
    for (size_t i = 0; i < a->matrices.size(); ++i) {
      const SparseMatrix& x = a->matrices[i].matrix;
      const SparseMatrix& y = b->matrices[i].matrix;
      SCOPED_TRACE(a->matrices[i].name);
      EXPECT_EQ(KindOf(x), KindOf(y));
      EXPECT_EQ(ValuesName(x), ValuesName(y));
      ASSERT_TRUE(Validate(y, "y").ok());
      if (const auto* nx = std::get_if<NmMatrix>(&x)) {
        const Tensor& my = std::get<NmMatrix>(y).meta;
        EXPECT_EQ(std::memcmp(nx->meta.data(), my.data(), my.nbytes()), 0);
      }
      if (const auto* cx = std::get_if<CsrMatrix>(&x)) {
        const auto& cy = std::get<CsrMatrix>(y);
        ASSERT_EQ(cx->col_idx.nbytes(), cy.col_idx.nbytes());
        EXPECT_EQ(std::memcmp(cx->col_idx.data(), cy.col_idx.data(), cx->col_idx.nbytes()), 0);
        EXPECT_EQ(std::memcmp(cx->row_ptr.data(), cy.row_ptr.data(), cx->row_ptr.nbytes()), 0);
      }
    }
    EXPECT_NE(b->metadata.at("sparq.finetune").find("\"gptq\""), std::string::npos);
    ASSERT_TRUE(LlamaModel::Load(full, cfg_).ok());
    // Round to nearest on the same training writes other values.
    FinetuneOptions ro = o;
    ro.out = TempPath("qrtn.sparq");
    ro.gptq = false;
    ASSERT_TRUE(Run(ro).ok());
    EXPECT_FALSE(ReadAll(ro.out) == ReadAll(full));
    std::filesystem::remove(ro.out);
    std::filesystem::remove(ro.out + ".state");
    EXPECT_FALSE(std::filesystem::exists(full + ".gptq-in.sparq"));
    EXPECT_FALSE(std::filesystem::exists(full + ".gptq-out.sparq"));
  }
  o.out = part;
  o.stop_at = 4;
  auto r = Run(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->wrote_out);
  o.stop_at = -1;
  o.resume = true;
  r = Run(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->start_step, 4);
  const std::string x = ReadAll(full), y = ReadAll(part);
  ASSERT_FALSE(x.empty());
  EXPECT_TRUE(x == y) << "resumed OUT differs from the uninterrupted run's";
  for (const std::string& p : {q, full, part, full + ".state", part + ".state"}) {
    std::filesystem::remove(p);
  }
}

// A quantized student with a channel-permuted slot, quantized or not (PruneLlama refuses
// permuted inputs), falls back to round to nearest under GPTQ, saying so in OUT's metadata; --train norms leaves every quantized
// matrix bit for bit (unchanged weights keep their codes) and re-quantizes none.
TEST_F(FinetuneTest, AQuantizedStudentFallsBackToRoundToNearestWhenPermutedAndKeepsCodesForNorms) {
  const std::string q = TempPath("quant_student4.sparq"), out = TempPath("quant_out4.sparq");
  WriteTinySparq(q, 1, testing::QuantStore, 11, 2, "int8:g32");
  FinetuneOptions o = Options(out);
  o.student = q;
  o.tokens = 3 * 16;
  o.warmup = 1;
  auto r = Run(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->requant_gptq, 0);
  EXPECT_EQ(r->requant_rtn, 12);
  auto b = ReadCheckpoint(out);
  ASSERT_TRUE(b.ok());
  EXPECT_NE(b->metadata.at("sparq.finetune").find("channel-permuted"), std::string::npos)
      << b->metadata.at("sparq.finetune");

  // A permuted slot of numbers (PruneLlama refuses any permuted layer) does the same.
  const std::string q2 = TempPath("quant_student5.sparq");
  WriteTinySparq(q2, 1, [](int64_t l, int s) {
    return l == 1 && s == 0 ? testing::TinyStore::kNm24PermF32 : testing::QuantStoreNoPerm(l, s);
  });
  FinetuneOptions o2 = o;
  o2.student = q2;
  o2.out = TempPath("quant_out5.sparq");
  r = Run(o2);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->requant_gptq, 0);
  EXPECT_GT(r->requant_rtn, 0);
  for (const std::string& p : {q2, o2.out, o2.out + ".state"}) std::filesystem::remove(p);

  o.norms_only = true;
  r = Run(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->requant_gptq + r->requant_rtn, 0);
  auto a = ReadCheckpoint(q);
  b = ReadCheckpoint(out);
  ASSERT_TRUE(a.ok() && b.ok());
  for (size_t i = 0; i < a->matrices.size(); ++i) {
    const SparseMatrix& x = a->matrices[i].matrix;
    const SparseMatrix& y = b->matrices[i].matrix;
    if (!IsQuantized(x)) continue;
    SCOPED_TRACE(a->matrices[i].name);
    const Tensor& vx = std::visit([](const auto& m) -> const Tensor& { return m.values; }, x);
    const Tensor& vy = std::visit([](const auto& m) -> const Tensor& { return m.values; }, y);
    ASSERT_EQ(vx.nbytes(), vy.nbytes());
    EXPECT_EQ(std::memcmp(vx.data(), vy.data(), vx.nbytes()), 0);
    const Tensor& sx = QuantOf(x)->scales;
    const Tensor& sy = QuantOf(y)->scales;
    EXPECT_EQ(std::memcmp(sx.data(), sy.data(), sx.nbytes()), 0);
  }
  for (const std::string& p : {q, out, out + ".state"}) std::filesystem::remove(p);
}

// A quantized sparse slot's mask is fixed too: a trained weight outside its structure is refused.
TEST_F(FinetuneTest, WritingANonzeroPrunedWeightOfAQuantizedSlotNamesTheTensor) {
  const std::string q = TempPath("quant_student3.sparq");
  WriteTinySparq(q, 1, testing::QuantStore);
  LlamaConfig c = testing::TinyConfig();
  auto ck = ReadCheckpoint(q);
  ASSERT_TRUE(ck.ok());
  auto model = LlamaModel::Load(q, cfg_);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto tm = FromLlamaModel(*model, &pool_);
  ASSERT_TRUE(tm.ok());
  ASSERT_TRUE(StudentQuantizedMasters(*ck, c, &*tm).ok());
  // blk.0.attn_q (slot 0) is 2:4 int4:g32:sym: a position outside its kept list.
  const std::vector<int64_t>& kept = tm->masks[0].kept[0];
  ASSERT_FALSE(kept.empty());
  int64_t pruned = 0;
  while (std::find(kept.begin(), kept.end(), pruned) != kept.end()) ++pruned;
  tm->weights.blocks[0].linear[0][pruned] = 0.5f;
  const Status st = WriteFinetunedCheckpoint(q, c, tm->weights, TempPath("never.sparq"));
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("blk.0.attn_q.weight"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("pruned"), std::string::npos) << st.ToString();
  std::filesystem::remove(q);
}

// The writer refuses a trained weight where the student has none: the mask is fixed.
TEST_F(FinetuneTest, WritingANonzeroPrunedWeightNamesTheTensor) {
  LlamaConfig c = testing::TinyConfig();
  auto model = LlamaModel::Load(*student_, cfg_);
  ASSERT_TRUE(model.ok());
  auto tm = FromLlamaModel(*model, &pool_);
  ASSERT_TRUE(tm.ok());
  // blk.0.attn_q (slot 0) is 2:4: its weight (0, j) for some pruned j.
  std::vector<float>& q = tm->weights.blocks[0].linear[0];
  int64_t pruned = 0;
  while (q[pruned] != 0.0f) ++pruned;
  q[pruned] = 0.5f;
  const Status st = WriteFinetunedCheckpoint(*student_, c, tm->weights, TempPath("never.sparq"));
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("blk.0.attn_q.weight"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("pruned"), std::string::npos) << st.ToString();
}

}  // namespace
}  // namespace sparq::train
