// Pre-tokenizers: split text (as codepoints) into the pieces BPE runs on, as llama.cpp's
// unicode_regex_split does for the GPT-2 family of regexes. Internal to src/model.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "sparq/status.h"

namespace sparq::pretok {

enum class Kind {
  kGpt2,        // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  kDigitsGpt2,  // first every \p{N} codepoint on its own ("\p{N}"), then kGpt2 within each piece
};

// Maps a GGUF `tokenizer.ggml.pre` name to a Kind; Unsupported for names sparq does not know.
Result<Kind> KindFromName(const std::string& name);

// Appends [begin, end) codepoint index ranges of the pieces of cps[begin, end) to `pieces`.
// The pieces tile the input exactly.
void Split(Kind kind, const std::vector<uint32_t>& cps, size_t begin, size_t end,
           std::vector<std::pair<size_t, size_t>>* pieces);

}  // namespace sparq::pretok
