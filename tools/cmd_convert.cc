// `sparq convert IN OUT --pattern P --format auto|dense|coo|csr|bsr|nm|vnm [--include REGEX]
//                       [--values f32|bf16|f16|int8[:gN]|int4[:gN][:sym]]` (--dtype: the same)
//
// Reads a GGUF, safetensors or sparq file and writes a sparq checkpoint (atomically).
//   * Selected tensors: 2-D tensors whose full name matches --include (std::regex, ECMAScript,
//     whole-name match). Default: every 2-D tensor except embeddings and the output head (names
//     containing token_embd, embed_tokens, wte, word_embeddings or lm_head, or named
//     output.weight): pruning those hurts most and they are not linear layers of a block.
//     Each selected tensor is read as dense f32, magnitude-masked to --pattern (MagnitudePrune),
//     and encoded in --format (auto: PickFormat(pattern)) with values in --values (default f32;
//     int8 / int4 round to nearest per group, nm (kept values) and csr (columns) only: format.h).
//   * Everything else is copied unchanged where the checkpoint can hold it: plain f32/f16/bf16
//     tensors keep their type and bits, sparse matrices of a .sparq input keep their encoding,
//     GGUF quantized tensors (Q4_1, Q4_K, ...) are dequantized to f32. --dtype applies only to the
//     selected tensors.
//   * --format dense turns every tensor into a plain dense tensor (no sparq matrices): sparse
//     matrices are densified in their value dtype (or --dtype), so `convert x.sparq y --format
//     dense` gives back exactly the stored (masked, rounded) weights. --pattern is optional then;
//     if given, the selected tensors are masked first.
//   Free-form metadata of a safetensors / sparq input is carried over.
// `sparq convert IN OUT --model [--values f32|bf16|f16]` writes instead a model checkpoint every
// sparq command loads (SaveLlamaCheckpoint: configuration, tokenizer, weights as loaded; a GGUF's
// Q4_0 / Q4_1 / Q8_0 layers keep their codes and scales, other weights are stored as --values).
// Exit codes: 0 ok, 1 bad input (file, flag, pattern), 2 internal error.
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <regex>

#include "sparq/checkpoint.h"
#include "sparq/format.h"
#include "sparq/model.h"
#include "sparq/pattern.h"
#include "sparq/thread_pool.h"
#include "tools/command.h"
#include "tools/model_source.h"

