// `sparq finetune` as a library call (issue 28, item 4): trains a pruned .sparq student on text,
// by distillation from a teacher (KL to its logits, optionally SquareHead on every block's
// output) and / or next-token cross-entropy, with its
// sparsity masks fixed, and writes the trained model as a .sparq in the student's own formats.
//
// What it trains: every weight of the student (embedding, norms, the kept weights of each sparse
// linear layer, every weight of a dense one) as f32 masters (sparq/train_model.h), AdamW
// (sparq/train_optim.h), warmup + cosine (sparq/train_loop.h). Pruned weights stay exactly 0.
// How: the student's forward / backward runs on the training fast path (TrainExec::fast,
// sparq/train_model.h: f32 BLAS tiles, attention and the per-row ops split over the pool), the
// teacher's forward on the runtime's kernels; both on the pool passed in, with results that do
// not depend on its size.
// Quantized students (int8 / int4 values: dense, N:M, CSR) train through f32 masters (their
// codes dequantized; a sparse slot's mask from its stored structure, so a kept weight whose code
// means 0 still trains) and are written back in their own structure and value specs, by GPTQ
// with the masks fixed (FinetuneOptions::gptq, `sparq quantize`'s path) or round to nearest.
// What it does not do yet: an untied output head is refused (FromLlamaModel); a sparse slot's
// gradient is computed dense, then masked.
//
// Determinism: a run is a function of (student, teacher, texts, options); a run stopped after k
// steps and resumed from its state file ends with the same OUT, bit for bit.
// Errors are Status with messages naming the file / tensor; nothing here aborts on file data.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "sparq/checkpoint.h"
#include "sparq/kernel_config.h"
#include "sparq/status.h"
#include "sparq/thread_pool.h"
#include "sparq/train_loop.h"
#include "sparq/train_model.h"

