// MLP training, dense or 2:4 with SR-STE: sparq/train_mlp.h.

#include "sparq/train_mlp.h"
#include "src/train/sparse24.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <numbers>
#include <random>

#include "sparq/idx.h"
#include "src/core/blas_tiles.h"

namespace sparq::train {
namespace {

// Fashion-MNIST's pixel mean and standard deviation (of pixels / 255 over the training set).
constexpr float kPixelMean = 0.2860f;
constexpr float kPixelStd = 0.3530f;
// Images per forward call of the evaluation (bounds the activations' memory).
constexpr int64_t kEvalChunk = 1000;

// The element-wise passes as functions of restrict pointers (captured by reference in a lambda, the
// pointers would be reloaded on every iteration and the loops would not vectorize).
void AddDecay(const float* __restrict w, const uint8_t* __restrict mask, int64_t count,
              float lambda, float* __restrict g) {
  for (int64_t i = 0; i < count; ++i) g[i] += mask[i] ? 0.0f : lambda * w[i];
}

// Runs fn(r0, r1) over [0, rows) in blocks of kRowBlock rows on the pool (inline when null). The
// element-wise passes (masks, SR-STE, the update) write each row once: any split gives the same bits.
constexpr int64_t kRowBlock = 64;  // 64 rows of 1024 inputs: 256 KiB of f32 per task
void ForRows(ThreadPool* pool, int64_t rows, const std::function<void(int64_t, int64_t)>& fn) {
  const int64_t tasks = (rows + kRowBlock - 1) / kRowBlock;
  if (pool == nullptr || tasks == 1) {
    fn(0, rows);
    return;
  }
  pool->ParallelFor(tasks, [&](int64_t t, int) {
    fn(t * kRowBlock, std::min(rows, (t + 1) * kRowBlock));
  });
}

}  // namespace

Result<Mlp> Mlp::Create(const MlpOptions& opt) {
  if (opt.sizes.size() < 2) return InvalidInput("MLP: needs at least 2 layer sizes");
  for (int64_t s : opt.sizes) {
    if (s < 1 || s > (int64_t{1} << 24)) {
      return InvalidInput("MLP: layer size " + std::to_string(s) + " not in [1, 2^24]");
    }
  }
  if (opt.mask_every < 1) {
    return InvalidInput("--mask-every: " + std::to_string(opt.mask_every) + ", must be >= 1");
  }
  if (!(opt.srste >= 0.0) || !std::isfinite(opt.srste)) {
    return InvalidInput("--srste: " + std::to_string(opt.srste) + ", must be finite and >= 0");
  }
  if (!(opt.lr >= 0.0) || !std::isfinite(opt.lr)) {
    return InvalidInput("--lr: " + std::to_string(opt.lr) + ", must be finite and >= 0");
  }
  if (!(opt.momentum >= 0.0 && opt.momentum < 1.0)) {
    return InvalidInput("--momentum: " + std::to_string(opt.momentum) + ", must be in [0, 1)");
  }
  Mlp m;
  m.opt_ = opt;
  const int layers = static_cast<int>(opt.sizes.size()) - 1;
  for (int l = 0; l < layers; ++l) {
    if (m.sparse(l) && opt.sizes[l] % 4 != 0) {
      return InvalidInput("--pattern 2:4: layer " + std::to_string(l) + "'s input size " +
                          std::to_string(opt.sizes[l]) + " is not a multiple of 4");
    }
  }
  std::mt19937_64 rng(opt.seed);
  m.w_.resize(layers);
  m.b_.resize(layers);
  m.weff_.resize(layers);
  m.mask_.resize(layers);
  m.vw_.resize(layers);
  m.vb_.resize(layers);
  for (int l = 0; l < layers; ++l) {
    const int64_t in = opt.sizes[l], out = opt.sizes[l + 1];
    const double sd = std::sqrt(2.0 / static_cast<double>(in));
    m.w_[l].resize(out * in);
    for (float& v : m.w_[l]) v = static_cast<float>(sd * Normal(rng));
    m.b_[l].assign(out, 0.0f);
    m.mask_[l].assign(out * in, 1);
    m.vw_[l].assign(out * in, 0.0f);
    m.vb_[l].assign(out, 0.0f);
  }
  m.UpdateMasks(nullptr);
  return m;
}

bool Mlp::sparse(int layer) const {
  return opt_.pattern == MlpPattern::k2of4 && layer + 1 < static_cast<int>(opt_.sizes.size()) - 1;
}

void Mlp::UpdateMasks(ThreadPool* pool) {
  for (int l = 0; l < num_layers(); ++l) {
    if (!sparse(l)) continue;
    const int64_t in = opt_.sizes[l], out = opt_.sizes[l + 1];
    weff_[l].resize(w_[l].size());
    const float* __restrict w = w_[l].data();
    uint8_t* __restrict mask = mask_[l].data();
    float* __restrict weff = weff_[l].data();
    ForRows(pool, out, [&](int64_t r0, int64_t r1) {
      MaskAndApply2of4(w + r0 * in, (r1 - r0) * in, mask + r0 * in, weff + r0 * in);
    });
  }
  masks_current_ = true;
}

void Mlp::RefreshEffective() {
  for (int l = 0; l < num_layers(); ++l) {
    if (!sparse(l)) continue;
    weff_[l].resize(w_[l].size());
    for (size_t i = 0; i < w_[l].size(); ++i) weff_[l][i] = mask_[l][i] ? w_[l][i] : 0.0f;
  }
}

void Mlp::Forward(const float* x, int64_t n, float* logits, ThreadPool* pool) {
  const int layers = num_layers();
  acts_.resize(layers);
  acts_[0].assign(x, x + n * opt_.sizes[0]);
  for (int l = 0; l < layers; ++l) {
    const int64_t in = opt_.sizes[l], out = opt_.sizes[l + 1];
    const bool last = l + 1 == layers;
    float* z = logits;
    if (!last) {
      acts_[l + 1].resize(n * out);
      z = acts_[l + 1].data();
    }
    // Z[n, out] = A[n, in] W[out, in]^T (the masked products: dense sgemm on W_eff for now).
    blas::SgemmNTTiled(n, out, in, acts_[l].data(), in, effective_weight(l).data(), in, z, out,
                       pool);
    for (int64_t i = 0; i < n; ++i) {
      float* row = z + i * out;
      for (int64_t j = 0; j < out; ++j) {
        const float v = row[j] + b_[l][j];
        row[j] = last ? v : std::max(v, 0.0f);
      }
    }
  }
}

double Mlp::LossAndGrad(const float* x, const uint8_t* labels, int64_t n,
                        std::vector<std::vector<float>>* dw, std::vector<std::vector<float>>* db,
                        ThreadPool* pool) {
  return Backward(x, labels, n, dw, db, /*add_srste=*/true, pool);
}

double Mlp::Backward(const float* x, const uint8_t* labels, int64_t n,
                     std::vector<std::vector<float>>* dw, std::vector<std::vector<float>>* db,
                     bool add_srste, ThreadPool* pool) {
  const int layers = num_layers();
  const int64_t classes = opt_.sizes.back();
  std::vector<float>& dz = dz_;
  dz.resize(n * classes);
  Forward(x, n, dz.data(), pool);
  // Softmax cross-entropy in double per row; dz = (p - onehot) / n.
  double loss = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    float* row = &dz[i * classes];
    double mx = row[0];
    for (int64_t j = 1; j < classes; ++j) mx = std::max(mx, static_cast<double>(row[j]));
    double sum = 0.0;
    for (int64_t j = 0; j < classes; ++j) sum += std::exp(row[j] - mx);
    loss += std::log(sum) + mx - row[labels[i]];
    for (int64_t j = 0; j < classes; ++j) {
      const double p = std::exp(row[j] - mx) / sum;
      row[j] = static_cast<float>((p - (j == labels[i] ? 1.0 : 0.0)) / static_cast<double>(n));
    }
  }
  dw->resize(layers);
  db->resize(layers);
  std::vector<float>&dzt = dzt_, &da = da_;
  for (int l = layers - 1; l >= 0; --l) {
    const int64_t in = opt_.sizes[l], out = opt_.sizes[l + 1];
    auto& gb = (*db)[l];
    gb.assign(out, 0.0f);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < out; ++j) gb[j] += dz[i * out + j];
    }
    // dW[out, in] = dZ^T A: dZ transposed once so the product is a plain row-major sgemm.
    dzt.resize(out * n);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < out; ++j) dzt[j * n + i] = dz[i * out + j];
    }
    auto& gw = (*dw)[l];
    gw.resize(out * in);
    blas::SgemmTiled(out, in, n, 1.0f, dzt.data(), n, acts_[l].data(), in, 0.0f, gw.data(), in,
                     pool);
    if (add_srste && sparse(l) && opt_.srste > 0.0) {
      // SR-STE: decay the pruned master weights (the STE alone would let them grow unchecked).
      const float lambda = static_cast<float>(opt_.srste);
      const float* __restrict w = w_[l].data();
      const uint8_t* __restrict mask = mask_[l].data();
      float* __restrict g = gw.data();
      ForRows(pool, out, [&](int64_t r0, int64_t r1) {
        AddDecay(w + r0 * in, mask + r0 * in, (r1 - r0) * in, lambda, g + r0 * in);
      });
    }
    if (l == 0) break;
    // dA[n, in] = dZ W_eff; through the ReLU of the layer below (its output acts_[l] > 0).
    da.resize(n * in);
    blas::SgemmTiled(n, in, out, 1.0f, dz.data(), out, effective_weight(l).data(), in, 0.0f,
                     da.data(), in, pool);
    for (size_t i = 0; i < da.size(); ++i) {
      if (acts_[l][i] <= 0.0f) da[i] = 0.0f;
    }
    dz.swap(da);
  }
  return loss / static_cast<double>(n);
}

