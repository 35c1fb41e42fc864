// Chat templates: the prompt layout a chat model was trained on, as the model file carries it
// (GGUF `tokenizer.chat_template`, a Hugging Face tokenizer_config.json's `chat_template`, kept in
// a .sparq checkpoint's tokenizer: TokenizerData::chat_template).
//
// A chat template is a Jinja program; sparq does not run Jinja. ChatTemplate::Recognize reads the
// template's structure (its tags, the names its expressions use, the markers its string literals
// emit) and, when that is the structure of a family sparq renders, keeps the family and the
// parameters read from the template (a default system message, a BOS prefix). Render then gives
// what Hugging Face's `apply_chat_template(messages, tokenize=False, add_generation_prompt=...)`
// gives for the same template (checked against jinja2 on real templates,
// tests/model/data/chat_reference.json). Anything outside the family's structure (a name the
// family does not use, `{% set %}`, filters, text outside the tags that survives Jinja's
// whitespace rules) makes the template unrecognised, so a caller falls back to the raw prompt
// instead of guessing a layout.
//
// Families:
//   chatml  <|im_start|>ROLE\nCONTENT<|im_end|>\n per message, then <|im_start|>assistant\n
//           (SmolLM, SmolLM2); optionally a default system message the template adds when the
//           first message is not a system one, and {{ bos_token }} first.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sparq/status.h"
#include "sparq/tokenizer.h"

namespace sparq {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

class ChatTemplate {
 public:
  // Unsupported (naming what was not understood) when `jinja` is not of a known family.
  // `bos_token` is the vocabulary's BOS text, emitted where the template writes {{ bos_token }}.
  static Result<ChatTemplate> Recognize(std::string_view jinja, std::string_view bos_token = "");

  // "chatml".
  const std::string& family() const { return family_; }
  // The family and its parameters in a few words, e.g.
  // `chatml, default system message "You are a helpful AI assistant named SmolLM, ..."`.
  std::string Describe() const;
  // "" when the template adds none.
  const std::string& default_system() const { return default_system_; }
  // The template writes the BOS token itself (the caller then does not prepend one).
  bool emits_bos() const { return emits_bos_; }

  // The prompt text for `messages`; its special-token markers are meant to be tokenized as
  // special tokens (Tokenizer::Encode with parse_special).
  std::string Render(std::span<const ChatMessage> messages, bool add_generation_prompt) const;

 private:
  std::string family_, default_system_, bos_token_;
  bool emits_bos_ = false;
};

// The token ids `sparq generate` feeds a model for `prompt`: unless `raw`, a model that carries a
// chat template sparq recognises gets the prompt as one user message in it (special markers
// parsed, BOS as the template says); otherwise the prompt as it is (BOS if the vocabulary adds
// one). Shared by the command line and the Python module, so both give the same ids.
struct ChatPrompt {
  std::vector<int32_t> ids;
  std::string template_line;  // "template: ..." (which layout was applied, and why)
  std::string warning;        // a template was present but not recognised ("" otherwise)
};
Result<ChatPrompt> EncodeChatPrompt(const Tokenizer& tok, std::string_view prompt, bool raw);

}  // namespace sparq
