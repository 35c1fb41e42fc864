// Shared helpers of the model tests: where the SmolLM2 GGUF is, reading reference files.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "sparq/model.h"

namespace sparq::testing {

// $SPARQ_MODEL, else ${SPARQ_CACHE:-$HOME/.cache/sparq}/models/SmolLM2-135M-Instruct.Q4_1.gguf;
// empty if the file does not exist (tests then GTEST_SKIP with kModelMissing).
std::string SmolLmPath();
inline constexpr const char* kModelMissing =
    "SmolLM2-135M-Instruct.Q4_1.gguf not found: run scripts/fetch_model.sh or set SPARQ_MODEL";
// The SmolLM2 GGUF loaded as the dense model (for fixtures' SetUpTestSuite; the caller owns it).
// Null if the file is missing (tests skip) or does not load (a test failure is recorded).
LlamaModel* NewSmolLm();

// Whole file as bytes ("" if missing).
std::string ReadFileOrEmpty(const std::string& path);
// tests/model/data/<name> parsed as JSON (aborts the test program if it is missing: a repo file).
nlohmann::json LoadTestJson(const std::string& name);
// ../shared/data/text/<name>.
std::string SharedText(const std::string& name);

}  // namespace sparq::testing
