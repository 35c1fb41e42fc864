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

}  // namespace
}  // namespace sparq
