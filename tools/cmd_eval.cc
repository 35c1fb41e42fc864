// `sparq eval MODEL --text FILE [--ctx 512] [--max-tokens N] [--step N] [--json [FILE]]`: perplexity over
// non-overlapping windows (see Perplexity in sparq/model.h).

#include <cstdio>
#include <nlohmann/json.hpp>

#include "sparq/model.h"
#include "sparq/progress.h"
#include "tools/command.h"
#include "tools/gguf_values_flag.h"
#include "tools/json_output.h"

namespace sparq::cli {
namespace {

struct EvalOptions {
  std::string model, text;
  int64_t ctx = 512;
  int64_t max_tokens = 0;
  int64_t step = 0;
  int threads = 0;
  JsonOutput json;
  bool tokenize_only = false;
  std::string tokens_out, argmax_out;
  GgufValues gguf_values = GgufValues::kAsStored;
};

Status WriteIds(const std::string& path, const std::vector<int32_t>& ids) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return IoError(path + ": cannot write");
  for (int32_t id : ids) std::fprintf(f, "%d\n", id);
  if (std::fclose(f) != 0) return IoError(path + ": write failed");
  return Status::Ok();
}

Status RunEval(const EvalOptions& o, const KernelConfig& cfg) {
  const int threads = o.threads > 0 ? o.threads : DefaultThreads();
  ThreadPool pool(threads);
  SPARQ_ASSIGN_OR_RETURN(std::string text, ReadTextFile(o.text));
  // No f32 embedding table where a tied quantized head can serve the lookup: the same bits.
  SPARQ_ASSIGN_OR_RETURN(
      LlamaModel model,
      LlamaModel::Load(o.model, cfg, {.gguf_values = o.gguf_values, .embedding_table = false}));
  SPARQ_ASSIGN_OR_RETURN(std::vector<int32_t> ids, model.tokenizer().Encode(text));
  if (o.max_tokens > 0 && static_cast<int64_t>(ids.size()) > o.max_tokens) ids.resize(o.max_tokens);
  if (!o.tokens_out.empty()) SPARQ_RETURN_IF_ERROR(WriteIds(o.tokens_out, ids));
  if (o.tokenize_only) {
    SPARQ_RETURN_IF_ERROR(o.json.Write(nlohmann::json({{"tokens", ids.size()}, {"model", o.model}}).dump()));
    if (!o.json.to_stdout()) std::printf("%zu tokens\n", ids.size());
    return Status::Ok();
  }
  std::vector<int32_t> argmax;
  PerplexityResult r;
  {
    ProgressBar bar("eval", (static_cast<int64_t>(ids.size()) + o.ctx - 1) / o.ctx);
    SPARQ_ASSIGN_OR_RETURN(r, Perplexity(model, ids, o.ctx, &pool,
                                         [&](int64_t done, int64_t) { bar.Update(done); },
                                         o.argmax_out.empty() ? nullptr : &argmax, o.step));
  }
  if (!o.argmax_out.empty()) SPARQ_RETURN_IF_ERROR(WriteIds(o.argmax_out, argmax));
  const nlohmann::json j = {{"perplexity", r.perplexity}, {"tokens", r.tokens}, {"ctx", r.ctx},
                            {"windows", r.windows},       {"seconds", r.seconds},
                            {"model", o.model},           {"threads", threads},
                            {"isa", cfg.target_name()},  {"attention_isa", model.attention_target()},
                            {"step", o.step},             {"int8_activations", cfg.int8_activations},
                            {"kv_cache", cfg.kv_f16 ? "f16" : "f32"}};
  SPARQ_RETURN_IF_ERROR(o.json.Write(j.dump()));
  if (!o.json.to_stdout()) {
    std::printf("perplexity %.4f over %lld predicted tokens (%lld windows of ctx %lld) in %.1f s\n",
                r.perplexity, static_cast<long long>(r.tokens), static_cast<long long>(r.windows),
                static_cast<long long>(r.ctx), r.seconds);
  }
  return Status::Ok();
}

Registrar reg("eval", "Perplexity of a model (GGUF, .sparq or HF folder) on a text file",
              [](CLI::App& sub) -> RunFn {
                auto o = std::make_shared<EvalOptions>();
                sub.add_option("model", o->model, "Model: .gguf, .sparq or a Hugging Face folder")->required();
                sub.add_option("--text", o->text, "UTF-8 text file")->required();
                sub.add_option("--ctx", o->ctx, "Window (context) length in tokens")
                    ->capture_default_str()
                    ->check(CLI::Range(int64_t{2}, int64_t{1} << 16));
                sub.add_option("--max-tokens", o->max_tokens,
                               "Use only the first N tokens of the text (0: all)");
                sub.add_option("--threads", o->threads, "Threads (default: SPARQ_NUM_THREADS or all)");
                sub.add_option("--step", o->step,
                               "Feed each window N tokens per forward pass through the KV cache "
                               "(1: token by token, the kernels generation decodes with, e.g. "
                               "those of --int8-activations; 0: the whole window at once)")
                    ->capture_default_str()
                    ->check(CLI::Range(int64_t{0}, int64_t{1} << 16));
                sub.add_option("--tokens-out", o->tokens_out,
                               "Write the text's token ids (after --max-tokens), one per line");
                sub.add_option("--argmax-out", o->argmax_out,
                               "Write the greedy next-token choice at every predicted position");
                sub.add_flag("--tokenize-only", o->tokenize_only,
                             "Only tokenize (with --tokens-out: dump the ids), no evaluation");
                AddGgufValuesOption(sub, &o->gguf_values);
                o->json.Register(sub, "{\"perplexity\", \"tokens\", \"ctx\", ...}");
                return [o](const KernelConfig& cfg) { return RunEval(*o, cfg); };
              });

}  // namespace
}  // namespace sparq::cli
