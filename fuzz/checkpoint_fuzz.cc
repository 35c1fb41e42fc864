// libFuzzer target: the sparq checkpoint reader on arbitrary bytes. Every matrix that passes the
// reader's validation is densified (when its dense form is small): Validate must have rejected
// anything that would make ToDense read or write out of bounds.
#include <cstddef>
#include <cstdint>

#include "sparq/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto ck = sparq::ReadCheckpointFromMemory(data, size, "fuzz.sparq");
  if (!ck.ok()) return 0;
  for (const auto& m : ck->matrices) {
    const uint64_t rows = static_cast<uint64_t>(sparq::Rows(m.matrix));
    const uint64_t cols = static_cast<uint64_t>(sparq::Cols(m.matrix));
    if (rows != 0 && cols > (uint64_t{1} << 22) / rows) continue;  // dense form above 16 MiB
    sparq::Tensor d = sparq::ToDense(m.matrix);
    (void)d;
  }
  return 0;
}
