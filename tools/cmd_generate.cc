// `sparq generate MODEL --prompt "..." [--max-new 64] [--temperature 0] [--threads 2]`.
#include <cblas.h>

#include <cstdio>

#include "sparq/model.h"
#include "tools/command.h"

namespace sparq::cli {
namespace {

struct GenOptions {
  std::string model, prompt;
  int64_t max_new = 64;
  double temperature = 0.0;
  int64_t top_k = 40;
  uint64_t seed = 42;
  int threads = 0;
  bool chat = false;
};

Status RunGenerate(const GenOptions& o) {
  const int threads = o.threads > 0 ? o.threads : DefaultThreads();
  openblas_set_num_threads(threads);
  ThreadPool pool(threads);
  SPARQ_ASSIGN_OR_RETURN(LlamaModel model, LlamaModel::Load(o.model));
  std::string prompt = o.prompt;
  if (o.chat) {  // ChatML, as SmolLM2-Instruct's template
    prompt = "<|im_start|>user\n" + o.prompt + "<|im_end|>\n<|im_start|>assistant\n";
  }
  SPARQ_ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                         model.tokenizer().Encode(prompt, model.tokenizer().data().add_bos,
                                                  /*parse_special=*/o.chat));
  GenerateOptions g;
  g.max_new = o.max_new;
  g.temperature = o.temperature;
  g.top_k = o.top_k;
  g.seed = o.seed;
  if (!o.chat) std::fputs(o.prompt.c_str(), stdout);
  std::fflush(stdout);
  const Tokenizer& tok = model.tokenizer();
  SPARQ_ASSIGN_OR_RETURN(GenerateResult r,
                         Generate(model, ids, g, &pool, [&](int32_t t) {
                           const std::string piece = tok.Decode(std::span(&t, 1));
                           std::fwrite(piece.data(), 1, piece.size(), stdout);
                           std::fflush(stdout);
                         }));
  std::fputc('\n', stdout);
  std::fflush(stdout);  // before the timing line on stderr, also when stdout is a pipe
  const double decode_tokens = static_cast<double>(r.tokens.size() > 0 ? r.tokens.size() - 1 : 0);
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
                sub.add_option("--seed", o->seed, "Sampling seed")->capture_default_str();
                sub.add_option("--threads", o->threads, "Threads (default: SPARQ_NUM_THREADS or all)");
                sub.add_flag("--chat", o->chat, "Wrap the prompt in the ChatML template");
                return [o]() { return RunGenerate(*o); };
              });

}  // namespace
}  // namespace sparq::cli
