// LlamaModel::FromHfFolder (Hugging Face folders: config.json + tokenizer.json + *.safetensors).
//
// Tiny synthetic folders (always run): name mapping, the q/k RoPE row order, f16 and untied heads,
// shard discovery, and one error per kind of bad folder, each naming the file and the tensor.
// SmolLM2 (a failure without the GGUF): the test writes the GGUF's weights as an HF folder (f32 in
// one file; bf16 in two shards with an index) with q/k rows put back in HF order by the inverse
// of llama.cpp's converter permutation, written here as numpy-style axis swaps independent of the
// loader's index formula. The f32 folder must give the GGUF model bitwise; the independent check
// against transformers is tests/model/make_hf_folder.py (see docs/model.md).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>

#include "model/model_testutil.h"
#include "sparq/format.h"
#include "sparq/gguf.h"
#include "sparq/model.h"
#include "sparq/safetensors.h"

namespace sparq {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  ASSERT_TRUE(out.good()) << path;
}

// A fresh empty folder under the test temp dir, removed by the destructor.
struct TempFolder {
  explicit TempFolder(const std::string& name)
      : path(::testing::TempDir() + "/sparq_hf_" + name + "_" + std::to_string(::getpid())) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempFolder() { fs::remove_all(path); }
  std::string file(const std::string& name) const { return path + "/" + name; }
  std::string path;
};

// Inverse of convert_hf_to_gguf.py's LlamaModel.permute, which maps HF -> GGUF rows as
//   w.reshape(n_head, 2, hd/2, k).swapaxes(1, 2).reshape(m, k).
// Undoing it: view GGUF rows as [n_head, hd/2, 2, k] and swap the two middle axes back.
Tensor GgufToHfRows(const Tensor& gguf, int64_t n_head) {
  const int64_t m = gguf.dim(0), k = gguf.dim(1), half = m / n_head / 2;
  Tensor hf = Tensor::Alloc(DType::kF32, {m, k});
  const float* src = gguf.data_as<float>();  // [n_head][half][2][k]
  float* dst = hf.mutable_data_as<float>();  // [n_head][2][half][k]
  for (int64_t h = 0; h < n_head; ++h) {
    for (int64_t a = 0; a < half; ++a) {
      for (int64_t b = 0; b < 2; ++b) {
        const float* s = src + ((h * half + a) * 2 + b) * k;
        float* d = dst + ((h * 2 + b) * half + a) * k;
        std::memcpy(d, s, k * sizeof(float));
      }
    }
  }
  return hf;
}

json HfConfigJson(const LlamaConfig& c) {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"vocab_size", c.n_vocab},
          {"hidden_size", c.n_embd},
          {"num_hidden_layers", c.n_layer},
          {"num_attention_heads", c.n_head},
          {"num_key_value_heads", c.n_head_kv},
          {"intermediate_size", c.n_ff},
          {"max_position_embeddings", c.n_ctx_train},
          {"rope_theta", c.rope_theta},
          {"rms_norm_eps", c.rms_eps},  // nlohmann prints doubles round-trip exact
          {"tie_word_embeddings", c.tied_output},
          {"hidden_act", "silu"},
          {"attention_bias", false},
          {"mlp_bias", false},
          {"rope_scaling", nullptr},
          {"torch_dtype", "float32"}};
}

// tokenizer.json (HF `tokenizers` layout) from a tokenizer's data: normal tokens in model.vocab,
// control / user-defined ones also as added_tokens (special / not). `pair_merges` writes merges
// as ["left", "right"] (tokenizers >= 0.20) instead of "left right".
json HfTokenizerJson(const TokenizerData& d, bool pair_merges) {
  json vocab = json::object();
  json added = json::array();
  for (size_t i = 0; i < d.tokens.size(); ++i) {
    if (!vocab.contains(d.tokens[i])) vocab[d.tokens[i]] = i;
    const int32_t type = d.token_types.empty() ? 1 : d.token_types[i];
    if (type == static_cast<int32_t>(TokenType::kControl) ||
        type == static_cast<int32_t>(TokenType::kUserDefined)) {
      added.push_back({{"id", i},
                       {"content", d.tokens[i]},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", false},
                       {"special", type == static_cast<int32_t>(TokenType::kControl)}});
    }
  }
  json merges = json::array();
  for (const std::string& m : d.merges) {
    if (!pair_merges) {
      merges.push_back(m);
    } else {
      const size_t sp = m.find(' ', 1);
      merges.push_back({m.substr(0, sp), m.substr(sp + 1)});
    }
  }
  json byte_level = {{"type", "ByteLevel"},
                     {"add_prefix_space", false},
                     {"trim_offsets", true},
                     {"use_regex", true}};
  json pre = byte_level;
  if (d.pre == "smollm") {
    pre = {{"type", "Sequence"},
           {"pretokenizers", {{{"type", "Digits"}, {"individual_digits", true}}, byte_level}}};
  }
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", added},
          {"normalizer", nullptr},
          {"pre_tokenizer", pre},
          {"post_processor", byte_level},
          {"decoder", byte_level},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"vocab", vocab},
            {"merges", merges}}}};
}

