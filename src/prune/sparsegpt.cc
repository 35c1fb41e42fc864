// SparseGPT (Frantar & Alistarh 2023), following the reference IST-DASLab/sparsegpt sparsegpt.py:
// dead inputs zeroed, H damped, U = upper Cholesky factor of H^-1, then columns in blocks of B:
// inside a block each row is processed column by column (choose the mask, quantize if asked,
// err = (w - q) / U_jj, update the block's remaining columns with err * U[j, j+1:]), and after the
// block the remaining columns get the batched update W[:, i2:] -= Err @ U[i1:i2, i2:] (one sgemm).
//
// Within a block the rows never interact (the mask of a block is chosen at its start from all
// rows, then each row only reads U), so rows run in parallel with bit-identical results for any
// thread count; the batched update and the row quadratic forms run as fixed tile grids
// (blas_tiles.h), and the factorization on one OpenBLAS thread, so those do not depend on
// threads either.
#include <lapacke.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "src/core/blas_tiles.h"
#include "src/prune/prune_internal.h"

namespace sparq::prune_internal {
namespace {

// Rows per parallel task inside a column block: the task's rows of the block (16 x 128 floats =
// 8 KiB) stay in L1 while it sweeps the block's columns.
constexpr int64_t kRowTile = 16;

int64_t Lcm(int64_t a, int64_t b) { return a / std::gcd(a, b) * b; }

// Row quadratic forms w_i H w_i^T (the error of zeroing row i entirely), via dgemm on panels.
std::vector<double> RowQuadForms(std::span<const float> w, int64_t m, int64_t k,
                                 std::span<const double> h, ThreadPool* pool) {
  constexpr int64_t kPanel = 64;
  std::vector<double> out(static_cast<size_t>(m)), a(static_cast<size_t>(kPanel * k)),
      t(static_cast<size_t>(kPanel * k));
  for (int64_t r0 = 0; r0 < m; r0 += kPanel) {
    const int64_t nr = std::min(kPanel, m - r0);
    for (int64_t i = 0; i < nr * k; ++i) a[i] = w[r0 * k + i];
    blas::DgemmTiled(nr, k, k, 1.0, a.data(), k, h.data(), k, 0.0, t.data(), k, pool);
    for (int64_t r = 0; r < nr; ++r) {
      double s = 0;
      for (int64_t j = 0; j < k; ++j) s += a[r * k + j] * t[r * k + j];
      out[r0 + r] = s;
    }
  }
  return out;
}

// A PSD matrix computed in floating point (X^T X / N) can have eigenvalues of about
// -k * eps * max(diag) from rounding; anything below -1e-9 * k * max(diag) is a real violation.
constexpr double kIndefiniteTolerance = 1e-9;

// OpenBLAS 0.3.21 switches dpotrf and dtrtri (and dsyevr) to differently blocked parallel code
// paths when it runs with more than one thread, which changes the bits of the factor (measured:
// k = 2048, 1 vs 2 threads). So they run with OpenBLAS pinned to one thread; the factorization is
// about a tenth of the SparseGPT work on a square layer.

double SmallestEigenvalue(std::span<const double> h, int64_t k) {
  // dsyevr is threaded too; keep the decision independent of threads.
  blas::OpenBlasThreads pin(1);
  std::vector<double> a(h.begin(), h.end()), w(static_cast<size_t>(k));
  lapack_int found = 0;
  std::vector<lapack_int> isuppz(2);
  double z = 0;
  if (LAPACKE_dsyevr(LAPACK_ROW_MAJOR, 'N', 'I', 'U', static_cast<lapack_int>(k), a.data(),
                     static_cast<lapack_int>(k), 0.0, 0.0, 1, 1, 0.0, &found, w.data(), &z, 1,
                     isuppz.data()) != 0 ||
      found < 1) {
    return 0.0;  // unknown: let the damping retries decide
  }
  return w[0];
}

}  // namespace

bool InverseCholeskyUpper(std::span<const double> h, int64_t k, double lambda,
                          std::vector<double>* u) {
  // With P the reversal permutation and P (H + lambda I) P = L L^T, (H + lambda I)^-1 = U^T U for
  // U = P L^-1 P, which is upper triangular with a positive diagonal: the same factor as
  // cholesky(cholesky_inverse(cholesky(H)), upper=True) in the reference, for one factorization
  // and one triangular inverse instead of two factorizations and a full inverse.
  blas::OpenBlasThreads pin(1);
  std::vector<double> a(static_cast<size_t>(k * k));
  for (int64_t i = 0; i < k; ++i) {
    for (int64_t j = 0; j <= i; ++j) {
      a[i * k + j] = h[(k - 1 - i) * k + (k - 1 - j)] + (i == j ? lambda : 0.0);
    }
  }
  // Row-major lower is column-major upper: call LAPACK in column-major on the same buffer (no
  // transposed copies): potrf gives A = Uc^T Uc, i.e. row-major L = Uc^T; trtri inverts in place.
  if (LAPACKE_dpotrf(LAPACK_COL_MAJOR, 'U', static_cast<lapack_int>(k), a.data(),
                     static_cast<lapack_int>(k)) != 0) {
    return false;
  }
  if (LAPACKE_dtrtri(LAPACK_COL_MAJOR, 'U', 'N', static_cast<lapack_int>(k), a.data(),
                     static_cast<lapack_int>(k)) != 0) {
    return false;
  }
  u->assign(static_cast<size_t>(k * k), 0.0);
  for (int64_t i = 0; i < k; ++i) {
    for (int64_t j = i; j < k; ++j) {
      const double v = a[(k - 1 - i) * k + (k - 1 - j)];
      if (!std::isfinite(v)) return false;
      (*u)[i * k + j] = v;
    }
    if (!((*u)[i * k + i] > 0)) return false;
  }
  return true;
}

Status SparseGpt(std::span<float> w, int64_t m, int64_t k, std::span<const double> h,
                 const Pattern& p, const PruneOptions& opt, PruneReport* report) {
  if (m == 0 || k == 0) return Status::Ok();
  using Clock = std::chrono::steady_clock;
  auto since = [](Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  };
  const auto t_factor = Clock::now();
  // ---- dead inputs and damping
  std::vector<double> hd(h.begin(), h.end());
  double diag_sum = 0;
  for (int64_t j = 0; j < k; ++j) {
    if (hd[j * k + j] == 0.0) {
      hd[j * k + j] = 1.0;
      for (int64_t i = 0; i < m; ++i) w[i * k + j] = 0.0f;
      ++report->dead_inputs;
    }
    diag_sum += hd[j * k + j];
  }
  const double mean_diag = diag_sum / static_cast<double>(k);
  std::vector<double> ud;
  double damp = opt.damp;
  bool ok = false;
  for (int attempt = 0; attempt <= opt.max_damp_retries; ++attempt) {
    if (attempt == 1) {
      // Before damping harder, tell a genuinely indefinite H (a bad input) from a singular or
      // ill-conditioned one (few calibration rows): only the smallest eigenvalue is computed, and
      // only on this failure path.
      const double lmin = SmallestEigenvalue(h, k);
      double hmax = 0;
      for (int64_t j = 0; j < k; ++j) hmax = std::max(hmax, h[j * k + j]);
      if (lmin < -kIndefiniteTolerance * std::max(hmax, 1e-300) * static_cast<double>(k)) {
        return InvalidInput(opt.what + ": Hessian is not positive semi-definite (smallest "
                            "eigenvalue " + std::to_string(lmin) + ", largest diagonal " +
                            std::to_string(hmax) + ")");
      }
    }
    if (attempt > 0) {
      damp = std::max(damp, 1e-4) * 10.0;
      ++report->damp_retries;
    }
    if (InverseCholeskyUpper(hd, k, damp * mean_diag, &ud)) {
      ok = true;
      break;
    }
  }
  if (!ok) {
    return InvalidInput(opt.what + ": Hessian is not positive definite even with damping " +
                        std::to_string(damp) + " x mean(diag H) after " +
                        std::to_string(report->damp_retries) + " retries");
  }
  report->damp_used = damp;
  std::vector<float> u(ud.begin(), ud.end());
  ud.clear();
  ud.shrink_to_fit();
  report->factor_seconds = since(t_factor);

  // ---- block size: whole N:M groups, whole blocks, whole quantization groups per column block
  int64_t unit = 1;
  if (p.kind == PatternKind::kNM || p.kind == PatternKind::kVNM) unit = p.m;
  if (p.kind == PatternKind::kBlock) unit = p.bw;
  if (opt.quantizer && opt.quantizer->group_size() > 0) unit = Lcm(unit, opt.quantizer->group_size());
  const int64_t bs = std::max<int64_t>(1, (std::max<int64_t>(opt.blocksize, 1) + unit - 1) / unit) * unit;

  // ---- whole rows: the OBS error of removing row i is exactly w_i H w_i^T (no other weight of the
  // row survives to compensate, and rows do not interact), so prune the rows where it is smallest.
  std::vector<uint8_t> row_keep(static_cast<size_t>(m), 1);
  if (p.kind == PatternKind::kRows && opt.fixed_mask.empty()) {
    std::vector<double> q = RowQuadForms(w, m, k, h, opt.pool);
    std::vector<float> qf(q.begin(), q.end()), scratch;
    KeepTop(qf.data(), m, m - std::llround(p.fraction * static_cast<double>(m)), row_keep.data(),
            &scratch);
  }

  Quantizer* quant = opt.quantizer;
  const int64_t qgroup = quant ? quant->group_size() : 0;
  const bool group_masks = p.kind == PatternKind::kNM || p.kind == PatternKind::kVNM;
  const int64_t tile = p.kind == PatternKind::kVNM ? p.v : kRowTile;
  const int64_t ntiles = (m + tile - 1) / tile;
  std::vector<float> w1(static_cast<size_t>(m * bs)), e1(static_cast<size_t>(m * bs)),
      tmp(static_cast<size_t>(m * bs)), scratch;
  std::vector<uint8_t> keep1(static_cast<size_t>(m * bs));
  std::vector<int64_t> pruned_per_tile(static_cast<size_t>(ntiles), 0);

  for (int64_t i1 = 0; i1 < k; i1 += bs) {
    const int64_t i2 = std::min(k, i1 + bs), nb = i2 - i1;
    for (int64_t r = 0; r < m; ++r) {
      std::copy(w.begin() + r * k + i1, w.begin() + r * k + i2, w1.begin() + r * nb);
    }
    std::fill(keep1.begin(), keep1.begin() + m * nb, 1);
    // ---- block-level masks from scores w^2 / U_jj^2 at the block's start
    auto score = [&](int64_t r, int64_t j) {
      const float d = u[(i1 + j) * k + i1 + j];
      const float x = w1[r * nb + j];
      return x * x / (d * d);
    };
    const bool fixed = !opt.fixed_mask.empty();
    if (fixed) {
      for (int64_t r = 0; r < m; ++r) {
        std::copy(opt.fixed_mask.begin() + r * k + i1, opt.fixed_mask.begin() + r * k + i2,
                  keep1.begin() + r * nb);
      }
    }
    switch (fixed ? PatternKind::kDense : p.kind) {
      case PatternKind::kUnstructured:
        for (int64_t r = 0; r < m; ++r) {
          for (int64_t j = 0; j < nb; ++j) tmp[r * nb + j] = score(r, j);
        }
        if (p.per_row || opt.per_row_mask) {
          for (int64_t r = 0; r < m; ++r) {
            const int64_t n = p.per_row ? CumulativeCount(p.fraction, i1, i2)
                                        : CumulativeCount(p.fraction, r * k + i1, r * k + i2);
            KeepTop(tmp.data() + r * nb, nb, nb - n, keep1.data() + r * nb, &scratch);
          }
        } else {
          KeepTop(tmp.data(), m * nb, m * nb - CumulativeCount(p.fraction, m * i1, m * i2),
                  keep1.data(), &scratch);
        }
        break;
      case PatternKind::kCols: {
        std::vector<float> cs(static_cast<size_t>(nb));
        std::vector<uint8_t> ck(static_cast<size_t>(nb), 1);
        for (int64_t j = 0; j < nb; ++j) {
          double acc = 0;
          for (int64_t r = 0; r < m; ++r) acc += score(r, j);
          cs[j] = static_cast<float>(acc);
        }
        KeepTop(cs.data(), nb, nb - CumulativeCount(p.fraction, i1, i2), ck.data(), &scratch);
        for (int64_t r = 0; r < m; ++r) {
          for (int64_t j = 0; j < nb; ++j) keep1[r * nb + j] = ck[j];
        }
        break;
      }
      case PatternKind::kBlock: {
        const int64_t nbr = (m + p.bh - 1) / p.bh;
        const int64_t bc0 = i1 / p.bw, bc1 = (i2 + p.bw - 1) / p.bw, nbc = bc1 - bc0;
        std::vector<float> bsc(static_cast<size_t>(nbr * nbc), 0.0f);
        std::vector<uint8_t> bk(bsc.size(), 1);
        for (int64_t bi = 0; bi < nbr; ++bi) {
          for (int64_t bj = 0; bj < nbc; ++bj) {
            double acc = 0;
            for (int64_t r = bi * p.bh; r < std::min(m, (bi + 1) * p.bh); ++r) {
              for (int64_t j = bj * p.bw; j < std::min(nb, (bj + 1) * p.bw); ++j) acc += score(r, j);
            }
            bsc[bi * nbc + bj] = static_cast<float>(acc);
          }
        }
        KeepTop(bsc.data(), nbr * nbc,
                nbr * nbc - CumulativeCount(p.fraction, nbr * bc0, nbr * bc1), bk.data(), &scratch);
        for (int64_t r = 0; r < m; ++r) {
          for (int64_t j = 0; j < nb; ++j) keep1[r * nb + j] = bk[(r / p.bh) * nbc + j / p.bw];
        }
        break;
      }
      case PatternKind::kRows:
        for (int64_t r = 0; r < m; ++r) {
          if (!row_keep[r]) std::fill(keep1.begin() + r * nb, keep1.begin() + (r + 1) * nb, 0);
        }
        break;
      default:
        break;
    }

    // ---- column sweep, rows in parallel
    auto run_tile = [&](int64_t t, int) {
      const int64_t r0 = t * tile, r1 = std::min(m, r0 + tile);
      int64_t pruned = 0;
      float gs[16];
      // N:M / V:N:M masks of the groups of m columns in [i, i + span), from the current weights.
      auto choose_masks = [&](int64_t i, int64_t span) {
        for (int64_t i0 = i; i0 < std::min(nb, i + span); i0 += p.m) {
          const int64_t len = std::min<int64_t>(p.m, nb - i0);
          const int64_t v = p.kind == PatternKind::kVNM ? p.v : 1;
          for (int64_t b0 = r0; b0 < r1; b0 += v) {
            const int64_t b1 = std::min(r1, b0 + v);
            for (int64_t j = 0; j < len; ++j) {
              double acc = 0;
              for (int64_t r = b0; r < b1; ++r) acc += score(r, i0 + j);
              gs[j] = static_cast<float>(acc);
            }
            const uint32_t bits = KeepTopInGroup(gs, static_cast<int>(len),
                                                 std::min<int>(p.n, static_cast<int>(len)));
            for (int64_t r = b0; r < b1; ++r) {
              for (int64_t j = 0; j < len; ++j) keep1[r * nb + i0 + j] = (bits >> j) & 1u;
            }
          }
        }
      };
      // A quantization group spanning whole groups of m is fitted on the weights its masks would
      // keep at its start; the masks are then chosen as usual, m columns at a time, after the
      // compensation of the columns before them. (Choosing the whole group's masks at its start
      // instead cost more in reconstruction error than the better-fitted scale won back.)
      const bool choose = group_masks && !fixed;
      const bool fit_on_mask = choose && qgroup > 0 && qgroup % p.m == 0;
      for (int64_t i = 0; i < nb; ++i) {
        const int64_t col = i1 + i;
        if (qgroup > 0 && col % qgroup == 0) {
          if (fit_on_mask) choose_masks(i, qgroup);
          for (int64_t r = r0; r < r1; ++r) {
            quant->FitGroup(r, col, &w1[r * nb + i], &keep1[r * nb + i], std::min(qgroup, nb - i));
          }
        }
        if (choose && i % p.m == 0) choose_masks(i, p.m);
        const float d = u[col * k + col];
        const float* urow = &u[col * k + i1];
        for (int64_t r = r0; r < r1; ++r) {
          float* wr = &w1[r * nb];
          const float x = wr[i];
          float q = 0.0f;
          if (keep1[r * nb + i]) {
            q = quant ? quant->Quantize(r, col, x) : x;
          } else {
            ++pruned;
          }
          const float err = (x - q) / d;
          wr[i] = q;
          e1[r * nb + i] = err;
          if (err != 0.0f) {
            for (int64_t j = i + 1; j < nb; ++j) wr[j] -= err * urow[j];
          }
        }
      }
      pruned_per_tile[t] += pruned;
    };
    if (opt.pool) {
      opt.pool->ParallelFor(ntiles, run_tile);
    } else {
      for (int64_t t = 0; t < ntiles; ++t) run_tile(t, 0);
    }
    for (int64_t r = 0; r < m; ++r) {
      std::copy(w1.begin() + r * nb, w1.begin() + (r + 1) * nb, w.begin() + r * k + i1);
    }
    if (i2 < k) {
      const auto t_update = Clock::now();
      blas::SgemmTiled(m, k - i2, nb, -1.0f, e1.data(), nb, u.data() + i1 * k + i2, k, 1.0f,
                       w.data() + i2, k, opt.pool);
      report->update_seconds += since(t_update);
    }
  }
  report->pruned = std::accumulate(pruned_per_tile.begin(), pruned_per_tile.end(), int64_t{0});
  return Status::Ok();
}

namespace {

// The swept (permuted) column j is original column perm[j]: the inner quantizer's static groups
// are looked up there. No lazy fitting (group_size 0): the groups were fitted before the sweep.
class PermutedQuantizer : public Quantizer {
 public:
  PermutedQuantizer(const Quantizer& inner, const std::vector<int32_t>& perm)
      : inner_(inner), perm_(perm) {}
  float Quantize(int64_t row, int64_t col, float w) const override {
    return inner_.Quantize(row, perm_[static_cast<size_t>(col)], w);
  }

