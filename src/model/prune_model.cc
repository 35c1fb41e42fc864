// Sequential calibration and pruning of a Llama model (SparseGPT's procedure), writing a .sparq.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <regex>

#include "sparq/checkpoint.h"
#include "sparq/gguf.h"
#include "sparq/model_file.h"
#include "sparq/progress.h"
#include "src/model/llama_internal.h"

namespace sparq {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

bool ActOrderApplies(const ModelPruneOptions& opt) {
  return opt.values.quantized() && opt.quant_method == ModelPruneOptions::QuantMethod::kGptq &&
         !opt.permute &&
         (opt.pattern.kind == PatternKind::kDense || opt.method == PruneMethod::kSparseGpt);
}

// llama_internal.h: refused, naming the tensor, rather than written as inf.
Status FitsValueType(std::span<const float> w, DType dt, const std::string& name) {
  if (dt != DType::kF16) return Status::Ok();
  for (size_t i = 0; i < w.size(); ++i) {
    if (!std::isfinite(F16ToF32(F32ToF16(w[i])))) {
      return InvalidInput(name + ": value " + std::to_string(w[i]) + " at " + std::to_string(i) +
                          " does not fit f16 (|v| <= 65504); use --values bf16 or f32");
    }
  }
  return Status::Ok();
}

namespace {

// The model file's own token_embd when the GGUF stores it on exactly the grid `spec` names (a Q4_1
// embedding for int4:g32, Q8_0 for int8:g32, Q4_0 for int4:g32:sym; any of them for a null spec),
// else nullopt. Those codes
// are the dense model's values: GPTQ on the head's inputs would move them off the grid they sit
// on (a Q4_1 head re-fitted by GPTQ at g32 cost 3.5% perplexity), so they are kept bit for bit.
Result<std::optional<DenseMatrix>> StoredEmbedding(const std::string& model_path,
                                                   const ValueSpec* spec) {
  auto kind = DetectModelFile(model_path);
  if (!kind.ok() || *kind != ModelFileKind::kGguf) return std::optional<DenseMatrix>();
  SPARQ_ASSIGN_OR_RETURN(GgufFile f, GgufFile::Open(model_path));
  const GgufTensorInfo* t = f.FindTensor("token_embd.weight");
  if (t == nullptr || (t->type != GgmlType::kQ4_0 && t->type != GgmlType::kQ4_1 &&
                       t->type != GgmlType::kQ8_0)) {
    return std::optional<DenseMatrix>();
  }
  SPARQ_ASSIGN_OR_RETURN(DenseMatrix dm, f.ReadQuantized(*t));
  if (spec != nullptr && dm.quant.spec.Name() != spec->Name()) return std::optional<DenseMatrix>();
  return std::optional<DenseMatrix>(std::move(dm));
}

// The `k` most frequent ids of `tokens` (ties: lower id first), in increasing order.
std::vector<int32_t> FrequentTokenIds(std::span<const int32_t> tokens, int64_t vocab, int64_t k) {
  std::vector<int64_t> count(static_cast<size_t>(vocab), 0);
  for (int32_t t : tokens) ++count[static_cast<size_t>(t)];
  std::vector<int32_t> ids(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i) ids[i] = static_cast<int32_t>(i);
  std::stable_sort(ids.begin(), ids.end(),
                   [&](int32_t a, int32_t b) { return count[a] > count[b]; });
  ids.resize(static_cast<size_t>(k));
  std::sort(ids.begin(), ids.end());
  return ids;
}

// Rows `ids` of the f32 embedding in int8:g32, rounded to nearest: the grid of a Q8_0 embedding
// (SmolLM2's), so its rows come back bit for bit; GPTQ would move them off it.
Result<DenseMatrix> RowsInt8(const Tensor& embd, std::span<const int32_t> ids) {
  const auto k = static_cast<int64_t>(ids.size());
  const int64_t d = embd.dim(1);
  std::vector<float> rows(static_cast<size_t>(k * d));
  for (int64_t j = 0; j < k; ++j) {
    std::memcpy(rows.data() + j * d, embd.data_as<float>() + int64_t{ids[j]} * d,
                sizeof(float) * d);
  }
  SPARQ_ASSIGN_OR_RETURN(DenseMatrix f, DenseMatrix::FromDense(rows, k, d));
  SPARQ_ASSIGN_OR_RETURN(ValueSpec spec, ValueSpec::Parse("int8:g32"));
  return DenseMatrix::Quantize(f, spec, {}, "token_embd.rows.weight");
}

// Which Hessian feeds each slot: q/k/v share the attention input, gate/up the MLP input.
constexpr int kSlotInput[kNumSlots] = {0, 0, 0, 1, 2, 2, 3};
constexpr int kNumInputs = 4;

// Calibration segments: `samples` windows of `len` tokens at seeded random offsets (SparseGPT's
// data loader does the same on C4/WikiText).
Result<std::vector<int32_t>> CalibrationTokens(const Tokenizer& tok, std::string_view text,
                                               int64_t samples, int64_t len, uint64_t seed) {
  if (samples <= 0 || len <= 0) return InvalidInput("calibration: samples and length must be > 0");
  SPARQ_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok.Encode(text));
  const auto total = static_cast<int64_t>(ids.size());
  if (total < len + 1) {
    return InvalidInput("calibration text has " + std::to_string(total) +
                        " tokens, fewer than --calib-len " + std::to_string(len) + " + 1");
  }
  std::mt19937_64 rng(seed);
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(samples * len));
  for (int64_t s = 0; s < samples; ++s) {
    const auto start = static_cast<int64_t>(rng() % static_cast<uint64_t>(total - len));
    out.insert(out.end(), ids.begin() + start, ids.begin() + start + len);
  }
  return out;
}