std::string HfSlotName(int64_t layer, LinearSlot s) {
  static constexpr const char* kNames[kNumSlots] = {
      "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
      "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
  return "model.layers." + std::to_string(layer) + "." + kNames[static_cast<int>(s)] + ".weight";
}

Tensor Convert(const Tensor& f32, DType dtype) {
  auto t = FromF32(f32, dtype);
  EXPECT_TRUE(t.ok());
  return std::move(*t);
}

Status WriteIndex(const std::string& path, const std::vector<NamedTensor>& a,
                  const std::string& a_name, const std::vector<NamedTensor>& b,
                  const std::string& b_name) {
  json wm = json::object();
  for (const auto& t : a) wm[t.name] = a_name;
  for (const auto& t : b) wm[t.name] = b_name;
  std::ofstream out(path);
  out << json{{"metadata", {{"total_size", 0}}}, {"weight_map", wm}}.dump(1);
  return out.good() ? Status::Ok() : IoError(path);
}

// ---- tiny synthetic folders -------------------------------------------------------------------

LlamaConfig TinyConfig() {
  LlamaConfig c;
  c.n_vocab = 8, c.n_embd = 8, c.n_layer = 2, c.n_head = 2, c.n_head_kv = 1, c.n_ff = 12;
  c.n_ctx_train = 64, c.rope_dim = 4, c.rope_theta = 10000.0, c.rms_eps = 1e-5;
  c.tied_output = true;
  return c;
}

TokenizerData TinyTokenizer() {
  TokenizerData d;
  d.tokens = {"a", "b", "ab", "<|im_start|>"};
  d.token_types = {1, 1, 1, 3};
  d.merges = {"a b"};
  return d;
}

// HF tensors of a tiny model with seeded random values (f32, HF names and row order).
std::vector<NamedTensor> TinyTensors(const LlamaConfig& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<NamedTensor> out;
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    Tensor t = Tensor::Alloc(DType::kF32, std::move(shape));
    float* p = t.mutable_data_as<float>();
    for (uint64_t i = 0; i < t.numel(); ++i) p[i] = u(rng);
    out.push_back({name, std::move(t)});
  };
  add("model.embed_tokens.weight", {c.n_vocab, c.n_embd});
  add("model.norm.weight", {c.n_embd});
  if (!c.tied_output) add("lm_head.weight", {c.n_vocab, c.n_embd});
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {c.n_embd});
    add(p + "post_attention_layernorm.weight", {c.n_embd});
    for (int s = 0; s < kNumSlots; ++s) {
      const auto [m, k] = SlotShape(c, static_cast<LinearSlot>(s));
      add(HfSlotName(l, static_cast<LinearSlot>(s)), {m, k});
    }
  }
  return out;
}

