// What the `sparq bench` subcommands share: the clock, medians, and their comma-separated lists.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "sparq/pattern.h"
#include "sparq/status.h"

namespace sparq::cli {

inline double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// "a,b,c" -> items; numbers must be positive integers. Empty items are skipped; an empty list is
// an error naming the flag.
template <typename T>
Result<std::vector<T>> ParseList(const std::string& s, const char* what) {
  std::vector<T> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    if constexpr (std::is_same_v<T, std::string>) {
      out.push_back(item);
    } else {
      char* end = nullptr;
      const long long v = std::strtoll(item.c_str(), &end, 10);
      if (*end || v <= 0) return InvalidInput(std::string(what) + ": bad value '" + item + "'");
      out.push_back(static_cast<T>(v));
    }
  }
  if (out.empty()) return InvalidInput(std::string(what) + ": empty list");
  return out;
}

// "MxK,..." (each side in [1, 2^20]) for --shapes.
inline Result<std::vector<std::pair<int64_t, int64_t>>> ParseShapes(const std::string& s) {
  SPARQ_ASSIGN_OR_RETURN(auto list, ParseList<std::string>(s, "--shapes"));
  std::vector<std::pair<int64_t, int64_t>> shapes;
  for (const auto& item : list) {
    long long m = 0, k = 0;
    char x = 0;
    if (std::sscanf(item.c_str(), "%lld%c%lld", &m, &x, &k) != 3 || x != 'x' || m <= 0 || k <= 0 ||
        m > (1 << 20) || k > (1 << 20)) {
      return InvalidInput("--shapes: bad shape '" + item + "' (want MxK, e.g. 4096x4096)");
    }
    shapes.emplace_back(m, k);
  }
  return shapes;
}

// "2:4,unstructured:0.9,..." for --patterns.
inline Result<std::vector<Pattern>> ParsePatterns(const std::string& s) {
  SPARQ_ASSIGN_OR_RETURN(auto list, ParseList<std::string>(s, "--patterns"));
  std::vector<Pattern> patterns;
  for (const auto& item : list) {
    auto p = Pattern::Parse(item);
    if (!p.ok()) return p.status().WithContext("--patterns");
    patterns.push_back(*p);
  }
  return patterns;
}

}  // namespace sparq::cli