// Dense f32 weight of a layer of the loaded model, row-major [m, k]. Pruning starts from the dense
// model (GGUF or Hugging Face folder), not from an already pruned or bf16 checkpoint.
Result<std::vector<float>> DenseWeights(const LinearWeight& lw, const std::string& source,
                                        const std::string& name) {
  const float* p = lw.dense_f32();
  if (p == nullptr) {
    return InvalidInput(source + ": '" + name + "' is stored as " + lw.format() +
                        ", not dense f32: prune the dense model (GGUF or Hugging Face folder), "
                        "not a pruned checkpoint");
  }
  return std::vector<float>(p, p + lw.rows() * lw.cols());
}

// The checkpoint of a .sparq input with at least one sparse (not dense) linear layer, else none.
// Channel-permuted layers are refused: their masks hold in permuted column order.
Result<std::optional<Checkpoint>> SparseInput(const std::string& path, const LlamaModel& model) {
  bool sparse = false;
  for (const LlamaBlock& b : model.weights().blocks) {
    for (int s = 0; s < kNumSlots; ++s) {
      if (b.linear[s].dense_f32() == nullptr && !b.linear[s].format().starts_with("dense")) {
        sparse = true;
      }
      if (!b.perm[s].empty()) {
        return InvalidInput(path + ": a layer is channel-permuted; re-quantizing a permuted "
                            "checkpoint is not supported: prune the dense model");
      }
    }
  }
  if (!sparse) return std::optional<Checkpoint>();
  SPARQ_ASSIGN_OR_RETURN(Checkpoint ck, ReadCheckpoint(path));
  return std::optional<Checkpoint>(std::move(ck));
}

// The input's matrix of `name` if it is sparse (its pattern is not dense).
const CheckpointTensor* InputSparse(const std::optional<Checkpoint>& ck, const std::string& name) {
  if (!ck) return nullptr;
  const CheckpointTensor* t = ck->FindMatrix(name);
  return t != nullptr && t->pattern.kind != PatternKind::kDense ? t : nullptr;
}

// A sparse input layer's weights (dequantized to f32) and its mask: the nonzero weights (a kept
// weight that is exactly 0 counts as pruned; the pattern holds for the mask either way).
Result<std::vector<float>> KeptMask(const CheckpointTensor& in, int64_t m, int64_t k,
                                    std::vector<uint8_t>* mask) {
  const Tensor d = ToDense(in.matrix);
  if (d.numel() != uint64_t(m * k)) {
    return InvalidInput(in.name + ": stored shape " + d.ShapeString() + ", want [" +
                        std::to_string(m) + ", " + std::to_string(k) + "]");
  }
  std::vector<float> w(d.data_as<float>(), d.data_as<float>() + m * k);
  mask->resize(w.size());
  for (size_t i = 0; i < w.size(); ++i) (*mask)[i] = w[i] != 0.0f;
  return w;
}

Tensor VectorTensor(const std::vector<float>& v) {
  Tensor t = Tensor::Alloc(DType::kF32, {static_cast<int64_t>(v.size())});
  std::memcpy(t.mutable_data(), v.data(), v.size() * sizeof(float));
  return t;
}

