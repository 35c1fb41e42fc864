#include "model/model_testutil.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace sparq::testing {

std::string SmolLmPath() {
  const std::string path = SmolLmModelPath();
  return FileExists(path) ? path : std::string();
}

std::string ReadFileOrEmpty(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

nlohmann::json LoadTestJson(const std::string& name) {
  const std::string path = std::string(SPARQ_SOURCE_DIR) + "/tests/model/data/" + name;
  const std::string s = ReadFileOrEmpty(path);
  if (s.empty()) {
    std::fprintf(stderr, "missing test data %s\n", path.c_str());
    std::abort();
  }
  return nlohmann::json::parse(s);
}

const KernelConfig& MachineConfig() {
  static const KernelConfig cfg = KernelConfig::FromMachine().value();
  return cfg;
}

LlamaModel* NewSmolLm() {
  const std::string path = SmolLmPath();
  if (path.empty()) return nullptr;
  auto m = LlamaModel::FromGguf(path, MachineConfig());
  if (!m.ok()) {
    ADD_FAILURE() << m.status().ToString();
    return nullptr;
  }
  return new LlamaModel(std::move(*m));
}

LlamaModel* NewSmolLmAsStored() {
  const std::string path = SmolLmPath();
  if (path.empty()) return nullptr;
  auto m = LlamaModel::Load(path, MachineConfig(), {.gguf_values = GgufValues::kAsStored});
  if (!m.ok()) {
    ADD_FAILURE() << m.status().ToString();
    return nullptr;
  }
  return new LlamaModel(std::move(*m));
}

}  // namespace sparq::testing
