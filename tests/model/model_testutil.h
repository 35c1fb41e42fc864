// Shared helpers of the model tests: where the SmolLM2 GGUF is, reading reference files.
#pragma once

#include <gtest/gtest.h>
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
// The same with the GGUF's Q4_1 / Q8_0 layers run as stored (GgufValues::kAsStored).
LlamaModel* NewSmolLmAsStored();

// A fixture whose tests share one dense SmolLM2, `model_`, loaded once per suite (CRTP: one
// model per derived suite); a test fails when the file is missing (SPARQ_REQUIRE_MODEL).
template <class Suite>
class SharedSmolLm : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { model_ = NewSmolLm(); }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  void SetUp() override {
    SPARQ_REQUIRE_MODEL();
    ASSERT_NE(model_, nullptr);
  }
  static inline LlamaModel* model_ = nullptr;
};

// A fixture with both loads of SmolLM2's GGUF, `f32_` (dense) and `stored_` (Q4_1 / Q8_0 run as
// stored), and its path, `path_`.
template <class Suite>
class SharedSmolLmPair : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    path_ = SmolLmPath();
    if (path_.empty()) return;
    f32_ = NewSmolLm();
    stored_ = NewSmolLmAsStored();
  }
  static void TearDownTestSuite() {
    delete f32_;
    delete stored_;
    f32_ = stored_ = nullptr;
  }
  void SetUp() override {
    SPARQ_REQUIRE_MODEL();
    ASSERT_NE(f32_, nullptr);
    ASSERT_NE(stored_, nullptr);
  }
  static inline std::string path_;
  static inline LlamaModel* f32_ = nullptr;
  static inline LlamaModel* stored_ = nullptr;
};

// This machine's KernelConfig, built once (FromMachine(): under SPARQ_MAX_ISA the capped target,
// since test_main disables Highway's targets above it first); what the model tests load with.
const KernelConfig& MachineConfig();

// Whole file as bytes ("" if missing).
std::string ReadFileOrEmpty(const std::string& path);
// tests/model/data/<name> parsed as JSON (aborts the test program if it is missing: a repo file).
nlohmann::json LoadTestJson(const std::string& name);

}  // namespace sparq::testing
