// `sparq demo`: sparq's main job on the default model (SmolLM2-135M-Instruct): prune it one-shot
// with SparseGPT to 50% unstructured (bf16 values) and to 2:4, then one table of perplexity,
// decode and prefill tokens/s and weight bytes for the dense model (f32, and with its weights
// rounded to bf16, so that what bf16 buys is not credited to sparsity) and both pruned models,
// and one generated sentence from each. Its texts are found in data/text/ (the current folder's,
// else the checkout's the binary was built in) unless --calib / --text name them; --quick makes
// every stage short (an end-to-end check, not numbers to quote).
// `sparq demo --formats`: a layer with the shape of a Llama-7B MLP weight (11008 x 4096),
// magnitude-masked to each pattern, encoded in each applicable format with f32 and bf16 values,
// checked for an exact round trip, and summarised in a memory table.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <sys/stat.h>

#include "sparq/format.h"
#include "sparq/model.h"
#include "sparq/pattern.h"
#include "sparq/thread_pool.h"
#include "tools/command.h"
#include "tools/python_path.h"

namespace sparq::cli {
namespace {

constexpr int64_t kLlama7bMlpRows = 11008;  // intermediate size (gate/up projection outputs)
constexpr int64_t kLlama7bMlpCols = 4096;   // hidden size
constexpr uint64_t kDefaultSeed = 20240601;
constexpr float kInitStd = 0.02f;  // the usual std of a Llama-style weight initialisation

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Element i is a Box-Muller normal draw from a counter-based hash of (seed, i), so the values do
// not depend on how the work is split across threads.
std::vector<float> GaussianLayer(int64_t rows, int64_t cols, uint64_t seed, ThreadPool& pool) {
  std::vector<float> w(static_cast<size_t>(rows * cols));
  const int64_t tasks = std::max<int64_t>(1, rows / 64);
  pool.ParallelFor(tasks, [&](int64_t t, int) {
    const int64_t r0 = rows * t / tasks, r1 = rows * (t + 1) / tasks;
    for (int64_t i = r0 * cols; i < r1 * cols; ++i) {
      const uint64_t h = SplitMix64(seed * 0x632be59bd9b4e019ull + static_cast<uint64_t>(i));
      const double u1 = (static_cast<double>(h >> 40) + 1.0) / 16777217.0;  // (0, 1]
      const double u2 = static_cast<double>(h & 0xffffff) / 16777216.0;
      w[i] = static_cast<float>(kInitStd * std::sqrt(-2.0 * std::log(u1)) *
                                std::cos(6.283185307179586 * u2));
    }
  });
  return w;
}

float RoundTo(DType t, float x) {
  if (t == DType::kBF16) return BF16ToF32(F32ToBF16(x));
  if (t == DType::kF16) return F16ToF32(F32ToF16(x));
  return x;
}

struct TableRow {
  std::string pattern, format, values;
  uint64_t bytes = 0;
  bool ok = false;
  double encode_s = 0;
  std::string error;
};

// Encodes `w` (already satisfying `p`) in `format` with `dtype` values, validates, decodes, and
// compares bit for bit with the rounded input.
TableRow EncodeAndCheck(std::span<const float> w, int64_t rows, int64_t cols, const Pattern& p,
                        FormatKind format, DType dtype) {
  TableRow row;
  row.pattern = p.ToString();
  row.format = std::string(FormatName(format));
  row.values = std::string(DTypeName(dtype));
  const auto t0 = std::chrono::steady_clock::now();
  auto enc = Encode(w, rows, cols, format, p, dtype);
  row.encode_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!enc.ok()) {
    row.error = enc.status().ToString();
    return row;
  }
  row.bytes = ByteSize(*enc);
  Status st = Validate(*enc, "demo." + row.pattern + "." + row.format);
  if (!st.ok()) {
    row.error = st.ToString();
    return row;
  }
  const Tensor dense = ToDense(*enc);
  const float* d = dense.data_as<float>();
  for (size_t i = 0; i < w.size(); ++i) {
    const float want = RoundTo(dtype, w[i]);
    if (std::memcmp(&d[i], &want, 4) != 0) {
      row.error = "round trip differs at element " + std::to_string(i);
      return row;
    }
  }
  row.ok = true;
  return row;
}

}  // namespace

