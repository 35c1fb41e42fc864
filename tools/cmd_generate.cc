// `sparq generate MODEL --prompt "..." [--raw] [--max-new 64] [--temperature 0] [--threads 2]`.
//
// A model that carries a chat template (sparq/chat.h) gets the prompt as one user message in
// that template, unless --raw; a template sparq does not recognise means the raw prompt, with a
// warning. stdout holds only the generated text; which template was applied and the speed go to
// stderr, after it.

#include <cstdio>

#include "sparq/chat.h"
#include "sparq/model.h"
#include "tools/command.h"
#include "tools/gguf_values_flag.h"

namespace sparq::cli {
namespace {

struct GenOptions {
  std::string model, prompt;
  int64_t max_new = 64;
  double temperature = 0.0;
  int64_t top_k = 40;
  double top_p = 1.0;
  uint64_t seed = 42;
  int threads = 0;
  bool raw = false;
  bool chat = false;  // the default, spelled out (kept for older command lines)
  GgufValues gguf_values = GgufValues::kAsStored;
};

Status RunGenerate(const GenOptions& o, const KernelConfig& cfg) {
  const int threads = o.threads > 0 ? o.threads : DefaultThreads();
  ThreadPool pool(threads);
  // No f32 embedding table where a tied quantized head can serve the lookup: the same bits.
  SPARQ_ASSIGN_OR_RETURN(
      LlamaModel model,
      LlamaModel::Load(o.model, cfg, {.gguf_values = o.gguf_values, .embedding_table = false}));
  const Tokenizer& tok = model.tokenizer();
  SPARQ_ASSIGN_OR_RETURN(ChatPrompt prompt, EncodeChatPrompt(tok, o.prompt, o.raw));
  if (!prompt.warning.empty()) std::fprintf(stderr, "sparq: warning: %s\n", prompt.warning.c_str());
  GenerateOptions g;
  g.max_new = o.max_new;
  g.temperature = o.temperature;
  g.top_k = o.top_k;
  g.top_p = o.top_p;
  g.seed = o.seed;
  SPARQ_ASSIGN_OR_RETURN(GenerateResult r,
                         Generate(model, prompt.ids, g, &pool, [&](int32_t t) {
                           const std::string piece = tok.Decode(std::span(&t, 1));
                           std::fwrite(piece.data(), 1, piece.size(), stdout);
                           std::fflush(stdout);
                         }));
  std::fputc('\n', stdout);
  std::fflush(stdout);  // before the lines on stderr, also when stdout is a pipe
  const double decode_tokens = static_cast<double>(r.tokens.size() > 0 ? r.tokens.size() - 1 : 0);
  std::fprintf(stderr, "%s\n", prompt.template_line.c_str());
  std::fprintf(stderr,
               "prefill: %lld tokens in %.3f s (%.1f tok/s); decode: %zu tokens in %.3f s "
               "(%.1f tok/s); %d threads\n",
               static_cast<long long>(r.prompt_tokens), r.prefill_seconds,
               r.prompt_tokens / r.prefill_seconds, r.tokens.size(), r.decode_seconds,
               r.decode_seconds > 0 ? decode_tokens / r.decode_seconds : 0.0, threads);
  return Status::Ok();
}

Registrar reg("generate", "Generate text from a prompt (greedy or sampled)",
              [](CLI::App& sub) -> RunFn {
                auto o = std::make_shared<GenOptions>();
                sub.add_option("model", o->model, "Model: .gguf, .sparq or a Hugging Face folder")->required();
                sub.add_option("--prompt", o->prompt, "Prompt text")->required();
                sub.add_option("--max-new", o->max_new, "New tokens at most")
                    ->capture_default_str()
                    ->check(CLI::Range(int64_t{0}, int64_t{1} << 16));
                sub.add_option("--temperature", o->temperature, "0: greedy")
                    ->capture_default_str()
                    ->check(CLI::Range(0.0, 100.0));
                sub.add_option("--top-k", o->top_k, "Sampling: keep the k best (0: all)")
                    ->capture_default_str();
                sub.add_option("--top-p", o->top_p,
                               "Sampling: of those, the likeliest whose probability sums to p "
                               "(nucleus; 1: all)")
                    ->capture_default_str();
                sub.add_option("--seed", o->seed, "Sampling seed")->capture_default_str();
                sub.add_option("--threads", o->threads, "Threads (default: SPARQ_NUM_THREADS or all)");
                CLI::Option* raw = sub.add_flag(
                    "--raw", o->raw, "Use the prompt as it is, without the model's chat template");
                sub.add_flag("--chat", o->chat,
                             "Apply the model's chat template (the default; kept as an alias)")
                    ->excludes(raw);
                AddGgufValuesOption(sub, &o->gguf_values);
                return [o](const KernelConfig& cfg) { return RunGenerate(*o, cfg); };
              });

}  // namespace
}  // namespace sparq::cli
