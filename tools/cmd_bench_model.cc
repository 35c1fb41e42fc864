// `sparq bench model MODEL [MORE.sparq ...] [--threads 2] [--prompt 512] [--decode 32]
// [--ppl-text FILE [--ppl-tokens 8192] [--ctx 512]] [--llama-cpp [SCRIPT]] [--json [FILE]]
// [--no-dense-bf16]`: prefill and decode tokens/s, file and weight bytes, bits per weight and
// (with --ppl-text) perplexity per model, runs interleaved across models and medians taken;
// beside the first model, that model with its linear layers stored dense bf16
// (StoreLinearsAsBf16), so that what bf16 storage buys is not credited to sparsity, and, for a GGUF
// with Q4_0 / Q4_1 / Q8_0 weights, that model with them run as stored; optionally
// llama.cpp on the first model (bench/peers/llama_cpp_bench.py), interleaved with sparq's runs
// and scoring the same token ids. The rows' keys are in docs/bench-json.md.

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "sparq/gguf.h"
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
  std::string llama_cpp;  // path of bench/peers/llama_cpp_bench.py to run as the peer ("auto": find it)
  std::string ppl_text;   // perplexity of every row on this text's first ppl_tokens tokens
  int64_t ppl_tokens = 8192, ctx = 512;
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
  std::string variant;  // "as_stored" | "dense_bf16" | "as_stored_quant"
  std::string path;     // the file or folder ("" for a variant made in memory)
};

// Bytes of a model file, or of the files directly in a model folder (HF: safetensors, configs,
// tokenizer).
uint64_t FileBytes(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) return fs::file_size(path, ec);
  uint64_t total = 0;
  for (const auto& e : fs::directory_iterator(path, ec)) {
    if (e.is_regular_file(ec)) total += e.file_size(ec);
  }
  return total;
}

// What llama.cpp reads per decoded token of a GGUF: every tensor, except that an untied model
// reads one row of its embedding; and the file's weight types by bytes ("Q4_1+Q6_K").
struct GgufSummary {
  uint64_t bytes_per_token = 0;
  std::string values;
};
Result<GgufSummary> SummarizeGguf(const std::string& path) {
  SPARQ_ASSIGN_OR_RETURN(GgufFile f, GgufFile::Open(path));
  GgufSummary s;
  std::map<std::string, uint64_t> by_type;
  const bool untied = f.FindTensor("output.weight") != nullptr;
  for (const GgufTensorInfo& t : f.tensors()) {
    uint64_t b = t.nbytes;
    if (untied && t.name == "token_embd.weight" && !t.ne.empty() && t.ne.back() > 0) {
      b /= static_cast<uint64_t>(t.ne.back());  // one row of [n_vocab, n_embd]
    }
    s.bytes_per_token += b;
    if (t.ne.size() == 2) by_type[GgmlTypeName(t.type)] += t.nbytes;
  }
  std::vector<std::pair<uint64_t, std::string>> order;
  for (const auto& [name, bytes] : by_type) order.push_back({bytes, name});
  std::sort(order.rbegin(), order.rend());
  for (const auto& [bytes, name] : order) s.values += (s.values.empty() ? "" : "+") + name;
  return s;
}

// True for a GGUF with a 2-D Q4_0 / Q4_1 / Q8_0 tensor (LoadOptions::gguf_values = kAsStored keeps
// those as stored); false for other files, folders and GGUFs with none.
bool HasAsStoredTensors(const std::string& path) {
  auto f = GgufFile::Open(path);
  if (!f.ok()) return false;
  for (const GgufTensorInfo& t : f->tensors()) {
    if (t.ne.size() == 2 &&
        (t.type == GgmlType::kQ4_0 || t.type == GgmlType::kQ4_1 || t.type == GgmlType::kQ8_0)) {
      return true;
    }
  }
  return false;
}

// Runs the llama.cpp peer script once; its JSON row, or an error with what it printed.
Result<nlohmann::json> RunPeer(const std::string& cmd) {
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return IoError("cannot run: " + cmd);
  std::string out;
  char buf[4096];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, got);
  const int rc = ::pclose(p);
  nlohmann::json peer = nlohmann::json::parse(out, nullptr, false);
  if (rc != 0 || !peer.is_object()) {
    return IoError("the llama.cpp peer gave no result (is llama-cpp-python installed? "
                       "bench/peers/build_llama_cpp.sh): " + cmd);
  }
  return peer;
}