NamedTensor* FindNamed(std::vector<NamedTensor>& v, const std::string& name) {
  for (auto& t : v) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

void WriteTinyFolder(const TempFolder& f, const LlamaConfig& c,
                     const std::vector<NamedTensor>& tensors) {
  WriteText(f.file("config.json"), HfConfigJson(c).dump(1));
  WriteText(f.file("tokenizer.json"), HfTokenizerJson(TinyTokenizer(), false).dump());
  ASSERT_TRUE(WriteSafetensors(f.file("model.safetensors"), tensors).ok());
}

// The load fails and the message contains every one of `parts`.
void ExpectError(const std::string& dir, std::initializer_list<std::string> parts) {
  auto m = LlamaModel::Load(dir, testing::MachineConfig());
  ASSERT_FALSE(m.ok()) << "loaded " << dir;
  for (const std::string& p : parts) {
    EXPECT_NE(m.status().message().find(p), std::string::npos)
        << "'" << p << "' not in: " << m.status().message();
  }
}

TEST(HfFolderTest, TinyFolderMapsNamesAndRopeRows) {
  const LlamaConfig c = TinyConfig();
  TempFolder f("tiny");
  std::vector<NamedTensor> t = TinyTensors(c, 1);
  WriteTinyFolder(f, c, t);
  auto m = LlamaModel::Load(f.path + "/", testing::MachineConfig());  // a trailing slash is fine
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->config().ToJson(), c.ToJson());
  EXPECT_EQ(m->tokenizer().vocab_size(), 4);
  EXPECT_EQ(m->tokenizer().bos_id(), 3);
  const LlamaWeights& w = m->weights();
  auto same = [](const float* a, const Tensor& b) {
    return std::memcmp(a, b.data(), b.nbytes()) == 0;
  };
  EXPECT_TRUE(
      same(w.token_embd.data_as<float>(), FindNamed(t, "model.embed_tokens.weight")->tensor));
  EXPECT_TRUE(same(w.output.dense_f32(), FindNamed(t, "model.embed_tokens.weight")->tensor));
  EXPECT_TRUE(same(w.output_norm.data(), FindNamed(t, "model.norm.weight")->tensor));
  EXPECT_TRUE(same(w.blocks[1].ffn_norm.data(),
                   FindNamed(t, "model.layers.1.post_attention_layernorm.weight")->tensor));
  for (int64_t l = 0; l < c.n_layer; ++l) {
    for (int s = 0; s < kNumSlots; ++s) {
      const auto slot = static_cast<LinearSlot>(s);
      const Tensor& hf = FindNamed(t, HfSlotName(l, slot))->tensor;
      const float* got = w.blocks[l].at(slot).dense_f32();
      ASSERT_NE(got, nullptr);
      if (slot == LinearSlot::kQ || slot == LinearSlot::kK) {
        // The loader's rows, put back in HF order, are the file's rows.
        const int64_t heads = slot == LinearSlot::kQ ? c.n_head : c.n_head_kv;
        Tensor loaded = Tensor::View(DType::kF32, hf.shape(), got);
        EXPECT_TRUE(same(GgufToHfRows(loaded, heads).data_as<float>(), hf)) << HfSlotName(l, slot);
        EXPECT_FALSE(same(got, hf)) << "q/k rows were not reordered";
      } else {
        EXPECT_TRUE(same(got, hf)) << HfSlotName(l, slot);
      }
    }
  }
}

// The config is passed, never global: one folder loaded twice in one process, on this machine's
// best target and on its last (the portable fallback), packs and runs every layer on its own
// load's target, and both give the same model up to float reassociation.
TEST(HfFolderTest, TwoLoadsWithTwoConfigsRunTheirOwnTargets) {
  const std::vector<int64_t> targets = KernelConfig::SupportedTargets();
  ASSERT_GE(targets.size(), 2u);
  const KernelConfig best = testing::MachineConfig();
  const KernelConfig last = best.WithTarget(targets.back());
  ASSERT_NE(best.target, last.target);
  const LlamaConfig c = TinyConfig();
  TempFolder f("two_cfgs");
  WriteTinyFolder(f, c, TinyTensors(c, 3));
  auto a = LlamaModel::Load(f.path, best);
  auto b = LlamaModel::Load(f.path, last);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  for (const auto& [m, cfg] : {std::pair{&*a, &best}, std::pair{&*b, &last}}) {
    EXPECT_EQ(m->weights().output.config().target, cfg->target);
    for (const LlamaBlock& blk : m->weights().blocks) {
      for (int s = 0; s < kNumSlots; ++s) {
        EXPECT_EQ(blk.at(static_cast<LinearSlot>(s)).config().target_name(), cfg->target_name());
      }
    }
  }
  const std::vector<int32_t> tokens = {3, 0, 1, 2, 2, 1};
  std::vector<float> la(tokens.size() * c.n_vocab), lb(la.size());
  auto ca = KvCache::Create(c, 16), cb = KvCache::Create(c, 16);
  ASSERT_TRUE(ca.ok() && cb.ok());
  ASSERT_TRUE(a->Forward(tokens, &*ca, la.data(), true, nullptr).ok());
  ASSERT_TRUE(b->Forward(tokens, &*cb, lb.data(), true, nullptr).ok());
  for (size_t i = 0; i < la.size(); ++i) EXPECT_NEAR(la[i], lb[i], 1e-3 * (1 + std::fabs(la[i])));
}

