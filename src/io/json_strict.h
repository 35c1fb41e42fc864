// Strict JSON parsing for file headers: bounded nesting and duplicate keys reported (nlohmann
// alone silently keeps the last of two equal keys). Internal to src/io.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>

#include "sparq/status.h"

namespace sparq::io {

inline constexpr int kMaxJsonDepth = 64;  // sparq's documents nest 3 deep; this only stops abuse

// `what` prefixes error messages ("model.safetensors: header").
Result<nlohmann::json> ParseStrictJson(const char* p, size_t n, const std::string& what);

}  // namespace sparq::io
