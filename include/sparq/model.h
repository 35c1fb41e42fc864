// Llama-architecture language model: configuration, weights, KV cache, forward pass, perplexity
// and generation.
//
// Layout: hidden states are row-major [n tokens, n_embd] f32. Each transformer block is
//   h = x + Wo * Attn(RoPE(Wq * RMSNorm(x)), RoPE(Wk * RMSNorm(x)), Wv * RMSNorm(x))
//   y = h + Wdown * (SiLU(Wgate * RMSNorm(h)) * (Wup * RMSNorm(h)))
// with grouped-query attention (query head i reads KV head i / (n_head / n_head_kv)) and RoPE as
// llama.cpp applies it to LLM_ARCH_LLAMA (rope type NORM: adjacent pairs (2i, 2i+1) rotate by
// pos * theta^(-2i / rope_dim); GGUF q/k weights are already permuted for it by the converter).
// Every linear layer (the seven per block and the output head) is a sparq::LinearWeight, so dense
// f32, bf16 and every sparse format run through the same code.
//
// Thread-safety: a loaded LlamaModel is immutable; Forward may run concurrently on distinct
// KvCaches. Results do not depend on the thread count.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sparq/checkpoint.h"
#include "sparq/linear.h"
#include "sparq/prune.h"
#include "sparq/quant.h"
#include "sparq/status.h"
#include "sparq/tensor.h"
#include "sparq/thread_pool.h"
#include "sparq/tokenizer.h"

namespace sparq {

class GgufFile;

struct LlamaConfig {
  int64_t n_vocab = 0;
  int64_t n_embd = 0;
  int64_t n_layer = 0;
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t n_ff = 0;
  int64_t n_ctx_train = 0;
  int64_t rope_dim = 0;        // rotated dimensions per head (<= head_dim, even)
  double rope_theta = 10000.0;
  double rms_eps = 1e-5;
  bool tied_output = true;     // output head = token embedding

  int64_t head_dim() const { return n_head > 0 ? n_embd / n_head : 0; }
  int64_t kv_dim() const { return head_dim() * n_head_kv; }
  // Ranges and divisibility (n_embd % n_head, n_head % n_head_kv, even rope_dim <= head_dim);
  // errors are prefixed by `what`.
  Status Validate(const std::string& what) const;