TEST(HfFolderTest, F16UntiedHeadAndShardsWithoutIndex) {
  LlamaConfig c = TinyConfig();
  c.tied_output = false;
  TempFolder f("untied");
  std::vector<NamedTensor> t = TinyTensors(c, 2);
  // Two files, no index, no model.safetensors: every *.safetensors is read. f16 values.
  std::vector<NamedTensor> a, b;
  for (size_t i = 0; i < t.size(); ++i) {
    (i % 2 ? a : b).push_back({t[i].name, Convert(t[i].tensor, DType::kF16)});
  }
  WriteText(f.file("config.json"), HfConfigJson(c).dump());
  WriteText(f.file("tokenizer.json"), HfTokenizerJson(TinyTokenizer(), true).dump());
  ASSERT_TRUE(WriteSafetensors(f.file("part-a.safetensors"), a).ok());
  ASSERT_TRUE(WriteSafetensors(f.file("part-b.safetensors"), b).ok());
  auto m = LlamaModel::Load(f.path, testing::MachineConfig());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_FALSE(m->config().tied_output);
  const Tensor head = Convert(FindNamed(t, "lm_head.weight")->tensor, DType::kF16);
  const float* got = m->weights().output.dense_f32();
  for (uint64_t i = 0; i < head.numel(); ++i) {
    ASSERT_EQ(got[i], F16ToF32(head.data_as<uint16_t>()[i])) << i;
  }
  // And it runs.
  auto cache = KvCache::Create(m->config(), 4);
  ASSERT_TRUE(cache.ok());
  std::vector<float> logits(c.n_vocab);
  ASSERT_TRUE(
      m->Forward(std::vector<int32_t>{0, 2, 1}, &*cache, logits.data(), false, nullptr).ok());
  for (float x : logits) EXPECT_TRUE(std::isfinite(x));
}

