// Data in and out of the kernels (staging.h).
#include "src/cpu/staging.h"

#include <algorithm>
#include <cstring>

#include "sparq/checked.h"
#include "src/cpu/kernel_entry.h"
#include "src/cpu/tasks.h"

namespace sparq::cpu {

// ApplyEpilogueRow (spmm.h) for tokens [t0, t1) of Y (y = Y[0, 0], rows ldy apart), in one call.
void ApplyEpilogueBlock(const KernelConfig& c, float* y, int64_t ldy, int64_t t0, int64_t t1,
                        int64_t r0, int64_t r1, int64_t m, const Epilogue& ep) {
  if (ep.bias || ep.residual || ep.act != Activation::kNone) {
    EpilogueBlockAt(c, y, ldy, t0, t1, r0, r1, m, ep);
  }
}

// Writes raw sums [n][r1 - r0] (row-major over the task's rows) to Y with the epilogue.
void WriteRaw(const float* raw, int64_t n, int64_t r0, int64_t r1, const SpmmArgs& a,
              int64_t m) {
  const int64_t rows = r1 - r0;
  for (int64_t t = 0; t < n; ++t) {
    float* y = a.y + t * a.ldy;
    std::memcpy(y + r0, raw + t * rows, sizeof(float) * rows);
    ApplyEpilogueRow(a.config(), y, t, r0, r1, m, a.ep);
  }
}

// Whether the tiled kernels write Y (n x m) with non-temporal stores (TransposeT's stream): where Y
// is larger than the L2 of the threads that write it, so its lines would go back to L3 or memory
// before anyone reads them anyway, and a plain store first reads each line it fills (a 99% CSR call
// at 4096x4096 n = 512 moves 8 MB of X in and 8 MB of Y out beside 1 MB of weights). Not with an
// epilogue, which reads Y back. (measurements: docs/kernels.md)
bool StreamY(const SpmmArgs& a, int64_t m, const ThreadPool* pool) {
  const int threads = pool ? pool->num_threads() : 1;
  const StreamYMode forced = a.config().stream_y;
  if (forced == StreamYMode::kNever || a.ep.bias || a.ep.residual ||
      a.ep.act != Activation::kNone || a.ldy % 16 != 0 ||
      reinterpret_cast<uintptr_t>(a.y) % sizeof(float) != 0) {
    return false;
  }
  const int64_t l2 = a.config().cpu.l2_bytes;
  const double l2_bytes = l2 > 0 ? static_cast<double>(l2) : double{1 << 20};
  return forced == StreamYMode::kAlways ||
         static_cast<double>(a.n) * static_cast<double>(m) * 4.0 > l2_bytes * threads;
}

// Writes tokens [t0, t1) of a token tile from scratch laid out [row][nt] (row r's sums at
// scratch + row_off[r - r0], token t at + t - t0) to Y. Y is written along rows, contiguously per
// token (the scratch side is the strided one: it sits in L1/L2, while Y's lines would each be
// touched once per row otherwise), then the epilogue runs over each contiguous span.
void WriteTile(const float* scratch, const int64_t* row_off, int64_t r0, int64_t r1, int64_t t0,
               int64_t t1, const SpmmArgs& a, int64_t m, bool stream) {
  // Rows one after the other in scratch (all but row groups with padded rows): one
  // register transpose of the [rows][tokens] block.
  const int64_t nt = r1 - r0 > 1 ? row_off[1] - row_off[0] : 0;
  bool regular = row_off[0] == 0 && nt >= t1 - t0;
  for (int64_t r = r0; regular && r < r1; ++r) regular = row_off[r - r0] == (r - r0) * nt;
  if (regular && r1 - r0 > 1) {
    float* y = a.y + t0 * a.ldy;
    // Streamed (StreamY): rows from the first whole line on, in 16-row squares; the rows before
    // and after them (none where the task was cut at line starts) with plain stores.
    int64_t head = 0, body = 0;
    if (stream) {
      head = std::min(r1 - r0, (YLinePhase(a) + 16 - r0 % 16) % 16);
      body = (r1 - r0 - head) / 16 * 16;
    }
    if (head > 0) TransposeAt(a.config(), scratch, nt, head, t1 - t0, y + r0, a.ldy, false);
    if (body > 0) TransposeAt(a.config(), scratch + head * nt, nt, body, t1 - t0, y + r0 + head, a.ldy, true);
    const int64_t done = head + body;
    if (r1 - r0 > done) {
      TransposeAt(a.config(), scratch + done * nt, nt, r1 - r0 - done, t1 - t0, y + r0 + done, a.ldy, false);
    }
    ApplyEpilogueBlock(a.config(), a.y, a.ldy, t0, t1, r0, r1, m, a.ep);
    return;
  }
  for (int64_t t = t0; t < t1; ++t) {
    float* y = a.y + t * a.ldy;
    const float* s = scratch + (t - t0);
    for (int64_t r = r0; r < r1; ++r) y[r] = s[row_off[r - r0]];
    ApplyEpilogueRow(a.config(), y, t, r0, r1, m, a.ep);
  }
}

// X copied to rows of k_pad floats, zero beyond cols (the padded kernels read whole chunks).
float* PaddedX(const float* x, int64_t n, int64_t ldx, int64_t cols, int64_t k_pad) {
  float* xpad = ThreadBuffer(0, n * k_pad);
  for (int64_t t = 0; t < n; ++t) {
    std::memcpy(xpad + t * k_pad, x + t * ldx, cols * sizeof(float));
    std::fill(xpad + t * k_pad + cols, xpad + (t + 1) * k_pad, 0.0f);
  }
  return xpad;
}

float* BuildXt(const SpmmArgs& a, int64_t cols, int64_t k_rows, int64_t nt, ThreadPool* pool,
               int slot, int64_t tile0, int64_t tile1) {
  if (tile1 < 0) tile1 = CeilDiv(a.n, nt);
  const int64_t tiles = tile1 - tile0;
  float* xt = ThreadBuffer(slot, tiles * k_rows * nt);
  constexpr int64_t kCb = 64;  // columns per transpose block (cache friendly both ways)
  const int64_t cblocks = CeilDiv(k_rows, kCb);
  ParallelTasks(pool, tiles * cblocks, [&](int64_t task, int) {
    const int64_t tile = tile0 + task / cblocks, c0 = (task % cblocks) * kCb;
    const int64_t c1 = std::min(k_rows, c0 + kCb);
    float* dst = xt + (tile - tile0) * k_rows * nt;
    const int64_t cx = std::max(c0, std::min(c1, cols));
    const int64_t tokens = std::min(nt, a.n - tile * nt);
    // Zeros where no X lands: padded tokens of the last tile, columns past cols.
    if (tokens < nt) {
      for (int64_t c = c0; c < cx; ++c) std::fill(dst + c * nt + tokens, dst + (c + 1) * nt, 0.0f);
    }
    for (int64_t c = cx; c < c1; ++c) std::fill(dst + c * nt, dst + (c + 1) * nt, 0.0f);
    TransposeAt(a.config(), a.x + tile * nt * a.ldx + c0, a.ldx, tokens, cx - c0, dst + c0 * nt, nt, false);
  });
  return xt;
}


}  // namespace sparq::cpu
