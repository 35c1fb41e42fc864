// Prune(): validation, optional channel permutation, the method, and the report.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <nlohmann/json.hpp>

#include "src/prune/prune_internal.h"

namespace sparq {
namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Saliency for the permutation search: the method's own score where it exists without a
// factorization (|W| for magnitude, |W| * ||X_j|| otherwise).
std::vector<float> PermutationSaliency(PruneMethod method, std::span<const float> w, int64_t m,
                                       int64_t k, std::span<const double> h) {
  if (method == PruneMethod::kMagnitude || h.empty()) return prune_internal::MagnitudeScores(w);
  return prune_internal::WandaScores(w, m, k, h);
}

}  // namespace

namespace prune_internal {

void QuantizeKept(std::span<float> w, std::span<const uint8_t> keep, int64_t m, int64_t k,
                  Quantizer* q, ThreadPool* pool) {
  if (!q) return;
  const int64_t g = q->group_size();
  auto row = [&](int64_t r, int) {
    float* wr = w.data() + r * k;
    for (int64_t j = 0; j < k; ++j) {
      if (g > 0 && j % g == 0) q->FitGroup(r, j, wr + j, &keep[r * k + j], std::min(g, k - j));
      if (keep[r * k + j]) wr[j] = q->Quantize(r, j, wr[j]);
    }
  };
  if (pool) {
    pool->ParallelFor(m, row);
  } else {
    for (int64_t r = 0; r < m; ++r) row(r, 0);
  }
}

}  // namespace prune_internal

Status CheckPatternFits(const Pattern& p, int64_t m, int64_t k, const std::string& what) {
  SPARQ_RETURN_IF_ERROR(p.Validate().WithContext(what));
  if (m < 0 || k < 0) return InvalidInput(what + ": negative shape");
  if (p.kind == PatternKind::kNM || p.kind == PatternKind::kVNM) {
    if (k < p.m) {
      return InvalidInput(what + ": pattern " + p.ToString() + " needs at least " +
                          std::to_string(p.m) + " columns, the weight has " + std::to_string(k));
    }
  }
  if (p.kind == PatternKind::kVNM && m < p.v) {
    return InvalidInput(what + ": pattern " + p.ToString() + " needs at least " +
                        std::to_string(p.v) + " rows, the weight has " + std::to_string(m));
  }
  if (p.kind == PatternKind::kBlock && (p.bh > m || p.bw > k)) {
    return InvalidInput(what + ": block " + std::to_string(p.bh) + "x" + std::to_string(p.bw) +
                        " is larger than the weight (" + std::to_string(m) + " x " +
                        std::to_string(k) + ")");
  }
  return Status::Ok();
}

Result<PruneMethod> ParsePruneMethod(std::string_view name) {
  if (name == "magnitude") return PruneMethod::kMagnitude;
  if (name == "wanda") return PruneMethod::kWanda;
  if (name == "sparsegpt") return PruneMethod::kSparseGpt;
  return InvalidInput("unknown pruning method '" + std::string(name) +
                      "' (expected magnitude, wanda or sparsegpt)");
}

std::string_view PruneMethodName(PruneMethod m) {
  switch (m) {
    case PruneMethod::kMagnitude: return "magnitude";
    case PruneMethod::kWanda: return "wanda";
    case PruneMethod::kSparseGpt: return "sparsegpt";
  }
  return "?";
}

std::string PruneReport::ToJson() const {
  nlohmann::ordered_json j;
  j["method"] = method;
  j["pattern"] = pattern;
  j["shape"] = {m, k};
  j["zeros"] = zeros;
  j["pruned"] = pruned;
  j["sparsity"] = sparsity;
  if (rel_error >= 0) {
    j["rel_error"] = rel_error;
  } else {
    j["rel_error"] = nullptr;
  }
  j["seconds"] = seconds;
  j["cpu_seconds"] = cpu_seconds;
  j["error_seconds"] = error_seconds;
  j["factor_seconds"] = factor_seconds;
  j["update_seconds"] = update_seconds;
  j["damp"] = damp_used;
  j["damp_retries"] = damp_retries;
  j["dead_inputs"] = dead_inputs;
  if (!permutation.empty()) {
    j["permutation"] = permutation;
    j["saliency_kept_identity"] = saliency_kept_identity;
    j["saliency_kept_permuted"] = saliency_kept_permuted;
    j["permute_evals"] = permute_evals;
    j["permute_stopped_early"] = permute_stopped_early;
  }
  return j.dump(2);
}

