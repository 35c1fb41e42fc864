// `sparq prune-layer`: prune one linear layer given as .npy files (for users with their own
// framework, and for our tests). Also the hidden `sparq prune-layer-synth`, which writes the
// synthetic correlated layer used by docs/pruning.md.

#include <chrono>
#include <cstdio>
#include <string>

#include "sparq/npy.h"
#include "sparq/prune.h"
#include "sparq/atomic_write.h"
#include "sparq/synthetic.h"
#include "tools/command.h"


namespace sparq::cli {
namespace {

// Rows of X fed to the accumulator per call (a calibration stream would do the same).
constexpr int64_t kChunkRows = 512;

struct Flags {
  std::string weight, inputs, hessian, method = "sparsegpt", pattern, out, report, perm_out;
  bool permute = false, per_row_mask = false, skip_error = false;
  double damp = 0.01, permute_budget = 10.0;
  int64_t blocksize = 128, permute_work = 0;
  int threads = 0;
};

Status WriteText(const std::string& path, const std::string& text) {
  io::AtomicWriter wr;
  SPARQ_RETURN_IF_ERROR(wr.Open(path));
  SPARQ_RETURN_IF_ERROR(wr.Write(text.data(), text.size()));
  return wr.Commit();
}

Status Run(const Flags& f) {
  if (f.inputs.empty() == f.hessian.empty() && f.method != "magnitude") {
    return InvalidInput("prune-layer: give exactly one of --inputs X.npy or --hessian H.npy");
  }
  if (!f.inputs.empty() && !f.hessian.empty()) {
    return InvalidInput("prune-layer: --inputs and --hessian are exclusive");
  }
  SPARQ_ASSIGN_OR_RETURN(PruneMethod method, ParsePruneMethod(f.method));
  SPARQ_ASSIGN_OR_RETURN(Pattern pattern, Pattern::Parse(f.pattern));
  const int threads = f.threads > 0 ? f.threads : DefaultThreads();
  ThreadPool pool(threads);

  SPARQ_ASSIGN_OR_RETURN(Tensor w, ReadNpyF32(f.weight));
  if (w.rank() != 2) {
    return InvalidInput(f.weight + ": weight must be 2-D [m, k], got shape " + w.ShapeString());
  }
  const int64_t m = w.dim(0), k = w.dim(1);
  std::vector<double> h;
  int64_t samples = 0;
  double hessian_seconds = 0;
  if (!f.inputs.empty()) {
    SPARQ_ASSIGN_OR_RETURN(Tensor x, ReadNpyF32(f.inputs));
    if (x.rank() != 2 || x.dim(1) != k) {
      return InvalidInput(f.inputs + ": inputs must be [N, " + std::to_string(k) + "], got " +
                          x.ShapeString());
    }
    const auto t0 = std::chrono::steady_clock::now();
    HessianAccumulator acc(k);
    const float* xd = x.data_as<float>();
    for (int64_t r0 = 0; r0 < x.dim(0); r0 += kChunkRows) {
      const int64_t nr = std::min(kChunkRows, x.dim(0) - r0);
      SPARQ_RETURN_IF_ERROR(acc.Add(xd + r0 * k, nr, k, &pool, f.inputs));
    }
    if (acc.num_samples() == 0) return InvalidInput(f.inputs + ": has no rows");
    samples = acc.num_samples();
    h = acc.Hessian();
    hessian_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } else if (!f.hessian.empty()) {
    std::vector<int64_t> shape;
    SPARQ_ASSIGN_OR_RETURN(h, ReadNpyF64(f.hessian, &shape));
    if (shape.size() != 2 || shape[0] != k || shape[1] != k) {
      return InvalidInput(f.hessian + ": Hessian must be [" + std::to_string(k) + ", " +
                          std::to_string(k) + "] to match " + f.weight);
    }
  }

  PruneOptions opt;
  opt.method = method;
  opt.damp = f.damp;
  opt.blocksize = f.blocksize;
  opt.per_row_mask = f.per_row_mask;
  opt.compute_error = !f.skip_error;
  opt.permute = f.permute;
  opt.permute_time_budget_s = f.permute_budget;
  opt.permute_max_work = f.permute_work;
  opt.pool = &pool;
  opt.what = f.weight;
  float* wd = w.mutable_data_as<float>();
  SPARQ_ASSIGN_OR_RETURN(PruneReport rep,
                         Prune(std::span<float>(wd, static_cast<size_t>(m * k)), m, k, h, pattern, opt));
  SPARQ_RETURN_IF_ERROR(WriteNpy(f.out, w));
  if (!f.perm_out.empty()) {
    if (rep.permutation.empty()) return InvalidInput("--perm-out needs --permute");
    SPARQ_RETURN_IF_ERROR(
        WriteNpy(f.perm_out, rep.permutation.data(), {static_cast<int64_t>(rep.permutation.size())}));
  }
  if (!f.report.empty()) {
    std::string json = rep.ToJson();
    // Add where the data came from (a flat JSON object: insert before the closing brace).
    const std::string src = ",\n  \"weight\": \"" + f.weight + "\",\n  \"calibration_rows\": " +
                            std::to_string(samples) + ",\n  \"hessian_seconds\": " +
                            std::to_string(hessian_seconds) + ",\n  \"threads\": " +
                            std::to_string(threads) + "\n}";
    json.replace(json.rfind("\n}"), 2, src);
    SPARQ_RETURN_IF_ERROR(WriteText(f.report, json + "\n"));
  }
  std::printf("%s %s: %lld x %lld, sparsity %.4f, rel error %s, %.2f s (cpu %.2f s; error %.2f s)%s\n",
              rep.method.c_str(), rep.pattern.c_str(), static_cast<long long>(m),
              static_cast<long long>(k), rep.sparsity,
              rep.rel_error >= 0 ? std::to_string(rep.rel_error).c_str() : "n/a", rep.seconds,
              rep.cpu_seconds, rep.error_seconds,
              rep.permutation.empty()
                  ? ""
                  : (", permuted: kept saliency " + std::to_string(rep.saliency_kept_identity) +
                     " -> " + std::to_string(rep.saliency_kept_permuted) + " (" +
                     std::to_string(rep.permute_evals) + " swaps evaluated" +
                     (rep.permute_stopped_early ? ", stopped at its bound)" : ")"))
                        .c_str());
  if (rep.method == "sparsegpt") {
    std::printf("sparsegpt phases: Cholesky factor of H^-1 %.2f s, batched sgemm updates %.2f s, "
                "rest (column sweeps, masks, copies) %.2f s\n",
                rep.factor_seconds, rep.update_seconds,
                rep.seconds - rep.factor_seconds - rep.update_seconds);
  }
  if (samples > 0) {
    std::printf("H = X^T X / N from %lld rows: %.2f s\n", static_cast<long long>(samples),
                hessian_seconds);
  }
  if (rep.damp_retries > 0) {
    std::printf("note: Cholesky needed %d damping retries (damp %.3g)\n", rep.damp_retries,
                rep.damp_used);
  }
  return Status::Ok();
}

Registrar reg("prune-layer", "Prune one linear layer (.npy in, .npy out) with calibration data",
              [](CLI::App& sub) -> RunFn {
                auto f = std::make_shared<Flags>();
                sub.add_option("--weight", f->weight, "W.npy, f32/f64 [m, k]")->required();
                sub.add_option("--inputs", f->inputs, "X.npy, calibration inputs [N, k] (rows = tokens)");
                sub.add_option("--hessian", f->hessian, "H.npy, [k, k] (instead of --inputs)");
                sub.add_option("--method", f->method, "magnitude | wanda | sparsegpt")
                    ->default_val("sparsegpt");
                sub.add_option("--pattern", f->pattern,
                               "2:4, 4:8, unstructured:0.5, unstructured-row:0.5, block:16x16:0.5, "
                               "vnm:8:2:4, rows:0.3, cols:0.3")
                    ->required();
                sub.add_flag("--permute", f->permute, "channel permutation search (N:M, V:N:M)");
                sub.add_option("--permute-budget", f->permute_budget,
                               "seconds for the search (0: no clock)")
                    ->default_val(10.0);
                sub.add_option("--permute-work", f->permute_work,
                               "bound on the search's work, candidate swaps x rows scored, the "
                               "same on every machine (0: none)")
                    ->default_val(0);
                sub.add_option("--perm-out", f->perm_out, "write the permutation as int32 .npy");
                sub.add_option("--damp", f->damp, "SparseGPT dampening, fraction of mean diag(H)")
                    ->default_val(0.01);
                sub.add_option("--blocksize", f->blocksize, "SparseGPT column block")
                    ->default_val(128);
                sub.add_flag("--per-row-mask", f->per_row_mask,
                             "SparseGPT unstructured: choose the mask per row, not per block");
                sub.add_flag("--skip-error", f->skip_error,
                             "do not compute the reconstruction error (saves two m x k x k dgemms)");
                sub.add_option("--threads", f->threads, "threads (default: SPARQ_NUM_THREADS or all)");
                sub.add_option("-o,--output", f->out, "Wp.npy (pruned weight, original column order)")
                    ->required();
                sub.add_option("--report", f->report, "report.json");
                return [f](const KernelConfig&) { return Run(*f); };
              });

struct SynthFlags {
  int64_t m = 4096, k = 4096, n = 2048;
  uint64_t seed = 1;
  std::string weight, inputs;
};

Registrar reg_synth(
    "prune-layer-synth", "(hidden) write a synthetic correlated layer: W.npy and X.npy",
    [](CLI::App& sub) -> RunFn {
      sub.group("");  // hidden from --help
      auto f = std::make_shared<SynthFlags>();
      sub.add_option("--m", f->m)->default_val(4096);
      sub.add_option("--k", f->k)->default_val(4096);
      sub.add_option("--n", f->n, "calibration rows")->default_val(2048);
      sub.add_option("--seed", f->seed)->default_val(1);
      sub.add_option("--weight", f->weight)->required();
      sub.add_option("--inputs", f->inputs)->required();
      return [f](const KernelConfig&) -> Status {
        if (f->m < 1 || f->k < 1 || f->n < 1 || f->m * f->k > (int64_t{1} << 30) ||
            f->n * f->k > (int64_t{1} << 30)) {
          return InvalidInput("prune-layer-synth: sizes must be >= 1 and below 2^30 elements");
        }
        auto w = SyntheticWeights(f->m, f->k, f->seed);
        SPARQ_RETURN_IF_ERROR(WriteNpy(f->weight, w.data(), {f->m, f->k}));
        auto x = SyntheticInputs(f->n, f->k, f->seed);
        SPARQ_RETURN_IF_ERROR(WriteNpy(f->inputs, x.data(), {f->n, f->k}));
        std::printf("wrote %s [%lld, %lld] and %s [%lld, %lld]\n", f->weight.c_str(),
                    static_cast<long long>(f->m), static_cast<long long>(f->k), f->inputs.c_str(),
                    static_cast<long long>(f->n), static_cast<long long>(f->k));
        return Status::Ok();
      };
    });

}  // namespace
}  // namespace sparq::cli
