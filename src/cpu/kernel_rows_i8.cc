// The kernel table's rows with int8 values, one shard of kernel_rows-inl.h.
#define SPARQ_SHARD_I8 1
#define SPARQ_SHARD_BODIES RowBodiesI8
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/cpu/kernel_rows_i8.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include "src/cpu/kernel_rows-inl.h"
