// `sparq train --task fashion-mnist|lm --pattern dense|2:4 ...`: trains from scratch, dense or
// 2:4 sparse with SR-STE, an MLP on Fashion-MNIST (sparq/train_mlp.h) or a small Llama on text
// (sparq/train_lm.h), and reports its test accuracy / perplexity and step time.

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "sparq/gguf.h"
#include "sparq/idx.h"
#include "sparq/model.h"
#include "sparq/tokenizer.h"
#include "sparq/train_lm.h"
#include "sparq/train_mlp.h"
#include "tools/command.h"
#include "tools/json_output.h"

namespace sparq::cli {
namespace {

struct TrainCliOptions {
  train::MnistTrainOptions lib;
  std::string task = "fashion-mnist";
  std::string pattern = "dense";
  int threads = 0;
  JsonOutput json;
  // --task lm
  train::LmTrainOptions lm;
  std::string tokenizer, text, eval_text;
  bool lr_given = false, batch_given = false, srste_given = false, steps_given = false;
};

// The token ids of a text file under the tokenizer of a GGUF (a whole file, no BOS).
Result<std::vector<int32_t>> Tokens(const Tokenizer& tok, const std::string& path) {
  SPARQ_ASSIGN_OR_RETURN(std::string text, ReadTextFile(path));
  auto ids = tok.Encode(text);
  if (!ids.ok()) return ids.status().WithContext(path);
  return ids;
}

Status RunTrainLm(TrainCliOptions& o) {
  train::LmTrainOptions& l = o.lm;
  if (o.tokenizer.empty() || o.text.empty() || o.eval_text.empty()) {
    return InvalidInput("--task lm needs --tokenizer MODEL.gguf, --text FILE and --eval-text FILE");
  }
  if (o.pattern != "dense" && o.pattern != "2:4") {
    return InvalidInput("--pattern: '" + o.pattern + "' is not a pattern (dense, 2:4)");
  }
  l.sparse24 = o.pattern == "2:4";
  // The MLP's flags carry over; where they were not given the LM keeps its own defaults.
  if (o.lr_given) l.lr = o.lib.mlp.lr;
  if (o.batch_given) l.batch = o.lib.batch;
  if (o.srste_given) l.srste = o.lib.mlp.srste;
  if (o.steps_given) l.steps = o.lib.steps;
  l.mask_every = o.lib.mlp.mask_every;
  l.seed = o.lib.mlp.seed;
  SPARQ_ASSIGN_OR_RETURN(GgufFile g, GgufFile::Open(o.tokenizer));
  SPARQ_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::FromGguf(g));
  SPARQ_ASSIGN_OR_RETURN(std::vector<int32_t> train_ids, Tokens(tok, o.text));
  SPARQ_ASSIGN_OR_RETURN(std::vector<int32_t> eval_ids, Tokens(tok, o.eval_text));
  l.config.n_vocab = static_cast<int64_t>(tok.data().tokens.size());
  l.config.n_ctx_train = l.seq_len;
  l.config.rope_dim = l.config.n_head > 0 ? l.config.n_embd / l.config.n_head : 0;
  l.config.tied_output = true;
  ThreadPool pool(o.threads > 0 ? o.threads : DefaultThreads());
  const auto t0 = std::chrono::steady_clock::now();
  l.progress = [&](int64_t step, int64_t total, double loss, double ppl, double) {
    const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (ppl > 0 || step % 10 == 0 || step == total) {
      std::fprintf(stderr, "step %lld/%lld  loss %.4f%s  ETA %.0f s\n",
                   static_cast<long long>(step), static_cast<long long>(total), loss,
                   ppl > 0 ? ("  eval perplexity " + std::to_string(ppl)).c_str() : "",
                   el / static_cast<double>(step) * static_cast<double>(total - step));
    }
  };
  SPARQ_ASSIGN_OR_RETURN(train::LmTrainResult r, train::TrainLm(l, train_ids, eval_ids, &pool));
  nlohmann::json j;
  j["task"] = "lm";
  j["pattern"] = o.pattern;
  j["model"] = nlohmann::json::parse(l.config.ToJson());
  j["params"] = r.params;
  j["optimizer"] = "adamw";
  j["lr"] = l.lr;
  j["weight_decay"] = l.weight_decay;
  j["batch"] = l.batch;
  j["seq_len"] = l.seq_len;
  j["steps"] = r.steps;
  j["train_tokens"] = static_cast<int64_t>(train_ids.size());
  j["trained_tokens"] = r.steps * l.batch * l.seq_len;
  j["seed"] = l.seed;
  j["threads"] = pool.num_threads();
  if (l.sparse24) {
    j["mask_every"] = l.mask_every;
    j["srste"] = l.srste;
    j["last_mask_change"] = r.last_mask_change;
  }
  j["final_loss"] = r.final_loss;
  j["eval_perplexity"] = r.eval_perplexity;
  j["eval_tokens"] = r.eval_tokens;
  j["curve"] = nlohmann::json::array();
  for (const auto& [step, ppl] : r.curve) j["curve"].push_back({{"step", step}, {"perplexity", ppl}});
  j["median_step_ms"] = r.median_step_ms;
  j["seconds"] = r.seconds;
  j["zero_weight_fraction"] = r.zero_fraction;
  SPARQ_RETURN_IF_ERROR(o.json.Write(j.dump()));
  if (o.json.to_stdout()) return Status::Ok();
  std::printf(
      "lm %s: eval perplexity %.3f on %lld tokens after %lld steps (%lld tokens); median step "
      "%.1f ms on %d threads; %.1f s; %.1f%% of the block weights zero\n",
      o.pattern.c_str(), r.eval_perplexity, static_cast<long long>(r.eval_tokens),
      static_cast<long long>(r.steps), static_cast<long long>(r.steps * l.batch * l.seq_len),
      r.median_step_ms, pool.num_threads(), r.seconds, 100.0 * r.zero_fraction);
  return Status::Ok();
}

Status RunTrain(TrainCliOptions& o) {
  if (o.task == "lm") return RunTrainLm(o);
  if (o.task != "fashion-mnist") {
    return InvalidInput("--task: '" + o.task + "' is not a task (fashion-mnist, lm)");
  }
  if (o.pattern == "dense") {
    o.lib.mlp.pattern = train::MlpPattern::kDense;
  } else if (o.pattern == "2:4") {
    o.lib.mlp.pattern = train::MlpPattern::k2of4;
  } else {
    return InvalidInput("--pattern: '" + o.pattern + "' is not a pattern (dense, 2:4)");
  }
  if (o.lib.data_dir.empty()) o.lib.data_dir = kFashionMnistDefaultDir;
  ThreadPool pool(o.threads > 0 ? o.threads : DefaultThreads());
  const bool quiet = o.json.to_stdout();
  o.lib.progress = [&](int64_t step, int64_t total, double loss, double acc) {
    std::fprintf(stderr, "step %lld/%lld  loss %.4f  test accuracy %.2f%%\n",
                 static_cast<long long>(step), static_cast<long long>(total), loss, 100.0 * acc);
  };
  SPARQ_ASSIGN_OR_RETURN(train::MnistTrainResult r, train::TrainFashionMnist(o.lib, &pool));
  nlohmann::json j;
  j["task"] = o.task;
  j["pattern"] = o.pattern;
  j["sizes"] = o.lib.mlp.sizes;
  j["optimizer"] = "sgd-momentum";
  j["lr"] = o.lib.mlp.lr;
  j["momentum"] = o.lib.mlp.momentum;
  j["batch"] = r.batch;
  j["steps"] = r.steps;
  j["epochs"] = r.epochs_run;
  j["seed"] = o.lib.mlp.seed;
  j["threads"] = pool.num_threads();
  if (o.lib.mlp.pattern == train::MlpPattern::k2of4) {
    j["mask_every"] = o.lib.mlp.mask_every;
    j["srste"] = o.lib.mlp.srste;
  }
  j["final_loss"] = r.final_loss;
  j["test_accuracy"] = r.test_accuracy;
  j["epoch_test_accuracy"] = r.epoch_test_accuracy;
  j["median_step_ms"] = r.median_step_ms;
  j["seconds"] = r.seconds;
  j["zero_weight_fraction"] = r.sparse_fraction;
  SPARQ_RETURN_IF_ERROR(o.json.Write(j.dump()));
  if (quiet) return Status::Ok();
  std::printf(
      "%s %s: test accuracy %.2f%% after %lld steps (%lld epochs, batch %lld); median step %.1f ms "
      "on %d threads; %.1f s; %.1f%% of the weights zero\n",
      o.task.c_str(), o.pattern.c_str(), 100.0 * r.test_accuracy, static_cast<long long>(r.steps),
      static_cast<long long>(r.epochs_run), static_cast<long long>(r.batch), r.median_step_ms,
      pool.num_threads(), r.seconds, 100.0 * r.sparse_fraction);
  return Status::Ok();
}

Registrar reg(
    "train",
    "Train from scratch, dense or 2:4 sparse (SR-STE): an MLP on Fashion-MNIST or a small Llama",
    [](CLI::App& sub) -> RunFn {
      auto o = std::make_shared<TrainCliOptions>();
      train::MnistTrainOptions& l = o->lib;
      sub.footer(
          "MLP 784-1024-1024-10 (ReLU, softmax cross-entropy), f32, SGD + momentum with a cosine "
          "learning rate. 2:4: dense master weights, the mask (2 largest |w| of each 4 inputs) "
          "recomputed every --mask-every steps, straight-through gradients plus SR-STE's decay "
          "of the pruned weights; the last layer stays dense. The masked products still run as "
          "dense sgemm (no step speedup yet). Data: Debian's dataset-fashion-mnist.\n"
          "--task lm: a Llama (--layers, --hidden, --heads, --kv-heads, --ff; tied head, the "
          "vocabulary of --tokenizer) on --text, evaluated on --eval-text; AdamW with warmup + "
          "cosine (defaults --lr 1e-3, --batch 8 windows of --seq-len 128, --steps 300); 2:4 on "
          "every block linear, SR-STE decoupled (pruned masters scaled by 1 - lr * srste, "
          "default 0).");
      sub.add_option("--task", o->task, "Task (fashion-mnist, lm)")->capture_default_str();
      sub.add_option("--pattern", o->pattern, "Weight pattern: dense or 2:4")
          ->capture_default_str();
      sub.add_option("--mask-every", l.mlp.mask_every, "Steps between 2:4 mask recomputations")
          ->capture_default_str();
      sub.add_option_function<double>(
             "--srste",
             [o](double v) {
               o->lib.mlp.srste = v;
               o->srste_given = true;
             },
             "SR-STE decay lambda on pruned weights (2:4; MLP default 2e-4)");
      auto* epochs = sub.add_option("--epochs", l.epochs, "Epochs")->capture_default_str();
      sub.add_option_function<int64_t>(
             "--steps",
             [o](int64_t v) {
               o->lib.steps = v;
               o->steps_given = true;
             },
             "Steps (instead of --epochs)")
          ->excludes(epochs);
      sub.add_option_function<int64_t>(
          "--batch",
          [o](int64_t v) {
            o->lib.batch = v;
            o->batch_given = true;
          },
          "Images (lm: windows) per step (MLP default 256)");
      sub.add_option_function<double>(
          "--lr",
          [o](double v) {
            o->lib.mlp.lr = v;
            o->lr_given = true;
          },
          "Peak learning rate (MLP: cosine to 0, default 0.05)");
      sub.add_option("--momentum", l.mlp.momentum, "SGD momentum")->capture_default_str();
      sub.add_option("--seed", l.mlp.seed, "Seed of the weights and the data order")->required();
      sub.add_option("--data", l.data_dir,
                     std::string("Folder of the IDX files (default ") + kFashionMnistDefaultDir +
                         ")");
      sub.add_option("--threads", o->threads, "Threads");
      train::LmTrainOptions& m = o->lm;
      m.config.n_layer = 6;
      m.config.n_embd = 256;
      m.config.n_head = 4;
      m.config.n_head_kv = 4;
      m.config.n_ff = 688;
      const char* lm = "lm";
      sub.add_option("--tokenizer", o->tokenizer, "lm: the GGUF whose tokenizer splits the text")
          ->group(lm);
      sub.add_option("--text", o->text, "lm: training text (UTF-8)")->group(lm);
      sub.add_option("--eval-text", o->eval_text, "lm: evaluation text (UTF-8)")->group(lm);
      sub.add_option("--layers", m.config.n_layer, "lm: blocks")->capture_default_str()->group(lm);
      sub.add_option("--hidden", m.config.n_embd, "lm: model width")
          ->capture_default_str()
          ->group(lm);
      sub.add_option("--heads", m.config.n_head, "lm: attention heads")
          ->capture_default_str()
          ->group(lm);
      sub.add_option("--kv-heads", m.config.n_head_kv, "lm: key / value heads")
          ->capture_default_str()
          ->group(lm);
      sub.add_option("--ff", m.config.n_ff, "lm: SwiGLU width")->capture_default_str()->group(lm);
      sub.add_option("--seq-len", m.seq_len, "lm: tokens per window")
          ->capture_default_str()
          ->group(lm);
      sub.add_option("--weight-decay", m.weight_decay, "lm: AdamW weight decay")
          ->capture_default_str()
          ->group(lm);
      sub.add_option("--warmup", m.warmup, "lm: warmup steps (default 5% of the steps)")
          ->group(lm);
      sub.add_option("--eval-every", m.eval_every, "lm: also evaluate every N steps (the curve)")
          ->capture_default_str()
          ->group(lm);
      o->json.Register(sub, "the run's summary");
      return [o](const KernelConfig&) { return RunTrain(*o); };
    });

}  // namespace
}  // namespace sparq::cli
