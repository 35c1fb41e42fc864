// Sparse storage formats for a weight W[m, k] (m output rows, k input columns; see pattern.h).
//
// Every format is a plain struct of Tensor parts, so the checkpoint writer stores each part as a
// safetensors tensor (`<name>.values`, `<name>.col_idx`, ...; part names are the member names).
// Each has FromDense (exact: every nonzero of the input is stored), ToDense (bit-exact inverse),
// Validate (rejects malformed parts with a message naming the tensor and the position) and
// ByteSize (exact bytes of all parts). Values are f32, bf16 or f16; FromDense converts f32 input
// to `value_dtype` with round-to-nearest-even, so ToDense returns the rounded values.
// N:M, V:N:M, BSR, CSR and dense matrices can hold quantized values instead (QuantParts below,
// sparq/quant.h).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <variant>

#include "sparq/pattern.h"
#include "sparq/quant.h"
#include "sparq/status.h"
#include "sparq/tensor.h"

namespace sparq {

enum class FormatKind : uint8_t { kDense, kCoo, kCsr, kBsr, kNM, kVNM };
std::string_view FormatName(FormatKind f);  // "dense", "coo", "csr", "bsr", "nm", "vnm"
std::optional<FormatKind> ParseFormatName(std::string_view s);

// Quantized values (sparq/quant.h) in place of numbers: `values` then holds codes, in groups of
// spec.group consecutive stored values of a row (N:M: the kept values, in the order of `values`;
// dense: columns; CSR: columns too, see CsrMatrix; a row's last group may be shorter), each group
// with an f16 scale and, for int4 with a min, an f16 min. Codes (N:M, dense): int8 as i8 [rows,
// per_row]; int4 as u8 [rows, ceil(per_row / 2)], code 2i of a row in the low nibble of its byte
// i, code 2i+1 in the high one. The value of a code is Dequantize() of quant.h; a stored slot
// that points into the padded tail group stands for nothing (its code is ignored).
struct QuantParts {
  ValueSpec spec;  // spec.quantized() for a quantized matrix; otherwise unused
  Tensor scales;   // f16 [rows, groups_per_row]
  Tensor mins;     // f16 [rows, groups_per_row] for int4 with a min, else empty
  bool quantized() const { return spec.quantized(); }
};

// COO, sorted by (row, col), no duplicates.
struct CooMatrix {
  int64_t rows = 0, cols = 0;
  Tensor row_idx;  // u32 [nnz]
  Tensor col_idx;  // u32 [nnz]
  Tensor values;   // f32/bf16/f16 [nnz]

  static Result<CooMatrix> FromDense(std::span<const float> w, int64_t rows, int64_t cols,
                                     DType value_dtype = DType::kF32);
  Tensor ToDense() const;  // f32 [rows, cols]
  Status Validate(const std::string& name) const;
  uint64_t ByteSize() const;
  int64_t nnz() const { return static_cast<int64_t>(values.numel()); }
};

// CSR. Column indices are u16 whenever cols <= 65536 (FromDense picks), else u32.
//
// Quantized values (QuantParts, sparq/quant.h): `values` holds one code per stored value, in the
// order of col_idx: int8 as i8 [nnz]; int4 as u8 [ceil(nnz / 2)], code p in the low nibble of
// byte p / 2 when p is even, in the high one when odd (the last byte's unused high nibble is 0).
// Unlike N:M's and dense's, a CSR group is spec.group consecutive *dense columns* of a row (the
// last group of a row may be short), holding however many stored values fall in it (none too:
// its scale is then 0 from round to nearest, any finite scale >= 0 is legal); scales (and mins)
// are f16 [rows, ceil(cols / spec.group)]. Why columns, not kept values: (1) pruning with GPTQ
// fits each group's scale when the sweep reaches its first column, and an unstructured row's
// k-th kept value is not known until the masks of later column blocks are chosen; a column range
// is (SparseGPT rounds its block to whole groups); (2) the bit-mask kernels walk 16 columns at a
// time, and a group of 32, 64 or 128 columns holds whole 16-column chunks, so one scale serves
// each chunk. The price is bits: a group holds group * density values, so at 50% kept int4:g64
// spends 0.5 bits per kept value on its scale (and 0.5 on its min) where 2:4's spends 0.25; use
// g128 to match.
struct CsrMatrix {
  int64_t rows = 0, cols = 0;
  Tensor row_ptr;  // i64 [rows + 1], row_ptr[0] = 0, non-decreasing, row_ptr[rows] = nnz
  Tensor col_idx;  // u16 or u32 [nnz], strictly increasing within a row, < cols
  Tensor values;   // f32/bf16/f16 [nnz], or codes (above)
  QuantParts quant;

