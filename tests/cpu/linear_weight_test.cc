// LinearWeight, the model's view of a packed weight: Forward against the reference, the CSR layout
// by density, ForwardShared / ForwardSwiGlu bits, malformed inputs, u32 indices.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <set>

#include "src/cpu/kernel_entry.h"
#include "src/cpu/spmm.h"
#include "tests/cpu/spmm_cases_testutil.h"
#include "tests/cpu/spmm_testutil.h"

namespace sparq {
namespace {

using testing_cpu::Built;
using testing_cpu::Case;
using testing_cpu::Cfg;
using testing_cpu::ExpectClose;
using testing_cpu::ForEachTarget;
using testing_cpu::kGuard;
using testing_cpu::RandomVector;
using testing_cpu::RunAndCheck;

TEST(LinearWeightTest, ForwardMatchesReferenceAndNamesKernel) {
  const int64_t m = 40, k = 64;
  std::vector<float> w = testing_cpu::PatternWeights(Pattern::NM(2, 4), m, k, 5);
  auto s = NmMatrix::FromDense(w, m, k, 2, 4, DType::kF32);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  auto lw = LinearWeight::FromMatrix(std::move(s).value(), "blk.0.ffn_up", Cfg());
  ASSERT_TRUE(lw.ok()) << lw.status().ToString();
  EXPECT_EQ(lw->rows(), m);
  EXPECT_EQ(lw->cols(), k);
  EXPECT_EQ(lw->weight_bytes(), uint64_t(m) * 32 * 4 + uint64_t(m) * 2 * 4);  // values + meta
  // AVX2 decodes 2:4 with its in-lane window permute and runs 64-token tiles of one row (rows of
  // their own); the other targets the generic rows.
  EXPECT_EQ(lw->kernel_name(1), lw->config().target == HWY_AVX2
                                    ? "f32_nm24_decode_4xT__avx2(nm 2:4 f32)"
                                    : "f32_nm_m4_window_decode_4xT(nm 2:4 f32)");
  EXPECT_EQ(lw->kernel_name(512), lw->config().target == HWY_AVX2
                                      ? "f32_nm_m4_tiled_1x8__avx2(nm 2:4 f32)"
                                      : "f32_nm_m4_tiled_4xNV(nm 2:4 f32)");
  for (int64_t n : {1, 7}) {
    const std::vector<float> x = RandomVector(n * k, 6);
    std::vector<float> y(n * m);
    ThreadPool pool(2);
    lw->Forward(x.data(), n, y.data(), &pool);
    std::vector<double> want, abs_sum;
    testing_cpu::ReferenceForward(w, m, k, x.data(), n, k, Epilogue{}, want, abs_sum);
    ExpectClose(want, abs_sum, y.data(), n, m, m, k, "LinearWeight");
  }
}

TEST(LinearWeightTest, CsrLayoutFollowsDensity) {
  // 50% kept: one bit per weight (2 bytes per 16 columns) beats a u16 index per kept weight, so
  // the rows are packed as a bit mask; 5% kept: column indices.
  const int64_t m = 24, k = 100;  // 7 chunks of 16 columns per row, the last one partial
  for (double sparsity : {0.5, 0.95}) {
    std::vector<float> w = testing_cpu::PatternWeights(Pattern::Unstructured(sparsity), m, k, 8);
    auto s = CsrMatrix::FromDense(w, m, k, DType::kF32);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    const uint64_t nnz = s->values.numel();
    auto lw = LinearWeight::FromMatrix(std::move(s).value(), "w", Cfg());
    ASSERT_TRUE(lw.ok()) << lw.status().ToString();
    if (sparsity == 0.5) {
      EXPECT_EQ(lw->kernel_name(1), "f32_mask_decode_4xT(csr f32 as bitmask)");
      EXPECT_EQ(lw->kernel_name(12), "f32_mask_decode_4xT(csr f32 as bitmask)");
      EXPECT_EQ(lw->kernel_name(13), "f32_mask_tiled_2xNV(csr f32 as bitmask)");
      EXPECT_EQ(lw->weight_bytes(), nnz * 4 + uint64_t(m) * 7 * 2 + 8 * uint64_t(m + 1));
    } else {
      EXPECT_EQ(lw->kernel_name(1), "f32_csr_decode_1x1(csr f32 u16)");
      EXPECT_EQ(lw->weight_bytes(), nnz * 4 + nnz * 2 + 8 * uint64_t(m + 1));
    }
    for (int64_t n : {1, 5, 40}) {
      const std::vector<float> x = RandomVector(n * k, 9);
      std::vector<float> y(n * m);
      lw->Forward(x.data(), n, y.data(), nullptr);
      std::vector<double> want, abs_sum;
      testing_cpu::ReferenceForward(w, m, k, x.data(), n, k, Epilogue{}, want, abs_sum);
      ExpectClose(want, abs_sum, y.data(), n, m, m, k, "CSR " + std::to_string(sparsity));
    }
  }
}

// Three LinearWeights of cases c[i], rows[i] x cols[i], seeded seed + i, and their values
// densified.
void BuildLinears(const Case (&c)[3], const int64_t* rows, const int64_t* cols, uint64_t seed,
                  const char* what, std::vector<LinearWeight>* lw,
                  std::vector<std::vector<float>>* dense) {
  for (int i = 0; i < 3; ++i) {
    auto p = Pattern::Parse(c[i].pattern);
    ASSERT_TRUE(p.ok());
    std::vector<float> w = testing_cpu::PatternWeights(*p, rows[i], cols[i], seed + i);
    auto sm = Encode(w, rows[i], cols[i], c[i].format, *p, c[i].dtype);
    ASSERT_TRUE(sm.ok()) << what << ": " << sm.status().ToString();
    dense->push_back(testing_cpu::Densify(*sm));
    auto l = LinearWeight::FromMatrix(std::move(sm).value(), "w", Cfg());
    ASSERT_TRUE(l.ok()) << what << ": " << l.status().ToString();
    lw->push_back(std::move(l).value());
  }
}


TEST(LinearWeightTest, ForwardSharedGivesEachOutputItsOwnForwardBits) {
  const int64_t k = 80;
  const int64_t rows[3] = {96, 24, 24};  // a wide q and two narrow k/v, as in grouped attention
  struct Group {
    const char* what;
    Case c[3];
  };
  const Group groups[] = {
      {"bitmask bf16",
       {{FormatKind::kCsr, "unstructured:0.5", DType::kBF16},
        {FormatKind::kCsr, "unstructured:0.5", DType::kBF16},
        {FormatKind::kCsr, "unstructured:0.5", DType::kBF16}}},
      {"2:4 f32",
       {{FormatKind::kNM, "2:4", DType::kF32},
        {FormatKind::kNM, "2:4", DType::kF32},
        {FormatKind::kNM, "2:4", DType::kF32}}},
      {"dense bf16",
       {{FormatKind::kDense, "dense", DType::kBF16},
        {FormatKind::kDense, "dense", DType::kBF16},
        {FormatKind::kDense, "dense", DType::kBF16}}},
      {"csr columns",
       {{FormatKind::kCsr, "unstructured:0.9", DType::kF32},
        {FormatKind::kCsr, "unstructured:0.9", DType::kF32},
        {FormatKind::kCsr, "unstructured:0.9", DType::kF32}}},
      {"dense f32",
       {{FormatKind::kDense, "dense", DType::kF32},
        {FormatKind::kDense, "dense", DType::kF32},
        {FormatKind::kDense, "dense", DType::kF32}}},
      {"mixed",
       {{FormatKind::kCsr, "unstructured:0.5", DType::kBF16},
        {FormatKind::kNM, "2:4", DType::kBF16},
        {FormatKind::kNM, "4:8", DType::kF32}}},
  };
  ThreadPool p1(1), p2(2), p3(3);
  for (const Group& g : groups) {
    std::vector<LinearWeight> lw;
    std::vector<std::vector<float>> dense;
    const int64_t cols[3] = {k, k, k};
    ASSERT_NO_FATAL_FAILURE(BuildLinears(g.c, rows, cols, 20, g.what, &lw, &dense));
    for (int64_t n : {1, 3, 12, 40, 300}) {
      const std::vector<float> x = RandomVector(n * k, 30 + n);
      const std::vector<float> res = RandomVector(n * rows[1], 40 + n);
      Epilogue ep[3];
      ep[0].act = Activation::kSilu;
      ep[1].residual = res.data();
      std::vector<double> want, abs_sum;
      testing_cpu::ReferenceForward(dense[1], rows[1], k, x.data(), n, k, ep[1], want, abs_sum);
      for (ThreadPool* pool : {&p1, &p2, &p3}) {
        // Each output's own Forward on the same pool (sparq's kernels give the same bits for any
        // thread count, but the dense f32 path is OpenBLAS, whose sgemm need not).
        std::vector<float> own[3];
        for (int i = 0; i < 3; ++i) {
          own[i].assign(n * rows[i], 0.0f);
          lw[i].Forward(x.data(), n, 0, own[i].data(), 0, ep[i], pool);
        }
        ExpectClose(want, abs_sum, own[1].data(), n, rows[1], rows[1], k, g.what);
        std::vector<float> got[3];
        std::vector<LinearWeight::Output> outs;
        for (int i = 0; i < 3; ++i) {
          got[i].assign(n * rows[i], kGuard);
          outs.push_back({&lw[i], got[i].data(), ep[i]});
        }
        LinearWeight::ForwardShared(x.data(), n, outs, pool);
        for (int i = 0; i < 3; ++i) {
          EXPECT_EQ(0, std::memcmp(own[i].data(), got[i].data(), own[i].size() * 4))
              << g.what << " output " << i << " n=" << n << " threads=" << pool->num_threads();
        }
      }
    }
  }
}

// ForwardSwiGlu (a Llama MLP in one call: gate and up into down's X^T tiles, never transposed
// back to rows) must give the bits of the three products run separately, with and without a
// column permutation on down's input and a separate input for up, on every compiled target and
// for 1-3 threads; it must
// decline, writing nothing, where its kernels do not run (dense, CSR rows, few tokens).
// The separate products are also checked against a double reference of the whole MLP, so that
// both sides cannot be wrong together.
TEST(LinearWeightTest, ForwardSwiGluGivesTheSeparateProductsBits) {
  const int64_t d = 80, ff = 104;  // down has d rows and ff columns; gate/up ff rows, d columns
  struct Group {
    const char* what;
    Case c[3];  // gate, up, down
    bool fuses;
  };
  const Group groups[] = {
      {"2:4 f32",
       {{FormatKind::kNM, "2:4", DType::kF32},
        {FormatKind::kNM, "2:4", DType::kF32},
        {FormatKind::kNM, "2:4", DType::kF32}},
       true},
      {"2:4 bf16",
       {{FormatKind::kNM, "2:4", DType::kBF16},
        {FormatKind::kNM, "2:4", DType::kBF16},
        {FormatKind::kNM, "2:4", DType::kBF16}},
       true},
      {"bitmask bf16",
       {{FormatKind::kCsr, "unstructured:0.5", DType::kBF16},
        {FormatKind::kCsr, "unstructured:0.5", DType::kBF16},
        {FormatKind::kCsr, "unstructured:0.5", DType::kBF16}},
       true},
      {"mixed",
       {{FormatKind::kNM, "2:4", DType::kBF16},
        {FormatKind::kCsr, "unstructured:0.5", DType::kF32},
        {FormatKind::kNM, "4:8", DType::kF32}},
       true},
      {"dense f32 down",
       {{FormatKind::kNM, "2:4", DType::kF32},
        {FormatKind::kNM, "2:4", DType::kF32},
        {FormatKind::kDense, "dense", DType::kF32}},
       false},
      {"csr columns",
       {{FormatKind::kCsr, "unstructured:0.9", DType::kF32},
        {FormatKind::kCsr, "unstructured:0.9", DType::kF32},
        {FormatKind::kCsr, "unstructured:0.9", DType::kF32}},
       false},
  };
  const int64_t rows[3] = {ff, ff, d}, cols[3] = {d, d, ff};
  // A permutation of down's input columns (as channel permutation stores it): down reads
  // intermediate column perm[j] as its column j.
  std::vector<int32_t> perm(ff), down_row(ff);
  for (int64_t j = 0; j < ff; ++j) perm[j] = static_cast<int32_t>((j * 37 + 11) % ff);
  for (int64_t j = 0; j < ff; ++j) down_row[perm[j]] = static_cast<int32_t>(j);
  ThreadPool p1(1), p2(2), p3(3);
  for (const Group& g : groups) {
    std::vector<LinearWeight> lw;
    std::vector<std::vector<float>> dense;
    ASSERT_NO_FATAL_FAILURE(BuildLinears(g.c, rows, cols, 50, g.what, &lw, &dense));
    const int targets = ForEachTarget([&](const std::string& target) {
      for (int64_t n : {1, 12, 17, 40, 129, 300}) {
        const std::vector<float> x = RandomVector(n * d, 60 + n);
        const std::vector<float> res = RandomVector(n * d, 70 + n);
        // up's own input (gate and up stored with different column permutations read X gathered
        // two ways) in variant 2; down's permutation in variants 1 and 2.
        const std::vector<float> other = RandomVector(n * d, 80 + n);
        for (int variant = 0; variant < 3; ++variant) {
          const bool permuted = variant >= 1, own_up = variant == 2;
          const std::vector<float>& xu = own_up ? other : x;
          const std::string what = std::string(g.what) + " on " + target +
                                   " n=" + std::to_string(n) + (permuted ? " permuted" : "") +
                                   (own_up ? " own up input" : "");
          // Double reference: res + (silu(x Wg^T) * (x Wu^T)) gathered by perm, times Wd^T.
          std::vector<double> act(n * ff), want(n * d), abs_sum(n * d);
          for (int64_t t = 0; t < n; ++t) {
            for (int64_t r = 0; r < ff; ++r) {
              double sg = 0, su = 0;
              for (int64_t c = 0; c < d; ++c) {
                sg += double(dense[0][r * d + c]) * x[t * d + c];
                su += double(dense[1][r * d + c]) * xu[t * d + c];
              }
              act[t * ff + r] = sg / (1.0 + std::exp(-sg)) * su;
            }
            for (int64_t r = 0; r < d; ++r) {
              double sum = res[t * d + r], abs = std::fabs(res[t * d + r]);
              for (int64_t j = 0; j < ff; ++j) {
                const double a = act[t * ff + (permuted ? perm[j] : j)];
                sum += double(dense[2][r * ff + j]) * a;
                abs += std::fabs(double(dense[2][r * ff + j]) * a);
              }
              want[t * d + r] = sum;
              abs_sum[t * d + r] = abs;
            }
          }
          for (ThreadPool* pool : {&p1, &p2, &p3}) {
            // The separate products, as the model runs them without fusion.
            Epilogue silu, residual;
            silu.act = Activation::kSilu;
            residual.residual = res.data();
            std::vector<float> gate(n * ff), up(n * ff), act_in(n * ff), sep(n * d);
            lw[0].Forward(x.data(), n, 0, gate.data(), 0, silu, pool);
            lw[1].Forward(xu.data(), n, 0, up.data(), 0, Epilogue{}, pool);
            for (int64_t t = 0; t < n; ++t) {
              for (int64_t j = 0; j < ff; ++j) {
                const int64_t src = t * ff + (permuted ? perm[j] : j);
                act_in[t * ff + j] = gate[src] * up[src];
              }
            }
            lw[2].Forward(act_in.data(), n, 0, sep.data(), 0, residual, pool);
            // SiLU through the vector Exp (4 ulp) on values up to ~|k|: a few more ulps of slack
            // than the kernels' own 2 (k + 4) eps bound.
            ExpectClose(want, abs_sum, sep.data(), n, d, d, 4 * ff, what + " separate");
            std::vector<float> got(n * d + 16, kGuard);
            const bool fused = LinearWeight::ForwardSwiGlu(
                lw[0], lw[1], lw[2], x.data(), own_up ? xu.data() : nullptr, n,
                permuted ? down_row.data() : nullptr, res.data(), got.data(), pool);
            // Fused where all three run their tiled kernels (n above their DecodeMaxN).
            bool tiled = true;
            for (const LinearWeight& l : lw)
              tiled = tiled && l.kernel_name(n).find("_tiled") != std::string::npos;
            const bool expect = g.fuses && tiled;
            ASSERT_EQ(fused, expect) << what;
            EXPECT_EQ(LinearWeight::SwiGluFuses(lw[0], lw[1], lw[2], n), expect) << what;
            for (size_t i = fused ? n * d : 0; i < got.size(); ++i) {
              ASSERT_EQ(got[i], kGuard) << what << ": wrote y[" << i << "]";
            }
            if (!fused) continue;
            EXPECT_EQ(0, std::memcmp(sep.data(), got.data(), sep.size() * 4))
                << what << " threads=" << pool->num_threads();
          }
        }
      }
    });
    EXPECT_GE(targets, 2) << g.what;
  }
}

TEST(LinearWeightTest, MalformedInputsAreErrorsNamingThePart) {
  CsrMatrix csr;
  csr.rows = 2;
  csr.cols = 4;
  csr.row_ptr = Tensor::Alloc(DType::kI64, {3});
  csr.row_ptr.mutable_data_as<int64_t>()[1] = 1;
  csr.row_ptr.mutable_data_as<int64_t>()[2] = 2;
  csr.col_idx = Tensor::Alloc(DType::kU16, {2});
  csr.col_idx.mutable_data_as<uint16_t>()[1] = 9;  // >= cols
  csr.values = Tensor::Alloc(DType::kF32, {2});
  auto r = LinearWeight::FromMatrix(csr, "layer.w", Cfg());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("layer.w.col_idx[1]"), std::string::npos)
      << r.status().message();

