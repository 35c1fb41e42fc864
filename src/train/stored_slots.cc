// Route: the value slots of a matrix are mapped to dense positions by decoding a probe copy whose
// values are their own slot numbers (ToDense, in 12-bit digits so that each probe value is an
// exact f32 integer). This works for every format through its own decoder, so no format's layout
// is repeated here. A quantized matrix is probed as the same structure holding numbers (its
// quantization parts dropped from the probe): its codes play no part.
#include "src/train/stored_slots.h"

#include <variant>

namespace sparq::train {
namespace {

// Bits of the slot number each probe decodes: digit + 1 <= 4096 is exact in f32 (and never 0, so
// a decoded 0 means "no slot here").
constexpr int kDigitBits = 12;

}  // namespace

const Tensor& StoredValues(const SparseMatrix& s) {
  return std::visit([](const auto& x) -> const Tensor& { return x.values; }, s);
}
Tensor& MutableStoredValues(SparseMatrix& s) {
  return std::visit([](auto& x) -> Tensor& { return x.values; }, s);
}

const QuantParts* QuantOf(const SparseMatrix& s) {
  return std::visit(
      [](const auto& x) -> const QuantParts* {
        if constexpr (requires { x.quant; }) {
          return &x.quant;
        } else {
          return nullptr;
        }
      },
      s);
}

std::vector<int64_t> NumberShape(const SparseMatrix& s) {
  if (!IsQuantized(s)) {
    const Tensor& v = std::visit([](const auto& x) -> const Tensor& { return x.values; }, s);
    return std::vector<int64_t>(v.shape().begin(), v.shape().end());
  }
  if (const auto* nm = std::get_if<NmMatrix>(&s)) return {nm->rows, nm->groups() * nm->n};
  if (const auto* vnm = std::get_if<VnmMatrix>(&s)) return {vnm->rows, vnm->groups() * vnm->n};
  if (const auto* b = std::get_if<BsrMatrix>(&s)) return {b->nblocks(), b->bh, b->bw};
  if (const auto* c = std::get_if<CsrMatrix>(&s)) return {c->nnz()};
  return {Rows(s), Cols(s)};
}

SparseMatrix WithNumbers(const SparseMatrix& s, Tensor numbers) {
  SparseMatrix plain = s;
  std::visit(
      [](auto& x) {
        if constexpr (requires { x.quant; }) x.quant = QuantParts{};
      },
      plain);
  MutableStoredValues(plain) = std::move(numbers);
  return plain;
}

std::vector<int64_t> SlotPositions(const SparseMatrix& sm) {
  const std::vector<int64_t> shape = NumberShape(sm);
  int64_t nv = 1;
  for (int64_t d : shape) nv *= d;
  std::vector<int64_t> pos(nv, -1);
  if (KindOf(sm) == FormatKind::kDense) {
    for (int64_t i = 0; i < nv; ++i) pos[i] = i;
    return pos;
  }
  const int64_t n_dense = Rows(sm) * Cols(sm);
  std::vector<int64_t> slot(n_dense, 0);
  std::vector<bool> hit(n_dense, false);
  SparseMatrix probe = WithNumbers(sm, Tensor());  // the structure; values replaced below
  for (int shift = 0; shift == 0 || (nv - 1) >> shift > 0; shift += kDigitBits) {
    Tensor pv = Tensor::Alloc(DType::kF32, shape);
    float* p = pv.mutable_data_as<float>();
    for (int64_t i = 0; i < nv; ++i) {
      p[i] = static_cast<float>(((i >> shift) & ((1 << kDigitBits) - 1)) + 1);
    }
    MutableStoredValues(probe) = std::move(pv);
    const Tensor d = ToDense(probe);
    const float* dp = d.data_as<float>();
    for (int64_t j = 0; j < n_dense; ++j) {
      if (dp[j] == 0.0f) continue;
      hit[j] = true;
      slot[j] |= (static_cast<int64_t>(dp[j]) - 1) << shift;
    }
  }
  for (int64_t j = 0; j < n_dense; ++j) {
    if (hit[j]) pos[slot[j]] = j;
  }
  return pos;
}

}  // namespace sparq::train
