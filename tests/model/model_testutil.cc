#include "model/model_testutil.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace sparq::testing {

std::string SmolLmPath() {
  std::string path;
  if (const char* m = std::getenv("SPARQ_MODEL"); m != nullptr && *m) {
    path = m;
  } else {
    std::string cache;
    if (const char* c = std::getenv("SPARQ_CACHE"); c != nullptr && *c) {
      cache = c;
    } else if (const char* h = std::getenv("HOME"); h != nullptr) {
      cache = std::string(h) + "/.cache/sparq";
    }
    path = cache + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  }
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? path : std::string();
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

std::string SharedText(const std::string& name) {
  return std::string(SPARQ_SHARED_DIR) + "/data/text/" + name;
}

LlamaModel* NewSmolLm() {
  const std::string path = SmolLmPath();
  if (path.empty()) return nullptr;
  auto m = LlamaModel::FromGguf(path);
  if (!m.ok()) {
    ADD_FAILURE() << m.status().ToString();
    return nullptr;
  }
  return new LlamaModel(std::move(*m));
}

}  // namespace sparq::testing
