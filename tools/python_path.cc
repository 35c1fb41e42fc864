#include "tools/python_path.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

namespace sparq::cli {
namespace {

// Parents of the executable's folder searched by FindNearExecutable: build/<preset>/sparq is two
// below the repository root, and no higher, so a folder beside the checkout is never used.
constexpr int kParentLevels = 2;

std::string ExecutableDir() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  std::string path(buf, static_cast<size_t>(n));
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace

std::string FindNearExecutable(const std::string& relative_path) {
  std::string dir = ExecutableDir();
  for (int level = 0; level <= kParentLevels && !dir.empty(); ++level) {
    const std::string candidate = dir + "/" + relative_path;
    if (Exists(candidate)) return candidate;
    const size_t slash = dir.find_last_of('/');
    dir = slash == std::string::npos || slash == 0 ? "" : dir.substr(0, slash);
  }
  return "";
}

std::string PythonInterpreter() {
  if (const char* p = std::getenv("SPARQ_PYTHON"); p != nullptr && *p) return p;
  if (std::string venv = FindNearExecutable(".venv/bin/python"); !venv.empty()) return venv;
  return "python3";
}

std::string PythonCommand() {
  std::string out = "'";
  for (char c : PythonInterpreter()) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace sparq::cli
