#include "src/model/pretokenizer.h"

#include "src/model/unicode.h"

namespace sparq::pretok {
namespace {

// GPT-2's regex, matched by hand (leftmost alternative wins, as a backtracking regex engine does):
//   's|'t|'re|'ve|'m|'ll|'d | ?\p{L}+ | ?\p{N}+ | ?[^\s\p{L}\p{N}]+ | \s+(?!\S) | \s+
// Positions outside [begin, end) behave as "no character" (the piece boundary is an end of text).
void SplitGpt2(const std::vector<uint32_t>& cps, size_t begin, size_t end,
               std::vector<std::pair<size_t, size_t>>* pieces) {
  constexpr uint8_t kOutside = 0x80;  // a flag value no codepoint has
  auto flags = [&](size_t i) -> uint8_t { return i < end ? unicode::Flags(cps[i]) : kOutside; };
  auto cp = [&](size_t i) -> uint32_t { return i < end ? cps[i] : 0xFFFFFFFFu; };
  auto is_other = [](uint8_t f) {  // [^\s\p{L}\p{N}] and inside the piece
    return f != kOutside && (f & (unicode::kLetter | unicode::kNumber | unicode::kSpace)) == 0;
  };
  size_t pos = begin;
  auto emit = [&](size_t stop) {
    if (stop > pos) pieces->emplace_back(pos, stop);
    pos = stop;
  };
  while (pos < end) {
    const uint32_t c = cps[pos];
    // Contractions.
    if (c == '\'' && pos + 1 < end) {
      const uint32_t n1 = cp(pos + 1);
      if (n1 == 's' || n1 == 't' || n1 == 'm' || n1 == 'd') {
        emit(pos + 2);
        continue;
      }
      if (pos + 2 < end) {
        const uint32_t n2 = cp(pos + 2);
        if ((n1 == 'r' && n2 == 'e') || (n1 == 'v' && n2 == 'e') || (n1 == 'l' && n2 == 'l')) {
          emit(pos + 3);
          continue;
        }
      }
    }
    // " ?X+" for X = letter, number, other: the optional space belongs to the run that follows.
    const size_t run = pos + (c == ' ' ? 1 : 0);
    const uint8_t f = flags(run);
    if (f != kOutside && (f & unicode::kLetter)) {
      size_t q = run;
      while (flags(q) != kOutside && (flags(q) & unicode::kLetter)) ++q;
      emit(q);
      continue;
    }
    if (f != kOutside && (f & unicode::kNumber)) {
      size_t q = run;
      while (flags(q) != kOutside && (flags(q) & unicode::kNumber)) ++q;
      emit(q);
      continue;
    }
    if (is_other(f)) {
      size_t q = run;
      while (is_other(flags(q))) ++q;
      emit(q);
      continue;
    }
    // Whitespace: \s+(?!\S) leaves the last space of a run to the word that follows it.
    size_t ws = 0;
    while (flags(pos + ws) != kOutside && (flags(pos + ws) & unicode::kSpace)) ++ws;
    if (ws > 1 && pos + ws < end) {
      emit(pos + ws - 1);
      continue;
    }
    if (ws > 0) {
      emit(pos + ws);
      continue;
    }
    emit(pos + 1);  // unreachable for valid input; keeps the loop total
  }
}

}  // namespace

Result<Kind> KindFromName(const std::string& name) {
  // Names and groups as in llama.cpp's llama-vocab.cpp.
  for (const char* n : {"gpt2", "gpt-2", "mpt", "olmo", "jais"}) {
    if (name == n) return Kind::kGpt2;
  }
  for (const char* n : {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone"}) {
    if (name == n) return Kind::kDigitsGpt2;
  }
  return Unsupported("pre-tokenizer '" + name +
                     "' is not supported (supported: gpt2, gpt-2, mpt, olmo, jais, smollm, "
                     "starcoder, refact, command-r, codeshell, exaone)");
}

void Split(Kind kind, const std::vector<uint32_t>& cps, size_t begin, size_t end,
           std::vector<std::pair<size_t, size_t>>* pieces) {
  if (kind == Kind::kGpt2) {
    SplitGpt2(cps, begin, end, pieces);
    return;
  }
  // "\p{N}": each number codepoint is a piece of its own; the text between them stays together.
  size_t start = begin;
  for (size_t i = begin; i < end; ++i) {
    if (unicode::IsNumber(cps[i])) {
      if (i > start) SplitGpt2(cps, start, i, pieces);
      pieces->emplace_back(i, i + 1);  // a single digit: GPT-2's regex keeps it whole
      start = i + 1;
    }
  }
  if (end > start) SplitGpt2(cps, start, end, pieces);
}

}  // namespace sparq::pretok
