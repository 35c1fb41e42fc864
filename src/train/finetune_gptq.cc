// Re-quantization of a finetuned quantized student by GPTQ (sparq/finetune.h, Finetune with
// FinetuneOptions::gptq): the library path `sparq quantize` takes (PruneLlama with the dense
// pattern on a pruned .sparq: GPTQ with each sparse layer's mask fixed), run on a temporary copy
// of OUT that holds the trained f32 numbers in the student's structure, once per value spec (a
// student may mix specs), calibrated on the finetune's own text. Its values and groups are
// written into the student's structure (InStudentStructure), which stays bit for bit. A
// channel-permuted student (PruneLlama refuses it) keeps round to nearest throughout.
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "sparq/finetune.h"
#include "sparq/model.h"
#include "src/train/stored_slots.h"

namespace sparq::train {
namespace {

bool SameShape(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape();
}
bool SameBytes(const Tensor& a, const Tensor& b) {
  return SameShape(a, b) && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

// GPTQ's matrix g of a layer in the student's structure (that of rtn, the same layer rounded to
// nearest): GPTQ's dequantized values at the student's slots, coded on GPTQ's groups (its
// values lie on them, so their nearest codes give them back). GPTQ's own structure may differ
// where it stored a kept weight that is 0 (PruneLlama encodes N:M from the values), but its
// quantization groups are the same (N:M: consecutive kept slots; CSR, dense: column ranges).
// nullopt where g does not fit: another kind, spec or group count, or a nonzero outside rtn's
// structure.
Result<std::optional<SparseMatrix>> InStudentStructure(const SparseMatrix& rtn,
                                                       const SparseMatrix& g,
                                                       const std::string& name) {
  const QuantParts* rq = QuantOf(rtn);
  const QuantParts* gq = QuantOf(g);
  if (KindOf(rtn) != KindOf(g) || Rows(rtn) != Rows(g) || Cols(rtn) != Cols(g) ||
      ValuesName(rtn) != ValuesName(g) || rq == nullptr || gq == nullptr ||
      !SameShape(rq->scales, gq->scales)) {
    return std::optional<SparseMatrix>();
  }
  const ValueSpec& spec = rq->spec;
  const auto n_groups = static_cast<int64_t>(gq->scales.numel());
  const auto* sc = gq->scales.data_as<uint16_t>();
  const uint16_t* mn = spec.has_min() ? gq->mins.data_as<uint16_t>() : nullptr;
  std::vector<QuantGroup> fitted(n_groups);
  for (int64_t i = 0; i < n_groups; ++i) {
    fitted[i] = QuantGroupFromF16(sc[i], mn != nullptr ? mn[i] : 0, spec);
  }
  const Tensor d = ToDense(g);
  const float* dp = d.data_as<float>();
  const std::vector<int64_t> pos = SlotPositions(rtn);
  std::vector<bool> covered(static_cast<size_t>(d.numel()), false);
  Tensor nt = Tensor::Alloc(DType::kF32, NumberShape(rtn));
  float* nv = nt.mutable_data_as<float>();
  for (size_t i = 0; i < pos.size(); ++i) {
    nv[i] = pos[i] < 0 ? 0.0f : dp[pos[i]];
    if (pos[i] >= 0) covered[pos[i]] = true;
  }
  for (size_t j = 0; j < covered.size(); ++j) {
    if (!covered[j] && dp[j] != 0.0f) return std::optional<SparseMatrix>();
  }
  SPARQ_ASSIGN_OR_RETURN(SparseMatrix q,
                         QuantizeMatrix(WithNumbers(rtn, std::move(nt)), spec, fitted, name));
  SPARQ_RETURN_IF_ERROR(Validate(q, name));
  return std::optional<SparseMatrix>(std::move(q));
}

}  // namespace

std::vector<std::string> TrainedQuantizedBlockMatrices(const Checkpoint& student,
                                                       const Checkpoint& out) {
  std::vector<std::string> names;
  for (const CheckpointTensor& ct : student.matrices) {
    if (!IsQuantized(ct.matrix) || !ct.name.starts_with("blk.")) continue;
    const CheckpointTensor* o = out.FindMatrix(ct.name);
    if (o == nullptr || !IsQuantized(o->matrix)) continue;
    // Unchanged weights keep their codes (FinetunedCheckpoint): nothing was re-fitted.
    if (SameBytes(QuantOf(o->matrix)->scales, QuantOf(ct.matrix)->scales) &&
        SameBytes(StoredValues(o->matrix), StoredValues(ct.matrix))) {
      continue;
    }
    names.push_back(ct.name);
  }
  return names;
}

namespace {

std::string EscapeRegex(const std::string& s) {
  std::string r;
  for (char ch : s) {
    if (std::strchr(".^$|()[]{}*+?\\", ch) != nullptr) r.push_back('\\');
    r.push_back(ch);
  }
  return r;
}

}  // namespace

Result<GptqRequantReport> RequantizeWithGptq(const Checkpoint& student,
                                             const std::string& student_path, const LlamaConfig& c,
                                             const ModelWeights& w, std::string_view calib_text,
                                             int64_t calib_len, uint64_t seed,
                                             const std::string& tmp_prefix, const KernelConfig& cfg,
                                             ThreadPool* pool, Checkpoint* out) {
  GptqRequantReport rep;
  // Trained, quantized block slots by value spec.
  std::map<std::string, std::vector<std::string>> by_spec;
  bool permuted = false;
  for (const std::string& name : TrainedQuantizedBlockMatrices(student, *out)) {
    ++rep.candidates;
    by_spec[QuantOf(student.FindMatrix(name)->matrix)->spec.Name()].push_back(name);
  }
  // PruneLlama refuses an input with any channel-permuted layer, quantized or not.
  for (const NamedTensor& t : student.tensors) permuted = permuted || t.name.ends_with(".perm");
  if (by_spec.empty()) return rep;
  if (permuted) {  // round to nearest throughout
    rep.rtn = rep.candidates;
    rep.note = "a channel-permuted layer: GPTQ re-quantization refuses permuted inputs";
    return rep;
  }
  const std::string in_path = tmp_prefix + ".gptq-in.sparq";
  const std::string q_path = tmp_prefix + ".gptq-out.sparq";
  struct Cleanup {
    std::vector<std::string> paths;
    ~Cleanup() {
      std::error_code ec;
      for (const auto& p : paths) std::filesystem::remove(p, ec);
    }
  } cleanup{{in_path, q_path}};
  SPARQ_ASSIGN_OR_RETURN(Checkpoint numbers, FinetunedCheckpoint(student_path, c, w, true));
  SPARQ_RETURN_IF_ERROR(WriteCheckpoint(in_path, numbers));
  numbers = Checkpoint();
  for (const auto& [spec_name, names] : by_spec) {
    ModelPruneOptions opt;
    opt.method = PruneMethod::kSparseGpt;
    opt.pattern = Pattern::Dense();
    SPARQ_ASSIGN_OR_RETURN(opt.values, ValueSpec::Parse(spec_name));
    opt.quant_method = ModelPruneOptions::QuantMethod::kGptq;
    opt.calib_len = calib_len;
    opt.calib_samples = 64;
    opt.seed = seed;
    opt.progress = false;
    opt.include.clear();
    for (const std::string& n : names) {
      opt.include += (opt.include.empty() ? "" : "|") + EscapeRegex(n);
    }
    // A failure here (after the training) keeps round to nearest for this spec and says why:
    // the trained run is not lost.
    auto r = PruneLlama(in_path, calib_text, opt, q_path, cfg, pool);
    auto q = r.ok() ? ReadCheckpoint(q_path) : Result<Checkpoint>(r.status());
    if (!q.ok()) {
      rep.rtn += static_cast<int64_t>(names.size());
      rep.note += (rep.note.empty() ? "" : "; ") + spec_name + ": " + q.status().ToString();
      continue;
    }
    for (const std::string& n : names) {
      const CheckpointTensor* g = q->FindMatrix(n);
      CheckpointTensor* o = nullptr;
      for (CheckpointTensor& t : out->matrices) {
        if (t.name == n) o = &t;
      }
      std::optional<SparseMatrix> in;
      if (g != nullptr && o != nullptr) {
        SPARQ_ASSIGN_OR_RETURN(in, InStudentStructure(o->matrix, g->matrix, n));
      }
      if (in) {
        o->matrix = std::move(*in);
        ++rep.gptq;
      } else {
        ++rep.rtn;
      }
    }
  }
  return rep;
}

}  // namespace sparq::train
