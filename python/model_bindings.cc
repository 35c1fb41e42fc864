// sparq._sparq's model half: _Model (a loaded Llama-style model: perplexity, generation, speed,
// logits) and prune_model (whole-model calibration and pruning into a .sparq). Each wraps the
// library function the `sparq` command of the same name calls (Perplexity, EncodeChatPrompt +
// Generate, MeasureSpeed, PruneLlama), so Python and the command line give the same numbers; only
// argument handling lives here. The C++ runs with the GIL released; one call at a time per model.
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <type_traits>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "bindings_common.h"
#include "sparq/atomic_write.h"
#include "sparq/chat.h"
#include "sparq/model.h"
#include "sparq/model_file.h"
#include "sparq/thread_pool.h"

namespace sparq::python {
namespace {

struct Model {
  LlamaModel m;
  std::unique_ptr<ThreadPool> pool;
  // The ThreadPool runs one ParallelFor at a time, and Python threads may call one model at once
  // with the GIL released.
  std::unique_ptr<std::mutex> mu = std::make_unique<std::mutex>();
};

bool Int8Activations(const Model& model) {
  return model.m.weights().output.config().int8_activations;
}

std::string KvCacheValues(const Model& model) {
  return model.m.weights().output.config().kv_f16 ? "f16" : "f32";
}

// Runs f() (returning Status or Result<T>) with the GIL released and the model's lock held; raises
// its error with the GIL held again.
template <typename F>
auto Locked(const Model& model, F&& f) {
  using R = decltype(f());
  std::optional<R> r;
  {
    nb::gil_scoped_release release;  // before the lock: a waiting thread must not hold the GIL
    std::lock_guard<std::mutex> lock(*model.mu);
    r.emplace(f());
  }
  if constexpr (std::is_same_v<R, Status>) {
    Check(*r);
  } else {
    return Take(std::move(*r));
  }
}

Model Load(const std::string& path, int threads, const std::string& gguf_values,
           bool int8_activations, const std::string& kv_cache) {
  LoadOptions opt;
  opt.embedding_table = false;  // as `sparq generate` / `eval`: a tied quantized head's rows
  if (gguf_values == "as-stored") {
    opt.gguf_values = GgufValues::kAsStored;
  } else if (gguf_values == "f32") {
    opt.gguf_values = GgufValues::kF32;
  } else {
    Raise(InvalidInput("gguf_values must be 'as-stored' or 'f32', not '" + gguf_values + "'"));
  }
  // Every layer keeps its own copy of the config, so the flag set on a copy stays with the model
  // (as the command line's global --int8-activations sets it on the run's config).
  KernelConfig cfg = Config("");
  cfg.int8_activations = int8_activations;
  if (kv_cache != "f32" && kv_cache != "f16") {
    Raise(InvalidInput("kv_cache must be 'f32' or 'f16', not '" + kv_cache + "'"));
  }
  cfg.kv_f16 = kv_cache == "f16";
  Result<LlamaModel> r = Status();
  {
    nb::gil_scoped_release release;
    r = LlamaModel::Load(path, cfg, opt);
  }
  return Model{Take(std::move(r)), std::make_unique<ThreadPool>(threads)};
}

// `sparq eval --json`'s object, less "model" (the Python side adds the path it was given).
nb::dict Eval(const Model& model, const std::string& text, int64_t ctx, int64_t max_tokens,
              int64_t step) {
  if (ctx < 2 || ctx > (int64_t{1} << 16)) {
    Raise(InvalidInput("ctx must be in [2, 65536], got " + std::to_string(ctx)));
  }
  if (step < 0 || step > (int64_t{1} << 16)) {  // `sparq eval --step`'s range
    Raise(InvalidInput("step must be in [0, 65536], got " + std::to_string(step)));
  }
  // Tokenizing a book takes a while too: inside the released section, as `sparq eval` does it.
  const PerplexityResult r = Locked(model, [&]() -> Result<PerplexityResult> {
    SPARQ_ASSIGN_OR_RETURN(std::vector<int32_t> ids, model.m.tokenizer().Encode(text));
    if (max_tokens > 0 && static_cast<int64_t>(ids.size()) > max_tokens) ids.resize(max_tokens);
    return Perplexity(model.m, ids, ctx, model.pool.get(), {}, nullptr, step);
  });
  nb::dict d;
  d["perplexity"] = r.perplexity;
  d["tokens"] = r.tokens;
  d["ctx"] = r.ctx;
  d["windows"] = r.windows;
  d["seconds"] = r.seconds;
  d["threads"] = model.pool->num_threads();
  d["isa"] = model.m.weights().output.config().target_name();
  d["attention_isa"] = model.m.attention_target();
  d["step"] = step;
  d["int8_activations"] = Int8Activations(model);
  d["kv_cache"] = KvCacheValues(model);
  return d;
}

// (text, prompt ids, new ids) of `sparq generate`: the prompt in the model's chat template unless
// raw; the text is each new token decoded and concatenated, as the command prints it.
nb::tuple GenerateText(const Model& model, const std::string& prompt, int64_t max_new,
                       double temperature, int64_t top_k, double top_p, uint64_t seed, bool raw) {
  // The command line's ranges (CLI11 checks there; GenerateOptions' own checks cover the rest).
  if (max_new < 0 || max_new > (int64_t{1} << 16)) {
    Raise(InvalidInput("max_new must be in [0, 65536], got " + std::to_string(max_new)));
  }
  if (!(temperature >= 0.0 && temperature <= 100.0)) {
    Raise(InvalidInput("temperature must be in [0, 100], got " + std::to_string(temperature)));
  }
  const Tokenizer& tok = model.m.tokenizer();
  const ChatPrompt p = Take(EncodeChatPrompt(tok, prompt, raw));
  if (!p.warning.empty()) {
    // The command line's warning on stderr, as a Python warning (filterable).
    if (PyErr_WarnEx(PyExc_UserWarning, p.warning.c_str(), 1) < 0) throw nb::python_error();
  }
  GenerateOptions g;
  g.max_new = max_new;
  g.temperature = temperature;
  g.top_k = top_k;
  g.top_p = top_p;
  g.seed = seed;
  std::string text;
  const GenerateResult r = Locked(model, [&] {
    return Generate(model.m, p.ids, g, model.pool.get(), [&](int32_t t) {
      text += tok.Decode(std::span(&t, 1));
    });
  });
  return nb::make_tuple(nb::bytes(text.data(), text.size()), p.ids, r.tokens);
}

// Medians over `repeats` runs of MeasureSpeed, as `sparq bench model` takes them.
nb::tuple Bench(const Model& model, int64_t prompt, int64_t decode, int repeats) {
  if (prompt < 1 || prompt > 8192) Raise(InvalidInput("prompt must be in [1, 8192]"));
  if (decode < 1 || decode > 8192) Raise(InvalidInput("decode must be in [1, 8192]"));
  if (repeats < 1 || repeats > 100) Raise(InvalidInput("repeats must be in [1, 100]"));
  // The command's fixed synthetic prompt; taken modulo the vocabulary so that a small model has
  // valid ids (the same ids for any vocabulary of 20,100 tokens or more).
  const int64_t vocab = model.m.config().n_vocab;
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < prompt; ++i) ids.push_back(static_cast<int32_t>((100 + 37 * i % 20000) % vocab));
  std::vector<double> pre, dec;
  Locked(model, [&]() -> Status {
    for (int r = 0; r < repeats; ++r) {
      SPARQ_ASSIGN_OR_RETURN(ModelSpeed s, MeasureSpeed(model.m, ids, decode, model.pool.get()));
      pre.push_back(s.prefill_tok_s());
      dec.push_back(s.decode_tok_s());
    }
    return Status::Ok();
  });
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  return nb::make_tuple(median(pre), median(dec));
}

// Logits [n, n_vocab] of every position of `tokens`, run from an empty cache.
nb::ndarray<nb::numpy, float> Logits(const Model& model, const std::vector<int32_t>& tokens) {
  const int64_t n = static_cast<int64_t>(tokens.size()), v = model.m.config().n_vocab;
  if (n == 0) Raise(InvalidInput("logits: no tokens"));
  KvCache cache = Take(model.m.NewCache(n));
  auto* out = new std::vector<float>(static_cast<size_t>(n * v));
  nb::capsule owner(out, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
  Locked(model, [&] { return model.m.Forward(tokens, &cache, out->data(), true, model.pool.get()); });
  return nb::ndarray<nb::numpy, float>(out->data(), {static_cast<size_t>(n), static_cast<size_t>(v)},
                                       owner);
}

// name -> {format, values, shape, nbytes} for every linear layer as stored for compute, in GGUF
// names (what `sparq prune --include` matches).
nb::dict Layers(const Model& model) {
  nb::dict d;
  auto add = [&](const std::string& name, const LinearWeight& lw) {
    nb::dict e;
    e["format"] = lw.format();
    e["values"] = lw.values().Name();
    e["shape"] = nb::make_tuple(lw.rows(), lw.cols());
    e["nbytes"] = lw.weight_bytes();
    d[name.c_str()] = e;
  };
  const auto& blocks = model.m.weights().blocks;
  for (size_t l = 0; l < blocks.size(); ++l) {
    for (int s = 0; s < kNumSlots; ++s) {
      add("blk." + std::to_string(l) + "." + std::string(SlotName(static_cast<LinearSlot>(s))) +
              ".weight",
          blocks[l].linear[s]);
    }
  }
  add("output.weight", model.m.weights().output);
  return d;
}

// A linear layer of a model, shared with it (no copy): products run on the model's packed weight
// with its pool and lock. The binding keeps the Python model object alive while a Layer lives,
// and a Model never changes its weights after loading, so the pointers stay valid.
struct Layer {
  const Model* model = nullptr;
  const LinearWeight* w = nullptr;
  const std::vector<int32_t>* perm = nullptr;  // input-channel permutation; empty: identity
  std::string name;
  std::optional<double> density;  // computed on first use (a full densification)
};

Layer FindLayer(const Model& model, const std::string& name) {
  static const std::vector<int32_t> kNoPerm;
  const LlamaWeights& w = model.m.weights();
  if (name == "output.weight") return Layer{&model, &w.output, &kNoPerm, name, {}};
  for (size_t l = 0; l < w.blocks.size(); ++l) {
    for (int s = 0; s < kNumSlots; ++s) {
      if (name == "blk." + std::to_string(l) + "." +
                      std::string(SlotName(static_cast<LinearSlot>(s))) + ".weight") {
        return Layer{&model, &w.blocks[l].linear[s], &w.blocks[l].perm[s], name, {}};
      }
    }
  }
  Raise(InvalidInput("layer '" + name + "': no such linear layer (names as in Model.layers: "
                     "blk.0.attn_q.weight ... blk." + std::to_string(w.blocks.size() - 1) +
                     ".ffn_down.weight, output.weight)"));
}

// The weight [m, k] as the model multiplies with it: every product of a one-hot row of X picks
// one stored (dequantized) value times 1 and adds zeros, so for f32 / bf16 / f16 values each
// entry is exact. Columns come back in the model's input order (a permuted layer's W_p columns
// are scattered back through perm). Every call has kCols rows (the last chunk padded with zero
// rows): above every decode kernel's n, so X is never rounded to int8 here.
std::vector<float> LayerDense(const Layer& layer) {
  constexpr int64_t kCols = 64;  // > the int8-X rows' max n (16); Y chunk [kCols, m] stays small
  const int64_t m = layer.w->rows(), k = layer.w->cols();
  std::vector<float> out(static_cast<size_t>(m * k));
  const std::vector<int32_t>& perm = *layer.perm;
  Locked(*layer.model, [&]() -> Status {
    std::vector<float> x(static_cast<size_t>(kCols * k)), y(static_cast<size_t>(kCols * m));
    for (int64_t c0 = 0; c0 < k; c0 += kCols) {
      const int64_t n = std::min(kCols, k - c0);
      std::fill(x.begin(), x.end(), 0.0f);
      for (int64_t r = 0; r < n; ++r) x[static_cast<size_t>(r * k + c0 + r)] = 1.0f;
      layer.w->Forward(x.data(), kCols, y.data(), layer.model->pool.get());
      for (int64_t r = 0; r < n; ++r) {
        const int64_t col = perm.empty() ? c0 + r : perm[static_cast<size_t>(c0 + r)];
        for (int64_t i = 0; i < m; ++i) out[static_cast<size_t>(i * k + col)] = y[static_cast<size_t>(r * m + i)];
      }
    }
    return Status::Ok();
  });
  return out;
}

nb::ndarray<nb::numpy, float> LayerToDense(const Layer& layer) {
  auto* out = new std::vector<float>(LayerDense(layer));
  nb::capsule owner(out, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
  return nb::ndarray<nb::numpy, float>(
      out->data(), {static_cast<size_t>(layer.w->rows()), static_cast<size_t>(layer.w->cols())},
      owner);
}

double LayerDensity(Layer& layer) {
  if (!layer.density) {
    const std::vector<float> d = LayerDense(layer);
    const int64_t nnz = std::count_if(d.begin(), d.end(), [](float v) { return v != 0.0f; });
    layer.density = d.empty() ? 0.0 : static_cast<double>(nnz) / static_cast<double>(d.size());
  }
  return *layer.density;
}

// y [n, m] = x [n, k] W^T through the model's kernels (x C-contiguous; the Python side makes it
// so); a permuted layer gathers x's columns first, as the model's forward does.
nb::ndarray<nb::numpy, float> LayerForward(
    const Layer& layer, const nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu>& x) {
  const int64_t n = static_cast<int64_t>(x.shape(0)), k = static_cast<int64_t>(x.shape(1));
  const int64_t m = layer.w->rows();
  if (k != layer.w->cols()) {
    Raise(InvalidInput("x has " + std::to_string(k) + " columns (its last axis), layer " +
                       layer.name + " [" + std::to_string(m) + ", " +
                       std::to_string(layer.w->cols()) + "] needs " +
                       std::to_string(layer.w->cols())));
  }
  auto* out = new std::vector<float>(static_cast<size_t>(n * m));
  nb::capsule owner(out, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
  const float* xd = x.data();
  if (n > 0 && m > 0 && k > 0) {
    const std::vector<int32_t>& perm = *layer.perm;
    std::vector<float> gathered;
    if (!perm.empty()) {
      gathered.resize(static_cast<size_t>(n * k));
      for (int64_t r = 0; r < n; ++r) {
        for (int64_t j = 0; j < k; ++j) gathered[r * k + j] = xd[r * k + perm[static_cast<size_t>(j)]];
      }
      xd = gathered.data();
    }
    Locked(*layer.model, [&]() -> Status {
      layer.w->Forward(xd, n, out->data(), layer.model->pool.get());
      return Status::Ok();
    });
  }
  return nb::ndarray<nb::numpy, float>(out->data(), {static_cast<size_t>(n), static_cast<size_t>(m)},
                                       owner);
}

// The first word of the layer's storage ("nm 2:4 int4:g64" -> "nm"): SparseMatrix.format's names.
std::string LayerFormat(const Layer& layer) {
  const std::string& f = layer.w->format();
  return f.substr(0, f.find(' '));
}

nb::dict ConfigDict(const Model& model) {
  const LlamaConfig& c = model.m.config();
  nb::dict d;
  d["n_vocab"] = c.n_vocab;
  d["n_embd"] = c.n_embd;
  d["n_layer"] = c.n_layer;
  d["n_head"] = c.n_head;
  d["n_head_kv"] = c.n_head_kv;
  d["n_ff"] = c.n_ff;
  d["n_ctx_train"] = c.n_ctx_train;
  d["rope_dim"] = c.rope_dim;
  d["rope_theta"] = c.rope_theta;
  d["rms_eps"] = c.rms_eps;
  d["tied_output"] = c.tied_output;
  return d;
}

// A model loaded from a .sparq is saved as a copy of that file (written atomically: the
// checkpoint holds exactly what was loaded); one loaded from a GGUF or a Hugging Face folder by
// SaveLlamaCheckpoint (its layers as loaded: GGUF codes as stored, f32 weights as `values`).
void Save(const Model& model, const std::string& path, const std::optional<std::string>& values) {
  const std::string& src = model.m.source();
  const ModelFileKind kind = Take(DetectModelFile(src));
  if (kind != ModelFileKind::kSparq) {
    const std::string name = values.value_or("f32");
    const std::optional<DType> dt = ParseDType(name);  // SaveLlamaCheckpoint refuses non-floats
    if (!dt) Raise(InvalidInput("save: values must be 'f32', 'bf16' or 'f16', not '" + name + "'"));
    Status st;
    {
      nb::gil_scoped_release release;
      st = SaveLlamaCheckpoint(model.m, path, *dt);
    }
    Check(st);
    return;
  }
  if (values) {
    Raise(InvalidInput("save: " + src + " is a .sparq checkpoint, saved as loaded (a copy); "
                       "values applies to models loaded from GGUF files or Hugging Face folders"));
  }
  Status st;
  {
    nb::gil_scoped_release release;
    st = [&]() -> Status {
      std::ifstream in(src, std::ios::binary);
      if (!in) return IoError(src + ": cannot open");
      std::vector<char> buf(1 << 20);
      io::AtomicWriter wr;
      SPARQ_RETURN_IF_ERROR(wr.Open(path));
      while (in) {
        in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
        SPARQ_RETURN_IF_ERROR(wr.Write(buf.data(), static_cast<uint64_t>(in.gcount())));
      }
      if (in.bad()) return IoError(src + ": read failed");
      return wr.Commit();
    }();
  }
  Check(st);
}

// PruneLlama on the model at `path` with the command line's options; returns the report JSON
// (with timings, as `sparq prune --json`).
std::string PruneModel(const std::string& path, const std::string& calib_text,
                       const std::string& out, const std::string& pattern,
                       const std::string& method, const std::string& values,
                       const std::string& embedding_values, const std::string& quant_method,
                       int64_t calib_samples, int64_t calib_len, int64_t blocks, double damp,
                       uint64_t seed, const std::string& include, bool permute,
                       std::optional<bool> act_order,
                       int threads, int64_t embedding_int8_rows) {
  ModelPruneOptions opt;
  opt.method = Take(ParsePruneMethod(method));
  opt.pattern = Take(Pattern::Parse(pattern));
  opt.values = Take(ValueSpec::Parse(values));
  if (!embedding_values.empty()) opt.embedding_values = Take(ValueSpec::Parse(embedding_values));
  opt.embedding_int8_rows = embedding_int8_rows;
  if (quant_method == "rtn") {
    opt.quant_method = ModelPruneOptions::QuantMethod::kRtn;
  } else if (quant_method != "gptq") {
    Raise(InvalidInput("quant_method must be gptq or rtn, not '" + quant_method + "'"));
  }
  if (calib_samples < 1 || calib_samples > 4096) Raise(InvalidInput("calib_samples must be in [1, 4096]"));
  if (calib_len < 1 || calib_len > 8192) Raise(InvalidInput("calib_len must be in [1, 8192]"));
  opt.calib_samples = calib_samples;
  opt.calib_len = calib_len;
  opt.max_blocks = blocks;
  opt.damp = damp;
  opt.seed = seed;
  opt.permute = permute;
  if (!include.empty()) opt.include = include;
  // None: the command line's default (on wherever it applies); True insists, False turns it off.
  opt.act_order = act_order ? *act_order : ActOrderApplies(opt);
  opt.progress = false;  // no bar on the Python process's stderr
  const KernelConfig& cfg = Config("");
  Result<ModelPruneResult> r = Status();
  {
    nb::gil_scoped_release release;
    ThreadPool pool(threads);
    r = PruneLlama(path, calib_text, opt, out, cfg, &pool);
  }
  return Take(std::move(r)).ToJson(true);
}

}  // namespace

void BindModel(nb::module_& mod) {
  nb::class_<Model>(mod, "_Model")
      .def_static("load", &Load, nb::arg("path"), nb::arg("threads"), nb::arg("gguf_values"),
                  nb::arg("int8_activations"), nb::arg("kv_cache"))
      .def("eval", &Eval, nb::arg("text"), nb::arg("ctx"), nb::arg("max_tokens"), nb::arg("step"))
      .def("generate", &GenerateText, nb::arg("prompt"), nb::arg("max_new"),
           nb::arg("temperature"), nb::arg("top_k"), nb::arg("top_p"), nb::arg("seed"),
           nb::arg("raw"))
      .def("bench", &Bench, nb::arg("prompt"), nb::arg("decode"), nb::arg("repeats"))
      .def("logits", &Logits, nb::arg("tokens"))
      .def(
          "tokenize",
          [](const Model& m, const std::string& text) {
            Result<std::vector<int32_t>> ids = Status();
            {
              nb::gil_scoped_release release;  // the tokenizer is immutable: no lock needed
              ids = m.m.tokenizer().Encode(text);
            }
            return Take(std::move(ids));
          },
          nb::arg("text"))
      .def("save", &Save, nb::arg("path"), nb::arg("values").none() = nb::none())
      .def("layer", &FindLayer, nb::arg("name"), nb::keep_alive<0, 1>())
      .def_prop_ro("int8_activations", &Int8Activations)
      .def_prop_ro("decode_rounds_x", [](const Model& m) { return m.m.decode_rounds_x(); })
      .def_prop_ro("kv_cache", &KvCacheValues)
      .def_prop_ro("layers", &Layers)
      .def_prop_ro("config", &ConfigDict)
      .def_prop_ro("source", [](const Model& m) { return m.m.source(); })
      .def_prop_ro("threads", [](const Model& m) { return m.pool->num_threads(); })
      .def_prop_ro("isa", [](const Model& m) { return m.m.weights().output.config().target_name(); })
      .def_prop_ro("n_params", [](const Model& m) { return ParameterCount(m.m); })
      .def_prop_ro("weight_bytes", [](const Model& m) { return m.m.weight_bytes(); })
      .def_prop_ro("block_linear_bytes", [](const Model& m) { return m.m.block_linear_bytes(); })
      .def_prop_ro("weight_bytes_per_token",
                   [](const Model& m) { return m.m.weight_bytes_per_token(); })
      .def_prop_ro("values", [](const Model& m) { return m.m.block_linear_values(); });
  nb::class_<Layer>(mod, "_ModelLayer")
      .def("to_dense", &LayerToDense)
      .def("forward", &LayerForward, nb::arg("x"))
      .def(
          "kernel_name", [](const Layer& l, int64_t n) { return l.w->kernel_name(n); },
          nb::arg("n"))
      .def_prop_ro("rows", [](const Layer& l) { return l.w->rows(); })
      .def_prop_ro("cols", [](const Layer& l) { return l.w->cols(); })
      .def_prop_ro("nbytes", [](const Layer& l) { return l.w->weight_bytes(); })
      .def_prop_ro("format", &LayerFormat)
      .def_prop_ro("storage", [](const Layer& l) { return l.w->format(); })
      .def_prop_ro("values", [](const Layer& l) { return l.w->values().Name(); })
      .def_prop_ro("density", &LayerDensity)
      .def_prop_ro("name", [](const Layer& l) { return l.name; });
  mod.def("read_text_file", [](const std::string& path) {
    Result<std::string> r = ReadTextFile(path);
    const std::string s = Take(std::move(r));
    return nb::bytes(s.data(), s.size());
  });
  mod.def("prune_model", &PruneModel, nb::arg("path"), nb::arg("calib_text"), nb::arg("out"),
          nb::arg("pattern"), nb::arg("method"), nb::arg("values"), nb::arg("embedding_values"),
          nb::arg("quant_method"), nb::arg("calib_samples"), nb::arg("calib_len"),
          nb::arg("blocks"), nb::arg("damp"), nb::arg("seed"), nb::arg("include"),
          nb::arg("permute"), nb::arg("act_order").none(), nb::arg("threads"),
          nb::arg("embedding_int8_rows"));
}

}  // namespace sparq::python
