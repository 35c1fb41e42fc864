#include <algorithm>
#include <cstdio>
#include <exception>
#include <cstdlib>
#include <map>
#include <string>

#include <sys/stat.h>
#include <unistd.h>

#include <vector>

#include "src/cpu/machine.h"

#include "tools/bench_hooks.h"
#include "tools/command.h"

namespace sparq::cli {

std::vector<CommandInfo>& Registry() {
  static std::vector<CommandInfo> registry;
  return registry;
}

int ExitCodeFor(const Status& st) {
  if (st.ok()) return 0;
  std::fprintf(stderr, "sparq: %s\n", st.ToString().c_str());
  return st.code() == StatusCode::kInvalidInput || st.code() == StatusCode::kIoError ||
                 st.code() == StatusCode::kUnsupported
             ? 1
             : 2;
}

}  // namespace sparq::cli

int main(int argc, char** argv) {
  using namespace sparq::cli;
  // OpenBLAS mis-detects CPUs newer than itself as Prescott (SSE3) and runs dense products ~5x
  // slower (src/cpu/blas_core.cc). It reads OPENBLAS_CORETYPE only at load time, so set it and
  // start again; SPARQ_KEEP_BLAS_CORE=1 keeps whatever OpenBLAS chose.
  bool restart = false;
  if (const char* core = sparq::cpu::SuggestedOpenBlasCore();
      core != nullptr && std::getenv("SPARQ_KEEP_BLAS_CORE") == nullptr) {
    setenv("OPENBLAS_CORETYPE", core, 1);
    restart = true;
  }
  // `bench kernels` alternates sparq with OpenBLAS, oneDNN (OpenMP) and BLIS in one process. Each
  // library's idle threads spin after a call: OpenBLAS's for 2^28 cycles (~0.1 s), libgomp's for
  // its spin count, sparq's pool for 200 us. Spinners left by the previous library took the
  // second core from the next one's 2-thread run: measured, 4096x4096 2:4 f32 at n = 1 ran 3.30 ms
  // with 2 threads against 2.69 ms with one. Short spins (OpenBLAS 2^20 cycles, ~0.3 ms; libgomp
  // 10,000 polls) still keep every library's threads awake across its own back-to-back calls, and
  // Sample() sleeps 2 ms first, so each sample starts with the other libraries' threads asleep
  // (then 1.59 ms with 2 threads). Both are read at load time, so they are set here; a value the
  // user set is kept.
  if (argc >= 3 && std::string(argv[1]) == "bench" && std::string(argv[2]) == "kernels" &&
      std::getenv("SPARQ_BENCH_SPINS_SET") == nullptr) {
    setenv("SPARQ_BENCH_SPINS_SET", "1", 1);
    setenv("OPENBLAS_THREAD_TIMEOUT", "20", 0);
    setenv("GOMP_SPINCOUNT", "10000", 0);
    restart = true;
  }
  if (restart) execv("/proc/self/exe", argv);  // returns only on failure: then run as we are
  // `sparq bench MODEL [MORE ...]` (the spelling of the model issue) means `sparq bench model ...`
  // when the word after `bench` is no bench subcommand but an existing file or folder; a word
  // that is neither gets one line naming it (CLI11 would only say "A subcommand is required").
  std::vector<char*> args(argv, argv + argc);
  static char model_word[] = "model";
  if (argc >= 3 && std::string(argv[1]) == "bench" && argv[2][0] != '-') {
    const auto& subs = BenchSubcommands();
    const bool is_sub = std::any_of(subs.begin(), subs.end(),
                                    [&](const CommandInfo& c) { return c.name == argv[2]; });
    struct stat st {};
    if (!is_sub) {
      if (::stat(argv[2], &st) != 0) {
        std::string names;
        for (const auto& c : subs) names += (names.empty() ? "" : ", ") + c.name;
        std::fprintf(stderr,
                     "sparq: bench: '%s' is neither a subcommand (%s) nor an existing model file "
                     "or folder\n",
                     argv[2], names.c_str());
        return 1;
      }
      args.insert(args.begin() + 2, model_word);
    }
  }
  CLI::App app{"sparq: prune, pack and run sparse neural networks"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "sparq 0.1.0");
  auto& reg = Registry();
  std::sort(reg.begin(), reg.end(), [](auto& a, auto& b) { return a.name < b.name; });
  std::map<CLI::App*, RunFn> runs;
  for (auto& c : reg) {
    CLI::App* sub = app.add_subcommand(c.name, c.help);
    runs[sub] = c.setup(*sub);
  }
  try {
    app.parse(static_cast<int>(args.size()), args.data());
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 1;
  }
  try {
    for (auto& [sub, run] : runs) {
      if (sub->parsed()) return ExitCodeFor(run());
    }
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "sparq: out of memory\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sparq: internal error: %s\n", e.what());
    return 2;
  }
  return 2;
}