double Mlp::Step(const float* x, const uint8_t* labels, int64_t n, double lr, ThreadPool* pool) {
  if (t_ % opt_.mask_every == 0 && !masks_current_) UpdateMasks(pool);
  // When the next step recomputes the masks, the update pass below makes them (and W_eff) from
  // the weights it has just written, while they are in cache: the same bytes as UpdateMasks at
  // the next step's start, one pass over the weights fewer.
  const bool remask = (t_ + 1) % opt_.mask_every == 0;
  // SR-STE's decay is added in the update's pass below (one pass over the weights fewer).
  const double loss = Backward(x, labels, n, &dw_, &db_, /*add_srste=*/false, pool);
  const float mu = static_cast<float>(opt_.momentum), step = static_cast<float>(lr);
  const float lambda = static_cast<float>(opt_.srste);
  for (int l = 0; l < num_layers(); ++l) {
    const int64_t in = opt_.sizes[l], out = opt_.sizes[l + 1];
    const bool sp = sparse(l);
    // The update, and W_eff = W * M of the current mask (or of the next) in the same pass.
    float* __restrict w = w_[l].data();
    float* __restrict v = vw_[l].data();
    const float* __restrict g = dw_[l].data();
    uint8_t* __restrict mask = mask_[l].data();
    float* __restrict weff = sp ? weff_[l].data() : nullptr;
    ForRows(pool, out, [&](int64_t r0, int64_t r1) {
      const int64_t at = r0 * in, count = (r1 - r0) * in;
      if (sp && remask) {
        SgdMomentumRun(g + at, mask + at, count, mu, step, lambda, v + at, w + at, nullptr);
        MaskAndApply2of4(w + at, count, mask + at, weff + at);
      } else if (sp) {
        SgdMomentumRun(g + at, mask + at, count, mu, step, lambda, v + at, w + at, weff + at);
      } else {
        SgdMomentumRun(g + at, nullptr, count, mu, step, 0.0f, v + at, w + at, nullptr);
      }
    });
    for (int64_t i = 0; i < out; ++i) {
      vb_[l][i] = mu * vb_[l][i] + db_[l][i];
      b_[l][i] -= step * vb_[l][i];
    }
  }
  ++t_;
  masks_current_ = remask;
  return loss;
}