TEST(HfFolderTest, ErrorsNameTheFileAndTensor) {
  const LlamaConfig c = TinyConfig();
  const std::vector<NamedTensor> good = TinyTensors(c, 3);
  auto variant = [&](const std::string& name,
                     const std::function<void(std::vector<NamedTensor>&)>& edit) {
    auto f = std::make_unique<TempFolder>(name);
    std::vector<NamedTensor> t;
    for (const auto& x : good) t.push_back({x.name, x.tensor.Clone()});
    edit(t);
    WriteTinyFolder(*f, c, t);
    return f;
  };
  const std::string q0 = "model.layers.0.self_attn.q_proj.weight";
  const std::string up1 = "model.layers.1.mlp.up_proj.weight";
  {
    auto f = variant("missing", [&](std::vector<NamedTensor>& t) {
      t.erase(std::find_if(t.begin(), t.end(), [&](auto& x) { return x.name == up1; }));
    });
    ExpectError(f->path, {f->path, "missing tensor '" + up1 + "'", "model.safetensors"});
  }
  {
    auto f = variant("shape", [&](std::vector<NamedTensor>& t) {
      FindNamed(t, "model.layers.1.self_attn.k_proj.weight")->tensor =
          Tensor::Alloc(DType::kF32, {8, 8});
    });
    ExpectError(f->path, {f->file("model.safetensors"), "model.layers.1.self_attn.k_proj.weight",
                          "[8, 8]", "needs [4, 8]"});
  }
  {
    auto f = variant("dtype", [&](std::vector<NamedTensor>& t) {
      FindNamed(t, q0)->tensor = Tensor::Alloc(DType::kI8, {8, 8});
    });
    ExpectError(f->path, {f->file("model.safetensors"), q0, "dtype i8"});
  }
  {
    auto f = variant("f64", [&](std::vector<NamedTensor>& t) {
      FindNamed(t, "model.norm.weight")->tensor = Tensor::Alloc(DType::kF64, {8});
    });
    ExpectError(f->path, {f->file("model.safetensors"), "model.norm.weight", "dtype f64"});
  }
  for (float bad : {std::nanf(""), INFINITY}) {
    auto f = variant("nonfinite", [&](std::vector<NamedTensor>& t) {
      FindNamed(t, up1)->tensor.mutable_data_as<float>()[5] = bad;
    });
    ExpectError(f->path, {f->file("model.safetensors"), up1, "non-finite value at element 5"});
  }
  {
    auto f = variant("bias", [&](std::vector<NamedTensor>& t) {
      t.push_back({"model.layers.0.self_attn.q_proj.bias", Tensor::Alloc(DType::kF32, {8})});
    });
    ExpectError(f->path, {f->file("model.safetensors"), "model.layers.0.self_attn.q_proj.bias"});
  }
  {  // rotary caches of old checkpoints and a tied head's copy are ignored
    auto f = variant("ignored", [&](std::vector<NamedTensor>& t) {
      t.push_back(
          {"model.layers.0.self_attn.rotary_emb.inv_freq", Tensor::Alloc(DType::kF32, {2})});
      t.push_back({"lm_head.weight", Tensor::Alloc(DType::kF32, {8, 8})});
    });
    auto m = LlamaModel::Load(f->path, testing::MachineConfig());
    EXPECT_TRUE(m.ok()) << m.status().ToString();
  }
  {
    TempFolder f("noconfig");
    ExpectError(f.path, {f.path, "missing config.json"});
    WriteText(f.file("config.json"), HfConfigJson(c).dump());
    ExpectError(f.path, {f.path, "missing tokenizer.json"});
    WriteText(f.file("tokenizer.json"), HfTokenizerJson(TinyTokenizer(), false).dump());
    ExpectError(f.path, {f.path, "no model.safetensors"});
    json cfg = HfConfigJson(c);
    cfg["model_type"] = "mistral";
    WriteText(f.file("config.json"), cfg.dump());
    ExpectError(f.path, {f.file("config.json"), "model_type 'mistral'"});
    cfg = HfConfigJson(c);
    cfg["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
    WriteText(f.file("config.json"), cfg.dump());
    ExpectError(f.path, {f.file("config.json"), "rope_scaling"});
    cfg = HfConfigJson(c);
    cfg.erase("hidden_size");
    WriteText(f.file("config.json"), cfg.dump());
    ExpectError(f.path, {f.file("config.json"), "hidden_size"});
  }
  {  // index: a listed shard that is absent; a tensor its shard does not hold; duplicates
    TempFolder f("index");
    WriteText(f.file("config.json"), HfConfigJson(c).dump());
    WriteText(f.file("tokenizer.json"), HfTokenizerJson(TinyTokenizer(), false).dump());
    std::vector<NamedTensor> a, b;
    for (size_t i = 0; i < good.size(); ++i) {
      (i < 5 ? a : b).push_back({good[i].name, good[i].tensor.Clone()});
    }
    ASSERT_TRUE(WriteSafetensors(f.file("model-00001-of-00002.safetensors"), a).ok());
    ASSERT_TRUE(WriteIndex(f.file("model.safetensors.index.json"), a,
                           "model-00001-of-00002.safetensors", b,
                           "model-00002-of-00002.safetensors")
                    .ok());
    ExpectError(f.path, {f.file("model.safetensors.index.json"), "model-00002-of-00002.safetensors",
                         "is missing"});
    ASSERT_TRUE(WriteSafetensors(f.file("model-00002-of-00002.safetensors"), b).ok());
    EXPECT_TRUE(LlamaModel::Load(f.path, testing::MachineConfig()).ok());
    ASSERT_TRUE(WriteIndex(f.file("model.safetensors.index.json"), b,
                           "model-00001-of-00002.safetensors", a,
                           "model-00002-of-00002.safetensors")
                    .ok());
    ExpectError(f.path, {f.file("model.safetensors.index.json"), "model.embed_tokens.weight",
                         "does not contain it"});
    ASSERT_TRUE(WriteIndex(f.file("model.safetensors.index.json"), a,
                           "../model-00001-of-00002.safetensors", b,
                           "model-00002-of-00002.safetensors")
                    .ok());
    ExpectError(f.path, {f.file("model.safetensors.index.json"), "not a file name in the folder"});
    // Without the index every *.safetensors is read; a tensor in two of them is an error.
    fs::remove(f.file("model.safetensors.index.json"));
    EXPECT_TRUE(LlamaModel::Load(f.path, testing::MachineConfig()).ok());
    ASSERT_TRUE(
        WriteSafetensors(f.file("model-extra.safetensors"), std::span<const NamedTensor>(&a[0], 1))
            .ok());
    ExpectError(f.path, {"model-extra.safetensors", a[0].name, "also in"});
    // A truncated shard: the safetensors reader's message names it.
    fs::resize_file(f.file("model-extra.safetensors"), 20);
    ExpectError(f.path, {f.file("model-extra.safetensors")});
  }
}

// ---- SmolLM2: the GGUF written as HF folders ---------------------------------------------------

class SmolLmHfFolderTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    gguf_model_ = testing::NewSmolLm();
    if (gguf_model_ == nullptr) return;
    f32_ = new TempFolder("smollm_f32");
    bf16_ = new TempFolder("smollm_bf16");
    WriteFolders(testing::SmolLmPath());
  }
  static void TearDownTestSuite() {
    delete gguf_model_;
    delete f32_;
    delete bf16_;
    gguf_model_ = nullptr;
  }
  void SetUp() override {
    SPARQ_REQUIRE_MODEL();
    ASSERT_NE(gguf_model_, nullptr) << testing::SmolLmPath() << " did not load (see above)";
    // Every test reads WikiText ids or the calibration text.
    SPARQ_REQUIRE_TEXT("wikitext-2-raw-test.txt");
    SPARQ_REQUIRE_TEXT("sherlock-holmes-pg1661.txt");
  }

  // The GGUF's tensors (dequantized to f32, as FromGguf does) under HF names with HF q/k row
  // order; written as one f32 model.safetensors and as bf16 in two shards with an index.
  static void WriteFolders(const std::string& gguf_path) {
    auto g = GgufFile::Open(gguf_path);
    ASSERT_TRUE(g.ok());
    const LlamaConfig& c = gguf_model_->config();
    std::vector<NamedTensor> t;
    auto add = [&](const std::string& hf, const std::string& gg, int64_t heads = 0) {
      const GgufTensorInfo* info = g->FindTensor(gg);
      ASSERT_NE(info, nullptr) << gg;
      auto x = g->ReadF32(*info);
      ASSERT_TRUE(x.ok()) << gg;
      t.push_back({hf, heads ? GgufToHfRows(*x, heads) : std::move(*x)});
    };
    add("model.embed_tokens.weight", "token_embd.weight");
    add("model.norm.weight", "output_norm.weight");
    for (int64_t l = 0; l < c.n_layer; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      const std::string b = "blk." + std::to_string(l) + ".";
      add(p + "input_layernorm.weight", b + "attn_norm.weight");
      add(p + "post_attention_layernorm.weight", b + "ffn_norm.weight");
      for (int s = 0; s < kNumSlots; ++s) {
        const auto slot = static_cast<LinearSlot>(s);
        const int64_t heads = slot == LinearSlot::kQ   ? c.n_head
                              : slot == LinearSlot::kK ? c.n_head_kv
                                                       : 0;
        add(HfSlotName(l, slot), b + std::string(SlotName(slot)) + ".weight", heads);
      }
    }
    const std::string config = HfConfigJson(c).dump(1);
    const TokenizerData& tok = gguf_model_->tokenizer().data();
    WriteText(f32_->file("config.json"), config);
    WriteText(f32_->file("tokenizer.json"), HfTokenizerJson(tok, false).dump());
    ASSERT_TRUE(WriteSafetensors(f32_->file("model.safetensors"), t).ok());

    std::vector<NamedTensor> a, b;
    for (size_t i = 0; i < t.size(); ++i) {
      (i < t.size() / 2 ? a : b).push_back({t[i].name, Convert(t[i].tensor, DType::kBF16)});
    }
    t.clear();
    WriteText(bf16_->file("config.json"), config);
    WriteText(bf16_->file("tokenizer.json"), HfTokenizerJson(tok, true).dump());
    ASSERT_TRUE(WriteSafetensors(bf16_->file("model-00001-of-00002.safetensors"), a).ok());
    ASSERT_TRUE(WriteSafetensors(bf16_->file("model-00002-of-00002.safetensors"), b).ok());
    ASSERT_TRUE(WriteIndex(bf16_->file("model.safetensors.index.json"), a,
                           "model-00001-of-00002.safetensors", b,
                           "model-00002-of-00002.safetensors")
                    .ok());
  }

  static std::vector<float> AllLogits(const LlamaModel& m, std::span<const int32_t> ids,
                                      ThreadPool* pool) {
    auto cache = KvCache::Create(m.config(), static_cast<int64_t>(ids.size()));
    EXPECT_TRUE(cache.ok());
    std::vector<float> logits(ids.size() * m.config().n_vocab);
    Status st = m.Forward(ids, &*cache, logits.data(), true, pool);
    EXPECT_TRUE(st.ok()) << st.ToString();
    return logits;
  }

  static std::vector<int32_t> WikiIds(const LlamaModel& m, size_t chars) {
    const std::string wiki =
        testing::ReadFileOrEmpty(testing::DataText("wikitext-2-raw-test.txt")).substr(0, chars);
    auto ids = m.tokenizer().Encode(wiki);
    EXPECT_TRUE(ids.ok());
    return ids.ok() ? *ids : std::vector<int32_t>{};
  }

  static constexpr int64_t kTokens = 256;
  static LlamaModel* gguf_model_;
  static TempFolder* f32_;
  static TempFolder* bf16_;
};
LlamaModel* SmolLmHfFolderTest::gguf_model_ = nullptr;
TempFolder* SmolLmHfFolderTest::f32_ = nullptr;
TempFolder* SmolLmHfFolderTest::bf16_ = nullptr;

