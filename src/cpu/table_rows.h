// The kernel table's rows (table.h), in dispatch order. One list generates both the table
// (dispatch.cc) and each row's body entry on every target (kernels.cc), so a row's name, its
// `--explain` line, its benchmark row and its test all run the body it names.
//
// ROW(name, layout, values, mode, tile, best target, worst target, min n, max n, run, tile_nv,
//     SPARQ_BODY(body template, its arguments...))
// values: F32, Bf16, I8, I4 (with a min) or I4Sym (ValueKind::k<values>; kVal<values> in the
// bodies).
// tile_nv: the tiled rows' token tile (table.h). Bodies: spmm-inl.h.
//
// A row for one target sits above the generic row it replaces there: AVX2's 2:4 decode with the
// in-lane window permute (the halves scheme, NmWindow), its one-row x 8-vector row tiles from 64
// tokens, its 4-row x 3-vector group tiles from 48 tokens. Decode rows come before the tiled rows
// of their layout: a weight runs decode up to its DecodeMaxN (which differs by target), tiled
// above. min_n / max_n span every target's limits.
#pragma once

// The N:M rows of one value kind (f32, bf16, and the quantized int8 / int4: the f32 bodies with
// the values dequantized in registers for decode, into the decoded block for tiled). Index bits
// (2 for m <= 4, 4 above) and the X access (window permute or gather) are body arguments. The
// window rows need n to divide the lanes (Declines), so not on one-lane SCALAR (EMU128, the
// 4-lane emulation clang builds compile instead, keeps them).
#define SPARQ_NM_ROWS(ROW, p, V)                                                                  \
  ROW(p##_nm24_decode_4xT__avx2, kNm24, V, kDecode, "4xT", HWY_AVX2, HWY_AVX2, 0, 16, RunDecode,  \
      0, SPARQ_BODY(NmDecodeBody, 2, kVal##V, kNmHalves))                                          \
  ROW(p##_nm_m4_window_decode_4xT, kNmWindowM4, V, kDecode, "4xT", HWY_AVX3_DL, HWY_EMU128, 0,    \
      16, RunDecode, 0, SPARQ_BODY(NmDecodeBody, 2, kVal##V, kNmWindow))                           \
  ROW(p##_nm_m16_window_decode_4xT, kNmWindowM16, V, kDecode, "4xT", HWY_AVX3_DL, HWY_EMU128, 0,  \
      16, RunDecode, 0, SPARQ_BODY(NmDecodeBody, 4, kVal##V, kNmWindow))                           \
  ROW(p##_nm_m4_gather_decode_4xT, kNmM4, V, kDecode, "4xT", HWY_AVX3_DL, HWY_SCALAR, 0, 16,      \
      RunDecode, 0, SPARQ_BODY(NmDecodeBody, 2, kVal##V, kNmGather))                               \
  ROW(p##_nm_m16_gather_decode_4xT, kNmM16, V, kDecode, "4xT", HWY_AVX3_DL, HWY_SCALAR, 0, 16,    \
      RunDecode, 0, SPARQ_BODY(NmDecodeBody, 4, kVal##V, kNmGather))                               \
  ROW(p##_nm_m4_tiled_1x8__avx2, kNmM4, V, kTiled, "1x8", HWY_AVX2, HWY_AVX2, 64, INT64_MAX,      \
      RunRowTiled, 8, SPARQ_BODY(NmTiledBody, 2, kVal##V, 8))                                      \
  ROW(p##_nm_m16_tiled_1x8__avx2, kNmM16, V, kTiled, "1x8", HWY_AVX2, HWY_AVX2, 64, INT64_MAX,    \
      RunRowTiled, 8, SPARQ_BODY(NmTiledBody, 4, kVal##V, 8))                                      \
  ROW(p##_nm_m4_tiled_1x8__sse4, kNmM4, V, kTiled, "1x8", HWY_SSE4, HWY_SSE4, 32, INT64_MAX,      \
      RunRowTiled, 8, SPARQ_BODY(NmTiledBody, 2, kVal##V, 8))                                      \
  ROW(p##_nm_m4_tiled_4xNV, kNmM4, V, kTiled, "4xNV", HWY_AVX3_DL, HWY_SCALAR, 2, INT64_MAX,      \
      RunRowTiled, 0, SPARQ_BODY(NmTiledBody, 2, kVal##V, 0))                                      \
  ROW(p##_nm_m16_tiled_4xNV, kNmM16, V, kTiled, "4xNV", HWY_AVX3_DL, HWY_SCALAR, 2, INT64_MAX,    \
      RunRowTiled, 0, SPARQ_BODY(NmTiledBody, 4, kVal##V, 0))

// The row-group (CSR rows, groups of 2-4 rows, dense bf16) and bit-mask rows of one float value kind.
#define SPARQ_FLOAT_ROWS(ROW, p, V, BF)                                                           \
  ROW(p##_csr_decode_1x1, kCsr, V, kDecode, "1x1", HWY_AVX3_DL, HWY_SCALAR, 0, 16, RunDecode, 0,  \
      SPARQ_BODY(CsrDecodeBody, BF))                                                               \
  ROW(p##_csr_tiled_2x4tok, kCsr, V, kTiled, "2x4tok", HWY_AVX3_DL, HWY_AVX2, 2, 4, RunRowGroupTiled,  \
      -4, SPARQ_BODY(CsrNarrowBody, 4, BF))                                                        \
  ROW(p##_csr_tiled_2x8tok, kCsr, V, kTiled, "2x8tok", HWY_AVX3_DL, HWY_AVX3, 2, 8, RunRowGroupTiled,  \
      -8, SPARQ_BODY(CsrNarrowBody, 8, BF))                                                        \
  ROW(p##_csr_tiled_2xNV, kCsr, V, kTiled, "2xNV", HWY_AVX3_DL, HWY_SCALAR, 2, INT64_MAX,         \
      RunRowGroupTiled, 0, SPARQ_BODY(RowGroupTiledBody, 1, 0, BF))                                          \
  ROW(p##_rowgroups_decode_Gx1, kRowGroups, V, kDecode, "Gx1", HWY_AVX3_DL, HWY_SCALAR, 0, 16,    \
      RunDecode, 0, SPARQ_BODY(GroupDecodeBody, BF))                                               \
  ROW(p##_rowgroups_tiled_4x3__avx2, kRowGroups4, V, kTiled, "4x3", HWY_AVX2, HWY_AVX2, 48,       \
      INT64_MAX, RunRowGroupTiled, 3, SPARQ_BODY(RowGroupTiledBody, 4, 3, BF))                               \
  ROW(p##_rowgroups_tiled_GxNV, kRowGroups, V, kTiled, "GxNV", HWY_AVX3_DL, HWY_SCALAR, 2,        \
      INT64_MAX, RunRowGroupTiled, 0, SPARQ_BODY(RowGroupTiledBody, 0, 0, BF))                               \
  SPARQ_MASK_ROWS(ROW, p, V)

// The bit-mask rows of one value kind: f32 / bf16 values, or int8 / int4 codes kept packed
// (quantized CSR, mask_quant-inl.h: dequantized in registers for decode, per row's k block into the
// f32 body's values for tiled).
#define SPARQ_MASK_ROWS(ROW, p, V)                                                                \
  ROW(p##_mask_decode_4xT, kMask, V, kDecode, "4xT", HWY_AVX3_DL, HWY_SCALAR, 0, 16, RunDecode, 0, \
      SPARQ_BODY(MaskDecodeBody, kVal##V))                                                         \
  ROW(p##_mask_tiled_1x8__avx2, kMask, V, kTiled, "1x8", HWY_AVX2, HWY_AVX2, 64, INT64_MAX,       \
      RunRowTiled, 8, SPARQ_BODY(MaskTiledBody, kVal##V, 8))                                       \
  ROW(p##_mask_tiled_2xNV, kMask, V, kTiled, "2xNV", HWY_AVX3_DL, HWY_SCALAR, 2, INT64_MAX,       \
      RunRowTiled, 0, SPARQ_BODY(MaskTiledBody, kVal##V, 0))

// The dense quantized rows of one value kind (i8, i4, i4s): every column's code dequantized in
// registers (decode, 4 rows x T tokens), into panels of 64 rows that OpenBLAS's sgemm multiplies
// (from kDqSgemmMinN tokens: the panel's dequantization is then a few percent of its FLOPs) or
// into the N:M tiled kernel's block (tiled, between the two).
#define SPARQ_DENSE_QUANT_ROWS(ROW, p, V)                                                         \
  ROW(p##_dense_decode_4xT, kDenseQuant, V, kDecode, "4xT", HWY_AVX3_DL, HWY_SCALAR, 0, 16,       \
      RunDecode, 0, SPARQ_BODY(DenseQuantDecodeBody, kVal##V))                                     \
  ROW(p##_dense_sgemm_64xn, kDenseQuant, V, kTiled, "64xn", HWY_AVX3_DL, HWY_SCALAR, kDqSgemmMinN, \
      INT64_MAX, RunDenseQuantSgemm, 0, SPARQ_BODY(DenseQuantDequantBody, kVal##V))                \
  ROW(p##_dense_tiled_4xNV, kDenseQuant, V, kTiled, "4xNV", HWY_AVX3_DL, HWY_SCALAR, 2, INT64_MAX, \
      RunRowTiled, 0, SPARQ_BODY(DenseQuantTiledBody, kVal##V, 0))

// 2:4 int4 decode with X rounded to int8 (nm_x8-inl.h: VNNI + VBMI on AVX3_DL, vpshufb +
// vpmaddubsw on AVX2), above the f32-X rows; only with KernelConfig::int8_activations and groups
// of >= 64 kept values (Declines).
#define SPARQ_X8_ROWS(ROW)                                                                        \
  ROW(i4_nm24_decode_4x1_x8__avx3_dl, kNm24, I4, kDecodeInt8X, "4x1", HWY_AVX3_DL, HWY_AVX3_DL, 0, \
      16, RunDecode, 0, SPARQ_BODY(NmX8DecodeBody, kValI4))                                        \
  ROW(i4s_nm24_decode_4x1_x8__avx3_dl, kNm24, I4Sym, kDecodeInt8X, "4x1", HWY_AVX3_DL,            \
      HWY_AVX3_DL, 0, 16, RunDecode, 0, SPARQ_BODY(NmX8DecodeBody, kValI4Sym))                     \
  ROW(i4_nm24_decode_4x1_x8__avx2, kNm24, I4, kDecodeInt8X, "4x1", HWY_AVX2, HWY_AVX2, 0, 16,      \
      RunDecode, 0, SPARQ_BODY(NmX8DecodeBody, kValI4))                                            \
  ROW(i4s_nm24_decode_4x1_x8__avx2, kNm24, I4Sym, kDecodeInt8X, "4x1", HWY_AVX2, HWY_AVX2, 0, 16,  \
      RunDecode, 0, SPARQ_BODY(NmX8DecodeBody, kValI4Sym))

// Dense int8 / int4 decode with X rounded to int8 (dense_x8-inl.h: VNNI + VBMI on AVX3_DL,
// vpmaddubsw on AVX2), above the f32-X dense rows; only with KernelConfig::int8_activations (any
// group size: 32, 64, 128).
#define SPARQ_DENSE_X8_ROWS(ROW)                                                                  \
  ROW(i8_dense_decode_4x1_x8__avx3_dl, kDenseQuant, I8, kDecodeInt8X, "4x1", HWY_AVX3_DL,         \
      HWY_AVX3_DL, 0, 16, RunDecode, 0, SPARQ_BODY(DenseX8DecodeBody, kValI8))                     \
  ROW(i4_dense_decode_4x1_x8__avx3_dl, kDenseQuant, I4, kDecodeInt8X, "4x1", HWY_AVX3_DL,         \
      HWY_AVX3_DL, 0, 16, RunDecode, 0, SPARQ_BODY(DenseX8DecodeBody, kValI4))                     \
  ROW(i4s_dense_decode_4x1_x8__avx3_dl, kDenseQuant, I4Sym, kDecodeInt8X, "4x1", HWY_AVX3_DL,     \
      HWY_AVX3_DL, 0, 16, RunDecode, 0, SPARQ_BODY(DenseX8DecodeBody, kValI4Sym))                  \
  ROW(i8_dense_decode_4x1_x8__avx2, kDenseQuant, I8, kDecodeInt8X, "4x1", HWY_AVX2, HWY_AVX2, 0,  \
      16, RunDecode, 0, SPARQ_BODY(DenseX8DecodeBody, kValI8))                                     \
  ROW(i4_dense_decode_4x1_x8__avx2, kDenseQuant, I4, kDecodeInt8X, "4x1", HWY_AVX2, HWY_AVX2, 0,  \
      16, RunDecode, 0, SPARQ_BODY(DenseX8DecodeBody, kValI4))                                     \
  ROW(i4s_dense_decode_4x1_x8__avx2, kDenseQuant, I4Sym, kDecodeInt8X, "4x1", HWY_AVX2, HWY_AVX2, \
      0, 16, RunDecode, 0, SPARQ_BODY(DenseX8DecodeBody, kValI4Sym))

// The row-group rows of int8 / int4 codes (V:N:M, BSR in groups of 2 or 4 rows; row_groups-inl.h):
// decode dequantizes each segment of a group (one quantization group per row) into an L1 buffer,
// then runs the f32 loops on it; tiled dequantizes the whole weight into a per-call f32 twin
// (its body) that the f32 tiled row multiplies (RunRowGroupQuantTiled: a few percent of a
// prefill's FLOPs, where dequantizing per k block and token tile cost 1.7x).
#define SPARQ_ROWGROUP_QUANT_ROWS(ROW, p, V)                                                   \
  ROW(p##_rowgroups_decode_Gx1, kRowGroups, V, kDecode, "Gx1", HWY_AVX3_DL, HWY_SCALAR, 0, 16, \
      RunDecode, 0, SPARQ_BODY(GroupQuantDecodeBody, kVal##V))                                 \
  ROW(p##_rowgroups_tiled_GxNV, kRowGroups, V, kTiled, "GxNV", HWY_AVX3_DL, HWY_SCALAR, 2,     \
      INT64_MAX, RunRowGroupQuantTiled, 0, SPARQ_BODY(RowGroupDequantBody, kVal##V))

#define SPARQ_KERNEL_ROWS(ROW)                                                                     \
  ROW(f32_dense_blas, kDenseF32, F32, kBlas, "sgemv/sgemm", HWY_AVX3_DL, HWY_SCALAR, 0, INT64_MAX, \
      RunDenseBlas, 0, SPARQ_BODY(NoBody))                                                         \
  SPARQ_NM_ROWS(ROW, f32, F32)                                                                     \
  SPARQ_NM_ROWS(ROW, bf16, Bf16)                                                                   \
  SPARQ_NM_ROWS(ROW, i8, I8)                                                                       \
  SPARQ_X8_ROWS(ROW)                                                                               \
  SPARQ_NM_ROWS(ROW, i4, I4)                                                                       \
  SPARQ_NM_ROWS(ROW, i4s, I4Sym)                                                                   \
  SPARQ_DENSE_X8_ROWS(ROW)                                                                         \
  SPARQ_DENSE_QUANT_ROWS(ROW, i8, I8)                                                              \
  SPARQ_DENSE_QUANT_ROWS(ROW, i4, I4)                                                              \
  SPARQ_DENSE_QUANT_ROWS(ROW, i4s, I4Sym)                                                          \
  SPARQ_FLOAT_ROWS(ROW, f32, F32, false)                                                           \
  SPARQ_FLOAT_ROWS(ROW, bf16, Bf16, true)                                                          \
  SPARQ_MASK_ROWS(ROW, i8, I8)                                                                     \
  SPARQ_MASK_ROWS(ROW, i4, I4)                                                                     \
  SPARQ_MASK_ROWS(ROW, i4s, I4Sym)                                                                 \
  SPARQ_ROWGROUP_QUANT_ROWS(ROW, i8, I8)                                                           \
  SPARQ_ROWGROUP_QUANT_ROWS(ROW, i4, I4)                                                           \
  SPARQ_ROWGROUP_QUANT_ROWS(ROW, i4s, I4Sym)                                                       \
  ROW(bf16_dense_decode_4x1, kDenseBf16, Bf16, kDecode, "4x1", HWY_AVX3_DL, HWY_SCALAR, 0, 16,     \
      RunDecode, 0, SPARQ_BODY(DenseBf16DecodeBody))                                               \
  ROW(bf16_dense_tiled_4x3__avx2, kDenseBf16, Bf16, kTiled, "4x3", HWY_AVX2, HWY_AVX2, 48,         \
      INT64_MAX, RunRowGroupTiled, 3, SPARQ_BODY(RowGroupTiledBody, 4, 3, true))                   \
  ROW(bf16_dense_tiled_4xNV, kDenseBf16, Bf16, kTiled, "4xNV", HWY_AVX3_DL, HWY_SCALAR, 2,         \
      INT64_MAX, RunRowGroupTiled, 0, SPARQ_BODY(RowGroupTiledBody, 4, 0, true))
