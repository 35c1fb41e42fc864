// The per-target body entries of one shard of the kernel table's rows (table_rows.h), compiled
// once per Highway target by the shard's translation unit (kernel_rows_*.cc), which names its
// rows by value kind before including this file: SPARQ_SHARD_<values> 1 for its rows (the other
// kinds default to 0 here), SPARQ_SHARD_BODIES the function that gives its table. The rows were one
// translation unit (kernels.cc: 6 of a 2-core release build's 13.5 minutes, and the ASan build's
// longest compile) on one core; split by value kind, the shards compile side by side. Included
// per target: no include guard.
#include <hwy/highway.h>

#include "src/cpu/kernel_entry.h"
#include "src/cpu/spmm-inl.h"
#include "src/cpu/table_rows.h"

#ifndef SPARQ_CPU_KERNEL_ROWS_SELECT_
#define SPARQ_CPU_KERNEL_ROWS_SELECT_
#ifndef SPARQ_SHARD_F32
#define SPARQ_SHARD_F32 0
#endif
#ifndef SPARQ_SHARD_Bf16
#define SPARQ_SHARD_Bf16 0
#endif
#ifndef SPARQ_SHARD_I8
#define SPARQ_SHARD_I8 0
#endif
#ifndef SPARQ_SHARD_I4
#define SPARQ_SHARD_I4 0
#endif
#ifndef SPARQ_SHARD_I4Sym
#define SPARQ_SHARD_I4Sym 0
#endif
// SPARQ_IF(c)(code): code where c expands to 1, nothing where 0; SPARQ_IF_ELSE(c)(a, b): a or b.
#define SPARQ_IF(c) SPARQ_IF_I(c)
#define SPARQ_IF_I(c) SPARQ_IF_##c
#define SPARQ_IF_1(...) __VA_ARGS__
#define SPARQ_IF_0(...)
#define SPARQ_IF_ELSE(c) SPARQ_IF_ELSE_I(c)
#define SPARQ_IF_ELSE_I(c) SPARQ_IF_ELSE_##c
#define SPARQ_IF_ELSE_1(a, b) a
#define SPARQ_IF_ELSE_0(a, b) b
#endif

HWY_BEFORE_NAMESPACE();
namespace sparq::cpu::HWY_NAMESPACE {

// Each of this shard's rows' body entry on this target: its body where the target lies in the
// row's range, elsewhere nothing (never called: dispatch and the tests check the range first), so
// a body is compiled only for the targets its row names.
template <bool kOn, class Body>
HWY_INLINE void RowEntry(const KernelCall& c) {
  if constexpr (kOn) {
    Body::Run(c);
  } else {
    (void)c;
  }
}
#define SPARQ_BODY(T, ...) T<__VA_ARGS__>
#define SPARQ_ROW_ENTRY(name, layout, values, mode, tile, best, worst, min_n, max_n, run, nv, \
                        body)                                                                 \
  SPARQ_IF(SPARQ_SHARD_##values)                                                              \
  (void name(const KernelCall& c) {                                                           \
    RowEntry<(HWY_TARGET >= (best) && HWY_TARGET <= (worst)), body>(c);                       \
  })
SPARQ_KERNEL_ROWS(SPARQ_ROW_ENTRY)
#undef SPARQ_ROW_ENTRY
#undef SPARQ_BODY

}  // namespace sparq::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace sparq::cpu {

#define SPARQ_ROW_EXPORT(name, layout, values, ...) \
  SPARQ_IF(SPARQ_SHARD_##values)(HWY_EXPORT(name);)
SPARQ_KERNEL_ROWS(SPARQ_ROW_EXPORT)
#undef SPARQ_ROW_EXPORT

// Every row in table order: this shard's dispatch tables, nullptr for the other shards' rows.
const KernelBody* const* SPARQ_SHARD_BODIES() {
#define SPARQ_ROW_BODIES(name, layout, values, ...) \
  SPARQ_IF_ELSE(SPARQ_SHARD_##values)(HWY_DISPATCH_TABLE(name), nullptr),
  static const KernelBody* const kBodies[] = {SPARQ_KERNEL_ROWS(SPARQ_ROW_BODIES)};
#undef SPARQ_ROW_BODIES
  return kBodies;
}

}  // namespace sparq::cpu
#endif  // HWY_ONCE
