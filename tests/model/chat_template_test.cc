// ChatTemplate (sparq/chat.h) against jinja2: tests/model/data/chat_reference.json holds chat
// templates (SmolLM2's own, read from its GGUF, and ChatML spelled in other ways) rendered by
// jinja2 as Hugging Face's apply_chat_template renders them (tests/model/make_chat_reference.py),
// and templates of other layouts that must be refused. Rendering is text: compared exactly.
// Also where the template comes from: GGUF metadata, tokenizer_config.json, a checkpoint's
// tokenizer JSON.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <vector>

#include "data_testutil.h"
#include "model/model_testutil.h"
#include "sparq/chat.h"
#include "sparq/gguf.h"
#include "sparq/tokenizer.h"

namespace sparq {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

std::vector<ChatMessage> Messages(const json& j) {
  std::vector<ChatMessage> out;
  for (const auto& m : j) out.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  return out;
}

TEST(ChatTemplateTest, RendersAsJinja2OrRefuses) {
  const json ref = testing::LoadTestJson("chat_reference.json");
  ASSERT_GE(ref["templates"].size(), 4u);
  int recognised = 0, refused = 0;
  for (const auto& t : ref["templates"]) {
    const std::string name = t["name"].get<std::string>();
    auto ct = ChatTemplate::Recognize(t["template"].get<std::string>(),
                                      t["bos_token"].get<std::string>());
    if (!t["recognised"].get<bool>()) {
      ASSERT_FALSE(ct.ok()) << name << " should be refused; recognised as " << ct->Describe();
      EXPECT_EQ(ct.status().code(), StatusCode::kUnsupported) << name;
      EXPECT_THAT(ct.status().message(), HasSubstr("chat template not recognised")) << name;
      ++refused;
      continue;
    }
    ASSERT_TRUE(ct.ok()) << name << ": " << ct.status().ToString();
    EXPECT_EQ(ct->family(), t["family"].get<std::string>()) << name;
    EXPECT_EQ(ct->default_system(), t["default_system"].get<std::string>()) << name;
    EXPECT_EQ(ct->emits_bos(), t["emits_bos"].get<bool>()) << name;
    for (const auto& c : t["cases"]) {
      EXPECT_EQ(ct->Render(Messages(c["messages"]), c["add_generation_prompt"].get<bool>()),
                c["text"].get<std::string>())
          << name << " on " << c["messages"].dump();
    }
    ++recognised;
  }
  EXPECT_EQ(recognised, 4);
  EXPECT_GE(refused, 8);
}

TEST(ChatTemplateTest, DescribeNamesTheFamilyAndTheDefaultSystemMessage) {
  const json ref = testing::LoadTestJson("chat_reference.json");
  const auto ct = ChatTemplate::Recognize(ref["templates"][0]["template"].get<std::string>());
  ASSERT_TRUE(ct.ok()) << ct.status().ToString();
  EXPECT_EQ(ct->Describe(),
            "chatml, default system message \"You are a helpful AI assistant named SmolLM, "
            "trained by Hugging Face\"");
}

TEST(ChatTemplateTest, MalformedTemplatesAreRefusedNotCrashed) {
  for (const char* bad :
       {"", "<|im_start|><|im_end|>", "{{ '<|im_start|>' ", "{% for message in messages %}<|im_end|>",
        "{{ '<|im_start|>\\q<|im_end|>' }}", "{% if %}<|im_start|><|im_end|>{% endif %}",
        "{% endfor %}<|im_start|><|im_end|>", "{{ '<|im_start|>' + }}<|im_end|>",
        "{{ message[ }}<|im_start|><|im_end|>", "{# <|im_start|><|im_end|>"}) {
    const auto ct = ChatTemplate::Recognize(bad);
    EXPECT_FALSE(ct.ok()) << bad;
    EXPECT_EQ(ct.status().code(), StatusCode::kUnsupported) << bad;
  }
}

// The GGUF's tokenizer.chat_template reaches TokenizerData and is the string the reference was
// rendered from.
TEST(ChatTemplateTest, SmolLm2GgufCarriesTheReferencedTemplate) {
  SPARQ_REQUIRE_MODEL();
  const std::string path = testing::SmolLmPath();
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  auto tok = Tokenizer::FromGguf(*f);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  const json ref = testing::LoadTestJson("chat_reference.json");
  EXPECT_EQ(tok->data().chat_template, ref["templates"][0]["template"].get<std::string>());
  // The checkpoint form keeps it; a tokenizer JSON without the key (older checkpoints) has none.
  auto back = TokenizerData::FromJson(tok->data().ToJson(), "t");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->chat_template, tok->data().chat_template);
  json old = json::parse(tok->data().ToJson());
  old.erase("chat_template");
  back = TokenizerData::FromJson(old.dump(), "t");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->chat_template, "");
}

// tokenizer_config.json's chat_template: a string, or a list of named templates ("default").
TEST(ChatTemplateTest, HfTokenizerConfigChatTemplate) {
  const std::string dir = ::testing::TempDir();
  const std::string tok_path = dir + "/chat_tokenizer.json";
  {
    const json tj = {{"model",
                      {{"type", "BPE"},
                       {"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}}},
                       {"merges", {"a b"}}}},
                     {"added_tokens", {{{"id", 3}, {"content", "<|im_start|>"}, {"special", true}},
                                       {{"id", 4}, {"content", "<|im_end|>"}, {"special", true}}}},
                     {"pre_tokenizer", {{"type", "ByteLevel"}}}};
    std::ofstream(tok_path) << tj.dump();
  }
  const std::string cfg = dir + "/chat_tokenizer_config.json";
  auto load = [&](const json& config) {
    std::ofstream(cfg) << config.dump();
    return Tokenizer::FromHfJson(tok_path, cfg);
  };
  auto t = load({{"chat_template", "T1"}});
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->data().chat_template, "T1");
  t = load({{"chat_template", {{{"name", "tool_use"}, {"template", "T2"}},
                               {{"name", "default"}, {"template", "T3"}}}}});
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->data().chat_template, "T3");
  t = load({{"eos_token", "<|im_end|>"}});
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->data().chat_template, "");
  t = load({{"chat_template", 7}});
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(t.status().message(), HasSubstr(cfg + ": 'chat_template' is neither"));
  // Without a config file (or naming none): no template, no error.
  t = Tokenizer::FromHfJson(tok_path, dir + "/no_such_config.json");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->data().chat_template, "");
}

}  // namespace
}  // namespace sparq
