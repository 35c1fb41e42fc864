#include <gtest/gtest.h>

#include <string>

#include "sparq/format.h"
#include "sparq/pattern.h"

namespace sparq {
namespace {

TEST(PatternParse, CanonicalSpellingsRoundTripExactly) {
  for (const char* spec :
       {"dense", "unstructured:0.9", "unstructured-row:0.9", "unstructured:0", "unstructured:1",
        "rows:0.3", "cols:0.3", "2:4", "4:8", "1:4", "15:16", "1:2", "block:16x16",
        "block:32x32:0.9", "block:1x4:0.25", "block:64x1:0", "vnm:8:2:4", "vnm:64:1:16",
        "vnm:2:1:2", "unstructured:0.123456789"}) {
    SCOPED_TRACE(spec);
    auto p = Pattern::Parse(spec);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    EXPECT_EQ(p->ToString(), spec);
    auto again = Pattern::Parse(p->ToString());
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(*again, *p);
  }
}

TEST(PatternParse, FieldsAreSet) {
  EXPECT_EQ(*Pattern::Parse("2:4"), Pattern::NM(2, 4));
  EXPECT_EQ(*Pattern::Parse("block:16x16"), Pattern::Block(16, 16, 0.5));
  EXPECT_EQ(*Pattern::Parse("block:16x8:0.9"), Pattern::Block(16, 8, 0.9));
  EXPECT_EQ(*Pattern::Parse("vnm:8:2:4"), Pattern::VNM(8, 2, 4));
  EXPECT_EQ(*Pattern::Parse("unstructured-row:0.5"), Pattern::Unstructured(0.5, true));
  EXPECT_EQ(*Pattern::Parse("rows:0.25"), Pattern::Rows(0.25));
  EXPECT_EQ(*Pattern::Parse("cols:0.75"), Pattern::Cols(0.75));
  EXPECT_EQ(*Pattern::Parse("dense"), Pattern::Dense());
  EXPECT_EQ(*Pattern::Parse("unstructured:5e-1"), Pattern::Unstructured(0.5));
  // Non-canonical spellings normalise.
  EXPECT_EQ(Pattern::Parse("block:16x16:0.5")->ToString(), "block:16x16");
  EXPECT_EQ(Pattern::Parse("unstructured:0.50")->ToString(), "unstructured:0.5");
}

TEST(PatternParse, FactoryPatternsRoundTrip) {
  for (const Pattern& p :
       {Pattern::Dense(), Pattern::Unstructured(0.7), Pattern::Unstructured(1.0 / 3, true),
        Pattern::Rows(0.1), Pattern::Cols(0.9), Pattern::NM(3, 7), Pattern::Block(4, 1, 0.6),
        Pattern::Block(64, 64, 0.5), Pattern::VNM(16, 2, 4)}) {
    auto q = Pattern::Parse(p.ToString());
    ASSERT_TRUE(q.ok()) << p.ToString() << ": " << q.status().ToString();
    EXPECT_EQ(*q, p) << p.ToString();
  }
}

struct BadSpec {
  const char* spec;
  const char* expect;  // substring of the message
};

TEST(PatternParse, BadSpecsGiveClearErrors) {
  for (const BadSpec& b : std::initializer_list<BadSpec>{
           {"3:2", "1 <= N < M"},
           {"4:4", "1 <= N < M"},
           {"0:4", "1 <= N < M"},
           {"2:17", "outside 2..16"},
           {"2:4:1", "exactly two numbers"},
           {"block:0x4", "each side must be in 1..64"},
           {"block:65x4", "each side must be in 1..64"},
           {"block:16", "is not HxW"},
           {"block:16x16:2", "outside [0, 1]"},
           {"vnm:1:2:4", "V = 1 is outside 2..64"},
           {"vnm:128:2:4", "V = 128 is outside 2..64"},
           {"vnm:8:2", "vnm:V:N:M"},
           {"vnm:8:4:2", "1 <= N < M"},
           {"unstructured:1.5", "outside [0, 1]"},
           {"unstructured:-0.1", "not a number in [0, 1]"},
           {"unstructured:nan", "not a number in [0, 1]"},
           {"unstructured", "unstructured:F"},
           {"unstructured:0.5:1", "unstructured:F"},
           {"rows:x", "not a number"},
           {"", "empty pattern"},
           {"sparse", "unknown pattern 'sparse'"},
           {"dense:1", "expected the form 'dense'"},
           {"2:x", "M must be a whole number"},
           {" 2:4", "unknown pattern"},
       }) {
    SCOPED_TRACE(b.spec);
    auto p = Pattern::Parse(b.spec);
    ASSERT_FALSE(p.ok());
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidInput);
    EXPECT_NE(p.status().message().find(b.expect), std::string::npos) << p.status().message();
    EXPECT_NE(p.status().message().find(std::string("'") + b.spec + "'"), std::string::npos)
        << "message should quote the spec: " << p.status().message();
  }
}

TEST(PatternValidate, Ranges) {
  EXPECT_TRUE(Pattern::NM(1, 16).Validate().ok());
  EXPECT_FALSE(Pattern::NM(2, 2).Validate().ok());
  EXPECT_FALSE(Pattern::NM(2, 18).Validate().ok());
  EXPECT_TRUE(Pattern::Block(1, 64, 0.0).Validate().ok());
  EXPECT_FALSE(Pattern::Block(0, 4, 0.5).Validate().ok());
  EXPECT_FALSE(Pattern::Block(4, 4, 1.01).Validate().ok());
  EXPECT_TRUE(Pattern::VNM(64, 2, 4).Validate().ok());
  EXPECT_FALSE(Pattern::VNM(65, 2, 4).Validate().ok());
  EXPECT_FALSE(Pattern::Unstructured(-0.5).Validate().ok());
  EXPECT_FALSE(Pattern::Rows(2).Validate().ok());
  EXPECT_TRUE(Pattern::Cols(1).Validate().ok());
}

TEST(FormatName, RoundTrip) {
  for (FormatKind f : {FormatKind::kDense, FormatKind::kCoo, FormatKind::kCsr, FormatKind::kBsr,
                       FormatKind::kNM, FormatKind::kVNM}) {
    EXPECT_EQ(ParseFormatName(FormatName(f)), f);
  }
  EXPECT_EQ(FormatName(FormatKind::kNM), "nm");
  EXPECT_FALSE(ParseFormatName("auto").has_value());
  EXPECT_FALSE(ParseFormatName("CSR").has_value());
}

TEST(PickFormat, AutoChoice) {
  EXPECT_EQ(PickFormat(Pattern::NM(2, 4)), FormatKind::kNM);
  EXPECT_EQ(PickFormat(Pattern::VNM(8, 2, 4)), FormatKind::kVNM);
  EXPECT_EQ(PickFormat(Pattern::Block(16, 16, 0.5)), FormatKind::kBsr);
  EXPECT_EQ(PickFormat(Pattern::Dense()), FormatKind::kDense);
  EXPECT_EQ(PickFormat(Pattern::Unstructured(0.9)), FormatKind::kCsr);
  EXPECT_EQ(PickFormat(Pattern::Rows(0.3)), FormatKind::kCsr);
  EXPECT_EQ(PickFormat(Pattern::Cols(0.3)), FormatKind::kCsr);
}

}  // namespace
}  // namespace sparq