  // From `general.architecture` = "llama" and the `llama.*` keys.
  static Result<LlamaConfig> FromGguf(const GgufFile& file);
  // From a Hugging Face config.json (model_type "llama").
  static Result<LlamaConfig> FromHfConfig(const std::string& path);
  std::string ToJson() const;
  static Result<LlamaConfig> FromJson(std::string_view json, const std::string& what);
};

// The seven linear layers of a block, in GGUF naming order.
enum class LinearSlot : int { kQ, kK, kV, kO, kGate, kUp, kDown };
inline constexpr int kNumSlots = 7;
// "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down".
std::string_view SlotName(LinearSlot s);
// Rows and cols of the slot's weight [m, k] under `c`.
std::array<int64_t, 2> SlotShape(const LlamaConfig& c, LinearSlot s);

struct LlamaBlock {
  std::vector<float> attn_norm;  // [n_embd]
  std::vector<float> ffn_norm;   // [n_embd]
  std::array<LinearWeight, kNumSlots> linear;
  // Input-channel permutation of each linear layer (empty: identity). A layer stored with
  // permutation p computes Y = W_p * X[:, p] (X's columns gathered before the product), where W_p
  // is the weight with its columns permuted so that N:M groups are contiguous.
  std::array<std::vector<int32_t>, kNumSlots> perm;
  LinearWeight& at(LinearSlot s) { return linear[static_cast<int>(s)]; }
  const LinearWeight& at(LinearSlot s) const { return linear[static_cast<int>(s)]; }
};

struct LlamaWeights {
  // f32 [n_vocab, n_embd]; empty when the tied head, stored quantized, serves the lookup (its
  // rows dequantized per token, output_rows' for output_row_ids: LoadOptions::embedding_table).
  Tensor token_embd;
  std::vector<float> output_norm; // [n_embd]
  LinearWeight output;            // [n_vocab, n_embd] (a copy of token_embd when tied)
  // Rows of a tied quantized head stored apart at more bits (`--embedding-int8-rows`): the
  // logits of these token ids come from output_rows ([ids, n_embd]), not from output's rows;
  // token_embd, when kept, already holds their values. Empty: none.
  std::vector<int32_t> output_row_ids;
  LinearWeight output_rows;
  std::vector<LlamaBlock> blocks;
};

// Keys and values of every layer for up to `capacity` positions, in f32 or f16 (f16: each value
// rounded to nearest even, saturated at +-65504, NaN kept; attention reads them back exactly).
// An f16 cache holds its keys in tiles of 16 positions ([head_dim][16] each, for decode
// attention), the rows of a KV head rounded up to whole tiles.
class KvCache {
 public:
  KvCache() = default;
  // dtype f32 or f16. Error if the sizes overflow or exceed a sane bound, or for another dtype.
  static Result<KvCache> Create(const LlamaConfig& c, int64_t capacity, DType dtype = DType::kF32);
  int64_t capacity() const { return capacity_; }
  // Rows allocated per KV head: capacity, rounded up to whole tiles for f16.
  int64_t rows() const { return rows_; }
  int64_t length() const { return length_; }
  DType dtype() const { return dtype_; }
  void Clear() { length_ = 0; }
  void set_length(int64_t n) { length_ = n; }
  // Layer l's keys / values: [n_head_kv][rows][head_dim], each KV head's rows contiguous (an
  // f16 cache's keys: [n_head_kv][rows / 16][head_dim][16]); k / v for an f32 cache, k16 / v16
  // (f16 bits) for an f16 one, null otherwise.
  float* k(int64_t layer) { return k_.empty() ? nullptr : k_.data() + layer * layer_stride_; }
  float* v(int64_t layer) { return v_.empty() ? nullptr : v_.data() + layer * layer_stride_; }
  uint16_t* k16(int64_t layer) { return k16_.empty() ? nullptr : k16_.data() + layer * layer_stride_; }
  uint16_t* v16(int64_t layer) { return v16_.empty() ? nullptr : v16_.data() + layer * layer_stride_; }

 private:
  int64_t capacity_ = 0, rows_ = 0, length_ = 0, layer_stride_ = 0;
  DType dtype_ = DType::kF32;
  std::vector<float> k_, v_;
  std::vector<uint16_t> k16_, v16_;
};

// What LlamaModel::Load does with a GGUF's quantized weights.
enum class GgufValues {
  // Every tensor dequantized to f32: the dense model (today's default).
  kF32,
  // Q4_0 / Q4_1 / Q8_0 linear layers (the blocks', and the head's, tied or not) kept as stored
  // (GgufFile::ReadQuantized: int4:g32:sym / int4:g32 / int8:g32) and run on the dense quantized
  // kernels; the same values as kF32 bit for bit, so only the kernels' summation order differs.
  // Other types (F32, F16, BF16, K-quants) are dequantized to f32 as with kF32. The embedding
  // lookup reads an f32 copy of token_embd unless LoadOptions::embedding_table is false.
  kAsStored,
};

struct LoadOptions {
  GgufValues gguf_values = GgufValues::kF32;  // GGUF files only; ignored for other formats
  // false: where the head is tied and stored quantized (a GGUF's Q8_0 / Q4_x head run as stored,
  // a .sparq's int8 / int4 embedding), the embedding lookup dequantizes the head's row of each
  // token and no f32 table is kept (SmolLM2: 113 MB less; weights().token_embd is then empty).
  // What inference wants; pruning, training and conversion read the f32 table, so it is kept by
  // default. Either way the lookup gives the same bits.
  bool embedding_table = true;
};

class LlamaModel {
 public:
  LlamaModel();
  ~LlamaModel();
  LlamaModel(LlamaModel&&) noexcept;
  LlamaModel& operator=(LlamaModel&&) noexcept;

