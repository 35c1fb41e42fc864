// The `sparq` command line is a set of subcommands, one file each (tools/cmd_<name>.cc), that
// register themselves here; main.cc needs no edit when one is added.
//
// Exit codes: 0 success, 1 bad input (one line naming the problem), 2 internal error.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "sparq/kernel_config.h"
#include "sparq/status.h"
#include "sparq/thread_pool.h"

namespace sparq::cli {

// `setup` adds the subcommand's options to `sub` and returns the function to run when it is chosen.
// main() builds the one KernelConfig of the run from the flags (--max-isa) after parsing and hands
// it to that function, which passes it on to everything that packs weights or runs kernels.
using RunFn = std::function<Status(const KernelConfig& cfg)>;
using SetupFn = std::function<RunFn(CLI::App& sub)>;

struct CommandInfo {
  std::string name;
  std::string help;
  SetupFn setup;
};

std::vector<CommandInfo>& Registry();

struct Registrar {
  Registrar(std::string name, std::string help, SetupFn setup) {
    Registry().push_back({std::move(name), std::move(help), std::move(setup)});
  }
};

// Thread count of a command run without --threads: SPARQ_NUM_THREADS when it holds a count >= 1,
// else every hardware thread. The library reads no environment; this is where the knob lives.
inline int DefaultThreads() {
  if (const char* env = std::getenv("SPARQ_NUM_THREADS")) {
    const int n = std::atoi(env);
    if (n >= 1) return n;
  }
  return ThreadPool::HardwareThreads();
}

// Map a Status to an exit code and print it (stderr) as one line.
int ExitCodeFor(const Status& st);

}  // namespace sparq::cli
