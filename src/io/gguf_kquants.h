// Dequantization of ggml's K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) to f32: 256-element
// super-blocks, see gguf_kquants.cc for the layouts.
#pragma once

#include <cstdint>

#include "sparq/gguf.h"
#include "sparq/status.h"

namespace sparq::io {

constexpr int64_t kQK_K = 256;  // elements per K-quant super-block (ggml's QK_K)

bool IsKQuant(GgmlType type);

// Converts `blocks` super-blocks of `type` (an IsKQuant type) at `src` (any alignment) to
// blocks * 256 floats at `dst`. kInvalidInput naming the super-block when its f16 scale d (or
// min scale dmin) is NaN or infinite: a quantizer never writes one, so the file is corrupt.
Status DequantizeKQuant(GgmlType type, const uint8_t* src, int64_t blocks, float* dst);

}  // namespace sparq::io