  // A .gguf file, a .sparq checkpoint, or a Hugging Face folder (config.json, *.safetensors,
  // tokenizer.json). Quantized GGUF weights are dequantized to f32 (the dense model), or with
  // opt.gguf_values = kAsStored the Q4_0 / Q4_1 / Q8_0 linear layers run as stored.
  // Every linear layer is packed for `cfg` (its target and knobs), and so runs with it, attention
  // too: two models loaded with two configs run on their own targets in one process.
  static Result<LlamaModel> Load(const std::string& path, const KernelConfig& cfg,
                                 const LoadOptions& opt = {});
  static Result<LlamaModel> FromGguf(const std::string& path, const KernelConfig& cfg,
                                     const LoadOptions& opt = {});
  static Result<LlamaModel> FromSparq(const std::string& path, const KernelConfig& cfg,
                                      const LoadOptions& opt = {});
  // A Hugging Face Llama folder: config.json (model_type "llama"), tokenizer.json, and the weights
  // in model.safetensors, or in the shards named by model.safetensors.index.json ("weight_map"),
  // or, with neither, in every *.safetensors of the folder. F32, F16 and BF16 tensors are
  // converted to f32. q_proj/k_proj rows are permuted as llama.cpp's converter does
  // (convert_hf_to_gguf.py, LlamaModel.permute), so the folder and its GGUF conversion give the
  // same model. Errors name the file and tensor: missing files, shards or tensors, shapes that
  // do not match config.json, other dtypes, non-finite values, tensors the runtime has no place
  // for (biases, ...).
  static Result<LlamaModel> FromHfFolder(const std::string& dir, const KernelConfig& cfg);
  // Assembles a model from parts (weights must match the config; checked).
  static Result<LlamaModel> FromParts(LlamaConfig config, LlamaWeights weights,
                                      Tokenizer tokenizer, const std::string& what);

  const LlamaConfig& config() const;
  const Tokenizer& tokenizer() const;
  const LlamaWeights& weights() const;
  LlamaWeights& mutable_weights();
  const std::string& source() const;  // the path it was loaded from
  // The Highway target its attention runs on (its layers' KernelConfig's), e.g. "AVX2"; "" with
  // no blocks.
  std::string attention_target() const;
  // A KV cache of `capacity` positions for this model, of the type its layers' KernelConfig names
  // (kv_f16: f16, else f32): what generation and perplexity run on.
  Result<KvCache> NewCache(int64_t capacity) const;
  // Bytes of all weights as stored for compute: linear layers' packed bytes (output head
  // included) + embedding + norms.
  uint64_t weight_bytes() const;
  // Bytes of the linear layers of the blocks only (what pruning changes).
  uint64_t block_linear_bytes() const;
  // Bytes of weights one decoded token reads: every linear layer (the head included), the norms
  // and one embedding row (weight_bytes() less the rest of the embedding).
  uint64_t weight_bytes_per_token() const;
  // The values the blocks' linear layers store, as the kernels read them: "bf16", "int4:g64", or
  // the distinct specs joined by "+" in layer order ("bf16+f32" when some layers stay f32).
  std::string block_linear_values() const;
  // Some product of a decoded token rounds X to int8 (LinearWeight::rounds_x of a block's layer
  // or the head): what KernelConfig::int8_activations changed for this model.
  bool decode_rounds_x() const;

