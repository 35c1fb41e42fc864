// Task splitting of the kernels: fixed tasks balanced by stored weights (never by the thread
// count, so no sum depends on it), per-thread buffers, and the pool loop.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "sparq/thread_pool.h"
#include "src/cpu/spmm.h"

namespace sparq::cpu {

// Fewest multiply-adds per task: below, thread hand-off costs more than it saves (docs/kernels.md).
inline constexpr int64_t kMinTaskWork = 1 << 14;
// Most tasks per call: enough to balance 2..8 threads, few enough to keep per-task setup small.
inline constexpr int64_t kMaxTasks = 64;
// Most tasks of a task-outer row-group prefill cut so that each task's weights stay in L2.
inline constexpr int64_t kMaxTasksL2 = 256;
// Fewest rows per task of the tiled kernels: every task streams all of X^T once per token tile,
// so tiny tasks (9 rows for SmolLM2's 576-row layers at n = 512) multiply that traffic.
inline constexpr int64_t kTiledMinRows = 32;

// Per-thread reusable buffer `slot` (0-6) of at least `floats` floats, 64-byte aligned.
float* ThreadBuffer(int slot, size_t floats);
// The slot of the int4 bit-mask decode's permuted copy of X (mask_quant-inl.h): decode tasks
// hold slot 0 (staged X, on the calling thread) and 1 (raw sums); 5 is used by no other path.
inline constexpr int kMaskPermutedXSlot = 5;
// X rounded once per product for the int8-X rows (RunDecodeJobs, on the calling thread; every task
// reads it): at most n * Int8XFloatsPerToken(k_pad) floats, whatever the row.
inline constexpr int kInt8XSharedSlot = 6;
inline int64_t Int8XFloatsPerToken(int64_t k_pad) { return k_pad + 64; }

// Splits [0, units) into tasks balanced by cost prefix `cum` (cum[i] = cost of units < i), each
// of at least `min_units` units and cut at units u with u % align == offset % align.
std::vector<int64_t> SplitTasks(const std::vector<int64_t>& cum, int64_t n, int64_t min_units = 1,
                                int64_t align = 1, int64_t max_tasks = kMaxTasks,
                                int64_t offset = 0);
void ParallelTasks(ThreadPool* pool, int64_t tasks, const std::function<void(int64_t, int)>& fn);
// Cost prefix of a weight's task units (rows, or row groups of kRowGroups).
std::vector<int64_t> RowCost(const PackedWeight& w);

// Rows from Y's row 0 to the first 64-byte line start.
int64_t YLinePhase(const SpmmArgs& a);
// Where tasks of g-row units may be cut: every `align` units from `offset`.
struct TaskCuts {
  int64_t align, offset;
};
TaskCuts CutsFor(const SpmmArgs& a, bool stream, int64_t g, int64_t base_align);

}  // namespace sparq::cpu
