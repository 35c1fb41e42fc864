// Decode attention over a KV cache in key ranges (see attention.cc): each range gives a partial
// result (its max score, its sum of exp(score - max) and its unnormalized output), and the
// partials of one query and head merge into the softmax-weighted sum over all keys. Splitting the
// keys lets the heads that share a KV head read it once and balances threads.
#pragma once

#include <cstdint>

#include "sparq/kernel_config.h"

// Every entry runs the body compiled for cfg.target (cfg.dispatch_index into the per-target
// table), so `--max-isa` caps attention like the kernels; never Highway's own best-target choice.
namespace sparq::cpu {

struct AttendPartial {
  float max = 0.0f;
  double sum = 0.0;
  float* out = nullptr;  // [hd], caller's storage
};

// Over the len keys k_j = k + j * stride and values v_j = v + j * stride (rows of a KV cache):
// scores s_j = scale * q . k_j; part->max = max_j s_j, part->sum = sum_j exp(s_j - max) and
// part->out = sum_j exp(s_j - max) v_j. scores: room for len floats. len may be 0.
void AttendRange(const KernelConfig& cfg, const float* q, const float* k, const float* v,
                 int64_t len, int64_t stride, int64_t hd, float scale, float* scores,
                 AttendPartial* part);

// An f16 KV cache stores its keys in tiles of kKvTile positions, [head_dim][kKvTile] each, so
// that decode computes a tile's scores as vectors (no sum across lanes per key); values stay rows.
inline constexpr int64_t kKvTile = 16;

// AttendRange for `heads` query heads (q + h * hd) sharing one KV head of an f16 cache, over keys
// [0, len) of a range that starts on a tile: kt its first K tile (tiles tile_stride halves apart),
// v its first V row (rows of hd). parts[h] as AttendRange's; scores: room for heads rows of
// score_stride >= len rounded up to kKvTile floats. The same softmax-weighted sums, in another
// order of the dot products' terms than AttendRange's.
void AttendTilesF16(const KernelConfig& cfg, const float* q, int64_t heads, const uint16_t* kt,
                    int64_t tile_stride, const uint16_t* v, int64_t len, int64_t hd, float scale,
                    float* scores, int64_t score_stride, AttendPartial* parts);

// out[0, hd) = the softmax-weighted sum over the union of the ranges, merged in order.
void MergeAttend(const AttendPartial* parts, int64_t count, int64_t hd, float* out);

// In-place softmax of s[0, len) (len >= 1 to do anything), vectorized.
void SoftmaxRow(const KernelConfig& cfg, float* s, int64_t len);

// An f16 KV cache's rows: out[i] = the f16 bits of x[i] (round to nearest even, saturated at
// +-65504 rather than infinity, NaN kept), the same bits on every target.
void StoreF16(const KernelConfig& cfg, const float* x, int64_t n, uint16_t* out);
// out[i] = x[i] (f16 bits) widened to f32, exactly.
void LoadF16(const KernelConfig& cfg, const uint16_t* x, int64_t n, float* out);

// The Highway target whose attention bodies run under cfg (HWY_TARGET as compiled into the body
// the table gives for cfg): cfg.target, which tests check for every supported target.
int64_t AttentionTarget(const KernelConfig& cfg);

}  // namespace sparq::cpu