  csr.col_idx.mutable_data_as<uint16_t>()[1] = 1;
  csr.row_ptr.mutable_data_as<int64_t>()[1] = 5;  // beyond nnz
  r = LinearWeight::FromMatrix(csr, "layer.w", Cfg());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("row_ptr"), std::string::npos) << r.status().message();

  NmMatrix nm;
  nm.rows = 1;
  nm.cols = 4;
  nm.n = 2;
  nm.m = 4;
  nm.values = Tensor::Alloc(DType::kF32, {1, 2});
  nm.meta = Tensor::Alloc(DType::kU8, {1, 1});
  nm.meta.mutable_data_as<uint8_t>()[0] = 0x05;  // indices 1, 1: not ascending
  auto q = LinearWeight::FromMatrix(nm, "nm.w", Cfg());
  ASSERT_FALSE(q.ok());
  EXPECT_NE(q.status().message().find("nm.w.meta"), std::string::npos) << q.status().message();

  nm.meta = Tensor::Alloc(DType::kU8, {1, 3});  // wrong size
  q = LinearWeight::FromMatrix(nm, "nm.w", Cfg());
  ASSERT_FALSE(q.ok());

  BsrMatrix bsr;
  bsr.rows = 4;
  bsr.cols = 4;
  bsr.bh = 2;
  bsr.bw = 2;
  bsr.row_ptr = Tensor::Alloc(DType::kI64, {3});
  bsr.row_ptr.mutable_data_as<int64_t>()[1] = 1;
  bsr.row_ptr.mutable_data_as<int64_t>()[2] = 1;
  bsr.col_idx = Tensor::Alloc(DType::kU32, {1});
  bsr.col_idx.mutable_data_as<uint32_t>()[0] = 2;  // >= 2 block columns
  bsr.values = Tensor::Alloc(DType::kF32, {1, 2, 2});
  auto b = LinearWeight::FromMatrix(bsr, "bsr.w", Cfg());
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("bsr.w.col_idx[0]"), std::string::npos)
      << b.status().message();
}

