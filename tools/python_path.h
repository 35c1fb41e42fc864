// Where the `sparq` command line finds the files of its checkout (the Python tools of .venv/, the
// texts of data/text/) when it runs from a build folder, and which Python it runs its helper
// scripts with (peers, plots).
#pragma once

#include <string>

namespace sparq::cli {

// The first existing `dir/relative_path` for dir = the executable's folder and its two parents
// (from build/release/sparq: build/release, build, the repository root); "" if none.
std::string FindNearExecutable(const std::string& relative_path);

// The interpreter for Python helper scripts: $SPARQ_PYTHON, else the repository's
// .venv/bin/python (made by scripts/install_deps.sh) found near the executable, else python3.
std::string PythonInterpreter();
// PythonInterpreter() quoted for a shell command line.
std::string PythonCommand();

}  // namespace sparq::cli
