// libFuzzer target: the safetensors reader on arbitrary bytes. Every accepted tensor is read end
// to end (and converted to f32 where sparq can), so an out-of-range view shows up under ASan.
#include <cstddef>
#include <cstdint>

#include "sparq/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto f = sparq::SafetensorsFile::FromMemory(data, size, "fuzz.safetensors");
  if (!f.ok()) return 0;
  volatile uint8_t sink = 0;
  for (const auto& e : f->tensors()) {
    const auto* p = static_cast<const uint8_t*>(e.tensor.data());
    for (uint64_t i = 0; i < e.tensor.nbytes(); ++i) sink = sink ^ p[i];
    if (e.tensor.numel() < (1u << 20)) {
      auto t = sparq::ToF32(e.tensor);
      (void)t;
    }
  }
  return 0;
}
