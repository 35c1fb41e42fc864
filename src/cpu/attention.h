// Decode attention of one query row (see attention.cc).
#pragma once

#include <cstdint>

namespace sparq::cpu {

// out[0, hd) = softmax_j(scale * q . k_j) weighted sum of v_j over j < len, where k_j = k + j *
// stride and v_j = v + j * stride (rows of a KV cache). scores: room for len floats (left holding
// the probabilities).
void AttendRow(const float* q, const float* k, const float* v, int64_t len, int64_t stride,
               int64_t hd, float scale, float* scores, float* out);

}  // namespace sparq::cpu