namespace sparq::train {

// One training text: its name (a file, for errors) and its UTF-8 contents.
struct FinetuneText {
  std::string name;
  std::string text;
};

// A point of the curve (FinetuneOptions::eval_every).
struct FinetuneCurvePoint {
  int64_t step = 0;         // completed steps (0: the student as given)
  int64_t tokens = 0;       // trained tokens at that step
  double perplexity = 0.0;  // on the first of FinetuneOptions::eval_texts
  // One per eval text, in their order (perplexities[0] == perplexity): each text scored on its
  // own, so held-out text of another kind (WikiText beside the book's held-out part) shows
  // whether the student gains on its training text's style only.
  std::vector<double> perplexities;
};

struct FinetuneOptions {
  std::string student;  // a .sparq checkpoint (the output keeps its formats)
  std::string teacher;  // .gguf / .sparq / HF folder; needed when kl > 0
  std::vector<FinetuneText> texts;
  std::string out;         // the trained .sparq
  std::string state_path;  // the train state file; "" for out + ".state"
  int64_t tokens = 0;      // trained tokens: steps = ceil(tokens / (seq_len * accum))
  int64_t seq_len = 512;
  int64_t accum = 1;
  double lr = 1e-4;
  int64_t warmup = -1;  // < 0: 5% of the steps (at most steps - 1)
  double min_lr_ratio = 0.1;
  double kl = 1.0, ce = 0.0, tau = 1.0;
  // SquareHead's weight (LossSpec::hidden_weight): > 0 distills every block's output too; the
  // teacher then runs the training forward on its f32 masters (FromLlamaModel: the runtime's
  // forward exposes no hidden states) and must have the student's n_layer and n_embd.
  double hidden = 0.0;
  double weight_decay = 0.0;
  double max_grad_norm = 1.0;
  // A quantized student's trained matrices go back into their value specs by GPTQ with the masks
  // fixed (`sparq quantize`'s path, calibrated on `texts`) where that keeps the stored structure
  // bit for bit, else (and with gptq = false, `--requant rtn`) by round to nearest per group.
  bool gptq = true;
  bool norms_only = false;  // train only the RMSNorm gains (`--train norms`): the matrices stay
  uint64_t seed = 0;
  int64_t checkpoint_every = 0;  // 0: the state is saved at the end only
  bool resume = false;           // continue from state_path
  int64_t stop_at = -1;          // stop after this step without writing out (tests: interrupt)
  // With stop_at: write out as of that step too (a snapshot of the run in the student's formats:
  // sample or evaluate it; the state stays, so a resume continues the run unchanged).
  bool write_at_stop = false;
  // The curve: the student's perplexity on each of eval_texts (tokenized as `sparq eval` does,
  // the first eval_tokens of each, windows of seq_len tokens) before the first step, every eval_every
  // steps and after the last; computed on the f32 masters by the training forward (a bf16 or
  // quantized OUT rounds them afterwards), so it costs no change to the run: a resumed run
  // gives the same points. eval_every 0: no curve.
  std::vector<FinetuneText> eval_texts;
  int64_t eval_every = 0;
  int64_t eval_tokens = 16384;
  std::function<void(const FinetuneCurvePoint&)> on_eval;  // may be empty
  std::function<void(const TrainProgress&)> progress;  // may be empty
  TrainTimers* timers = nullptr;  // null, or accumulates where the steps' time went
  // Keep every block's activations from the forward for the backward (TrainExec::activations:
  // SmolLM2 at seq_len 512 ~0.5 GB more, ~15% less time a step); false recomputes them block by
  // block (memory bounded by one block's). The same bits either way.
  bool keep_activations = true;
};

struct FinetuneResult {
  int64_t steps = 0;                         // the run's total steps
  int64_t start_step = 0;                    // > 0 when resumed
  int64_t end_step = 0;                      // the last completed step
  int64_t data_tokens = 0;                   // tokens in the texts
  int64_t trained_tokens = 0;                // (end_step - start_step) * seq_len * accum
  double first_loss = 0.0, last_loss = 0.0;  // of this call's first / last step (0 if none)
  double seconds = 0.0;
  bool wrote_out = false;  // false when stopped by stop_at
  // Trained quantized block matrices written back by GPTQ / by round to nearest.
  int64_t requant_gptq = 0, requant_rtn = 0;
  std::vector<FinetuneCurvePoint> curve;  // this call's points (FinetuneOptions::eval_every)
  int64_t eval_predicted = 0;             // tokens each point predicts (all eval texts)
  std::vector<std::string> eval_names;    // the eval texts' names, in the points' order
  std::string ToJson() const;
};

// The whole run: loads the student (LlamaModel::Load) and the teacher, tokenizes the texts with
// the student's tokenizer, trains (TrainLoop, saving the state to state_path every
// checkpoint_every steps and at the end) and writes out (WriteFinetunedCheckpoint).
// Errors (kInvalidInput unless said): a student that is not a .sparq model checkpoint, a teacher
// whose vocabulary differs (naming both files), texts with fewer than seq_len + 1 tokens, a
// non-finite loss (the run stops; the state file holds the last good step), a --resume state from
// another student, data or options.
Result<FinetuneResult> Finetune(const FinetuneOptions& opt, const KernelConfig& cfg,
                                ThreadPool* pool);

// Writes `w` as a copy of the .sparq checkpoint at student_path: every matrix keeps its format,
// structure (indices, metadata), pattern and value dtype, its values replaced by w's (rounded to
// bf16 / f16 where stored so; channel-permuted slots stored permuted again, `.perm` tensors
// kept); plain tensors (embedding, norms) keep their dtypes. A quantized matrix keeps its
// structure and value spec (same int8 / int4, group, sym / min): every stored slot takes w's value
// and each group is re-fitted by round to nearest (NmMatrix / CsrMatrix / DenseMatrix::Quantize).
// `metadata` entries are added to the student's. Errors: a shape that differs, a weight of w that
// is nonzero where the student's matrix holds no value or (numbers, sparse format) an explicit 0
// (naming the tensor and entry: the mask must be fixed), a group whose scale does not fit f16.
// Written atomically.
// The student's quantized block slots in tm (from FromLlamaModel of the student loaded from ck)
// re-read from the checkpoint: masters = the codes dequantized (ToDense; channel permutations
// undone), and for a sparse format the kept positions = every stored slot (N:M metadata, CSR
// indices), not the nonzero values: a kept weight whose code means exactly 0 (symmetric int4 code
// 8, int8 code 0) stays kept and trains. Slots with numbers are left as FromLlamaModel read them.
// Errors: a matrix or `.perm` whose shape differs from c's.
Status StudentQuantizedMasters(const Checkpoint& ck, const LlamaConfig& c, TrainableModel* tm);

Status WriteFinetunedCheckpoint(const std::string& student_path, const LlamaConfig& c,
                                const ModelWeights& w, const std::string& out_path,
                                const std::map<std::string, std::string>& metadata = {});

// ---- self-distillation data (`sparq finetune --self-distill`) ------------------------------------
//
// Recovery needs text like what the model saw in training, which the repo does not hold (one book
// for calibration, one evaluation text). The teacher itself is the source: samples drawn from it
// at temperature 1 follow its own distribution, which the KL loss then teaches the student.
struct SelfDistillOptions {
  int64_t tokens = 65536;     // new tokens to generate in all (samples are drawn until reached)
  int64_t sample_len = 512;   // new tokens per sample (fewer when the teacher ends it with EOS)
  double temperature = 1.0;   // > 0
  int64_t top_k = 0;          // 0: the whole vocabulary
  double top_p = 1.0;         // nucleus (GenerateOptions::top_p); 1: no cut
  uint64_t seed = 0;
  // Samples decoded at once (LlamaModel::ForwardBatch: one pass over the teacher's weights per
  // step for all of them); a slot freed by a sample that ends takes the next sample. >= 1.
  int64_t batch = 16;
  // Called as samples end, with the tokens sampled so far (at most total). May be empty.
  std::function<void(int64_t generated, int64_t total)> progress;
};

// The openings samples start from: short, across topics (history, science, places, people,
// how-to, dialogue); sample i starts from entry i mod size.
const std::vector<std::string>& SelfDistillPrompts();

// Samples from `teacher` until `o.tokens` new tokens are generated; returns each sample's prompt
// and decoded continuation (bytes that do not form valid UTF-8 dropped), samples in sample order
// separated by a blank line. Sample i starts from prompt i mod size, prefilled alone
// (LlamaModel::Forward), draws with its own seed by Generate's rule (SampleToken), and is decoded
// with up to o.batch - 1 others (LlamaModel::ForwardBatch). Its length: up to and including an
// EOS, at most sample_len, and cut to the budget the samples before it leave, o.tokens - (their
// kept tokens); a sample with no budget left is not part of the text (nor drawn: one starts only
// when the samples before it are certain to leave it a token). So the text holds exactly o.tokens
// new tokens, each sample's tokens are a prefix of what it would draw without the cut, and batch
// 1 gives the text Generate gave one sample at a time. Deterministic in (teacher, options): the
// thread count does not change it; the batch may (its kernels sum in another order, which can
// change a draw), not the prompts or the number of tokens.
// Errors: temperature <= 0 or non-finite, tokens, sample_len or batch < 1.
Result<std::string> SelfDistillText(const LlamaModel& teacher, const SelfDistillOptions& o,
                                    ThreadPool* pool);

}  // namespace sparq::train
