// ChatTemplate (sparq/chat.h): recognises a Jinja chat template by its structure and renders its
// family in C++.
//
// Recognition reads the template as Hugging Face's renderer does (jinja2 with trim_blocks and
// lstrip_blocks): it splits it into text and tags, applies the whitespace rules to the text
// between tags (text that survives would be emitted: not a known structure), lexes each tag, and
// collects what the expression tags emit, in order: string literals, the loop message's role and
// content, bos_token, each with the blocks it sits in. A ChatML template is one whose emissions
// are, after adjacent literals are joined,
//   [bos_token, outside the loop]
//   ["<|im_start|>system\n" TEXT "<|im_end|>\n", under an `if` that tests the role against
//    'system' (and `loop.first` when inside the loop)]
//   "<|im_start|>" role "\n" content "<|im_end|>\n"   (directly inside `for M in messages`)
//   "<|im_start|>assistant\n"                          (under `if add_generation_prompt`)
// and whose tags use only the names and statements that layout needs.
#include <cctype>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "sparq/chat.h"

namespace sparq {
namespace {

constexpr std::string_view kImStart = "<|im_start|>";
constexpr std::string_view kImEnd = "<|im_end|>";

Status NotRecognised(const std::string& why) {
  return Unsupported("chat template not recognised: " + why);
}

struct Tok {
  enum Kind { kIdent, kString, kNumber, kOp } kind;
  std::string text;  // kString: the unescaped value
};

struct Tag {
  char type;  // '{' expression, '%' statement, '#' comment
  bool trim_before = false, trim_after = false, keep_lstrip = false;
  std::vector<Tok> toks;
};

// A Jinja string literal starting at s[*i] (a quote); Python's escapes.
Result<std::string> LexString(std::string_view s, size_t* i) {
  const char q = s[*i];
  std::string out;
  for (size_t j = *i + 1; j < s.size(); ++j) {
    const char c = s[j];
    if (c == q) {
      *i = j + 1;
      return out;
    }
    if (c != '\\') {
      out += c;
      continue;
    }
    if (++j == s.size()) break;
    switch (s[j]) {
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'r': out += '\r'; break;
      case '\\': case '\'': case '"': out += s[j]; break;
      default: return NotRecognised(std::string("string escape \\") + s[j]);
    }
  }
  return NotRecognised("unterminated string literal");
}

// The tokens of a tag's code (between its delimiters and whitespace-control marks).
Result<std::vector<Tok>> LexCode(std::string_view s) {
  std::vector<Tok> out;
  size_t i = 0;
  auto ident = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  while (i < s.size()) {
    const char c = s[i];
    if (std::isspace(static_cast<unsigned char>(c))) {
      ++i;
    } else if (c == '\'' || c == '"') {
      SPARQ_ASSIGN_OR_RETURN(std::string v, LexString(s, &i));
      out.push_back({Tok::kString, std::move(v)});
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t j = i;
      while (j < s.size() && ident(s[j])) ++j;
      out.push_back({Tok::kNumber, std::string(s.substr(i, j - i))});
      i = j;
    } else if (ident(c)) {
      size_t j = i;
      while (j < s.size() && ident(s[j])) ++j;
      out.push_back({Tok::kIdent, std::string(s.substr(i, j - i))});
      i = j;
    } else if (s.substr(i, 2) == "==" || s.substr(i, 2) == "!=") {
      out.push_back({Tok::kOp, std::string(s.substr(i, 2))});
      i += 2;
    } else if (std::string_view("+~[]().|=,:-*/%<>!{}").find(c) != std::string_view::npos) {
      out.push_back({Tok::kOp, std::string(1, c)});
      ++i;
    } else {
      return NotRecognised(std::string("operator '") + c + "'");
    }
  }
  return out;
}

// Where a tag's `close` delimiter is, from `from` on; in code, quotes are skipped over.
size_t FindClose(std::string_view t, size_t from, std::string_view close, bool code) {
  for (size_t i = from; i + close.size() <= t.size(); ++i) {
    if (code && (t[i] == '\'' || t[i] == '"')) {
      size_t j = i + 1;
      while (j < t.size() && t[j] != t[i]) j += t[j] == '\\' ? 2 : 1;
      if (j >= t.size()) return std::string_view::npos;
      i = j;
      continue;
    }
    if (t.compare(i, close.size(), close) == 0) return i;
  }
  return std::string_view::npos;
}

bool IsBlank(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// Text between two tags after Jinja's whitespace rules (trim_blocks, lstrip_blocks, '-' marks):
// what a renderer would emit for it.
std::string SurvivingText(std::string_view d, const Tag* prev, const Tag* next, bool line_start) {
  std::string s(d);
  if (prev != nullptr && prev->trim_after) {
    size_t i = 0;
    while (i < s.size() && IsBlank(s[i])) ++i;
    s.erase(0, i);
    line_start = false;
  } else if (prev != nullptr && prev->type != '{') {  // trim_blocks: the newline after a block
    if (s.rfind("\r\n", 0) == 0) {
      s.erase(0, 2), line_start = true;
    } else if (!s.empty() && s[0] == '\n') {
      s.erase(0, 1), line_start = true;
    }
  }
  if (next != nullptr && next->trim_before) {
    while (!s.empty() && IsBlank(s.back())) s.pop_back();
  } else if (next != nullptr && next->type != '{' && !next->keep_lstrip) {
    // lstrip_blocks: spaces and tabs from the start of the line up to a block tag.
    size_t j = s.size();
    while (j > 0 && (s[j - 1] == ' ' || s[j - 1] == '\t')) --j;
    if ((j > 0 && s[j - 1] == '\n') || (j == 0 && line_start)) s.erase(j);
  }
  return s;
}

Result<std::vector<Tag>> SplitTags(std::string_view t) {
  std::vector<Tag> tags;
  std::vector<std::string_view> text;  // text[i] precedes tags[i]; one more after the last
  size_t pos = 0;
  while (true) {
    size_t open = std::string_view::npos;
    for (size_t i = pos; i + 1 < t.size(); ++i) {
      if (t[i] == '{' && (t[i + 1] == '{' || t[i + 1] == '%' || t[i + 1] == '#')) {
        open = i;
        break;
      }
    }
    text.push_back(t.substr(pos, open == std::string_view::npos ? std::string_view::npos : open - pos));
    if (open == std::string_view::npos) break;
    Tag tag;
    tag.type = t[open + 1];
    size_t body = open + 2;
    if (body < t.size() && (t[body] == '-' || t[body] == '+')) {
      (t[body] == '-' ? tag.trim_before : tag.keep_lstrip) = true;
      ++body;
    }
    const std::string close = tag.type == '{' ? "}}" : std::string(1, tag.type) + "}";
    const size_t end = FindClose(t, body, close, tag.type != '#');
    if (end == std::string_view::npos) return NotRecognised("unterminated tag");
    size_t body_end = end;
    if (body_end > body && t[body_end - 1] == '-') tag.trim_after = true, --body_end;
    if (tag.type != '#') {
      SPARQ_ASSIGN_OR_RETURN(tag.toks, LexCode(t.substr(body, body_end - body)));
    }
    tags.push_back(std::move(tag));
    pos = end + close.size();
  }
  for (size_t i = 0; i < text.size(); ++i) {
    const Tag* prev = i > 0 ? &tags[i - 1] : nullptr;
    const Tag* next = i < tags.size() ? &tags[i] : nullptr;
    if (!SurvivingText(text[i], prev, next, i == 0).empty()) {
      return NotRecognised("it emits text outside its tags");
    }
  }
  return tags;
}

// What an expression tag emits, with the blocks around it.
struct Item {
  enum Kind { kLiteral, kRole, kContent, kBos } kind;
  std::string text;
  bool in_loop = false;
  bool under_if = false;
  bool if_generation = false;  // the innermost if is `if add_generation_prompt`
  bool if_not_system = false;  // ... tests a role != 'system'
  bool if_first = false;       // ... tests loop.first
};

bool Is(const Tok& t, Tok::Kind k, std::string_view text) { return t.kind == k && t.text == text; }

struct Block {
  bool loop;
  std::vector<Tok> cond;
};

// The items of one expression tag: terms joined by '+' or '~'; a term is a string literal,
// bos_token, or the loop variable's role / content (`m['role']`, `m.role`).
Status ExpressionItems(const std::vector<Tok>& t, const std::string& var, Item ctx,
                       std::vector<Item>* out) {
  size_t i = 0;
  while (true) {
    if (i >= t.size()) return NotRecognised("an empty expression");
    Item it = ctx;
    if (t[i].kind == Tok::kString) {
      it.kind = Item::kLiteral, it.text = t[i].text, i += 1;
    } else if (Is(t[i], Tok::kIdent, "bos_token")) {
      it.kind = Item::kBos, i += 1;
    } else if (!var.empty() && Is(t[i], Tok::kIdent, var)) {
      std::string field;
      if (i + 3 < t.size() && Is(t[i + 1], Tok::kOp, "[") && t[i + 2].kind == Tok::kString &&
          Is(t[i + 3], Tok::kOp, "]")) {
        field = t[i + 2].text, i += 4;
      } else if (i + 2 < t.size() && Is(t[i + 1], Tok::kOp, ".") && t[i + 2].kind == Tok::kIdent) {
        field = t[i + 2].text, i += 3;
      } else {
        return NotRecognised("'" + var + "' used other than as " + var + "['role'] / ['content']");
      }
      if (field != "role" && field != "content") return NotRecognised("message field '" + field + "'");
      it.kind = field == "role" ? Item::kRole : Item::kContent;
    } else {
      return NotRecognised("'" + t[i].text + "' in an expression");
    }
    out->push_back(std::move(it));
    if (i == t.size()) return Status::Ok();
    if (!Is(t[i], Tok::kOp, "+") && !Is(t[i], Tok::kOp, "~")) {
      return NotRecognised(t[i].text == "|" ? "a filter ('|')" : "'" + t[i].text + "' in an expression");
    }
    ++i;
  }
}

// Names a condition may use (the loop variable too).
const std::set<std::string>& ConditionNames() {
  static const std::set<std::string> names = {"messages", "loop", "first", "add_generation_prompt",
                                               "role", "and", "not"};
  return names;
}

Result<std::vector<Item>> Emissions(const std::vector<Tag>& tags) {
  std::vector<Item> items;
  std::vector<Block> open;
  std::string var;  // the loop variable while inside the loop
  for (const Tag& tag : tags) {
    if (tag.type == '#') continue;
    const std::vector<Tok>& t = tag.toks;
    if (tag.type == '{') {
      Item ctx{Item::kLiteral, ""};
      for (const Block& b : open) ctx.in_loop |= b.loop;
      if (!open.empty() && !open.back().loop) {
        const std::vector<Tok>& c = open.back().cond;
        ctx.under_if = true;
        ctx.if_generation = c.size() == 1 && Is(c[0], Tok::kIdent, "add_generation_prompt");
        for (size_t i = 0; i + 1 < c.size(); ++i) {
          ctx.if_not_system |= Is(c[i], Tok::kOp, "!=") && Is(c[i + 1], Tok::kString, "system");
          ctx.if_first |= Is(c[i], Tok::kIdent, "loop") && Is(c[i + 1], Tok::kOp, ".") &&
                          i + 2 < c.size() && Is(c[i + 2], Tok::kIdent, "first");
        }
      }
      SPARQ_RETURN_IF_ERROR(ExpressionItems(t, var, ctx, &items));
      continue;
    }
    if (t.empty() || t[0].kind != Tok::kIdent) return NotRecognised("an empty statement");
    const std::string& kw = t[0].text;
    if (kw == "for") {
      if (t.size() != 4 || t[1].kind != Tok::kIdent || !Is(t[2], Tok::kIdent, "in") ||
          !Is(t[3], Tok::kIdent, "messages") || !var.empty()) {
        return NotRecognised("a loop other than `for message in messages`");
      }
      var = t[1].text;
      open.push_back({true, {}});
    } else if (kw == "if") {
      std::vector<Tok> cond(t.begin() + 1, t.end());
      for (const Tok& c : cond) {
        if (c.kind == Tok::kIdent && !ConditionNames().count(c.text) && c.text != var) {
          return NotRecognised("'" + c.text + "' in a condition");
        }
        if (c.kind == Tok::kOp && c.text != "==" && c.text != "!=" && c.text != "[" &&
            c.text != "]" && c.text != "." && c.text != "(" && c.text != ")") {
          return NotRecognised(c.text == "|" ? "a filter ('|')" : "'" + c.text + "' in a condition");
        }
      }
      open.push_back({false, std::move(cond)});
    } else if (kw == "endfor" || kw == "endif") {
      if (t.size() != 1 || open.empty() || open.back().loop != (kw == "endfor")) {
        return NotRecognised("unbalanced {% " + kw + " %}");
      }
      if (open.back().loop) var.clear();
      open.pop_back();
    } else {
      return NotRecognised("{% " + kw + " %}");
    }
  }
  if (!open.empty()) return NotRecognised("an unclosed block");
  // Adjacent literals in the same blocks are one emission.
  std::vector<Item> joined;
  for (Item& it : items) {
    if (!joined.empty() && it.kind == Item::kLiteral && joined.back().kind == Item::kLiteral &&
        it.in_loop == joined.back().in_loop && it.under_if == joined.back().under_if &&
        it.if_generation == joined.back().if_generation &&
        it.if_not_system == joined.back().if_not_system && it.if_first == joined.back().if_first) {
      joined.back().text += it.text;
    } else {
      joined.push_back(std::move(it));
    }
  }
  return joined;
}

}  // namespace

Result<ChatTemplate> ChatTemplate::Recognize(std::string_view jinja, std::string_view bos_token) {
  if (jinja.find(kImStart) == std::string_view::npos || jinja.find(kImEnd) == std::string_view::npos) {
    return NotRecognised("no family's markers (ChatML: <|im_start|>, <|im_end|>)");
  }
  SPARQ_ASSIGN_OR_RETURN(std::vector<Tag> tags, SplitTags(jinja));
  SPARQ_ASSIGN_OR_RETURN(std::vector<Item> items, Emissions(tags));
  ChatTemplate ct;
  ct.family_ = "chatml";
  ct.bos_token_ = bos_token;
  size_t i = 0;
  auto at = [&](Item::Kind k, std::string_view text = {}) {
    return i < items.size() && items[i].kind == k && (k != Item::kLiteral || items[i].text == text);
  };
  if (at(Item::kBos)) {
    if (items[i].in_loop || items[i].under_if) return NotRecognised("bos_token inside a block");
    ct.emits_bos_ = true, ++i;
  }
  const std::string sys_head = std::string(kImStart) + "system\n";
  const std::string end_nl = std::string(kImEnd) + "\n";
  if (i < items.size() && items[i].kind == Item::kLiteral && items[i].text.rfind(sys_head, 0) == 0) {
    const Item& s = items[i];
    if (!s.if_not_system || (s.in_loop && !s.if_first)) {
      return NotRecognised("a system message not conditioned on the first message's role");
    }
    const std::string& x = s.text;
    if (x.size() < sys_head.size() + end_nl.size() ||
        x.compare(x.size() - end_nl.size(), end_nl.size(), end_nl) != 0) {
      return NotRecognised("a default system message not closed by <|im_end|>\\n");
    }
    ct.default_system_ = x.substr(sys_head.size(), x.size() - sys_head.size() - end_nl.size());
    if (ct.default_system_.find("<|") != std::string::npos) {
      return NotRecognised("markers inside the default system message");
    }
    ++i;
  }
  // The message, directly inside the loop.
  const std::vector<std::pair<Item::Kind, std::string>> message = {
      {Item::kLiteral, std::string(kImStart)}, {Item::kRole, ""}, {Item::kLiteral, "\n"},
      {Item::kContent, ""}, {Item::kLiteral, end_nl}};
  for (const auto& [kind, text] : message) {
    if (!at(kind, text)) {
      return NotRecognised("messages not laid out as <|im_start|>ROLE\\nCONTENT<|im_end|>\\n");
    }
    if (!items[i].in_loop || items[i].under_if) {
      return NotRecognised("the message layout is not directly inside the loop");
    }
    ++i;
  }
  if (!at(Item::kLiteral, std::string(kImStart) + "assistant\n") || items[i].in_loop ||
      !items[i].if_generation) {
    return NotRecognised("no <|im_start|>assistant\\n under `if add_generation_prompt`");
  }
  if (++i != items.size()) return NotRecognised("it emits more after the generation prompt");
  return ct;
}

std::string ChatTemplate::Describe() const {
  std::string d = family_;
  if (emits_bos_) d += ", BOS first";
  if (!default_system_.empty()) d += ", default system message \"" + default_system_ + "\"";
  return d;
}

std::string ChatTemplate::Render(std::span<const ChatMessage> messages,
                                 bool add_generation_prompt) const {
  std::string out;
  if (emits_bos_) out += bos_token_;
  if (!default_system_.empty() && !messages.empty() && messages[0].role != "system") {
    out += std::string(kImStart) + "system\n" + default_system_ + std::string(kImEnd) + "\n";
  }
  for (const ChatMessage& m : messages) {
    out += std::string(kImStart) + m.role + "\n" + m.content + std::string(kImEnd) + "\n";
  }
  if (add_generation_prompt) out += std::string(kImStart) + "assistant\n";
  return out;
}

}  // namespace sparq
