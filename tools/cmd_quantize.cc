// `sparq quantize MODEL --values int4:g64 [--quant-method gptq|rtn] [--no-act-order] --calib TEXT
// -o OUT.sparq`:
// weight-only quantization of a whole Llama model, `sparq prune` with the dense pattern
// (PruneLlama in sparq/model.h): every block linear is stored as a dense quantized matrix, its
// groups fitted by GPTQ (SparseGPT's sweep with no mask, block by block on calibration inputs) or
// rounded to nearest. A pruned .sparq (e.g. after `sparq finetune`) keeps its layers' patterns and
// masks: GPTQ then runs on the kept weights with the mask fixed.

#include <cstdio>

#include "sparq/atomic_write.h"
#include "sparq/model.h"
#include "tools/command.h"
#include "tools/quant_flags.h"
#include "tools/json_output.h"

namespace sparq::cli {
namespace {

struct QuantizeCliOptions {
  std::string model, calib, out, values = "int4:g64", quant_method = "gptq";
  std::string embedding_values;  // "": bf16
  int64_t embedding_int8_rows = 0;
  std::string include;
  int64_t calib_samples = 64, calib_len = 512, blocks = -1;
  double damp = 0.01;
  bool act_order = false, no_act_order = false;
  uint64_t seed = 0;
  int threads = 0;
  JsonOutput json;
};

Status RunQuantize(const QuantizeCliOptions& o, const KernelConfig& cfg) {
  ThreadPool pool(o.threads > 0 ? o.threads : DefaultThreads());
  ModelPruneOptions opt;
  opt.method = PruneMethod::kSparseGpt;
  opt.pattern = Pattern::Dense();
  SPARQ_ASSIGN_OR_RETURN(opt.values, ValueSpec::Parse(o.values));
  if (!opt.values.quantized()) {
    return InvalidInput("--values must be int8[:gN] or int4[:gN][:sym], not '" + o.values + "'");
  }
  SPARQ_RETURN_IF_ERROR(ApplyQuantFlags(o.embedding_values, o.quant_method, &opt));
  opt.embedding_int8_rows = o.embedding_int8_rows;
  opt.calib_samples = o.calib_samples;
  opt.calib_len = o.calib_len;
  opt.max_blocks = o.blocks;
  opt.damp = o.damp;
  opt.seed = o.seed;
  if (!o.include.empty()) opt.include = o.include;
  SPARQ_RETURN_IF_ERROR(ApplyActOrderFlags(o.act_order, o.no_act_order, &opt));
  SPARQ_ASSIGN_OR_RETURN(std::string text, ReadTextFile(o.calib));
  SPARQ_ASSIGN_OR_RETURN(ModelPruneResult r, PruneLlama(o.model, text, opt, o.out, cfg, &pool));
  SPARQ_RETURN_IF_ERROR(o.json.Write(r.ToJson(true)));
  if (o.json.to_stdout()) return Status::Ok();
  double err_sum = 0.0;
  for (const LayerPruneResult& l : r.layers) err_sum += l.report.rel_error;
  std::printf("quantized %zu layers (%s, %s) with %lld calibration tokens\n", r.layers.size(),
              opt.values.Name().c_str(), o.quant_method.c_str(),
              static_cast<long long>(r.calib_tokens));
  std::printf(
      "quantized layers: %.1f MB dense f32 -> %.1f MB stored (%.3fx); mean relative "
      "reconstruction error %.4f\n",
      r.dense_bytes / 1e6, r.stored_bytes / 1e6,
      r.dense_bytes > 0 ? r.stored_bytes / r.dense_bytes : 0.0,
      r.layers.empty() ? 0.0 : err_sum / static_cast<double>(r.layers.size()));
  std::printf("time: %.1f s total, %.1f s in the solver; wrote %s\n", r.seconds, r.prune_seconds,
              o.out.c_str());
  return Status::Ok();
}

Registrar reg(
    "quantize", "Quantize a whole model's weights (GPTQ or round to nearest) into a .sparq",
    [](CLI::App& sub) -> RunFn {
      auto o = std::make_shared<QuantizeCliOptions>();
      sub.add_option("model", o->model, "Model (.gguf, Hugging Face folder or .sparq; a pruned .sparq keeps its masks)")
          ->required();
      sub.add_option("--values", o->values,
                     "Stored values: int8[:gN] | int4[:gN][:sym] (N = 32, 64, 128)")
          ->capture_default_str();
      sub.add_option("--quant-method", o->quant_method,
                     "gptq (errors fed to the columns not yet quantized, on calibration inputs) "
                     "| rtn (round to nearest)")
          ->capture_default_str();
      sub.add_option("--embedding-values", o->embedding_values,
                     "Token embedding (the tied head): f32 | bf16 | f16 | int8[:gN] | "
                     "int4[:gN][:sym], quantized as the head by --quant-method (default: the GGUF's "
                     "own Q8_0 / Q4_0 / Q4_1 grid where it stores the embedding so, else bf16)");
      sub.add_option("--embedding-int8-rows", o->embedding_int8_rows,
                     "With an int4 --embedding-values: also store the rows of the K most frequent "
                     "calibration tokens in int8:g32 (the head reads them there; 2048 on "
                     "SmolLM2: +1.3 MB, half of the int4 head's perplexity cost)")
          ->capture_default_str();
      sub.add_option("--calib", o->calib, "Calibration text (UTF-8)")->required();
      sub.add_option("--calib-samples", o->calib_samples, "Calibration segments")
          ->capture_default_str()
          ->check(CLI::Range(int64_t{1}, int64_t{4096}));
      sub.add_option("--calib-len", o->calib_len, "Tokens per segment")
          ->capture_default_str()
          ->check(CLI::Range(int64_t{1}, int64_t{8192}));
      sub.add_option("--include", o->include,
                     "Regex over layer names to quantize (default: all block linears)");
      sub.add_option("--blocks", o->blocks, "Quantize only the first N blocks (-1: all)");
      sub.add_option("--damp", o->damp, "GPTQ dampening (fraction of mean diag H)")
          ->capture_default_str();
      sub.add_flag("--act-order", o->act_order,
                   "GPTQ in order of decreasing input energy (H_jj), groups fitted before the "
                   "sweep on the given weights (static groups); the default with gptq");
      sub.add_flag("--no-act-order", o->no_act_order, "GPTQ in column order");
      sub.add_option("--seed", o->seed, "Calibration sampling seed")->capture_default_str();
      sub.add_option("--threads", o->threads, "Threads");
      o->json.Register(sub, "the report (with timings)");
      sub.add_option("-o,--output", o->out, "Output .sparq")->required();
      return [o](const KernelConfig& cfg) { return RunQuantize(*o, cfg); };
    });

}  // namespace
}  // namespace sparq::cli
