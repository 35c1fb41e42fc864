// SIMD bodies of the sparse x dense kernels (see spmm.h for the operation and spmm_packed.h for
// the layouts). Included once per Highway target by kernels.cc; everything
// here is inlined into the per-target task functions at the bottom.
//
// Two regimes:
//  - decode (few tokens): memory bound, so the compressed weights are streamed exactly once and
//    expanded in registers: N:M indices are decoded with a per-lane variable shift of one u32 and
//    X is gathered by them ("load as sparse, compute as dense"); CSR gathers X by its u16/u32
//    indices; bf16 values are widened by a 16-bit shift.
//  - tiled (many tokens): compute bound. X is transposed once per call into tiles xt[c][NT] of NT
//    tokens (NT = NV vectors), and each kept weight w at (r, c) does y[r, tile] += w * xt[c, :]:
//    one broadcast, NV loads and NV FMAs, i.e. exactly the FMAs of the kept weights at full vector
//    width. Rows that share columns (BSR block rows, V:N:M slabs, dense bf16) share the xt loads
//    across G rows (G * NV accumulators). Loops: task rows (weights stay in L2 across token
#if defined(SPARQ_CPU_SPMM_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SPARQ_CPU_SPMM_INL_H_
#undef SPARQ_CPU_SPMM_INL_H_
#else
#define SPARQ_CPU_SPMM_INL_H_
#endif

#include "src/cpu/simd-inl.h"
#include "src/cpu/epilogue-inl.h"
#include "src/cpu/transpose-inl.h"
#include "src/cpu/nm-inl.h"
#include "src/cpu/csr-inl.h"
#include "src/cpu/row_groups-inl.h"
#include "src/cpu/mask-inl.h"

HWY_BEFORE_NAMESPACE();
namespace sparq::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Tile widths and the per-target wrappers the entry points of kernels.cc call.

// Vectors per token tile for a group of g rows and n tokens: as few as cover n (1, 2 or 4), at
// most what the registers hold (g * NV accumulators).
inline int TiledNv(int g, int64_t n) {
  if (kGroupTile4x3 && g == 4 && n >= kGroupTile4x3MinN) return 3;
  const int64_t L = static_cast<int64_t>(hn::Lanes(DF()));
  const int max_nv = std::max(1, std::min(4, kMaxAcc / g));
  const int need = n <= L ? 1 : n <= 2 * L ? 2 : 4;
  return std::min(need, max_nv);
}
inline int64_t TileWidth(int g, int64_t n) {
  return TiledNv(g, n) * static_cast<int64_t>(hn::Lanes(DF()));
}

// Token tiles of the row kernels (N:M, and bit-mask rows, which run as pairs of rows). On AVX-512
// (16 lanes, 16 accumulators) any 1 to 8 vectors: one tile of ceil(n / 16) vectors up to 128
// tokens; beyond, the width of 4..8 vectors with the least padded work, counting each kept
// weight's offset load and broadcast as two more loads beside its NV loads and FMAs (so 8
// vectors at equal padding: 8 FMAs per offset and broadcast instead of 4). 128-token tiles
// measured (n = 512, one thread, medians of interleaved runs of the OpenBLAS / sparq time ratio,
// against 64-token tiles): 2:4 f32 (6 runs) 576x576 0.90 -> 0.99, 576x1536 0.87 -> 0.90,
// 4096x4096 1.01 -> 1.04, 1536x576 0.96 -> 0.97; 50% bit mask (4 runs, a loaded host) 576x576
// f32 0.88 -> 0.96, bf16 0.90 -> 1.00, the other SmolLM2 shapes within +-0.02. Widths of 3, 5, 6
// and 7 vectors remove the padding of token counts between the powers of two (n = 48 computed
// 64 tokens, n = 96 computed 128): docs/kernels.md. Other targets: 1, 2 or 4 vectors.
inline int64_t RowTileWidth(int64_t n) {
  const int64_t L = static_cast<int64_t>(hn::Lanes(DF()));
  if (kWideRowTiles && n >= 8 * L) return 8 * L;
  if (!(kMaxAcc >= 16 && L == 16)) return TileWidth(1, n);
  if (n <= 8 * L) return std::max<int64_t>(1, (n + L - 1) / L) * L;
  int64_t best_nv = 8, best_cost = INT64_MAX;
  for (int64_t nv = 8; nv >= 4; --nv) {
    const int64_t cost = (n + nv * L - 1) / (nv * L) * (nv + 2);
    if (cost < best_cost) {
      best_cost = cost;
      best_nv = nv;
    }
  }
  return best_nv * L;
}

