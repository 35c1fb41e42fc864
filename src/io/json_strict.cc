#include "src/io/json_strict.h"

#include <algorithm>
#include <set>
#include <vector>

namespace sparq::io {

namespace {
// Deepest [ / { nesting outside strings; cheap guard before handing the text to nlohmann.
int JsonDepth(const char* p, size_t n) {
  int depth = 0, max_depth = 0;
  bool in_str = false;
  for (size_t i = 0; i < n; ++i) {
    const char c = p[i];
    if (in_str) {
      if (c == '\\') ++i;
      else if (c == '"') in_str = false;
    } else if (c == '"') {
      in_str = true;
    } else if (c == '[' || c == '{') {
      max_depth = std::max(max_depth, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return max_depth;
}
}  // namespace

Result<nlohmann::json> ParseStrictJson(const char* p, size_t n, const std::string& what) {
  using json = nlohmann::json;
  if (JsonDepth(p, n) > kMaxJsonDepth) {
    return InvalidInput(what + " JSON nests deeper than " + std::to_string(kMaxJsonDepth));
  }
  std::vector<std::set<std::string>> keys;
  std::string duplicate;
  json::parser_callback_t cb = [&](int /*depth*/, json::parse_event_t ev, json& parsed) {
    switch (ev) {
      case json::parse_event_t::object_start: keys.emplace_back(); break;
      case json::parse_event_t::object_end:
        if (!keys.empty()) keys.pop_back();
        break;
      case json::parse_event_t::key:
        if (!keys.empty() && parsed.is_string()) {
          const auto& k = parsed.get_ref<const std::string&>();
          if (!keys.back().insert(k).second && duplicate.empty()) duplicate = k;
        }
        break;
      default: break;
    }
    return true;
  };
  json j;
  try {
    j = json::parse(p, p + n, cb, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const json::exception& e) {
    return InvalidInput(what + " is not valid JSON: " + e.what());
  }
  if (!duplicate.empty()) return InvalidInput(what + ": duplicate key '" + duplicate + "'");
  return j;
}

}  // namespace sparq::io
