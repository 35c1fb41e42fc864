// Self-distillation data (sparq/finetune.h): text sampled from the teacher, so that recovery
// training needs no corpus.
#include <algorithm>
#include <cmath>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "sparq/checked.h"
#include "sparq/finetune.h"
#include "sparq/model.h"

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
  if (o.batch < 1) return InvalidInput("self-distill: the batch must be >= 1");
  if (o.top_k < 0) return InvalidInput("self-distill: top-k must be >= 0");
  if (!(o.top_p > 0.0 && o.top_p <= 1.0)) {
    return InvalidInput("self-distill: top-p must be in (0, 1], not " + std::to_string(o.top_p));
  }
  const std::vector<std::string>& prompts = SelfDistillPrompts();
  std::vector<std::vector<int32_t>> prompt_ids;
  int64_t longest = 0;
  for (const std::string& p : prompts) {
    SPARQ_ASSIGN_OR_RETURN(std::vector<int32_t> ids, teacher.tokenizer().Encode(p));
    if (ids.empty()) return Internal("self-distill: prompt \"" + p + "\" encodes to no tokens");
    longest = std::max(longest, static_cast<int64_t>(ids.size()));
    prompt_ids.push_back(std::move(ids));
  }
  GenerateOptions g;
  g.temperature = o.temperature;
  g.top_k = o.top_k;
  g.top_p = o.top_p;
  const int64_t max_len = std::min(o.sample_len, o.tokens);
  const auto n_vocab = static_cast<size_t>(teacher.config().n_vocab);
  const int32_t eos = teacher.tokenizer().eos_id();

  // Samples in sample order; len = tokens so far (a lower bound of the final count while in flight).
  struct Sample {
    std::vector<int32_t> tokens;
    bool done = false;
  };
  std::vector<Sample> samples;
  // Slots: a cache and RNG each; slot_sample[s] < 0 when free. A sample starts only
  // while the ones in flight (max_len each at most) leave room, so no more than
  // ceil(tokens / max_len) are ever in flight.
  const int64_t batch = std::min(o.batch, CeilDiv(o.tokens, max_len));
  std::vector<KvCache> caches;
  for (int64_t b = 0; b < batch; ++b) {
    SPARQ_ASSIGN_OR_RETURN(KvCache kv, teacher.NewCache(longest + max_len));
    caches.push_back(std::move(kv));
  }
  std::vector<int64_t> slot_sample(static_cast<size_t>(batch), -1);
  std::vector<std::mt19937_64> rngs(static_cast<size_t>(batch));
  std::vector<float> logits(static_cast<size_t>(batch) * n_vocab);  // a step's rows, or a prefill's

  // The budget rule (sparq/finetune.h): sample i keeps min(its length, o.tokens - the kept tokens
  // of samples < i). While some are in flight only bounds are known: `before_lo` / `before_hi`
  // bound the tokens of the samples before i from below (tokens so far) and above (sample_len
  // while in flight).
  auto bounds_before = [&](size_t i, int64_t* lo, int64_t* hi) {
    *lo = *hi = 0;
    for (size_t j = 0; j < i; ++j) {
      const auto n = static_cast<int64_t>(samples[j].tokens.size());
      *lo += n;
      *hi += samples[j].done ? n : max_len;
    }
  };
  // Progress as the tokens of all samples so far (capped), reported when a sample ends.
  int64_t reported = -1;
  auto report = [&] {
    if (!o.progress) return;
    int64_t lo = 0, hi = 0;
    bounds_before(samples.size(), &lo, &hi);
    lo = std::min(lo, o.tokens);
    if (lo != reported) o.progress(lo, o.tokens);
    reported = lo;
  };
  // Ends sample i when it cannot need another token: EOS, its length, or the tokens before it
  // already leave it no more room.
  auto maybe_finish = [&](size_t i) {
    Sample& smp = samples[i];
    const auto n = static_cast<int64_t>(smp.tokens.size());
    int64_t lo = 0, hi = 0;
    bounds_before(i, &lo, &hi);
    if (smp.tokens.back() == eos || n >= max_len || n >= o.tokens - lo) {
      smp.done = true;
      report();
    }
    return smp.done;
  };
  // Starts the next sample in a free slot when the samples before it are certain to leave it at
  // least one token (so none is sampled in vain): prefill its prompt, draw its first token.
  auto start = [&](size_t slot) -> Result<bool> {
    const size_t i = samples.size();
    int64_t lo = 0, hi = 0;
    bounds_before(i, &lo, &hi);
    if (hi >= o.tokens) return false;
    const std::vector<int32_t>& ids = prompt_ids[i % prompt_ids.size()];
    KvCache& kv = caches[slot];
    kv.Clear();
    float* row = logits.data();
    SPARQ_RETURN_IF_ERROR(teacher.Forward(ids, &kv, row, false, pool));
    // One seed per sample (splitmix-style mixing): samples differ and a prefix of the text does
    // not depend on how many tokens are asked for in all.
    rngs[slot].seed((o.seed + 1) * 0x9E3779B97F4A7C15ull ^
                    static_cast<uint64_t>(i) * 0xBF58476D1CE4E5B9ull);
    samples.emplace_back();
    samples.back().tokens.push_back(SampleToken({row, n_vocab}, g, &rngs[slot]));
    slot_sample[slot] = static_cast<int64_t>(i);
    if (maybe_finish(i)) slot_sample[slot] = -1;
    return true;
  };
  std::vector<int32_t> step_tokens;
  std::vector<KvCache*> step_caches;
  std::vector<size_t> step_slots;
  while (true) {
    // Fill free slots in slot order (a sample that ends at once frees its slot again).
    for (size_t slot = 0; slot < static_cast<size_t>(batch); ++slot) {
      while (slot_sample[slot] < 0) {
        SPARQ_ASSIGN_OR_RETURN(bool started, start(slot));
        if (!started) break;
      }
    }
    step_tokens.clear();
    step_caches.clear();
    step_slots.clear();
    for (size_t slot = 0; slot < static_cast<size_t>(batch); ++slot) {
      if (slot_sample[slot] < 0) continue;
      step_tokens.push_back(samples[static_cast<size_t>(slot_sample[slot])].tokens.back());
      step_caches.push_back(&caches[slot]);
      step_slots.push_back(slot);
    }
    if (step_slots.empty()) break;  // every sample is done and the budget is reached
    // Row r of the step belongs to slot step_slots[r].
    SPARQ_RETURN_IF_ERROR(teacher.ForwardBatch(step_tokens, step_caches, logits.data(), pool));
    // Every draw uses its own slot's RNG; the finish tests after all draws, as a sample's reads
    // the lengths of the samples before it.
    // (A draw sorts the vocabulary: ~3 ms, as much as a step's forward at B = 16, hence the pool.)
    auto draw = [&](int64_t r, int) {
      const size_t slot = step_slots[static_cast<size_t>(r)];
      const auto i = static_cast<size_t>(slot_sample[slot]);
      samples[i].tokens.push_back(
          SampleToken({logits.data() + r * n_vocab, n_vocab}, g, &rngs[slot]));
    };
    const auto rows = static_cast<int64_t>(step_slots.size());
    if (pool != nullptr && pool->num_threads() > 1 && rows > 1) {
      pool->ParallelFor(rows, draw);
    } else {
      for (int64_t r = 0; r < rows; ++r) draw(r, 0);
    }
    for (size_t slot = 0; slot < static_cast<size_t>(batch); ++slot) {
      if (slot_sample[slot] >= 0 && maybe_finish(static_cast<size_t>(slot_sample[slot]))) {
        slot_sample[slot] = -1;
      }
    }
  }

  std::string text;
  int64_t kept = 0;
  for (size_t i = 0; i < samples.size() && kept < o.tokens; ++i) {
    const auto n = std::min(static_cast<int64_t>(samples[i].tokens.size()), o.tokens - kept);
    kept += n;
    if (!text.empty()) text += "\n\n";
    text += prompts[i % prompts.size()];
    text += KeepValidUtf8(teacher.tokenizer().Decode(
        std::span<const int32_t>(samples[i].tokens.data(), static_cast<size_t>(n))));
  }
  return text;
}

}  // namespace sparq::train