// The row kernels' vector counts: 1, 2, 4 everywhere; 3 and 5..8 where 16 accumulators fit two
// rows of them (AVX-512; elsewhere RowTileWidth never asks for them and they map to 4, so that
// they are not compiled). Calls fn(std::integral_constant<int, NV>()).
template <int NV>
using RowNv = std::integral_constant<int, kMaxAcc >= 16 || NV <= 2 || (kWideRowTiles && NV == 8)
                                              ? NV
                                              : std::min(4, kMaxAcc)>;
template <class Fn>
HWY_INLINE void WithRowNv(int64_t nv, Fn&& fn) {
  switch (nv) {
    case 1:
      return fn(RowNv<1>());
    case 2:
      return fn(RowNv<2>());
    case 3:
      return fn(RowNv<3>());
    case 5:
      return fn(RowNv<5>());
    case 6:
      return fn(RowNv<6>());
    case 7:
      return fn(RowNv<7>());
    case 8:
      return fn(RowNv<8>());
    default:
      return fn(RowNv<4>());
  }
}

// The table's 2:4 decode row of AVX2 (f32_nm24_decode_4xT__avx2): the halves window (NmWindow).
inline constexpr bool kNmHalvesTarget = HWY_TARGET == HWY_AVX2;

// Calls fn(std::integral_constant<int, kV>()) for w's value kind (nm-inl.h).
template <class Fn>
HWY_INLINE void WithNmValues(const NmWeight& w, Fn&& fn) {
  switch (w.value_dtype) {
    case DType::kBF16: return fn(std::integral_constant<int, kValBf16>());
    case DType::kI8: return fn(std::integral_constant<int, kValI8>());
    case DType::kI4:
      return w.has_min ? fn(std::integral_constant<int, kValI4Min>())
                       : fn(std::integral_constant<int, kValI4>());
    default: return fn(std::integral_constant<int, kValF32>());
  }
}

inline void NmDecode(const NmWeight& w, const float* xpad, int64_t n, int64_t r0, int64_t r1,
                     float* raw) {
  const bool perm = w.m == 2 * w.n && hn::Lanes(DF()) % w.n == 0;
  WithNmValues(w, [&](auto kv) {
    constexpr int kV = decltype(kv)::value;
    if constexpr (kNmHalvesTarget) {
      if (w.bits == 2 && w.n == 2 && w.m == 4) {
        NmDecodeImpl<2, kV, true, kNmHalvesTarget>(w, xpad, n, r0, r1, raw);
        return;
      }
    }
    if (w.bits == 2) {
      perm ? NmDecodeImpl<2, kV, true, false>(w, xpad, n, r0, r1, raw)
           : NmDecodeImpl<2, kV, false, false>(w, xpad, n, r0, r1, raw);
    } else {
      perm ? NmDecodeImpl<4, kV, true, false>(w, xpad, n, r0, r1, raw)
           : NmDecodeImpl<4, kV, false, false>(w, xpad, n, r0, r1, raw);
    }
  });
}

inline void ScgDecode(const ScgWeight& w, const float* x, int64_t ldx, int64_t n, int64_t g0,
                      int64_t g1, float* raw) {
  const bool bf = w.value_dtype == DType::kBF16;
  if (w.implicit_cols) {
    bf ? ScgDecodeDenseImpl<true>(w, x, n, g0, g1, raw) : ScgDecodeDenseImpl<false>(w, x, n, g0, g1, raw);
  } else if (w.g == 1) {
    if (w.idx16) {
      bf ? ScgDecodeG1Impl<true, true>(w, x, ldx, n, g0, g1, raw)
         : ScgDecodeG1Impl<true, false>(w, x, ldx, n, g0, g1, raw);
    } else {
      bf ? ScgDecodeG1Impl<false, true>(w, x, ldx, n, g0, g1, raw)
         : ScgDecodeG1Impl<false, false>(w, x, ldx, n, g0, g1, raw);
    }
  } else if (w.g == 2) {
    bf ? ScgDecodeGroupImpl<2, true>(w, x, ldx, n, g0, g1, raw)
       : ScgDecodeGroupImpl<2, false>(w, x, ldx, n, g0, g1, raw);
  } else {
    bf ? ScgDecodeGroupImpl<4, true>(w, x, ldx, n, g0, g1, raw)
       : ScgDecodeGroupImpl<4, false>(w, x, ldx, n, g0, g1, raw);
  }
}

inline void MaskDecode(const MaskWeight& w, const float* xpad, int64_t n, int64_t r0, int64_t r1,
                       float* raw) {
  w.value_dtype == DType::kBF16 ? MaskDecodeImpl<true>(w, xpad, n, r0, r1, raw)
                                : MaskDecodeImpl<false>(w, xpad, n, r0, r1, raw);
}

