// `sparq inspect FILE [--json [FILE]]`: what a model file holds. For every tensor: shape, dtype,
// stored format, density, the finest pattern it satisfies (FinestPattern on its dense f32 form; 1-D
// tensors get their density only, tensors of rank > 2 are viewed as [prod(leading dims), last]),
// bytes as stored and as dense f32, and bits per dense weight as stored (what a quantized sparse
// file is compared by: Q4_1 is 5). Every tensor is dequantized / densified on the way, so a
// successful inspect also proves the file reads end to end. GGUF types read: F32, F16, BF16, Q8_0,
// Q4_0, Q4_1 and the K-quants Q2_K..Q6_K (dequantized to f32); others (IQ*, Q5_0, ...) are listed
// as "(unsupported type)".
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "sparq/pattern.h"
#include "sparq/thread_pool.h"
#include "tools/command.h"
#include "tools/json_output.h"
#include "tools/model_source.h"

namespace sparq::cli {
namespace {

// Stored bits per parameter (what a quantized sparse file is compared by: Q4_1 is 5).
double BitsPerWeight(uint64_t stored_bytes, uint64_t params) {
  return params ? 8.0 * double(stored_bytes) / double(params) : 0.0;
}

struct Row {
  double density = 0;
  std::string pattern;     // "-" for rank < 2
  Pattern finest;
  uint64_t nonfinite = 0;  // NaN / Inf elements
  uint64_t numel = 0;
  Status status;           // unreadable tensors are listed with their error
};

std::string ShapeStr(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

std::string Bytes(uint64_t b) {
  char buf[32];
  if (b >= (uint64_t{1} << 30)) std::snprintf(buf, sizeof(buf), "%.2f GiB", b / 1073741824.0);
  else if (b >= (uint64_t{1} << 20)) std::snprintf(buf, sizeof(buf), "%.2f MiB", b / 1048576.0);
  else if (b >= 1024) std::snprintf(buf, sizeof(buf), "%.1f KiB", b / 1024.0);
  else std::snprintf(buf, sizeof(buf), "%llu B", static_cast<unsigned long long>(b));
  return buf;
}

Row Analyze(const ModelSource& src, const SourceTensor& t) {
  Row r;
  auto f = src.ReadF32(t);
  if (!f.ok()) {
    r.status = f.status();
    return r;
  }
  const float* w = f->data_as<float>();
  r.numel = f->numel();
  uint64_t nnz = 0;
  for (uint64_t i = 0; i < r.numel; ++i) {
    nnz += w[i] != 0.0f;
    r.nonfinite += !std::isfinite(w[i]);
  }
  r.density = r.numel ? static_cast<double>(nnz) / static_cast<double>(r.numel) : 0.0;
  if (t.shape.size() >= 2) {
    const int64_t k = t.shape.back();
    const int64_t m = k ? static_cast<int64_t>(r.numel) / k : 0;
    r.finest = FinestPattern(std::span<const float>(w, r.numel), m, k);
    r.pattern = r.finest.ToString();
  } else {
    r.pattern = "-";
  }
  return r;
}

// `v` cut to at most `max_len` bytes, on a UTF-8 character boundary (a cut inside a multi-byte
// character made invalid UTF-8, which the JSON writer refuses), with the full size appended.
std::string MetaValue(const std::string& v, size_t max_len) {
  if (v.size() <= max_len) return v;
  size_t cut = max_len;
  while (cut > 0 && (static_cast<unsigned char>(v[cut]) & 0xC0) == 0x80) --cut;
  return v.substr(0, cut) + "... (" + std::to_string(v.size()) + " bytes)";
}

Status Run(const std::string& path, const JsonOutput& json, int threads) {
  SPARQ_ASSIGN_OR_RETURN(ModelSource src, ModelSource::Open(path));
  std::vector<Row> rows(src.tensors.size());
  ThreadPool pool(threads > 0 ? threads : DefaultThreads());
  pool.ParallelFor(static_cast<int64_t>(src.tensors.size()), [&](int64_t i, int) {
    rows[i] = Analyze(src, src.tensors[i]);
  });
  // A tensor that fails to read for a reason other than "unsupported type" is bad input.
  for (size_t i = 0; i < rows.size(); ++i) {
    if (!rows[i].status.ok() && rows[i].status.code() != StatusCode::kUnsupported) return rows[i].status;
  }

  std::vector<std::pair<std::string, std::string>> meta;
  if (src.gguf) {
    for (const auto& [k, v] : src.gguf->metadata()) meta.push_back({k, GgufValueToString(v)});
  } else {
    for (const auto& [k, v] : src.ckpt->metadata) meta.push_back({k, v});
  }
  uint64_t total_stored = 0, total_f32 = 0, total_params = 0;
  int unsupported = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    uint64_t numel = 1;
    for (int64_t d : src.tensors[i].shape) numel *= static_cast<uint64_t>(d);
    total_params += numel;
    total_stored += src.tensors[i].stored_bytes;
    total_f32 += numel * 4;
    unsupported += !rows[i].status.ok();
  }

  if (json.requested()) {
    nlohmann::ordered_json j;
    j["file"] = path;
    j["kind"] = ModelFileKindName(src.kind);
    if (src.gguf) {
      j["gguf_version"] = src.gguf->version();
      j["alignment"] = src.gguf->alignment();
    }
    j["file_bytes"] = src.file_bytes;
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : meta) m[k] = MetaValue(v, 256);
    j["metadata"] = std::move(m);
    nlohmann::ordered_json ts = nlohmann::ordered_json::array();
    for (size_t i = 0; i < rows.size(); ++i) {
      const SourceTensor& t = src.tensors[i];
      nlohmann::ordered_json e;
      e["name"] = t.name;
      e["shape"] = t.shape;
      e["dtype"] = t.dtype;
      e["format"] = t.format;
      e["supported"] = rows[i].status.ok();
      if (rows[i].status.ok()) {
        e["density"] = rows[i].density;
        e["pattern"] = rows[i].pattern;
        e["nonfinite"] = rows[i].nonfinite;
      } else {
        e["error"] = rows[i].status.message();
      }
      if (t.matrix_index >= 0) e["recorded_pattern"] = src.ckpt->matrices[t.matrix_index].pattern.ToString();
      e["stored_bytes"] = t.stored_bytes;
      uint64_t numel = 1;
      for (int64_t d : t.shape) numel *= static_cast<uint64_t>(d);
      e["dense_f32_bytes"] = numel * 4;
      e["bits_per_weight"] = BitsPerWeight(t.stored_bytes, numel);
      ts.push_back(std::move(e));
    }
    j["tensors"] = std::move(ts);
    j["totals"] = {{"tensors", rows.size()},    {"params", total_params},
                   {"stored_bytes", total_stored}, {"dense_f32_bytes", total_f32},
                   {"bits_per_weight", BitsPerWeight(total_stored, total_params)},
                   {"unsupported", unsupported}};
    // Names and values from the file need not be UTF-8: invalid bytes become U+FFFD.
    SPARQ_RETURN_IF_ERROR(json.Write(j.dump(1, ' ', false, nlohmann::ordered_json::error_handler_t::replace)));
    if (json.to_stdout()) return Status::Ok();
  }