namespace sparq::cli {
namespace {

constexpr char kDefaultExclude[] =
    ".*(token_embd|embed_tokens|wte|word_embeddings|lm_head).*|output\\.weight";

struct Options {
  std::string in, out, pattern, format = "auto", include, values;
  int threads = 0;
  bool model = false;
};

struct Slot {
  bool is_matrix = false;
  CheckpointTensor matrix;
  NamedTensor plain;
  Status status;
  bool converted = false;
};

// --model: the whole model, as loaded, in the layout LlamaModel::FromSparq reads.
Status RunModel(const Options& o, const KernelConfig& cfg) {
  if (!o.pattern.empty() || o.format != "auto" || !o.include.empty()) {
    return InvalidInput("convert --model writes the model as loaded: --pattern, --format and "
                        "--include do not apply (prune with `sparq prune`)");
  }
  const std::string name = o.values.empty() ? "f32" : o.values;
  const std::optional<DType> dt = ParseDType(name);  // SaveLlamaCheckpoint refuses non-floats
  if (!dt) {
    return InvalidInput("convert --model: --values must be f32, bf16 or f16, not '" + name +
                        "' (quantizing is `sparq quantize`)");
  }
  SPARQ_ASSIGN_OR_RETURN(LlamaModel m,
                         LlamaModel::Load(o.in, cfg, {.gguf_values = GgufValues::kAsStored}));
  SPARQ_RETURN_IF_ERROR(SaveLlamaCheckpoint(m, o.out, *dt));
  std::error_code ec;
  const auto bytes = std::filesystem::file_size(o.out, ec);
  std::printf("%s: the model of %s (its blocks' layers %s, as loaded), %llu bytes\n",
              o.out.c_str(), o.in.c_str(), m.block_linear_values().c_str(),
              static_cast<unsigned long long>(ec ? 0 : bytes));
  return Status::Ok();
}

Status Run(const Options& o) {
  const bool to_dense = o.format == "dense";
  std::optional<FormatKind> format;
  if (o.format != "auto") {
    format = ParseFormatName(o.format);
    if (!format) return InvalidInput("convert: unknown --format '" + o.format + "' (auto|dense|coo|csr|bsr|nm|vnm)");
  }
  std::optional<Pattern> pattern;
  if (!o.pattern.empty()) {
    auto p = Pattern::Parse(o.pattern);
    if (!p.ok()) return p.status().WithContext("convert: --pattern");
    pattern = *p;
  } else if (!to_dense) {
    return InvalidInput("convert: --pattern is required unless --format dense");
  }
  std::optional<DType> dtype;  // float values of the converted tensors
  ValueSpec spec;               // or quantized ones
  if (!o.values.empty()) {
    auto v = ValueSpec::Parse(o.values);
    if (!v.ok()) return v.status().WithContext("convert: --values");
    spec = *v;
    if (!spec.quantized()) dtype = spec.dtype;
  }
  std::regex include, exclude;
  try {
    if (!o.include.empty()) include = std::regex(o.include, std::regex::ECMAScript);
    exclude = std::regex(kDefaultExclude, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    return InvalidInput("convert: bad --include regex '" + o.include + "': " + e.what());
  }
  const FormatKind fmt = format ? *format : (pattern ? PickFormat(*pattern) : FormatKind::kDense);
  if (spec.quantized() && (to_dense || fmt == FormatKind::kCoo)) {
    return InvalidInput("convert: " + spec.Name() +
                        " values are stored for nm, vnm, bsr and csr matrices, not " +
                        std::string(to_dense ? "dense" : FormatName(fmt)) + " ones");
  }

  SPARQ_ASSIGN_OR_RETURN(ModelSource src, ModelSource::Open(o.in));
  std::vector<Slot> slots(src.tensors.size());
  ThreadPool pool(o.threads > 0 ? o.threads : DefaultThreads());
  pool.ParallelFor(static_cast<int64_t>(src.tensors.size()), [&](int64_t i, int) {
    const SourceTensor& t = src.tensors[i];
    Slot& s = slots[i];
    const bool selected = pattern && t.shape.size() == 2 &&
                          (o.include.empty() ? !std::regex_match(t.name, exclude)
                                             : std::regex_match(t.name, include));
    const CheckpointTensor* stored = t.matrix_index >= 0 ? &src.ckpt->matrices[t.matrix_index] : nullptr;
    if (selected) {
      auto w = src.ReadF32(t);
      if (!w.ok()) { s.status = w.status(); return; }
      const int64_t m = t.shape[0], k = t.shape[1];
      float* wp = w->mutable_data_as<float>();
      s.status = MagnitudePrune(*pattern, std::span<float>(wp, w->numel()), m, k, t.name);
      if (!s.status.ok()) return;
      const DType vt = dtype ? *dtype : DType::kF32;
      if (to_dense) {
        auto d = FromF32(*w, vt);
        if (!d.ok()) { s.status = d.status(); return; }
        s.plain = {t.name, std::move(*d)};
      } else {
        auto enc = Encode(std::span<const float>(wp, w->numel()), m, k, fmt, *pattern, vt);
        if (!enc.ok()) { s.status = enc.status().WithContext("tensor '" + t.name + "'"); return; }
        if (spec.quantized()) {
          auto q = QuantizeMatrix(*enc, spec, {}, t.name);
          if (!q.ok()) { s.status = q.status(); return; }
          *enc = std::move(*q);
        }
        s.is_matrix = true;
        s.matrix = {t.name, std::move(*enc), *pattern};
      }
      s.converted = true;
      return;
    }
    if (stored) {
      if (!to_dense) {
        s.is_matrix = true;
        s.matrix = *stored;
        return;
      }
      Tensor dense = ToDense(stored->matrix);
      // Quantized codes come back as their dequantized f32 values.
      const DType vt = dtype                          ? *dtype
                       : IsQuantized(stored->matrix) ? DType::kF32
                                                     : ValueDType(stored->matrix);
      auto d = FromF32(dense, vt);
      if (!d.ok()) { s.status = d.status(); return; }
      s.plain = {t.name, std::move(*d)};
      return;
    }
    if (t.plain_index >= 0) {
      s.plain = src.ckpt->tensors[t.plain_index];  // any dtype, unchanged (a view)
      return;
    }
    if (auto pf = src.PlainFloat(t)) {
      s.plain = {t.name, std::move(*pf)};
      return;
    }
    auto w = src.ReadF32(t);
    if (!w.ok()) { s.status = w.status(); return; }
    s.plain = {t.name, std::move(*w)};
  });

  Checkpoint out;
  if (src.ckpt) out.metadata = src.ckpt->metadata;
  int converted = 0;
  uint64_t before = 0, after = 0;
  for (size_t i = 0; i < slots.size(); ++i) {
    if (!slots[i].status.ok()) return slots[i].status;
    if (slots[i].is_matrix) {
      if (slots[i].converted) {
        ++converted;
        before += src.tensors[i].stored_bytes;
        after += ByteSize(slots[i].matrix.matrix);
      }
      out.matrices.push_back(std::move(slots[i].matrix));
    } else {
      if (slots[i].converted) ++converted;
      out.tensors.push_back(std::move(slots[i].plain));
    }
  }
  if (pattern && converted == 0) {
    std::fprintf(stderr, "sparq convert: warning: no 2-D tensor matched the selection\n");
  }
  if (to_dense && out.matrices.empty()) {
    // Plain safetensors: no sparq matrix table, only the carried free-form metadata.
    SPARQ_RETURN_IF_ERROR(WriteSafetensors(o.out, out.tensors, out.metadata));
  } else {
    SPARQ_RETURN_IF_ERROR(WriteCheckpoint(o.out, out));
  }
  std::printf("%s: %zu tensors written, %d converted", o.out.c_str(), slots.size(), converted);
  if (after) {
    std::printf(" (stored %.2f MiB, were %.2f MiB in %s)", after / 1048576.0, before / 1048576.0,
                o.in.c_str());
  }
  std::printf("\n");
  return Status::Ok();
}

Registrar reg("convert", "Magnitude-prune the selected weights of a model file to a pattern and write a sparq checkpoint",
              [](CLI::App& sub) -> RunFn {
                auto o = std::make_shared<Options>();
                sub.add_option("input", o->in, "GGUF, safetensors or sparq file")->required();
                sub.add_option("output", o->out, "sparq checkpoint (a safetensors file) to write")->required();
                sub.add_option("--pattern", o->pattern, "2:4 | 4:8 | unstructured:0.9 | block:16x16 | vnm:8:2:4 | rows:0.3 ...");
                sub.add_option("--format", o->format, "auto | dense | coo | csr | bsr | nm | vnm (default auto)");
                sub.add_option("--include", o->include, "regex (whole name) of the 2-D tensors to convert");
                sub.add_option(
                    "--values,--dtype", o->values,
                    "values of converted tensors: f32 | bf16 | f16 | int8[:gN] | "
                    "int4[:gN][:sym] (N = 32, 64, 128; quantized: every format but coo)");
                sub.add_option("--threads", o->threads, "worker threads");
                sub.add_flag("--model", o->model,
                             "write the whole model (GGUF or Hugging Face folder) as a checkpoint "
                             "sparq commands load: Q4_0 / Q4_1 / Q8_0 layers keep their codes, "
                             "other weights stored as --values (f32, bf16 or f16)");
                return [o](const KernelConfig& cfg) {
                  return o->model ? RunModel(*o, cfg) : Run(*o);
                };
              });

}  // namespace
}  // namespace sparq::cli
