// Tokenizer tests: hand-built vocabularies for the pre-tokenizer and BPE rules, and SmolLM2's real
// vocabulary against Hugging Face `tokenizers` ids (tests/model/make_tokenizer_reference.py).
#include "sparq/tokenizer.h"

#include <gtest/gtest.h>

#include "model/model_testutil.h"
#include "sparq/gguf.h"

namespace sparq {
namespace {

// A byte-level vocabulary: the 256 single-byte tokens (GPT-2's byte-to-unicode order) plus `extra`.
TokenizerData ByteVocab(std::vector<std::string> extra, std::vector<std::string> merges,
                        std::string pre = "gpt2") {
  TokenizerData d;
  d.pre = std::move(pre);
  auto cp_of = [](int b) -> uint32_t {
    if ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE)) return b;
    int n = 0;
    for (int c = 0; c < b; ++c) {
      if (!((c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE))) ++n;
    }
    return 256 + n;
  };
  for (int b = 0; b < 256; ++b) {
    std::string s;
    const uint32_t cp = cp_of(b);
    if (cp < 0x80) {
      s.push_back(static_cast<char>(cp));
    } else {
      s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
    d.tokens.push_back(s);
  }
  for (auto& e : extra) d.tokens.push_back(e);
  d.merges = std::move(merges);
  return d;
}

std::vector<std::string> Pieces(const Tokenizer& t, std::string_view text) {
  auto r = t.PreTokenize(text);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : std::vector<std::string>{};
}

// A default-constructed tokenizer is an empty vocabulary, not a null one (it crashed in
// vocab_size() when a model was built from parts without one).
TEST(TokenizerTest, DefaultIsAnEmptyVocabulary) {
  const Tokenizer t;
  EXPECT_EQ(t.vocab_size(), 0);
  EXPECT_TRUE(t.data().tokens.empty());
}

TEST(TokenizerTest, Gpt2PreTokenizerFollowsTheRegex) {
  auto t = Tokenizer::FromData(ByteVocab({}, {}), "test");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  using V = std::vector<std::string>;
  EXPECT_EQ(Pieces(*t, "Hello world"), (V{"Hello", " world"}));
  // \s+(?!\S): the last space of a run goes to the next word.
  EXPECT_EQ(Pieces(*t, "a   b"), (V{"a", "  ", " b"}));
  EXPECT_EQ(Pieces(*t, "a  "), (V{"a", "  "}));
  EXPECT_EQ(Pieces(*t, "x\n\ny"), (V{"x", "\n", "\n", "y"}));
  EXPECT_EQ(Pieces(*t, "I'm they'll it's"), (V{"I", "'m", " they", "'ll", " it", "'s"}));
  EXPECT_EQ(Pieces(*t, "x=123 45"), (V{"x", "=", "123", " 45"}));
  EXPECT_EQ(Pieces(*t, "caf\xC3\xA9!?"), (V{"caf\xC3\xA9", "!?"}));
}

TEST(TokenizerTest, SmollmPreTokenizerSplitsEveryDigit) {
  auto t = Tokenizer::FromData(ByteVocab({}, {}, "smollm"), "test");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  using V = std::vector<std::string>;
  EXPECT_EQ(Pieces(*t, "x=123 45"), (V{"x", "=", "1", "2", "3", " ", "4", "5"}));
  EXPECT_EQ(Pieces(*t, "a\xC2\xB2"), (V{"a", "\xC2\xB2"}));  // U+00B2 is \p{N} (No)
}

TEST(TokenizerTest, BpeMergesByRankAndFallsBackToBytes) {
  // "ab" (rank 0), "bc" (rank 1): "abc" -> "ab" + "c", never "a" + "bc".
  auto t = Tokenizer::FromData(ByteVocab({"ab", "bc", "abc2"}, {"a b", "b c"}), "test");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  auto ids = t->Encode("abc");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<int32_t>{256, 'c'}));
  // Merged symbol missing from the vocabulary: bytes.
  auto t2 = Tokenizer::FromData(ByteVocab({}, {"a b"}), "test");
  ASSERT_TRUE(t2.ok());
  EXPECT_EQ(*t2->Encode("ab"), (std::vector<int32_t>{'a', 'b'}));
  // Decode inverts byte-level encoding, including bytes outside ASCII.
  const std::string s = "a\xC3\xA9 \x01z";
  auto e = t->Encode(s);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(t->Decode(*e), s);
}

TEST(TokenizerTest, SpecialTokensOnlyWhenAsked) {
  TokenizerData d = ByteVocab({"<|x|>"}, {});
  d.token_types.assign(d.tokens.size(), 1);
  d.token_types.back() = 3;  // control
  d.eos_id = 256;
  auto t = Tokenizer::FromData(d, "test");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*t->Encode("a<|x|>b", false, true), (std::vector<int32_t>{'a', 256, 'b'}));
  EXPECT_EQ(t->Encode("a<|x|>b", false, false)->size(), 7u);
  EXPECT_EQ(t->Decode(std::vector<int32_t>{'a', 256}), "a");
  EXPECT_EQ(t->Decode(std::vector<int32_t>{'a', 256}, true), "a<|x|>");
}