template <int NV>
HWY_INLINE void MaskTiledN(const MaskWeight& w, int64_t r0, int64_t r1, const float* xt,
                           int64_t c0, int64_t c1, int64_t* cursor, int32_t* off, float* scratch,
                           const XtNext& next) {
  if (w.value_dtype == DType::kBF16) {
    MaskTiledImpl<NV, true>(w, r0, r1, xt, c0, c1, cursor, off, scratch, next);
  } else {
    MaskTiledImpl<NV, false>(w, r0, r1, xt, c0, c1, cursor, off, scratch, next);
  }
}

// nt: the tile width TileWidth(1, n) the caller built X^T with.
inline void MaskTiled(const MaskWeight& w, int64_t nt, int64_t r0, int64_t r1, const float* xt,
                      int64_t c0, int64_t c1, int64_t* cursor, int32_t* off, float* scratch,
                      const XtNext& next) {
  WithRowNv(nt / static_cast<int64_t>(hn::Lanes(DF())), [&](auto nv) {
    MaskTiledN<decltype(nv)::value>(w, r0, r1, xt, c0, c1, cursor, off, scratch, next);
  });
}

template <int G, int NV>
HWY_INLINE void ScgTiledGN(const ScgWeight& w, int64_t g0, int64_t g1, const float* xt,
                           const ScgBlock& blk, float* scratch, const XtNext& next) {
  if constexpr (G * NV <= kMaxAcc || NV == 1 || (kGroupTile4x3 && G == 4 && NV == 3)) {
    if (w.value_dtype == DType::kBF16) {
      ScgTiledImpl<G, NV, true>(w, g0, g1, xt, blk, scratch, next);
    } else {
      ScgTiledImpl<G, NV, false>(w, g0, g1, xt, blk, scratch, next);
    }
  }
}

template <int G>
HWY_INLINE void ScgTiledG(const ScgWeight& w, int nv, int64_t g0, int64_t g1, const float* xt,
                          const ScgBlock& blk, float* scratch, const XtNext& next) {
  if (nv == 1) {
    ScgTiledGN<G, 1>(w, g0, g1, xt, blk, scratch, next);
  } else if (nv == 2) {
    ScgTiledGN<G, 2>(w, g0, g1, xt, blk, scratch, next);
  } else if (nv == 3) {
    ScgTiledGN<G, 3>(w, g0, g1, xt, blk, scratch, next);
  } else {
    ScgTiledGN<G, 4>(w, g0, g1, xt, blk, scratch, next);
  }
}

// nt: the tile width TileWidth(w.g, n) the caller built X^T with.
inline void ScgTiled(const ScgWeight& w, int64_t nt, int64_t g0, int64_t g1, const float* xt,
                     const ScgBlock& blk, float* scratch, const XtNext& next) {
  const int nv = static_cast<int>(nt / static_cast<int64_t>(hn::Lanes(DF())));
  if (nv == 0) {  // a narrow CSR tile (NarrowCsrWidth)
    const bool bf = w.value_dtype == DType::kBF16;
    if (nt == 4) {
      bf ? CsrNarrowImpl<4, true>(w, g0, g1, xt, blk, scratch, next)
         : CsrNarrowImpl<4, false>(w, g0, g1, xt, blk, scratch, next);
    } else {
      bf ? CsrNarrowImpl<8, true>(w, g0, g1, xt, blk, scratch, next)
         : CsrNarrowImpl<8, false>(w, g0, g1, xt, blk, scratch, next);
    }
    return;
  }
  if (w.g == 1) {
    ScgTiledG<1>(w, nv, g0, g1, xt, blk, scratch, next);
  } else if (w.g == 2) {
    ScgTiledG<2>(w, nv, g0, g1, xt, blk, scratch, next);
  } else {
    ScgTiledG<4>(w, nv, g0, g1, xt, blk, scratch, next);
  }
}

template <int NV>
HWY_INLINE void NmTiledN(const NmWeight& w, int64_t r0, int64_t r1, const float* xt, int64_t c0,
                         int64_t c1, float* scratch, const XtNext& next) {
  WithNmValues(w, [&](auto kv) {
    constexpr int kV = decltype(kv)::value;
    w.bits == 2 ? NmTiledImpl<2, kV, NV>(w, r0, r1, xt, c0, c1, scratch, next)
                : NmTiledImpl<4, kV, NV>(w, r0, r1, xt, c0, c1, scratch, next);
  });
}

inline void NmTiled(const NmWeight& w, int64_t nt, int64_t r0, int64_t r1, const float* xt,
                    int64_t c0, int64_t c1, float* scratch, const XtNext& next) {
  WithRowNv(nt / static_cast<int64_t>(hn::Lanes(DF())),
            [&](auto nv) { NmTiledN<decltype(nv)::value>(w, r0, r1, xt, c0, c1, scratch, next); });
}

}  // namespace sparq::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // SPARQ_CPU_SPMM_INL_H_