TEST_F(SmolLmHfFolderTest, F32FolderIsTheGgufModelBitwise) {
  auto m = LlamaModel::Load(f32_->path, testing::MachineConfig());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->config().ToJson(), gguf_model_->config().ToJson());
  // Tokenizer from tokenizer.json: the same ids as the GGUF's on a WikiText slice.
  const std::vector<int32_t> ids = WikiIds(*gguf_model_, 30000);
  ASSERT_GT(ids.size(), 5000u);
  EXPECT_EQ(WikiIds(*m, 30000), ids);
  EXPECT_EQ(m->tokenizer().bos_id(), gguf_model_->tokenizer().bos_id());
  EXPECT_EQ(m->tokenizer().eos_id(), gguf_model_->tokenizer().eos_id());
  // Same weights in the same slots (q/k rows included) ...
  const LlamaConfig& c = m->config();
  for (int64_t l = 0; l < c.n_layer; ++l) {
    for (int s = 0; s < kNumSlots; ++s) {
      const LinearWeight& a = m->weights().blocks[l].linear[s];
      const LinearWeight& b = gguf_model_->weights().blocks[l].linear[s];
      ASSERT_EQ(std::memcmp(a.dense_f32(), b.dense_f32(), a.rows() * a.cols() * sizeof(float)), 0)
          << "blk." << l << "." << SlotName(static_cast<LinearSlot>(s));
    }
  }
  // ... hence the same logits, bitwise (same kernels, same order).
  ThreadPool pool(2);
  const std::span<const int32_t> first(ids.data(), kTokens);
  const std::vector<float> want = AllLogits(*gguf_model_, first, &pool);
  const std::vector<float> got = AllLogits(*m, first, &pool);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
}