// Masks `w` [rows, cols] to each pattern, encodes every variant (auto format and csr, f32 and
// bf16 values), checks the round trips and prints the memory table. Fails if any variant does.
Status FormatsMemoryTable(std::span<const float> w, int64_t rows, int64_t cols,
                          const std::vector<Pattern>& patterns, ThreadPool& pool) {
  const DType kDTypes[] = {DType::kF32, DType::kBF16};
  struct Job {
    size_t pattern;
    FormatKind format;
    DType dtype;
  };
  std::vector<Job> jobs;
  for (DType dt : kDTypes) jobs.push_back({patterns.size(), FormatKind::kDense, dt});
  for (size_t i = 0; i < patterns.size(); ++i) {
    for (DType dt : kDTypes) {
      const FormatKind autof = PickFormat(patterns[i]);
      jobs.push_back({i, autof, dt});
      if (autof != FormatKind::kCsr) jobs.push_back({i, FormatKind::kCsr, dt});
    }
  }
  // One task per pattern (masking once, then every encoding of it), so that a thread holds one
  // masked copy at a time.
  std::vector<TableRow> table(jobs.size());
  std::vector<Status> mask_status(patterns.size() + 1);
  pool.ParallelFor(static_cast<int64_t>(patterns.size()) + 1, [&](int64_t t, int) {
    std::vector<float> masked;
    std::span<const float> src = w;
    const Pattern p = t < static_cast<int64_t>(patterns.size()) ? patterns[t] : Pattern::Dense();
    if (t < static_cast<int64_t>(patterns.size())) {
      masked.assign(w.begin(), w.end());
      mask_status[t] = MagnitudePrune(p, masked, rows, cols, "demo layer");
      if (!mask_status[t].ok()) return;
      src = masked;
    }
    for (size_t j = 0; j < jobs.size(); ++j) {
      if (static_cast<int64_t>(jobs[j].pattern) != t) continue;
      table[j] = EncodeAndCheck(src, rows, cols, p, jobs[j].format, jobs[j].dtype);
    }
  });
  for (const Status& st : mask_status) SPARQ_RETURN_IF_ERROR(st);

  const double dense_f32 = 4.0 * rows * cols, dense_bf16 = 2.0 * rows * cols;
  std::printf("%-20s %-6s %-6s %10s %8s %9s %7s %9s\n", "pattern", "format", "values",
              "stored MB", "vs f32", "vs bf16", "exact", "encode s");
  int failures = 0;
  for (const TableRow& r : table) {
    std::printf("%-20s %-6s %-6s %10.2f %8.3f %9.3f %7s %9.2f\n", r.pattern.c_str(),
                r.format.c_str(), r.values.c_str(), r.bytes / 1e6, r.bytes / dense_f32,
                r.bytes / dense_bf16, r.ok ? "yes" : "NO", r.encode_s);
    if (!r.ok) {
      std::fprintf(stderr, "  %s %s %s: %s\n", r.pattern.c_str(), r.format.c_str(),
                   r.values.c_str(), r.error.c_str());
      ++failures;
    }
  }
  if (failures) return Internal(std::to_string(failures) + " format round trips failed");
  return Status::Ok();
}

