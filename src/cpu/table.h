// The kernel table: one row per concrete kernel (layout, value kind, decode or tiled, tile, body,
// target range, token counts). Dispatch (ChooseKernel) walks it in order and takes the first row
// that serves a weight, recording why each earlier row declined (ExplainKernel: `sparq bench
// kernels --explain`); the tests force every row on every compiled target against the
// reference, and the benchmark names each row. The row list (table_rows.h) also generates each
// row's body entry per target (kernels.cc): the row decides the body, no rule elsewhere swaps it.
// Adding a kernel is one row (above the rows it should win over) plus its body.
//
// Names: <values>_<layout>_<mode>_<rows>x<tokens>[__<target>], tile = rows of W x token vectors
// per inner step ("T": the decode kernels' token block, "NV": vectors of the token tile, chosen by
// n; "tok": tokens of a tile narrower than a vector), as in XNNPACK's
// xnn_f32_spmm_minmax_ukernel_32x1__neonfma. Rows without a target suffix are one Highway body
// compiled for every target in their range.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sparq/dtype.h"
#include "sparq/kernel_config.h"
#include "sparq/thread_pool.h"
#include "src/cpu/spmm_packed.h"

namespace sparq::cpu {

struct SpmmArgs;

// kDecodeInt8X: a decode row that rounds X to int8 per 32 columns (KernelConfig::int8_activations
// opts in; other rows give the f32 products' bits); it serves the token counts decode does.
enum class KernelMode : uint8_t { kBlas, kDecode, kTiled, kDecodeInt8X };
inline bool DecodeMode(KernelMode m) {
  return m == KernelMode::kDecode || m == KernelMode::kDecodeInt8X;
}
// The layout a row serves, finer than PackedKind (the packed form of each family). Some are
// cases of others (LayoutServes): a row of the wider layout serves the narrower one too.
enum class KernelLayout : uint8_t {
  kDenseF32,     // kDenseF32 (OpenBLAS)
  kNmM4,         // kNm with m <= 4 (2-bit indices): 1:4, 3:4, and the window cases below
  kNmWindowM4,   // kNm with m = 2n <= 4 (1:2, 2:4): X windows permuted (a case of kNmM4)
  kNm24,         // kNm 2:4 (a case of kNmWindowM4), for rows written for 2:4 only
  kNmM16,        // kNm with 4 < m <= 16 (4-bit indices): 1:8, 2:8, 4:16, ...
  kNmWindowM16,  // kNm with m = 2n > 4 (4:8, 8:16): X windows permuted (a case of kNmM16)
  // The row-group family (PackedKind::kRowGroups) by its group size:
  kCsr,          // groups of one row with explicit columns
  kRowGroups,    // groups of 2-4 rows sharing columns (V:N:M, BSR)
  kRowGroups4,   // groups of 4 rows (a case of kRowGroups), for rows written for 4-row groups
  kDenseBf16,    // groups of 4 rows with implicit columns (dense bf16 rows)
  kMask,         // kMask
  kDenseQuant,   // kDenseQuant: int8 / int4 codes of every column with group scales
};
const char* LayoutName(KernelLayout layout);
KernelLayout LayoutOf(const PackedWeight& w);
// A row of layout `row` serves weights of layout `w`: the same, or a case of it.
bool LayoutServes(KernelLayout row, KernelLayout w);

struct KernelRow;
// A row's path: stages the input, splits the tasks and calls the row's body (runners.h).
using KernelRun = void (*)(const KernelRow& row, const PackedWeight& w, const SpmmArgs& a,
                           ThreadPool* pool);
struct KernelCall;
// A row's body on one target (kernel_entry.h): the template instantiation the row names.
using KernelBody = void (*)(const KernelCall& call);

struct KernelRow {
  const char* name;
  KernelLayout layout;
  ValueKind values;
  KernelMode mode;
  const char* tile;   // rows x token vectors per inner step
  // Highway targets the row runs on: from `worst` (e.g. HWY_SCALAR) to `best` (e.g. HWY_AVX3_DL);
  // Highway's target bits grow as targets get older, so best <= target <= worst.
  int64_t best, worst;
  int64_t min_n, max_n;  // token counts it may be chosen for (it is correct for every n)
  KernelRun run;
  // Token tile of the tiled rows: > 0 that many vectors, < 0 that many tokens (narrower than a
  // vector), 0 chosen by n (RowTileWidth / TileWidth of its target).
  int tile_nv;
  const KernelBody* bodies;  // per target, indexed by KernelConfig::dispatch_index

  KernelBody Body(const KernelConfig& cfg) const { return bodies[cfg.dispatch_index]; }
  void Run(const PackedWeight& w, const SpmmArgs& a, ThreadPool* pool) const {
    run(*this, w, a, pool);
  }
};
// Tokens per tile the row's body runs for n tokens of weight w on cfg's target.
int64_t TileTokens(const KernelRow& row, const PackedWeight& w, int64_t n,
                   const KernelConfig& cfg);

// Every row, in dispatch order.
const std::vector<KernelRow>& KernelTable();

// Why `row` does not serve `w` for n tokens on cfg's target (empty: it does). With any_n, the
// token-count checks are left out (tests: a row must be correct for every n it can be given).
std::string Declines(const KernelRow& row, const PackedWeight& w, int64_t n,
                     const KernelConfig& cfg, bool any_n = false);
// The first row that serves w for n tokens.
const KernelRow& ChooseKernel(const PackedWeight& w, int64_t n, const KernelConfig& cfg);
// The chosen row and, for every row before it of the same family, why it declined.
struct KernelChoice {
  const KernelRow* chosen = nullptr;
  std::vector<std::pair<const KernelRow*, std::string>> declined;
};
KernelChoice ExplainKernel(const PackedWeight& w, int64_t n, const KernelConfig& cfg);

}  // namespace sparq::cpu
