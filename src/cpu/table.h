// The kernel table: one row per concrete variant (layout, value dtype, decode or tiled, tile,
// target range, token counts). Dispatch (ChooseKernel) walks it in order and takes the first row
// that serves a weight, recording why each earlier row declined (ExplainKernel: `sparq bench
// kernels --explain`); the tests run every row against the reference on every compiled target
// and the benchmark names each row. Adding a kernel is one SPARQ_KERNEL_ROWS line (above the rows
// it should win over) plus its body.
//
// Names: <dtype>_<layout>_<mode>_<rows>x<tokens>[__<target>], tile = rows of W x token vectors
// per inner step ("T": the decode kernels' token block, "NV": vectors of the token tile), as in
// XNNPACK's xnn_f32_spmm_minmax_ukernel_32x1__neonfma. Rows without a target suffix are one
// Highway body compiled for every target in their range.
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

enum class KernelMode : uint8_t { kBlas, kDecode, kTiled };
// The layout a row serves, finer than PackedKind (the packed form of each family).
enum class KernelLayout : uint8_t {
  kDenseF32,   // kDenseF32 (OpenBLAS)
  kNmWindow,   // kNm with m = 2n (2:4, 4:8): X windows permuted; its rows serve kNm24 too
  kNm24,       // kNm 2:4 (a kNmWindow weight), for rows written for 2:4 only
  kNmGather,   // other kNm (1:4, 2:8, ...): X gathered
  kCsr,        // kScg, groups of one row with explicit columns
  kRowGroups,  // kScg, groups of 2-4 rows sharing columns (V:N:M, BSR); its rows serve kRowGroups4
  kRowGroups4, // kScg, groups of 4 rows (a kRowGroups weight), for rows written for 4-row groups
  kDenseBf16,  // kScg with implicit columns (dense bf16 rows)
  kMask,       // kMask
};
const char* LayoutName(KernelLayout layout);
KernelLayout LayoutOf(const PackedWeight& w);
// A row of layout `row` serves weights of layout `w`: the same, or a case of it (kNm24 is a case
// of kNmWindow, kRowGroups4 of kRowGroups).
bool LayoutServes(KernelLayout row, KernelLayout w);

using KernelRun = void (*)(const PackedWeight& w, const SpmmArgs& a, ThreadPool* pool);

struct KernelRow {
  const char* name;
  KernelLayout layout;
  DType dtype;        // value dtype (kF32 for dense f32)
  KernelMode mode;
  const char* tile;   // rows x token vectors per inner step
  // Highway targets the row runs on: from `worst` (e.g. HWY_SCALAR) to `best` (e.g. HWY_AVX3_DL);
  // Highway's target bits grow as targets get older, so best <= target <= worst.
  int64_t best, worst;
  int64_t min_n, max_n;  // token counts it may be chosen for (it is correct for every n)
  KernelRun run;
};

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