// OWL (Yin et al. 2024, "Outlier Weighed Layerwise sparsity"): one sparsity per block from the
// blocks' outlier ratios under the dense model's activations of the calibration tokens `x` ([S*L,
// d], advanced through the blocks here on a copy). A block's ratio is the fraction of the Wanda
// scores |W_ij| * ||X_j|| of all its selected layers together (as OWL's reference code
// concatenates them) above `threshold` times their mean; OwlSparsities turns the ratios into
// sparsities whose parameter-weighted mean over the selected layers is the target. Blocks with no
// selected layer get the target (unused).
Result<std::vector<double>> OwlBlockSparsities(
    const LlamaConfig& c, const LlamaWeights& w, const std::string& model_path,
    std::vector<float> x, int64_t samples, int64_t len, int64_t blocks,
    const std::vector<std::array<bool, kNumSlots>>& selected, double target, double lambda,
    double threshold, ThreadPool* pool) {
  const int64_t d = c.n_embd;
  std::vector<float> kc(static_cast<size_t>(len * c.kv_dim())), vc(kc.size());
  BlockScratch scratch;
  scratch.keep_inputs = true;
  std::vector<double> ratios, sparsity(static_cast<size_t>(blocks), target);
  std::vector<int64_t> numel, which;
  for (int64_t l = 0; l < blocks; ++l) {
    const LlamaBlock& b = w.blocks[l];
    // Column sums of squares of each linear layer's input over every calibration token.
    std::array<std::vector<double>, kNumInputs> sq;
    for (int i = 0; i < kNumInputs; ++i) sq[i].assign(i == 3 ? c.n_ff : d, 0.0);
    for (int64_t s = 0; s < samples; ++s) {
      RunBlock(c, b, x.data() + s * len * d, len, 0, kc.data(), vc.data(), len, &scratch, pool);
      const float* taps[kNumInputs] = {scratch.attn_in.data(), scratch.att.data(),
                                       scratch.ffn_in.data(), scratch.act.data()};
      for (int i = 0; i < kNumInputs; ++i) {
        const auto k = static_cast<int64_t>(sq[i].size());
        for (int64_t t = 0; t < len; ++t) {
          for (int64_t j = 0; j < k; ++j) sq[i][j] += double(taps[i][t * k + j]) * taps[i][t * k + j];
        }
      }
    }
    // Two passes over the block's scores: their mean, then the count above threshold * mean.
    std::vector<std::vector<float>> ws(kNumSlots);
    double sum = 0.0;
    int64_t count = 0;
    for (int sl = 0; sl < kNumSlots; ++sl) {
      if (!selected[l][sl]) continue;
      const auto slot = static_cast<LinearSlot>(sl);
      const auto [m, k] = SlotShape(c, slot);
      const std::string name =
          "blk." + std::to_string(l) + "." + std::string(SlotName(slot)) + ".weight";
      SPARQ_ASSIGN_OR_RETURN(ws[sl], DenseWeights(b.linear[sl], model_path, name));
      const std::vector<double>& q = sq[kSlotInput[sl]];
      for (int64_t r = 0; r < m; ++r) {
        for (int64_t j = 0; j < k; ++j) sum += std::fabs(ws[sl][r * k + j]) * std::sqrt(q[j]);
      }
      count += m * k;
    }
    if (count == 0) continue;
    const double cut = threshold * sum / static_cast<double>(count);
    int64_t outliers = 0;
    for (int sl = 0; sl < kNumSlots; ++sl) {
      if (ws[sl].empty()) continue;
      const std::vector<double>& q = sq[kSlotInput[sl]];
      const auto k = static_cast<int64_t>(q.size());
      for (size_t i = 0; i < ws[sl].size(); ++i) {
        outliers += std::fabs(ws[sl][i]) * std::sqrt(q[i % k]) > cut ? 1 : 0;
      }
    }
    ratios.push_back(static_cast<double>(outliers) / static_cast<double>(count));
    numel.push_back(count);
    which.push_back(l);
  }
  if (ratios.empty()) return sparsity;
  SPARQ_ASSIGN_OR_RETURN(std::vector<double> owl, OwlSparsities(ratios, numel, target, lambda));
  for (size_t i = 0; i < which.size(); ++i) sparsity[which[i]] = owl[i];
  return sparsity;
}

// The stored matrix with quantized values: N:M or CSR (a pruned layer) or dense (a quantized dense
// layer or the tied head). `fitted`: GPTQ's groups, or empty for round to nearest.
struct LayerJob {
  std::string name;
  int64_t m, k;
  const HessianAccumulator* acc;
};

// Prunes one dense weight and encodes it; returns the stored matrix, its LinearWeight, its
// permutation (empty if none) and the report.
struct PrunedLayer {
  SparseMatrix stored;
  LinearWeight linear;
  std::vector<int32_t> perm;
  LayerPruneResult result;
};

