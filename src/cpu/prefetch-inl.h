// Software prefetch of the kernels: how far ahead each weight stream is fetched, the X^T slice
// of the next k block, and the runs of a column group in one k block. The constants' measurements
// are in docs/kernels.md.
#if defined(SPARQ_CPU_PREFETCH_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SPARQ_CPU_PREFETCH_INL_H_
#undef SPARQ_CPU_PREFETCH_INL_H_
#else
#define SPARQ_CPU_PREFETCH_INL_H_
#endif

#include "src/cpu/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace sparq::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Bytes ahead of the current position that the kernels prefetch in each weight stream (several
// streams in flight hide this VM's memory latency better than the hardware prefetcher).
inline constexpr int kPrefetchBytes = 1024;

// The far weight-stream prefetch of the decode kernels (N:M, bit mask, dense bf16, f32 V:N:M /
// BSR): into L2 (prefetcht1; hwy::Prefetch is prefetcht0, into L1). Those lines are not read for
// hundreds of cycles, and on AMD Zen 4 (32 KiB L1) the L1 prefetches presumably held the fill
// buffers that the demand loads wait for (no hardware counters on that VM). (measurements:
// docs/kernels.md)
HWY_INLINE void PrefetchFar(const void* p) { __builtin_prefetch(p, 0, 2); }
// The decode kernels of N:M and bit-mask rows run R = 4 rows in lockstep, and the rows' values are
// contiguous, so 1 KiB ahead of each row's stream stayed inside the 4 rows being read (a 576-column
// bf16 row at 50% is 576 bytes): nothing of the next rows was requested before the kernel reached
// them. 6 KiB reaches the next block of rows. (measurements: docs/kernels.md)
inline constexpr int kDecodePrefetchBytes = 6144;
inline constexpr int kDensePrefetchBytes = 3072;
// The N:M decode's prefetch runs kDecodePrefetchBytes / 4 ahead in each of its 4 streams, a stream
// being one slot of the 4-row blocks (rows q, q + 4, q + 8, ... back to back). For SmolLM2's short
// rows that is about the 6 KiB ahead above (the next block of rows); in a long row 6 KiB ahead of
// row q was row q + 1, which the kernel was already reading (a 4096-column 2:4 bf16 row is 4 KiB),
// so only one row in four had anything fetched ahead. (measurements: docs/kernels.md)
inline constexpr int64_t kNmStreamPrefetchBytes = kDecodePrefetchBytes / 4;

// The prefetch point kNmStreamPrefetchBytes ahead in each of the R row streams a decode row
// reads in lockstep (rows of row_bytes, back to back): row q of the block rows_ahead blocks of R
// rows on (Row), off bytes into it; Advance moves it by the bytes the row just read.
struct RowStreamAhead {
  explicit RowStreamAhead(int64_t row_bytes)
      : row_bytes(row_bytes),
        rows_ahead(kNmStreamPrefetchBytes / row_bytes),
        off(kNmStreamPrefetchBytes % row_bytes) {}
  int64_t Row(int q, int R) const { return q + R * rows_ahead; }
  void Advance(int64_t bytes) {
    off += bytes;
    if (off >= row_bytes) {
      off -= row_bytes;
      ++rows_ahead;
    }
  }
  int64_t row_bytes, rows_ahead, off;
};

// Prefetches the next k block's X^T slice (`next`, whole cache lines) during the last row groups
// of this one's `steps`, at least 4 lines per group. The slice is read in a data-dependent column
// order, so the hardware prefetchers do not fetch it ahead, and with few rows per pass (SmolLM2's
// 576x1536 layers) its first touch from L3 is a large part of the pass. When to use it:
// NextXtSlice in prefetch.h.
class XtSlicePrefetcher {
 public:
  XtSlicePrefetcher(const XtNext& next, int64_t steps)
      : p_(static_cast<const uint8_t*>(static_cast<const void*>(next.xt))),
        end_(p_ == nullptr ? nullptr : p_ + next.bytes) {
    const int64_t lines = next.bytes / 64;
    if (p_ == nullptr || steps <= 0 || lines <= 0) return;
    per_step_ = std::max<int64_t>(4, (lines + steps - 1) / steps);
    start_ = steps - (lines + per_step_ - 1) / per_step_;
  }
  HWY_INLINE void Step() {
    if (step_++ < start_) return;
    for (int64_t i = 0; i < per_step_ && p_ < end_; ++i, p_ += 64) hwy::Prefetch(p_);
  }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
  int64_t per_step_ = 0;
  int64_t start_ = 0;
  int64_t step_ = 0;
};

// Prefetches a group's values and column indices in one k block (RowGroupTiledImpl, one group ahead). A
// group's run in a k block is short (hundreds of bytes) and the next group's starts far away (this
// group's other k blocks lie between), so the hardware prefetchers do not fetch it ahead; where a
// task's weights do not stay in L2 across the token tiles (11008x4096 V:N:M, 1.4 MB per task), each
// run came from L3 on demand. (measurements: docs/kernels.md)
class RowGroupPrefetcher {
 public:
  RowGroupPrefetcher(const RowGroupWeight& w, const RowGroupBlock& blk, int64_t g0, int64_t g1, int g,
                   size_t vb)
      : vals_(static_cast<const uint8_t*>(w.values.data())),
        idx_(w.implicit_cols ? nullptr : static_cast<const uint8_t*>(w.col_idx.data())),
        pb_(blk.pb),
        pe_(blk.pe),
        g0_(g0),
        g1_(g1),
        vbytes_(vb * static_cast<size_t>(g)),
        ibytes_(w.idx16 ? 2 : 4) {}
  HWY_INLINE void Fetch(int64_t gi) const {
    if (gi >= g1_) return;
    const int64_t p0 = pb_[gi - g0_], p1 = pe_[gi - g0_];
    if (p1 <= p0) return;
    Lines(vals_ + static_cast<size_t>(p0) * vbytes_, static_cast<size_t>(p1 - p0) * vbytes_);
    if (idx_ != nullptr) {
      Lines(idx_ + static_cast<size_t>(p0) * ibytes_, static_cast<size_t>(p1 - p0) * ibytes_);
    }
  }

 private:
  static HWY_INLINE void Lines(const uint8_t* p, size_t bytes) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{63};
    const uintptr_t e = reinterpret_cast<uintptr_t>(p) + bytes;
    for (uintptr_t l = a; l < e; l += 64) hwy::Prefetch(reinterpret_cast<const void*>(l));
  }
  const uint8_t* vals_;
  const uint8_t* idx_;
  const int64_t* pb_;
  const int64_t* pe_;
  int64_t g0_, g1_;
  size_t vbytes_, ibytes_;
};

// Rows ahead whose weights CsrNarrowImpl prefetches in a pass over the whole k (blk.stream, weights
// beyond L2): they are read once per call there, from DRAM or L3 (a model reads each layer once per
// token), and a kept weight costs too few cycles for the hardware prefetchers to keep up.
// (measurements: docs/kernels.md)
inline constexpr int64_t kCsrStreamAhead = 4;

}  // namespace sparq::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // SPARQ_CPU_PREFETCH_INL_H_
