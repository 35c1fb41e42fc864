// `sparq bench kernels`: sparq's products against the best dense library and the sparse peers,
// same shapes, same run, interleaved, medians over repeats; table, JSON and plot.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include <unistd.h>

#include "sparq/format.h"
#include "sparq/linear.h"
#include "sparq/pattern.h"
#include "sparq/machine.h"
#include "tools/bench_hooks.h"
#include "tools/bench_peers.h"
#include "tools/bench_util.h"
#include "tools/json_output.h"
#include "tools/machine_info.h"
#include "tools/python_path.h"

namespace sparq::cli {
namespace {

using nlohmann::json;

// One timing sample of fn: repeats the call until at least 2 ms have passed (calls of a few
// microseconds are otherwise dominated by the clock), returns seconds per call. Sleeps 2 ms first,
// so that the previous sample's library has parked its spinning threads (tools/main.cc).
template <typename Fn>
double Sample(Fn&& fn) {
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  const double t0 = Now();
  int calls = 0;
  double t;
  do {
    fn();
    ++calls;
    t = Now() - t0;
  } while (t < 2e-3);
  return t / calls;
}

struct Options {
  JsonOutput json;
  std::string plot_path, shapes, ns, patterns, threads, values, py_peers;
  int repeats = 5;
  bool explain = false;  // print the kernel each row would run and why the others declined
  // Bytes each side of a few-token row rotates through (RotationCopies); < 0: twice the LLC.
  int64_t rotate_bytes = -1;
};

// Few-token products are bound by reading the weights, and a model's layers each come from
// memory (the whole model is far larger than the last-level cache). Benchmarked in a loop, a
// weight that fits the LLC is read from cache instead: a 19 MB 2:4 bf16 4096x4096 weight stays
// there while the 67 MB f32 peer streams, which credits sparq with more than its byte ratio. So
// rows with n <= kRotateMaxN run each call on the next of several copies (ours and the peers'
// alike) that together hold at least twice the LLC: every copy has left the cache before it is
// used again.
constexpr int64_t kRotateMaxN = 16;

// Last-level cache of this machine in bytes (sysconf; 32 MiB when the system does not say).
int64_t LastLevelCacheBytes() {
  for (int name : {_SC_LEVEL3_CACHE_SIZE, _SC_LEVEL2_CACHE_SIZE}) {
    const long v = sysconf(name);
    if (v > 0) return v;
  }
  return int64_t{32} << 20;
}

// Copies of a weight of `bytes` that one side of an n-token row cycles through.
int64_t RotationCopies(uint64_t bytes, int64_t n, int64_t rotate_bytes) {
  if (n > kRotateMaxN || rotate_bytes <= 0 || bytes == 0) return 1;
  return std::max<int64_t>(1, (rotate_bytes + static_cast<int64_t>(bytes) - 1) /
                                  static_cast<int64_t>(bytes));
}

// Round-robin over copies; the position persists across samples, so consecutive calls (also
// across the interleaved sides' samples) never reuse a copy before all others were read.
template <typename T>
struct Rotation {
  std::vector<T>* items = nullptr;
  size_t count = 1, next = 0;
  T& Next() { return (*items)[next++ % count]; }
};

// `s` as one single-quoted word of a /bin/sh command line (paths with spaces or quotes).
std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Runs the Python sparse peers (scipy / torch CSR) once for all rows; returns their medians keyed
// by "m,k,n,threads,pattern" -> {peer: seconds}.
std::map<std::string, std::map<std::string, double>> RunPythonPeers(const Options& o,
                                                                   int64_t rotate_bytes) {
  std::map<std::string, std::map<std::string, double>> out;
  if (o.py_peers.empty()) return out;
  if (!std::ifstream(o.py_peers).good()) {
    std::fprintf(stderr, "sparse peers script %s not found: scipy/torch peers skipped\n", o.py_peers.c_str());
    return out;
  }
  const std::string cmd = PythonCommand() + " " + ShellQuote(o.py_peers) + " --shapes " +
                          ShellQuote(o.shapes) + " --n " + ShellQuote(o.ns) + " --patterns " +
                          ShellQuote(o.patterns) + " --threads " + ShellQuote(o.threads) +
                          " --repeats " + std::to_string(o.repeats) + " --rotate-bytes " +
                          std::to_string(rotate_bytes);
  std::fprintf(stderr, "running sparse peers: %s\n", cmd.c_str());
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return out;
  std::string text;
  char buf[4096];
  size_t got;
  while ((got = fread(buf, 1, sizeof(buf), f)) > 0) text.append(buf, got);
  pclose(f);
  try {
    for (const auto& r : json::parse(text)) {
      const std::string key = std::to_string(r["m"].get<int64_t>()) + "," + std::to_string(r["k"].get<int64_t>()) +
                              "," + std::to_string(r["n"].get<int64_t>()) + "," +
                              std::to_string(r["threads"].get<int>()) + "," + r["pattern"].get<std::string>();
      out[key][r["peer"].get<std::string>()] = r["median_s"].get<double>();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sparse peers output not understood (%s): skipped\n", e.what());
  }
  return out;
}

// The plot script writes next to `path` and renames, so a failed run leaves no half-written image.
Status WritePlot(const json& rows, const std::string& path, const std::string& script_dir) {
  const std::string tmp = path + ".rows.json";
  std::ofstream(tmp) << rows.dump();
  const std::string cmd = PythonCommand() + " " + ShellQuote(script_dir + "/plot_speedup.py") +
                          " " + ShellQuote(tmp) + " " + ShellQuote(path);
  const int rc = std::system(cmd.c_str());
  std::remove(tmp.c_str());
  if (rc != 0) return IoError("--plot: '" + cmd + "' failed (needs matplotlib: install_deps.sh)");
  return Status::Ok();
}

// --plot runs a matplotlib script after the whole benchmark: check that it can run before
// spending minutes on the benchmark.
Status CheckPlotter(const std::string& script_dir) {
  const std::string script = script_dir + "/plot_speedup.py";
  if (!std::ifstream(script).good()) {
    return IoError(
        "--plot: plot script '" + script +
        "' not found (run from the repository root, or name the peers script with --py-peers)");
  }
  if (std::system((PythonCommand() + " -c 'import matplotlib' >/dev/null 2>&1").c_str()) != 0) {
    return IoError("--plot needs matplotlib in " + PythonInterpreter() + " (scripts/install_deps.sh "
                   "puts it in .venv/; SPARQ_PYTHON names another Python); nothing was run");
  }
  return Status::Ok();
}

// The folder of the Python peer scripts: --py-peers's folder ("." for a bare file name), or
// bench/peers when the sparse peers are skipped (--py-peers '').
std::string PeerScriptDir(const Options& o) {
  if (o.py_peers.empty()) return "bench/peers";
  const std::string dir = std::filesystem::path(o.py_peers).parent_path().string();
  return dir.empty() ? "." : dir;
}

Status RunKernels(const Options& o, const KernelConfig& cfg) {
  if (!o.plot_path.empty()) SPARQ_RETURN_IF_ERROR(CheckPlotter(PeerScriptDir(o)));
  SPARQ_ASSIGN_OR_RETURN(auto shapes, ParseShapes(o.shapes));
  SPARQ_ASSIGN_OR_RETURN(auto ns, ParseList<int64_t>(o.ns, "--n"));
  // Patterns as the user spelled them, for messages and the JSON rows' "pattern".
  SPARQ_ASSIGN_OR_RETURN(auto pattern_list, ParseList<std::string>(o.patterns, "--patterns"));
  SPARQ_ASSIGN_OR_RETURN(auto patterns, ParsePatterns(o.patterns));
  SPARQ_ASSIGN_OR_RETURN(auto threads_list, ParseList<int>(o.threads, "--threads"));
  SPARQ_ASSIGN_OR_RETURN(auto value_list, ParseList<std::string>(o.values, "--values"));
  // Value types: f32 / bf16 as encoded; int8 / int4 specs quantize the f32 encoding at pack time.
  std::vector<ValueSpec> specs;
  for (const auto& v : value_list) {
    auto spec = ValueSpec::Parse(v);
    if (!spec.ok()) return spec.status().WithContext("--values");
    if (spec->dtype == DType::kF16) return InvalidInput("--values: f16 values run as f32 (want f32, bf16, int8[:gN] or int4[:gN][:sym])");
    specs.push_back(*spec);
  }
  auto encode_dtype = [](const ValueSpec& v) { return v.quantized() ? DType::kF32 : v.dtype; };
  const int64_t nmax = *std::max_element(ns.begin(), ns.end());
  const MachineInfo machine = DescribeMachine(cfg);
  std::printf("%s\n", MachineLine(machine).c_str());
  if (o.explain) {
    std::mt19937_64 erng(42);
    std::uniform_real_distribution<float> eu(-1.0f, 1.0f);
    for (const auto& [m, k] : shapes) {
      std::vector<float> w0(size_t(m * k));
      for (auto& v : w0) v = eu(erng);
      for (size_t pi = 0; pi < patterns.size(); ++pi) {
        const Pattern& p = patterns[pi];
        std::vector<float> w = w0;
        if (p.kind != PatternKind::kDense) {
          SPARQ_RETURN_IF_ERROR(MagnitudePrune(p, w, m, k, "bench weights"));
        }
        for (const ValueSpec& spec : specs) {
          auto s = Encode(w, m, k, PickFormat(p), p, encode_dtype(spec));
          if (!s.ok()) return s.status().WithContext("pattern " + pattern_list[pi]);
          SPARQ_ASSIGN_OR_RETURN(LinearWeight lw,
                                 LinearWeight::FromMatrix(std::move(s).value(), spec, "bench", cfg));
          for (int64_t n : ns) {
            std::printf("%lldx%lld %s %s n=%lld (stored as %s)\n%s", static_cast<long long>(m),
                        static_cast<long long>(k), pattern_list[pi].c_str(),
                        spec.Name().c_str(), static_cast<long long>(n),
                        lw.format().c_str(), lw.explain(n).c_str());
          }
        }
      }
    }
    return Status::Ok();
  }

  std::map<int, double> peak, load_fma, bw;
  for (int t : threads_list) {
    peak[t] = cpu::MeasurePeakFmaGflops(t, cfg);
    load_fma[t] = cpu::MeasureLoadFmaGflops(t, cfg);
    // Twice the last-level cache at least: a smaller buffer measures the cache, not memory.
    bw[t] = cpu::MeasureReadGbps(
        t, std::max<int64_t>(int64_t{64} << 20, 2 * LastLevelCacheBytes()), cfg);
    std::printf(
        "machine, %d thread(s): peak FMA %.1f GFLOP/s (%.1f with one L1 load per FMA), read "
        "bandwidth %.1f GB/s\n",
        t, peak[t], load_fma[t], bw[t]);
  }
  const int64_t rotate_bytes =
      o.rotate_bytes >= 0 ? o.rotate_bytes : 2 * LastLevelCacheBytes();
  const auto py = RunPythonPeers(o, rotate_bytes);
  auto peers = MakeDensePeers();
  std::map<int, std::unique_ptr<ThreadPool>> pools;
  for (int t : threads_list) pools[t] = std::make_unique<ThreadPool>(t);
  auto set_threads = [&](int t) { for (auto& p : peers) p->SetThreads(t); };

  json rows = json::array();
  if (rotate_bytes > 0) {
    std::printf(
        "rows with n <= %lld rotate through copies of each weight (sparq's and the peers') of "
        ">= %.0f MiB per side (last-level cache %.0f MiB)\n",
        static_cast<long long>(kRotateMaxN), rotate_bytes / 1048576.0,
        LastLevelCacheBytes() / 1048576.0);
  }
  // How long the peers' idle threads spin (tools/main.cc sets both before the libraries load;
  // a value the user set is kept), so that a reader can tell a run with short spins from one
  // without: a 2-thread row measured beside a spinning peer thread loses its second core.
  {
    const char* ob = std::getenv("OPENBLAS_THREAD_TIMEOUT");
    const char* gs = std::getenv("GOMP_SPINCOUNT");
    std::printf("peers' idle threads spin: OPENBLAS_THREAD_TIMEOUT=%s, GOMP_SPINCOUNT=%s; each "
                "sample starts after a 2 ms pause\n",
                ob ? ob : "unset (OpenBLAS: 2^28 cycles)", gs ? gs : "unset (libgomp's default)");
  }
  std::printf("%6s %6s %4s %2s %-18s %-12s %-30s %9s %7s %6s %-8s %9s %7s %-6s %9s %7s\n", "m", "k", "n", "T",
              "pattern", "val", "kernel", "ms", "GFLOP/s", "GB/s", "peer", "peer ms", "speedup",
              "sparse", "sp ms", "vs sp");
  std::mt19937_64 rng(42);
  const bool any_rotated = std::any_of(ns.begin(), ns.end(), [](int64_t n) { return n <= kRotateMaxN; });
  for (const auto& shape : shapes) {
    // Plain locals, not a structured binding: lambdas below capture them (clang 14 cannot).
    const int64_t m = shape.first, k = shape.second;
    std::vector<float> w0(size_t(m * k)), x(size_t(nmax * k)), y(size_t(nmax * m)), yref(size_t(nmax * m));
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (auto& v : w0) v = u(rng);
    for (auto& v : x) v = u(rng);
    // The dense peers' copies of W for the few-token rows (the first is w0 itself).
    const int64_t peer_copies =
        any_rotated ? RotationCopies(uint64_t(m * k) * 4, 1, rotate_bytes) : 1;
    std::vector<std::vector<float>> w_extra(size_t(peer_copies - 1), w0);
    std::vector<const float*> w_ptrs{w0.data()};
    for (const auto& c : w_extra) w_ptrs.push_back(c.data());
    auto peer_rotation = [&](int64_t n) {
      return Rotation<const float*>{&w_ptrs, size_t(RotationCopies(uint64_t(m * k) * 4, n, rotate_bytes)), 0};
    };
    // Dense peers: check each against OpenBLAS once, then medians per (n, threads).
    std::map<std::pair<int64_t, int>, std::pair<std::string, DensePeer*>> best;
    std::map<std::pair<int64_t, int>, std::map<std::string, double>> peer_s;
    for (int64_t n : ns) {
      for (int t : threads_list) {
        set_threads(t);
        std::map<std::string, std::vector<double>> samples;
        peers[0]->Run(w0.data(), x.data(), yref.data(), m, k, n);
        std::vector<DensePeer*> ok;
        for (auto& p : peers) {
          p->Run(w0.data(), x.data(), y.data(), m, k, n);
          double err = 0;
          for (int64_t i = 0; i < n * m; ++i) err = std::max<double>(err, std::fabs(y[i] - yref[i]));
          if (err < 1e-2) ok.push_back(p.get());
          else std::fprintf(stderr, "peer %s disagrees with openblas (max err %g): skipped\n", p->name().c_str(), err);
        }
        auto rot = peer_rotation(n);
        for (int rep = 0; rep < o.repeats; ++rep) {
          for (DensePeer* p : ok) {
            samples[p->name()].push_back(
                Sample([&] { p->Run(rot.Next(), x.data(), y.data(), m, k, n); }));
          }
        }
        double bt = 1e30;
        for (DensePeer* p : ok) {
          const double med = Median(samples[p->name()]);
          peer_s[{n, t}][p->name()] = med;
          if (med < bt) bt = med, best[{n, t}] = {p->name(), p};
        }
      }
    }
    // Our own bf16 dense kernel (the fair baseline for bf16 sparse). It is sampled inside each
    // bf16 row's loop, interleaved with sparq and the f32 peer, so that all three run under the
    // same cache state.
    std::vector<LinearWeight> bf16_dense;
    auto make_bf16_dense = [&]() -> Status {
      auto d = DenseMatrix::FromDense(w0, m, k, DType::kBF16);
      if (!d.ok()) return d.status();
      auto lw = LinearWeight::FromMatrix(std::move(d).value(), "dense_bf16", cfg);
      if (!lw.ok()) return lw.status();
      bf16_dense.push_back(std::move(lw).value());
      return Status::Ok();
    };
    if (std::any_of(specs.begin(), specs.end(), [](const ValueSpec& v) { return v.dtype == DType::kBF16; })) {
      SPARQ_RETURN_IF_ERROR(make_bf16_dense());
      const int64_t copies =
          any_rotated ? RotationCopies(bf16_dense[0].weight_bytes(), 1, rotate_bytes) : 1;
      while (int64_t(bf16_dense.size()) < copies) SPARQ_RETURN_IF_ERROR(make_bf16_dense());
    }
    for (size_t pi = 0; pi < patterns.size(); ++pi) {
      const Pattern& p = patterns[pi];
      std::vector<float> w = w0;
      if (p.kind != PatternKind::kDense) SPARQ_RETURN_IF_ERROR(MagnitudePrune(p, w, m, k, "bench weights"));
      int64_t nnz = 0;
      for (float v : w) nnz += v != 0.0f;
      const bool eigen_row = p.kind == PatternKind::kUnstructured || (p.kind == PatternKind::kNM && p.n == 2 && p.m == 4);
      // Eigen's copies (CSR: a 4-byte value and a 4-byte index per nonzero).
      std::vector<std::unique_ptr<EigenSparsePeer>> eigen;
      if (eigen_row) {
        const int64_t copies =
            any_rotated ? RotationCopies(uint64_t(nnz) * 8 + uint64_t(m) * 4, 1, rotate_bytes) : 1;
        for (int64_t c = 0; c < copies; ++c) eigen.push_back(std::make_unique<EigenSparsePeer>(w.data(), m, k));
      }
      std::map<int64_t, double> eigen_s;  // single-threaded: measured once per n
      for (const ValueSpec& spec : specs) {
        const DType dt = spec.dtype;
        const double tp0 = Now();
        auto encode = [&]() -> Result<LinearWeight> {
          auto s = Encode(w, m, k, PickFormat(p), p, encode_dtype(spec));
          if (!s.ok()) return s.status().WithContext("pattern " + pattern_list[pi]);
          auto lw = LinearWeight::FromMatrix(std::move(s).value(), spec, "bench", cfg);
          if (!lw.ok()) return lw.status().WithContext("pattern " + pattern_list[pi] + ", values " + spec.Name());
          return lw;
        };
        std::vector<LinearWeight> lws;
        {
          auto lw = encode();
          if (!lw.ok()) return lw.status();
          lws.push_back(std::move(lw).value());
        }
        const double pack_s = Now() - tp0;
        const LinearWeight* lw = &lws[0];
        const int64_t sparq_copies =
            any_rotated ? RotationCopies(lw->weight_bytes(), 1, rotate_bytes) : 1;
        while (int64_t(lws.size()) < sparq_copies) {
          auto c = encode();
          if (!c.ok()) return c.status();
          lws.push_back(std::move(c).value());
        }
        lw = &lws[0];
        for (int64_t n : ns) {
          for (int t : threads_list) {
            set_threads(t);
            DensePeer* bp = best[{n, t}].second;
            const bool with_bf16 = dt == DType::kBF16 && !bf16_dense.empty();
            Rotation<LinearWeight> rs{&lws, size_t(RotationCopies(lw->weight_bytes(), n, rotate_bytes)), 0};
            Rotation<LinearWeight> rb{&bf16_dense, 1, 0};
            if (with_bf16) {
              rb.count = size_t(RotationCopies(bf16_dense[0].weight_bytes(), n, rotate_bytes));
            }
            auto rp = peer_rotation(n);
            std::vector<double> ts, tp, tb;
            lw->Forward(x.data(), n, y.data(), pools[t].get());  // warm up
            if (with_bf16) bf16_dense[0].Forward(x.data(), n, yref.data(), pools[t].get());
            for (int rep = 0; rep < o.repeats; ++rep) {
              ts.push_back(Sample([&] { rs.Next().Forward(x.data(), n, y.data(), pools[t].get()); }));
              if (bp) tp.push_back(Sample([&] { bp->Run(rp.Next(), x.data(), yref.data(), m, k, n); }));
              if (with_bf16) {
                tb.push_back(Sample(
                    [&] { rb.Next().Forward(x.data(), n, yref.data(), pools[t].get()); }));
              }
            }
            const double med = Median(ts), pmed = bp ? Median(tp) : 0;
            json r;
            r["m"] = m; r["k"] = k; r["n"] = n; r["threads"] = t;
            r["pattern"] = pattern_list[pi]; r["values"] = spec.Name();
            r["kernel"] = lw->kernel_name(n);
            r["cpu_model"] = machine.cpu_model;
            r["isa"] = machine.isa;
            r["median_s"] = med;
            r["nnz"] = nnz;
            r["gflops"] = 2.0 * n * nnz / med * 1e-9;
            r["weight_bytes"] = lw->weight_bytes();
            r["weight_gbps"] = lw->weight_bytes() / med * 1e-9;
            r["pack_s"] = pack_s;
            r["peer"] = bp ? best[{n, t}].first : "";
            r["peer_median_s"] = pmed;
            r["speedup"] = pmed / med;
            r["dense_peers_median_s"] = peer_s[{n, t}];
            r["peak_fma_gflops"] = peak[t];
            r["load_fma_gflops"] = load_fma[t];
            r["read_gbps"] = bw[t];
            r["frac_peak_fma"] = 2.0 * n * nnz / med * 1e-9 / peak[t];
            r["frac_read_bw"] = lw->weight_bytes() / med * 1e-9 / bw[t];
            // Copies each side cycled through (1: none; the weights may then stay cached).
            r["rotated_copies"] = {{"sparq", rs.count}, {"peer", rp.count}};
            if (with_bf16) {
              r["rotated_copies"]["bf16_dense"] = rb.count;
              r["bf16_dense_median_s"] = Median(tb);
              r["speedup_vs_bf16_dense"] = Median(tb) / med;
            }
            // Sparse peers: Eigen (one thread; measured once per n), scipy / torch (script).
            std::string sp;
            double spt = 0;
            if (!eigen.empty()) {
              if (!eigen_s.count(n)) {
                std::vector<double> es;
                const int reps = n >= 128 ? 1 : std::min(o.repeats, 3);
                Rotation<std::unique_ptr<EigenSparsePeer>> re{
                    &eigen, size_t(std::min<int64_t>(
                                int64_t(eigen.size()),
                                RotationCopies(uint64_t(nnz) * 8 + uint64_t(m) * 4, n, rotate_bytes))),
                    0};
                for (int rep = 0; rep < reps; ++rep) es.push_back(Sample([&] { re.Next()->Run(x.data(), yref.data(), n); }));
                eigen_s[n] = Median(es);
              }
              sp = "eigen", spt = eigen_s[n];
              r["eigen_median_s"] = spt;
            }
            const std::string key = std::to_string(m) + "," + std::to_string(k) + "," + std::to_string(n) + "," +
                                    std::to_string(t) + "," + pattern_list[pi];
            if (auto it = py.find(key); it != py.end()) {
              for (auto& [name, sec] : it->second) {
                r[name + "_median_s"] = sec;
                if (sp.empty() || sec < spt) sp = name, spt = sec;
              }
            }
            if (!sp.empty()) {
              r["sparse_peer"] = sp;
              r["sparse_peer_median_s"] = spt;
              r["speedup_vs_sparse_peer"] = spt / med;
            }
            std::printf("%6lld %6lld %4lld %2d %-18s %-12s %-30.30s %9.4f %7.1f %6.1f %-8s %9.4f %6.2fx %-6s %9.4f %6.1fx\n",
                        (long long)m, (long long)k, (long long)n, t, pattern_list[pi].c_str(),
                        spec.Name().c_str(), r["kernel"].get<std::string>().c_str(), med * 1e3,
                        r["gflops"].get<double>(), r["weight_gbps"].get<double>(), r["peer"].get<std::string>().c_str(),
                        pmed * 1e3, pmed / med, sp.c_str(), spt * 1e3, sp.empty() ? 0.0 : spt / med);
            std::fflush(stdout);
            rows.push_back(r);
          }
        }
      }
    }
  }
  SPARQ_RETURN_IF_ERROR(o.json.Write(rows.dump(1)));
  if (!o.plot_path.empty()) {
    SPARQ_RETURN_IF_ERROR(WritePlot(rows, o.plot_path, PeerScriptDir(o)));
  }
  return Status::Ok();
}

BenchRegistrar kernels(
    "kernels", "Time sparse products against dense (OpenBLAS, oneDNN, BLIS) and sparse peers",
    [](CLI::App& sub) -> RunFn {
      auto o = std::make_shared<Options>();
      o->shapes = "4096x4096,11008x4096,4096x11008,576x576,1536x576,576x1536";
      o->ns = "1,4,16,32,128,512";
      o->patterns =
          "2:4,4:8,1:4,vnm:8:2:4,vnm:16:2:4,vnm:32:2:4,unstructured:0.5,unstructured:0.7,"
          "unstructured:0.8,unstructured:0.9,unstructured:0.95,unstructured:0.99,"
          "block:16x16:0.5,block:16x16:0.7,block:16x16:0.9,block:32x32:0.5,block:32x32:0.7,"
          "block:32x32:0.9";
      o->threads = "1,2";
      o->values = "f32";
      o->py_peers = "bench/peers/sparse_peers.py";
      o->json.Register(sub, "the rows (docs/bench-json.md)");
      sub.add_option("--plot", o->plot_path, "Draw speedup vs sparsity per n to FILE (.png or .svg)");
      sub.add_option("--shapes", o->shapes, "Comma-separated MxK shapes")->capture_default_str();
      sub.add_option("--n", o->ns, "Comma-separated token counts")->capture_default_str();
      sub.add_option("--patterns", o->patterns, "Comma-separated patterns")->capture_default_str();
      sub.add_option("--threads", o->threads, "Comma-separated thread counts")->capture_default_str();
      sub.add_option("--values", o->values,
                     "Comma-separated value types: f32, bf16, int8[:gN], int4[:gN][:sym] (N = 32, "
                     "64, 128; int8 / int4 quantize round-to-nearest; unstructured rows keep the "
                     "codes in the bit-mask layout, column lists run dequantized to f32)")
          ->capture_default_str();
      sub.add_option("--repeats", o->repeats, "Timing samples per row (median)")->capture_default_str();
      sub.add_option("--py-peers", o->py_peers, "scipy/torch peer script ('' to skip)")->capture_default_str();
      sub.add_flag("--explain", o->explain,
                   "Print the kernel each shape / pattern / values / n would run and why the other "
                   "kernels of its layout declined (no timing)");
      sub.add_option("--rotate-bytes", o->rotate_bytes,
                     "Bytes of weight copies each side of a row with n <= 16 cycles through, so "
                     "that weights come from memory as in a model (default: twice the last-level "
                     "cache; 0: no copies)");
      return [o](const KernelConfig& cfg) -> Status {
        if (o->repeats < 1) return InvalidInput("--repeats must be >= 1");
        StdoutToStderr table_to_stderr(&o->json);  // bare --json: stdout holds the rows alone
        return RunKernels(*o, cfg);
      };
    });

}  // namespace
}  // namespace sparq::cli