Status RunBenchModel(const BenchModelOptions& o, const KernelConfig& cfg) {
  ThreadPool pool(o.threads);
  const MachineInfo machine = DescribeMachine(cfg);
  std::vector<LlamaModel> models;
  std::vector<BenchRow> names;
  // Inference only: a tied quantized head serves the embedding lookup, no f32 table (the bits
  // and the speed are the same; the memory is not).
  const LoadOptions as_loaded{.embedding_table = false};
  for (const std::string& m : o.models) {
    SPARQ_ASSIGN_OR_RETURN(LlamaModel lm, LlamaModel::Load(m, cfg, as_loaded));
    models.push_back(std::move(lm));
    names.push_back({Base(m), "as_stored", m});
    if (names.size() > 1) continue;
    if (!o.no_dense_bf16) {
      // The first model again, its linear layers dense bf16; a first model that is not dense f32
      // (a pruned checkpoint) has no such row.
      SPARQ_ASSIGN_OR_RETURN(LlamaModel bf, LlamaModel::Load(m, cfg));
      if (Status st = StoreLinearsAsBf16(&bf); !st.ok()) {
        std::fprintf(stderr, "no dense bf16 row: %s\n", st.message().c_str());
      } else {
        models.push_back(std::move(bf));
        names.push_back({Base(m) + " [dense bf16]", "dense_bf16", ""});
      }
    }
    // A GGUF whose linear layers are Q4_0 / Q4_1 / Q8_0: again with them run as stored, the row
    // that sits beside llama.cpp's on the same bytes.
    if (HasAsStoredTensors(m)) {
      SPARQ_ASSIGN_OR_RETURN(LlamaModel q,
                             LlamaModel::Load(m, cfg, {.gguf_values = GgufValues::kAsStored,
                                                       .embedding_table = false}));
      models.push_back(std::move(q));
      names.push_back({Base(m) + " [as stored]", "as_stored_quant", m});  // the file it runs
    }
  }
  for (size_t i = 1; i < models.size(); ++i) {
    if (models[i].config().n_vocab != models[0].config().n_vocab) {
      return InvalidInput(names[i].path + ": vocabulary of " +
                          std::to_string(models[i].config().n_vocab) + " tokens, " +
                          o.models[0] + " has " + std::to_string(models[0].config().n_vocab) +
                          ": the rows must share one tokenizer");
    }
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
  // Perplexity: one tokenization (the first model's) for every row, the peer's included.
  std::vector<int32_t> ppl_ids;
  std::string ids_file;
  if (!o.ppl_text.empty()) {
    SPARQ_ASSIGN_OR_RETURN(std::string t, ReadTextFile(o.ppl_text));
    SPARQ_ASSIGN_OR_RETURN(ppl_ids, models[0].tokenizer().Encode(t));
    if (static_cast<int64_t>(ppl_ids.size()) > o.ppl_tokens) ppl_ids.resize(o.ppl_tokens);
    if (ppl_ids.size() < 2) return InvalidInput(o.ppl_text + ": fewer than 2 tokens to score");
  }
  std::vector<double> ppl(models.size(), 0.0);
  for (size_t i = 0; i < models.size() && !ppl_ids.empty(); ++i) {
    std::fprintf(stderr, "perplexity: %s\n", names[i].name.c_str());
    // Where decode rounds X to int8 (--activations int8 and a kernel for the model's weights),
    // score token by token, so the perplexity is that of the products the decode column times;
    // elsewhere decode and the whole window multiply alike, and a window at once is faster.
    SPARQ_ASSIGN_OR_RETURN(PerplexityResult r,
                           Perplexity(models[i], ppl_ids, o.ctx, &pool, {}, nullptr,
                                      models[i].decode_rounds_x() ? 1 : 0));
    ppl[i] = r.perplexity;
  }
  // The peer: the script, found near the executable for a bare --llama-cpp.
  std::string peer_cmd;
  if (!o.llama_cpp.empty()) {
    std::string script = o.llama_cpp;
    if (script == "auto") script = FindNearExecutable("bench/peers/llama_cpp_bench.py");
    if (script.empty()) {
      return InvalidInput("--llama-cpp: bench/peers/llama_cpp_bench.py not found near the "
                          "executable: pass its path");
    }
    peer_cmd = PythonCommand() + " '" + script + "' '" + o.models[0] + "' --threads " +
               std::to_string(o.threads) + " --prompt " + std::to_string(o.prompt) +
               " --decode " + std::to_string(o.decode) + " --repeats 1 --json";
    if (!ppl_ids.empty()) {
      char tmpl[] = "/tmp/sparq-ppl-ids-XXXXXX";
      const int fd = ::mkstemp(tmpl);
      if (fd < 0) return IoError("cannot create a temporary file for the token ids");
      ids_file = tmpl;
      std::string text;
      for (int32_t id : ppl_ids) text += std::to_string(id) + "\n";
      const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
      ::close(fd);
      if (!ok) return IoError(ids_file + ": cannot write the token ids");
    }
  }
  // Interleave: repeat r runs every model once, then the peer, so a slow phase of the machine
  // hits all of them.
  std::vector<std::vector<double>> pre(models.size()), dec(models.size());
  std::vector<double> peer_pre, peer_dec;
  nlohmann::json peer;
  for (int r = 0; r < o.repeats; ++r) {
    for (size_t i = 0; i < models.size(); ++i) {
      SPARQ_ASSIGN_OR_RETURN(ModelSpeed s, MeasureSpeed(models[i], prompt, o.decode, &pool));
      pre[i].push_back(s.prefill_tok_s());
      dec[i].push_back(s.decode_tok_s());
    }
    if (peer_cmd.empty()) continue;
    // The peer scores the ids once, in the first repeat.
    const std::string cmd =
        peer_cmd + (r == 0 && !ids_file.empty()
                        ? " --ppl-ids '" + ids_file + "' --ctx " + std::to_string(o.ctx)
                        : std::string());
    auto row = RunPeer(cmd);
    if (!row.ok()) {
      std::fprintf(stderr, "%s\n", row.status().message().c_str());
      peer_cmd.clear();
      continue;
    }
    if (r == 0) peer = *row;
    peer_pre.push_back((*row)["prefill_tok_s"].get<double>());
    peer_dec.push_back((*row)["decode_tok_s"].get<double>());
  }
  if (!ids_file.empty()) std::remove(ids_file.c_str());
  const double params = ParameterCount(models[0]);
  nlohmann::json rows = nlohmann::json::array();
  for (size_t i = 0; i < models.size(); ++i) {
    nlohmann::json row = {{"model", names[i].name},
                          {"variant", names[i].variant},
                          {"decode_tok_s", Median(dec[i])},
                          {"prefill_tok_s", Median(pre[i])},
                          {"weight_bytes", models[i].weight_bytes()},
                          {"block_linear_bytes", models[i].block_linear_bytes()},
                          {"weight_bytes_per_token", models[i].weight_bytes_per_token()},
                          {"values", models[i].block_linear_values()},
                          {"threads", o.threads},
                          {"prompt_tokens", o.prompt},
                          {"decode_tokens", o.decode},
                          {"runtime", "sparq"},
                          {"activations", models[i].decode_rounds_x() ? "int8" : "f32"},
                          {"kv_cache", cfg.kv_f16 ? "f16" : "f32"},
                          {"cpu_model", machine.cpu_model},
                          {"isa", machine.isa}};
    // A variant made in memory has no file.
    row["file_bytes"] = nullptr;
    row["bits_per_weight"] = nullptr;
    if (!names[i].path.empty()) {
      const uint64_t fb = FileBytes(names[i].path);
      row["file_bytes"] = fb;
      row["bits_per_weight"] = 8.0 * double(fb) / ParameterCount(models[i]);
    }
    row["perplexity"] = ppl_ids.empty() ? nlohmann::json(nullptr) : nlohmann::json(ppl[i]);
    rows.push_back(std::move(row));
  }
  if (peer.is_object() && !peer_dec.empty()) {
    peer["decode_tok_s"] = Median(peer_dec);
    peer["prefill_tok_s"] = Median(peer_pre);
    peer["cpu_model"] = machine.cpu_model;
    if (!peer.contains("isa")) peer["isa"] = "";  // the peer's own dispatch, not sparq's
    const uint64_t fb = FileBytes(o.models[0]);
    peer["file_bytes"] = fb;
    peer["bits_per_weight"] = 8.0 * double(fb) / params;
    auto g = SummarizeGguf(o.models[0]);
    peer["weight_bytes_per_token"] = g.ok() ? nlohmann::json(g->bytes_per_token) : nlohmann::json(nullptr);
    peer["values"] = g.ok() ? g->values : std::string();
    if (!peer.contains("perplexity")) peer["perplexity"] = nullptr;
    peer.erase("ppl_tokens");
    rows.push_back(peer);
  }
  SPARQ_RETURN_IF_ERROR(o.json.Write(rows.dump(1)));
  if (o.json.to_stdout()) return Status::Ok();
  std::printf("%s; %d threads\n", MachineLine(machine).c_str(), o.threads);
  const double base_dec = rows[0]["decode_tok_s"].get<double>();
  const double base_pre = rows[0]["prefill_tok_s"].get<double>();
  auto num = [](const nlohmann::json& v, double scale, const char* fmt) {
    char b[32] = "-";
    if (v.is_number()) std::snprintf(b, sizeof(b), fmt, v.get<double>() * scale);
    return std::string(b);
  };
  std::printf("%-44s %-9s %-4s %9s %7s %10s %7s %8s %8s %6s %9s\n", "model", "values", "X",
              "decode t/s", "vs 1st", "prefill t/s", "vs 1st", "file MB", "MB/token", "bits/w",
              "perplexity");
  for (const auto& r : rows) {
    const double d = r["decode_tok_s"].get<double>(), p = r["prefill_tok_s"].get<double>();
    // X: the activations of decode's products (llama.cpp's row: its own, int8 for its
    // quantized weights, not recorded in the row).
    const std::string x = r.contains("activations") ? r["activations"].get<std::string>() : "-";
    std::printf("%-44s %-9s %-4s %9.1f %6.2fx %10.1f %6.2fx %8s %8s %6s %9s\n",
                r["model"].get<std::string>().substr(0, 44).c_str(),
                r["values"].get<std::string>().substr(0, 9).c_str(), x.c_str(), d, d / base_dec, p,
                p / base_pre, num(r["file_bytes"], 1e-6, "%.1f").c_str(),
                num(r["weight_bytes_per_token"], 1e-6, "%.1f").c_str(),
                num(r["bits_per_weight"], 1.0, "%.2f").c_str(),
                num(r["perplexity"], 1.0, "%.3f").c_str());
  }
  std::printf("(prefill: %lld-token prompt; decode: %lld tokens after it; sparq's KV cache %s; "
              "medians of %d interleaved runs%s)\n",
              static_cast<long long>(o.prompt), static_cast<long long>(o.decode),
              cfg.kv_f16 ? "f16" : "f32", o.repeats,
              ppl_ids.empty() ? ""
                              : ("; perplexity: " + std::to_string(ppl_ids.size()) +
                                 " tokens of " + Base(o.ppl_text) + ", ctx " +
                                 std::to_string(o.ctx))
                                    .c_str());
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
                                    "Also run llama.cpp on the first model (a GGUF), interleaved: "
                                    "bench/peers/llama_cpp_bench.py, found near the executable "
                                    "when no path is given")
                         ->expected(0, 1)
                         ->default_str("auto");
                     sub.add_option("--ppl-text", o->ppl_text,
                                    "Perplexity of every row (the peer's too) on this text");
                     sub.add_option("--ppl-tokens", o->ppl_tokens, "Tokens of --ppl-text scored")
                         ->capture_default_str()
                         ->check(CLI::Range(int64_t{2}, int64_t{1} << 24));
                     sub.add_option("--ctx", o->ctx, "Perplexity window (tokens)")
                         ->capture_default_str()
                         ->check(CLI::Range(int64_t{2}, int64_t{8192}));
                     o->json.Register(sub, "the rows (docs/bench-json.md)");
                     sub.add_flag("--no-dense-bf16", o->no_dense_bf16,
                                  "Leave out the first model's dense bf16 row");
                     return [o](const KernelConfig& cfg) { return RunBenchModel(*o, cfg); };
                   });

}  // namespace
}  // namespace sparq::cli
