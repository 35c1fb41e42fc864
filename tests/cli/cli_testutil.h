// Running the `sparq` executable from the CLI tests.
#pragma once

#include <fstream>
#include <sstream>
#include <string>

#include "io/io_testutil.h"

namespace sparq::testing {

inline std::string Cli() { return SPARQ_CLI_PATH; }

inline std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The CLI with stdout and stderr captured apart; returns the exit code.
inline int RunSplit(const std::string& args, std::string* out, std::string* err) {
  const std::string o = TempDir() + "/stdout.txt", e = TempDir() + "/stderr.txt";
  std::string ignored;
  const int rc = RunCommand(Cli() + " " + args + " >" + o + " 2>" + e, &ignored);
  *out = Slurp(o);
  *err = Slurp(e);
  return rc;
}

}  // namespace sparq::testing
