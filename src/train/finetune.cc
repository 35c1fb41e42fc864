// `sparq finetune` below the command line (sparq/finetune.h): loads the student and the teacher,
// tokenizes the texts, checks a resumed state against this run, trains with TrainLoop and writes
// the trained .sparq.
#include "sparq/finetune.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "sparq/checkpoint.h"
#include "sparq/model.h"
#include "src/train/stored_slots.h"

namespace sparq::train {
namespace {

// The student must be a .sparq model: OUT is written in its formats (a GGUF or an HF folder has
// no sparse structure to keep). Returns its checkpoint: the stored structure of quantized slots.
Result<Checkpoint> ReadStudentFile(const std::string& path) {
  auto ck = ReadCheckpoint(path);
  if (!ck.ok()) {
    return ck.status().WithContext("finetune: the student must be a .sparq checkpoint");
  }
  if (ck->metadata.find("sparq.model") == ck->metadata.end()) {
    return InvalidInput("finetune: " + path +
                        " has no model configuration ('sparq.model' "
                        "metadata): the student must be a model checkpoint made by `sparq prune`");
  }
  return std::move(*ck);
}

// Distillation compares logits token by token: the teacher must number the tokens the same way.
Status CheckTeacherVocabulary(const LlamaModel& student, const std::string& student_path,
                              const LlamaModel& teacher, const std::string& teacher_path) {
  const int64_t ns = student.config().n_vocab, nt = teacher.config().n_vocab;
  if (ns != nt) {
    return InvalidInput("finetune: the teacher " + teacher_path + " has " + std::to_string(nt) +
                        " tokens, the student " + student_path + " has " + std::to_string(ns) +
                        ": distillation needs the same vocabulary");
  }
  const auto& ts = student.tokenizer().data().tokens;
  const auto& tt = teacher.tokenizer().data().tokens;
  if (ts.size() != tt.size()) {
    return InvalidInput("finetune: the tokenizer of the teacher " + teacher_path + " has " +
                        std::to_string(tt.size()) + " tokens, that of the student " + student_path +
                        " has " + std::to_string(ts.size()));
  }
  for (size_t i = 0; i < ts.size(); ++i) {
    if (ts[i] != tt[i]) {
      return InvalidInput("finetune: token " + std::to_string(i) + " is '" + tt[i] +
                          "' in the teacher " + teacher_path + " and '" + ts[i] +
                          "' in the student " + student_path +
                          ": distillation needs the same vocabulary");
    }
  }
  return Status::Ok();
}

// A resumed state must continue this run: same model shape and masks (the student), the same
// options (a changed option would make the result differ from an uninterrupted run). The data is
// checked by TrainLoop. checkpoint_every may change: it does not change the result.
Status CheckResume(const std::string& path, const TrainState& s, const LlamaConfig& c,
                   const std::vector<BlockMasks>& masks, const TrainOptions& o) {
  const std::string pre = "finetune: --resume: " + path + " ";
  if (s.config.ToJson() != c.ToJson()) {
    return InvalidInput(pre + "was trained from another model (its configuration differs)");
  }
  if (s.masks.size() != masks.size()) {
    return InvalidInput(pre + "was trained from another student (its masks differ)");
  }
  for (size_t l = 0; l < masks.size(); ++l) {
    for (int k = 0; k < kNumSlots; ++k) {
      std::vector<int64_t> a = s.masks[l].kept[k], b = masks[l].kept[k];
      std::sort(a.begin(), a.end());
      std::sort(b.begin(), b.end());
      if (a != b) {
        return InvalidInput(pre + "was trained from another student (the mask of blk." +
                            std::to_string(l) + "." +
                            std::string(SlotName(static_cast<LinearSlot>(k))) + ".weight differs)");
      }
    }
  }
  const TrainOptions& so = s.options;
  auto differ = [&](const char* what, double then, double now) -> Status {
    auto str = [](double x) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.10g", x);
      return std::string(buf);
    };
    return InvalidInput(pre + "was trained with " + what + " " + str(then) +
                        ", this run asks for " + str(now));
  };
  const std::pair<const char*, std::pair<double, double>> fields[] = {
      {"--seq-len", {double(so.seq_len), double(o.seq_len)}},
      {"--accum", {double(so.accum), double(o.accum)}},
      {"total steps (--tokens)", {double(so.schedule.total_steps), double(o.schedule.total_steps)}},
      {"--warmup", {double(so.schedule.warmup_steps), double(o.schedule.warmup_steps)}},
      {"--lr", {so.schedule.peak, o.schedule.peak}},
      {"min lr ratio", {so.schedule.min_ratio, o.schedule.min_ratio}},
      {"--kl", {so.kl_weight, o.kl_weight}},
      {"--ce", {so.ce_weight, o.ce_weight}},
      {"--tau", {so.tau, o.tau}},
      {"--hidden", {so.hidden_weight, o.hidden_weight}},
      {"weight decay", {so.adamw.weight_decay, o.adamw.weight_decay}},
      {"max grad norm", {so.adamw.max_grad_norm, o.adamw.max_grad_norm}},
      {"beta1", {so.adamw.beta1, o.adamw.beta1}},
      {"beta2", {so.adamw.beta2, o.adamw.beta2}},
      {"eps", {so.adamw.eps, o.adamw.eps}},
  };
  for (const auto& [what, v] : fields) {
    if (v.first != v.second) return differ(what, v.first, v.second);
  }
  if (so.seed != o.seed) return InvalidInput(pre + "was trained with another --seed");
  if (so.adamw.norms_only != o.adamw.norms_only) {
    return InvalidInput(pre + "was trained with --train " +
                        (so.adamw.norms_only ? "norms" : "all") + ", this run asks for --train " +
                        (o.adamw.norms_only ? "norms" : "all"));
  }
  return Status::Ok();
}

// `sparq eval`'s protocol on the training forward: non-overlapping windows of ctx tokens (the
// last, shorter one too when it has >= 2), each token after a window's first predicted from those
// before it. The masters hold exact zeros where pruned, so no masks are needed.
Result<double> WindowPerplexity(const LlamaConfig& c, const ModelWeights& w,
                                std::span<const int32_t> tokens, int64_t ctx, ThreadPool* pool,
                                int64_t* predicted) {
  const auto n = static_cast<int64_t>(tokens.size());
  double nll = 0.0;
  int64_t count = 0;
  const TrainExec exec{.fast = true, .pool = pool};
  for (int64_t at = 0; at + 2 <= n; at += ctx) {
    const int64_t len = std::min(ctx, n - at);
    LossResult r;
    SPARQ_RETURN_IF_ERROR(
        ModelLossAndGrad(c, w, {}, tokens.subspan(at, len), LossSpec{}, &r, nullptr, exec));
    nll += r.ce * static_cast<double>(len - 1);
    count += len - 1;
  }
  *predicted = count;
  return std::exp(nll / static_cast<double>(count));
}

}  // namespace

