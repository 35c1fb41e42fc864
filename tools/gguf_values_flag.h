// `--gguf-values as-stored|f32`, the flag of the commands that load one model to run it (eval,
// generate): how a GGUF's Q4_0 / Q4_1 / Q8_0 weights are held (LoadOptions, sparq/model.h).
#pragma once

#include <CLI/CLI.hpp>
#include <map>
#include <string>

#include "sparq/model.h"

namespace sparq::cli {

inline void AddGgufValuesOption(CLI::App& sub, GgufValues* values) {
  const std::map<std::string, GgufValues> names = {{"f32", GgufValues::kF32},
                                                   {"as-stored", GgufValues::kAsStored}};
  // f32 stays the default until as-stored has been measured against f32 on every host kind
  // (issue 27 makes as-stored the default then).
  sub.add_option("--gguf-values", *values,
                 "A GGUF's Q4_0 / Q4_1 / Q8_0 linear layers: f32 (dequantized, the default for "
                 "now) or as-stored (run on the quantized kernels; the planned default)")
      ->transform(CLI::CheckedTransformer(names))
      ->default_str("f32");
}

}  // namespace sparq::cli
