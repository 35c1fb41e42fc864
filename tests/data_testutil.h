// Files the tests need that a checkout may lack: the SmolLM2 GGUF (fetched into the cache by
// scripts/fetch_model.sh), the texts of data/text/, and the Python interpreter of .venv/.
//
// Policy (a green run must mean the tests ran): a missing file is a test FAILURE whose message
// names the file and how to get it. Only SPARQ_ALLOW_SKIP=1 turns it into a skip, and never under
// CI=true. Every test that needs such a file checks it with SPARQ_REQUIRE_FILE (in the test body
// or the fixture's SetUp, where it can return) before touching it.
#pragma once

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <string>
#include <string_view>

namespace sparq::testing {

inline bool EnvIs(const char* name, std::string_view value) {
  const char* v = std::getenv(name);
  return v != nullptr && value == v;
}

// SPARQ_ALLOW_SKIP=1 and not CI=true.
inline bool MissingFilesSkip() { return EnvIs("SPARQ_ALLOW_SKIP", "1") && !EnvIs("CI", "true"); }

inline bool FileExists(const std::string& path) {
  struct stat st;
  return !path.empty() && ::stat(path.c_str(), &st) == 0;
}

// The failure (or skip) message for a missing prerequisite, with the policy that applies.
inline std::string MissingMessage(const std::string& what_and_how) {
  if (MissingFilesSkip()) return what_and_how;
  return what_and_how + (EnvIs("CI", "true")
                             ? " (CI=true: never skipped)"
                             : " (SPARQ_ALLOW_SKIP=1 turns this failure into a skip)");
}

// The expected location of SmolLM2-135M-Instruct (Q4_1 GGUF): $SPARQ_MODEL (or, as before,
// $SPARQ_SMOLLM2_GGUF), else ${SPARQ_CACHE:-$HOME/.cache/sparq}/models/<name>. Existing or not.
inline std::string SmolLmModelPath() {
  for (const char* var : {"SPARQ_MODEL", "SPARQ_SMOLLM2_GGUF"}) {
    if (const char* p = std::getenv(var); p != nullptr && *p) return p;
  }
  std::string cache;
  if (const char* c = std::getenv("SPARQ_CACHE"); c != nullptr && *c) {
    cache = c;
  } else {
    const char* h = std::getenv("HOME");
    cache = std::string(h != nullptr && *h ? h : "/root") + "/.cache/sparq";
  }
  return cache + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}
inline constexpr const char* kGetModel =
    "run scripts/fetch_model.sh (it downloads the file into ${SPARQ_CACHE:-~/.cache/sparq}/models/)"
    " or set SPARQ_MODEL to its path";

// data/text/<name> of this checkout.
// (Appended in place: GCC 12 warns -Warray-bounds, wrongly, on the chain of operator+ here.)
inline std::string DataText(const std::string& name) {
  std::string path = SPARQ_DATA_DIR;
  path += "/text/";
  path += name;
  return path;
}
inline constexpr const char* kGetText =
    "it is part of the repository (data/text/, see data/text/SOURCES.md): restore it with "
    "`git checkout -- data/text`";

// The interpreter for Python helpers: $SPARQ_PYTHON, else the repo's .venv/bin/python
// (scripts/install_deps.sh makes it), else python3.
inline std::string PythonInterpreter() {
  if (const char* p = std::getenv("SPARQ_PYTHON"); p != nullptr && *p) return p;
  const std::string venv = std::string(SPARQ_SOURCE_DIR) + "/.venv/bin/python";
  return FileExists(venv) ? venv : "python3";
}

}  // namespace sparq::testing

// Unless `present`, fails (or, under the opt-out, skips) the current test and returns from the
// enclosing void function; `what_and_how` names what is missing and how a user gets it.
#define SPARQ_REQUIRE(present, what_and_how)                                             \
  do {                                                                                   \
    if (!(present)) {                                                                    \
      const std::string sparq_missing_ = ::sparq::testing::MissingMessage(what_and_how); \
      if (::sparq::testing::MissingFilesSkip()) GTEST_SKIP() << sparq_missing_;          \
      FAIL() << sparq_missing_;                                                          \
    }                                                                                    \
  } while (0)

// The same for a file; `how_to_get` says how a user gets it.
#define SPARQ_REQUIRE_FILE(path, how_to_get)                       \
  do {                                                             \
    const std::string sparq_path_ = (path);                        \
    SPARQ_REQUIRE(::sparq::testing::FileExists(sparq_path_),       \
                  "missing " + sparq_path_ + ": " + (how_to_get)); \
  } while (0)

// The two requirements most tests have.
#define SPARQ_REQUIRE_MODEL() \
  SPARQ_REQUIRE_FILE(::sparq::testing::SmolLmModelPath(), ::sparq::testing::kGetModel)
#define SPARQ_REQUIRE_TEXT(name) \
  SPARQ_REQUIRE_FILE(::sparq::testing::DataText(name), ::sparq::testing::kGetText)