 private:
  const Quantizer& inner_;
  const std::vector<int32_t>& perm_;
};

}  // namespace

Status SparseGptActOrder(std::span<float> w, int64_t m, int64_t k, std::span<const double> h,
                         const Pattern& p, const PruneOptions& opt, PruneReport* report) {
  if (m == 0 || k == 0) return Status::Ok();
  Quantizer* quant = opt.quantizer;
  std::vector<uint8_t> ones;
  std::span<const uint8_t> mask = opt.fixed_mask;
  if (mask.empty()) {
    ones.assign(static_cast<size_t>(m * k), 1);
    mask = ones;
  }
  // Static groups: each group's grid from the weights as given (the stored formats keep groups
  // as column ranges of the original order, which the permuted sweep visits out of order).
  if (const int64_t g = quant->group_size(); g > 0) {
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t c = 0; c < k; c += g) {
        quant->FitGroup(r, c, &w[r * k + c], &mask[r * k + c], std::min(g, k - c));
      }
    }
  }
  // Decreasing H_jj; ties (and dead inputs, H_jj = 0, last) in column order.
  std::vector<int32_t> perm(static_cast<size_t>(k));
  std::iota(perm.begin(), perm.end(), 0);
  std::stable_sort(perm.begin(), perm.end(),
                   [&](int32_t a, int32_t b) { return h[a * k + a] > h[b * k + b]; });
  std::vector<float> wp(static_cast<size_t>(m * k));
  PermuteColumns(w, wp, m, k, perm);
  std::vector<double> hp(static_cast<size_t>(k * k));
  for (int64_t i = 0; i < k; ++i) {
    for (int64_t j = 0; j < k; ++j) hp[i * k + j] = h[perm[i] * k + perm[j]];
  }
  std::vector<uint8_t> maskp;
  PruneOptions o = opt;
  if (!opt.fixed_mask.empty()) {
    maskp.resize(static_cast<size_t>(m * k));
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t j = 0; j < k; ++j) maskp[r * k + j] = opt.fixed_mask[r * k + perm[j]];
    }
    o.fixed_mask = maskp;
  }
  PermutedQuantizer pq(*quant, perm);
  o.quantizer = &pq;
  o.act_order = false;
  SPARQ_RETURN_IF_ERROR(SparseGpt(wp, m, k, hp, p, o, report));
  UnpermuteColumns(wp, w, m, k, perm);
  return Status::Ok();
}

}  // namespace sparq::prune_internal
