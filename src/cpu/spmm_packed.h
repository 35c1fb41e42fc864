// Internal packed weight layouts for the sparse x dense products (Y[n, m] = X[n, k] W[m, k]^T).
//
// Every format of format.h is packed at load time into one of five layouts (PackedWeight::layout),
// each with its own kernel table rows (table_rows.h) and a plain reference (spmm_ref.cc):
//  - kDenseF32: the f32 matrix as is; runs through OpenBLAS (sgemv for n = 1, sgemm otherwise).
//  - kDenseQuant: a dense matrix of int8 / int4 codes with group scales (DenseQuantWeight).
//  - kNm:  N:M with n in {1, 2, 4, 8, 16} (so a chunk of 16 kept values holds whole groups) and
//          m <= 16. Values stay compressed ([rows, chunks * 16], padded with zeros); the position
//          indices are re-packed per chunk of 16 values into one u32 (2-bit indices, m <= 4:
//          0.5 bit per weight for 2:4, as in the source format) or two u32 (4-bit, m <= 16).
//  - kRowGroups: groups of g (1, 2 or 4) consecutive rows share one ascending
//          column list; values are interleaved [col][row-in-group] so that one load of X (or of
//          a row of X^T) feeds g rows. CSR / COO / other N:M are g = 1; BSR and V:N:M share
//          columns across the rows of a block row / slab; dense bf16 is g = 4 with implicit
//          columns 0..k-1 (no index bytes).
//  - kMask: unstructured rows (CSR / COO) dense enough that one bit per weight costs fewer bytes
//          than a 16-bit column index per kept weight (density >= kMaskMinDensity): a u16 bit mask
//          per 16 columns plus the kept values packed row after row. Decode expands the values in
//          registers to a dense 16-column vector and multiplies it with contiguous X (no gather);
//          the tiled kernels turn each k block's bits into column offsets.
// Values are f32 or bf16 (f16 is widened to f32 at pack time: correct, not fast); N:M values may
// also be int8 / int4 codes with f16 group scales (ValueKind).
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "sparq/dtype.h"
#include "sparq/format.h"
#include "sparq/kernel_config.h"
#include "sparq/quant.h"
#include "sparq/status.h"
#include "sparq/tensor.h"

