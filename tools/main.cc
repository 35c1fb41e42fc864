#include <algorithm>
#include <cstdio>
#include <exception>
#include <cstdlib>
#include <map>
#include <string>

#include <sys/stat.h>
#include <unistd.h>

#include <vector>

#include <dlfcn.h>

#include "sparq/kernel_config.h"
#include "sparq/machine.h"

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

namespace {

// The --max-isa value from argv (either spelling), else the old SPARQ_MAX_ISA variable, else "".
std::string MaxIsaArg(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--max-isa" && i + 1 < argc) return argv[i + 1];
    if (a.rfind("--max-isa=", 0) == 0) return a.substr(10);
  }
  const char* env = std::getenv("SPARQ_MAX_ISA");
  return env != nullptr ? env : "";
}

// Index of the command word (`bench`, `prune`, ...): the first argument that is not one of the
// options before it (`--activations A`, `--max-isa X`, `--kv-cache T`, ...), so that checks made
// before CLI11 parses (the peers' spins of `bench kernels`, `sparq bench MODEL`) see `sparq
// --int8-activations bench kernels` as they see `sparq bench kernels`. argc when there is none.
int CommandIndex(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--max-isa" || a == "--kv-cache" || a == "--activations") {
      ++i;
    } else if (a.empty() || a[0] != '-') {
      return i;
    }
  }
  return argc;
}

// BLIS_ARCH_TYPE is read as a number by Debian's BLIS 0.9 (its arch_t id; a name such as
// "haswell" parses as 0, which is Skylake-X there, AVX-512): find haswell's id in BLIS's own
// table of names. -1 when BLIS is absent or has no such entry.
int BlisArchId(const char* name) {
  void* h = dlopen("libblis.so.4", RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) return -1;
  using Fn = const char* (*)(int);
  auto fn = reinterpret_cast<Fn>(dlsym(h, "bli_arch_string"));
  int id = -1;
  for (int i = 0; fn != nullptr && i < 64 && id < 0; ++i) {
    const char* s = fn(i);
    if (s == nullptr) break;
    if (std::string(s) == name) id = i;
  }
  dlclose(h);
  return id;
}

// Caps the dense peers of `bench kernels` (read by each library when it loads) to the same
// instruction set as sparq's kernels, so that a capped run compares AVX2 code with AVX2 code.
// Returns whether it set anything (the process must then start again).
bool CapPeers(const std::string& max_isa) {
  std::string s = max_isa;
  for (auto& ch : s) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  if (s != "AVX2" || std::getenv("SPARQ_PEER_CAPS_SET") != nullptr) return false;
  setenv("SPARQ_PEER_CAPS_SET", "1", 1);
  setenv("OPENBLAS_CORETYPE", "Haswell", 1);
  setenv("ONEDNN_MAX_CPU_ISA", "AVX2", 1);
  if (const int id = BlisArchId("haswell"); id >= 0) {
    setenv("BLIS_ARCH_TYPE", std::to_string(id).c_str(), 1);
  } else {
    unsetenv("BLIS_ARCH_TYPE");
  }
  return true;
}

}  // namespace

}  // namespace sparq::cli