TEST(TokenizerTest, RejectsBadInput) {
  auto t = Tokenizer::FromData(ByteVocab({}, {}), "test");
  ASSERT_TRUE(t.ok());
  for (const char* bad : {"ok\xFF", "\xC3", "\xC0\x80", "\xED\xA0\x80", "\xF4\x90\x80\x80"}) {
    auto r = t->Encode(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("invalid UTF-8 at byte"), std::string::npos)
        << r.status().message();
  }
  EXPECT_EQ(t->Encode("ok\xFF").status().message(), "text: invalid UTF-8 at byte 2 (0xFF)");
  auto unknown_pre = Tokenizer::FromData(ByteVocab({}, {}, "llama-bpe-xyz"), "m.gguf");
  ASSERT_FALSE(unknown_pre.ok());
  EXPECT_NE(unknown_pre.status().message().find("m.gguf: pre-tokenizer 'llama-bpe-xyz'"),
            std::string::npos)
      << unknown_pre.status().message();
  TokenizerData bad_model = ByteVocab({}, {});
  bad_model.model = "llama";
  EXPECT_EQ(Tokenizer::FromData(bad_model, "m").status().code(), StatusCode::kUnsupported);
  EXPECT_FALSE(Tokenizer::FromData(ByteVocab({}, {"nospace"}), "m").ok());
  TokenizerData bad_id = ByteVocab({}, {});
  bad_id.eos_id = 100000;
  auto r = Tokenizer::FromData(bad_id, "m");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("eos token id 100000 out of range"), std::string::npos);
}

TEST(TokenizerTest, JsonRoundTrip) {
  TokenizerData d = ByteVocab({"ab"}, {"a b"}, "smollm");
  d.bos_id = 1;
  d.add_bos = true;
  auto back = TokenizerData::FromJson(d.ToJson(), "x");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->tokens, d.tokens);
  EXPECT_EQ(back->merges, d.merges);
  EXPECT_EQ(back->pre, "smollm");
  EXPECT_EQ(back->bos_id, 1);
  EXPECT_TRUE(back->add_bos);
  EXPECT_FALSE(TokenizerData::FromJson("{\"model\": 3}", "x").ok());
  EXPECT_FALSE(TokenizerData::FromJson("not json", "x").ok());
}

class SmolLmTokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SPARQ_REQUIRE_MODEL();
    const std::string path = testing::SmolLmPath();
    auto f = GgufFile::Open(path);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    auto t = Tokenizer::FromGguf(*f);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    tok_ = std::make_unique<Tokenizer>(std::move(*t));
  }
  std::unique_ptr<Tokenizer> tok_;
};

TEST_F(SmolLmTokenizerTest, MetadataFacts) {
  EXPECT_EQ(tok_->vocab_size(), 49152);
  EXPECT_EQ(tok_->bos_id(), 1);
  EXPECT_EQ(tok_->eos_id(), 2);
  EXPECT_EQ(tok_->data().pre, "smollm");
  EXPECT_EQ(tok_->data().merges.size(), 48900u);
}

TEST_F(SmolLmTokenizerTest, MatchesReferenceOnWikiTextSlice) {
  const nlohmann::json ref = testing::LoadTestJson("tokenizer_reference.json");
  SPARQ_REQUIRE_TEXT("wikitext-2-raw-test.txt");
  const std::string wiki = testing::ReadFileOrEmpty(testing::DataText("wikitext-2-raw-test.txt"));
  const std::string slice = wiki.substr(0, ref["wikitext_bytes"].get<size_t>());
  auto ids = tok_->Encode(slice);
  ASSERT_TRUE(ids.ok()) << ids.status().ToString();
  const auto want = ref["wikitext_ids"].get<std::vector<int32_t>>();
  ASSERT_EQ(ids->size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ((*ids)[i], want[i]) << "token " << i;
  EXPECT_EQ(tok_->Decode(*ids), slice);
}

TEST_F(SmolLmTokenizerTest, MatchesReferenceOnEdgeCases) {
  const nlohmann::json ref = testing::LoadTestJson("tokenizer_reference.json");
  for (const auto& c : ref["cases"]) {
    const std::string text = c["text"].get<std::string>();
    auto ids = tok_->Encode(text);
    ASSERT_TRUE(ids.ok()) << ids.status().ToString();
    EXPECT_EQ(*ids, c["ids"].get<std::vector<int32_t>>()) << "text: " << text;
    EXPECT_EQ(tok_->Decode(*ids), text);
  }
}

TEST_F(SmolLmTokenizerTest, ChatTemplateTokensWithParseSpecial) {
  auto ids = tok_->Encode("<|im_start|>user\nHi<|im_end|>", false, true);
  ASSERT_TRUE(ids.ok());
  ASSERT_GE(ids->size(), 3u);
  EXPECT_EQ(ids->front(), 1);
  EXPECT_EQ(ids->back(), 2);
}

}  // namespace
}  // namespace sparq
