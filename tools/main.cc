#include <algorithm>
#include <cstdio>
#include <exception>
#include <cstdlib>
#include <map>

#include <unistd.h>

#include "src/cpu/machine.h"

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
  if (const char* core = sparq::cpu::SuggestedOpenBlasCore();
      core != nullptr && std::getenv("SPARQ_KEEP_BLAS_CORE") == nullptr) {
    setenv("OPENBLAS_CORETYPE", core, 1);
    execv("/proc/self/exe", argv);  // returns only on failure: then run with the slow kernels
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
    app.parse(argc, argv);
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
