// libFuzzer target: the GGUF reader on arbitrary bytes; every tensor of an accepted file is
// dequantized, and read as stored (ReadQuantized; their sizes are bounded by the input, so this
// never allocates much). Where both succeed they must agree bit for bit.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

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
    auto q = f->ReadQuantized(t);
    if (x.ok() && q.ok()) {
      const sparq::Tensor d = q->ToDense();
      if (d.nbytes() != x->nbytes() ||
          (d.nbytes() != 0 && std::memcmp(d.data(), x->data(), d.nbytes()) != 0)) {
        std::abort();  // ReadQuantized disagrees with ggml's dequantization
      }
    }
  }
  return 0;
}
