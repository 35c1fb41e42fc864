// Unicode facts the tokenizer needs: UTF-8 decoding (strict) and the three codepoint classes of
// GPT-2 style pre-tokenizer regexes (\p{L}, \p{N}, \s). Internal to src/model.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "sparq/status.h"

namespace sparq::unicode {

inline constexpr uint8_t kLetter = 1;  // general category L* (Lu Ll Lt Lm Lo)
inline constexpr uint8_t kNumber = 2;  // general category N* (Nd Nl No)
inline constexpr uint8_t kSpace = 4;   // White_Space property

struct CodepointRange {
  uint32_t first, last;
  uint8_t flags;
};
// Generated table (unicode_tables.cc): sorted, disjoint ranges with nonzero flags.
extern const CodepointRange kCodepointRanges[];
extern const int kNumCodepointRanges;
extern const char kUnicodeVersion[];

// Class flags of a codepoint (0 for anything not listed, e.g. punctuation or unassigned).
uint8_t Flags(uint32_t cp);
inline bool IsLetter(uint32_t cp) { return Flags(cp) & kLetter; }
inline bool IsNumber(uint32_t cp) { return Flags(cp) & kNumber; }
inline bool IsSpace(uint32_t cp) { return Flags(cp) & kSpace; }

// Decodes UTF-8 strictly (no overlong forms, surrogates or values above U+10FFFF). On success
// `cps` holds the codepoints and `offsets` (size cps+1) the byte offset where each one starts.
// The error names `what` and the byte offset of the first bad sequence.
Status DecodeUtf8(std::string_view s, const std::string& what, std::vector<uint32_t>* cps,
                  std::vector<size_t>* offsets);
void AppendUtf8(uint32_t cp, std::string* out);

}  // namespace sparq::unicode