std::string FinetuneResult::ToJson() const {
  nlohmann::json j = {{"steps", steps},
                      {"start_step", start_step},
                      {"end_step", end_step},
                      {"data_tokens", data_tokens},
                      {"trained_tokens", trained_tokens},
                      {"first_loss", first_loss},
                      {"last_loss", last_loss},
                      {"seconds", seconds},
                      {"wrote_out", wrote_out},
                      {"requant_gptq", requant_gptq},
                      {"requant_rtn", requant_rtn}};
  if (!curve.empty()) {
    nlohmann::json pts = nlohmann::json::array();
    for (const FinetuneCurvePoint& p : curve) {
      pts.push_back({{"step", p.step},
                     {"tokens", p.tokens},
                     {"perplexity", p.perplexity},
                     {"perplexities", p.perplexities}});
    }
    j["curve"] = pts;
    j["eval_texts"] = eval_names;
    j["eval_predicted"] = eval_predicted;
  }
  return j.dump(2);
}

Result<FinetuneResult> Finetune(const FinetuneOptions& o, const KernelConfig& cfg,
                                ThreadPool* pool) {
  const auto t0 = std::chrono::steady_clock::now();
  if (o.out.empty()) return InvalidInput("finetune: no output path (-o)");
  if (o.tokens < 1) return InvalidInput("finetune: --tokens must be >= 1");
  if (o.seq_len < 1 || o.accum < 1) {
    return InvalidInput("finetune: --seq-len and --accum must be >= 1");
  }
  if (o.texts.empty()) return InvalidInput("finetune: no training text (--text)");
  if (o.eval_every < 0) return InvalidInput("finetune: --eval-every must be >= 0");
  if (o.write_at_stop && o.stop_at < 0) {
    return InvalidInput("finetune: --snapshot writes OUT at --stop-at N: give the step");
  }
  if (o.eval_every > 0 && o.eval_texts.empty()) {
    return InvalidInput("finetune: --eval-every needs an evaluation text (--eval-text)");
  }
  if (o.eval_every > 0 && o.eval_tokens < 2) {
    return InvalidInput("finetune: --eval-tokens must be >= 2");
  }
  if (!std::isfinite(o.hidden) || o.hidden < 0) {
    return InvalidInput("finetune: --hidden must be finite and >= 0, got " +
                        std::to_string(o.hidden));
  }
  SPARQ_ASSIGN_OR_RETURN(Checkpoint student_ck, ReadStudentFile(o.student));
  SPARQ_ASSIGN_OR_RETURN(LlamaModel student, LlamaModel::Load(o.student, cfg));
  const LlamaConfig c = student.config();

  std::vector<int32_t> tokens;
  std::string names;
  for (const FinetuneText& t : o.texts) {
    auto ids = student.tokenizer().Encode(t.text, student.tokenizer().data().add_bos);
    if (!ids.ok()) return ids.status().WithContext("finetune: " + t.name);
    tokens.insert(tokens.end(), ids->begin(), ids->end());
    names += (names.empty() ? "" : ", ") + t.name;
  }
  // Each eval text as `sparq eval` reads it: no BOS, its first eval_tokens tokens.
  std::vector<std::vector<int32_t>> eval_ids;
  for (const FinetuneText& t : o.eval_texts) {
    if (o.eval_every == 0) break;
    auto ids = student.tokenizer().Encode(t.text);
    if (!ids.ok()) return ids.status().WithContext("finetune: --eval-text " + t.name);
    if (static_cast<int64_t>(ids->size()) > o.eval_tokens) ids->resize(o.eval_tokens);
    if (ids->size() < 2) {
      return InvalidInput("finetune: the evaluation text " + t.name + " holds fewer than 2 tokens");
    }
    eval_ids.push_back(std::move(*ids));
  }
  if (static_cast<int64_t>(tokens.size()) < o.seq_len + 1) {
    return InvalidInput("finetune: the texts (" + names + ") hold " +
                        std::to_string(tokens.size()) + " tokens; a training window needs " +
                        "--seq-len + 1 = " + std::to_string(o.seq_len + 1));
  }

  TrainOptions to;
  const int64_t per_step = o.seq_len * o.accum;
  const int64_t steps = (o.tokens + per_step - 1) / per_step;
  int64_t warmup = o.warmup;
  if (warmup < 0) warmup = std::min(steps / 20, steps - 1);
  to.schedule = {o.lr, warmup, steps, o.min_lr_ratio};
  to.adamw.weight_decay = o.weight_decay;
  to.adamw.max_grad_norm = o.max_grad_norm;
  to.adamw.norms_only = o.norms_only;
  to.seq_len = o.seq_len;
  to.accum = o.accum;
  to.seed = o.seed;
  to.checkpoint_every = o.checkpoint_every;
  to.ce_weight = o.ce;
  to.kl_weight = o.kl;
  to.tau = o.tau;
  to.hidden_weight = o.hidden;
  SPARQ_RETURN_IF_ERROR(to.Validate(c).WithContext("finetune"));

  std::optional<LlamaModel> teacher;
  std::optional<TrainableModel> teacher_f32;  // SquareHead's teacher (replaces `teacher`)
  LlamaConfig tc;
  if (o.kl > 0 || o.hidden > 0) {
    if (o.teacher.empty()) return InvalidInput("finetune: --kl or --hidden > 0 needs a --teacher");
    // Logits only (no --hidden): a GGUF's Q4_x / Q8_0 layers run as stored, the same values as
    // its f32 load in ~1/5 of the memory and no f32 embedding table; since the sgemm rows their
    // windows run as fast as f32's (docs/measurements/zen5-dense-quant-sgemm-2026-12-07.md).
    // SquareHead's teacher becomes f32 masters below, so it loads as f32. The teacher's logits
    // are the targets: f32 activations even where the run decodes with int8 ones (a window of
    // <= 16 tokens runs the decode rows).
    KernelConfig tcfg = cfg;
    tcfg.int8_activations = false;
    LoadOptions tlo;
    if (o.hidden == 0) tlo = {.gguf_values = GgufValues::kAsStored, .embedding_table = false};
    auto t = LlamaModel::Load(o.teacher, tcfg, tlo);
    if (!t.ok()) return t.status().WithContext("finetune: teacher");
    teacher.emplace(std::move(*t));
    SPARQ_RETURN_IF_ERROR(CheckTeacherVocabulary(student, o.student, *teacher, o.teacher));
    tc = teacher->config();
  }
  if (o.hidden > 0) {
    // SquareHead matches block l of the student with block l of the teacher, row for row.
    if (tc.n_layer != c.n_layer || tc.n_embd != c.n_embd) {
      return InvalidInput("finetune: --hidden compares block outputs, but the teacher " +
                          o.teacher + " has " + std::to_string(tc.n_layer) + " blocks of width " +
                          std::to_string(tc.n_embd) + " and the student " + o.student + " " +
                          std::to_string(c.n_layer) + " of width " + std::to_string(c.n_embd));
    }
    auto tm = FromLlamaModel(*teacher, pool);
    if (!tm.ok()) return tm.status().WithContext("finetune: --hidden: teacher " + o.teacher);
    teacher_f32.emplace(std::move(*tm));
    teacher.reset();  // its f32 masters replace it
  }

  const std::string state_path = o.state_path.empty() ? o.out + ".state" : o.state_path;
  SPARQ_ASSIGN_OR_RETURN(TrainableModel tm, FromLlamaModel(student, pool));
  student = LlamaModel();  // the f32 masters replace it
  SPARQ_RETURN_IF_ERROR(StudentQuantizedMasters(student_ck, c, &tm).WithContext(o.student));
  bool quantized = false;
  for (const CheckpointTensor& ct : student_ck.matrices)
    quantized = quantized || IsQuantized(ct.matrix);
  if (!quantized) student_ck = Checkpoint();  // kept for GPTQ's re-quantization only
  TrainState state;
  if (o.resume) {
    SPARQ_ASSIGN_OR_RETURN(state, LoadTrainState(state_path));
    SPARQ_RETURN_IF_ERROR(CheckResume(state_path, state, c, tm.masks, to));
    state.options.checkpoint_every = o.checkpoint_every;
  } else {
    SPARQ_ASSIGN_OR_RETURN(state, NewTrainState(c, std::move(tm.weights), std::move(tm.masks), to));
  }
  tm = TrainableModel();

  FinetuneResult r;
  for (const FinetuneText& t : o.eval_texts) {
    if (o.eval_every > 0) r.eval_names.push_back(t.name);
  }
  r.steps = steps;
  r.start_step = state.step();
  r.data_tokens = static_cast<int64_t>(tokens.size());
  TrainLoopOptions lo;
  lo.checkpoint_path = state_path;
  std::vector<BlockActivations> activations;  // the steps' kept activations, reused
  lo.exec = {.fast = true,
             .pool = pool,
             .timers = o.timers,
             .activations = o.keep_activations ? &activations : nullptr};
  lo.progress = [&](const TrainProgress& p) {
    if (p.step == r.start_step + 1) r.first_loss = p.loss;
    r.last_loss = p.loss;
    if (o.progress) o.progress(p);
  };
  std::optional<KvCache> cache;
  if (teacher_f32) {
    // The training forward (f32 masters, the fast path): it keeps every block's output, which
    // the runtime's forward does not expose. Not timed into o.timers' forward: the loop counts
    // the whole call as the teacher's time.
    lo.teacher_hidden = [&](std::span<const int32_t> in, std::span<float> logits,
                            std::span<float> hidden) -> Status {
      return ModelLogitsAndHidden(tc, teacher_f32->weights, in, logits, hidden,
                                  {.fast = true, .pool = pool});
    };
  } else if (teacher) {
    SPARQ_ASSIGN_OR_RETURN(KvCache kv, teacher->NewCache(o.seq_len));
    cache.emplace(std::move(kv));
    lo.teacher = [&](std::span<const int32_t> in, std::span<float> logits) -> Status {
      cache->Clear();  // each window is its own sequence from position 0
      return teacher->Forward(in, &*cache, logits.data(), /*all_logits=*/true, pool);
    };
  }
  auto evaluate = [&]() -> Status {
    FinetuneCurvePoint p{state.step(), state.step() * per_step, 0.0, {}};
    r.eval_predicted = 0;
    for (size_t i = 0; i < eval_ids.size(); ++i) {
      int64_t predicted = 0;
      auto ppl = WindowPerplexity(c, state.weights, eval_ids[i], o.seq_len, pool, &predicted);
      if (!ppl.ok()) return ppl.status().WithContext("finetune: --eval-text " + o.eval_texts[i].name);
      p.perplexities.push_back(*ppl);
      r.eval_predicted += predicted;
    }
    p.perplexity = p.perplexities.front();
    r.curve.push_back(p);
    if (o.on_eval) o.on_eval(p);
    return Status::Ok();
  };
  // The run goes in pieces that end at the curve's steps; TrainLoop continues a state exactly
  // (that is what --resume relies on), so the pieces train as one call would.
  const int64_t last = o.stop_at >= 0 ? std::min(o.stop_at, steps) : steps;
  if (o.eval_every > 0 && state.step() == 0) SPARQ_RETURN_IF_ERROR(evaluate());
  Status st = Status::Ok();
  while (st.ok()) {
    int64_t until = last;
    if (o.eval_every > 0) until = std::min(last, (state.step() / o.eval_every + 1) * o.eval_every);
    lo.stop_at = until;
    const int64_t before = state.step();
    st = TrainLoop(&state, tokens, lo);
    if (!st.ok()) break;
    if (o.eval_every > 0 && state.step() > before &&
        (state.step() % o.eval_every == 0 || state.step() == steps)) {
      SPARQ_RETURN_IF_ERROR(evaluate());
    }
    if (state.step() >= last) break;
  }
  if (!st.ok()) {
    // *state holds the last completed step: keep it, so that the run is not lost.
    if (state.step() > r.start_step && SaveTrainState(state_path, state).ok()) {
      return Status(st.code(), "finetune: training stopped: " + st.message() + "; the state of " +
                                   "step " + std::to_string(state.step()) + " is saved in " +
                                   state_path);
    }
    return st.WithContext("finetune: training stopped");
  }
  r.end_step = state.step();
  r.trained_tokens = (r.end_step - r.start_step) * per_step;
  if (state.step() >= steps || (o.write_at_stop && o.stop_at >= 0)) {
    nlohmann::json how = {{"student", o.student},
                          {"teacher", o.teacher},
                          {"steps", steps},
                          {"seq_len", o.seq_len},
                          {"accum", o.accum},
                          {"lr", o.lr},
                          {"warmup", warmup},
                          {"kl", o.kl},
                          {"ce", o.ce},
                          {"tau", o.tau},
                          {"hidden", o.hidden},
                          {"seed", o.seed},
                          {"data_tokens", r.data_tokens},
                          {"train", o.norms_only ? "norms" : "all"}};
    SPARQ_ASSIGN_OR_RETURN(Checkpoint out, FinetunedCheckpoint(o.student, c, state.weights, false));
    if (quantized && o.gptq) {
      std::string calib;
      for (const FinetuneText& t : o.texts) calib += (calib.empty() ? "" : "\n\n") + t.text;
      // CalibrationTokens needs calib_len + 1 tokens of the text (encoded without BOS).
      const int64_t len = std::max<int64_t>(
          1, std::min<int64_t>({o.seq_len, 512, static_cast<int64_t>(tokens.size()) - 2}));
      SPARQ_ASSIGN_OR_RETURN(GptqRequantReport g,
                             RequantizeWithGptq(student_ck, o.student, c, state.weights, calib, len,
                                                o.seed, o.out, cfg, pool, &out));
      r.requant_gptq = g.gptq;
      r.requant_rtn = g.rtn;
      how["requant"] = {{"method", "gptq"}, {"gptq", g.gptq}, {"rtn", g.rtn}, {"calib_len", len}};
      if (!g.note.empty()) how["requant"]["note"] = g.note;
    } else if (quantized) {
      r.requant_rtn = static_cast<int64_t>(TrainedQuantizedBlockMatrices(student_ck, out).size());
      how["requant"] = {{"method", "rtn"}, {"rtn", r.requant_rtn}};
    }
    if (state.step() < steps) how["snapshot_step"] = state.step();  // write_at_stop
    out.metadata["sparq.finetune"] = how.dump();
    SPARQ_RETURN_IF_ERROR(WriteCheckpoint(o.out, out));
    r.wrote_out = true;
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace sparq::train
