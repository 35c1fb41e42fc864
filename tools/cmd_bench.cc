// `sparq bench <kernels|machine|...>`: timing tables users run on their own machine. The
// sub-subcommands come from BenchSubcommands() (bench_hooks.h); `kernels` lives in
// bench_kernels.cc, `machine` here.
#include <cstdio>
#include <map>

#include "sparq/machine.h"
#include "tools/bench_hooks.h"

namespace sparq::cli {

std::vector<CommandInfo>& BenchSubcommands() {
  static std::vector<CommandInfo> subs;
  return subs;
}

void RegisterBenchSubcommand(std::string name, std::string help, SetupFn setup) {
  BenchSubcommands().push_back({std::move(name), std::move(help), std::move(setup)});
}

namespace {

Registrar reg("bench", "Benchmarks: `bench kernels` (sparse vs dense products), `bench machine`",
              [](CLI::App& sub) -> RunFn {
                sub.require_subcommand(1);
                auto runs = std::make_shared<std::map<CLI::App*, RunFn>>();
                for (auto& c : BenchSubcommands()) {
                  CLI::App* s = sub.add_subcommand(c.name, c.help);
                  (*runs)[s] = c.setup(*s);
                }
                return [runs](const KernelConfig& cfg) -> Status {
                  for (auto& [s, run] : *runs) {
                    if (s->parsed()) return run(cfg);
                  }
                  return InvalidInput("bench: choose a subcommand");
                };
              });

BenchRegistrar machine("machine",
                       "Measure peak f32 FMA rate (also with one L1 load per FMA) and read "
                       "bandwidth (1 and 2 threads)",
                       [](CLI::App& sub) -> RunFn {
                         return [](const KernelConfig& cfg) -> Status {
                           // The limits of the kernels' target (--max-isa caps both).
                           std::printf("isa: %s\n", cfg.target_name().c_str());
                           for (int t : {1, 2}) {
                             std::printf(
                                 "threads %d: peak FMA %.1f GFLOP/s (%.1f with one L1 load "
                                 "per FMA), read bandwidth %.1f GB/s (64 MiB) %.1f GB/s "
                                 "(1 GiB)\n",
                                 t, cpu::MeasurePeakFmaGflops(t, cfg),
                                 cpu::MeasureLoadFmaGflops(t, cfg),
                                 cpu::MeasureReadGbps(t, int64_t{64} << 20, cfg),
                                 cpu::MeasureReadGbps(t, int64_t{1} << 30, cfg));
                           }
                           return Status::Ok();
                         };
                       });

}  // namespace
}  // namespace sparq::cli
