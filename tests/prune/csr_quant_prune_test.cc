// Quantized values for the patterns stored as CSR (unstructured, rows, cols): GroupQuantizer's
// groups are column ranges (format.h CsrMatrix), GPTQ fits them inside SparseGPT's sweep (and
// once after masking for magnitude / Wanda), the mask the pruning applied survives bit for bit
// into the stored CSR (kept weights that round to 0 included), and the stored codes give back
// exactly the swept weights.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "prune/prune_testutil.h"
#include "sparq/format.h"
#include "sparq/prune.h"

namespace sparq {
namespace {

using testing::MakeProblem;
using testing::Problem;

// The stored CSR's positions as a dense 0/1 mask.
std::vector<uint8_t> MaskOf(const CsrMatrix& c) {
  std::vector<uint8_t> keep(size_t(c.rows * c.cols), 0);
  const int64_t* rp = c.row_ptr.data_as<int64_t>();
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t p = rp[r]; p < rp[r + 1]; ++p) {
      const int64_t col = c.col_idx.dtype() == DType::kU16 ? c.col_idx.data_as<uint16_t>()[p]
                                                           : c.col_idx.data_as<uint32_t>()[p];
      keep[r * c.cols + col] = 1;
    }
  }
  return keep;
}

TEST(CsrQuantPrune, GptqMaskSurvivesAndCodesReproduceTheSweep) {
  // k = 576 (SmolLM2's): g64 and g128 leave a short last group (576 = 4.5 x 128).
  Problem pr = MakeProblem(32, 576, 1024, 17);
  struct Case {
    Pattern p;
    PruneMethod method;
    const char* spec;
  };
  const Case cases[] = {
      {Pattern::Unstructured(0.5), PruneMethod::kSparseGpt, "int4:g64"},
      {Pattern::Unstructured(0.5), PruneMethod::kSparseGpt, "int4:g32:sym"},
      {Pattern::Unstructured(0.5), PruneMethod::kSparseGpt, "int8:g128"},
      {Pattern::Unstructured(0.7, true), PruneMethod::kSparseGpt, "int4:g128"},
      {Pattern::Unstructured(0.5), PruneMethod::kWanda, "int4:g64"},
      {Pattern::Rows(0.25), PruneMethod::kSparseGpt, "int8:g64"},
      {Pattern::Cols(0.25), PruneMethod::kMagnitude, "int4:g64:sym"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.p.ToString() + " " + c.spec + " method " + std::to_string(int(c.method)));
    const ValueSpec spec = *ValueSpec::Parse(c.spec);
    auto q = GroupQuantizer::Make(spec, c.p, pr.m, pr.k);
    ASSERT_TRUE(q.ok()) << q.status().ToString();
    EXPECT_EQ(q->group_size(), spec.group);
    std::vector<float> w = pr.w;
    PruneOptions opt;
    opt.method = c.method;
    opt.quantizer = &*q;
    ASSERT_TRUE(Prune(std::span<float>(w), pr.m, pr.k, pr.h, c.p, opt).ok());
    ASSERT_TRUE(q->status().ok()) << q->status().ToString();
    const std::vector<uint8_t>& kept = q->kept();
    ASSERT_EQ(kept.size(), w.size());
    int64_t n_kept = 0, kept_zeros = 0, pruned_nonzero = 0;
    for (size_t i = 0; i < w.size(); ++i) {
      n_kept += kept[i];
      kept_zeros += kept[i] && w[i] == 0.0f;
      pruned_nonzero += !kept[i] && w[i] != 0.0f;
    }
    EXPECT_EQ(pruned_nonzero, 0) << "a weight outside the mask survived";
    if (c.p.kind == PatternKind::kUnstructured) {
      const double want = (1.0 - c.p.fraction) * double(w.size());
      EXPECT_NEAR(double(n_kept), want, c.p.per_row ? double(pr.m) : 1.0);
    }
    // Store: the mask the sweep applied, then the codes of GPTQ's groups.
    auto csr = CsrMatrix::FromDenseMasked(w, kept, pr.m, pr.k);
    ASSERT_TRUE(csr.ok());
    auto stored = CsrMatrix::Quantize(*csr, spec, q->groups(), "w");
    ASSERT_TRUE(stored.ok()) << stored.status().ToString();
    EXPECT_EQ(MaskOf(*stored), kept) << "the stored positions are not the pruning mask";
    const Tensor back = stored->ToDense();
    EXPECT_EQ(std::memcmp(back.data_as<float>(), w.data(), w.size() * 4), 0)
        << "the stored codes do not reproduce the swept weights";
    std::printf("%s %s: %lld kept, %lld of them rounded to 0 (kept in the CSR)\n",
                c.p.ToString().c_str(), c.spec, (long long)n_kept, (long long)kept_zeros);
  }
}

