// The kernel table's rows with bf16 values (and the dense bf16 rows), one shard of
// kernel_rows-inl.h.
#define SPARQ_SHARD_Bf16 1
#define SPARQ_SHARD_BODIES RowBodiesBf16
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/cpu/kernel_rows_bf16.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include "src/cpu/kernel_rows-inl.h"
