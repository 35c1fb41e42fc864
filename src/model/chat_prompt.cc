// EncodeChatPrompt (sparq/chat.h): the prompt layout of `sparq generate`, in the library so that
// every front end (the command line, Python) gives a model the same ids for the same prompt.
#include "sparq/chat.h"

namespace sparq {

Result<ChatPrompt> EncodeChatPrompt(const Tokenizer& tok, std::string_view prompt, bool raw) {
  const TokenizerData& d = tok.data();
  ChatPrompt p;
  if (!raw && !d.chat_template.empty()) {
    const std::string bos = d.bos_id >= 0 ? d.tokens[d.bos_id] : std::string();
    auto ct = ChatTemplate::Recognize(d.chat_template, bos);
    if (ct.ok()) {
      const ChatMessage user{"user", std::string(prompt)};
      const std::string text = ct->Render(std::span(&user, 1), /*add_generation_prompt=*/true);
      SPARQ_ASSIGN_OR_RETURN(p.ids, tok.Encode(text, d.add_bos && !ct->emits_bos(),
                                               /*parse_special=*/true));
      p.template_line = "template: " + ct->Describe() + " (the model's chat template)";
      return p;
    }
    p.warning = ct.status().message() + "; the prompt is used raw (--raw: no warning)";
    p.template_line = "template: none (the model's chat template is not recognised; raw prompt)";
  } else {
    p.template_line = raw ? "template: none (--raw)"
                          : "template: none (the model carries no chat template; raw prompt)";
  }
  SPARQ_ASSIGN_OR_RETURN(p.ids, tok.Encode(prompt, d.add_bos, /*parse_special=*/false));
  return p;
}

}  // namespace sparq