  static Result<CsrMatrix> FromDense(std::span<const float> w, int64_t rows, int64_t cols,
                                     DType value_dtype = DType::kF32);
  // Stores exactly the positions where keep[i] != 0 (rows * cols entries, row-major), zeros
  // included: a pruning mask survives whatever the kept values are.
  static Result<CsrMatrix> FromDenseMasked(std::span<const float> w, std::span<const uint8_t> keep,
                                           int64_t rows, int64_t cols,
                                           DType value_dtype = DType::kF32);
  // The same matrix with quantized values (same row_ptr and col_idx): each group's parameters
  // fitted by round to nearest on the values stored in it, or taken from `fitted` (rows *
  // quant_groups(spec) entries, row-major; e.g. GPTQ's), and each value its nearest code. `src`
  // holds numbers. Errors name the row and group whose scale does not fit f16.
  static Result<CsrMatrix> Quantize(const CsrMatrix& src, const ValueSpec& spec,
                                    std::span<const QuantGroup> fitted = {},
                                    const std::string& name = "weight");
  // Quantization groups per row under `spec`: ceil(cols / spec.group).
  int64_t quant_groups(const ValueSpec& spec) const;
  // The stored values as f32 [nnz]: the numbers, or the codes dequantized. Precondition: valid.
  Tensor StoredValuesF32() const;
  Tensor ToDense() const;
  Status Validate(const std::string& name) const;
  uint64_t ByteSize() const;  // row_ptr + col_idx + values (or codes) + scales + mins
  int64_t nnz() const { return static_cast<int64_t>(col_idx.numel()); }
};

// Block CSR with blocks of bh x bw. Edge blocks (rows % bh, cols % bw) are stored padded to the
// full block with zeros. A block is stored iff it has a nonzero.
//
// Quantized values (QuantParts): codes per block, int8 as i8 [nblocks, bh, bw], int4 as u8
// [nblocks, bh, ceil(bw / 2)] (code j of a block row in the low nibble of byte j / 2 when j is
// even, the high one when odd); padding (beyond the matrix edge, and an odd bw's spare nibble)
// holds code 0 and stands for nothing. As CSR's, a group is spec.group consecutive *dense columns*
// of a row, holding the stored values of that row's blocks that fall in it (GPTQ fits a group
// when its sweep reaches the group's first column); scales (and mins) f16 [rows, ceil(cols /
// spec.group)], a group without stored values any finite scale >= 0.
struct BsrMatrix {
  int64_t rows = 0, cols = 0;
  int bh = 0, bw = 0;
  Tensor row_ptr;  // i64 [ceil(rows/bh) + 1], over block rows
  Tensor col_idx;  // u16 or u32 [nblocks], block-column index, strictly increasing per block row
  Tensor values;   // f32/bf16/f16 [nblocks, bh, bw], each block row-major; or codes (above)
  QuantParts quant;