  // Runs `tokens` at positions cache->length() ... and appends them to the cache. logits: if not
  // null, [n, n_vocab] for every token when all_logits, else [n_vocab] for the last token only.
  // Errors: token id out of range, cache too small.
  Status Forward(std::span<const int32_t> tokens, KvCache* cache, float* logits, bool all_logits,
                 ThreadPool* pool) const;
  // One decode step of B sequences at once (batched sampling, e.g. self-distillation): token b is
  // the next token of the sequence whose cache is caches[b], at its position caches[b]->length(),
  // and is appended to that cache. The linear layers run over all B tokens at once (n = B: one
  // pass over the weights for B tokens instead of B passes), RoPE and attention per sequence.
  // logits: [B, n_vocab], row b for sequence b. They equal per-sequence Forward calls up to the
  // kernels' summation order (n = B and n = 1 may take different kernel paths); B = 1 runs
  // Forward's own kernels. Errors: tokens and caches of different counts or none, a token id out
  // of range, a null or repeated cache, a cache with no room left; nothing is run or appended then.
  Status ForwardBatch(std::span<const int32_t> tokens, std::span<KvCache* const> caches,
                      float* logits, ThreadPool* pool) const;
  // Forward runs each block's MLP as one fused SwiGLU kernel call where its weights allow (on by
  // default). The bits are the same either way; off only serves to time the difference.
  void set_fuse_mlp(bool on);
  bool fuse_mlp() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Writes the model as a .sparq checkpoint (checkpoint.h; the layout FromSparq reads) holding it
// as loaded: configuration, tokenizer, norms, embedding, and each linear layer as a dense matrix,
// its codes, scales and mins where it runs quantized as stored (a GGUF's Q4_0 / Q4_1 / Q8_0 with
// GgufValues::kAsStored; a tied head so stored makes the embedding that matrix), else its f32
// weights stored as `values` (f32: bit for bit; bf16 / f16 rounded to nearest, f16 refused where
// a weight exceeds its range). For models loaded from GGUF files and Hugging Face folders; a
// sparse or bf16 layer (a model loaded from a .sparq: save it by copying that file) is an error
// naming it. Atomic.
Status SaveLlamaCheckpoint(const LlamaModel& model, const std::string& path,
                           DType values = DType::kF32);

// Parameters of the model: every linear layer's rows x cols (the head only when untied), the
// embedding and the norms; the denominator of bits per weight (`sparq bench model`).
double ParameterCount(const LlamaModel& m);

// ---- perplexity --------------------------------------------------------------------------------

struct PerplexityResult {
  double perplexity = 0.0;
  double mean_nll = 0.0;
  int64_t tokens = 0;     // predicted tokens (each window of c tokens predicts c - 1)
  int64_t windows = 0;
  int64_t ctx = 0;
  double seconds = 0.0;
};
// Non-overlapping windows of `ctx` tokens (the last, shorter one included if it has >= 2 tokens);
// within each window every token after the first is predicted from the ones before it; the mean
// negative log-likelihood is over all predicted tokens. `progress(done_windows, windows)` is called
// after each window when set. If `argmax` is set it receives, for every predicted token in order,
// the model's greedy choice (for agreement checks against another runtime). step > 0 feeds each
// window `step` tokens per forward pass through the KV cache (1: token by token, the products
// generation decodes with, e.g. those of KernelConfig::int8_activations); 0: the whole window in
// one pass. The logits are the same function of the tokens either way, up to the kernels' rounding.
Result<PerplexityResult> Perplexity(const LlamaModel& model, std::span<const int32_t> tokens,
                                    int64_t ctx, ThreadPool* pool,
                                    const std::function<void(int64_t, int64_t)>& progress = {},
                                    std::vector<int32_t>* argmax = nullptr, int64_t step = 0);

// Index of the largest logit (lowest index on ties).
int32_t Argmax(std::span<const float> logits);

// ---- generation --------------------------------------------------------------------------------

struct GenerateOptions {
  int64_t max_new = 64;
  double temperature = 0.0;  // 0: greedy
  int64_t top_k = 40;        // sampling only; 0 = whole vocabulary
  // Sampling only (nucleus): of the top_k, the fewest likeliest tokens whose probabilities (at
  // the temperature) sum to at least top_p of theirs; 1 = all of them. In (0, 1].
  double top_p = 1.0;
  uint64_t seed = 42;
  bool stop_at_eos = true;
};
struct GenerateResult {
  std::vector<int32_t> tokens;  // new tokens only
  double prefill_seconds = 0.0;
  double decode_seconds = 0.0;
  int64_t prompt_tokens = 0;
};
// The token Generate picks from one position's logits [n_vocab]: the argmax at temperature <= 0,
// else a draw from `rng` over the top_k / top_p cut at opt.temperature (ties in index order).
// Exposed so that batched samplers (self-distillation) draw exactly as Generate does.
int32_t SampleToken(std::span<const float> logits, const GenerateOptions& opt,
                    std::mt19937_64* rng);
// Prefills the prompt in one batch, then decodes one token at a time. `on_token` (optional) sees
// each new token as it is produced.
Result<GenerateResult> Generate(const LlamaModel& model, std::span<const int32_t> prompt,
                                const GenerateOptions& opt, ThreadPool* pool,
                                const std::function<void(int32_t)>& on_token = {});

// ---- speed -------------------------------------------------------------------------------------

struct ModelSpeed {
  double prefill_seconds = 0.0, decode_seconds = 0.0;
  int64_t prefill_tokens = 0, decode_tokens = 0;
  double prefill_tok_s() const { return prefill_tokens / prefill_seconds; }
  double decode_tok_s() const { return decode_tokens / decode_seconds; }
};
// One timed run: prefill `prompt` in one batch (last-token logits only), then `decode_tokens`
// single-token greedy steps, timed separately.
Result<ModelSpeed> MeasureSpeed(const LlamaModel& model, std::span<const int32_t> prompt,
                                int64_t decode_tokens, ThreadPool* pool);

// ---- dense bf16 ----------------------------------------------------------------------------------

// Re-stores every linear layer of `model` (the seven of each block and the output head) as dense
// bf16 (round to nearest even), so they run through sparq's dense bf16 kernel: the dense model at
// bf16's bytes, the baseline that separates what bf16 storage buys from what sparsity buys. The
// token embedding and norms stay f32. Errors, naming the layer, if one is not stored dense f32
// (a pruned or already converted model); the model is then unchanged. Each layer is repacked
// for the KernelConfig it already has.
Status StoreLinearsAsBf16(LlamaModel* model);

// ---- calibration, pruning, checkpoints ----------------------------------------------------------

// Default work bound of the channel-permutation search per layer (PermuteOptions::max_work): about
// the same time for every SmolLM2 layer shape; measured 7.4-8.1 s per layer (1,779 s for the
// whole model) on one thread while other jobs used both cores of this machine.
inline constexpr int64_t kDefaultPermuteWork = 50'000'000;

struct ModelPruneOptions {
  PruneMethod method = PruneMethod::kSparseGpt;
  Pattern pattern = Pattern::Unstructured(0.5);
  // Values of the pruned matrices: f32, bf16, or quantized (int8 / int4; N:M, dense and the CSR
  // patterns: unstructured, rows, cols, whose groups are column ranges, format.h CsrMatrix;
  // the embedding is then stored in bf16). Quantized values come from GPTQ in the same sweep as
  // SparseGPT (quantization error fed to the columns not yet fixed; magnitude and Wanda fit each
  // group once after masking), or from round to nearest after pruning (kRtn). The dense pattern
  // prunes nothing whatever the method: it quantizes each layer (GPTQ, or RTN), `sparq quantize`.
  ValueSpec values;
  // Values of the token embedding (the tied head): unset follows `values` (f32 / bf16 / f16 as
  // they are; for quantized values the GGUF's own grid where it stores the embedding as Q8_0 /
  // Q4_0 / Q4_1, kept bit for bit, else bf16). int8 / int4 store it as a dense quantized matrix, which
  // the head then runs as stored: quantized as the head by `quant_method` (GPTQ on the final-norm
  // hidden states of the calibration tokens, or round to nearest per group of a row); an
  // embedding untied from the head, only looked up, is rounded to nearest. The tied head then
  // appears in the result's layers as "token_embd.weight" with its reconstruction error.
  std::optional<ValueSpec> embedding_values;
  // With a quantized tied head (embedding_values int4): the rows of the calibration text's most
  // frequent tokens are stored apart in int8:g32 as well (ties: lower id first). On SmolLM2 the
  // int4:g64 head's perplexity cost is mostly in those rows: 2,048 of 49,152 (+1.3 MB) halve it.
  int64_t embedding_int8_rows = 0;
  enum class QuantMethod { kGptq, kRtn } quant_method = QuantMethod::kGptq;
  bool permute = false;              // channel permutation for N:M / V:N:M
  // GPTQ's act-order (PruneOptions::act_order, static groups), GPTQ only: dense layers (`sparq
  // quantize`, also keeping a pruned .sparq's masks), or with a pattern and SparseGPT two passes
  // per layer (SparseGPT in f32, then act-order GPTQ on the kept weights with that mask fixed).
  // Off here; the command line and Python turn it on wherever ActOrderApplies (their default).
  bool act_order = false;
  // Bounds of the permutation search per layer (see PermuteOptions). Work bounds, not a clock,
  // so that pruning twice with the same flags gives byte-identical checkpoints on any machine of
  // the same CPU model (the BLAS and kernels round by the CPU).
  double permute_time_budget_s = 0.0;   // <= 0: none
  int64_t permute_max_rounds = 64;
  int64_t permute_max_work = kDefaultPermuteWork;
  int64_t calib_samples = 64;        // segments of the calibration text ...
  int64_t calib_len = 512;           // ... of this many tokens each, at seeded random offsets
  uint64_t seed = 0;
  // ECMAScript regex over tensor names; matching linear layers are pruned, others stay dense.
  // "output.weight" (the head) may be included: it is then pruned on the final-norm activations
  // and stored untied from the embedding.
  std::string include =
      "blk\\..*\\.(attn_q|attn_k|attn_v|attn_output|ffn_gate|ffn_up|ffn_down)\\.weight";
  int64_t max_blocks = -1;           // prune only blocks < max_blocks (tests); -1: all
  double damp = 0.01;
  // How an unstructured pattern's sparsity is spread over the blocks: the same in every block, or
  // OWL (Yin et al. 2024): denser blocks where the dense model's Wanda scores |W_ij| * ||X_j||
  // have more outliers (above owl_threshold times the block's mean), within +-owl_lambda of the
  // target, the parameter-weighted mean over the pruned layers equal to the target.
  enum class Allocation { kUniform, kOwl } allocation = Allocation::kUniform;
  double owl_lambda = 0.08, owl_threshold = 5.0;  // OWL's defaults for LLaMA (lambda, M)
  bool progress = true;              // progress bar on stderr (only when it is a terminal)
};

// Whether act-order can run under `opt` (quantized values, GPTQ, no --permute, SparseGPT where a
// pattern prunes): where `sparq prune` / `sparq quantize` run it unless told --no-act-order.
// It took a third to a half of int4:g64's perplexity cost back on SmolLM2 (2:4: 181.0 -> 160.6;
// docs/measurements/xeon-gptq-act-order-2026-12-06.md) for the same bytes.
bool ActOrderApplies(const ModelPruneOptions& opt);

struct LayerPruneResult {
  std::string name;
  std::string format;  // stored format ("nm", "csr", ...)
  uint64_t stored_bytes = 0;
  PruneReport report;
};

struct ModelPruneResult {
  std::vector<LayerPruneResult> layers;
  int64_t calib_tokens = 0;
  double seconds = 0.0;        // whole pipeline
  double prune_seconds = 0.0;  // inside Prune() calls
  double dense_bytes = 0.0, stored_bytes = 0.0;  // pruned layers: f32 dense vs as stored
  std::vector<double> block_sparsity;  // kOwl: each block's unstructured sparsity (else empty)
  // Deterministic summary (no timings) as stored in the checkpoint's metadata.
  std::string ToJson(bool with_timings) const;
};

// Sequential calibration and pruning (SparseGPT's procedure): the calibration segments run through
// the model block by block; for each block the inputs of its linear layers are accumulated into
// Hessians (q/k/v share one, gate/up share one), the selected layers are pruned, and the block's
// outputs are recomputed with the pruned weights to feed the next block. Only one block's
// activations are held. `model_path` is a GGUF file (its dequantized weights are the dense
// model); the result is written atomically to `out_path` as a self-contained .sparq checkpoint
// (config and tokenizer in the metadata). Same inputs and options give byte-identical files.
// `cfg`: the target the calibration passes and the pruned layers run on (not in the file).
Result<ModelPruneResult> PruneLlama(const std::string& model_path, std::string_view calib_text,
                                    const ModelPruneOptions& opt, const std::string& out_path,
                                    const KernelConfig& cfg, ThreadPool* pool);

// Reads a whole text file, checking it is non-empty UTF-8 (error names the file and byte offset).
Result<std::string> ReadTextFile(const std::string& path);

}  // namespace sparq
