// Shared helpers of the model tests: where the SmolLM2 GGUF is, reading reference files.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "data_testutil.h"
#include "sparq/model.h"

namespace sparq::testing {

// SmolLmModelPath() (data_testutil.h) if the file exists, else empty; a test that needs it starts
// with SPARQ_REQUIRE_MODEL().
std::string SmolLmPath();
// The SmolLM2 GGUF loaded as the dense model (for fixtures' SetUpTestSuite; the caller owns it).
// Null if the file is missing (SPARQ_REQUIRE_MODEL in SetUp reports it) or does not load (a test
// failure is recorded).
LlamaModel* NewSmolLm();

// This machine's KernelConfig, built once (FromMachine(): under SPARQ_MAX_ISA the capped target,
// since test_main disables Highway's targets above it first); what the model tests load with.
const KernelConfig& MachineConfig();

// Whole file as bytes ("" if missing).
std::string ReadFileOrEmpty(const std::string& path);
// tests/model/data/<name> parsed as JSON (aborts the test program if it is missing: a repo file).
nlohmann::json LoadTestJson(const std::string& name);

}  // namespace sparq::testing