  static Result<BsrMatrix> FromDense(std::span<const float> w, int64_t rows, int64_t cols, int bh,
                                     int bw, DType value_dtype = DType::kF32);
  // The same blocks with quantized values, as CsrMatrix::Quantize: each group's parameters by
  // round to nearest on the stored values in it, or from `fitted` (rows * quant_groups(spec),
  // row-major), each value its nearest code. `src` holds numbers.
  static Result<BsrMatrix> Quantize(const BsrMatrix& src, const ValueSpec& spec,
                                    std::span<const QuantGroup> fitted = {},
                                    const std::string& name = "weight");
  int64_t quant_groups(const ValueSpec& spec) const;  // ceil(cols / spec.group)
  // The stored values as f32 [nblocks, bh, bw] (codes dequantized, padding 0). Precondition: valid.
  Tensor StoredValuesF32() const;
  Tensor ToDense() const;
  Status Validate(const std::string& name) const;
  uint64_t ByteSize() const;
  int64_t nblocks() const { return static_cast<int64_t>(col_idx.numel()); }
};

// N:M compressed along k. groups = ceil(cols / m); the tail group (cols % m) is padded with zeros.
// values: [rows, groups * n], the kept values of each group in ascending position order (a group
// with fewer than n nonzeros stores zeros at unused positions, still with distinct ascending
// indices). meta: per row, groups * n indices of bits = ceil(log2 m) bits each, packed LSB-first
// into a little-endian bit stream; each row's stream starts on a byte boundary and is
// meta_row_bytes = ceil(groups * n * bits / 8) long. For 2:4 this is exactly the NVIDIA sparse
// tensor core encoding: per group of 4 columns, two 2-bit indices in ascending order in 4 bits,
// group g of a row in bits [4g, 4g+4) (so a u16 holds 4 groups, the first in the low bits).
struct NmMatrix {
  int64_t rows = 0, cols = 0;
  int n = 0, m = 0;
  Tensor values;  // f32/bf16/f16 [rows, groups * n], or codes (QuantParts)
  Tensor meta;    // u8 [rows, meta_row_bytes]
  QuantParts quant;

  static Result<NmMatrix> FromDense(std::span<const float> w, int64_t rows, int64_t cols, int n,
                                    int m, DType value_dtype = DType::kF32);
  // The same matrix with quantized values (same meta, so the same positions): each group's
  // parameters are fitted by round to nearest, or taken from `fitted` (rows * quant_groups(spec)
  // entries, row-major; e.g. GPTQ's), and each value gets its nearest code. `src` holds numbers.
  // Errors name the row and group whose scale does not fit f16.
  static Result<NmMatrix> Quantize(const NmMatrix& src, const ValueSpec& spec,
                                   std::span<const QuantGroup> fitted = {},
                                   const std::string& name = "weight");
  // Quantization groups per row under `spec`: ceil(groups * n / spec.group).
  int64_t quant_groups(const ValueSpec& spec) const;
  // The stored values as f32 [rows, groups * n]: the numbers, or the codes dequantized (slots in
  // the padded tail as 0). Precondition: a valid matrix.
  Tensor StoredValuesF32() const;
  Tensor ToDense() const;
  Status Validate(const std::string& name) const;
  uint64_t ByteSize() const;
  int64_t groups() const { return (cols + m - 1) / m; }
  int index_bits() const;          // ceil(log2 m), at least 1
  int64_t meta_row_bytes() const;  // see above
  // Index j (0 <= j < groups*n) of row r.
  int Index(int64_t r, int64_t j) const;
};

// V:N:M: rows are taken in slabs of v consecutive rows (the last slab may be shorter); within a
// slab every row keeps the same n positions of each group of m columns. Indices are stored once
// per slab, in the N:M bit layout above. Quantized values (QuantParts) are laid out exactly as
// N:M's: codes [rows, groups * n] (int4: two to a byte), groups of spec.group kept values of a
// row, scales (and mins) f16 [rows, ceil(groups * n / spec.group)].
struct VnmMatrix {
  int64_t rows = 0, cols = 0;
  int v = 0, n = 0, m = 0;
  Tensor values;  // f32/bf16/f16 [rows, groups * n], or codes (QuantParts)
  Tensor meta;    // u8 [ceil(rows / v), meta_row_bytes]
  QuantParts quant;

