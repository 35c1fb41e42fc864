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
#include "src/cpu/nm_x8-inl.h"
#include "src/cpu/csr-inl.h"
#include "src/cpu/row_groups-inl.h"
#include "src/cpu/mask-inl.h"
#include "src/cpu/mask_quant-inl.h"
#include "src/cpu/dense_quant-inl.h"
#include "src/cpu/dense_x8-inl.h"
#include "src/cpu/kernel_entry.h"

HWY_BEFORE_NAMESPACE();
namespace sparq::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Tile widths chosen by n (rows whose tile_nv is 0), and the row bodies: the template
// instantiation each kernel table row names (table_rows.h), called through KernelCall.

// Vectors per token tile for a group of g rows and n tokens: as few as cover n (1, 2 or 4), at
// most what the registers hold (g * NV accumulators).
inline int TiledNv(int g, int64_t n) {
  const int64_t L = static_cast<int64_t>(hn::Lanes(DF()));
  const int max_nv = std::max(1, std::min(4, kMaxAcc / g));
  const int need = n <= L ? 1 : n <= 2 * L ? 2 : 4;
  return std::min(need, max_nv);
}
inline int64_t TileWidth(int g, int64_t n) {
  return TiledNv(g, n) * static_cast<int64_t>(hn::Lanes(DF()));
}

