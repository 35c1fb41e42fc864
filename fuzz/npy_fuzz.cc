// libFuzzer target: the .npy parser on arbitrary bytes. An accepted file's data must have exactly
// the size its shape says (ParseNpy copies it; ASan catches any read past the input).
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "sparq/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto t = sparq::ParseNpy(data, size, "fuzz.npy");
  if (!t.ok()) return 0;
  if (t->nbytes() > size) std::abort();
  return 0;
}
