// Perplexity over non-overlapping windows, and text-file reading for eval/calibration.
#include <chrono>
#include <cmath>
#include <fstream>
#include <sstream>

#include "sparq/model.h"
#include "src/model/unicode.h"

namespace sparq {

int32_t Argmax(std::span<const float> logits) {
  // The maximum in 16 independent lanes, then its first index: the one-pass scan chained every
  // logit through the load of logits[best] (~8 cycles each, 2-4% of a one-thread decode over
  // 49152 logits). Same result: NaNs never win, and a NaN first logit (which nothing exceeds) is 0.
  const size_t n = logits.size();
  if (n == 0 || std::isnan(logits[0])) return 0;
  constexpr size_t kLanes = 16;
  float lane[kLanes];
  for (float& m : lane) m = logits[0];
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) lane[j] = logits[i + j] > lane[j] ? logits[i + j] : lane[j];
  }
  float mx = lane[0];
  for (size_t j = 1; j < kLanes; ++j) mx = lane[j] > mx ? lane[j] : mx;
  for (; i < n; ++i) mx = logits[i] > mx ? logits[i] : mx;
  for (i = 0; i < n; ++i) {
    if (logits[i] == mx) break;
  }
  return static_cast<int32_t>(i);
}

Result<PerplexityResult> Perplexity(const LlamaModel& model, std::span<const int32_t> tokens,
                                    int64_t ctx, ThreadPool* pool,
                                    const std::function<void(int64_t, int64_t)>& progress,
                                    std::vector<int32_t>* argmax, int64_t step) {
  if (argmax != nullptr) argmax->clear();
  if (ctx < 2) return InvalidInput("perplexity: --ctx must be at least 2");
  if (step < 0) return InvalidInput("perplexity: --step must be 0 (whole windows) or more");
  const auto total = static_cast<int64_t>(tokens.size());
  if (total < 2) return InvalidInput("perplexity: the text has fewer than 2 tokens");
  const int64_t vocab = model.config().n_vocab;
  int64_t windows = total / ctx + (total % ctx >= 2 ? 1 : 0);
  const auto t0 = std::chrono::steady_clock::now();
  SPARQ_ASSIGN_OR_RETURN(KvCache cache, model.NewCache(ctx));
  std::vector<float> logits(static_cast<size_t>(ctx * vocab));
  double nll = 0.0;
  int64_t predicted = 0;
  for (int64_t w = 0; w < windows; ++w) {
    const int64_t begin = w * ctx;
    const int64_t len = std::min(ctx, total - begin);
    cache.Clear();
    const int64_t per = step > 0 ? step : len;
    for (int64_t i = 0; i < len; i += per) {
      SPARQ_RETURN_IF_ERROR(model.Forward(tokens.subspan(begin + i, std::min(per, len - i)), &cache,
                                          logits.data() + i * vocab, true, pool));
    }
    for (int64_t i = 0; i + 1 < len; ++i) {
      const float* row = logits.data() + i * vocab;
      float mx = row[0];
      for (int64_t j = 1; j < vocab; ++j) mx = std::max(mx, row[j]);
      double sum = 0.0;
      for (int64_t j = 0; j < vocab; ++j) sum += std::exp(static_cast<double>(row[j] - mx));
      nll += std::log(sum) + mx - row[tokens[begin + i + 1]];
      if (argmax != nullptr) argmax->push_back(Argmax({row, static_cast<size_t>(vocab)}));
      ++predicted;
    }
    if (progress) progress(w + 1, windows);
  }
  PerplexityResult r;
  r.mean_nll = nll / static_cast<double>(predicted);
  r.perplexity = std::exp(r.mean_nll);
  r.tokens = predicted;
  r.windows = windows;
  r.ctx = ctx;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

Result<std::string> ReadTextFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return IoError(path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return IoError(path + ": read failed");
  std::string text = ss.str();
  if (text.empty()) return InvalidInput(path + ": the text file is empty");
  std::vector<uint32_t> cps;
  std::vector<size_t> offs;
  SPARQ_RETURN_IF_ERROR(unicode::DecodeUtf8(text, path, &cps, &offs));
  return text;
}

}  // namespace sparq
