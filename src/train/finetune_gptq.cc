// Re-quantization of a finetuned quantized student by GPTQ (sparq/finetune.h, Finetune with
// FinetuneOptions::gptq): the library path `sparq quantize` takes (PruneLlama with the dense
// pattern on a pruned .sparq: GPTQ with each sparse layer's mask fixed), run on a temporary copy
// of OUT that holds the trained f32 numbers in the student's structure, once per value spec (a
// student may mix specs), calibrated on the finetune's own text. Its matrices replace the round-
// to-nearest ones only where they keep the student's structure bit for bit and its value spec:
// PruneLlama reads a sparse layer's mask from its nonzero values, so a kept weight that is still
// exactly 0 after training (or a channel-permuted layer, which it refuses) keeps round to nearest.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "sparq/finetune.h"
#include "sparq/model.h"
#include "src/train/stored_slots.h"

namespace sparq::train {
namespace {

bool SameBytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

// The structure (not the values) of a and b is the same, bit for bit.
bool SameStructure(const SparseMatrix& a, const SparseMatrix& b) {
  if (KindOf(a) != KindOf(b) || Rows(a) != Rows(b) || Cols(a) != Cols(b) ||
      ValuesName(a) != ValuesName(b)) {
    return false;
  }
  if (const auto* x = std::get_if<NmMatrix>(&a)) {
    const auto& y = std::get<NmMatrix>(b);
    return x->n == y.n && x->m == y.m && SameBytes(x->meta, y.meta);
  }
  if (const auto* x = std::get_if<CsrMatrix>(&a)) {
    const auto& y = std::get<CsrMatrix>(b);
    return SameBytes(x->row_ptr, y.row_ptr) && SameBytes(x->col_idx, y.col_idx);
  }
  return KindOf(a) == FormatKind::kDense;
}

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
                                             const std::string& tmp_prefix,
                                             const KernelConfig& cfg, ThreadPool* pool,
                                             Checkpoint* out) {
  GptqRequantReport rep;
  // Trained, quantized block slots by value spec.
  std::map<std::string, std::vector<std::string>> by_spec;
  bool permuted = false;
  for (const CheckpointTensor& ct : student.matrices) {
    if (!IsQuantized(ct.matrix) || !ct.name.starts_with("blk.")) continue;
    const CheckpointTensor* o = out->FindMatrix(ct.name);
    if (o == nullptr) continue;
    // Unchanged weights keep their codes (FinetunedCheckpoint): nothing to re-fit.
    if (SameBytes(QuantOf(o->matrix)->scales, QuantOf(ct.matrix)->scales) &&
        SameBytes(StoredValues(o->matrix), StoredValues(ct.matrix))) {
      continue;
    }
    ++rep.candidates;
    permuted = permuted || student.FindTensor(ct.name + ".perm") != nullptr;
    by_spec[QuantOf(ct.matrix)->spec.Name()].push_back(ct.name);
  }
  if (by_spec.empty()) return rep;
  if (permuted) {  // PruneLlama refuses a permuted input: round to nearest throughout
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
    auto r = PruneLlama(in_path, calib_text, opt, q_path, cfg, pool);
    if (!r.ok()) return r.status().WithContext("finetune: GPTQ re-quantization (" + spec_name + ")");
    SPARQ_ASSIGN_OR_RETURN(Checkpoint q, ReadCheckpoint(q_path));
    for (const std::string& n : names) {
      const CheckpointTensor* g = q.FindMatrix(n);
      CheckpointTensor* o = nullptr;
      for (CheckpointTensor& t : out->matrices) {
        if (t.name == n) o = &t;
      }
      if (g != nullptr && o != nullptr && SameStructure(g->matrix, o->matrix)) {
        o->matrix = g->matrix;
        ++rep.gptq;
      } else {
        ++rep.rtn;
      }
    }
  }
  return rep;
}

}  // namespace sparq::train
