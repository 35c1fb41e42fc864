#include "sparq/synthetic.h"

#include <algorithm>
#include <cmath>

#include "src/core/blas_tiles.h"

namespace sparq {
namespace {

// Standard normal samples (Box-Muller on splitmix64).
class Gaussian {
 public:
  explicit Gaussian(uint64_t seed) : state_(seed) {}
  double Next();
  uint64_t NextU64();

 private:
  uint64_t state_;
  bool have_ = false;
  double spare_ = 0;
};

uint64_t Gaussian::NextU64() {
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double Gaussian::Next() {
  if (have_) {
    have_ = false;
    return spare_;
  }
  // u1 in (0, 1], u2 in [0, 1).
  const double u1 = (static_cast<double>(NextU64() >> 11) + 1.0) * 0x1.0p-53;
  const double u2 = static_cast<double>(NextU64() >> 11) * 0x1.0p-53;
  const double r = std::sqrt(-2.0 * std::log(u1));
  spare_ = r * std::sin(2.0 * M_PI * u2);
  have_ = true;
  return r * std::cos(2.0 * M_PI * u2);
}

}  // namespace

std::vector<float> SyntheticInputs(int64_t n, int64_t k, uint64_t seed, double outlier_scale) {
  Gaussian g(seed);
  const int64_t r = std::max<int64_t>(4, k / 16);
  std::vector<float> x(static_cast<size_t>(n * k)), zr(static_cast<size_t>(n * r)),
      q(static_cast<size_t>(r * k));
  for (auto& v : x) v = static_cast<float>(0.3 * g.Next());
  for (auto& v : zr) v = static_cast<float>(g.Next());
  const double qs = 1.0 / std::sqrt(static_cast<double>(r));
  for (auto& v : q) v = static_cast<float>(qs * g.Next());
  // The tile grid keeps X the same for any OpenBLAS thread count (see blas_tiles.h).
  blas::SgemmTiled(n, k, r, 1.0f, zr.data(), r, q.data(), k, 1.0f, x.data(), k, nullptr);
  std::vector<float> s(static_cast<size_t>(k));
  for (auto& v : s) v = static_cast<float>(std::exp(0.5 * g.Next()));
  const int64_t outliers = std::min<int64_t>(k, std::max<int64_t>(1, k / 100));
  for (int64_t i = 0; i < outliers; ++i) {
    s[g.NextU64() % static_cast<uint64_t>(k)] *= static_cast<float>(outlier_scale);
  }
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < k; ++j) x[i * k + j] *= s[j];
  }
  return x;
}

std::vector<float> SyntheticWeights(int64_t m, int64_t k, uint64_t seed) {
  Gaussian g(seed ^ 0xabcdef12345ull);
  std::vector<float> w(static_cast<size_t>(m * k));
  const double sc = 1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(k, 1)));
  for (auto& v : w) v = static_cast<float>(sc * g.Next());
  return w;
}

}  // namespace sparq
