// Channel permutations for N:M and V:N:M (Pool & Yu, "Channel Permutations for N:M Sparsity",
// NeurIPS 2021): reorder the k input columns so that the groups of M adjacent columns lose as
// little saliency as possible under the pattern. Search: a sorted round-robin deal as the start,
// then greedy best-of-M^2 swaps between pairs of groups, worst groups first.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <random>

#include "sparq/prune.h"

namespace sparq {
namespace {

// Above this many groups a round pairs each group with a seeded random sample of partners
// instead of all of them (keeps a round of a 4096-column layer to ~1M swap evaluations).
constexpr int64_t kExhaustivePairGroups = 256;
constexpr int64_t kSampledPartners = 64;

// Sum of the n largest of v[0..len) (len <= 16), summed in descending order (deterministic).
inline float TopNSum(const float* v, int64_t len, int64_t n) {
  float top[16];
  int64_t cnt = 0;
  for (int64_t i = 0; i < len; ++i) {
    const float x = v[i];
    int64_t pos = cnt < n ? cnt : n;
    while (pos > 0 && top[pos - 1] < x) {
      if (pos < n) top[pos] = top[pos - 1];
      --pos;
    }
    if (pos < n) {
      top[pos] = x;
      if (cnt < n) ++cnt;
    }
  }
  float s = 0.0f;
  for (int64_t i = 0; i < cnt; ++i) s += top[i];
  return s;
}

struct Layout {
  int64_t v = 1, nrb = 0, M = 0, N = 0, G = 0, k = 0;
  std::vector<float> a;  // [k][nrb]: saliency of column c summed over row block rb
  int64_t GroupLen(int64_t g) const { return std::min(M, k - g * M); }
};

Result<Layout> MakeLayout(const Pattern& p, std::span<const float> s, int64_t m, int64_t k) {
  if (p.kind != PatternKind::kNM && p.kind != PatternKind::kVNM) {
    return InvalidInput("channel permutation needs an N:M or V:N:M pattern, not " + p.ToString());
  }
  SPARQ_RETURN_IF_ERROR(CheckPatternFits(p, m, k, "saliency"));
  if (static_cast<uint64_t>(s.size()) != static_cast<uint64_t>(m) * static_cast<uint64_t>(k)) {
    return InvalidInput("saliency: size does not match the shape");
  }
  if (k > INT32_MAX) return InvalidInput("saliency: too many columns for a permutation");
  Layout L;
  L.v = p.kind == PatternKind::kVNM ? p.v : 1;
  L.nrb = (m + L.v - 1) / L.v;
  L.M = p.m;
  L.N = p.n;
  L.k = k;
  L.G = (k + p.m - 1) / p.m;
  L.a.assign(static_cast<size_t>(k * L.nrb), 0.0f);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < k; ++j) {
      const float x = s[i * k + j];
      if (!(x >= 0.0f) || !std::isfinite(x)) {
        return InvalidInput("saliency: value at (" + std::to_string(i) + ", " + std::to_string(j) +
                            ") is negative or not finite");
      }
      L.a[j * L.nrb + i / L.v] += x;
    }
  }
  return L;
}

// kept[rb] of group g for the columns cols[0..len).
void GroupKept(const Layout& L, const int32_t* cols, int64_t len, float* out) {
  float vals[16];
  for (int64_t rb = 0; rb < L.nrb; ++rb) {
    for (int64_t j = 0; j < len; ++j) vals[j] = L.a[cols[j] * L.nrb + rb];
    out[rb] = TopNSum(vals, len, L.N);
  }
}

double TotalKept(const Layout& L, const std::vector<int32_t>& perm) {
  std::vector<float> tmp(static_cast<size_t>(L.nrb));
  double total = 0;
  for (int64_t g = 0; g < L.G; ++g) {
    GroupKept(L, perm.data() + g * L.M, L.GroupLen(g), tmp.data());
    for (float x : tmp) total += x;
  }
  return total;
}

}  // namespace

double KeptSaliency(const Pattern& p, std::span<const float> saliency, int64_t m, int64_t k,
                    std::span<const int32_t> perm) {
  auto L = MakeLayout(p, saliency, m, k);
  if (!L.ok()) return 0.0;
  std::vector<int32_t> pm(perm.begin(), perm.end());
  if (pm.empty()) {
    pm.resize(static_cast<size_t>(k));
    std::iota(pm.begin(), pm.end(), 0);
  }
  return TotalKept(*L, pm);
}

