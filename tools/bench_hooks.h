// `sparq bench` has sub-subcommands (`kernels`, `machine`, ...). Other files add theirs (e.g.
// `sparq bench model`) with a static BenchRegistrar, exactly like top-level commands:
//
//   namespace { sparq::cli::BenchRegistrar reg("model", "Time a model", [](CLI::App& sub) {...}); }
#pragma once

#include <string>
#include <vector>

#include "tools/command.h"

namespace sparq::cli {

std::vector<CommandInfo>& BenchSubcommands();
void RegisterBenchSubcommand(std::string name, std::string help, SetupFn setup);

struct BenchRegistrar {
  BenchRegistrar(std::string name, std::string help, SetupFn setup) {
    RegisterBenchSubcommand(std::move(name), std::move(help), std::move(setup));
  }
};

}  // namespace sparq::cli
