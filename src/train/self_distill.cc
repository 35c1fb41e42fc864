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
    // One seed per sample (splitmix-style mixing): samples differ and a prefix of the text does
    // not depend on how many tokens are asked for in all.
    g.seed = (o.seed + 1) * 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(i) * 0xBF58476D1CE4E5B9ull;
    g.stop_at_eos = true;
    SPARQ_ASSIGN_OR_RETURN(GenerateResult r, Generate(teacher, ids, g, pool));
    // A sample the teacher ends at once still counts one token, so the loop always advances.
    generated += std::max<int64_t>(1, static_cast<int64_t>(r.tokens.size()));
    if (!text.empty()) text += "\n\n";
    text += prompt;
    text += teacher.tokenizer().Decode(r.tokens);
    if (o.progress) o.progress(std::min(generated, o.tokens), o.tokens);
  }
  return text;
}

}  // namespace sparq::train
