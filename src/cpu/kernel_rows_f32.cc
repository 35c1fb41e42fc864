// The kernel table's rows with f32 values (and the dense f32 row), one shard of kernel_rows-inl.h.
#define SPARQ_SHARD_F32 1
#define SPARQ_SHARD_BODIES RowBodiesF32
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/cpu/kernel_rows_f32.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include "src/cpu/kernel_rows-inl.h"