  static Result<VnmMatrix> FromDense(std::span<const float> w, int64_t rows, int64_t cols, int v,
                                     int n, int m, DType value_dtype = DType::kF32);
  // As NmMatrix::Quantize: same meta, each group's parameters by round to nearest or from
  // `fitted` (rows * quant_groups(spec), row-major), each value its nearest code.
  static Result<VnmMatrix> Quantize(const VnmMatrix& src, const ValueSpec& spec,
                                    std::span<const QuantGroup> fitted = {},
                                    const std::string& name = "weight");
  int64_t quant_groups(const ValueSpec& spec) const;  // ceil(groups * n / spec.group)
  // The stored values as f32 [rows, groups * n] (codes dequantized; padded tail slots 0).
  // Precondition: a valid matrix.
  Tensor StoredValuesF32() const;
  Tensor ToDense() const;
  Status Validate(const std::string& name) const;
  uint64_t ByteSize() const;
  int64_t groups() const { return (cols + m - 1) / m; }
  int64_t slabs() const { return (rows + v - 1) / v; }
  int index_bits() const;
  int64_t meta_row_bytes() const;
  int Index(int64_t slab, int64_t j) const;
};

// Plain dense storage (f32/bf16/f16 [rows, cols]) in the same family, for uniform handling, or
// quantized values (QuantParts): groups of spec.group consecutive columns of a row (a row's last
// group may be shorter), codes as i8 [rows, cols] (int8) or u8 [rows, ceil(cols / 2)] (int4, code
// 2i in the low nibble of byte i). Two things N:M's quantized values do not allow are legal here,
// both so that GGUF Q4_0 blocks load as stored (gguf.h ReadQuantized): any finite scale, negative
// too (Q4_0 stores d = extremum / -8), and symmetric int4 code 0 ((0 - 8) * scale; rounding to
// nearest never writes it). Dequantize (quant.h) gives every code's value.
struct DenseMatrix {
  int64_t rows = 0, cols = 0;
  Tensor values;  // f32/bf16/f16 [rows, cols], or codes (QuantParts)
  QuantParts quant;

  static Result<DenseMatrix> FromDense(std::span<const float> w, int64_t rows, int64_t cols,
                                       DType value_dtype = DType::kF32);
  // The same matrix with quantized values, as NmMatrix::Quantize: each group's parameters fitted
  // by round to nearest, or taken from `fitted` (rows * quant_groups(spec) entries, row-major),
  // and each value its nearest code. `src` holds numbers. Errors name the row and group.
  static Result<DenseMatrix> Quantize(const DenseMatrix& src, const ValueSpec& spec,
                                      std::span<const QuantGroup> fitted = {},
                                      const std::string& name = "weight");
  // Quantization groups per row under `spec`: ceil(cols / spec.group).
  int64_t quant_groups(const ValueSpec& spec) const;
  // The values as f32 [rows, cols] (codes dequantized); the same as ToDense. Precondition: valid.
  Tensor StoredValuesF32() const;
  Tensor ToDense() const;
  Status Validate(const std::string& name) const;
  uint64_t ByteSize() const;  // values (or codes) + scales + mins
};

// Any stored weight.
using SparseMatrix =
    std::variant<DenseMatrix, CooMatrix, CsrMatrix, BsrMatrix, NmMatrix, VnmMatrix>;

FormatKind KindOf(const SparseMatrix& s);
int64_t Rows(const SparseMatrix& s);
int64_t Cols(const SparseMatrix& s);
DType ValueDType(const SparseMatrix& s);  // the dtype of `values` (codes: i8 or u8)
// The same matrix with quantized values (its Quantize: N:M, V:N:M, BSR, CSR, dense; COO is refused
// with a message naming `name` and the format): round to nearest, or `fitted`'s parameters.
Result<SparseMatrix> QuantizeMatrix(const SparseMatrix& s, const ValueSpec& spec,
                                    std::span<const QuantGroup> fitted, const std::string& name);
// What the values are: "f32", "bf16", "f16", or a quantized spec name ("int4:g64").
std::string ValuesName(const SparseMatrix& s);
bool IsQuantized(const SparseMatrix& s);
Tensor ToDense(const SparseMatrix& s);
Status Validate(const SparseMatrix& s, const std::string& name);
uint64_t ByteSize(const SparseMatrix& s);

// Encode W (which must already satisfy `p` where the format needs it) in `format`. FormatKind is
// the storage; Pattern supplies n/m/v/bh/bw. kDense ignores the pattern. "auto" choice:
// PickFormat picks nm for kNM, vnm for kVNM, bsr for kBlock, dense for kDense, and csr otherwise.
FormatKind PickFormat(const Pattern& p);
Result<SparseMatrix> Encode(std::span<const float> w, int64_t rows, int64_t cols, FormatKind format,
                            const Pattern& p, DType value_dtype);

}  // namespace sparq
