// Byte-level BPE encode/decode. Loading (GGUF, tokenizer.json, JSON form) is in tokenizer_load.cc.
#include "sparq/tokenizer.h"

#include <algorithm>
#include <queue>
#include <unordered_map>

#include "src/model/pretokenizer.h"
#include "src/model/tokenizer_impl.h"
#include "src/model/unicode.h"

namespace sparq {

// An empty vocabulary (not a null one): a default tokenizer answers vocab_size() == 0.
Tokenizer::Tokenizer() : impl_(std::make_unique<Impl>()) {}
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->data.tokens.size()); }
int32_t Tokenizer::bos_id() const { return impl_->data.bos_id; }
int32_t Tokenizer::eos_id() const { return impl_->data.eos_id; }
const TokenizerData& Tokenizer::data() const { return impl_->data; }

namespace {

// GPT-2's bytes_to_unicode(): printable bytes map to themselves, the rest to U+0100 upwards.
void MakeByteMaps(uint32_t byte_to_cp[256], std::unordered_map<uint32_t, uint8_t>* cp_to_byte) {
  bool direct[256] = {};
  for (int b = '!'; b <= '~'; ++b) direct[b] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) direct[b] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) direct[b] = true;
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    byte_to_cp[b] = direct[b] ? static_cast<uint32_t>(b) : next++;
    (*cp_to_byte)[byte_to_cp[b]] = static_cast<uint8_t>(b);
  }
}

std::string MergeKey(std::string_view left, std::string_view right) {
  std::string key;
  key.reserve(left.size() + right.size() + 1);
  key.append(left);
  key.push_back('\0');  // never part of a byte-level token (byte 0 maps to U+0100)
  key.append(right);
  return key;
}

}  // namespace

Status TokenizerImplInit(Tokenizer::Impl* impl, const std::string& what) {
  const TokenizerData& d = impl->data;
  if (d.model != "gpt2") {
    return Unsupported(what + ": tokenizer model '" + d.model +
                       "' is not supported (only byte-level BPE, 'gpt2')");
  }
  auto kind = pretok::KindFromName(d.pre);
  if (!kind.ok()) return kind.status().WithContext(what);
  impl->pre = static_cast<int>(*kind);
  if (d.tokens.empty()) return InvalidInput(what + ": tokenizer has no tokens");
  if (d.tokens.size() > (size_t{1} << 30)) return InvalidInput(what + ": too many tokens");
  if (!d.token_types.empty() && d.token_types.size() != d.tokens.size()) {
    return InvalidInput(what + ": " + std::to_string(d.token_types.size()) + " token types for " +
                        std::to_string(d.tokens.size()) + " tokens");
  }
  const auto n = static_cast<int32_t>(d.tokens.size());
  for (auto [name, id] : {std::pair{"bos", d.bos_id}, {"eos", d.eos_id}, {"unk", d.unk_id},
                          {"pad", d.pad_id}}) {
    if (id < -1 || id >= n) {
      return InvalidInput(what + ": " + name + " token id " + std::to_string(id) +
                          " out of range [0, " + std::to_string(n) + ")");
    }
  }
  impl->token_to_id.reserve(d.tokens.size());
  for (int32_t i = 0; i < n; ++i) {
    // Duplicates happen in real vocabularies (e.g. padding tokens); the first id wins, as in
    // llama.cpp's token_to_id map.
    impl->token_to_id.emplace(d.tokens[i], i);
    const int32_t type = d.token_types.empty() ? 1 : d.token_types[i];
    if (type == static_cast<int32_t>(TokenType::kControl) ||
        type == static_cast<int32_t>(TokenType::kUserDefined)) {
      if (!d.tokens[i].empty()) impl->specials.emplace_back(d.tokens[i], i);
    }
  }
  std::stable_sort(impl->specials.begin(), impl->specials.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  impl->merge_rank.reserve(d.merges.size());
  for (size_t r = 0; r < d.merges.size(); ++r) {
    const std::string& m = d.merges[r];
    const size_t sp = m.size() > 1 ? m.find(' ', 1) : std::string::npos;
    if (sp == std::string::npos || sp + 1 >= m.size()) {
      return InvalidInput(what + ": merge " + std::to_string(r) + " ('" + m +
                          "') is not 'left right'");
    }
    impl->merge_rank.emplace(MergeKey(std::string_view(m).substr(0, sp),
                                      std::string_view(m).substr(sp + 1)),
                             static_cast<int32_t>(r));
  }
  MakeByteMaps(impl->byte_to_cp, &impl->cp_to_byte);
  for (int b = 0; b < 256; ++b) {
    std::string s;
    unicode::AppendUtf8(impl->byte_to_cp[b], &s);
    auto it = impl->token_to_id.find(s);
    impl->byte_token[b] = it == impl->token_to_id.end() ? -1 : it->second;
  }
  return Status::Ok();
}

namespace {

struct Symbol {
  int32_t prev, next;
  uint32_t start, len;  // byte range in the encoded word
};
struct Bigram {
  int32_t rank;
  int32_t left;  // symbol index
  uint32_t size; // total byte length at push time, to detect stale entries
  bool operator<(const Bigram& o) const {  // priority_queue pops the largest: invert
    return rank > o.rank || (rank == o.rank && left > o.left);
  }
};

// BPE over one pre-tokenized piece (raw bytes); appends token ids.
void EncodeWord(const Tokenizer::Impl& t, std::string_view bytes, std::vector<int32_t>* out) {
  std::string word;  // byte-level encoded: one codepoint per input byte
  std::vector<Symbol> sym;
  sym.reserve(bytes.size());
  for (unsigned char b : bytes) {
    const auto start = static_cast<uint32_t>(word.size());
    unicode::AppendUtf8(t.byte_to_cp[b], &word);
    const auto i = static_cast<int32_t>(sym.size());
    sym.push_back({i - 1, i + 1, start, static_cast<uint32_t>(word.size()) - start});
  }
  if (sym.empty()) return;
  sym.back().next = -1;
  std::priority_queue<Bigram> queue;
  std::string key;
  auto try_add = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const std::string_view w(word);
    auto it = t.merge_rank.find(MergeKey(w.substr(sym[left].start, sym[left].len),
                                         w.substr(sym[right].start, sym[right].len)));
    if (it == t.merge_rank.end()) return;
    queue.push({it->second, left, sym[left].len + sym[right].len});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(sym.size()); ++i) try_add(i, i + 1);
  while (!queue.empty()) {
    const Bigram bg = queue.top();
    queue.pop();
    Symbol& left = sym[bg.left];
    // Stale: one side was merged away or grew since this pair was queued.
    if (left.len == 0 || left.next < 0) continue;
    Symbol& right = sym[left.next];
    if (left.len + right.len != bg.size) continue;
    left.len += right.len;
    right.len = 0;
    left.next = right.next;
    if (right.next >= 0) sym[right.next].prev = bg.left;
    try_add(left.prev, bg.left);
    try_add(bg.left, left.next);
  }
  for (int32_t i = 0; i >= 0; i = sym[i].next) {
    const std::string_view piece = std::string_view(word).substr(sym[i].start, sym[i].len);
    auto it = t.token_to_id.find(std::string(piece));
    if (it != t.token_to_id.end()) {
      out->push_back(it->second);
      continue;
    }
    // Fallback: one token per byte of the symbol (each byte is one codepoint of `word`).
    std::vector<uint32_t> cps;
    std::vector<size_t> offs;
    (void)unicode::DecodeUtf8(piece, "bpe", &cps, &offs);
    for (uint32_t c : cps) {
      auto b = t.cp_to_byte.find(c);
      const int32_t id = b == t.cp_to_byte.end() ? -1 : t.byte_token[b->second];
      out->push_back(id >= 0 ? id : t.data.unk_id);
    }
  }
}

}  // namespace