namespace sparq::cpu {

// Kept values per N:M chunk: one AVX-512 vector of f32, and 16 two-bit indices in one u32.
inline constexpr int kNmChunk = 16;

struct NmWeight {
  int64_t rows = 0, cols = 0;
  int n = 0, m = 0;
  int bits = 0;                      // 2 (m <= 4) or 4 (m <= 16): bits per index in `meta`
  // What the values are, as the flag and the .sparq name them: f32, bf16, or quantized int8 / int4
  // (sparq/quant.h; its group and min apply to quantized specs only). ValueKindOf picks the rows.
  ValueSpec spec;
  int64_t chunks = 0;                // chunks per row
  int64_t k_pad = 0;                 // chunks * (kNmChunk / n) * m >= cols: X is zero-padded to it
  Tensor values;                     // [rows, chunks * kNmChunk]; kI4: 8 bytes per chunk, byte b
                                     // holding value b (low nibble) and value b + 8 (high)
  // Quantized values: groups of spec.group values of a row (a multiple of kNmChunk, so a chunk
  // lies in one group; the row's last group may be short), each with the f32 value of its f16
  // scale (and min, spec.has_min()), [rows, groups_per_row]. Code q of value j is Dequantize(q,
  // ...) of sparq/quant.h.
  int group_shift = 0;               // log2(spec.group): groups are 32, 64 or 128 values
  int64_t groups_per_row = 0;
  std::vector<float> scales, mins;
  Tensor meta;                       // u32 [rows, chunks * bits / 2]; lane j in bits [b*j, b*j+b)
                                     // of word j*b/32 (b = bits)
  int words_per_chunk() const { return bits / 2; }
  // Value j (0 <= j < chunks * kNmChunk) of row r as f32: stored, or dequantized (sparq/quant.h).
  float Value(int64_t r, int64_t j) const;
  // Column of value j (0 <= j < kNmChunk) of chunk c of row r.
  int64_t Col(int64_t r, int64_t c, int j) const {
    const uint32_t* w = meta.data_as<uint32_t>() + (r * chunks + c) * words_per_chunk();
    const int bit = bits * j;
    const uint32_t idx = (w[bit / 32] >> (bit % 32)) & ((1u << bits) - 1);
    return c * (kNmChunk / n) * m + (j / n) * m + idx;
  }
};

struct RowGroupWeight {
  int64_t rows = 0, cols = 0;
  int g = 1;                         // rows per group: 1, 2 or 4
  DType value_dtype = DType::kF32;   // kF32 or kBF16
  bool implicit_cols = false;        // dense: every group holds all columns 0..cols-1
  bool idx16 = true;                 // col_idx is u16 (else u32)
  std::vector<int64_t> group_row;    // [groups + 1]: group i covers rows [group_row[i], [i+1])
  std::vector<int64_t> group_ptr;    // [groups + 1]: its columns are [group_ptr[i], [i+1])
  Tensor col_idx;                    // u16/u32 [columns]; empty if implicit_cols
  Tensor values;                     // f32/bf16 [columns * g], [col][row in group]; zero padded
  // Quantized values (spec.quantized(): V:N:M / BSR int8 / int4 in groups of 2 or 4 rows): a
  // group's columns run in segments within which each of its rows keeps one quantization group;
  // segment i (qseg_ptr[gi] <= i < qseg_ptr[gi + 1]) covers columns [qseg_begin[i], qseg_end[i]),
  // its codes [col][row] start at value index qseg_code[i] (a multiple of kNmChunk: int8 one byte
  // each; int4 in chunks of 16 codes, byte b of a chunk holding code b low and b + 8 high, as
  // NmWeight) and row q's scale and min are qscale / qmin[i * g + q] (f32 of the f16 ones; a
  // padding row's are 0). Code c of row q means Dequantize(c) of sparq/quant.h.
  ValueSpec spec;
  std::vector<int64_t> qseg_ptr, qseg_begin, qseg_end, qseg_code;
  std::vector<float> qscale, qmin;
  bool quantized() const { return spec.quantized(); }
  // Value of column position p, row q of group gi (tests and the reference product).
  float Value(int64_t gi, int64_t p, int q) const;
  int64_t groups() const { return static_cast<int64_t>(group_row.size()) - 1; }
  int64_t Col(int64_t p) const {
    if (implicit_cols) return p % cols;
    return idx16 ? col_idx.data_as<uint16_t>()[p] : col_idx.data_as<uint32_t>()[p];
  }
};

// One k block of a tiled row-group call: group g0 + i's columns in it are [pb[i], pe[i]);
// first: the first block (the partial sums start from zero).
struct RowGroupBlock {
  bool first = false;
  bool stream = false;  // one pass over CSR weights (one token tile, whole k): prefetch them
  const int64_t* pb = nullptr;
  const int64_t* pe = nullptr;
};

// The X^T slice the next tiled call will read (whole cache lines from xt; null: none), for the
// current call to prefetch.
struct XtNext {
  const float* xt = nullptr;
  int64_t bytes = 0;
};

// Columns per bit-mask word of the kMask layout.
inline constexpr int kMaskChunk = 16;

struct MaskWeight {
  int64_t rows = 0, cols = 0;
  int64_t chunks = 0;                // ceil(cols / kMaskChunk) per row; X is zero-padded to k_pad
  DType value_dtype = DType::kF32;   // kF32 or kBF16 (unused where spec is quantized)
  Tensor bits;                       // u16 [rows, chunks]: bit j of (r, c) keeps W[r, c * 16 + j]
  std::vector<int64_t> row_ptr;      // [rows + 1]: row r's kept values are [row_ptr[r], [r+1])
  Tensor values;                     // f32/bf16 [nnz + 2 * kMaskChunk], kept values in column
                                     // order; the zero tail lets a 32-value load start at any value
  // Quantized values (spec.quantized(), CsrMatrix's codes as stored): `values` is u8, int8 one
  // code per kept value, int4 code p in the low nibble of byte p / 2 when p is even, the high one
  // when odd, then kMaskQuantTail zero bytes. Groups are spec.group dense columns of a row (a
  // multiple of kMaskChunk, so a chunk lies in one group); params holds each group's f16 scale
  // (and min, spec.has_min()) [rows, groups_per_row, params_per_group]: f16 keeps the bytes a
  // decode streams low (f32 would add 0.06 bytes per column at g64 with a min, 1/8 of the total
  // at half kept).
  ValueSpec spec;
  int group_shift = 0;               // log2(spec.group)
  int64_t groups_per_row = 0;
  std::vector<uint16_t> params;
  int params_per_group() const { return spec.has_min() ? 2 : 1; }
  bool quantized() const { return spec.quantized(); }
  int64_t k_pad() const { return chunks * kMaskChunk; }
  // Kept value p (row r, column c) as f32: stored, or its code dequantized (sparq/quant.h).
  float Value(int64_t r, int64_t c, int64_t p) const;
};
// Zero bytes after a quantized mask's codes: a load may start at the last code (16 int8 bytes, 9
// bytes from an odd int4 start, and the AVX3_DL int4 decode's 64 bytes per 64-column block).
inline constexpr int64_t kMaskQuantTail = 64;
// Why a quantized spec cannot keep its codes in the bit-mask layout (empty: it can).
std::string MaskQuantDeclines(const ValueSpec& spec);

// Lowest density (kept / all) packed as kMask instead of column indices. Bytes alone favour the
// mask above 1/16 (one bit per weight against 16 per kept weight), but decode then spends a vector
// step per 16 columns however few are kept. (measurements: docs/kernels.md)
inline constexpr double kMaskMinDensity = 0.2;

// The dense f32 matrix as it came (shared with the source where it was f32).
struct DenseF32Weight {
  Tensor values;  // f32 [rows, cols]
};

// Dense quantized values (int8 / int4 codes with per-group f16 scales, and mins for int4 with a
// min), as GGUF's Q8_0 / Q4_0 / Q4_1 and `--values int8|int4` store a dense matrix. Codes are
// row-major, each row zero-code padded to k_pad = cols rounded up to kDqChunk so a vector load
// never crosses a row; X is zero-padded to k_pad, so padded codes add 0 * finite. Groups are
// `values.group` consecutive columns (32, 64 or 128, multiples of kDqChunk: a chunk lies in one
// group); a row's last group may be short.
inline constexpr int kDqChunk = 16;
// Tokens from which dense int8 / int4 products dequantize panels of rows for OpenBLAS's sgemm
// (the *_dense_sgemm_64xn rows) instead of running the tiled kernel.
inline constexpr int64_t kDqSgemmMinN = 64;
struct DenseQuantWeight {
  int64_t rows = 0, cols = 0;
  ValueSpec values;       // kI8, or kI4 (with a min unless values.sym); Dequantize of quant.h
  int64_t k_pad = 0;      // cols rounded up to kDqChunk
  int group_shift = 0;    // log2(values.group)
  int64_t groups_per_row = 0;  // ceil(cols / group)
  // int8: i8 [rows, k_pad]. int4: u8 [rows, k_pad / 2], per chunk of 16 codes byte b holds code
  // b (low nibble) and code b + 8 (high), as NmWeight: one 8-byte load widened to 16 lanes and
  // shifted by 0 or 4 per half unpacks a chunk (AVX-512 one vpsrlvd; AVX2 the 8 low nibbles, then
  // the 8 high), where GGUF's adjacent-pair order would need a lane interleave.
  Tensor codes;
  std::vector<float> scales, mins;  // f32 values of the f16 scales (mins) [rows, groups_per_row]
  int64_t row_bytes() const { return values.dtype == DType::kI8 ? k_pad : k_pad / 2; }
  int Code(int64_t r, int64_t c) const;
  // W[r, c] as f32: Dequantize of its code in its group (c < cols).
  float Value(int64_t r, int64_t c) const;
};

// The packed layouts, in the order of PackedWeight::layout's alternatives.
enum class PackedKind : uint8_t { kDenseF32, kNm, kRowGroups, kMask, kDenseQuant };

// How a weight's values are stored, as the kernels read them: each kind has its own rows in the
// kernel table (table.h) and its own body instantiation (kValF32... in nm-inl.h are these).
enum class ValueKind : uint8_t {
  kF32 = 0,
  kBf16 = 1,
  kI8 = 2,     // int8 codes, one f16 scale per group (symmetric)
  kI4Sym = 3,  // int4 codes, symmetric: (q - 8) * scale
  kI4 = 4,     // int4 codes with a min: q * scale + min (int4's default, as Q4_1)
};
const char* ValueKindName(ValueKind v);
// The kind a weight packed with `spec` gets where its layout stores it (f16 is widened to f32).
ValueKind ValueKindOf(const ValueSpec& spec);

struct PackedWeight {
  int64_t rows = 0, cols = 0;
  std::string source;     // "nm 2:4 f32", "csr bf16 u16", ... (for names and logs)
  std::variant<DenseF32Weight, NmWeight, RowGroupWeight, MaskWeight, DenseQuantWeight> layout;
  uint64_t weight_bytes = 0;  // bytes a product streams: values + indices/metadata
  int64_t stored = 0;         // stored weights (incl. padding zeros), for FLOP counts
  // The decode kernels' task split at n = 1 (CacheDecodeBounds; empty: computed per call).
  std::vector<int64_t> decode_bounds_1;