// Token tiles of the row kernels chosen by n (N:M, and bit-mask rows, which run as pairs of
// rows). On AVX-512 (16 lanes, 16 accumulators) any 1 to 8 vectors: one tile of ceil(n / 16)
// vectors up to 128 tokens; beyond, the width of 4..8 vectors with the least padded work, counting
// each kept weight's offset load and broadcast as two more loads beside its NV loads and FMAs.
// Other targets: 1, 2 or 4 vectors. Measurements: docs/measurements/code-constants.md.
inline int64_t RowTileWidth(int64_t n) {
  const int64_t L = static_cast<int64_t>(hn::Lanes(DF()));
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

// The row kernels' vector counts chosen by n: 1, 2, 4 everywhere; 3 and 5..8 where 16
// accumulators fit two rows of them (AVX-512; elsewhere RowTileWidth never asks for them and they
// map to 4, so that they are not compiled). Calls fn(std::integral_constant<int, NV>()).
template <int NV>
using RowNv = std::integral_constant<int, kMaxAcc >= 16 || NV <= 2 ? NV : std::min(4, kMaxAcc)>;
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
// The group kernels' vector counts chosen by n for G rows (TiledNv: 1, 2 or 4, within the
// accumulators).
template <int G, class Fn>
HWY_INLINE void WithGroupNv(int64_t nv, Fn&& fn) {
  constexpr int kMax = std::max(1, std::min(4, kMaxAcc / G));
  if (nv == 1 || kMax == 1) return fn(std::integral_constant<int, 1>());
  if (nv == 2 || kMax == 2) return fn(std::integral_constant<int, 2>());
  return fn(std::integral_constant<int, kMax>());
}

// The X access of an N:M decode body: AVX2's in-lane 2:4 window (NmWindow), the two-table
// window permute (m = 2n, n dividing the lanes: Permute2), or a gather.
inline constexpr int kNmHalves = 0, kNmWindow = 1, kNmGather = 2;

// Row bodies. Each is one instantiation (the token tiles of NV vectors chosen by n are its
// geometry, not another body); index storage (u16, u32 or implicit columns) is read from the
// weight.
template <int kUnused = 0>  // (templates all: the row list names each body as T<args...>)
struct NoBody {  // the dense f32 row runs OpenBLAS
  static void Run(const KernelCall&) {}
};

template <int kBits, int kV, int kScheme>
struct NmDecodeBody {
  static void Run(const KernelCall& c) {
    NmDecodeImpl<kBits, kV, kScheme != kNmGather, kScheme == kNmHalves>(c.w->nm(), c.x, c.n, c.u0,
                                                                         c.u1, c.raw);
  }
};

// kNv: a fixed tile of kNv vectors (AVX2's one row x 8 vectors), or 0: chosen by n (c.nt).
template <int kBits, int kV, int kNv>
struct NmTiledBody {
  static void Run(const KernelCall& c) {
    auto run = [&c](auto nv) {
      NmTiledImpl<kBits, kV, decltype(nv)::value>(c.w->nm(), c.u0, c.u1, c.xt, c.c0, c.c1,
                                                   c.scratch, *c.next);
    };
    if constexpr (kNv > 0) {
      run(std::integral_constant<int, kNv>());
    } else {
      WithRowNv(c.nt / static_cast<int64_t>(hn::Lanes(DF())), run);
    }
  }
};

// Dense int8 / int4 rows (dense_quant-inl.h): decode R = 4 rows x T tokens; tiled in the N:M
// tiled geometry (kNv: a fixed tile of kNv vectors, 0: chosen by n).
template <int kV>
struct DenseQuantDecodeBody {
  static void Run(const KernelCall& c) {
    DqDecodeImpl<kV>(c.w->dense_quant(), c.x, c.n, c.u0, c.u1, c.raw);
  }
};
template <int kV, int kNv>
struct DenseQuantTiledBody {
  static void Run(const KernelCall& c) {
    auto run = [&c](auto nv) {
      DqTiledImpl<kV, decltype(nv)::value>(c.w->dense_quant(), c.u0, c.u1, c.xt, c.c0, c.c1,
                                           c.scratch, *c.next);
    };
    if constexpr (kNv > 0) {
      run(std::integral_constant<int, kNv>());
    } else {
      WithRowNv(c.nt / static_cast<int64_t>(hn::Lanes(DF())), run);
    }
  }
};

// The dense int8 / int4 sgemm rows' body: rows [u0, u1) dequantized into c.scratch ([row][k_pad];
// RunDenseQuantSgemm multiplies them).
template <int kV>
struct DenseQuantDequantBody {
  static void Run(const KernelCall& c) {
    DqDequantRows<kV>(c.w->dense_quant(), c.u0, c.u1, c.scratch);
  }
};

// Bit-mask rows of value kind kV: f32 / bf16 values stored, or int8 / int4 codes (quantized
// bodies: mask_quant-inl.h).
template <int kV>
struct MaskDecodeBody {
  static void Run(const KernelCall& c) {
    if constexpr (kV == kValF32 || kV == kValBf16) {
      MaskDecodeImpl<kV == kValBf16>(c.w->mask(), c.x, c.n, c.u0, c.u1, c.raw);
    } else {
      MaskQuantDecodeImpl<kV>(c.w->mask(), c.x, c.n, c.u0, c.u1, c.raw);
    }
  }
};

// Quantized rows dequantize each row's k block into two rows' room after the offsets in c.off
// (RowTiled::off_entries).
template <int kV, int kNv>
struct MaskTiledBody {
  static void Run(const KernelCall& c) {
    auto run = [&c](auto nv) {
      const MaskWeight& w = c.w->mask();
      if constexpr (kV == kValF32 || kV == kValBf16) {
        const MaskStoredValues<kV == kValBf16> vals{w.values.data_as<uint8_t>()};
        MaskTiledImpl<decltype(nv)::value, kV == kValBf16>(w, vals, c.u0, c.u1, c.xt, c.c0, c.c1,
                                                          c.cursor, c.off, c.scratch, *c.next);
      } else {
        const int64_t per_row = (c.c1 - c.c0) * kMaskChunk + kMaskChunk;
        const MaskQuantValues<kV> vals{w, reinterpret_cast<float*>(c.off + 4 * per_row), per_row};
        MaskTiledImpl<decltype(nv)::value, false>(w, vals, c.u0, c.u1, c.xt, c.c0, c.c1, c.cursor,
                                                  c.off, c.scratch, *c.next);
      }
    };
    if constexpr (kNv > 0) {
      run(std::integral_constant<int, kNv>());
    } else {
      WithRowNv(c.nt / static_cast<int64_t>(hn::Lanes(DF())), run);
    }
  }
};

template <bool kBf16>
struct CsrDecodeBody {
  static void Run(const KernelCall& c) {
    const RowGroupWeight& w = c.w->row_groups();
    w.idx16 ? CsrDecodeImpl<true, kBf16>(w, c.x, c.ldx, c.n, c.u0, c.u1, c.raw)
            : CsrDecodeImpl<false, kBf16>(w, c.x, c.ldx, c.n, c.u0, c.u1, c.raw);
  }
};

// Groups of 2 rows run the 2-row body, of 3 or 4 the 4-row one (3-row groups are stored padded
// to 4).
template <bool kBf16>
struct GroupDecodeBody {
  static void Run(const KernelCall& c) {
    const RowGroupWeight& w = c.w->row_groups();
    w.g == 2 ? RowGroupDecodeImpl<2, kBf16>(w, c.x, c.ldx, c.n, c.u0, c.u1, c.raw)
             : RowGroupDecodeImpl<4, kBf16>(w, c.x, c.ldx, c.n, c.u0, c.u1, c.raw);
  }
};

template <bool kBf16 = true>
struct DenseBf16DecodeBody {
  static void Run(const KernelCall& c) {
    DenseBf16DecodeImpl<kBf16>(c.w->row_groups(), c.x, c.n, c.u0, c.u1, c.raw);
  }
};

// CSR rows on a tile of kNt tokens narrower than one vector (csr-inl.h).
template <size_t kNt, bool kBf16>
struct CsrNarrowBody {
  static void Run(const KernelCall& c) {
    CsrNarrowImpl<kNt, kBf16>(c.w->row_groups(), c.u0, c.u1, c.xt, *c.blk, c.scratch, *c.next);
  }
};

// Shared-column groups of kG rows (0: the weight's g, 2 or 4) on tiles of kNv vectors (0: chosen
// by n).
template <int kG, int kNv, bool kBf16>
struct RowGroupTiledBody {
  template <int G>
  static void RunG(const KernelCall& c) {
    auto run = [&c](auto nv) {
      RowGroupTiledImpl<G, decltype(nv)::value, kBf16>(c.w->row_groups(), c.u0, c.u1, c.xt, *c.blk, c.scratch,
                                                   *c.next);
    };
    if constexpr (kNv > 0) {
      run(std::integral_constant<int, kNv>());
    } else {
      WithGroupNv<G>(c.nt / static_cast<int64_t>(hn::Lanes(DF())), run);
    }
  }
  static void Run(const KernelCall& c) {
    if constexpr (kG > 0) {
      RunG<kG>(c);
    } else {
      c.w->row_groups().g == 2 ? RunG<2>(c) : RunG<4>(c);
    }
  }
};

// Row groups (V:N:M, BSR) with int8 / int4 codes (row_groups-inl.h).
template <int kV>
struct GroupQuantDecodeBody {
  static void Run(const KernelCall& c) {
    const RowGroupWeight& w = c.w->row_groups();
    w.g == 2 ? RowGroupQuantDecodeImpl<2, kV>(w, c.x, c.ldx, c.n, c.u0, c.u1, c.raw)
             : RowGroupQuantDecodeImpl<4, kV>(w, c.x, c.ldx, c.n, c.u0, c.u1, c.raw);
  }
};

// Groups [u0, u1) dequantized into c.scratch (the f32 twin RunRowGroupQuantTiled multiplies).
template <int kV>
struct RowGroupDequantBody {
  static void Run(const KernelCall& c) {
    const RowGroupWeight& w = c.w->row_groups();
    w.g == 2 ? RowGroupDequantImpl<2, kV>(w, c.u0, c.u1, c.scratch)
             : RowGroupDequantImpl<4, kV>(w, c.u0, c.u1, c.scratch);
  }
};

}  // namespace sparq::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // SPARQ_CPU_SPMM_INL_H_