// Helpers for the kernel tests: seeded pattern-satisfying weights, the densified double reference
// and the all-targets loop.
#pragma once

#include "sparq/kernel_config.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "sparq/format.h"
#include "sparq/linear.h"
#include "sparq/pattern.h"
#include "sparq/thread_pool.h"
#include "src/cpu/spmm.h"

namespace sparq::testing_cpu {

// Seeded weights in [-1, 1) pruned to `pattern` (magnitude), rows x cols.
std::vector<float> PatternWeights(const Pattern& p, int64_t rows, int64_t cols, uint64_t seed);
// Seeded values in [-1, 1).
std::vector<float> RandomVector(size_t n, uint64_t seed);
// Dense f32 of what `s` stores (values rounded to its dtype), via the format's own ToDense.
std::vector<float> Densify(const SparseMatrix& s);
// Y = epilogue(X W^T) summed in double; also returns per-output sum |w||x| for the tolerance.
void ReferenceForward(const std::vector<float>& w, int64_t m, int64_t k, const float* x,
                      int64_t n, int64_t ldx, const Epilogue& ep, std::vector<double>& y,
                      std::vector<double>& abs_sum);
// Runs fn once per compiled target this CPU supports (Cfg() is then that target's KernelConfig,
// and Highway's supported set is mocked to it), then restores both. fn receives the target's
// name. Returns how many targets ran: callers check it (at least a SIMD target and the
// emulated / scalar one), so a loop that silently ran nothing fails.
int ForEachTarget(const std::function<void(const std::string&)>& fn);
// The configuration the tests run kernels with: the target ForEachTarget is on, else this
// machine's best (FromMachine(); capped under SPARQ_MAX_ISA, as test_main disables the rest). MutableCfg: for a test that forces a knob (reset it after).
const KernelConfig& Cfg();
KernelConfig& MutableCfg();
// Y [n, m] of one kernel row forced on w (x [n, k], Cfg()); y starts at a sentinel so that an
// output the row does not write shows.
std::vector<float> RunRow(const cpu::KernelRow& kern, const cpu::PackedWeight& w,
                          const std::vector<float>& x, int64_t m, int64_t k, int64_t n,
                          ThreadPool* pool);
// The kernel table's row of that name, or null.
const cpu::KernelRow* RowNamed(const std::string& name);

}  // namespace sparq::testing_cpu
