// `--json [FILE]`, one convention for every command:
//   --json           print the JSON document on stdout, and nothing else there
//   --json FILE      write it to FILE atomically (temporary file + rename); the command's usual
//                    output is printed as without --json
//   --json -         the same as a bare --json
// A bare --json takes no value from a following word that starts with '-', so `--json --threads
// 2` works; a positional argument right after a bare --json would be read as FILE: put --json
// last, or after the positionals.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "sparq/status.h"

namespace sparq::cli {

class JsonOutput {
 public:
  // Adds --json [FILE] to `sub`; `what` says what the document holds (for --help).
  void Register(CLI::App& sub, const std::string& what);
  bool requested() const { return opt_ != nullptr && opt_->count() > 0; }
  // Bare --json (or --json -): stdout is the document's alone.
  bool to_stdout() const { return requested() && (path_.empty() || path_ == "-"); }
  const std::string& path() const { return path_; }
  // `doc` and a newline to stdout (to_stdout) or to the file; nothing when not requested.
  Status Write(const std::string& doc) const;

 private:
  friend class StdoutToStderr;
  CLI::Option* opt_ = nullptr;
  std::string path_;
  int stdout_fd_ = 1;  // where to_stdout() writes; StdoutToStderr keeps the real stdout here
};

// For a command whose table goes to stdout as it runs (bench kernels): under a bare --json, the
// table goes to stderr until this object is destroyed, and JsonOutput::Write still reaches the
// real stdout. Does nothing otherwise.
class StdoutToStderr {
 public:
  explicit StdoutToStderr(JsonOutput* json);
  ~StdoutToStderr();
  StdoutToStderr(const StdoutToStderr&) = delete;
  StdoutToStderr& operator=(const StdoutToStderr&) = delete;

 private:
  JsonOutput* json_ = nullptr;
  int saved_ = -1;
};

}  // namespace sparq::cli
