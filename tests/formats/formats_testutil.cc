#include "formats/formats_testutil.h"

#include <cstring>
#include <random>
#include <sstream>

namespace sparq::testing_formats {

std::vector<float> RandomMatrix(int64_t rows, int64_t cols, uint64_t seed, double zero_fraction,
                                bool negative_zeros) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  std::vector<float> w(static_cast<size_t>(rows * cols));
  for (float& x : w) {
    const double u = uni(rng);
    if (u < zero_fraction) {
      x = (negative_zeros && u < zero_fraction / 4) ? -0.0f : 0.0f;
    } else {
      x = normal(rng);
      if (x == 0.0f) x = 1.0f;
    }
  }
  return w;
}

std::vector<float> IntegerScores(int64_t rows, int64_t cols, uint64_t seed, int levels) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> d(0, levels - 1);
  std::vector<float> s(static_cast<size_t>(rows * cols));
  for (float& x : s) x = static_cast<float>(d(rng));
  return s;
}

std::vector<float> RoundThrough(DType dtype, const std::vector<float>& w) {
  std::vector<float> out(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    switch (dtype) {
      case DType::kBF16: out[i] = BF16ToF32(F32ToBF16(w[i])); break;
      case DType::kF16: out[i] = F16ToF32(F32ToF16(w[i])); break;
      default: out[i] = w[i]; break;
    }
  }
  return out;
}

::testing::AssertionResult BitEqual(const Tensor& got, const std::vector<float>& want,
                                    int64_t rows, int64_t cols) {
  if (got.dtype() != DType::kF32 || got.shape() != std::vector<int64_t>{rows, cols}) {
    return ::testing::AssertionFailure()
           << "dense result is " << got.ShapeString() << ", expected f32[" << rows << ", " << cols
           << "]";
  }
  const float* g = got.data_as<float>();
  for (size_t i = 0; i < want.size(); ++i) {
    if (F32Bits(g[i]) != F32Bits(want[i])) {
      std::ostringstream os;
      os << "element (" << i / cols << ", " << i % cols << "): got " << g[i] << " (0x" << std::hex
         << F32Bits(g[i]) << "), want " << want[i] << " (0x" << F32Bits(want[i]) << ")";
      return ::testing::AssertionFailure() << os.str();
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace sparq::testing_formats
