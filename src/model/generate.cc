// Greedy / temperature sampling generation with a KV cache.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <random>

#include "sparq/model.h"

namespace sparq {

int32_t SampleToken(std::span<const float> logits, const GenerateOptions& opt,
                    std::mt19937_64* rng) {
  if (opt.temperature <= 0.0) return Argmax(logits);
  const auto v = static_cast<int64_t>(logits.size());
  std::vector<int32_t> idx(static_cast<size_t>(v));
  std::iota(idx.begin(), idx.end(), 0);
  int64_t k = (opt.top_k > 0 && opt.top_k < v) ? opt.top_k : v;
  // The k likeliest in descending order, ties by index: a strict total order, so any sort gives
  // the same order. nth_element + sort rather than partial_sort: partial_sort is a heap sort,
  // ~4x slower for k near the vocabulary (top_k 0, self-distillation's default, sorts it all).
  auto likelier = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  if (k < v) std::nth_element(idx.begin(), idx.begin() + k, idx.end(), likelier);
  std::sort(idx.begin(), idx.begin() + k, likelier);
  std::vector<double> p(static_cast<size_t>(k));
  const double mx = logits[idx[0]];
  double sum = 0.0;
  for (int64_t i = 0; i < k; ++i) {
    p[i] = std::exp((logits[idx[i]] - mx) / opt.temperature);
    sum += p[i];
  }
  if (opt.top_p < 1.0) {
    // The nucleus: the sorted prefix whose mass first reaches top_p of the whole.
    const double target = opt.top_p * sum;
    double mass = 0.0;
    int64_t keep = 0;
    while (keep < k && mass < target) mass += p[keep++];
    k = std::max<int64_t>(keep, 1);
    sum = mass > 0.0 ? mass : p[0];
  }
  std::uniform_real_distribution<double> u(0.0, sum);
  double r = u(*rng);
  for (int64_t i = 0; i < k; ++i) {
    r -= p[i];
    if (r <= 0.0) return idx[i];
  }
  return idx[k - 1];
}

Result<GenerateResult> Generate(const LlamaModel& model, std::span<const int32_t> prompt,
                                const GenerateOptions& opt, ThreadPool* pool,
                                const std::function<void(int32_t)>& on_token) {
  if (prompt.empty()) return InvalidInput("generate: the prompt has no tokens");
  if (opt.max_new < 0) return InvalidInput("generate: --max-new must be >= 0");
  if (!(opt.top_p > 0.0 && opt.top_p <= 1.0)) {
    return InvalidInput("generate: --top-p must be in (0, 1], not " + std::to_string(opt.top_p));
  }
  const auto np = static_cast<int64_t>(prompt.size());
  SPARQ_ASSIGN_OR_RETURN(KvCache cache, model.NewCache(np + opt.max_new + 1));
  std::vector<float> logits(static_cast<size_t>(model.config().n_vocab));
  std::mt19937_64 rng(opt.seed);
  GenerateResult r;
  r.prompt_tokens = np;
  auto t0 = std::chrono::steady_clock::now();
  SPARQ_RETURN_IF_ERROR(model.Forward(prompt, &cache, logits.data(), false, pool));
  auto t1 = std::chrono::steady_clock::now();
  r.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
  for (int64_t i = 0; i < opt.max_new; ++i) {
    const int32_t tok = SampleToken(logits, opt, &rng);
    r.tokens.push_back(tok);
    if (on_token) on_token(tok);
    if (opt.stop_at_eos && tok == model.tokenizer().eos_id()) break;
    if (i + 1 == opt.max_new) break;
    SPARQ_RETURN_IF_ERROR(
        model.Forward(std::span<const int32_t>(&tok, 1), &cache, logits.data(), false, pool));
  }
  r.decode_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  return r;
}

}  // namespace sparq

namespace sparq {

Result<ModelSpeed> MeasureSpeed(const LlamaModel& model, std::span<const int32_t> prompt,
                                int64_t decode_tokens, ThreadPool* pool) {
  if (prompt.empty() || decode_tokens < 0) return InvalidInput("speed: empty prompt");
  const auto np = static_cast<int64_t>(prompt.size());
  SPARQ_ASSIGN_OR_RETURN(KvCache cache, model.NewCache(np + decode_tokens + 1));
  std::vector<float> logits(static_cast<size_t>(model.config().n_vocab));
  ModelSpeed s;
  auto t0 = std::chrono::steady_clock::now();
  SPARQ_RETURN_IF_ERROR(model.Forward(prompt, &cache, logits.data(), false, pool));
  auto t1 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < decode_tokens; ++i) {
    const int32_t tok = Argmax(logits);
    SPARQ_RETURN_IF_ERROR(
        model.Forward(std::span<const int32_t>(&tok, 1), &cache, logits.data(), false, pool));
  }
  auto t2 = std::chrono::steady_clock::now();
  s.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
  s.decode_seconds = std::chrono::duration<double>(t2 - t1).count();
  s.prefill_tokens = np;
  s.decode_tokens = decode_tokens;
  return s;
}

}  // namespace sparq