TEST(LinearWeightTest, CsrWithU32IndicesBeyond65536Columns) {
  const int64_t m = 3, k = 70000;
  std::vector<float> w = testing_cpu::PatternWeights(Pattern::Unstructured(0.999), m, k, 8);
  auto s = CsrMatrix::FromDense(w, m, k, DType::kF32);
  ASSERT_TRUE(s.ok());
  ASSERT_EQ(s->col_idx.dtype(), DType::kU32);
  auto lw = LinearWeight::FromMatrix(std::move(s).value(), "weight", Cfg());
  ASSERT_TRUE(lw.ok());
  for (int64_t n : {1, 4}) {
    const std::vector<float> x = RandomVector(n * k, 9);
    std::vector<float> y(n * m);
    lw->Forward(x.data(), n, y.data(), nullptr);
    std::vector<double> want, abs_sum;
    testing_cpu::ReferenceForward(w, m, k, x.data(), n, k, Epilogue{}, want, abs_sum);
    ExpectClose(want, abs_sum, y.data(), n, m, m, k, "csr u32");
  }
  // Both registry kernels on every target, through the token tiles of each width (narrow 4 and 8,
  // one and two vectors).
  auto cs = CsrMatrix::FromDense(w, m, k, DType::kF32);
  ASSERT_TRUE(cs.ok());
  Built b;
  b.dense = w;
  auto pw = cpu::Pack(SparseMatrix(std::move(cs).value()), "w");
  ASSERT_TRUE(pw.ok()) << pw.status().ToString();
  b.packed = std::move(pw).value();
  ASSERT_EQ(b.packed.kind(), cpu::PackedKind::kRowGroups);
  ASSERT_FALSE(b.packed.row_groups().idx16);
  const int targets = ForEachTarget([&](const std::string& target) {
    int rows_run = 0;
    for (const auto& kern : cpu::KernelTable()) {
      if (!cpu::Declines(kern, b.packed, 0, Cfg(), true).empty()) continue;
      ++rows_run;
      for (int64_t n : {1, 3, 5, 12, 17}) {
        RunAndCheck(kern, b, m, k, n, Epilogue{}, nullptr,
                    target + " " + kern.name + " csr u32 n=" + std::to_string(n));
      }
    }
    EXPECT_GE(rows_run, 2) << target << ": the decode and the tiled row should both run";
  });
  EXPECT_GE(targets, 2);
}