namespace {

struct DemoOptions {
  int64_t rows = kLlama7bMlpRows;
  int64_t cols = kLlama7bMlpCols;
  uint64_t seed = kDefaultSeed;
  int threads = 0;
  bool formats = false;
  std::string model;                  // default: $SPARQ_MODEL or the cache
  std::string calib, text;            // default: data/text/ (FindText)
  bool quick = false;
  int64_t calib_samples = 16, calib_len = 512;
  int64_t eval_tokens = 8192, ctx = 512;
  int64_t prompt = 512, decode = 32;
  int speed_repeats = 3;
  int64_t generate_tokens = 20;
};

// --quick: a real run of every stage (all 30 blocks pruned, perplexity, speed, generation), each
// cut short; the model load and the pruning of 210 layers remain most of its time.
constexpr int64_t kQuickCalibSamples = 4, kQuickCalibLen = 128;
constexpr int64_t kQuickEvalTokens = 1024, kQuickCtx = 256;
constexpr int64_t kQuickPrompt = 64, kQuickDecode = 8, kQuickGenerate = 8;
constexpr int kQuickSpeedRepeats = 1;

std::string CacheDir() {
  if (const char* c = std::getenv("SPARQ_CACHE"); c != nullptr && *c) return c;
  const char* h = std::getenv("HOME");
  return std::string(h != nullptr ? h : "/tmp") + "/.cache/sparq";
}

bool Exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

// `flag_value` if given, else data/text/<name> of the current folder, else of the checkout the
// executable sits in (build/<preset>/sparq -> <repo>/data/text).
Result<std::string> FindText(const std::string& flag_value, const std::string& name,
                             const char* flag) {
  if (!flag_value.empty()) {
    if (!Exists(flag_value)) return InvalidInput("demo: " + std::string(flag) + " " + flag_value +
                                                 ": no such file");
    return flag_value;
  }
  const std::string rel = "data/text/" + name;
  if (Exists(rel)) return rel;
  if (std::string near = FindNearExecutable(rel); !near.empty()) return near;
  return InvalidInput("demo: " + rel + " not found in the current folder nor in the checkout of "
                      "this sparq binary: run it from the repository root or name the file with " +
                      flag);
}

// The dense model with every linear layer and the head stored as dense bf16 (round to nearest
// even, as the pruned bf16 checkpoints store their kept values) and run through sparq's dense
// bf16 kernel: the row that separates what bf16 buys from what sparsity buys.
Status ToDenseBf16(LlamaModel& model) {
  LlamaWeights& w = model.mutable_weights();
  auto convert = [](LinearWeight& lw, const std::string& name) -> Status {
    const float* d = lw.dense_f32();
    if (d == nullptr) return Internal("demo: " + name + " is not dense f32 (" + lw.format() + ")");
    const int64_t rows = lw.rows(), cols = lw.cols();
    SPARQ_ASSIGN_OR_RETURN(SparseMatrix m,
                           Encode(std::span<const float>(d, static_cast<size_t>(rows * cols)),
                                  rows, cols, FormatKind::kDense, Pattern::Dense(), DType::kBF16));
    SPARQ_ASSIGN_OR_RETURN(lw, LinearWeight::FromMatrix(std::move(m), name, lw.config()));
    return Status::Ok();
  };
  for (size_t l = 0; l < w.blocks.size(); ++l) {
    for (int s = 0; s < kNumSlots; ++s) {
      SPARQ_RETURN_IF_ERROR(convert(w.blocks[l].linear[s],
                                    "blk." + std::to_string(l) + "." +
                                        std::string(SlotName(static_cast<LinearSlot>(s)))));
    }
  }
  return convert(w.output, "output");
}

struct DemoRow {
  std::string label, path;
  double ppl = 0, prune_s = 0;
  bool pruned = false;
  std::vector<double> dec, pre;
  uint64_t bytes = 0, linear_bytes = 0;
  std::string sentence;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

Status RunModelDemo(DemoOptions o, const KernelConfig& cfg) {
  const auto t0 = std::chrono::steady_clock::now();
  if (o.quick) {
    o.calib_samples = std::min(o.calib_samples, kQuickCalibSamples);
    o.calib_len = std::min(o.calib_len, kQuickCalibLen);
    o.eval_tokens = std::min(o.eval_tokens, kQuickEvalTokens);
    o.ctx = std::min(o.ctx, kQuickCtx);
    o.prompt = kQuickPrompt;
    o.decode = kQuickDecode;
    o.speed_repeats = kQuickSpeedRepeats;
    o.generate_tokens = kQuickGenerate;
  }
  if (o.calib_samples < 1 || o.calib_len < 2 || o.eval_tokens < 2 || o.ctx < 2) {
    return InvalidInput("demo: --calib-samples must be >= 1, --calib-len, --eval-tokens and --ctx "
                        ">= 2");
  }
  const int threads = o.threads > 0 ? o.threads : DefaultThreads();
  ThreadPool pool(threads);
  std::string model = o.model;
  if (model.empty()) {
    const char* m = std::getenv("SPARQ_MODEL");
    model = (m != nullptr && *m) ? m : CacheDir() + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  }
  if (!Exists(model)) {
    return InvalidInput(model + " not found: run scripts/fetch_model.sh (scripts/run_demo.sh does)");
  }
  SPARQ_ASSIGN_OR_RETURN(const std::string calib_path,
                         FindText(o.calib, "sherlock-holmes-pg1661.txt", "--calib"));
  SPARQ_ASSIGN_OR_RETURN(const std::string eval_path,
                         FindText(o.text, "wikitext-2-raw-test.txt", "--text"));
  SPARQ_ASSIGN_OR_RETURN(std::string calib, ReadTextFile(calib_path));
  SPARQ_ASSIGN_OR_RETURN(std::string eval_text, ReadTextFile(eval_path));
  // --quick keeps its checkpoints apart from the full run's.
  const std::string out_dir = CacheDir() + (o.quick ? "/demo-quick" : "/demo");
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return IoError("demo: cannot create " + out_dir + ": " + ec.message());
  std::printf("sparq demo%s: %s, %d threads\n", o.quick ? " --quick (every stage cut short)" : "",
              model.c_str(), threads);
  std::printf("calibration text: %s\nevaluation text:  %s\n", calib_path.c_str(),
              eval_path.c_str());
  std::printf("calibration: %lld x %lld tokens; perplexity: first %lld tokens, ctx %lld; "
              "checkpoints in %s\n\n",
              static_cast<long long>(o.calib_samples), static_cast<long long>(o.calib_len),
              static_cast<long long>(o.eval_tokens), static_cast<long long>(o.ctx),
              out_dir.c_str());
  // Row order: dense f32, dense bf16, then the pruned (bf16) models.
  constexpr size_t kDenseF32 = 0, kDenseBf16 = 1, kFirstPruned = 2;
  std::vector<DemoRow> rows(4);
  rows[kDenseF32].label = "dense (Q4_1 dequantized to f32)";
  rows[kDenseF32].path = model;
  rows[kDenseBf16].label = "dense, bf16 weights";
  rows[kDenseBf16].path = model;
  rows[2].label = "SparseGPT 50% unstructured, bf16";
  rows[2].path = out_dir + "/smollm2-sparsegpt-u50-bf16.sparq";
  rows[3].label = "SparseGPT 2:4, bf16";
  rows[3].path = out_dir + "/smollm2-sparsegpt-2of4-bf16.sparq";
  const char* kPrunedPatterns[2] = {"unstructured:0.5", "2:4"};
  for (size_t i = kFirstPruned; i < rows.size(); ++i) {
    ModelPruneOptions po;
    po.method = PruneMethod::kSparseGpt;
    SPARQ_ASSIGN_OR_RETURN(po.pattern, Pattern::Parse(kPrunedPatterns[i - kFirstPruned]));
    po.values.dtype = DType::kBF16;
    po.calib_samples = o.calib_samples;
    po.calib_len = o.calib_len;
    std::fprintf(stderr, "pruning: %s\n", rows[i].label.c_str());
    SPARQ_ASSIGN_OR_RETURN(ModelPruneResult r, PruneLlama(model, calib, po, rows[i].path, cfg, &pool));
    rows[i].prune_s = r.seconds;
    rows[i].pruned = true;
  }
  std::vector<LlamaModel> models;
  for (size_t i = 0; i < rows.size(); ++i) {
    SPARQ_ASSIGN_OR_RETURN(LlamaModel m, LlamaModel::Load(rows[i].path, cfg));
    if (i == kDenseBf16) SPARQ_RETURN_IF_ERROR(ToDenseBf16(m));
    rows[i].bytes = m.weight_bytes();
    rows[i].linear_bytes = m.block_linear_bytes();
    models.push_back(std::move(m));
  }
  SPARQ_ASSIGN_OR_RETURN(std::vector<int32_t> ids, models[0].tokenizer().Encode(eval_text));
  if (static_cast<int64_t>(ids.size()) > o.eval_tokens) ids.resize(o.eval_tokens);
  for (size_t i = 0; i < rows.size(); ++i) {
    std::fprintf(stderr, "perplexity: %s\n", rows[i].label.c_str());
    SPARQ_ASSIGN_OR_RETURN(PerplexityResult p, Perplexity(models[i], ids, o.ctx, &pool));
    rows[i].ppl = p.perplexity;
  }
  // Speed: interleaved repeats, medians.
  std::vector<int32_t> prompt(ids.begin(), ids.begin() + std::min<size_t>(ids.size(), o.prompt));
  std::fprintf(stderr, "speed: prefill %zu tokens, decode %lld tokens, %d interleaved run%s\n",
               prompt.size(), static_cast<long long>(o.decode), o.speed_repeats,
               o.speed_repeats == 1 ? "" : "s");
  for (int rep = 0; rep < o.speed_repeats; ++rep) {
    for (size_t i = 0; i < rows.size(); ++i) {
      SPARQ_ASSIGN_OR_RETURN(ModelSpeed s, MeasureSpeed(models[i], prompt, o.decode, &pool));
      rows[i].pre.push_back(s.prefill_tok_s());
      rows[i].dec.push_back(s.decode_tok_s());
    }
  }
  const std::string prompt_text = "The history of the city of London";
  SPARQ_ASSIGN_OR_RETURN(std::vector<int32_t> pids, models[0].tokenizer().Encode(prompt_text));
  for (size_t i = 0; i < rows.size(); ++i) {
    GenerateOptions g;
    g.max_new = o.generate_tokens;
    SPARQ_ASSIGN_OR_RETURN(GenerateResult gr, Generate(models[i], pids, g, &pool));
    std::string s = prompt_text + models[i].tokenizer().Decode(gr.tokens);
    for (char& ch : s) {
      if (ch == '\n') ch = ' ';
    }
    rows[i].sentence = s;
  }
  std::printf("%-34s %10s %10s %11s %11s %11s %9s\n", "model", "perplexity", "decode t/s",
              "prefill t/s", "weights MB", "linears MB", "prune s");
  for (const DemoRow& r : rows) {
    char prune[32] = "-";
    if (r.pruned) std::snprintf(prune, sizeof(prune), "%.1f", r.prune_s);
    std::printf("%-34s %10.3f %10.1f %11.1f %11.1f %11.1f %9s\n", r.label.c_str(), r.ppl,
                Median(r.dec), Median(r.pre), r.bytes / 1e6, r.linear_bytes / 1e6, prune);
  }
  auto ratios = [&](const DemoRow& r, const DemoRow& base) {
    std::printf("%s: perplexity x%.2f, decode x%.2f, prefill x%.2f, linear bytes x%.2f\n",
                r.label.c_str(), r.ppl / base.ppl, Median(r.dec) / Median(base.dec),
                Median(r.pre) / Median(base.pre),
                static_cast<double>(r.linear_bytes) / base.linear_bytes);
  };
  std::printf("\nwhat bf16 buys (vs dense f32): ");
  ratios(rows[kDenseBf16], rows[kDenseF32]);
  std::printf("what sparsity buys (vs dense bf16):\n");
  for (size_t i = kFirstPruned; i < rows.size(); ++i) {
    std::printf("  ");
    ratios(rows[i], rows[kDenseBf16]);
  }
  std::printf("(weights MB: everything the runtime holds for compute, incl. the embedding (f32 in "
              "memory) and the tied output head (bf16 in the bf16 rows); linears MB: the "
              "210 block linear layers, what pruning changes)\n\n");
  for (const DemoRow& r : rows) std::printf("%-34s \"%s\"\n", r.label.c_str(), r.sentence.c_str());
  std::printf("\ntotal %.1f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return Status::Ok();
}

Status RunFormatsDemo(const DemoOptions& o) {
  if (o.rows < 1 || o.cols < 1 || o.rows > (int64_t{1} << 20) || o.cols > (int64_t{1} << 20)) {
    return InvalidInput("demo: --rows and --cols must be in 1..1048576");
  }
  ThreadPool pool(o.threads > 0 ? o.threads : DefaultThreads());
  const auto t0 = std::chrono::steady_clock::now();
  std::printf("sparq demo: a %lld x %lld layer (the shape of a Llama-7B MLP weight), Gaussian "
              "values with std %.2f, seed %llu, %d threads\n\n",
              static_cast<long long>(o.rows), static_cast<long long>(o.cols), kInitStd,
              static_cast<unsigned long long>(o.seed), pool.num_threads());
  const std::vector<float> w = GaussianLayer(o.rows, o.cols, o.seed, pool);
  const std::vector<Pattern> patterns = {
      Pattern::NM(2, 4),          Pattern::NM(4, 8),           Pattern::NM(1, 4),
      Pattern::Unstructured(0.5), Pattern::Unstructured(0.7),  Pattern::Unstructured(0.9),
      Pattern::Block(16, 16, 0.5), Pattern::Block(16, 16, 0.9), Pattern::VNM(16, 2, 4),
      Pattern::Rows(0.3)};
  Status st = FormatsMemoryTable(w, o.rows, o.cols, patterns, pool);
  std::printf("\nvs f32 / vs bf16: stored bytes (values + indices/metadata) over the dense f32 /"
              " bf16 bytes of the same layer;\nexact: the format validated and decoded bit for bit"
              " to the masked layer rounded to the value type.\n");
  std::printf("total %.1f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return st;
}

Registrar reg("demo",
              "Prune SmolLM2-135M (SparseGPT 50% / 2:4) and compare perplexity, speed, bytes "
              "with the dense model in f32 and bf16; --formats: memory table of each format",
              [](CLI::App& sub) -> RunFn {
                auto o = std::make_shared<DemoOptions>();
                sub.add_option("--rows", o->rows, "rows of the generated layer (default 11008)");
                sub.add_option("--cols", o->cols, "columns of the generated layer (default 4096)");
                sub.add_option("--seed", o->seed, "seed of the generated values");
                sub.add_option("--threads", o->threads, "threads (default: SPARQ_NUM_THREADS or "
                                                        "all cores)");
                sub.add_flag("--formats", o->formats,
                             "Show the formats memory table of a Llama-7B-shaped layer instead");
                sub.add_option("--model", o->model, "Model (default: the cached SmolLM2 GGUF)");
                sub.add_option("--calib", o->calib,
                               "Calibration text (default: data/text/sherlock-holmes-pg1661.txt "
                               "of the current folder, else of this binary's checkout)");
                sub.add_option("--text", o->text,
                               "Evaluation text (default: data/text/wikitext-2-raw-test.txt, "
                               "found the same way)");
                sub.add_flag("--quick", o->quick,
                             "A short end-to-end run with the same table: at most 4 x 128 "
                             "calibration tokens, perplexity on 1024 tokens (ctx 256), speed from "
                             "one run of a 64-token prefill and 8 decode steps, 8 generated "
                             "tokens; every block is still pruned. Its checkpoints go to "
                             "<cache>/demo-quick");
                sub.add_option("--calib-samples", o->calib_samples, "Calibration segments")
                    ->capture_default_str();
                sub.add_option("--calib-len", o->calib_len, "Tokens per segment")
                    ->capture_default_str();
                sub.add_option("--eval-tokens", o->eval_tokens, "WikiText tokens for perplexity")
                    ->capture_default_str();
                sub.add_option("--ctx", o->ctx, "Perplexity window (tokens)")
                    ->capture_default_str();
                return [o](const KernelConfig& cfg) {
                  return o->formats ? RunFormatsDemo(*o) : RunModelDemo(*o, cfg);
                };
              });

}  // namespace
}  // namespace sparq::cli
