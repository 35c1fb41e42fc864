// One-shot pruning of linear layers with calibration data: magnitude, Wanda and SparseGPT, for
// every pattern of pattern.h, plus channel permutations for N:M, per-layer sparsity allocation
// (explicit lists and OWL) and the cubic gradual schedule.
//
// Shapes (as everywhere in sparq): a weight W[m, k] row-major f32 is used as Y[n, m] = X[n, k] W^T;
// m = output channels (rows), k = input channels (columns), n = tokens. Calibration inputs X are the
// layer's inputs, rows = tokens. H = X^T X / N is [k, k], double, symmetric.
//
// Typical use by the model runtime, one transformer block at a time (q/k/v share one input, so one
// accumulator serves all three; gate/up likewise):
//
//   HessianAccumulator acc(k);
//   for (chunk of calibration activations) SPARQ_RETURN_IF_ERROR(acc.Add(x, rows, k, &pool));
//   PruneOptions opt; opt.method = PruneMethod::kSparseGpt; opt.pool = &pool;
//   for (W of q, k, v) SPARQ_ASSIGN_OR_RETURN(PruneReport r, Prune(W, m, k, acc, pattern, opt));
//
// Threads: `pool` parallelizes row-independent loops (each row's output is written by one task) and
// the dense products, which run as a fixed grid of output tiles, each one single-threaded OpenBLAS
// call (OpenBLAS is pinned to one thread meanwhile and its count restored after; SparseGPT's
// factorization likewise runs on one OpenBLAS thread). OpenBLAS's own threading changes the bits of
// its sgemm (Haswell, Zen kernels), dgemm and dsyrk (SkylakeX kernels), dpotrf and dtrtri, so
// nothing here relies on it: results are bitwise identical for any pool size and any OpenBLAS
// thread count, on every CPU. Checked by tests that flip openblas_set_num_threads between 1 and 2.
// Same inputs, same call: bitwise identical output.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sparq/pattern.h"
#include "sparq/quant.h"
#include "sparq/status.h"
#include "sparq/thread_pool.h"

namespace sparq {

enum class PruneMethod : uint8_t { kMagnitude, kWanda, kSparseGpt };
Result<PruneMethod> ParsePruneMethod(std::string_view name);  // "magnitude" | "wanda" | "sparsegpt"
std::string_view PruneMethodName(PruneMethod m);

// ---- calibration statistics -------------------------------------------------------------------

// Accumulates sum(X^T X) over streamed chunks of activations in double (one dsyrk per chunk), so a
// caller never holds all of X. Not thread-safe (one Add at a time); Add itself is parallel.
class HessianAccumulator {
 public:
  explicit HessianAccumulator(int64_t k);

  // x: [rows, k] row-major f32 (rows = tokens). Rejects k mismatch and NaN/Inf (naming the row and
  // column); `what` names the input in messages. rows == 0 is a no-op.
  Status Add(const float* x, int64_t rows, int64_t k, ThreadPool* pool = nullptr,
             const std::string& what = "inputs");

  int64_t k() const { return k_; }
  int64_t num_samples() const { return n_; }
  // H = X^T X / N, full symmetric [k, k] row-major (zeros if no sample was added).
  std::vector<double> Hessian() const;
  // Wanda's per-column input norms ||X_j||_2 = sqrt(sum_n x_nj^2) = sqrt(N * H_jj).
  std::vector<double> ColumnNorms() const;

