// `sparq prune MODEL --method ... --pattern ... --calib TEXT -o OUT.sparq`: sequential calibration
// and one-shot pruning of a whole Llama model (PruneLlama in sparq/model.h).

#include <cstdio>

#include "sparq/model.h"
#include "sparq/atomic_write.h"
#include "tools/command.h"
#include "tools/quant_flags.h"
#include "tools/json_output.h"

namespace sparq::cli {
namespace {

struct PruneCliOptions {
  std::string model, method = "sparsegpt", pattern = "unstructured:0.5", calib, out, values = "f32";
  std::string quant_method = "gptq";
  std::string allocation = "uniform";
  double owl_lambda = 0.08, owl_threshold = 5.0;
  std::string embedding_values;  // "": follow --values
  int64_t embedding_int8_rows = 0;
  std::string include, report;
  int64_t calib_samples = 64, calib_len = 512, blocks = -1, permute_work = kDefaultPermuteWork;
  double damp = 0.01;
  uint64_t seed = 0;
  int threads = 0;
  bool permute = false;
  bool act_order = false, no_act_order = false;
  JsonOutput json;
};

Status RunPrune(const PruneCliOptions& o, const KernelConfig& cfg) {
  const int threads = o.threads > 0 ? o.threads : DefaultThreads();
  ThreadPool pool(threads);
  ModelPruneOptions opt;
  SPARQ_ASSIGN_OR_RETURN(opt.method, ParsePruneMethod(o.method));
  SPARQ_ASSIGN_OR_RETURN(opt.pattern, Pattern::Parse(o.pattern));
  SPARQ_ASSIGN_OR_RETURN(opt.values, ValueSpec::Parse(o.values));
  SPARQ_RETURN_IF_ERROR(ApplyQuantFlags(o.embedding_values, o.quant_method, &opt));
  opt.embedding_int8_rows = o.embedding_int8_rows;
  if (o.allocation == "owl") {
    opt.allocation = ModelPruneOptions::Allocation::kOwl;
  } else if (o.allocation != "uniform") {
    return InvalidInput("--allocation must be uniform or owl, not '" + o.allocation + "'");
  }
  opt.owl_lambda = o.owl_lambda;
  opt.owl_threshold = o.owl_threshold;
  opt.permute = o.permute;
  opt.permute_max_work = o.permute_work;
  opt.calib_samples = o.calib_samples;
  opt.calib_len = o.calib_len;
  opt.max_blocks = o.blocks;
  opt.damp = o.damp;
  opt.seed = o.seed;
  if (!o.include.empty()) opt.include = o.include;
  SPARQ_RETURN_IF_ERROR(ApplyActOrderFlags(o.act_order, o.no_act_order, &opt));
  SPARQ_ASSIGN_OR_RETURN(std::string text, ReadTextFile(o.calib));
  SPARQ_ASSIGN_OR_RETURN(ModelPruneResult r, PruneLlama(o.model, text, opt, o.out, cfg, &pool));
  if (!o.report.empty()) {
    const std::string text = r.ToJson(true) + "\n";
    io::AtomicWriter wr;
    SPARQ_RETURN_IF_ERROR(wr.Open(o.report));
    SPARQ_RETURN_IF_ERROR(wr.Write(text.data(), text.size()));
    SPARQ_RETURN_IF_ERROR(wr.Commit());
  }
  SPARQ_RETURN_IF_ERROR(o.json.Write(r.ToJson(true)));
  if (o.json.to_stdout()) return Status::Ok();
  double err_sum = 0.0;
  for (const LayerPruneResult& l : r.layers) err_sum += l.report.rel_error;
  std::printf("pruned %zu layers (%s, %s, %s values%s) with %lld calibration tokens\n",
              r.layers.size(), o.method.c_str(), opt.pattern.ToString().c_str(), opt.values.Name().c_str(),
              o.permute ? ", permuted" : "", static_cast<long long>(r.calib_tokens));
  std::printf("pruned layers: %.1f MB dense f32 -> %.1f MB stored (%.3fx); mean relative "
              "reconstruction error %.4f\n",
              r.dense_bytes / 1e6, r.stored_bytes / 1e6,
              r.dense_bytes > 0 ? r.stored_bytes / r.dense_bytes : 0.0,
              r.layers.empty() ? 0.0 : err_sum / static_cast<double>(r.layers.size()));
  std::printf("time: %.1f s total, %.1f s in the pruning solver; wrote %s\n", r.seconds,
              r.prune_seconds, o.out.c_str());
  return Status::Ok();
}

Registrar reg("prune", "Calibrate and prune a whole model (GGUF) into a .sparq checkpoint",
              [](CLI::App& sub) -> RunFn {
                auto o = std::make_shared<PruneCliOptions>();
                sub.add_option("model", o->model, "Dense model (.gguf)")->required();
                sub.add_option("--method", o->method, "sparsegpt | wanda | magnitude")
                    ->capture_default_str();
                sub.add_option(
                       "--pattern", o->pattern,
                       "2:4 | 4:8 | unstructured:0.5 | vnm:8:2:4 | block:16x16:0.5 | dense ...")
                    ->capture_default_str();
                sub.add_option("--calib", o->calib, "Calibration text (UTF-8)")->required();
                sub.add_option("--calib-samples", o->calib_samples, "Calibration segments")
                    ->capture_default_str()
                    ->check(CLI::Range(int64_t{1}, int64_t{4096}));
                sub.add_option("--calib-len", o->calib_len, "Tokens per segment")
                    ->capture_default_str()
                    ->check(CLI::Range(int64_t{1}, int64_t{8192}));
                sub.add_option(
                       "--values,--dtype", o->values,
                       "Stored values: f32 | bf16 | f16 | int8[:gN] | int4[:gN][:sym] (N = 32, "
                       "64, 128; quantized: N:M, dense, unstructured, rows, cols)")
                    ->capture_default_str();
                sub.add_option("--embedding-values", o->embedding_values,
                               "Token embedding (the tied head): f32 | bf16 | f16 | int8[:gN] | "
                               "int4[:gN][:sym], quantized as the tied head by --quant-method "
                               "(default: as --values; when quantized, the GGUF's own Q8_0 / Q4_0 / Q4_1 "
                               "grid where it stores the embedding so (kept bit for bit), else bf16)");
                sub.add_option("--embedding-int8-rows", o->embedding_int8_rows,
                               "With an int4 --embedding-values: also store the rows of the K "
                               "most frequent calibration tokens in int8:g32 (the head reads "
                               "them there; 2048 on SmolLM2: +1.3 MB, half of the int4 head's "
                               "perplexity cost)")
                    ->capture_default_str();
                sub.add_option("--quant-method", o->quant_method,
                               "Quantized values: gptq (in SparseGPT's sweep) | rtn (after)")
                    ->capture_default_str();
                sub.add_option("--allocation", o->allocation,
                               "Unstructured sparsity per block: uniform | owl (denser blocks "
                               "where the dense model has more outlier weights; same mean)")
                    ->capture_default_str();
                sub.add_option("--owl-lambda", o->owl_lambda,
                               "OWL: largest change of a block's sparsity from the target")
                    ->capture_default_str()
                    ->check(CLI::Range(0.0, 0.5));
                sub.add_option("--owl-threshold", o->owl_threshold,
                               "OWL: an outlier's score is above this many times its block's mean")
                    ->capture_default_str()
                    ->check(CLI::Range(1.0, 1000.0));
                sub.add_flag("--permute", o->permute, "Channel permutation (N:M, V:N:M)");
                sub.add_flag("--act-order", o->act_order,
                             "With int8 / int4 values (GPTQ): prune with SparseGPT in f32 first, "
                             "then quantize the kept weights with the masks fixed, inputs in order "
                             "of decreasing H_jj (static groups). The default wherever it applies "
                             "(SparseGPT or a dense pattern, GPTQ, no --permute); given, it "
                             "refuses where it does not");
                sub.add_flag("--no-act-order", o->no_act_order,
                             "With int8 / int4 values: GPTQ in column order (SparseGPT's joint "
                             "sweep for a pattern)");
                sub.add_option("--permute-work", o->permute_work,
                               "Work bound of the permutation search per layer: candidate swaps x "
                               "rows scored (the same on every machine, so reruns are identical)")
                    ->capture_default_str()
                    ->check(CLI::Range(int64_t{1}, int64_t{1} << 50));
                sub.add_option("--include", o->include,
                               "Regex over layer names to prune (default: all block linears)");
                sub.add_option("--blocks", o->blocks, "Prune only the first N blocks (-1: all)");
                sub.add_option("--damp", o->damp, "SparseGPT dampening (fraction of mean diag H)")
                    ->capture_default_str();
                sub.add_option("--seed", o->seed, "Calibration sampling seed")
                    ->capture_default_str();
                sub.add_option("--threads", o->threads, "Threads");
                sub.add_option("--report", o->report,
                               "Write the JSON report (with timings) to FILE (as --json FILE)");
                o->json.Register(sub, "the report (with timings)");
                sub.add_option("-o,--output", o->out, "Output .sparq")->required();
                return [o](const KernelConfig& cfg) { return RunPrune(*o, cfg); };
              });

}  // namespace
}  // namespace sparq::cli
