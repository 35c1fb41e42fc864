// Byte-level BPE tokenizer (GPT-2 style), as llama.cpp and Hugging Face `tokenizers` run it.
//
// Sources: GGUF metadata (`tokenizer.ggml.model` = "gpt2", `.tokens`, `.merges`, `.token_type`,
// `.pre`, bos/eos ids) or a Hugging Face tokenizer.json (model type "BPE" with a ByteLevel
// pre-tokenizer). Encoding: optional split on special tokens, the pre-tokenizer named by `pre`
// (regex splitting written by hand over generated Unicode tables, see src/model/unicode.h),
// GPT-2's byte-to-unicode mapping, then BPE merges by rank (lowest first, leftmost on ties);
// a final symbol missing from the vocabulary falls back to one token per byte.
// Thread-safety: a Tokenizer is immutable after construction; Encode/Decode are const and may be
// called concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sparq/status.h"

namespace sparq {

class GgufFile;

// Token types as in GGUF / llama.cpp (`tokenizer.ggml.token_type`).
enum class TokenType : int32_t {
  kUndefined = 0, kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6,
};

// Everything that defines a tokenizer; the form stored in a .sparq checkpoint.
struct TokenizerData {
  std::string model = "gpt2";  // only "gpt2" (byte-level BPE) is supported
  std::string pre = "gpt2";    // pre-tokenizer name as llama.cpp spells it ("smollm", "gpt-2", ...)
  std::vector<std::string> tokens;
  std::vector<int32_t> token_types;  // empty or one per token
  std::vector<std::string> merges;   // "left right", in rank order
  int32_t bos_id = -1, eos_id = -1, unk_id = -1, pad_id = -1;
  bool add_bos = false;
  // The model's Jinja chat template (GGUF `tokenizer.chat_template`, tokenizer_config.json's
  // `chat_template`); "" when it has none. See sparq/chat.h.
  std::string chat_template;

  // JSON round trip (used for checkpoint metadata).
  std::string ToJson() const;
  static Result<TokenizerData> FromJson(std::string_view json, const std::string& what);
};

class Tokenizer {
 public:
  Tokenizer();
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // Validates `data` (unknown model/pre, merges naming unknown tokens, out-of-range special ids,
  // duplicate tokens) with errors prefixed by `what` (a file name).
  static Result<Tokenizer> FromData(TokenizerData data, const std::string& what);
  static Result<Tokenizer> FromGguf(const GgufFile& file);
  // A Hugging Face tokenizer.json (BPE model with byte-level pre-tokenizer). `config_path`, when
  // not empty and the file exists, is the folder's tokenizer_config.json: its `chat_template` (a
  // string, or a list of {name, template} of which "default" is taken) becomes chat_template.
  static Result<Tokenizer> FromHfJson(const std::string& path, const std::string& config_path = "");

  // Token ids of UTF-8 `text` (invalid UTF-8 is an error naming the byte offset). BOS is
  // prepended when `add_bos` (and the vocabulary has one). With `parse_special`, occurrences of
  // control / user-defined token texts map to those tokens; otherwise they are plain text.
  Result<std::vector<int32_t>> Encode(std::string_view text, bool add_bos = false,
                                      bool parse_special = false) const;
  // Bytes of the tokens (byte-level decoding; control tokens are emitted as their text when
  // `special`, skipped otherwise). May end inside a UTF-8 sequence when ids do.
  std::string Decode(std::span<const int32_t> ids, bool special = false) const;
  // Pre-tokenizer pieces of `text` (for tests), byte strings.
  Result<std::vector<std::string>> PreTokenize(std::string_view text) const;

  int32_t vocab_size() const;
  int32_t bos_id() const;
  int32_t eos_id() const;
  const TokenizerData& data() const;

  struct Impl;  // opaque (src/model/tokenizer_impl.h)

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace sparq
