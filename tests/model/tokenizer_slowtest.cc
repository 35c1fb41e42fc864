// Slow tier: SmolLM2's tokenizer on the whole WikiText-2 test text and the whole Sherlock Holmes
// text, against Hugging Face `tokenizers` (count and FNV-1a hash of the ids, made by
// tests/model/make_tokenizer_reference.py; the ids themselves would be megabytes).
#include <gtest/gtest.h>

#include <cinttypes>
#include <cstdio>

#include "model/model_testutil.h"
#include "sparq/gguf.h"
#include "sparq/tokenizer.h"

namespace sparq {
namespace {

std::string Fnv1a64(const std::vector<int32_t>& ids) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (int32_t id : ids) {
    const auto u = static_cast<uint32_t>(id);
    for (int b = 0; b < 4; ++b) {
      h ^= (u >> (8 * b)) & 0xFF;
      h *= 0x100000001b3ull;
    }
  }
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016" PRIx64, h);
  return buf;
}

TEST(TokenizerSlowTest, WholeTextsMatchReference) {
  SPARQ_REQUIRE_MODEL();
  const std::string path = testing::SmolLmPath();
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok());
  auto tok = Tokenizer::FromGguf(*f);
  ASSERT_TRUE(tok.ok());
  const nlohmann::json ref = testing::LoadTestJson("tokenizer_reference.json");
  for (const auto& [name, want] : ref["full_texts"].items()) {
    SPARQ_REQUIRE_TEXT(name);
    const std::string text = testing::ReadFileOrEmpty(testing::DataText(name));
    auto ids = tok->Encode(text);
    ASSERT_TRUE(ids.ok()) << ids.status().ToString();
    EXPECT_EQ(ids->size(), want["count"].get<size_t>()) << name;
    EXPECT_EQ(Fnv1a64(*ids), want["fnv1a64"].get<std::string>()) << name;
    EXPECT_EQ(tok->Decode(*ids), text) << name;
  }
}

}  // namespace
}  // namespace sparq
