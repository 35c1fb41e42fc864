// Self-distillation data (sparq/finetune.h): text sampled from the teacher, so that recovery
// training needs no corpus.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "sparq/finetune.h"

namespace sparq::train {

const std::vector<std::string>& SelfDistillPrompts() {
  // Plain openings rather than chat turns: the student is scored as a language model on running
  // text, and the teacher's continuations of these read like encyclopedia, news and story text.
  static const std::vector<std::string> kPrompts = {
      "The history of",
      "In 1905,",
      "Scientists have discovered that",
      "The city of",
      "She opened the door and",
      "How to make",
      "The main difference between",
      "According to the report,",
      "The river",
      "In mathematics, a",
      "He was born in",
      "The first step is to",
      "During the war,",
      "The company announced",
      "A recipe for",
      "The theory of",
      "Once upon a time,",
      "The album was released",
      "Photosynthesis is",
      "The museum",
      "In computer science,",
      "The team won",
      "\"I don't know,\" she said,",
      "The population of",
      "Climate change",
      "The king",
      "Water boils at",
      "The novel tells the story of",
      "The bridge was built",
      "Students who",
      "The species is found in",
      "Music in the 18th century",
  };
  return kPrompts;
}

namespace {

// `s` with every byte that does not start a strict UTF-8 sequence (no overlong forms, surrogates
// or values above U+10FFFF: the rules the training text is checked by) dropped. A sample can end
// inside a character (its last token is a byte of one) and sampled byte tokens need not form one.
std::string KeepValidUtf8(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const uint8_t b0 = p[i];
    int len = 0;
    uint32_t cp = 0, min = 0;
    if (b0 < 0x80) {
      len = 1, cp = b0;
    } else if ((b0 & 0xE0) == 0xC0) {
      len = 2, cp = b0 & 0x1F, min = 0x80;
    } else if ((b0 & 0xF0) == 0xE0) {
      len = 3, cp = b0 & 0x0F, min = 0x800;
    } else if ((b0 & 0xF8) == 0xF0) {
      len = 4, cp = b0 & 0x07, min = 0x10000;
    }
    bool ok = len > 0 && i + len <= n;
    for (int j = 1; ok && j < len; ++j) {
      ok = (p[i + j] & 0xC0) == 0x80;
      cp = (cp << 6) | (p[i + j] & 0x3F);
    }
    if (ok && len > 1 && (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))) ok = false;
    if (ok) {
      out.append(s, i, static_cast<size_t>(len));
      i += static_cast<size_t>(len);
    } else {
      ++i;
    }
  }
  return out;
}

}  // namespace

Result<std::string> SelfDistillText(const LlamaModel& teacher, const SelfDistillOptions& o,
                                    ThreadPool* pool) {
  if (!(o.temperature > 0.0) || !std::isfinite(o.temperature)) {
    return InvalidInput("self-distill: the temperature must be a finite value > 0, not " +
                        std::to_string(o.temperature));
  }
  if (o.tokens < 1 || o.sample_len < 1) {
    return InvalidInput("self-distill: tokens and sample length must be >= 1");
  }
  if (o.top_k < 0) return InvalidInput("self-distill: top-k must be >= 0");
  if (!(o.top_p > 0.0 && o.top_p <= 1.0)) {
    return InvalidInput("self-distill: top-p must be in (0, 1], not " + std::to_string(o.top_p));
  }
  const std::vector<std::string>& prompts = SelfDistillPrompts();
  std::string text;
  int64_t generated = 0;
  for (int64_t i = 0; generated < o.tokens; ++i) {
    const std::string& prompt = prompts[static_cast<size_t>(i) % prompts.size()];
    SPARQ_ASSIGN_OR_RETURN(std::vector<int32_t> ids, teacher.tokenizer().Encode(prompt));
    GenerateOptions g;
    g.max_new = std::min(o.sample_len, o.tokens - generated);
    g.temperature = o.temperature;
    g.top_k = o.top_k;
    g.top_p = o.top_p;
    // One seed per sample (splitmix-style mixing): samples differ and a prefix of the text does
    // not depend on how many tokens are asked for in all.
    g.seed = (o.seed + 1) * 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(i) * 0xBF58476D1CE4E5B9ull;
    g.stop_at_eos = true;
    SPARQ_ASSIGN_OR_RETURN(GenerateResult r, Generate(teacher, ids, g, pool));
    // A sample the teacher ends at once still counts one token, so the loop always advances.
    generated += std::max<int64_t>(1, static_cast<int64_t>(r.tokens.size()));
    if (!text.empty()) text += "\n\n";
    text += prompt;
    text += KeepValidUtf8(teacher.tokenizer().Decode(r.tokens));
    if (o.progress) o.progress(std::min(generated, o.tokens), o.tokens);
  }
  return text;
}

}  // namespace sparq::train
