// Task splitting and per-thread buffers of the kernels (tasks.h).
#include "src/cpu/tasks.h"

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <new>

namespace sparq::cpu {

// Buffers belong to threads, not to weights: calls on one LinearWeight may run concurrently from
// many threads. 64-byte aligned: a tiled X^T load that straddles two cache lines costs two.
namespace {
struct AlignedFree {
  void operator()(float* p) const { std::free(p); }
};
}  // namespace
float* ThreadBuffer(int slot, size_t floats) {
  constexpr size_t kAlign = 64;
  thread_local std::unique_ptr<float, AlignedFree> bufs[7];
  thread_local size_t sizes[7] = {0, 0, 0, 0, 0, 0, 0};
  if (sizes[slot] < floats || !bufs[slot]) {
    const size_t bytes = (std::max<size_t>(floats, 1) * sizeof(float) + kAlign - 1) / kAlign * kAlign;
    bufs[slot].reset(static_cast<float*>(std::aligned_alloc(kAlign, bytes)));
    if (!bufs[slot]) throw std::bad_alloc();
    sizes[slot] = bytes / sizeof(float);
  }
  return bufs[slot].get();
}

// Splits [0, units) into tasks balanced by cost prefix `cum` (cum[i] = cost of units < i), each
// of at least `min_units` units and cut at units u with u % align == offset % align (whole row
// blocks for the row-blocked kernels; CutsFor adds Y's line starts). The split depends on the
// shape (and, streaming, on where Y starts in a cache line), never on the thread count; no sum
// depends on it.
std::vector<int64_t> SplitTasks(const std::vector<int64_t>& cum, int64_t n, int64_t min_units,
                                int64_t align, int64_t max_tasks, int64_t offset) {
  const int64_t units = static_cast<int64_t>(cum.size()) - 1;
  const int64_t total = cum.back();
  int64_t tasks = std::clamp<int64_t>(total * std::max<int64_t>(n, 1) / kMinTaskWork, 1, max_tasks);
  tasks = std::min(tasks, std::max<int64_t>(units / std::max<int64_t>(min_units, 1), 1));
  std::vector<int64_t> bounds{0};
  int64_t u = 0;
  for (int64_t t = 1; t < tasks; ++t) {
    const int64_t target = total * t / tasks;
    while (u < units && cum[u] < target) ++u;
    u = std::min(units, u + ((offset - u) % align + align) % align);
    if (u > bounds.back()) bounds.push_back(u);
  }
  if (units > bounds.back() || bounds.size() == 1) bounds.push_back(units);
  return bounds;
}

void ParallelTasks(ThreadPool* pool, int64_t tasks, const std::function<void(int64_t, int)>& fn) {
  if (pool == nullptr || pool->num_threads() == 1) {
    for (int64_t t = 0; t < tasks; ++t) fn(t, 0);
  } else {
    pool->ParallelFor(tasks, fn);
  }
}

std::vector<int64_t> RowCost(const PackedWeight& w) {
  std::vector<int64_t> cum;
  std::visit(
      Overloaded{
          [&](const DenseF32Weight&) {
            cum.resize(w.rows + 1);
            for (int64_t r = 0; r <= w.rows; ++r) cum[r] = r * w.cols;
          },
          [&](const DenseQuantWeight& d) {
            cum.resize(w.rows + 1);
            for (int64_t r = 0; r <= w.rows; ++r) cum[r] = r * d.k_pad;
          },
          [&](const NmWeight& nm) {
            cum.resize(w.rows + 1);
            for (int64_t r = 0; r <= w.rows; ++r) cum[r] = r * nm.chunks * kNmChunk;
          },
          [&](const MaskWeight& mw) {
            // Decode steps through every 16 columns (a vector step costs about as much as two
            // kept weights), and each kept weight is a load and an FMA.
            cum.resize(w.rows + 1);
            for (int64_t r = 0; r <= w.rows; ++r) cum[r] = mw.row_ptr[r] + r * mw.chunks * 2;
          },
          [&](const RowGroupWeight& s) {
            // Each group costs its columns times g, plus a little per row (setup and write-out).
            cum.resize(s.groups() + 1);
            for (int64_t i = 0; i <= s.groups(); ++i) {
              cum[i] = s.group_ptr[i] * s.g + s.group_row[i] * 8;
            }
          },
      },
      w.layout);
  return cum;
}


// Rows from Y's row 0 to the first 64-byte line start (Y rows of ldy % 16 == 0 floats all start
// at the same offset in a line): tasks cut at rows r with (phase + r) % 16 == 0 write whole lines.
int64_t YLinePhase(const SpmmArgs& a) {
  return (16 - static_cast<int64_t>(reinterpret_cast<uintptr_t>(a.y) / sizeof(float) % 16)) % 16;
}

// A streamed Y also wants cuts at its line starts, where the kernels' grid and the line starts meet.
TaskCuts CutsFor(const SpmmArgs& a, bool stream, int64_t g, int64_t base_align) {
  const int64_t phase = YLinePhase(a);
  if (stream && g <= 16 && 16 % g == 0 && phase % g == 0 && (16 / g) % base_align == 0 &&
      (phase / g) % base_align == 0) {
    return {16 / g, phase / g};
  }
  return {base_align, 0};
}

// Writes tokens [t0, t1) of a token tile from scratch laid out [row][nt] (row r's sums at
// scratch + row_off[r - r0], token t at + t - t0) to Y. Y is written along rows, contiguously per
// token (the scratch side is the strided one: it sits in L1/L2, while Y's lines would each be

}  // namespace sparq::cpu