int main(int argc, char** argv) {
  using namespace sparq::cli;
  using sparq::KernelConfig;
  // OpenBLAS mis-detects CPUs newer than itself as Prescott (SSE3) and runs dense products ~5x
  // slower (src/cpu/blas_core.cc). It reads OPENBLAS_CORETYPE only at load time, so set it and
  // start again; SPARQ_KEEP_BLAS_CORE=1 keeps whatever OpenBLAS chose.
  bool restart = false;
  const std::string max_isa = MaxIsaArg(argc, argv);
  if (!max_isa.empty()) restart = CapPeers(max_isa) || restart;
  const char* user_core = std::getenv("OPENBLAS_CORETYPE");
  if (const char* core =
          sparq::cpu::SuggestedOpenBlasCore(user_core != nullptr && *user_core != '\0');
      core != nullptr && std::getenv("SPARQ_KEEP_BLAS_CORE") == nullptr &&
      std::getenv("SPARQ_PEER_CAPS_SET") == nullptr) {
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
  // (Until 2026-12-07 this looked at argv[1] only: a run with an option before `bench`, e.g.
  // every `sparq --int8-activations bench kernels`, kept the long spins, and its 2-thread rows
  // ran beside the previous peer's spinning thread.)
  const int cmd = CommandIndex(argc, argv);
  // `bench grad` alternates OpenBLAS and sparq's pool the same way (before 2026-12-07 it kept the
  // long spins: some of its 2-thread rows ran sparq at one thread's speed).
  if (cmd + 1 < argc && std::string(argv[cmd]) == "bench" &&
      (std::string(argv[cmd + 1]) == "kernels" || std::string(argv[cmd + 1]) == "grad") &&
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
  if (cmd + 1 < argc && std::string(argv[cmd]) == "bench" && argv[cmd + 1][0] != '-') {
    const char* word = argv[cmd + 1];
    const auto& subs = BenchSubcommands();
    const bool is_sub = std::any_of(subs.begin(), subs.end(),
                                    [&](const CommandInfo& c) { return c.name == word; });
    struct stat st {};
    if (!is_sub) {
      if (::stat(word, &st) != 0) {
        std::string names;
        for (const auto& c : subs) names += (names.empty() ? "" : ", ") + c.name;
        std::fprintf(stderr,
                     "sparq: bench: '%s' is neither a subcommand (%s) nor an existing model file "
                     "or folder\n",
                     word, names.c_str());
        return 1;
      }
      args.insert(args.begin() + cmd + 1, model_word);
    }
  }
  CLI::App app{"sparq: prune, pack and run sparse neural networks"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "sparq 0.1.0");
  app.fallthrough();
  std::string max_isa_flag;
  app.add_option("--max-isa", max_isa_flag,
                 "Run sparq's kernels on at most this instruction set (AVX3_DL, AVX3, AVX2, SSE4, "
                 "SSSE3, SCALAR; default: the best this CPU has); AVX2 also caps the dense peers of "
                 "`bench kernels` (OpenBLAS, oneDNN, BLIS) to their AVX2 code. SPARQ_MAX_ISA is the "
                 "old spelling.")
      ->configurable(false);
  // int8 by default since 2026-12-07: where a kernel for it exists, it is llama.cpp's own decode
  // arithmetic: 1.1-1.6x the f32-X decode of a 2:4 int4 or as-stored GGUF model on a Zen 5, at
  // +0.1-0.5% perplexity; users compare defaults, and f32 X left sparq's default decode slower.
  std::string activations = "int8";
  CLI::Option* act_opt =
      app.add_option("--activations", activations,
                     "Activations of decode products with quantized weights: int8 (rounded per "
                     "32 columns, as llama.cpp does, where a kernel for it exists: 2:4 int4 "
                     "weights with groups of 64 or more, dense int8 / int4 weights, a GGUF's "
                     "Q4_0 / Q4_1 / Q8_0 run as stored; on AVX-512 VNNI + VBMI and on AVX2), or "
                     "f32 (every product has the f32 product's bits). Prefill, f32 / bf16 "
                     "weights and the other layouts run f32 X either way.")
          ->check(CLI::IsMember({"int8", "f32"}))
          ->capture_default_str()
          ->configurable(false);
  bool int8_flag = false;
  app.add_flag("--int8-activations", int8_flag,
               "The old spelling of --activations int8 (the default)")
      ->excludes(act_opt)
      ->configurable(false);
  std::string kv_cache = "f32";
  app.add_option("--kv-cache", kv_cache,
                 "Values of the KV cache that generation, perplexity and `bench model` run on: f32, "
                 "or f16 (half the bytes decode attention reads, as llama.cpp's default cache; "
                 "each key and value rounded to f16)")
      ->check(CLI::IsMember({"f32", "f16"}))
      ->capture_default_str()
      ->configurable(false);
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
  // The run's one configuration: this machine, capped by --max-isa; passed down, never global.
  auto cfg = KernelConfig::FromMachine(max_isa);
  if (!cfg.ok()) return ExitCodeFor(cfg.status());
  cfg->int8_activations = int8_flag || activations == "int8";
  cfg->kv_f16 = kv_cache == "f16";
  try {
    for (auto& [sub, run] : runs) {
      if (sub->parsed()) return ExitCodeFor(run(*cfg));
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