Result<std::vector<std::string>> Tokenizer::PreTokenize(std::string_view text) const {
  std::vector<uint32_t> cps;
  std::vector<size_t> offs;
  SPARQ_RETURN_IF_ERROR(unicode::DecodeUtf8(text, "text", &cps, &offs));
  std::vector<std::pair<size_t, size_t>> pieces;
  pretok::Split(static_cast<pretok::Kind>(impl_->pre), cps, 0, cps.size(), &pieces);
  std::vector<std::string> out;
  for (auto [b, e] : pieces) out.emplace_back(text.substr(offs[b], offs[e] - offs[b]));
  return out;
}

Result<std::vector<int32_t>> Tokenizer::Encode(std::string_view text, bool add_bos,
                                               bool parse_special) const {
  const Impl& t = *impl_;
  std::vector<uint32_t> cps;
  std::vector<size_t> offs;
  SPARQ_RETURN_IF_ERROR(unicode::DecodeUtf8(text, "text", &cps, &offs));
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 2);
  if (add_bos && t.data.bos_id >= 0) ids.push_back(t.data.bos_id);
  // Fragments of plain text between special tokens (codepoint ranges).
  std::vector<std::pair<size_t, size_t>> pieces;
  std::unordered_map<std::string, std::vector<int32_t>> cache;
  auto encode_text = [&](size_t cb, size_t ce) {
    pieces.clear();
    pretok::Split(static_cast<pretok::Kind>(t.pre), cps, cb, ce, &pieces);
    for (auto [b, e] : pieces) {
      std::string bytes(text.substr(offs[b], offs[e] - offs[b]));
      auto it = cache.find(bytes);
      if (it == cache.end()) {
        std::vector<int32_t> w;
        EncodeWord(t, bytes, &w);
        it = cache.emplace(std::move(bytes), std::move(w)).first;
      }
      ids.insert(ids.end(), it->second.begin(), it->second.end());
    }
  };
  size_t frag = 0;  // codepoint index where the current plain-text fragment starts
  if (parse_special && !t.specials.empty()) {
    for (size_t i = 0; i < cps.size(); ++i) {
      const std::string_view rest = text.substr(offs[i]);
      for (const auto& [s, id] : t.specials) {
        if (rest.substr(0, s.size()) != s) continue;
        // Specials are whole UTF-8 strings, so their end is a codepoint boundary.
        const size_t end_byte = offs[i] + s.size();
        size_t j = i;
        while (offs[j] < end_byte) ++j;
        encode_text(frag, i);
        ids.push_back(id);
        frag = j;
        i = j - 1;
        break;
      }
    }
  }
  encode_text(frag, cps.size());
  return ids;
}

std::string Tokenizer::Decode(std::span<const int32_t> ids, bool special) const {
  const Impl& t = *impl_;
  std::string out;
  std::vector<uint32_t> cps;
  std::vector<size_t> offs;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) continue;
    const std::string& s = t.data.tokens[id];
    const int32_t type = t.data.token_types.empty() ? 1 : t.data.token_types[id];
    if (type == static_cast<int32_t>(TokenType::kControl)) {
      if (special) out += s;
      continue;
    }
    if (type == static_cast<int32_t>(TokenType::kUserDefined) ||
        !unicode::DecodeUtf8(s, "token", &cps, &offs).ok()) {
      out += s;
      continue;
    }
    for (uint32_t c : cps) {
      auto b = t.cp_to_byte.find(c);
      if (b != t.cp_to_byte.end()) {
        out.push_back(static_cast<char>(b->second));
      } else {
        unicode::AppendUtf8(c, &out);
      }
    }
  }
  return out;
}

}  // namespace sparq
