// `sparq train --task fashion-mnist --pattern dense|2:4 ...`: trains an MLP from scratch, dense
// or 2:4 sparse with SR-STE (sparq/train_mlp.h), and reports its test accuracy and step time.

#include <cstdio>
#include <nlohmann/json.hpp>

#include "sparq/idx.h"
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
};

Status RunTrain(TrainCliOptions& o) {
  if (o.task != "fashion-mnist") {
    return InvalidInput("--task: '" + o.task + "' is not a task (fashion-mnist)");
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
    "train", "Train an MLP from scratch on Fashion-MNIST, dense or 2:4 sparse (SR-STE)",
    [](CLI::App& sub) -> RunFn {
      auto o = std::make_shared<TrainCliOptions>();
      train::MnistTrainOptions& l = o->lib;
      sub.footer(
          "MLP 784-1024-1024-10 (ReLU, softmax cross-entropy), f32, SGD + momentum with a cosine "
          "learning rate. 2:4: dense master weights, the mask (2 largest |w| of each 4 inputs) "
          "recomputed every --mask-every steps, straight-through gradients plus SR-STE's decay "
          "of the pruned weights; the last layer stays dense. The masked products still run as "
          "dense sgemm (no step speedup yet). Data: Debian's dataset-fashion-mnist.");
      sub.add_option("--task", o->task, "Task (fashion-mnist)")->capture_default_str();
      sub.add_option("--pattern", o->pattern, "Weight pattern: dense or 2:4")
          ->capture_default_str();
      sub.add_option("--mask-every", l.mlp.mask_every, "Steps between 2:4 mask recomputations")
          ->capture_default_str();
      sub.add_option("--srste", l.mlp.srste, "SR-STE decay lambda on pruned weights (2:4)")
          ->capture_default_str();
      auto* epochs = sub.add_option("--epochs", l.epochs, "Epochs")->capture_default_str();
      sub.add_option("--steps", l.steps, "Steps (instead of --epochs)")->excludes(epochs);
      sub.add_option("--batch", l.batch, "Images per step")->capture_default_str();
      sub.add_option("--lr", l.mlp.lr, "Peak learning rate (cosine to 0)")->capture_default_str();
      sub.add_option("--momentum", l.mlp.momentum, "SGD momentum")->capture_default_str();
      sub.add_option("--seed", l.mlp.seed, "Seed of the weights and the data order")->required();
      sub.add_option("--data", l.data_dir,
                     std::string("Folder of the IDX files (default ") + kFashionMnistDefaultDir +
                         ")");
      sub.add_option("--threads", o->threads, "Threads");
      o->json.Register(sub, "the run's summary");
      return [o](const KernelConfig&) { return RunTrain(*o); };
    });

}  // namespace
}  // namespace sparq::cli
