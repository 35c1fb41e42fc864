// Where each lane of spmm_nm24_bf16_mmasp_m16n8k32 (src/cuda/spmm_nm24_bf16_mmasp.cu) loads its
// operands and stores its results: host+device code shared with a host test
// (tests/cuda/mma_frag_test.cc) that runs the kernel's per-lane arithmetic for a whole warp on the
// CPU through a model of mma.sp written from the PTX ISA's fragment tables.
// Lane = 4 g + t (g = groupID, t = threadID_in_group). Y[n, m] = X[n, k] W[m, k]^T: A = W's 16 x 32
// tile, B = X^T (32 x 8: k by token), D = Y^T (16 x 8).
#pragma once

#include <cstdint>

#include "src/cuda/gemv_nm24_step.h"  // SPARQ_HOST_DEVICE

namespace sparq::cuda {

// The packing's metadata word this lane passes (selector 0 reads those of threads 0 and 1 of each
// group; threads 2 and 3 pass a copy).
SPARQ_HOST_DEVICE int64_t MmaSpMetaWord(int64_t tile, int g, int t) { return tile * 16 + g * 2 + (t & 1); }

// B register r (0..3) of the k32 step tk: B[k][token] for k = 8 r + 2 t and the next, i.e. that
// pair of X's row `token`, as the index of a 32-bit word in the row.
SPARQ_HOST_DEVICE int64_t MmaSpBWord(int64_t tk, int r, int t) { return (tk * 32 + 8 * r + 2 * t) / 2; }

// D register i (0..3) of lane (g, t): row (of W, the output feature) g + 8 (i >> 1), column
// (token) 2 t + (i & 1).
SPARQ_HOST_DEVICE int MmaDRow(int i, int g) { return g + 8 * (i >> 1); }
SPARQ_HOST_DEVICE int MmaDCol(int i, int t) { return 2 * t + (i & 1); }

}  // namespace sparq::cuda