Result<PermuteResult> FindPermutation(const Pattern& p, std::span<const float> saliency, int64_t m,
                                      int64_t k, const PermuteOptions& opt) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  SPARQ_ASSIGN_OR_RETURN(Layout L, MakeLayout(p, saliency, m, k));
  PermuteResult res;
  std::vector<int32_t> ident(static_cast<size_t>(k));
  std::iota(ident.begin(), ident.end(), 0);
  res.kept_identity = TotalKept(L, ident);

  // Start: columns by total saliency, dealt round-robin over the groups' slots, so the largest
  // columns land in different groups.
  std::vector<double> tot(static_cast<size_t>(k), 0.0);
  for (int64_t c = 0; c < k; ++c) {
    for (int64_t rb = 0; rb < L.nrb; ++rb) tot[c] += L.a[c * L.nrb + rb];
  }
  std::vector<int32_t> order = ident;
  std::stable_sort(order.begin(), order.end(), [&](int32_t x, int32_t y) { return tot[x] > tot[y]; });
  std::vector<int32_t> dealt(static_cast<size_t>(k));
  int64_t next = 0;
  for (int64_t slot = 0; slot < L.M; ++slot) {
    for (int64_t g = 0; g < L.G; ++g) {
      if (g * L.M + slot < k) dealt[g * L.M + slot] = order[next++];
    }
  }
  std::vector<int32_t> perm = ident;
  double total = res.kept_identity;
  const double dealt_total = TotalKept(L, dealt);
  if (dealt_total > total) {
    perm = dealt;
    total = dealt_total;
  }

  // Per-group kept saliency per row block, and per-group totals.
  std::vector<float> kept(static_cast<size_t>(L.G * L.nrb));
  std::vector<double> gsum(static_cast<size_t>(L.G), 0.0), gmax(static_cast<size_t>(L.G), 0.0);
  auto refresh = [&](int64_t g) {
    GroupKept(L, perm.data() + g * L.M, L.GroupLen(g), kept.data() + g * L.nrb);
    double s = 0;
    for (int64_t rb = 0; rb < L.nrb; ++rb) s += kept[g * L.nrb + rb];
    gsum[g] = s;
  };
  for (int64_t g = 0; g < L.G; ++g) refresh(g);
  // What a group could keep at best is bounded by its columns' total; loss = total - kept.
  auto loss = [&](int64_t g) {
    double s = 0;
    for (int64_t j = 0; j < L.GroupLen(g); ++j) s += tot[perm[g * L.M + j]];
    return s - gsum[g];
  };

  std::mt19937_64 rng(opt.seed);
  std::vector<float> n1(static_cast<size_t>(L.nrb)), n2(static_cast<size_t>(L.nrb));
  int32_t c1[16], c2[16];
  int64_t work = 0;
  bool timed_out = false, out_of_work = false;
  for (int64_t round = 0; round < opt.max_rounds && !timed_out && !out_of_work && L.G > 1;
       ++round) {
    ++res.rounds;
    std::vector<std::pair<double, int64_t>> by_loss;
    for (int64_t g = 0; g < L.G; ++g) by_loss.push_back({-loss(g), g});
    std::sort(by_loss.begin(), by_loss.end());
    bool improved = false;
    std::vector<int64_t> partners;
    for (const auto& [neg_loss, g1] : by_loss) {
      if (neg_loss == 0.0) break;  // groups that lose nothing need no swap
      partners.clear();
      if (L.G <= kExhaustivePairGroups) {
        for (int64_t g = 0; g < L.G; ++g) {
          if (g != g1) partners.push_back(g);
        }
      } else {
        std::uniform_int_distribution<int64_t> pick(0, L.G - 1);
        for (int64_t i = 0; i < kSampledPartners; ++i) {
          const int64_t g = pick(rng);
          if (g != g1) partners.push_back(g);
        }
      }
      for (int64_t g2 : partners) {
        if (opt.time_budget_s > 0 &&
            std::chrono::duration<double>(Clock::now() - t0).count() > opt.time_budget_s) {
          timed_out = true;
          break;
        }
        const int64_t len1 = L.GroupLen(g1), len2 = L.GroupLen(g2);
        if (opt.max_work > 0 && work + len1 * len2 * L.nrb > opt.max_work) {
          out_of_work = true;
          break;
        }
        work += len1 * len2 * L.nrb;
        res.evals += len1 * len2;
        const double before = gsum[g1] + gsum[g2];
        double best = 1e-7 * std::max(before, 1e-30);
        int64_t best_a = -1, best_b = -1;
        for (int64_t a = 0; a < len1; ++a) {
          for (int64_t b = 0; b < len2; ++b) {
            std::copy(perm.begin() + g1 * L.M, perm.begin() + g1 * L.M + len1, c1);
            std::copy(perm.begin() + g2 * L.M, perm.begin() + g2 * L.M + len2, c2);
            std::swap(c1[a], c2[b]);
            GroupKept(L, c1, len1, n1.data());
            GroupKept(L, c2, len2, n2.data());
            double after = 0;
            for (int64_t rb = 0; rb < L.nrb; ++rb) after += static_cast<double>(n1[rb]) + n2[rb];
            if (after - before > best) {
              best = after - before;
              best_a = a;
              best_b = b;
            }
          }
        }
        if (best_a >= 0) {
          std::swap(perm[g1 * L.M + best_a], perm[g2 * L.M + best_b]);
          refresh(g1);
          refresh(g2);
          improved = true;
        }
      }
      if (timed_out || out_of_work) break;
    }
    if (!improved) break;
  }
  res.hit_time_budget = timed_out;
  res.hit_work_bound = out_of_work;
  res.kept_permuted = TotalKept(L, perm);
  res.perm = std::move(perm);
  return res;
}

void PermuteColumns(std::span<const float> src, std::span<float> dst, int64_t m, int64_t k,
                    std::span<const int32_t> perm) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < k; ++j) dst[i * k + j] = src[i * k + perm[j]];
  }
}

void UnpermuteColumns(std::span<const float> src, std::span<float> dst, int64_t m, int64_t k,
                      std::span<const int32_t> perm) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < k; ++j) dst[i * k + perm[j]] = src[i * k + j];
  }
}

Status ValidatePermutation(std::span<const int32_t> perm, int64_t k, const std::string& what) {
  if (static_cast<int64_t>(perm.size()) != k) {
    return InvalidInput(what + ": permutation has " + std::to_string(perm.size()) +
                        " entries, expected " + std::to_string(k));
  }
  std::vector<uint8_t> seen(static_cast<size_t>(k), 0);
  for (size_t j = 0; j < perm.size(); ++j) {
    if (perm[j] < 0 || perm[j] >= k || seen[perm[j]]) {
      return InvalidInput(what + ": entry " + std::to_string(j) + " (" + std::to_string(perm[j]) +
                          ") is out of range or repeated");
    }
    seen[perm[j]] = 1;
  }
  return Status::Ok();
}

}  // namespace sparq
