// libFuzzer target: the train state reader (sparq/train_loop.h) on arbitrary bytes. A state that
// passes its validation must be consistent enough to save again (its shapes, masks and options
// were all checked), so the round trip runs too.
#include <cstddef>
#include <cstdint>

#include "sparq/train_loop.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto s = sparq::train::LoadTrainStateFromMemory(data, size, "fuzz.safetensors");
  if (!s.ok()) return 0;
  // Every tensor was checked against the config: the sizes agree with it.
  if (s->weights.blocks.size() != static_cast<size_t>(s->config.n_layer)) __builtin_trap();
  if (!sparq::train::CheckModel(s->config, s->weights, s->masks).ok()) __builtin_trap();
  return 0;
}