 private:
  int64_t k_;
  int64_t n_ = 0;
  std::vector<double> sum_;  // upper triangle maintained by dsyrk; mirrored on read
  std::vector<double> scratch_;
};

// Wanda's column norms from a Hessian alone (any positive scale gives the same masks):
// sqrt(max(H_jj, 0)) * sqrt(num_samples).
std::vector<double> ColumnNormsFromHessian(std::span<const double> h, int64_t k,
                                           int64_t num_samples = 1);

// Checks H: k*k finite values, symmetric (to a relative 1e-6), non-negative diagonal. The message
// names `what` and the first offending position.
Status ValidateHessian(std::span<const double> h, int64_t k, const std::string& what = "hessian");

// Relative reconstruction error tr(dW H dW^T) / tr(W H W^T), dW = W - W', computed with dgemm
// over row panels and summed in double: equals ||X W^T - X W'^T||_F^2 / ||X W^T||_F^2 when
// H = X^T X / N. Returns 0 when tr(W H W^T) == 0 and dW H dW^T == 0, +Inf if only the latter
// is nonzero. pool (optional) runs the dgemm tiles; the result does not depend on it.
double ReconstructionError(std::span<const float> w, std::span<const float> w_pruned, int64_t m,
                           int64_t k, std::span<const double> h, ThreadPool* pool = nullptr);

// ---- quantize-while-pruning hook ---------------------------------------------------------------

// GPTQ-style joint pruning and quantization: SparseGPT calls Quantize on every kept weight after its
// error-compensated value is known, and propagates the quantization error to the not yet processed
// columns exactly like the pruning error. Pruned weights stay exactly 0 and are never passed.
// Magnitude and Wanda apply it once after masking (round to nearest, no feedback).
//
// Rows are processed in parallel, so the callbacks must be safe to call concurrently for different
// rows; within one row, calls come in increasing column order. For group-wise scales (GPTQ's
// groups along k) return group_size() > 0 (dense columns per group): before the first column of
// each group, FitGroup(row, col, w, keep, len) receives the row's current (error-compensated)
// weights of that group and which of them are kept, so the scale can be fitted lazily as GPTQ does.
// When the group is a multiple of M, SparseGPT passes the N:M / V:N:M masks the group's weights
// would choose at its start (the final masks are chosen M columns at a time as usual, so a few
// may differ); it rounds its block size up to a multiple of group_size() so a group never
// straddles two blocks.
class Quantizer {
 public:
  virtual ~Quantizer() = default;
  // Grid value for weight w at (row, col).
  virtual float Quantize(int64_t row, int64_t col, float w) const = 0;
  virtual int64_t group_size() const { return 0; }
  virtual void FitGroup(int64_t row, int64_t col, const float* w, const uint8_t* keep,
                        int64_t len) {}
};

// The quantizer of sparq's stored values (sparq/quant.h): groups of spec.group kept values of a
// row, i.e. spec.group * M / N dense columns of an N:M pattern (spec.group columns when dense,
// and for the patterns stored as CSR, whose groups are column ranges: format.h CsrMatrix);
// each group's f16 scale (and min) is fitted by round to nearest on its kept weights when the
// sweep reaches it, and Quantize returns the nearest value of that grid. The fitted groups are
// what NmMatrix::Quantize takes, so the stored codes reproduce the swept weights exactly.
class GroupQuantizer : public Quantizer {
 public:
  // An error if spec is not quantized or the pattern is not dense, unstructured, rows, cols, or
  // N:M or V:N:M with N dividing spec.group.
  static Result<GroupQuantizer> Make(const ValueSpec& spec, const Pattern& p, int64_t rows,
                                     int64_t cols);
  float Quantize(int64_t row, int64_t col, float w) const override;
  int64_t group_size() const override { return dense_group_; }
  void FitGroup(int64_t row, int64_t col, const float* w, const uint8_t* keep,
                int64_t len) override;
  // [rows * groups_per_row()], row-major; groups never reached keep scale 0.
  const std::vector<QuantGroup>& groups() const { return groups_; }
  int64_t groups_per_row() const { return per_row_; }
  // Unstructured, rows and cols patterns: the mask the pruning applied, [rows * cols] row-major
  // (1 = kept), as FitGroup received it (these masks are final before the sweep reaches a group).
  // Kept weights that round to 0 are still kept: CsrMatrix::FromDenseMasked stores this mask.
  // Empty for the other patterns.
  const std::vector<uint8_t>& kept() const { return kept_; }
  // The first fit that failed (a scale beyond f16), naming its row and group; ok otherwise.
  Status status() const;