TEST_F(SmolLmHfFolderTest, PruningTheFolderGivesTheGgufsPrunedMatrices) {
  // `sparq prune` starts from LlamaModel::Load, so a folder prunes exactly like its GGUF.
  const std::string calib =
      testing::ReadFileOrEmpty(testing::DataText("sherlock-holmes-pg1661.txt"));
  ModelPruneOptions o;
  o.method = PruneMethod::kWanda;
  o.pattern = Pattern::NM(2, 4);
  o.calib_samples = 2;
  o.calib_len = 64;
  o.max_blocks = 1;
  o.progress = false;
  ThreadPool pool(2);
  const std::string a = f32_->path + "_pruned_gguf.sparq", b = f32_->path + "_pruned_hf.sparq";
  ASSERT_TRUE(PruneLlama(testing::SmolLmPath(), calib, o, a, testing::MachineConfig(), &pool).ok());
  auto r = PruneLlama(f32_->path, calib, o, b, testing::MachineConfig(), &pool);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->layers.size(), 7u);
  auto ca = ReadCheckpoint(a), cb = ReadCheckpoint(b);
  ASSERT_TRUE(ca.ok() && cb.ok());
  ASSERT_EQ(ca->matrices.size(), cb->matrices.size());
  for (size_t i = 0; i < ca->matrices.size(); ++i) {
    const Tensor da = ToDense(ca->matrices[i].matrix), db = ToDense(cb->matrices[i].matrix);
    EXPECT_EQ(ca->matrices[i].name, cb->matrices[i].name);
    ASSERT_EQ(da.nbytes(), db.nbytes());
    EXPECT_EQ(std::memcmp(da.data(), db.data(), da.nbytes()), 0) << ca->matrices[i].name;
  }
  std::remove(a.c_str());
  std::remove(b.c_str());
}