  std::printf("%s: %s", path.c_str(), ModelFileKindName(src.kind));
  if (src.gguf) {
    std::printf(" v%u, alignment %llu", src.gguf->version(),
                static_cast<unsigned long long>(src.gguf->alignment()));
  }
  std::printf(", %zu tensors\n", rows.size());
  for (const auto& [k, v] : meta) std::printf("  %s = %s\n", k.c_str(), MetaValue(v, 100).c_str());
  size_t w = 4;
  for (const auto& t : src.tensors) w = std::max(w, t.name.size());
  size_t dw = 6;
  for (const auto& t : src.tensors) dw = std::max(dw, t.dtype.size());
  std::printf("\n%-*s  %-16s %-*s %-6s %8s  %-22s %12s %6s %12s\n", static_cast<int>(w), "name", "shape",
              static_cast<int>(dw), "dtype", "format", "density", "finest pattern", "stored", "bits",
              "dense f32");
  for (size_t i = 0; i < rows.size(); ++i) {
    const SourceTensor& t = src.tensors[i];
    uint64_t numel = 1;
    for (int64_t d : t.shape) numel *= static_cast<uint64_t>(d);
    char dens[16] = "-";
    if (rows[i].status.ok()) std::snprintf(dens, sizeof(dens), "%.4f", rows[i].density);
    std::string pat = rows[i].status.ok() ? rows[i].pattern : "(unsupported type)";
    if (rows[i].status.ok() && rows[i].finest.kind == PatternKind::kUnstructured) {
      char buf[48];
      std::snprintf(buf, sizeof(buf), "unstructured%s:%.4f", rows[i].finest.per_row ? "-row" : "",
                    rows[i].finest.fraction);
      pat = buf;
    }
    if (rows[i].nonfinite) pat += " [" + std::to_string(rows[i].nonfinite) + " non-finite]";
    std::printf("%-*s  %-16s %-*s %-6s %8s  %-22s %12s %6.2f %12s\n", static_cast<int>(w), t.name.c_str(),
                ShapeStr(t.shape).c_str(), static_cast<int>(dw), t.dtype.c_str(), t.format.c_str(), dens,
                pat.c_str(), Bytes(t.stored_bytes).c_str(), BitsPerWeight(t.stored_bytes, numel),
                Bytes(numel * 4).c_str());
  }
  std::printf("\ntotal: %zu tensors, %llu parameters, stored %s vs dense f32 %s (%.3fx, %.2f bits per weight)",
              rows.size(), static_cast<unsigned long long>(total_params), Bytes(total_stored).c_str(),
              Bytes(total_f32).c_str(), total_f32 ? double(total_stored) / double(total_f32) : 0.0,
              BitsPerWeight(total_stored, total_params));
  if (unsupported) std::printf(", %d of unsupported type (not dequantized)", unsupported);
  std::printf("\n");
  return Status::Ok();
}

Registrar reg("inspect", "List the tensors of a GGUF, safetensors or sparq file with their sparsity",
              [](CLI::App& sub) -> RunFn {
                auto path = std::make_shared<std::string>();
                auto json = std::make_shared<JsonOutput>();
                auto threads = std::make_shared<int>(0);
                sub.add_option("file", *path,
                               "model file (.gguf, .safetensors, .sparq); GGUF F32/F16/BF16, Q8_0/Q4_0/Q4_1 "
                               "and the K-quants Q2_K..Q6_K are read as f32")
                    ->required();
                json->Register(sub, "the file's metadata and tensors");
                sub.add_option("--threads", *threads, "worker threads (default: SPARQ_NUM_THREADS or all cores)");
                return [=](const KernelConfig&) { return Run(*path, *json, *threads); };
              });

}  // namespace
}  // namespace sparq::cli
