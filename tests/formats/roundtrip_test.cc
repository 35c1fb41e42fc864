// dense -> format -> dense, bit-exact, for every format, value dtype and a sweep of shapes and
// contents. The reference is the input rounded f32 -> dtype -> f32 element by element.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "formats/formats_testutil.h"
#include "sparq/format.h"
#include "sparq/pattern.h"

namespace sparq {
namespace {

using testing_formats::BitEqual;
using testing_formats::RandomMatrix;
using testing_formats::RoundThrough;

struct Shape {
  int64_t m, k;
};
// 1x1, k below / equal / not a multiple of m and of the block sides, empty dimensions.
const Shape kShapes[] = {{1, 1}, {1, 2}, {1, 7},  {7, 1},   {3, 4},  {5, 9},   {16, 16},
                         {17, 33}, {9, 30}, {2, 65}, {33, 17}, {0, 5}, {5, 0}, {0, 0}};
const DType kDTypes[] = {DType::kF32, DType::kBF16, DType::kF16};

enum class Content { kRandomHalf, kAllZero, kFullyDense, kEmptyRows, kSparse95 };
const Content kContents[] = {Content::kRandomHalf, Content::kAllZero, Content::kFullyDense,
                             Content::kEmptyRows, Content::kSparse95};

std::vector<float> MakeContent(Content c, int64_t m, int64_t k, uint64_t seed) {
  switch (c) {
    case Content::kAllZero: return std::vector<float>(m * k, 0.0f);
    case Content::kFullyDense: return RandomMatrix(m, k, seed, 0.0);
    case Content::kSparse95: return RandomMatrix(m, k, seed, 0.95, true);
    case Content::kEmptyRows: {
      std::vector<float> w = RandomMatrix(m, k, seed, 0.3, true);
      for (int64_t i = 0; i < m; i += 2) std::fill_n(w.begin() + i * k, k, 0.0f);
      return w;
    }
    case Content::kRandomHalf: break;
  }
  return RandomMatrix(m, k, seed, 0.5, true);
}

// Stored entries: elements whose rounded value is not +0 (a -0 is stored, so it round-trips).
int64_t StoredCount(const std::vector<float>& rounded) {
  return std::count_if(rounded.begin(), rounded.end(),
                       [](float x) { return F32Bits(x) != 0; });
}

uint64_t ValueBytes(DType t) { return t == DType::kF32 ? 4 : 2; }

void CheckRoundTrip(const SparseMatrix& s, const std::vector<float>& want, int64_t m, int64_t k,
                    const std::string& what) {
  SCOPED_TRACE(what);
  Status st = Validate(s, "w");
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(Rows(s), m);
  EXPECT_EQ(Cols(s), k);
  EXPECT_TRUE(BitEqual(ToDense(s), want, m, k));
}

TEST(RoundTrip, UnconstrainedFormatsAllShapesDTypesContents) {
  uint64_t seed = 100;
  for (const Shape& sh : kShapes) {
    for (Content c : kContents) {
      const std::vector<float> w = MakeContent(c, sh.m, sh.k, seed++);
      for (DType dt : kDTypes) {
        const std::vector<float> want = RoundThrough(dt, w);
        const int64_t nnz = StoredCount(want);
        const std::string tag = std::to_string(sh.m) + "x" + std::to_string(sh.k) + " content " +
                                std::to_string(static_cast<int>(c)) + " " +
                                std::string(DTypeName(dt)) + " seed " + std::to_string(seed - 1);
        for (FormatKind f : {FormatKind::kDense, FormatKind::kCoo, FormatKind::kCsr}) {
          auto s = Encode(w, sh.m, sh.k, f, Pattern::Dense(), dt);
          ASSERT_TRUE(s.ok()) << s.status().ToString();
          EXPECT_EQ(KindOf(*s), f);
          EXPECT_EQ(ValueDType(*s), dt);
          CheckRoundTrip(*s, want, sh.m, sh.k, tag + " " + std::string(FormatName(f)));
          // Exact byte sizes, computed independently of the parts.
          const uint64_t vb = ValueBytes(dt);
          uint64_t expect_bytes = 0;
          if (f == FormatKind::kDense) expect_bytes = sh.m * sh.k * vb;
          if (f == FormatKind::kCoo) expect_bytes = nnz * (4 + 4 + vb);
          if (f == FormatKind::kCsr) expect_bytes = (sh.m + 1) * 8 + nnz * (2 + vb);
          EXPECT_EQ(ByteSize(*s), expect_bytes) << tag << " " << FormatName(f);
        }
        for (auto [bh, bw] : {std::pair{1, 1}, {1, 4}, {4, 1}, {3, 5}, {4, 4}, {16, 16}, {64, 64}}) {
          auto s = Encode(w, sh.m, sh.k, FormatKind::kBsr, Pattern::Block(bh, bw, 0.5), dt);
          ASSERT_TRUE(s.ok()) << s.status().ToString();
          CheckRoundTrip(*s, want, sh.m, sh.k,
                         tag + " bsr " + std::to_string(bh) + "x" + std::to_string(bw));
          // A block is stored iff it holds a stored element.
          int64_t blocks = 0;
          for (int64_t r0 = 0; r0 < sh.m; r0 += bh) {
            for (int64_t c0 = 0; c0 < sh.k; c0 += bw) {
              bool any = false;
              for (int64_t i = r0; i < std::min(sh.m, r0 + bh); ++i) {
                for (int64_t j = c0; j < std::min(sh.k, c0 + bw); ++j) {
                  any |= F32Bits(want[i * sh.k + j]) != 0;
                }
              }
              blocks += any;
            }
          }
          const auto& b = std::get<BsrMatrix>(*s);
          EXPECT_EQ(b.nblocks(), blocks);
          EXPECT_EQ(b.ByteSize(), ((sh.m + bh - 1) / bh + 1) * 8 + blocks * 2 +
                                      blocks * bh * bw * ValueBytes(dt));
        }
      }
    }
  }
}

TEST(RoundTrip, StructuredFormatsAfterMasking) {
  uint64_t seed = 500;
  const Pattern kNm[] = {Pattern::NM(2, 4), Pattern::NM(1, 4), Pattern::NM(4, 8),
                         Pattern::NM(2, 8), Pattern::NM(3, 5), Pattern::NM(1, 2),
                         Pattern::NM(7, 16), Pattern::NM(15, 16)};
  const Pattern kVnm[] = {Pattern::VNM(2, 2, 4), Pattern::VNM(8, 2, 4), Pattern::VNM(4, 1, 4),
                          Pattern::VNM(16, 4, 8), Pattern::VNM(3, 2, 3), Pattern::VNM(64, 2, 4)};
  for (const Shape& sh : kShapes) {
    for (Content c : kContents) {
      const std::vector<float> base = MakeContent(c, sh.m, sh.k, seed++);
      for (bool vnm : {false, true}) {
        for (const Pattern& p : vnm ? std::vector<Pattern>(std::begin(kVnm), std::end(kVnm))
                                    : std::vector<Pattern>(std::begin(kNm), std::end(kNm))) {
          std::vector<float> w = base;
          ASSERT_TRUE(MagnitudePrune(p, w, sh.m, sh.k).ok());
          ASSERT_TRUE(Satisfies(p, w, sh.m, sh.k));
          for (DType dt : kDTypes) {
            const std::vector<float> want = RoundThrough(dt, w);
            const std::string tag = p.ToString() + " " + std::to_string(sh.m) + "x" +
                                    std::to_string(sh.k) + " content " +
                                    std::to_string(static_cast<int>(c)) + " " +
                                    std::string(DTypeName(dt));
            auto s = Encode(w, sh.m, sh.k, PickFormat(p), p, dt);
            ASSERT_TRUE(s.ok()) << tag << ": " << s.status().ToString();
            CheckRoundTrip(*s, want, sh.m, sh.k, tag);
            const int64_t groups = (sh.k + p.m - 1) / p.m;
            int bits = 1;
            while ((1 << bits) < p.m) ++bits;
            const int64_t meta_rows = vnm ? (sh.m + p.v - 1) / p.v : sh.m;
            EXPECT_EQ(ByteSize(*s), sh.m * groups * p.n * ValueBytes(dt) +
                                        meta_rows * ((groups * p.n * bits + 7) / 8))
                << tag;
            // A V:N:M tensor also encodes as plain N:M.
            if (vnm) {
              auto nm = Encode(w, sh.m, sh.k, FormatKind::kNM, p, dt);
              ASSERT_TRUE(nm.ok()) << nm.status().ToString();
              CheckRoundTrip(*nm, want, sh.m, sh.k, tag + " as nm");
            }
          }
        }
      }
    }
  }
}

TEST(RoundTrip, NegativeZeroInNmKeepsItsSignWhenASlotIsFree) {
  // Group 0 has one nonzero and a -0: the free slot goes to the -0.
  const std::vector<float> w = {0.0f, -0.0f, 3.0f, 0.0f, 1.0f, 2.0f, 0.0f, 0.0f};
  auto s = NmMatrix::FromDense(w, 1, 8, 2, 4);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->Index(0, 0), 1);
  EXPECT_EQ(s->Index(0, 1), 2);
  EXPECT_TRUE(BitEqual(s->ToDense(), w, 1, 8));
}

TEST(RoundTrip, CsrPicksIndexWidth) {
  std::vector<float> w(65536 + 1, 0.0f);
  w[65536] = 1.0f;
  auto wide = CsrMatrix::FromDense(w, 1, 65537);
  ASSERT_TRUE(wide.ok());
  EXPECT_EQ(wide->col_idx.dtype(), DType::kU32);
  EXPECT_TRUE(wide->Validate("w").ok());
  EXPECT_TRUE(BitEqual(wide->ToDense(), w, 1, 65537));
  w.pop_back();
  w[65535] = 2.0f;
  auto narrow = CsrMatrix::FromDense(w, 1, 65536);
  ASSERT_TRUE(narrow.ok());
  EXPECT_EQ(narrow->col_idx.dtype(), DType::kU16);
  EXPECT_TRUE(BitEqual(narrow->ToDense(), w, 1, 65536));
  // BSR indexes block columns: 65537 columns in blocks of 2 still fit u16.
  std::vector<float> b(65537 * 1, 1.0f);
  auto bsr = BsrMatrix::FromDense(b, 1, 65537, 1, 2);
  ASSERT_TRUE(bsr.ok());
  EXPECT_EQ(bsr->col_idx.dtype(), DType::kU16);
  EXPECT_TRUE(BitEqual(bsr->ToDense(), b, 1, 65537));
}

TEST(Encode, RefusesWhatDoesNotFit) {
  std::vector<float> w = {1, 2, 3, 0, 0, 0, 0, 0};
  auto r = Encode(w, 1, 8, FormatKind::kNM, Pattern::NM(2, 4), DType::kF32);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("row 0, group 0 (columns 0..3) has 3 nonzeros"),
            std::string::npos)
      << r.status().message();
  r = Encode(w, 1, 8, FormatKind::kBsr, Pattern::NM(2, 4), DType::kF32);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("needs a block pattern"), std::string::npos);
  r = Encode(w, 1, 8, FormatKind::kVNM, Pattern::NM(2, 4), DType::kF32);
  ASSERT_FALSE(r.ok());
  r = Encode(w, 2, 8, FormatKind::kCsr, Pattern::Dense(), DType::kF32);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("8 values for a 2 x 8"), std::string::npos);
  r = Encode(w, 1, 8, FormatKind::kCsr, Pattern::Dense(), DType::kI8);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("not f32, bf16 or f16"), std::string::npos);
  // V:N:M: rows of one slab must share their columns.
  std::vector<float> v = {1, 1, 0, 0, 0, 0, 1, 1};
  auto vr = VnmMatrix::FromDense(v, 2, 4, 2, 2, 4);
  ASSERT_FALSE(vr.ok());
  EXPECT_NE(vr.status().message().find("slab 0 (rows 0..1), group 0 (columns 0..3) has 4 "
                                       "columns with nonzeros"),
            std::string::npos)
      << vr.status().message();
}

}  // namespace
}  // namespace sparq
