// Shared helpers of the pruning tests: synthetic problems, an independent pattern checker, and the
// reconstruction error computed directly from X.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sparq/pattern.h"
#include "sparq/prune.h"

namespace sparq::testing {

struct Problem {
  int64_t m = 0, k = 0, n = 0;
  std::vector<float> w, x;  // W [m, k], X [n, k]
  std::vector<double> h;    // X^T X / n
};
// Synthetic correlated problem (see sparq/synthetic.h); seed printed by the caller.
Problem MakeProblem(int64_t m, int64_t k, int64_t n, uint64_t seed);

// "" if W satisfies p exactly as the pruning code promises (exact counts for fraction patterns:
// W must have no zeros other than pruned ones), else a message naming the first violation.
std::string CheckPattern(const Pattern& p, const std::vector<float>& w, int64_t m, int64_t k);

// ||X W^T - X W'^T||_F^2 / ||X W^T||_F^2 in double, straight from X (independent of H).
double DirectError(const Problem& pr, const std::vector<float>& wp);

// Every pattern family the tests sweep, with shapes that fit m >= 16, k >= 8.
std::vector<Pattern> AllPatterns();

}  // namespace sparq::testing