TEST(LinearWeightTest, GroupsWithU32IndicesBeyond65536Columns) {
  // Shared-column groups of 2 and 4 rows (BSR 2x2, 4x4) with u32 column indices, through both
  // registry kernels at n = 1, 2, 5 (the decode on AVX-512: 16 / g columns per vector from one
  // gather).
  const int64_t m = 8, k = 70000;
  for (const char* pat : {"block:4x4:0.99", "block:2x2:0.99"}) {
    auto p = Pattern::Parse(pat);
    ASSERT_TRUE(p.ok());
    std::vector<float> w = testing_cpu::PatternWeights(*p, m, k, 12);
    auto s = Encode(w, m, k, FormatKind::kBsr, *p, DType::kF32);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    Built b;
    b.dense = testing_cpu::Densify(*s);
    auto pw = cpu::Pack(*s, "w");
    ASSERT_TRUE(pw.ok()) << pw.status().ToString();
    b.packed = std::move(pw).value();
    ASSERT_FALSE(b.packed.row_groups().idx16) << pat;
    ASSERT_GE(b.packed.row_groups().g, 2) << pat;
    const int targets = ForEachTarget([&](const std::string& target) {
      int rows_run = 0;
      for (const auto& kern : cpu::KernelTable()) {
        if (!cpu::Declines(kern, b.packed, 0, Cfg(), true).empty()) continue;
        ++rows_run;
        for (int64_t n : {1, 2, 5}) {
          RunAndCheck(kern, b, m, k, n, Epilogue{}, nullptr,
                      target + " " + pat + " " + kern.name + " n=" + std::to_string(n));
        }
      }
      EXPECT_GE(rows_run, 2) << target << " " << pat
                             << ": the decode and the tiled row should both run";
    });
    EXPECT_GE(targets, 2) << pat;
  }
}

}  // namespace
}  // namespace sparq
