// The kernel table's rows with symmetric int4 values, one shard of kernel_rows-inl.h.
#define SPARQ_SHARD_I4Sym 1
#define SPARQ_SHARD_BODIES RowBodiesI4Sym
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/cpu/kernel_rows_i4s.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include "src/cpu/kernel_rows-inl.h"