Result<PrunedLayer> PruneOne(std::vector<float> w, const LayerJob& job,
                             const ModelPruneOptions& opt, bool allow_permute,
                             const KernelConfig& cfg, ThreadPool* pool,
                             std::span<const uint8_t> fixed_mask = {}) {
  const bool quantized = opt.values.quantized();
  const bool gptq = quantized && opt.quant_method == ModelPruneOptions::QuantMethod::kGptq;
  PruneOptions po;
  // A dense pattern prunes nothing, whatever the method: GPTQ is SparseGPT's sweep with the
  // quantizer and no mask, and round to nearest needs no sweep (magnitude keeps every weight).
  po.method = opt.pattern.kind != PatternKind::kDense ? opt.method
              : gptq                                  ? PruneMethod::kSparseGpt
                                                      : PruneMethod::kMagnitude;
  po.damp = opt.damp;
  po.permute = allow_permute && opt.permute &&
               (opt.pattern.kind == PatternKind::kNM || opt.pattern.kind == PatternKind::kVNM);
  po.permute_time_budget_s = opt.permute_time_budget_s;
  po.permute_max_rounds = opt.permute_max_rounds;
  po.permute_max_work = opt.permute_max_work;
  po.pool = pool;
  po.what = job.name;
  po.fixed_mask = fixed_mask;
  if (!fixed_mask.empty()) po.permute = false;
  po.act_order = opt.act_order && gptq;
  // Act-order with a pattern whose mask the sweep would choose (SparseGPT N:M, unstructured):
  // two passes on the same Hessian, SparseGPT's pruning in f32 (its masks and compensation),
  // then GPTQ in act-order on the kept weights with that mask fixed (what `prune --values bf16`
  // then `quantize --act-order` does, in one run).
  const bool two_pass = po.act_order && fixed_mask.empty() && opt.pattern.kind != PatternKind::kDense;
  std::optional<GroupQuantizer> gq;
  if (gptq) {
    SPARQ_ASSIGN_OR_RETURN(GroupQuantizer q,
                           GroupQuantizer::Make(opt.values, opt.pattern, job.m, job.k));
    gq.emplace(std::move(q));
    po.quantizer = &*gq;
  }
  // Rounding to nearest after pruning changes the weights after Prune measured its error: keep
  // the dense weights to measure the stored ones again.
  const bool rtn = quantized && !gq;
  std::vector<float> orig;
  if ((rtn || two_pass) && po.compute_error) orig = w;
  std::vector<uint8_t> first_mask;
  if (two_pass) {
    PruneOptions p1 = po;
    p1.quantizer = nullptr;
    p1.act_order = false;
    p1.compute_error = false;
    SPARQ_RETURN_IF_ERROR(Prune(w, job.m, job.k, *job.acc, opt.pattern, p1).status());
    first_mask.resize(w.size());
    for (size_t i = 0; i < w.size(); ++i) first_mask[i] = w[i] != 0.0f;
    po.fixed_mask = first_mask;
    po.compute_error = false;  // measured below on what is stored, against the dense weights
  }
  // The second pass keeps W's zeros as its mask: checked as a dense pattern, since a weight the
  // first pass kept may be exactly 0 (a dead input's), which an exact-count pattern would refuse.
  const Pattern sweep_pattern = two_pass ? Pattern::Dense() : opt.pattern;
  SPARQ_ASSIGN_OR_RETURN(PruneReport rep, Prune(w, job.m, job.k, *job.acc, sweep_pattern, po));
  if (two_pass) rep.pattern = opt.pattern.ToString();
  if (gq) {
    SPARQ_RETURN_IF_ERROR(gq->status().WithContext(job.name));
  }
  PrunedLayer out;
  std::vector<float> to_store;
  if (!rep.permutation.empty()) {
    // Prune returns W' in the original column order; store W'[:, perm] so that its N:M groups
    // are contiguous, and gather X by perm at run time.
    to_store.resize(w.size());
    PermuteColumns(w, to_store, job.m, job.k, rep.permutation);
    out.perm = rep.permutation;
  } else {
    to_store = std::move(w);
  }
  const FormatKind fmt = PickFormat(opt.pattern);
  SPARQ_RETURN_IF_ERROR(FitsValueType(to_store, opt.values.dtype, job.name));
  if (gq && !gq->kept().empty()) {
    // CSR with GPTQ: a kept weight may round to 0; store the mask the sweep applied, not the
    // nonzeros, so the pattern survives bit for bit.
    SPARQ_ASSIGN_OR_RETURN(CsrMatrix c, CsrMatrix::FromDenseMasked(to_store, gq->kept(), job.m,
                                                                   job.k, DType::kF32));
    out.stored = std::move(c);
  } else {
    SPARQ_ASSIGN_OR_RETURN(out.stored, Encode(to_store, job.m, job.k, fmt, opt.pattern,
                                              quantized ? DType::kF32 : opt.values.dtype));
  }
  if (quantized) {
    // GPTQ's swept weights lie on the grids it fitted: their nearest codes give them back exactly
    // (stored order = swept order, permuted or not). RTN fits each group of the stored values.
    SPARQ_ASSIGN_OR_RETURN(out.stored, QuantizeMatrix(out.stored, opt.values,
                                                      gq ? std::span<const QuantGroup>(gq->groups())
                                                         : std::span<const QuantGroup>(),
                                                      job.name));
    if (!orig.empty()) {
      // The report's error is that of what is stored: the dequantized values, in the original
      // column order.
      const Tensor d = ToDense(out.stored);
      std::span<const float> stored(d.data_as<float>(), static_cast<size_t>(d.numel()));
      std::vector<float> unperm;
      if (!out.perm.empty()) {
        unperm.resize(stored.size());
        UnpermuteColumns(stored, unperm, job.m, job.k, out.perm);
        stored = unperm;
      }
      rep.rel_error = ReconstructionError(orig, stored, job.m, job.k, job.acc->Hessian(), pool);
    }
  }
  SparseMatrix copy = out.stored;  // LinearWeight takes its matrix; the checkpoint keeps ours
  SPARQ_ASSIGN_OR_RETURN(out.linear, LinearWeight::FromMatrix(std::move(copy), job.name, cfg));
  out.result.name = job.name;
  out.result.format = std::string(FormatName(fmt));
  out.result.stored_bytes = StoredByteSize(out.stored);  // as the checkpoint writes it
  out.result.report = std::move(rep);
  return out;
}

}  // namespace