// bf16 keeps 8 significant bits: each weight moves by a relative error of at most 2^-9 (0.2%),
// with a sign that varies from weight to weight, so a dot product moves by about
// 2^-9 / sqrt(3) * sqrt(sum_i (w_i x_i)^2) (random-walk sum), and 30 blocks compound that; this
// is an estimate, not a bound, so the limits are docs/model.md's measured claim. Logits are
// O(10-30). Measured (256 WikiText tokens x 49152 logits): max |d logit| 0.3258, mean 0.02168,
// mean next-token NLL 3.47930 vs 3.47835 nats, greedy choice 256/256, the same to 1e-4 with the
// OpenBLAS Haswell and SkylakeX kernels: the bf16 rounding is the same on every machine and f32
// summation order adds ~1e-4. So the bounds are the claim (0.33, 0.022, 0.001 nats), and one
// greedy flip is allowed for a top-2 gap inside that order noise. A wrong q/k row order or a
// mis-mapped tensor moves logits by whole units and the greedy agreement to near 0.
TEST_F(SmolLmHfFolderTest, Bf16ShardsAreClose) {
  auto m = LlamaModel::Load(bf16_->path, testing::MachineConfig());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const std::vector<int32_t> ids = WikiIds(*gguf_model_, 4000);
  ASSERT_GT(ids.size(), static_cast<size_t>(kTokens));
  EXPECT_EQ(WikiIds(*m, 4000), ids);
  ThreadPool pool(2);
  const std::span<const int32_t> first(ids.data(), kTokens);
  const std::vector<float> want = AllLogits(*gguf_model_, first, &pool);
  const std::vector<float> got = AllLogits(*m, first, &pool);
  const int64_t vocab = m->config().n_vocab;
  double max_err = 0.0, sum_err = 0.0, nll_a = 0.0, nll_b = 0.0;
  int agree = 0;
  auto nll = [&](const float* row, int32_t next) {
    double mx = row[0], s = 0.0;
    for (int64_t j = 0; j < vocab; ++j) mx = std::max(mx, static_cast<double>(row[j]));
    for (int64_t j = 0; j < vocab; ++j) s += std::exp(row[j] - mx);
    return std::log(s) + mx - row[next];
  };
  for (int64_t i = 0; i < kTokens; ++i) {
    const float* a = want.data() + i * vocab;
    const float* b = got.data() + i * vocab;
    for (int64_t j = 0; j < vocab; ++j) {
      const double e = std::abs(static_cast<double>(a[j]) - b[j]);
      max_err = std::max(max_err, e);
      sum_err += e;
    }
    agree += Argmax({a, static_cast<size_t>(vocab)}) == Argmax({b, static_cast<size_t>(vocab)});
    if (i + 1 < kTokens) {
      nll_a += nll(a, ids[i + 1]);
      nll_b += nll(b, ids[i + 1]);
    }
  }
  const double mean_err = sum_err / (kTokens * vocab);
  const double dnll = std::abs(nll_a - nll_b) / (kTokens - 1);
  std::printf(
      "bf16 folder vs GGUF: max |d logit| %.4f, mean %.5f, mean NLL %.5f vs %.5f, "
      "greedy agreement %d/%lld\n",
      max_err, mean_err, nll_b / (kTokens - 1), nll_a / (kTokens - 1), agree,
      static_cast<long long>(kTokens));
  EXPECT_LE(max_err, 0.33);
  EXPECT_LE(mean_err, 0.022);
  EXPECT_LE(dnll, 0.001);
  EXPECT_GE(agree, kTokens - 1);
}

}  // namespace
}  // namespace sparq