  PackedKind kind() const { return static_cast<PackedKind>(layout.index()); }
  // The layout's parts (the kind must match: std::get checks it).
  const Tensor& dense() const { return std::get<DenseF32Weight>(layout).values; }
  const NmWeight& nm() const { return std::get<NmWeight>(layout); }
  const RowGroupWeight& row_groups() const { return std::get<RowGroupWeight>(layout); }
  const MaskWeight& mask() const { return std::get<MaskWeight>(layout); }
  const DenseQuantWeight& dense_quant() const { return std::get<DenseQuantWeight>(layout); }
  NmWeight& nm() { return std::get<NmWeight>(layout); }
  RowGroupWeight& row_groups() { return std::get<RowGroupWeight>(layout); }
  MaskWeight& mask() { return std::get<MaskWeight>(layout); }
};
// Calls the overload of fn that takes the weight's layout (std::visit over PackedWeight::layout).
template <class... Fn>
struct Overloaded : Fn... {
  using Fn::operator()...;
};
template <class... Fn>
Overloaded(Fn...) -> Overloaded<Fn...>;
ValueKind ValueKindOf(const PackedWeight& w);

// How CSR / COO rows are laid out (KernelConfig::csr_layout): by density (kAuto: kMask from
// kMaskMinDensity up), or forced (tests run both layouts on the same matrices).
// values: the stored value type; quantized specs (int8 / int4) are quantized round-to-nearest at
// pack time, for layouts that have quantized kernels (N:M so far; others are an error).
struct PackOptions {
  CsrLayout csr_layout = CsrLayout::kAuto;
  ValueSpec values;  // float types keep the source's values (f32, bf16; f16 widened)
};
// The packing a configuration asks for.
inline PackOptions PackOptionsFor(const KernelConfig& cfg) { return PackOptions{cfg.csr_layout, {}}; }

// Fills pw->decode_bounds_1 (decode.cc): LinearWeight does, once its weight is packed.
void CacheDecodeBounds(PackedWeight* pw);
// Validates `matrix` (shapes, dtypes, index ranges, N:M metadata) and packs it. Errors name
// `name` and the part ("w.col_idx[17]: column 4100 >= cols 4096").
Result<PackedWeight> Pack(const SparseMatrix& matrix, const std::string& name,
                          const PackOptions& options = {});

// Dense quantized packing (dense_quant_pack.cc). From f32 [rows, cols] (row stride ld >= cols):
// round-to-nearest per group (FitQuantGroup / NearestCode of quant.h) under `values` (int8 or
// int4). Errors name `name` (a non-finite value, a scale past f16).
Result<PackedWeight> PackDenseQuant(const float* w, int64_t rows, int64_t cols, int64_t ld,
                                    const ValueSpec& values, const std::string& name);
// From stored codes as the file formats hold them (format.h QuantParts): int8 codes i8 [rows,
// cols]; int4 codes u8 [rows, ceil(cols / 2)], code 2i in the low nibble of byte i; f16 scales
// (and mins, int4 with a min) [rows, ceil(cols / group)]. Spans are checked for their sizes.
Result<PackedWeight> PackDenseQuantCodes(int64_t rows, int64_t cols, const ValueSpec& values,
                                         const uint8_t* codes, int64_t code_bytes,
                                         const uint16_t* scales_f16, const uint16_t* mins_f16,
                                         int64_t group_count, const std::string& name);

// Replaces the f32 values of pw, the bit-mask packing of q's dequantized values (same bits and
// row_ptr), by q's codes and group parameters, and names it (mask_quant_pack.cc). q is a valid
// quantized CSR whose spec MaskQuantDeclines does not decline.
Status KeepMaskCodes(PackedWeight& pw, const CsrMatrix& q, const std::string& name);

// Lane permutations that expand up to 8 packed values to the set bits of an 8-bit mask (for
// targets without an expand instruction): entry [mask][j] is the rank of lane j among the set
// bits, with the sign bit set where bit j is clear (the lane becomes zero).
const int32_t* ExpandTable8();
// The inverse for targets without a compress instruction: entry [mask][j] is the lane of the
// j-th set bit of an 8-bit mask (0 past the popcount).
const int32_t* CompressTable8();

// Value of weight p of an f32/bf16 value array, widened to f32.
inline float ValueAt(const Tensor& values, int64_t p) {
  return values.dtype() == DType::kBF16 ? BF16ToF32(values.data_as<uint16_t>()[p])
                                        : values.data_as<float>()[p];
}

}  // namespace sparq::cpu