// Round to nearest after pruning (the kRtn path): quantizing never moves a position, and GPTQ's
// error (fed to the columns not yet fixed) is below rounding after SparseGPT's f32 sweep.
TEST(CsrQuantPrune, RoundToNearestKeepsThePositionsAndGptqBeatsIt) {
  Problem pr = MakeProblem(32, 576, 1024, 19);
  const Pattern p = Pattern::Unstructured(0.5);
  std::vector<float> pruned = pr.w;
  PruneOptions opt;
  opt.method = PruneMethod::kSparseGpt;
  ASSERT_TRUE(Prune(std::span<float>(pruned), pr.m, pr.k, pr.h, p, opt).ok());
  const CsrMatrix f32 = *CsrMatrix::FromDense(pruned, pr.m, pr.k);
  for (const char* text : {"int4:g64", "int4:g128"}) {
    SCOPED_TRACE(text);
    const ValueSpec spec = *ValueSpec::Parse(text);
    auto rtn = CsrMatrix::Quantize(f32, spec);
    ASSERT_TRUE(rtn.ok());
    EXPECT_EQ(MaskOf(*rtn), MaskOf(f32));
    auto q = GroupQuantizer::Make(spec, p, pr.m, pr.k);
    ASSERT_TRUE(q.ok());
    std::vector<float> joint = pr.w;
    PruneOptions jo = opt;
    jo.quantizer = &*q;
    ASSERT_TRUE(Prune(std::span<float>(joint), pr.m, pr.k, pr.h, p, jo).ok());
    const Tensor after = rtn->ToDense();
    const double e_f32 = testing::DirectError(pr, pruned);
    const double e_joint = testing::DirectError(pr, joint);
    const double e_after = testing::DirectError(
        pr, std::vector<float>(after.data_as<float>(), after.data_as<float>() + pruned.size()));
    std::printf("unstructured:0.5 %s: f32 %.5f, joint %.5f, round to nearest after %.5f\n", text,
                e_f32, e_joint, e_after);
    EXPECT_LT(e_joint, e_after);
  }
}

// PruneOptions::fixed_mask (re-quantizing a pruned weight): every method keeps exactly the given
// mask, SparseGPT's sweep fits and quantizes the kept weights with it (GPTQ with a fixed mask), and
// a mask of the wrong size or one that breaks the pattern is an error naming the weight.
TEST(CsrQuantPrune, FixedMaskIsKeptByEveryMethod) {
  Problem pr = MakeProblem(32, 576, 1024, 23);
  // A 2:4 mask unlike the one any method would choose: keep columns 0 and 3 of every group of 4.
  std::vector<uint8_t> mask(size_t(pr.m * pr.k), 0);
  for (int64_t i = 0; i < pr.m * pr.k; ++i) mask[i] = (i % 4 == 0 || i % 4 == 3);
  std::vector<double> errors;
  for (PruneMethod method : {PruneMethod::kSparseGpt, PruneMethod::kWanda, PruneMethod::kMagnitude}) {
    SCOPED_TRACE(std::string(PruneMethodName(method)));
    auto q = GroupQuantizer::Make(*ValueSpec::Parse("int4:g64"), Pattern::NM(2, 4), pr.m, pr.k);
    ASSERT_TRUE(q.ok()) << q.status().ToString();
    std::vector<float> w = pr.w;
    PruneOptions opt;
    opt.method = method;
    opt.quantizer = &*q;
    opt.fixed_mask = mask;
    auto rep = Prune(w, pr.m, pr.k, pr.h, Pattern::NM(2, 4), opt);
    ASSERT_TRUE(rep.ok()) << rep.status().ToString();
    int64_t moved = 0, kept_changed = 0;
    for (size_t i = 0; i < w.size(); ++i) {
      moved += !mask[i] && w[i] != 0.0f;
      kept_changed += mask[i] && w[i] != pr.w[i];
    }
    EXPECT_EQ(moved, 0);
    EXPECT_GT(kept_changed, 0);  // quantized (and, for SparseGPT, compensated)
    errors.push_back(testing::DirectError(pr, w));
    std::printf("%s with a fixed 2:4 mask, int4:g64: relative error %.4f\n",
                std::string(PruneMethodName(method)).c_str(), errors.back());
  }
  // Only SparseGPT feeds the removed weights' and the rounding errors back to the kept ones.
  EXPECT_LT(errors[0], 0.5 * errors[2]);
  PruneOptions opt;
  std::vector<float> w = pr.w;
  opt.fixed_mask = std::span<const uint8_t>(mask.data(), mask.size() - 1);
  auto bad = Prune(w, pr.m, pr.k, pr.h, Pattern::NM(2, 4), opt);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("fixed mask has"), std::string::npos);
  std::vector<uint8_t> three = mask;
  three[1] = 1;  // 3 of the first 4 kept
  opt.fixed_mask = three;
  bad = Prune(w, pr.m, pr.k, pr.h, Pattern::NM(2, 4), opt);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("does not satisfy pattern 2:4"), std::string::npos)
      << bad.status().ToString();
}

}  // namespace
}  // namespace sparq
