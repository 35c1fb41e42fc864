// The kernel tests' cases (a format, pattern and value type), their packed weights with the
// dense values they store, the derived tolerance check, and the guarded run of one row against
// the double reference. Shared by spmm_test.cc, spmm_bits_test.cc, spmm_epilogue_test.cc,
// spmm_dispatch_test.cc and linear_weight_test.cc.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "src/cpu/kernel_entry.h"
#include "src/cpu/spmm.h"
#include "tests/cpu/spmm_testutil.h"

namespace sparq::testing_cpu {

struct Case {
  FormatKind format;
  std::string pattern;
  DType dtype;
  CsrLayout layout = CsrLayout::kAuto;  // CSR / COO: column indices or bit mask
};

std::string Name(const Case& c);
// Every format, pattern and value type the kernel table serves (spmm_test.cc's sweep).
std::vector<Case> AllCases();

struct Built {
  std::vector<float> dense;  // what the format stores, as f32
  cpu::PackedWeight packed;
};
// Seeded weights of case c, encoded, densified and packed (with c's CSR layout when given).
Built Build(const Case& c, int64_t m, int64_t k, uint64_t seed);

// Y within the tolerance derived in spmm_cases_testutil.cc of the double reference `want`.
void ExpectClose(const std::vector<double>& want, const std::vector<double>& abs_sum,
                 const float* y, int64_t n, int64_t m, int64_t ldy, int64_t k,
                 const std::string& what);

inline constexpr float kGuard = -12345.0f;

// Y (n x m, dense rows) of kernel `kern` on X (n x k) with the default config, for bit comparisons.
std::vector<float> RunPlain(const cpu::KernelRow& kern, const Built& b, const std::vector<float>& x,
                            int64_t m, int64_t k, int64_t n, ThreadPool* pool);
// The plain reference as a table row's run function.
void RunReference(const cpu::KernelRow&, const cpu::PackedWeight& w, const cpu::SpmmArgs& a,
                  ThreadPool* pool);
// Runs kernel `kern` with X misaligned by one float and Y inside a guarded buffer, and checks Y
// against the double reference and the guards.
void RunAndCheck(const cpu::KernelRow& kern, const Built& b, int64_t m, int64_t k, int64_t n,
                 const Epilogue& ep, ThreadPool* pool, const std::string& what);

}  // namespace sparq::testing_cpu
