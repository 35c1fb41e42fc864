// `sparq finetune STUDENT.sparq --teacher MODEL --text FILE --tokens T -o OUT.sparq`: trains a
// pruned student with its masks fixed, by distillation and / or cross-entropy
// (sparq/finetune.h), and writes it in the student's formats.

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <sstream>
#include <utility>

#include "sparq/atomic_write.h"
#include "sparq/finetune.h"
#include "sparq/model.h"
#include "tools/command.h"
#include "tools/json_output.h"

namespace sparq::cli {
namespace {

struct FinetuneCliOptions {
  train::FinetuneOptions lib;
  std::vector<std::string> text_files;
  std::vector<std::string> eval_files;
  bool self_distill = false;
  train::SelfDistillOptions distill;
  std::string distill_cache;  // "": OUT.distill.txt
  std::string train = "all";  // --train all | norms
  std::string requant = "gptq";  // --requant gptq | rtn
  int threads = 0;
  bool timings = false;
  bool recompute_activations = false;
  train::TrainTimers timers;
  JsonOutput json;
  std::string log;  // --log FILE.csv
};

std::string Clock(double seconds) {
  const auto s = static_cast<long long>(std::max(0.0, seconds) + 0.5);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  return buf;
}

// --log FILE: the run as CSV, one row per step and one per point of the curve and text, kept
// whole across --resume: the JSON summary holds one invocation's points, a long run has many.
// Rows are flushed as written, so a killed run leaves whole rows (a torn last one is dropped on
// the next open); rows past the step a resumed state continues from are dropped then too (they
// were trained again), so the log reads as one uninterrupted run's. `seconds` is wall time since
// the run's first invocation started, the gaps between invocations left out.
class CsvLog {
 public:
  static constexpr const char* kHeader =
      "kind,step,tokens,loss,lr,grad_norm,tokens_per_s,seconds,text,perplexity";

  // Checks an existing file before any training: refused unless it is such a log.
  Status Open(const std::string& path) {
    path_ = path;
    if (!std::filesystem::exists(path)) return Status::Ok();
    SPARQ_ASSIGN_OR_RETURN(std::string text, ReadTextFile(path));
    std::istringstream in(text);
    std::string line;
    if (!std::getline(in, line) || line != kHeader) {
      return InvalidInput("finetune: --log " + path + " exists and is not a finetune log (its "
                          "first line is not \"" + std::string(kHeader) + "\"): not overwritten");
    }
    while (std::getline(in, line)) {
      // The last line, unterminated, is torn; a text's name may hold commas (quoted), so >= 10.
      if (!in.eof() && Fields(line) >= 10) rows_.push_back(line);
    }
    return Status::Ok();
  }

  // The first event of this invocation: keep the rows up to the state's step (none for a fresh
  // run), rewrite the file atomically with them and append from here on.
  void Start(int64_t start_step) {
    if (started_) return;
    started_ = true;
    std::string keep = std::string(kHeader) + "\n";
    for (const std::string& r : rows_) {
      const std::string step = Field(r, 1), sec = Field(r, 7);
      char* end = nullptr;
      const long long st = std::strtoll(step.c_str(), &end, 10);
      if (start_step <= 0 || end == step.c_str() || *end != '\0' || st > start_step) continue;
      keep += r + "\n";
      offset_ = std::max(offset_, std::strtod(sec.c_str(), nullptr));
    }
    io::AtomicWriter w;
    Status st = w.Open(path_);
    if (st.ok()) st = w.Write(keep.data(), keep.size());
    if (st.ok()) st = w.Commit();
    if (st.ok()) file_ = std::fopen(path_.c_str(), "a");
    if (!st.ok() || file_ == nullptr) {
      std::fprintf(stderr, "warning: --log %s: cannot write (%s); the run goes on without it\n",
                   path_.c_str(), st.ok() ? std::strerror(errno) : st.message().c_str());
    }
  }
  void Row(const std::string& row) {
    if (file_ == nullptr) return;
    std::fprintf(file_, "%s\n", row.c_str());
    std::fflush(file_);
  }
  double offset() const { return offset_; }
  ~CsvLog() {
    if (file_ != nullptr) std::fclose(file_);
  }