namespace {

std::vector<float> Normalize(const std::vector<uint8_t>& pixels) {
  std::vector<float> out(pixels.size());
  for (size_t i = 0; i < pixels.size(); ++i) {
    out[i] = (static_cast<float>(pixels[i]) / 255.0f - kPixelMean) / kPixelStd;
  }
  return out;
}

double Accuracy(Mlp& m, const std::vector<float>& x, const std::vector<uint8_t>& labels,
                ThreadPool* pool) {
  const int64_t d0 = m.options().sizes.front(), classes = m.options().sizes.back();
  const int64_t count = static_cast<int64_t>(labels.size());
  std::vector<float> logits(kEvalChunk * classes);
  int64_t right = 0;
  for (int64_t s = 0; s < count; s += kEvalChunk) {
    const int64_t n = std::min(kEvalChunk, count - s);
    m.Forward(&x[s * d0], n, logits.data(), pool);
    for (int64_t i = 0; i < n; ++i) {
      const float* row = &logits[i * classes];
      right += (std::max_element(row, row + classes) - row) == labels[s + i];
    }
  }
  return static_cast<double>(right) / static_cast<double>(count);
}

}  // namespace

Result<MnistTrainResult> TrainFashionMnist(const MnistTrainOptions& opt, ThreadPool* pool) {
  if (opt.batch < 1 || opt.batch > 60000) {
    return InvalidInput("--batch: " + std::to_string(opt.batch) + ", must be in [1, 60000]");
  }
  if (opt.steps < 0) return InvalidInput("--steps: must be >= 0");
  if (opt.steps == 0 && opt.epochs < 1) {
    return InvalidInput("--epochs: " + std::to_string(opt.epochs) + ", must be >= 1");
  }
  MlpOptions mo = opt.mlp;
  if (mo.sizes.front() != 784 || mo.sizes.back() != 10) {
    return InvalidInput("fashion-mnist: the MLP must map 784 pixels to 10 classes");
  }
  SPARQ_ASSIGN_OR_RETURN(Mlp m, Mlp::Create(mo));
  SPARQ_ASSIGN_OR_RETURN(FashionMnist data, LoadFashionMnist(opt.data_dir));
  const std::vector<float> train_x = Normalize(data.train_images.pixels);
  const std::vector<float> test_x = Normalize(data.test_images.pixels);
  const int64_t count = static_cast<int64_t>(data.train_labels.size());
  const int64_t per_epoch = count / opt.batch;
  if (per_epoch < 1) return InvalidInput("--batch: larger than the training set");
  const int64_t total = opt.steps > 0 ? opt.steps : opt.epochs * per_epoch;

  MnistTrainResult r;
  r.batch = opt.batch;
  // The data order's own engine (seeded from the run's seed, apart from the weights' draws).
  std::mt19937_64 order_rng(mo.seed ^ 0x9e3779b97f4a7c15ull);
  std::vector<int64_t> order(count);
  std::vector<float> bx(opt.batch * 784);
  std::vector<uint8_t> by(opt.batch);
  std::vector<double> step_ms;
  step_ms.reserve(total);
  double epoch_loss = 0.0;
  int64_t epoch_steps = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t t = 0; t < total; ++t) {
    const int64_t pos = t % per_epoch;
    if (pos == 0) {
      for (int64_t i = 0; i < count; ++i) order[i] = i;
      for (int64_t i = count - 1; i > 0; --i) {
        std::swap(order[i], order[order_rng() % static_cast<uint64_t>(i + 1)]);
      }
      epoch_loss = 0.0;
      epoch_steps = 0;
    }
    for (int64_t i = 0; i < opt.batch; ++i) {
      const int64_t src = order[pos * opt.batch + i];
      std::copy_n(&train_x[src * 784], 784, &bx[i * 784]);
      by[i] = data.train_labels[src];
    }
    const double lr =
        mo.lr * 0.5 * (1.0 + std::cos(std::numbers::pi * static_cast<double>(t) / total));
    const auto s0 = std::chrono::steady_clock::now();
    const double loss = m.Step(bx.data(), by.data(), opt.batch, lr, pool);
    step_ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s0).count());
    if (!std::isfinite(loss)) {
      return InvalidInput("training diverged at step " + std::to_string(t + 1) +
                          " (loss not finite): lower --lr");
    }
    epoch_loss += loss;
    ++epoch_steps;
    if (pos == per_epoch - 1 || t + 1 == total) {
      const double acc = Accuracy(m, test_x, data.test_labels, pool);
      r.epoch_test_accuracy.push_back(acc);
      r.final_loss = epoch_loss / static_cast<double>(epoch_steps);
      if (opt.progress) opt.progress(t + 1, total, r.final_loss, acc);
    }
  }
  r.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.steps = total;
  r.epochs_run = (total + per_epoch - 1) / per_epoch;
  r.test_accuracy = r.epoch_test_accuracy.back();
  std::nth_element(step_ms.begin(), step_ms.begin() + step_ms.size() / 2, step_ms.end());
  r.median_step_ms = step_ms[step_ms.size() / 2];
  int64_t zeros = 0, all = 0;
  for (int l = 0; l < m.num_layers(); ++l) {
    for (float v : m.effective_weight(l)) zeros += v == 0.0f;
    all += static_cast<int64_t>(m.effective_weight(l).size());
  }
  r.sparse_fraction = static_cast<double>(zeros) / static_cast<double>(all);
  return r;
}

}  // namespace sparq::train
