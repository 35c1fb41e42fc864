// The epilogue outside the kernels: the reference's scalar form and the vector row form.
#include <cmath>

#include "src/cpu/kernel_entry.h"
#include "src/cpu/spmm.h"

namespace sparq::cpu {

float ApplyEpilogue(float v, int64_t t, int64_t r, int64_t m, const Epilogue& ep) {
  if (ep.bias) v += ep.bias[r];
  switch (ep.act) {
    case Activation::kNone: break;
    case Activation::kRelu: v = v > 0.0f ? v : 0.0f; break;
    case Activation::kGelu: v = 0.5f * v * (1.0f + std::erf(v * 0.70710678118654752f)); break;
    case Activation::kSilu: v = v / (1.0f + std::exp(-v)); break;
  }
  if (ep.residual) v += ep.residual[t * (ep.ld_residual ? ep.ld_residual : m) + r];
  return v;
}

void EpilogueRowVector(const KernelConfig& cfg, float* y, int64_t t, int64_t r0, int64_t r1,
                       int64_t m, const Epilogue& ep) {
  EpilogueRowAt(cfg, y, t, r0, r1, m, ep);
}

}  // namespace sparq::cpu
