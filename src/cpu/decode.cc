// The decode path (few tokens): X staged once (padded, or repeated for dense bf16), rows split into
// fixed tasks, each task's raw sums written to Y with the epilogue.
#include <cstring>

#include "src/cpu/kernel_entry.h"
#include "src/cpu/runners.h"
#include "src/cpu/staging.h"
#include "src/cpu/tasks.h"

namespace sparq::cpu {
// The decode kernels (gathers and expansions, n <= their max_n) of several weights that read the
// same X, in one parallel call: q/k/v of an attention block, gate/up of an MLP. A model's decode
// step is ~200 calls of 20-100 us each, and each call ends by waiting for its slowest task; one
// call per input instead of per weight removes 3 of a Llama block's 8 waits and gives the small
// k/v products' rows to whichever thread is free. Every job keeps its own row split, so its bits
// are those of a call on its own.

// The X rows the decode kernels of `pw` read, staged once per input (same kind and width for all
// jobs of a call): N:M and bit-mask rows read X zero-padded to k_pad; dense bf16 reads each x
// repeated 4 times (matching its [col][4] values); CSR column lists read X as it is.
struct DecodeInput {
  const float* x;
  int64_t ldx;
};
DecodeInput StageDecodeInput(const PackedWeight& pw, const float* x, int64_t n, int64_t ldx) {
  return std::visit(
      Overloaded{
          [&](const NmWeight& w) -> DecodeInput {
            return {PaddedX(x, n, ldx, w.cols, w.k_pad), w.k_pad};
          },
          [&](const MaskWeight& w) -> DecodeInput {
            return {PaddedX(x, n, ldx, w.cols, w.k_pad()), w.k_pad()};
          },
          [&](const RowGroupWeight& w) -> DecodeInput {
            if (!w.implicit_cols) return {x, ldx};
            float* xrep = ThreadBuffer(0, n * w.cols * 4);
            for (int64_t t = 0; t < n; ++t) {
              for (int64_t c = 0; c < w.cols; ++c) {
                const float v = x[t * ldx + c];
                float* d = xrep + (t * w.cols + c) * 4;
                d[0] = d[1] = d[2] = d[3] = v;
              }
            }
            return {xrep, w.cols * 4};
          },
          [&](const DenseF32Weight&) -> DecodeInput { return {x, ldx}; },
          [&](const DenseQuantWeight& w) -> DecodeInput {
            return {PaddedX(x, n, ldx, w.cols, w.k_pad), w.k_pad};
          },
      },
      pw.layout);
}

// The same staged input serves two weights when they are decoded by the same kernel over the same
// padded width.
bool SameDecodeInput(const PackedWeight& a, const PackedWeight& b) {
  if (a.kind() != b.kind() || a.cols != b.cols) return false;
  switch (a.kind()) {
    case PackedKind::kNm: return a.nm().k_pad == b.nm().k_pad;
    case PackedKind::kMask: return a.mask().k_pad() == b.mask().k_pad();
    case PackedKind::kRowGroups: return a.row_groups().implicit_cols == b.row_groups().implicit_cols;
    case PackedKind::kDenseQuant: return a.dense_quant().k_pad == b.dense_quant().k_pad;
    case PackedKind::kDenseF32: return false;
  }
  return false;
}

// Task units of a weight's decode split: rows (N:M, bit mask; blocks of 4 rows for the mask
// kernel) or row groups (CSR column lists, BSR, V:N:M, dense bf16).
std::vector<int64_t> DecodeBounds(const PackedWeight& pw, int64_t n) {
  return SplitTasks(RowCost(pw), n, 1, pw.kind() == PackedKind::kMask ? 4 : 1);
}

// One token's split is made once per weight: computed per call, it was 3.2 of the 3.7 us that
// each of SmolLM2's 121 products per decoded token spent before its tasks started (2:4 int4, one
// thread, this Xeon). The weight is immutable once packed, so the cache cannot go stale.
void CacheDecodeBounds(PackedWeight* pw) { pw->decode_bounds_1 = DecodeBounds(*pw, 1); }

// Units [u0, u1) of the job (rows, or row groups of a kRowGroups weight) by its row's body.
void RunDecodeTask(const DecodeJob& job, const DecodeInput& in, const float* x8, int64_t u0,
                   int64_t u1) {
  const PackedWeight& pw = *job.w;
  const SpmmArgs& a = job.a;
  const bool groups = pw.kind() == PackedKind::kRowGroups;
  const int64_t r0 = groups ? pw.row_groups().group_row[u0] : u0;
  const int64_t r1 = groups ? pw.row_groups().group_row[u1] : u1;
  KernelCall c;
  c.w = &pw;
  c.u0 = u0;
  c.u1 = u1;
  c.x = in.x;
  c.ldx = in.ldx;
  c.n = a.n;
  c.x8 = x8;
  c.raw = ThreadBuffer(1, a.n * (r1 - r0));
  job.row->Body(a.config())(c);
  WriteRaw(c.raw, a.n, r0, r1, a, pw.rows);
}

// Jobs must share X (a.x, a.n, a.ldx) and SameDecodeInput.
void RunDecodeJobs(const DecodeJob* jobs, size_t count, ThreadPool* pool) {
  const SpmmArgs& a0 = jobs[0].a;
  const DecodeInput in = StageDecodeInput(*jobs[0].w, a0.x, a0.n, a0.ldx);
  struct Task {
    size_t job;
    int64_t u0, u1;
  };
  // An int8-X row's X is rounded once per job here, not by each task: a 576 x 1536 product runs
  // 54 tasks, and rounding its 1536 columns each time took as long as the rows' dot products.
  // Job j's rounded X is at x8_buf + j * x8_floats (the jobs share n and the row).
  const int64_t x8_floats = a0.n * Int8XFloatsPerToken(in.ldx);
  float* x8_buf = nullptr;
  for (size_t j = 0; j < count; ++j) {
    if (jobs[j].row->mode != KernelMode::kDecodeInt8X) continue;
    if (x8_buf == nullptr) {
      x8_buf = ThreadBuffer(kInt8XSharedSlot, static_cast<size_t>(x8_floats) * count);
    }
    KernelCall c;
    c.w = jobs[j].w;
    c.x = in.x;
    c.ldx = in.ldx;
    c.n = jobs[j].a.n;
    c.x8_out = x8_buf + static_cast<int64_t>(j) * x8_floats;
    jobs[j].row->Body(jobs[j].a.config())(c);
  }
  std::vector<Task> tasks;
  for (size_t j = 0; j < count; ++j) {
    const PackedWeight& w = *jobs[j].w;
    std::vector<int64_t> computed;
    const std::vector<int64_t>& bounds = jobs[j].a.n == 1 && !w.decode_bounds_1.empty()
                                             ? w.decode_bounds_1
                                             : (computed = DecodeBounds(w, jobs[j].a.n));
    for (size_t b = 0; b + 1 < bounds.size(); ++b) tasks.push_back({j, bounds[b], bounds[b + 1]});
  }
  ParallelTasks(pool, static_cast<int64_t>(tasks.size()), [&](int64_t t, int) {
    const Task& tk = tasks[static_cast<size_t>(t)];
    const float* x8 = x8_buf ? x8_buf + static_cast<int64_t>(tk.job) * x8_floats : nullptr;
    RunDecodeTask(jobs[tk.job], in, x8, tk.u0, tk.u1);
  });
}

void RunDecode(const KernelRow& row, const PackedWeight& pw, const SpmmArgs& a, ThreadPool* pool) {
  const DecodeJob job{&pw, a, &row};
  RunDecodeJobs(&job, 1, pool);
}

// X^T tiles: xt[tile - tile0][c][j] = X[tile * nt + j][c] (zero for padded tokens and c >=

}  // namespace sparq::cpu
