// OpenBLAS kernel-family check (see machine.h).
//
// Debian 12's OpenBLAS 0.3.21 (DYNAMIC_ARCH) picks its kernels by CPU model number. CPUs newer
// than the library (e.g. family 6 model 207, the Xeon this project is measured on) are not in its
// table and fall back to "Prescott" (SSE3) kernels: sgemm at 18-23 GFLOP/s on one core instead
// of 110-120 with the SkylakeX kernels (measured here, 4096x4096x512). OpenBLAS reads
// OPENBLAS_CORETYPE when the library loads, so the fix has to come before the process starts.
#include <cblas.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "sparq/machine.h"

namespace sparq::cpu {

std::string BlasCoreName() {
  const char* name = openblas_get_corename();
  return name ? name : "unknown";
}

const char* SuggestedOpenBlasCore(bool user_chose) {
  if (user_chose) return nullptr;
  // Kernel families that predate AVX2: on a CPU with AVX2 (or AVX-512) they are a mis-detection.
  static const char* const kOld[] = {"Prescott", "Core2",   "Penryn",    "Dunnington",
                                     "Nehalem",  "Atom",    "Sandybridge", "Katmai",
                                     "Coppermine", "Northwood", "Banias", "unknown"};
  const std::string core = BlasCoreName();
  bool old = false;
  for (const char* o : kOld) old = old || core == o;
  if (!old) return nullptr;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")) {
    return "SkylakeX";
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
  return nullptr;
}

}  // namespace sparq::cpu
