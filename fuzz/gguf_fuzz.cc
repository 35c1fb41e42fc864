// libFuzzer target: the GGUF reader on arbitrary bytes; every tensor of an accepted file is
// dequantized (their sizes are bounded by the input, so this never allocates much).
#include <cstddef>
#include <cstdint>

#include "sparq/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto f = sparq::GgufFile::FromMemory(data, size, "fuzz.gguf");
  if (!f.ok()) return 0;
  for (const auto& [k, v] : f->metadata()) {
    auto s = sparq::GgufValueToString(v);
    (void)s;
  }
  for (const auto& t : f->tensors()) {
    auto x = f->ReadF32(t);
    (void)x;
  }
  return 0;
}
