// Highway helpers every kernel family shares: vector types, value loads (f32, or bf16 widened),
// the accumulator budget per target and a two-table permute. Included once per target.
#if defined(SPARQ_CPU_SIMD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SPARQ_CPU_SIMD_INL_H_
#undef SPARQ_CPU_SIMD_INL_H_
#else
#define SPARQ_CPU_SIMD_INL_H_
#endif

#include <hwy/cache_control.h>
#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "src/cpu/spmm.h"
#include "src/cpu/spmm_packed.h"

HWY_BEFORE_NAMESPACE();
namespace sparq::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using DI = hn::RebindToSigned<DF>;
using DU = hn::RebindToUnsigned<DF>;

// Accumulators per tile row: AVX-512 has 32 registers, the others 16 (or emulated).
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
inline constexpr int kMaxAcc = 16;
#else
inline constexpr int kMaxAcc = 8;
#endif

// Loads L values (f32, or bf16 widened by a 16-bit shift) as f32.
template <bool kBf16, class D>
HWY_INLINE hn::Vec<D> LoadValues(D df, const void* p) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if constexpr (kBf16 && hn::MaxLanes(D()) == 16) {
    // One word permute (port 5) puts bf16 j into the upper half of lane j and zeroes the lower
    // half, where PromoteTo + ShiftLeft took two vector ops (ports 5 and 0): the 2:4 bf16 decode
    // loop spends 5 instead of 6 vector ops per row and 16 weights (docs/kernels.md).
    (void)df;
    const __m512i idx = _mm512_set_epi16(15, 0, 14, 0, 13, 0, 12, 0, 11, 0, 10, 0, 9, 0, 8, 0, 7, 0,
                                         6, 0, 5, 0, 4, 0, 3, 0, 2, 0, 1, 0, 0, 0);
    const __m512i raw = _mm512_castsi256_si512(
        _mm256_loadu_si256(static_cast<const __m256i*>(p)));
    return hn::Vec<D>{_mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(0xAAAAAAAAu, idx, raw))};
  }
#endif
  if constexpr (kBf16) {
    const hn::Rebind<uint16_t, D> d16;
    const hn::RebindToUnsigned<D> du;
    const auto u = hn::PromoteTo(du, hn::LoadU(d16, static_cast<const uint16_t*>(p)));
    return hn::BitCast(df, hn::ShiftLeft<16>(u));
  } else {
    return hn::LoadU(df, static_cast<const float*>(p));
  }
}

template <bool kBf16>
HWY_INLINE float ScalarValue(const void* p, int64_t i) {
  if constexpr (kBf16) {
    return BF16ToF32(static_cast<const uint16_t*>(p)[i]);
  } else {
    return static_cast<const float*>(p)[i];
  }
}

// Per-lane constants of an N:M chunk: lane j of the chunk sits in group j / n (column base

// ---------------------------------------------------------------------------------------------
// Two-table permutation: lane j gets (idx[j] < L ? lo : hi)[idx[j] % L], idx in [0, 2L).
HWY_INLINE hn::Vec<DF> Permute2(DF d, hn::Vec<DF> lo, hn::Vec<DF> hi, hn::Vec<DI> idx) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  (void)d;
  return hn::Vec<DF>{_mm512_permutex2var_ps(lo.raw, idx.raw, hi.raw)};
#elif HWY_TARGET == HWY_AVX2
  // vpermps reads only an index's low 3 bits and vblendvps only a lane's sign bit, so bit 3 (the
  // table) shifted to bit 31 is the whole select: no masks, no compare.
  (void)d;
  const __m256 a = _mm256_permutevar8x32_ps(lo.raw, idx.raw);
  const __m256 b = _mm256_permutevar8x32_ps(hi.raw, idx.raw);
  return hn::Vec<DF>{_mm256_blendv_ps(a, b, _mm256_castsi256_ps(_mm256_slli_epi32(idx.raw, 28)))};
#else
  const DI di;
  const int32_t L = static_cast<int32_t>(hn::Lanes(d));
  const auto lane = hn::IndicesFromVec(d, hn::And(idx, hn::Set(di, L - 1)));
  const auto use_hi = hn::RebindMask(d, hn::Ne(hn::And(idx, hn::Set(di, L)), hn::Zero(di)));
  return hn::IfThenElse(use_hi, hn::TableLookupLanes(hi, lane), hn::TableLookupLanes(lo, lane));
#endif
}

}  // namespace sparq::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // SPARQ_CPU_SIMD_INL_H_
