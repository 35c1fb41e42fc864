// The kernel table's rows with int4 values with a min, one shard of kernel_rows-inl.h.
#define SPARQ_SHARD_I4 1
#define SPARQ_SHARD_BODIES RowBodiesI4
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/cpu/kernel_rows_i4.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include "src/cpu/kernel_rows-inl.h"
