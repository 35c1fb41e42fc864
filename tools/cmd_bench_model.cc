// `sparq bench model MODEL [MORE.sparq ...] [--threads 2] [--prompt 512] [--decode 32]
// [--json [FILE]] [--no-dense-bf16]`: prefill and decode tokens/s and weight bytes per model,
// runs interleaved across models and medians taken; beside the first model, that model with its
// linear layers stored dense bf16 (StoreLinearsAsBf16), so that what bf16 storage buys is not
// credited to sparsity; optionally llama.cpp's figures (bench/peers/llama_cpp_bench.py). The rows'
// keys are in docs/bench-json.md.

#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "sparq/model.h"
#include "tools/bench_hooks.h"
#include "tools/json_output.h"
#include "tools/machine_info.h"
#include "tools/python_path.h"

namespace sparq::cli {
namespace {

struct BenchModelOptions {
  std::vector<std::string> models;
  int threads = 2;
  int64_t prompt = 512, decode = 32;
  int repeats = 3;
  JsonOutput json;
  bool no_dense_bf16 = false;
  std::string text;       // prompt tokens from this file (default: a fixed synthetic sequence)
  std::string llama_cpp;  // path of bench/peers/llama_cpp_bench.py to run as the peer
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Last path component ("models/smollm2-hf/" -> "smollm2-hf").
std::string Base(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p.substr(p.find_last_of('/') + 1);
}

struct BenchRow {
  std::string name;     // "model" key
  std::string variant;  // "as_stored" | "dense_bf16"
};

Status RunBenchModel(const BenchModelOptions& o, const KernelConfig& cfg) {
  ThreadPool pool(o.threads);
  const MachineInfo machine = DescribeMachine(cfg);
  std::vector<LlamaModel> models;
  std::vector<BenchRow> names;
  for (const std::string& m : o.models) {
    SPARQ_ASSIGN_OR_RETURN(LlamaModel lm, LlamaModel::Load(m, cfg));
    models.push_back(std::move(lm));
    names.push_back({Base(m), "as_stored"});
    if (names.size() > 1 || o.no_dense_bf16) continue;
    // The first model again, its linear layers dense bf16; a first model that is not dense f32
    // (a pruned checkpoint) has no such row.
    SPARQ_ASSIGN_OR_RETURN(LlamaModel bf, LlamaModel::Load(m, cfg));
    if (Status st = StoreLinearsAsBf16(&bf); !st.ok()) {
      std::fprintf(stderr, "no dense bf16 row: %s\n", st.message().c_str());
      continue;
    }
    models.push_back(std::move(bf));
    names.push_back({Base(m) + " [dense bf16]", "dense_bf16"});
  }
  std::vector<int32_t> prompt;
  if (!o.text.empty()) {
    SPARQ_ASSIGN_OR_RETURN(std::string t, ReadTextFile(o.text));
    SPARQ_ASSIGN_OR_RETURN(prompt, models[0].tokenizer().Encode(t));
    if (static_cast<int64_t>(prompt.size()) < o.prompt) {
      return InvalidInput(o.text + ": fewer than --prompt tokens");
    }
    prompt.resize(o.prompt);
  } else {
    for (int64_t i = 0; i < o.prompt; ++i) prompt.push_back(static_cast<int32_t>(100 + 37 * i % 20000));
  }
  // Interleave: repeat r runs every model once, so a slow phase of the machine hits all of them.
  std::vector<std::vector<double>> pre(models.size()), dec(models.size());
  for (int r = 0; r < o.repeats; ++r) {
    for (size_t i = 0; i < models.size(); ++i) {
      SPARQ_ASSIGN_OR_RETURN(ModelSpeed s, MeasureSpeed(models[i], prompt, o.decode, &pool));
      pre[i].push_back(s.prefill_tok_s());
      dec[i].push_back(s.decode_tok_s());
    }
  }
  nlohmann::json rows = nlohmann::json::array();
  for (size_t i = 0; i < models.size(); ++i) {
    rows.push_back({{"model", names[i].name},
                    {"variant", names[i].variant},
                    {"decode_tok_s", Median(dec[i])},
                    {"prefill_tok_s", Median(pre[i])},
                    {"weight_bytes", models[i].weight_bytes()},
                    {"block_linear_bytes", models[i].block_linear_bytes()},
                    {"threads", o.threads},
                    {"prompt_tokens", o.prompt},
                    {"decode_tokens", o.decode},
                    {"runtime", "sparq"},
                    {"cpu_model", machine.cpu_model},
                    {"isa", machine.isa}});
  }
  if (!o.llama_cpp.empty()) {
    const std::string cmd = PythonCommand() + " '" + o.llama_cpp + "' '" + o.models[0] +
                            "' --threads " + std::to_string(o.threads) +
                            " --prompt " + std::to_string(o.prompt) +
                            " --decode " + std::to_string(o.decode) + " --repeats " +
                            std::to_string(o.repeats) + " --json";
    FILE* p = ::popen(cmd.c_str(), "r");
    std::string out;
    if (p != nullptr) {
      char buf[4096];
      size_t got;
      while ((got = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, got);
      ::pclose(p);
    }
    nlohmann::json peer = nlohmann::json::parse(out, nullptr, false);
    if (peer.is_object()) {
      peer["cpu_model"] = machine.cpu_model;
      if (!peer.contains("isa")) peer["isa"] = "";  // the peer's own dispatch, not sparq's
      rows.push_back(peer);
    } else {
      std::fprintf(stderr, "llama.cpp peer gave no result (is llama-cpp-python installed?)\n");
    }
  }
  SPARQ_RETURN_IF_ERROR(o.json.Write(rows.dump(1)));
  if (o.json.to_stdout()) return Status::Ok();
  std::printf("%s; %d threads\n", MachineLine(machine).c_str(), o.threads);
  const double base_dec = rows[0]["decode_tok_s"].get<double>();
  const double base_pre = rows[0]["prefill_tok_s"].get<double>();
  std::printf("%-44s %10s %8s %11s %8s %14s %8s\n", "model", "decode t/s", "vs 1st", "prefill t/s",
              "vs 1st", "weight MB", "threads");
  for (const auto& r : rows) {
    const double d = r["decode_tok_s"].get<double>(), p = r["prefill_tok_s"].get<double>();
    std::printf("%-44s %10.1f %7.2fx %11.1f %7.2fx %14.1f %8d\n",
                r["model"].get<std::string>().substr(0, 44).c_str(), d, d / base_dec, p,
                p / base_pre, r["weight_bytes"].get<double>() / 1e6, r["threads"].get<int>());
  }
  std::printf("(prefill: %lld-token prompt; decode: %lld tokens after it; medians of %d interleaved "
              "runs)\n",
              static_cast<long long>(o.prompt), static_cast<long long>(o.decode), o.repeats);
  return Status::Ok();
}

BenchRegistrar reg("model", "Prefill/decode tokens/s and weight bytes of models (GGUF, .sparq or HF folder)",
                   [](CLI::App& sub) -> RunFn {
                     auto o = std::make_shared<BenchModelOptions>();
                     sub.add_option("models", o->models, "Models; ratios are against the first")
                         ->required();
                     sub.add_option("--threads", o->threads, "Threads")->capture_default_str();
                     sub.add_option("--prompt", o->prompt, "Prefill tokens")
                         ->capture_default_str()
                         ->check(CLI::Range(int64_t{1}, int64_t{8192}));
                     sub.add_option("--decode", o->decode, "Decode tokens")
                         ->capture_default_str()
                         ->check(CLI::Range(int64_t{1}, int64_t{8192}));
                     sub.add_option("--repeats", o->repeats, "Interleaved repeats (median)")
                         ->capture_default_str()
                         ->check(CLI::Range(1, 100));
                     sub.add_option("--text", o->text, "Take the prompt from this text file");
                     sub.add_option("--llama-cpp", o->llama_cpp,
                                    "Also run this peer script (bench/peers/llama_cpp_bench.py) "
                                    "on the first model");
                     o->json.Register(sub, "the rows (docs/bench-json.md)");
                     sub.add_flag("--no-dense-bf16", o->no_dense_bf16,
                                  "Leave out the first model's dense bf16 row");
                     return [o](const KernelConfig& cfg) { return RunBenchModel(*o, cfg); };
                   });

}  // namespace
}  // namespace sparq::cli
