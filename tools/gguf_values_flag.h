// `--gguf-values as-stored|f32`, the flag of the commands that load one model to run it (eval,
// generate): how a GGUF's Q4_0 / Q4_1 / Q8_0 weights are held (LoadOptions, sparq/model.h).
// as-stored is the default: the same values as f32 (up to f32 summation order), 2.0-2.3x the
// decode tok/s and ~1.03x the prefill on SmolLM2 Q4_1 (Intel Xeon, AVX-512 and capped at AVX2,
// 2 threads: docs/measurements/xeon-quantized-e2e-2026-12-05.md), and a fifth of the memory.
#pragma once

#include <CLI/CLI.hpp>
#include <map>
#include <string>

#include "sparq/model.h"

namespace sparq::cli {

inline void AddGgufValuesOption(CLI::App& sub, GgufValues* values) {
  const std::map<std::string, GgufValues> names = {{"f32", GgufValues::kF32},
                                                   {"as-stored", GgufValues::kAsStored}};
  sub.add_option("--gguf-values", *values,
                 "A GGUF's Q4_0 / Q4_1 / Q8_0 linear layers: as-stored (run on the quantized "
                 "kernels, the default) or f32 (dequantized)")
      ->transform(CLI::CheckedTransformer(names))
      ->default_str("as-stored");
}

}  // namespace sparq::cli
