// The per-target helpers of kernel_entry.h, each dispatched by the configuration's target (every
// product runs the target its KernelConfig names, not a process-wide one), and the table of the
// rows' body entries, which the shards kernel_rows_*.cc compile (one per value kind).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/cpu/kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "src/cpu/kernel_entry.h"
#include "src/cpu/spmm-inl.h"
#include "src/cpu/table_rows.h"

HWY_BEFORE_NAMESPACE();
namespace sparq::cpu::HWY_NAMESPACE {

// out[i] = silu(g[i]) * u[i], i < len, with the SiLU of the epilogue (EpilogueSpan: an element's
// bits do not depend on its position), so the fused MLP (RunSwiGlu) gives the bits of a SiLU
// epilogue on gate's output times up's. g is overwritten (it may be out).
void SiluMulT(float* g, const float* u, int64_t len, float* out) {
  EpilogueSpan<false, false, 2>(g, nullptr, nullptr, 0, len);
  for (int64_t i = 0; i < len; ++i) out[i] = g[i] * u[i];
}
int64_t TileWidthT(int g, int64_t n) { return TileWidth(g, n); }
int64_t LanesT() { return static_cast<int64_t>(hn::Lanes(DF())); }
int64_t RowTileWidthT(int64_t n) { return RowTileWidth(n); }
// stream: write dst with non-temporal stores where the target has whole-line squares (dst and ldd
// must then be 64-byte aligned), fenced before returning.
void TransposeT(const float* src, int64_t lds, int64_t rows, int64_t cols, float* dst, int64_t ldd,
                bool stream) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if (stream) {
    TransposeBlock<true>(src, lds, rows, cols, dst, ldd);
    _mm_sfence();
    return;
  }
#endif
  (void)stream;
  TransposeBlock(src, lds, rows, cols, dst, ldd);
}
const char* TargetNameT() { return hwy::TargetName(HWY_TARGET); }
// The token counts up to which the decode kernels run on this target (DecodeMaxN; the
// measurements behind them are in docs/kernels.md).
void DecodeLimitsT(bool amd_family_19h, DecodeLimits* b) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  *b = DecodeLimits{16, 4, 2, amd_family_19h ? kZen4GroupsDecodeMaxN : 4, 12, 12, 8, 16, 8};
#else
  (void)amd_family_19h;
  *b = DecodeLimits{4, 4, 3, 1, 6, 12, 12, 8, 1};
#endif
}
void EpilogueBlockT(float* y, int64_t ldy, int64_t t0, int64_t t1, int64_t r0, int64_t r1,
                    int64_t m, const Epilogue* ep) {
  EpilogueBlock(y, ldy, t0, t1, r0, r1, m, *ep);
}
void EpilogueRowT(float* y, int64_t t, int64_t r0, int64_t r1, int64_t m, const Epilogue* ep) {
  EpilogueRow(y, t, r0, r1, m, *ep);
}

}  // namespace sparq::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <array>
#include <cstdio>
#include <cstdlib>

#include "src/cpu/kernel_entry.h"

namespace sparq::cpu {

HWY_EXPORT(TileWidthT);
HWY_EXPORT(LanesT);
HWY_EXPORT(RowTileWidthT);
HWY_EXPORT(TransposeT);
HWY_EXPORT(TargetNameT);
HWY_EXPORT(DecodeLimitsT);
HWY_EXPORT(EpilogueRowT);
HWY_EXPORT(EpilogueBlockT);
HWY_EXPORT(SiluMulT);

// The rows' bodies come from the shards (kernel_rows_*.cc), each holding its value kinds' rows
// and nullptr for the others.
const KernelBody* const* RowBodies() {
#define SPARQ_COUNT_ROW(...) +1
  static constexpr size_t kRows = 0 SPARQ_KERNEL_ROWS(SPARQ_COUNT_ROW);
#undef SPARQ_COUNT_ROW
  static const auto* const kBodies = [] {
    static std::array<const KernelBody*, kRows> merged{};
    std::array<int, kRows> shards{};
    for (const KernelBody* const* shard :
         {RowBodiesF32(), RowBodiesBf16(), RowBodiesI8(), RowBodiesI4(), RowBodiesI4Sym()}) {
      for (size_t i = 0; i < kRows; ++i) {
        if (shard[i] != nullptr) {
          merged[i] = shard[i];
          ++shards[i];
        }
      }
    }
    // A value kind that no shard (or two) names would leave a row without its body (or with two).
    for (size_t i = 0; i < kRows; ++i) {
      if (shards[i] != 1) {
        std::fprintf(stderr, "sparq: kernel table row %zu is in %d shards of kernel_rows_*.cc\n", i,
                     shards[i]);
        std::abort();
      }
    }
    return merged.data();
  }();
  return kBodies;
}

#define SPARQ_AT(fn) HWY_DISPATCH_TABLE(fn)[c.dispatch_index]

void SiluMulAt(const KernelConfig& c, float* g, const float* u, int64_t len, float* out) {
  SPARQ_AT(SiluMulT)(g, u, len, out);
}
int64_t TileWidthAt(const KernelConfig& c, int g, int64_t n) { return SPARQ_AT(TileWidthT)(g, n); }
int64_t LanesAt(const KernelConfig& c) { return SPARQ_AT(LanesT)(); }
int64_t RowTileWidthAt(const KernelConfig& c, int64_t n) { return SPARQ_AT(RowTileWidthT)(n); }
void TransposeAt(const KernelConfig& c, const float* src, int64_t lds, int64_t rows, int64_t cols,
                 float* dst, int64_t ldd, bool stream) {
  SPARQ_AT(TransposeT)(src, lds, rows, cols, dst, ldd, stream);
}
const char* TargetNameAt(const KernelConfig& c) { return SPARQ_AT(TargetNameT)(); }
DecodeLimits DecodeLimitsAt(const KernelConfig& c) {
  DecodeLimits b;
  SPARQ_AT(DecodeLimitsT)(c.cpu.amd_family_19h(), &b);
  return b;
}
void EpilogueBlockAt(const KernelConfig& c, float* y, int64_t ldy, int64_t t0, int64_t t1,
                     int64_t r0, int64_t r1, int64_t m, const Epilogue& ep) {
  SPARQ_AT(EpilogueBlockT)(y, ldy, t0, t1, r0, r1, m, &ep);
}
void EpilogueRowAt(const KernelConfig& c, float* y, int64_t t, int64_t r0, int64_t r1, int64_t m,
                   const Epilogue& ep) {
  SPARQ_AT(EpilogueRowT)(y, t, r0, r1, m, &ep);
}

#undef SPARQ_AT

}  // namespace sparq::cpu
#endif  // HWY_ONCE