Result<PruneReport> Prune(std::span<float> w, int64_t m, int64_t k, const HessianAccumulator& acc,
                          const Pattern& pattern, const PruneOptions& opt) {
  if (acc.k() != k) {
    return InvalidInput(opt.what + ": accumulator has k = " + std::to_string(acc.k()) +
                        ", weight has k = " + std::to_string(k));
  }
  if (acc.num_samples() == 0 && opt.method != PruneMethod::kMagnitude) {
    return InvalidInput(opt.what + ": no calibration samples were accumulated");
  }
  const std::vector<double> h = acc.Hessian();
  return Prune(w, m, k, acc.num_samples() ? std::span<const double>(h) : std::span<const double>(),
               pattern, opt);
}

Result<PruneReport> Prune(std::span<float> w, int64_t m, int64_t k, std::span<const double> h,
                          const Pattern& pattern, const PruneOptions& opt) {
  const auto t0 = Clock::now();
  const std::clock_t c0 = std::clock();
  const std::string& what = opt.what;
  if (m < 0 || k < 0 || static_cast<uint64_t>(w.size()) != static_cast<uint64_t>(m) * static_cast<uint64_t>(k)) {
    return InvalidInput(what + ": weight has " + std::to_string(w.size()) + " values, shape says " +
                        std::to_string(m) + " x " + std::to_string(k));
  }
  SPARQ_RETURN_IF_ERROR(CheckPatternFits(pattern, m, k, what));
  for (size_t i = 0; i < w.size(); ++i) {
    if (!std::isfinite(w[i])) {
      return InvalidInput(what + ": non-finite weight at (" + std::to_string(i / k) + ", " +
                          std::to_string(i % k) + ")");
    }
  }
  if (!h.empty()) SPARQ_RETURN_IF_ERROR(ValidateHessian(h, k, what + ": hessian"));
  if (h.empty() && opt.method != PruneMethod::kMagnitude) {
    return InvalidInput(what + ": " + std::string(PruneMethodName(opt.method)) +
                        " needs calibration inputs or a Hessian");
  }
  const bool nm_like = pattern.kind == PatternKind::kNM || pattern.kind == PatternKind::kVNM;
  if (opt.permute && !nm_like) {
    return InvalidInput(what + ": channel permutation applies to N:M and V:N:M patterns, not " +
                        pattern.ToString());
  }
  if (!opt.fixed_mask.empty()) {
    if (opt.fixed_mask.size() != w.size()) {
      return InvalidInput(what + ": fixed mask has " + std::to_string(opt.fixed_mask.size()) +
                          " entries, the weight " + std::to_string(w.size()));
    }
    if (opt.permute) return InvalidInput(what + ": a fixed mask cannot be permuted");
    std::vector<float> ones(opt.fixed_mask.begin(), opt.fixed_mask.end());
    if (!Satisfies(pattern, ones, m, k)) {
      return InvalidInput(what + ": the fixed mask does not satisfy pattern " + pattern.ToString());
    }
  }
  if (opt.act_order) {
    if (opt.method != PruneMethod::kSparseGpt || opt.quantizer == nullptr) {
      return InvalidInput(what + ": act-order orders GPTQ's sweep: it needs SparseGPT's sweep with "
                          "quantized values");
    }
    if (pattern.kind != PatternKind::kDense && opt.fixed_mask.empty()) {
      return InvalidInput(what + ": act-order needs a dense pattern or a fixed mask (quantize a "
                          "pruned checkpoint): pattern " + pattern.ToString() +
                          " chooses its mask in column order during the sweep");
    }
    if (opt.permute) return InvalidInput(what + ": act-order and channel permutation exclude each other");
  }
  if (opt.method == PruneMethod::kSparseGpt && !(opt.damp >= 0.0 && std::isfinite(opt.damp))) {
    return InvalidInput(what + ": damp must be a finite value >= 0");
  }

  PruneReport rep;
  rep.method = std::string(PruneMethodName(opt.method));
  rep.pattern = pattern.ToString();
  rep.m = m;
  rep.k = k;
  std::vector<float> cur(w.begin(), w.end());
  std::vector<float> orig;
  if (opt.compute_error && !h.empty()) orig = cur;
  std::vector<double> hp;  // H in permuted order, if permuting
  std::span<const double> hw = h;
  if (opt.permute && m > 0 && k > 0) {
    std::vector<float> sal = PermutationSaliency(opt.method, w, m, k, h);
    PermuteOptions po;
    po.time_budget_s = opt.permute_time_budget_s;
    po.max_rounds = opt.permute_max_rounds;
    po.max_work = opt.permute_max_work;
    po.pool = opt.pool;
    SPARQ_ASSIGN_OR_RETURN(PermuteResult pr, FindPermutation(pattern, sal, m, k, po));
    rep.permutation = pr.perm;
    rep.saliency_kept_identity = pr.kept_identity;
    rep.saliency_kept_permuted = pr.kept_permuted;
    rep.permute_evals = pr.evals;
    rep.permute_stopped_early = pr.hit_work_bound || pr.hit_time_budget;
    PermuteColumns(w, cur, m, k, pr.perm);
    if (!h.empty()) {
      hp.resize(h.size());
      for (int64_t i = 0; i < k; ++i) {
        for (int64_t j = 0; j < k; ++j) hp[i * k + j] = h[pr.perm[i] * k + pr.perm[j]];
      }
      hw = hp;
    }
  }

  if (opt.method == PruneMethod::kSparseGpt) {
    SPARQ_RETURN_IF_ERROR(opt.act_order
                              ? prune_internal::SparseGptActOrder(cur, m, k, hw, pattern, opt, &rep)
                              : prune_internal::SparseGpt(cur, m, k, hw, pattern, opt, &rep));
  } else {
    std::vector<float> scores = opt.method == PruneMethod::kMagnitude
                                    ? prune_internal::MagnitudeScores(cur)
                                    : prune_internal::WandaScores(cur, m, k, hw);
    // Wanda compares within rows (its paper's choice for per-layer targets); magnitude over the
    // whole tensor.
    MaskOptions mo;
    mo.row_wise = opt.method == PruneMethod::kWanda;
    mo.pool = opt.pool;
    std::vector<uint8_t> keep(opt.fixed_mask.begin(), opt.fixed_mask.end());
    if (keep.empty()) {
      SPARQ_ASSIGN_OR_RETURN(keep, ComputeMask(pattern, scores, m, k, what, mo));
    }
    for (size_t i = 0; i < cur.size(); ++i) {
      if (!keep[i]) {
        cur[i] = 0.0f;
        ++rep.pruned;
      }
    }
    prune_internal::QuantizeKept(cur, keep, m, k, opt.quantizer, opt.pool);
  }

  if (!rep.permutation.empty()) {
    UnpermuteColumns(cur, w, m, k, rep.permutation);
  } else {
    std::copy(cur.begin(), cur.end(), w.begin());
  }
  for (float x : w) rep.zeros += x == 0.0f;
  rep.sparsity = (m * k) != 0 ? static_cast<double>(rep.zeros) / static_cast<double>(m * k) : 0.0;
  rep.seconds = Seconds(t0);
  rep.cpu_seconds = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
  if (!orig.empty()) {
    const auto t1 = Clock::now();
    rep.rel_error = ReconstructionError(orig, w, m, k, h, opt.pool);
    rep.error_seconds = Seconds(t1);
  }
  return rep;
}

}  // namespace sparq