 private:
  ValueSpec spec_;
  int64_t dense_group_ = 0, per_row_ = 0, cols_ = 0;
  std::vector<QuantGroup> groups_;
  std::vector<uint8_t> kept_;
  std::vector<std::string> errors_;  // per row, empty if fine
};

// ---- one-layer pruning -------------------------------------------------------------------------

struct PruneOptions {
  PruneMethod method = PruneMethod::kSparseGpt;
  // SparseGPT dampening: lambda = damp * mean(diag H) added to the diagonal.
  double damp = 0.01;
  // If the Cholesky factorization fails, retry with damp *= 10 up to this many times (reported).
  int max_damp_retries = 4;
  // SparseGPT column block (lazy batched updates); rounded up to a multiple of M (N:M, V:N:M), of
  // bw (blocks) and of the quantizer's group size.
  int64_t blocksize = 128;
  // SparseGPT, unstructured per-layer sparsity: choose the mask per block of `blocksize` columns over
  // all m x blocksize scores (false, the paper's adaptive mask) or separately in each row (true,
  // every row then has the same sparsity to within one element).
  bool per_row_mask = false;
  // Channel permutation for N:M and V:N:M (see FindPermutation): W is pruned in permuted column
  // order and returned in the ORIGINAL order, so Y = X W'^T holds without permuting X; the chosen
  // permutation is in the report (the runtime may still permute to get contiguous groups).
  bool permute = false;
  double permute_time_budget_s = 10.0;
  int64_t permute_max_rounds = 1 << 30;
  int64_t permute_max_work = 0;  // see PermuteOptions::max_work
  Quantizer* quantizer = nullptr;
  // A mask to keep instead of choosing one (m * k entries, 1 = kept; empty: choose by `method`).
  // SparseGPT then sweeps with these weights kept (the quantizer, if any, fitted on them: GPTQ
  // on an already pruned weight); magnitude and Wanda zero the others. `pattern` must hold for
  // it (checked), and it rules out `permute`. Re-quantizing a fine-tuned sparse model uses it.
  std::span<const uint8_t> fixed_mask;
  // GPTQ's act-order (Frantar et al. 2022, "desc_act"): SparseGPT sweeps the columns in order of
  // decreasing H_jj, so the inputs with the most energy are quantized first and the others absorb
  // their error. The quantizer's groups stay column ranges of the original order (what the stored
  // formats hold), so they are fitted before the sweep on the weights as given ("static groups").
  // Needs SparseGPT with a quantizer, and a dense pattern or a fixed mask: the N:M and
  // unstructured masks are chosen in column order as the sweep reaches them.
  bool act_order = false;
  ThreadPool* pool = nullptr;  // null: single-threaded row loops
  // Compute ReconstructionError for the report (costs two m x k x k dgemms).
  bool compute_error = true;
  std::string what = "weight";  // names the tensor in messages
};

struct PruneReport {
  std::string method, pattern;
  int64_t m = 0, k = 0;
  int64_t zeros = 0;          // exact zeros in W' (includes weights that were already 0)
  int64_t pruned = 0;         // entries the mask removed
  double sparsity = 0.0;      // zeros / (m * k)
  double rel_error = -1.0;    // ReconstructionError, or -1 if not computed / no Hessian
  double seconds = 0.0;       // pruning time (not counting rel_error), wall clock
  double cpu_seconds = 0.0;   // process CPU time (all threads) during the pruning: on a loaded
                              // machine, wall time / cpu time shows how much CPU the run got
  double error_seconds = 0.0;
  double factor_seconds = 0.0;  // SparseGPT: damping + Cholesky factor of H^-1 (part of seconds)
  double update_seconds = 0.0;  // SparseGPT: the batched sgemm updates (part of seconds)
  double damp_used = 0.0;     // SparseGPT: the damp fraction that succeeded
  int damp_retries = 0;
  int64_t dead_inputs = 0;    // columns with H_jj == 0 (their weights are zeroed by SparseGPT)
  std::vector<int32_t> permutation;  // if permuted: permuted column j = original column perm[j]
  double saliency_kept_identity = 0.0, saliency_kept_permuted = 0.0;
  int64_t permute_evals = 0;         // candidate swaps the permutation search evaluated
  bool permute_stopped_early = false;  // it hit its evaluation or time bound
  std::string ToJson() const;
};

// Prunes W (f32 [m, k], row-major, in place) to `pattern`. h: H [k, k] (see HessianAccumulator);
// magnitude accepts an empty h (no error in the report then); Wanda only reads diag(h). Errors (W
// untouched then): NaN/Inf in W or H, H not symmetric / negative diagonal, H not positive definite
// even after the damping retries, a pattern that does not fit the shape or is invalid.
Result<PruneReport> Prune(std::span<float> w, int64_t m, int64_t k, std::span<const double> h,
                          const Pattern& pattern, const PruneOptions& opt = {});
// Same, reading H from an accumulator.
Result<PruneReport> Prune(std::span<float> w, int64_t m, int64_t k, const HessianAccumulator& acc,
                          const Pattern& pattern, const PruneOptions& opt = {});

// Checks that a pattern can be applied to an m x k weight: Validate(), N:M and V:N:M need k >= M,
// V:N:M needs m >= V, a block may not be larger than the weight. Names `what`. The masks
// themselves come from ComputeMask (pattern.h).
Status CheckPatternFits(const Pattern& p, int64_t m, int64_t k, const std::string& what);

// Global magnitude pruning across several layers: one threshold over all of them, pruning
// llround(fraction * total) weights (ties: earlier layer, then lower index, kept).
struct LayerRef {
  std::span<float> w;
  std::string name;
};
Status MagnitudePruneGlobal(std::span<LayerRef> layers, double fraction);

// ---- channel permutation (Pool & Yu, NeurIPS 2021) ----------------------------------------------

struct PermuteOptions {
  double time_budget_s = 10.0;   // <= 0: no clock (the result then never depends on machine speed)
  int64_t max_rounds = 1 << 30;  // rounds of the swap search (a bound that makes runs repeatable)
  // Bound on the work (0 = none): candidate column swaps evaluated, each counted as the number of
  // row blocks it scores (m for N:M, m / V for V:N:M), so that a bound costs about the same time
  // on a tall layer as on a short one. Unlike the time budget it stops the search at the same
  // point on every machine and thread count: the permutation, and a checkpoint pruned with it,
  // is reproducible.
  int64_t max_work = 0;
  uint64_t seed = 0x5eed;
  ThreadPool* pool = nullptr;
};
struct PermuteResult {
  std::vector<int32_t> perm;     // permuted column j = original column perm[j]
  double kept_identity = 0.0;    // saliency kept under the pattern without permutation
  double kept_permuted = 0.0;    // ... with perm
  int64_t rounds = 0;
  int64_t evals = 0;  // candidate swaps evaluated
  bool hit_time_budget = false;
  bool hit_work_bound = false;
};
// Finds a column permutation of saliency S[m, k] (>= 0, e.g. |W| * ||X_j||) maximizing the total
// saliency kept under N:M (pattern kNM) or V:N:M (kVNM: per block of v rows, scores summed). Start:
// the better of identity and a deal of columns sorted by total saliency round-robin over groups;
// then greedy improving swaps between pairs of groups (exhaustive over the M x M column swaps of a
// pair, pairs visited in a seeded random order) until a round finds no improvement, the round
// bound, the work bound or the time budget. Deterministic for given max_rounds and
// max_work unless the time budget is hit (set it <= 0 for a result that never depends on time).
Result<PermuteResult> FindPermutation(const Pattern& p, std::span<const float> saliency, int64_t m,
                                      int64_t k, const PermuteOptions& opt = {});
// Saliency kept by the best N:M / V:N:M mask of S with columns taken in order perm (empty = identity).
double KeptSaliency(const Pattern& p, std::span<const float> saliency, int64_t m, int64_t k,
                    std::span<const int32_t> perm = {});
// dst[:, j] = src[:, perm[j]] (W[m, k] row-major), and its inverse.
void PermuteColumns(std::span<const float> src, std::span<float> dst, int64_t m, int64_t k,
                    std::span<const int32_t> perm);
void UnpermuteColumns(std::span<const float> src, std::span<float> dst, int64_t m, int64_t k,
                      std::span<const int32_t> perm);
// Checks that perm is a permutation of 0..k-1.
Status ValidatePermutation(std::span<const int32_t> perm, int64_t k, const std::string& what);

// ---- per-layer sparsity allocation -------------------------------------------------------------

// "0.5" (same for every layer) or a comma list with exactly num_layers fractions in [0, 1].
Result<std::vector<double>> ParseSparsityList(std::string_view spec, int64_t num_layers);

// OWL (Yin et al. 2024, "Outlier Weighed Layerwise sparsity"): a layer's outlier ratio is the
// fraction of its Wanda scores |W_ij| * ||X_j|| above `threshold` times their mean.
double OutlierRatio(std::span<const float> w, int64_t m, int64_t k,
                    std::span<const double> col_norms, double threshold = 5.0);
// Layer sparsities from outlier ratios: ratios are min-max normalized to [0, 2*lambda]; density_l
// = c + normalized_l (more outliers -> denser), with the shift c chosen so that the parameter-
// weighted mean sparsity equals target exactly; results are clamped to [0, 1] (re-solving c).
// numel[l] is layer l's parameter count.
Result<std::vector<double>> OwlSparsities(std::span<const double> outlier_ratios,
                                          std::span<const int64_t> numel, double target,
                                          double lambda = 0.08);

// ---- gradual pruning schedule (Zhu & Gupta 2017) -----------------------------------------------

// s(t) = s_f + (s_i - s_f) * (1 - (t - t0) / (n * dt))^3 for t0 <= t <= t0 + n*dt, updated every dt
// steps (t is floored to the last multiple of dt after t0); s_i before t0, s_f after.
struct CubicSchedule {
  double initial_sparsity = 0.0;
  double final_sparsity = 0.5;
  int64_t start_step = 0;
  int64_t num_updates = 10;  // n
  int64_t frequency = 100;   // dt, steps between mask updates
  Status Validate() const;
  double At(int64_t step) const;
  // True on steps where the mask should be recomputed (t0, t0 + dt, ..., t0 + n*dt).
  bool IsUpdateStep(int64_t step) const;
};

}  // namespace sparq