 private:
  static int Fields(const std::string& line) {
    return 1 + static_cast<int>(std::count(line.begin(), line.end(), ','));
  }
  static std::string Field(const std::string& line, int i) {
    size_t a = 0;
    for (int k = 0; k < i; ++k) a = line.find(',', a) + 1;
    return line.substr(a, line.find(',', a) - a);
  }
  std::string path_;
  std::vector<std::string> rows_;
  bool started_ = false;
  double offset_ = 0.0;
  std::FILE* file_ = nullptr;
};

// A text's name as a CSV field: quoted (file names may hold commas); quotes doubled.
std::string CsvName(const std::string& s) {
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

// The self-distillation text, from its cache when that was made with the same teacher and
// options (the first line records them), else generated from the teacher and cached atomically.
Result<train::FinetuneText> SelfDistillData(FinetuneCliOptions& o, const KernelConfig& cfg,
                                            ThreadPool* pool) {
  if (o.lib.teacher.empty()) return InvalidInput("--self-distill samples the --teacher: give one");
  const std::string path = o.distill_cache.empty() ? o.lib.out + ".distill.txt" : o.distill_cache;
  const train::SelfDistillOptions& d = o.distill;
  char header[512];
  std::snprintf(header, sizeof header,
                "# sparq self-distill: teacher %s, %lld tokens, samples of %lld, temperature %g, "
                "top-k %lld, top-p %g, seed %llu, batch %lld%s\n",
                std::filesystem::path(o.lib.teacher).filename().string().c_str(),
                static_cast<long long>(d.tokens), static_cast<long long>(d.sample_len),
                d.temperature, static_cast<long long>(d.top_k), d.top_p,
                static_cast<unsigned long long>(d.seed), static_cast<long long>(d.batch),
                // The sampler decodes with the run's activations (int8 X rounds the teacher's
                // quantized products): a cache made with f32 ones holds other samples.
                cfg.int8_activations ? ", activations int8" : "");
  if (std::filesystem::exists(path)) {
    Result<std::string> cached = ReadTextFile(path);
    if (cached.ok() && cached->rfind(header, 0) == 0) {
      std::fprintf(stderr, "self-distill: using %s\n", path.c_str());
      return train::FinetuneText{path, cached->substr(std::strlen(header))};
    }
    std::fprintf(stderr, "self-distill: %s %s; generating again\n", path.c_str(),
                 cached.ok() ? "was made with other options"
                             : ("cannot be reused (" + cached.status().message() + ")").c_str());
  }
  LoadOptions lo;
  lo.gguf_values = GgufValues::kAsStored;  // the same values, 2x the decode speed (gguf_values_flag.h)
  lo.embedding_table = false;              // it only samples: the head's rows serve the lookup
  SPARQ_ASSIGN_OR_RETURN(LlamaModel teacher, LlamaModel::Load(o.lib.teacher, cfg, lo));
  const bool tty = ::isatty(2) != 0;
  const auto start = std::chrono::steady_clock::now();
  train::SelfDistillOptions run = d;
  run.progress = [&](int64_t done, int64_t total) {
    const double el =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr, "%sself-distill: %lld/%lld tokens  %.0f tok/s  ETA %s%s", tty ? "\r" : "",
                 static_cast<long long>(done), static_cast<long long>(total), done / el,
                 Clock(el / done * static_cast<double>(total - done)).c_str(),
                 tty && done < total ? "   " : "\n");
  };
  SPARQ_ASSIGN_OR_RETURN(std::string text, train::SelfDistillText(teacher, run, pool));
  io::AtomicWriter w;
  SPARQ_RETURN_IF_ERROR(w.Open(path));
  SPARQ_RETURN_IF_ERROR(w.Write(header, std::strlen(header)));
  SPARQ_RETURN_IF_ERROR(w.Write(text.data(), text.size()));
  SPARQ_RETURN_IF_ERROR(w.Commit());
  return train::FinetuneText{path, std::move(text)};
}

Status RunFinetune(FinetuneCliOptions& o, const KernelConfig& cfg) {
  ThreadPool pool(o.threads > 0 ? o.threads : DefaultThreads());
  if (o.text_files.empty() && !o.self_distill) {
    return InvalidInput("finetune: give training text (--text FILE) or --self-distill");
  }
  for (const std::string& f : o.text_files) {
    SPARQ_ASSIGN_OR_RETURN(std::string text, ReadTextFile(f));
    o.lib.texts.push_back({f, std::move(text)});
  }
  for (const std::string& f : o.eval_files) {
    SPARQ_ASSIGN_OR_RETURN(std::string text, ReadTextFile(f));
    o.lib.eval_texts.push_back({f, std::move(text)});
  }
  if (!o.eval_files.empty() && o.lib.eval_every == 0) {
    return InvalidInput("finetune: --eval-text needs --eval-every N (steps between points)");
  }
  std::optional<CsvLog> log;
  if (!o.log.empty()) {
    log.emplace();
    SPARQ_RETURN_IF_ERROR(log->Open(o.log));
  }
  if (o.self_distill) {
    SPARQ_ASSIGN_OR_RETURN(train::FinetuneText t, SelfDistillData(o, cfg, &pool));
    o.lib.texts.push_back(std::move(t));
  }
  // One line per step on a log, one line redrawn on a terminal; the ETA from this call's mean
  // step time (a resumed run's first steps are not in it).
  const bool tty = ::isatty(2) != 0;
  const auto start = std::chrono::steady_clock::now();
  int64_t first_step = -1;
  const int64_t per_step = o.lib.seq_len * o.lib.accum;
  o.lib.progress = [&](const train::TrainProgress& p) {
    if (first_step < 0) first_step = p.step - 1;
    const double el =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (log) {
      log->Start(p.step - 1);
      char row[256];
      std::snprintf(row, sizeof row, "step,%lld,%lld,%.9g,%.9g,%.9g,%.1f,%.1f,,",
                    static_cast<long long>(p.step), static_cast<long long>(p.step * per_step),
                    p.loss, p.lr, p.grad_norm, p.tokens_per_s, log->offset() + el);
      log->Row(row);
    }
    const double per = el / static_cast<double>(p.step - first_step);
    std::fprintf(stderr, "%sstep %lld/%lld  loss %.4f  lr %.2e  |g| %.3g  %.0f tok/s  ETA %s%s",
                 tty ? "\r" : "", static_cast<long long>(p.step),
                 static_cast<long long>(p.total_steps), p.loss, p.lr, p.grad_norm, p.tokens_per_s,
                 Clock(per * static_cast<double>(p.total_steps - p.step)).c_str(),
                 tty ? "   " : "\n");
    if (tty && p.step == p.total_steps) std::fprintf(stderr, "\n");
  };
  o.lib.on_eval = [&](const train::FinetuneCurvePoint& p) {
    if (log) {
      log->Start(p.step);
      const double el =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      for (size_t i = 0; i < p.perplexities.size(); ++i) {
        char row[160];
        std::snprintf(row, sizeof row, "eval,%lld,%lld,,,,,%.1f,", static_cast<long long>(p.step),
                      static_cast<long long>(p.tokens), log->offset() + el);
        char ppl[40];
        std::snprintf(ppl, sizeof ppl, ",%.17g", p.perplexities[i]);
        log->Row(row + CsvName(o.eval_files[i]) + ppl);
      }
    }
    // One perplexity per --eval-text, each named when there are several.
    std::string ppl;
    for (size_t i = 0; i < p.perplexities.size(); ++i) {
      char buf[64];
      std::snprintf(buf, sizeof(buf), "%s%.4f", i ? ", " : "", p.perplexities[i]);
      ppl += buf;
      if (p.perplexities.size() > 1) ppl += " (" + o.eval_files[i] + ")";
    }
    std::fprintf(stderr, "%seval step %lld (%lld tokens trained): perplexity %s\n",
                 tty ? "\r" : "", static_cast<long long>(p.step),
                 static_cast<long long>(p.tokens), ppl.c_str());
  };
  if (o.timings) o.lib.timers = &o.timers;
  SPARQ_ASSIGN_OR_RETURN(train::FinetuneResult r, train::Finetune(o.lib, cfg, &pool));
  if (o.timings) {
    const train::TrainTimers& t = o.timers;
    const double all = std::max(t.total(), 1e-9);
    std::fprintf(stderr, "step time (%d threads), s and share of %.2f s:\n", pool.num_threads(),
                 t.total());
    const std::pair<const char*, double> rows[] = {{"teacher forward", t.teacher},
                                                   {"student forward", t.forward},
                                                   {"head + loss", t.head},
                                                   {"head backward", t.head_backward},
                                                   {"blocks recomputed", t.recompute},
                                                   {"blocks backward", t.backward},
                                                   {"optimizer", t.optimizer}};
    for (const auto& [name, sec] : rows) {
      std::fprintf(stderr, "  %-18s %8.2f  %5.1f%%\n", name, sec, 100.0 * sec / all);
    }
  }
  SPARQ_RETURN_IF_ERROR(o.json.Write(r.ToJson()));
  if (o.json.to_stdout()) return Status::Ok();
  const std::string state = o.lib.state_path.empty() ? o.lib.out + ".state" : o.lib.state_path;
  const std::string snapshot = "wrote " + o.lib.out + ", a snapshot at step " +
                               std::to_string(r.end_step) + " of " + std::to_string(r.steps) +
                               " (the state is in " + state + ")";
  if (r.end_step == r.start_step) {
    if (r.wrote_out && r.end_step < r.steps) {
      std::printf("%s\n", snapshot.c_str());
    } else {
      std::printf("nothing left to train (the state is at step %lld of %lld); wrote %s\n",
                  static_cast<long long>(r.end_step), static_cast<long long>(r.steps),
                  o.lib.out.c_str());
    }
    return Status::Ok();
  }
  const std::string wrote = !r.wrote_out             ? "stopped; the state is in " + state
                            : r.end_step < r.steps ? snapshot
                                                   : "wrote " + o.lib.out;
  std::printf(
      "trained steps %lld..%lld of %lld (%lld tokens of %lld in the texts); loss %.4f -> "
      "%.4f; %.1f s; %s\n",
      static_cast<long long>(r.start_step + 1), static_cast<long long>(r.end_step),
      static_cast<long long>(r.steps), static_cast<long long>(r.trained_tokens),
      static_cast<long long>(r.data_tokens), r.first_loss, r.last_loss, r.seconds, wrote.c_str());
  if (r.requant_gptq + r.requant_rtn > 0) {
    std::printf("quantized matrices written back: %lld by GPTQ, %lld by round to nearest\n",
                static_cast<long long>(r.requant_gptq), static_cast<long long>(r.requant_rtn));
  }
  return Status::Ok();
}

Registrar reg(
    "finetune", "Train a pruned .sparq student with its masks fixed (distillation / cross-entropy)",
    [](CLI::App& sub) -> RunFn {
      auto o = std::make_shared<FinetuneCliOptions>();
      train::FinetuneOptions& l = o->lib;
      sub.footer(
          "Trains every weight of the student (embedding, norms, the kept weights of sparse "
          "layers, all of dense ones) in f32 with AdamW, warmup + cosine; pruned weights stay 0. "
          "OUT keeps the student's formats, patterns and value types (bf16 rounded from the f32 "
          "masters; int8 / int4 students re-quantized, see --requant). --train norms trains only "
          "the RMSNorm gains (a cheap first lever: no dW). --eval-text with --eval-every gives "
          "the curve: the student's perplexity on held-out text as training goes (`sparq eval`'s "
          "windows, on the f32 masters). Not yet: untied output heads.");
      sub.add_option("student", l.student, "Pruned student (.sparq)")->required();
      sub.add_option("--teacher", l.teacher,
                     "Teacher (.gguf / .sparq / HF folder; same vocabulary); needed with --kl or "
                     "--hidden > 0");
      sub.add_option("--text", o->text_files, "Training text (UTF-8); repeatable");
      sub.add_flag("--self-distill", o->self_distill,
                   "Train on text sampled from the teacher (with --text: both), generated once "
                   "and cached (--distill-cache)");
      sub.add_option("--distill-tokens", o->distill.tokens,
                     "Self-distillation: tokens to sample from the teacher")
          ->capture_default_str()
          ->check(CLI::Range(int64_t{1}, int64_t{1} << 32));
      sub.add_option("--distill-len", o->distill.sample_len,
                     "Self-distillation: new tokens per sample")
          ->capture_default_str()
          ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
      sub.add_option("--distill-temperature", o->distill.temperature,
                     "Self-distillation: sampling temperature")
          ->capture_default_str();
      sub.add_option("--distill-top-k", o->distill.top_k,
                     "Self-distillation: sample from the k likeliest tokens (0: all)")
          ->capture_default_str();
      sub.add_option("--distill-top-p", o->distill.top_p,
                     "Self-distillation: of those, the likeliest whose probability sums to p "
                     "(nucleus; 1: all)")
          ->capture_default_str();
      sub.add_option("--distill-seed", o->distill.seed, "Self-distillation: sampling seed")
          ->capture_default_str();
      sub.add_option("--distill-batch", o->distill.batch,
                     "Self-distillation: samples decoded at once (one pass over the teacher's "
                     "weights per step for all; the text can differ in rounding from batch 1)")
          ->capture_default_str()
          ->check(CLI::Range(int64_t{1}, int64_t{1} << 12));
      sub.add_option("--distill-cache", o->distill_cache,
                     "Self-distillation text cache (default: OUT.distill.txt); reused when made "
                     "with the same teacher and options");
      sub.add_option("--tokens", l.tokens, "Tokens to train on (steps = T / (seq-len x accum))")
          ->required()
          ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
      sub.add_option("--seq-len", l.seq_len, "Tokens per window")
          ->capture_default_str()
          ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
      sub.add_option("--accum", l.accum, "Windows per step (gradient accumulation)")
          ->capture_default_str()
          ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
      sub.add_option("--lr", l.lr, "Peak learning rate")->capture_default_str();
      sub.add_option("--warmup", l.warmup, "Warmup steps (default: 5% of the steps)");
      sub.add_option("--kl", l.kl, "Weight of KL(teacher || student)")->capture_default_str();
      sub.add_option("--ce", l.ce, "Weight of the next-token cross-entropy")->capture_default_str();
      sub.add_option("--tau", l.tau, "Distillation temperature")->capture_default_str();
      sub.add_option("--hidden", l.hidden,
                     "Weight of SquareHead (Kurtic et al. 2023): every block's output distilled "
                     "towards the teacher's by an MSE normalized per block, summed over the "
                     "blocks (0: off; > 0 runs the teacher on f32 masters, same n_layer / width)")
          ->capture_default_str();
      sub.add_option("--weight-decay", l.weight_decay, "AdamW weight decay")->capture_default_str();
      sub.add_option("--max-grad-norm", l.max_grad_norm, "Gradient clipping (0: none)")
          ->capture_default_str();
      sub.add_option("--train", o->train,
                     "What trains: all (every weight) | norms (only the RMSNorm gains)")
          ->capture_default_str()
          ->check(CLI::IsMember({"all", "norms"}));
      sub.add_option("--requant", o->requant,
                     "A quantized student's trained weights back into its value specs: gptq "
                     "(masks fixed, calibrated on the training text; round to nearest where it "
                     "would change a layer's structure) | rtn (round to nearest)")
          ->capture_default_str()
          ->check(CLI::IsMember({"gptq", "rtn"}));
      sub.add_option("--seed", l.seed, "Seed of the data order")->capture_default_str();
      sub.add_option("--threads", o->threads,
                     "Threads (the teacher's forward and the training step; same results for any)");
      sub.add_flag("--timings", o->timings,
                   "Print where the steps' time went (teacher, forward, head, backward, "
                   "optimizer) at the end, on stderr");
      sub.add_flag("--recompute-activations", o->recompute_activations,
                     "Keep only each block's input and recompute its activations in the "
                     "backward (memory of one block's, ~15% slower; the same result)");
      sub.add_option("--checkpoint-every", l.checkpoint_every,
                     "Save the train state every N steps (0: at the end only)")
          ->capture_default_str()
          ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
      sub.add_option("--eval-text", o->eval_files,
                     "Held-out text for the curve (UTF-8; repeatable, each scored on its own): "
                     "perplexity before the first step, every --eval-every steps and at the end");
      sub.add_option("--eval-every", l.eval_every, "Steps between the curve's points (0: none)")
          ->capture_default_str()
          ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
      sub.add_option("--eval-tokens", l.eval_tokens,
                     "Tokens of each --eval-text scored (its first; windows of --seq-len)")
          ->capture_default_str()
          ->check(CLI::Range(int64_t{2}, int64_t{1} << 40));
      sub.add_option("--state", l.state_path, "Train state file (default: OUT.state)");
      sub.add_flag("--resume", l.resume,
                   "Continue from the train state (same student, data, "
                   "options: ends as an uninterrupted run)");
      sub.add_option("--stop-at", l.stop_at,
                     "Stop after this step, keeping the state, without writing OUT (unless "
                     "--snapshot)");
      sub.add_flag("--snapshot", l.write_at_stop,
                   "With --stop-at: write OUT as of that step too (the state stays: --resume "
                   "continues the run as if never stopped)");
      sub.add_option("--log", o->log,
                     "CSV of the run, kept whole across --resume: a row per step (loss, lr, "
                     "gradient norm, tok/s, seconds) and per point of the curve and text");
      o->json.Register(sub, "the run's summary");
      sub.add_option("-o,--output", l.out, "Output .sparq")->required();
      return [o](const KernelConfig& cfg) {
        o->lib.norms_only = o->train == "norms";
        o->lib.gptq = o->requant == "gptq";
        o->lib.keep_activations = !o->recompute_activations;
        return RunFinetune(*o, cfg);
      };
    });

}  // namespace
}  // namespace sparq::cli
