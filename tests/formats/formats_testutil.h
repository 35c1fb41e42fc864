// Helpers shared by the format tests: seeded random matrices, dtype rounding, bit-exact compare.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "sparq/dtype.h"
#include "sparq/tensor.h"

namespace sparq::testing_formats {

// Seeded rows x cols matrix: Gaussian-ish values, each element zero with probability
// `zero_fraction` (a quarter of those zeros are -0.0 when `negative_zeros`).
std::vector<float> RandomMatrix(int64_t rows, int64_t cols, uint64_t seed, double zero_fraction,
                                bool negative_zeros = false);
// Small integer scores in [0, levels): many ties, and sums that are exact in double.
std::vector<float> IntegerScores(int64_t rows, int64_t cols, uint64_t seed, int levels);
// f32 -> dtype -> f32 for each element (the reference for what a format stores).
std::vector<float> RoundThrough(DType dtype, const std::vector<float>& w);
// Compares the f32 tensor `got` [rows, cols] with `want` bit for bit.
::testing::AssertionResult BitEqual(const Tensor& got, const std::vector<float>& want,
                                    int64_t rows, int64_t cols);

}  // namespace sparq::testing_formats
