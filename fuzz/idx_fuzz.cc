// libFuzzer target: the IDX image and label parsers (sparq/idx.h) on arbitrary bytes. An accepted
// file holds exactly the bytes its header says, and every accepted label is below 10.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "sparq/idx.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto im = sparq::ParseIdxImages(data, size, "fuzz.idx");
  if (im.ok() && im->pixels.size() + 16 != size) std::abort();
  auto lb = sparq::ParseIdxLabels(data, size, "fuzz.idx", 10);
  if (lb.ok()) {
    if (lb->size() + 8 != size) std::abort();
    for (uint8_t l : *lb) {
      if (l >= 10) std::abort();
    }
  }
  return 0;
}
