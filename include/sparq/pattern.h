// Sparsity patterns and masks.
//
// Convention (everywhere in sparq): a weight W[m, k] is used as Y[n, m] = X[n, k] * W^T, so
// m = output channels (rows), k = input channels (columns), n = tokens. N:M groups run along k.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sparq/status.h"

namespace sparq {

class ThreadPool;

enum class PatternKind : uint8_t {
  kDense,         // no constraint
  kUnstructured,  // `fraction` of the elements are zero: per tensor, or per row if per_row
  kRows,          // `fraction` of whole output rows are zero
  kCols,          // `fraction` of whole input columns are zero
  kNM,            // at most n nonzeros in each group of m consecutive elements along k
  kBlock,         // blocks of bh x bw, `fraction` of the blocks entirely zero
  kVNM,           // V:N:M: v consecutive rows share the kept positions of each N:M group
};

// Spelling (as on the command line, and round-tripped by ToString):
//   dense | unstructured:0.9 | unstructured-row:0.9 | rows:0.3 | cols:0.3 | 2:4 | 4:8 |
//   block:16x16 (fraction 0.5) | block:32x32:0.9 | vnm:8:2:4
struct Pattern {
  PatternKind kind = PatternKind::kDense;
  double fraction = 0.0;  // sparsity for kUnstructured / kRows / kCols / kBlock
  bool per_row = false;   // kUnstructured: the fraction applies to every row separately
  int n = 0, m = 0;       // kNM / kVNM: 1 <= n < m <= 16
  int bh = 0, bw = 0;     // kBlock: 1..64 each
  int v = 0;              // kVNM: 2..64

  static Result<Pattern> Parse(std::string_view spec);
  std::string ToString() const;
  // Checks ranges (1 <= n < m <= 16, block sides 1..64, v in 2..64, 0 <= fraction <= 1).
  Status Validate() const;
  bool operator==(const Pattern&) const = default;

  static Pattern Dense() { return {}; }
  static Pattern Unstructured(double f, bool per_row = false) {
    Pattern p; p.kind = PatternKind::kUnstructured; p.fraction = f; p.per_row = per_row; return p;
  }
  static Pattern NM(int n, int m) { Pattern p; p.kind = PatternKind::kNM; p.n = n; p.m = m; return p; }
  static Pattern Block(int bh, int bw, double f) {
    Pattern p; p.kind = PatternKind::kBlock; p.bh = bh; p.bw = bw; p.fraction = f; return p;
  }
  static Pattern VNM(int v, int n, int m) {
    Pattern p; p.kind = PatternKind::kVNM; p.v = v; p.n = n; p.m = m; return p;
  }
  static Pattern Rows(double f) { Pattern p; p.kind = PatternKind::kRows; p.fraction = f; return p; }
  static Pattern Cols(double f) { Pattern p; p.kind = PatternKind::kCols; p.fraction = f; return p; }
};

// Tail convention for N:M when k % m != 0: the last group is shorter (r = k % m elements) and
// holds at most min(n, r) nonzeros; it is stored padded to m with zeros (never-selected pads).
// Block / V:N:M edges likewise: edge blocks are partial and padded with zeros when stored.

// How ComputeMask chooses, beyond the pattern.
struct MaskOptions {
  // kUnstructured per tensor: compare within each row (Wanda's choice) instead of over the whole
  // tensor, spreading the tensor's count over the rows by cumulative rounding: row i prunes
  // llround(f*k*(i+1)) - llround(f*k*i), so the total is exactly llround(f*m*k).
  bool row_wise = false;
  // Optional: rows (N:M), row slabs (V:N:M) and per-row selections run on it; the mask does not
  // depend on it.
  ThreadPool* pool = nullptr;
};

// Chooses which elements to keep: mask[i*k + j] = 1 to keep. Keeps the highest `scores` per group,
// block, row or tensor; ties are broken deterministically (the lower flat index wins). Scores of a
// row, column, block or V:N:M column slab are summed and compared in double. Scores must be finite
// (error naming `what` otherwise). The number pruned for a fraction f of c candidates is
// llround(f * c). This is sparq's one mask selection: magnitude and Wanda pruning call it, and
// SparseGPT's per-block masks use the primitives below.
Result<std::vector<uint8_t>> ComputeMask(const Pattern& p, std::span<const float> scores,
                                         int64_t m, int64_t k, const std::string& what = "tensor",
                                         const MaskOptions& opt = {});
// w[i] = 0 where mask[i] == 0 (in place).
void ApplyMask(std::span<float> w, std::span<const uint8_t> mask);
// Magnitude pruning: ComputeMask(p, |w|) then ApplyMask.
Status MagnitudePrune(const Pattern& p, std::span<float> w, int64_t m, int64_t k,
                      const std::string& what = "tensor");

// Selection primitives of ComputeMask, with its tie rule (for callers that score their own units,
// as SparseGPT does per column block).
// out[i] = 1 for the `keep` highest of s[0..n) (ties: the lower index), 0 for the others; keep is
// clamped to [0, n]. scratch is a reusable buffer.
void KeepTop(const float* s, int64_t n, int64_t keep, uint8_t* out, std::vector<float>* scratch);
// The same for a group of len <= 16 scores, as bits (bit i set: s[i] kept).
uint32_t KeepTopInGroup(const float* s, int len, int keep);
// llround(f * after) - llround(f * before): how many of the candidates (before, after] to prune so
// that every prefix, and the whole, prunes exactly llround(f * count).
int64_t CumulativeCount(double fraction, int64_t before, int64_t after);

// Does W (f32 [m, k], row-major) satisfy the pattern's structure? For fraction patterns the
// achieved sparsity must be >= fraction (within one element of rounding) and, for kRows / kCols /
// kBlock, the zeros must come in whole rows / columns / blocks.
bool Satisfies(const Pattern& p, std::span<const float> w, int64_t m, int64_t k);

// The finest (most constrained) structured pattern W satisfies, for `sparq inspect`: tries, in
// order, N:M for small n:m (1:4, 2:4, 1:8, 2:8, 4:8, ... up to m = 16), then V:N:M and blocks of
// common shapes, then reports unstructured with its measured sparsity (or dense).
Pattern FinestPattern(std::span<const float> w, int64_t m, int64_t k);

}  // namespace sparq