std::string ModelPruneResult::ToJson(bool with_timings) const {
  nlohmann::json layers_j = nlohmann::json::array();
  for (const LayerPruneResult& l : layers) {
    nlohmann::json j = {{"name", l.name},
                        {"format", l.format},
                        {"stored_bytes", l.stored_bytes},
                        {"sparsity", l.report.sparsity},
                        {"rel_error", l.report.rel_error},
                        {"damp_used", l.report.damp_used},
                        {"permuted", !l.report.permutation.empty()}};
    if (!l.report.permutation.empty()) {
      j["permute_evals"] = l.report.permute_evals;
      j["permute_stopped_early"] = l.report.permute_stopped_early;
    }
    if (with_timings) j["seconds"] = l.report.seconds;
    layers_j.push_back(j);
  }
  nlohmann::json j = {{"calib_tokens", calib_tokens},
                      {"dense_f32_bytes", dense_bytes},
                      {"stored_bytes", stored_bytes},
                      {"layers", layers_j}};
  if (!block_sparsity.empty()) j["block_sparsity"] = block_sparsity;
  if (with_timings) {
    j["seconds"] = seconds;
    j["prune_seconds"] = prune_seconds;
  }
  return j.dump();
}

Result<ModelPruneResult> PruneLlama(const std::string& model_path, std::string_view calib_text,
                                    const ModelPruneOptions& opt, const std::string& out_path,
                                    const KernelConfig& cfg, ThreadPool* pool) {
  const auto t_start = Clock::now();
  SPARQ_RETURN_IF_ERROR(opt.pattern.Validate());
  if (!opt.values.quantized() && opt.values.dtype != DType::kF32 &&
      opt.values.dtype != DType::kBF16 && opt.values.dtype != DType::kF16) {
    return InvalidInput(
        "prune: --values must be f32, bf16, f16, int8[:gN] or int4[:gN][:sym], "
        "not " +
        opt.values.Name());
  }
  if (opt.allocation == ModelPruneOptions::Allocation::kOwl &&
      opt.pattern.kind != PatternKind::kUnstructured) {
    return InvalidInput("prune: --allocation owl spreads an unstructured sparsity over the blocks; " +
                        opt.pattern.ToString() + " fixes every layer's sparsity");
  }
  if (opt.act_order && (!opt.values.quantized() ||
                        opt.quant_method != ModelPruneOptions::QuantMethod::kGptq)) {
    return InvalidInput("prune: act-order orders GPTQ's sweep: it needs int8 / int4 values and "
                        "--quant-method gptq");
  }
  if (opt.act_order && opt.permute) {
    return InvalidInput("prune: act-order and --permute exclude each other (the act-order pass "
                        "keeps the first pass's masks in the original column order)");
  }
  if (opt.act_order && opt.pattern.kind != PatternKind::kDense &&
      opt.method != PruneMethod::kSparseGpt) {
    return InvalidInput("prune: act-order with pattern " + opt.pattern.ToString() +
                        " runs SparseGPT, then GPTQ on its masks: --method sparsegpt, not " +
                        std::string(PruneMethodName(opt.method)));
  }
  std::regex include;
  try {
    include = std::regex(opt.include, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    return InvalidInput("prune: --include '" + opt.include + "' is not a valid regex: " + e.what());
  }
  const bool prune_head = std::regex_match(std::string("output.weight"), include);
  // Quantized values without --embedding-values: a GGUF embedding already on an int8 / int4 grid
  // (SmolLM2's Q8_0) stays as stored: the dense model's own values, at half of bf16's bytes.
  std::optional<ValueSpec> embd_opt = opt.embedding_values;
  std::optional<DenseMatrix> stored_embd;
  if (!embd_opt && opt.values.quantized()) {
    SPARQ_ASSIGN_OR_RETURN(stored_embd, StoredEmbedding(model_path, nullptr));
    if (stored_embd) embd_opt = stored_embd->quant.spec;
  }
  const ValueSpec embd_values = embd_opt.value_or(ValueSpec{});
  // A quantized embedding that is also the head is quantized as the head, on its inputs.
  SPARQ_ASSIGN_OR_RETURN(LlamaModel model, LlamaModel::Load(model_path, cfg));
  LlamaConfig c = model.config();
  // A pruned .sparq (e.g. after `sparq finetune`): its sparse layers keep their patterns and masks
  // when quantized (the dense pattern: `sparq quantize`), GPTQ fitted on the kept weights.
  SPARQ_ASSIGN_OR_RETURN(std::optional<Checkpoint> input_ck, SparseInput(model_path, model));
  if (input_ck && opt.pattern.kind != PatternKind::kDense) {
    std::string first;
    for (const CheckpointTensor& t : input_ck->matrices) {
      if (t.pattern.kind != PatternKind::kDense) {
        first = "'" + t.name + "' is pruned to " + t.pattern.ToString();
        break;
      }
    }
    return InvalidInput(model_path + ": " + first + ": prune the dense model (GGUF or Hugging Face "
                        "folder), or quantize this one keeping its masks (`sparq quantize`)");
  }
  if (opt.embedding_values && embd_values.quantized()) {
    SPARQ_ASSIGN_OR_RETURN(stored_embd, StoredEmbedding(model_path, &embd_values));
  }
  const bool quantize_head = embd_opt && embd_values.quantized() && c.tied_output &&
                             !prune_head && !stored_embd;
  if (opt.embedding_int8_rows != 0 &&
      (!quantize_head || opt.embedding_int8_rows < 0 || opt.embedding_int8_rows > c.n_vocab ||
       embd_values.dtype != DType::kI4)) {
    return InvalidInput(
        "--embedding-int8-rows " + std::to_string(opt.embedding_int8_rows) +
        (quantize_head && embd_values.dtype == DType::kI4
             ? ": must be in [0, " + std::to_string(c.n_vocab) + "] (the vocabulary)"
             : ": applies to a tied head quantized to int4 here (--embedding-values int4[:gN], not "
               "kept as the model file stores it), which this run does not make"));
  }
  // Values of what is not pruned into a matrix of opt.values (embedding, untied head).
  // f16 stays f16 (the runtime widens it to f32: no f16 kernel rows); quantized specs keep bf16.
  const DType small_dtype = opt.values.dtype == DType::kF32 || opt.values.dtype == DType::kF16
                                ? opt.values.dtype
                                : DType::kBF16;
  LlamaWeights& w = model.mutable_weights();
  const int64_t d = c.n_embd, L = opt.calib_len, S = opt.calib_samples;
  SPARQ_ASSIGN_OR_RETURN(std::vector<int32_t> calib,
                         CalibrationTokens(model.tokenizer(), calib_text, S, L, opt.seed));

  Checkpoint ck;
  ModelPruneResult result;
  result.calib_tokens = S * L;
  // Hidden states of every calibration token at the current block's input: [S * L, d].
  std::vector<float> x(static_cast<size_t>(S * L * d));
  Embed(w, d, calib, x.data());
  std::vector<float> kc(static_cast<size_t>(L * c.kv_dim())), vc(kc.size());
  BlockScratch scratch;
  scratch.keep_inputs = true;  // step 1 reads every linear layer's input
  const int64_t blocks = opt.max_blocks < 0 ? c.n_layer : std::min(opt.max_blocks, c.n_layer);
  std::vector<std::array<bool, kNumSlots>> selected_of(static_cast<size_t>(c.n_layer));
  for (int64_t l = 0; l < blocks; ++l) {
    for (int s = 0; s < kNumSlots; ++s) {
      selected_of[l][s] = std::regex_match("blk." + std::to_string(l) + "." +
                                               std::string(SlotName(static_cast<LinearSlot>(s))) +
                                               ".weight",
                                           include);
    }
  }
  if (opt.allocation == ModelPruneOptions::Allocation::kOwl) {
    SPARQ_ASSIGN_OR_RETURN(result.block_sparsity,
                           OwlBlockSparsities(c, w, model_path, x, S, L, blocks, selected_of,
                                              opt.pattern.fraction, opt.owl_lambda,
                                              opt.owl_threshold, pool));
  }
  ProgressBar bar("prune", blocks);
  for (int64_t l = 0; l < c.n_layer; ++l) {
    LlamaBlock& b = w.blocks[l];
    const std::string blk = "blk." + std::to_string(l) + ".";
    const std::array<bool, kNumSlots>& selected = selected_of[l];
    bool any = false;
    for (int s = 0; s < kNumSlots; ++s) any = any || selected[s];
    ModelPruneOptions bo = opt;  // this block's options: OWL's sparsity
    if (!result.block_sparsity.empty() && l < blocks) {
      bo.pattern.fraction = result.block_sparsity[l];
    }
    if (any) {
      // 1. Inputs of each linear layer under the current (dense) block, into the Hessians.
      std::vector<HessianAccumulator> acc;
      for (int i = 0; i < kNumInputs; ++i) acc.emplace_back(i == 3 ? c.n_ff : d);
      std::vector<float> xs(static_cast<size_t>(L * d));
      for (int64_t s = 0; s < S; ++s) {
        std::memcpy(xs.data(), x.data() + s * L * d, sizeof(float) * L * d);
        RunBlock(c, b, xs.data(), L, 0, kc.data(), vc.data(), L, &scratch, pool);
        const float* taps[kNumInputs] = {scratch.attn_in.data(), scratch.att.data(),
                                         scratch.ffn_in.data(), scratch.act.data()};
        for (int i = 0; i < kNumInputs; ++i) {
          SPARQ_RETURN_IF_ERROR(acc[i].Add(taps[i], L, acc[i].k(), pool, blk + "inputs"));
        }
      }
      // 2. Prune the selected layers.
      for (int s = 0; s < kNumSlots; ++s) {
        if (!selected[s]) continue;
        const auto slot = static_cast<LinearSlot>(s);
        const auto [m, k] = SlotShape(c, slot);
        LayerJob job{blk + std::string(SlotName(slot)) + ".weight", m, k, &acc[kSlotInput[s]]};
        ModelPruneOptions lo = bo;
        std::vector<float> dense;
        std::vector<uint8_t> mask;
        if (const CheckpointTensor* in = InputSparse(input_ck, job.name)) {
          SPARQ_ASSIGN_OR_RETURN(dense, KeptMask(*in, m, k, &mask));
          lo.pattern = in->pattern;
        } else {
          SPARQ_ASSIGN_OR_RETURN(dense, DenseWeights(b.linear[s], model_path, job.name));
        }
        SPARQ_ASSIGN_OR_RETURN(PrunedLayer p,
                               PruneOne(std::move(dense), job, lo, true, cfg, pool, mask));
        result.prune_seconds += p.result.report.seconds;
        result.dense_bytes += static_cast<double>(m * k * 4);
        result.stored_bytes += static_cast<double>(p.result.stored_bytes);
        b.linear[s] = std::move(p.linear);
        b.perm[s] = p.perm;
        ck.matrices.push_back({job.name, std::move(p.stored), lo.pattern});
        if (!p.perm.empty()) {
          Tensor pt = Tensor::Alloc(DType::kI32, {k});
          std::memcpy(pt.mutable_data(), p.perm.data(), p.perm.size() * sizeof(int32_t));
          ck.tensors.push_back({job.name + ".perm", std::move(pt)});
        }
        result.layers.push_back(std::move(p.result));
      }
      bar.Update(l + 1, blk);
    }
    // Unselected layers are stored dense f32, exactly as read.
    for (int s = 0; s < kNumSlots; ++s) {
      if (selected[s]) continue;
      const auto slot = static_cast<LinearSlot>(s);
      const auto [m, k] = SlotShape(c, slot);
      const std::string name = blk + std::string(SlotName(slot)) + ".weight";
      if (const CheckpointTensor* in = InputSparse(input_ck, name)) {
        ck.matrices.push_back(*in);  // a sparse layer left out by --include stays as it was
        continue;
      }
      SPARQ_ASSIGN_OR_RETURN(std::vector<float> dense, DenseWeights(b.linear[s], model_path, name));
      SPARQ_ASSIGN_OR_RETURN(
          SparseMatrix dm, Encode(dense, m, k, FormatKind::kDense, Pattern::Dense(), DType::kF32));
      ck.matrices.push_back({name, std::move(dm), Pattern::Dense()});
    }
    ck.tensors.push_back({blk + "attn_norm.weight", VectorTensor(b.attn_norm)});
    ck.tensors.push_back({blk + "ffn_norm.weight", VectorTensor(b.ffn_norm)});
    // 3. Outputs of this block (with its pruned weights) feed the next one, or the head.
    if (l + 1 < blocks || prune_head || quantize_head) {
      for (int64_t s = 0; s < S; ++s) {
        RunBlock(c, b, x.data() + s * L * d, L, 0, kc.data(), vc.data(), L, &scratch, pool);
      }
    }
  }
  // The head's inputs: the final-norm hidden states of the calibration tokens.
  std::optional<HessianAccumulator> head_acc;
  if (prune_head || quantize_head) {
    std::vector<float> xn(x.size());
    RmsNorm(x.data(), S * L, d, w.output_norm.data(), c.rms_eps, xn.data(), pool);
    head_acc.emplace(d);
    SPARQ_RETURN_IF_ERROR(head_acc->Add(xn.data(), S * L, d, pool, "output.weight inputs"));
  }
  if (prune_head) {
    // The head: pruned on its inputs, stored untied from the embedding. No channel permutation
    // (the head has no input gather).
    LayerJob job{"output.weight", c.n_vocab, d, &*head_acc};
    SPARQ_ASSIGN_OR_RETURN(std::vector<float> dense, DenseWeights(w.output, model_path, job.name));
    SPARQ_ASSIGN_OR_RETURN(PrunedLayer p, PruneOne(std::move(dense), job, opt, false, cfg, pool));
    result.prune_seconds += p.result.report.seconds;
    result.dense_bytes += static_cast<double>(c.n_vocab * d * 4);
    result.stored_bytes += static_cast<double>(p.result.stored_bytes);
    ck.matrices.push_back({job.name, std::move(p.stored), opt.pattern});
    result.layers.push_back(std::move(p.result));
    c.tied_output = false;
  } else if (!c.tied_output) {
    SPARQ_ASSIGN_OR_RETURN(std::vector<float> dense,
                           DenseWeights(w.output, model_path, "output.weight"));
    SPARQ_RETURN_IF_ERROR(FitsValueType(dense, small_dtype, "output.weight"));
    SPARQ_ASSIGN_OR_RETURN(SparseMatrix dm, Encode(dense, c.n_vocab, d, FormatKind::kDense,
                                                   Pattern::Dense(), small_dtype));
    ck.matrices.push_back({"output.weight", std::move(dm), Pattern::Dense()});
  }
  // --values bf16 (or quantized, where the GGUF's embedding is not on an int8 / int4 grid) stores
  // the embedding in bf16; a tied head then runs as a dense bf16 product (half the bytes per
  // generated token of the f32 head, the largest matrix of a small model). --embedding-values
  // int8 / int4 store it as a dense quantized matrix instead.
  if (stored_embd && !prune_head) {
    // Kept as the GGUF stores it (StoredEmbedding): the lookup and a tied head read its codes.
    result.dense_bytes += static_cast<double>(c.n_vocab * d * 4);
    SparseMatrix em(std::move(*stored_embd));
    result.stored_bytes += static_cast<double>(ByteSize(em));
    ck.matrices.push_back({"token_embd.weight", std::move(em), Pattern::Dense()});
  } else if (quantize_head) {
    // The tied head: GPTQ (or round to nearest) on the final-norm hidden states, as a dense layer.
    // The lookup reads the same codes, though GPTQ fits them to the head's inputs only (the
    // lookup's error is not in its objective: docs/model.md measures what each costs).
    ModelPruneOptions ho = opt;
    ho.pattern = Pattern::Dense();
    ho.values = embd_values;
    LayerJob job{"token_embd.weight", c.n_vocab, d, &*head_acc};
    std::vector<float> dense(w.token_embd.data_as<float>(),
                             w.token_embd.data_as<float>() + w.token_embd.numel());
    SPARQ_ASSIGN_OR_RETURN(PrunedLayer p, PruneOne(std::move(dense), job, ho, false, cfg, pool));
    result.prune_seconds += p.result.report.seconds;
    result.dense_bytes += static_cast<double>(c.n_vocab * d * 4);
    result.stored_bytes += static_cast<double>(p.result.stored_bytes);
    ck.matrices.push_back({job.name, std::move(p.stored), Pattern::Dense()});
    result.layers.push_back(std::move(p.result));
    if (opt.embedding_int8_rows > 0) {
      const std::vector<int32_t> ids =
          FrequentTokenIds(calib, c.n_vocab, opt.embedding_int8_rows);
      SPARQ_ASSIGN_OR_RETURN(DenseMatrix rows, RowsInt8(w.token_embd, ids));
      result.stored_bytes += static_cast<double>(rows.ByteSize());
      ck.matrices.push_back({"token_embd.rows.weight", std::move(rows), Pattern::Dense()});
      const Tensor ids_t =
          Tensor::View(DType::kI32, {static_cast<int64_t>(ids.size())}, ids.data());
      ck.tensors.push_back({"token_embd.rows.ids", ids_t.Clone()});
    }
  } else if (embd_opt && embd_values.quantized()) {
    // An embedding untied from the head is only looked up: round to nearest.
    SPARQ_ASSIGN_OR_RETURN(SparseMatrix em,
                           Encode(std::span<const float>(w.token_embd.data_as<float>(),
                                                         w.token_embd.numel()),
                                  c.n_vocab, d, FormatKind::kDense, Pattern::Dense(), DType::kF32));
    SPARQ_ASSIGN_OR_RETURN(DenseMatrix q, DenseMatrix::Quantize(std::get<DenseMatrix>(em),
                                                                embd_values, {},
                                                                "token_embd.weight"));
    ck.matrices.push_back({"token_embd.weight", std::move(q), Pattern::Dense()});
  } else if (embd_opt && embd_values.dtype != small_dtype) {
    const DType et = embd_values.dtype;
    SPARQ_RETURN_IF_ERROR(FitsValueType(
        std::span<const float>(w.token_embd.data_as<float>(), w.token_embd.numel()), et,
        "token_embd.weight"));
    if (et == DType::kF32) {
      ck.tensors.push_back({"token_embd.weight", w.token_embd.Clone()});
    } else {
      SPARQ_ASSIGN_OR_RETURN(Tensor te, FromF32(w.token_embd, et));
      ck.tensors.push_back({"token_embd.weight", std::move(te)});
    }
  } else if (small_dtype != DType::kF32) {
    SPARQ_RETURN_IF_ERROR(
        FitsValueType(std::span<const float>(w.token_embd.data_as<float>(), w.token_embd.numel()),
                      small_dtype, "token_embd.weight"));
    SPARQ_ASSIGN_OR_RETURN(Tensor te, FromF32(w.token_embd, small_dtype));
    ck.tensors.push_back({"token_embd.weight", std::move(te)});
  } else {
    ck.tensors.push_back({"token_embd.weight", w.token_embd.Clone()});
  }
  ck.tensors.push_back({"output_norm.weight", VectorTensor(w.output_norm)});
  ck.metadata["sparq.model"] = c.ToJson();
  ck.metadata["sparq.tokenizer"] = model.tokenizer().data().ToJson();
  std::string source = model_path;
  while (source.size() > 1 && source.back() == '/') source.pop_back();  // a folder "dir/"
  source = source.substr(source.find_last_of('/') + 1);
  nlohmann::json how = {{"source", source},
                        {"method", std::string(PruneMethodName(opt.method))},
                        {"pattern", opt.pattern.ToString()},
                        {"values", opt.values.Name()},
                        {"permute", opt.permute},
                        {"calib_samples", S},
                        {"calib_len", L},
                        {"seed", opt.seed},
                        {"damp", opt.damp},
                        {"summary", nlohmann::json::parse(result.ToJson(false))}};
  if (embd_opt) how["embedding_values"] = embd_opt->Name();
  if (opt.embedding_int8_rows > 0) how["embedding_int8_rows"] = opt.embedding_int8_rows;
  if (input_ck) how["masks"] = "kept from the input's sparse layers";
  if (opt.allocation == ModelPruneOptions::Allocation::kOwl) {
    how["allocation"] = {{"method", "owl"},
                         {"lambda", opt.owl_lambda},
                         {"threshold", opt.owl_threshold},
                         {"block_sparsity", result.block_sparsity}};
  }
  if (opt.values.quantized()) {
    how["quant_method"] =
        opt.quant_method == ModelPruneOptions::QuantMethod::kGptq ? "gptq" : "rtn";
    if (opt.act_order) how["act_order"] = true;
  }
  ck.metadata["sparq.prune"] = how.dump();
  SPARQ_RETURN_IF_ERROR(WriteCheckpoint(out_path, ck));
  result.seconds = Since(t_start);
  return result;
}

}  // namespace sparq
