// Packing: validate a SparseMatrix part by part and re-lay it out for the kernels (spmm_packed.h).
// Everything here reads data that may come from a file, so every index is checked before use and
// every error names the tensor part and position.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "sparq/checked.h"
#include "src/cpu/spmm_packed.h"

namespace sparq::cpu {
namespace {

std::string Pos(const std::string& name, const char* part, int64_t i) {
  return name + "." + part + "[" + std::to_string(i) + "]";
}

Status CheckDims(const std::string& name, int64_t rows, int64_t cols) {
  if (rows < 0 || cols < 0) {
    return InvalidInput(name + ": negative shape " + std::to_string(rows) + "x" +
                        std::to_string(cols));
  }
  if (rows > (int64_t{1} << 40) || cols > (int64_t{1} << 31)) {
    return InvalidInput(name + ": shape " + std::to_string(rows) + "x" + std::to_string(cols) +
                        " too large");
  }
  return Status::Ok();
}

Status CheckValues(const std::string& name, const Tensor& v, uint64_t numel) {
  if (v.dtype() != DType::kF32 && v.dtype() != DType::kBF16 && v.dtype() != DType::kF16) {
    return InvalidInput(name + ".values: dtype " + std::string(DTypeName(v.dtype())) +
                        " (want f32, bf16 or f16)");
  }
  if (v.numel() != numel || (numel > 0 && v.data() == nullptr)) {
    return InvalidInput(name + ".values: " + std::to_string(v.numel()) + " elements, want " +
                        std::to_string(numel));
  }
  return Status::Ok();
}

Status CheckIndexTensor(const std::string& name, const char* part, const Tensor& t,
                        uint64_t numel, bool allow_u16) {
  const bool ok_type = t.dtype() == DType::kU32 || (allow_u16 && t.dtype() == DType::kU16);
  if (!ok_type) {
    return InvalidInput(name + "." + part + ": dtype " + std::string(DTypeName(t.dtype())) +
                        (allow_u16 ? " (want u16 or u32)" : " (want u32)"));
  }
  if (t.numel() != numel || (numel > 0 && t.data() == nullptr)) {
    return InvalidInput(name + "." + part + ": " + std::to_string(t.numel()) +
                        " elements, want " + std::to_string(numel));
  }
  return Status::Ok();
}

uint64_t IndexAt(const Tensor& t, int64_t i) {
  return t.dtype() == DType::kU16 ? t.data_as<uint16_t>()[i] : t.data_as<uint32_t>()[i];
}

// Source value p as f32 (any of f32 / bf16 / f16).
float SourceValue(const Tensor& v, int64_t p) {
  switch (v.dtype()) {
    case DType::kBF16: return BF16ToF32(v.data_as<uint16_t>()[p]);
    case DType::kF16: return F16ToF32(v.data_as<uint16_t>()[p]);
    default: return v.data_as<float>()[p];
  }
}

// Packed value dtype: bf16 stays bf16 (widened in registers); f16 is widened here.
DType PackedValueType(DType source) { return source == DType::kBF16 ? DType::kBF16 : DType::kF32; }

void StoreValue(Tensor& dst, int64_t p, const Tensor& src, int64_t q) {
  if (dst.dtype() == DType::kBF16) {
    dst.mutable_data_as<uint16_t>()[p] = src.data_as<uint16_t>()[q];
  } else {
    dst.mutable_data_as<float>()[p] = SourceValue(src, q);
  }
}

// Reads index j of a bit stream (LSB-first) of `bits`-bit fields.
int ReadBits(const uint8_t* stream, int64_t j, int bits) {
  int v = 0;
  for (int b = 0; b < bits; ++b) {
    const int64_t bit = j * bits + b;
    v |= ((stream[bit >> 3] >> (bit & 7)) & 1) << b;
  }
  return v;
}

int IndexBits(int m) {
  int bits = 1;
  while ((1 << bits) < m) ++bits;
  return bits;
}

// Decodes and checks the N:M positions of one row (or slab): out[j] = column of value j
// (may be >= cols only in the padded tail group, where the value must be zero: checked by caller).
Status DecodeNmPositions(const std::string& name, const uint8_t* stream, int64_t groups, int n,
                         int m, int64_t row, std::vector<int64_t>& out) {
  const int bits = IndexBits(m);
  out.resize(groups * n);
  for (int64_t g = 0; g < groups; ++g) {
    int prev = -1;
    for (int i = 0; i < n; ++i) {
      const int idx = ReadBits(stream, g * n + i, bits);
      if (idx >= m || idx <= prev) {
        return InvalidInput(name + ".meta: row " + std::to_string(row) + " group " +
                            std::to_string(g) + ": index " + std::to_string(idx) +
                            " not ascending or not < " + std::to_string(m));
      }
      prev = idx;
      out[g * n + i] = g * m + idx;
    }
  }
  return Status::Ok();
}

// Builds a RowGroupWeight from per-group column lists and a value getter value(group, col_pos, q).
struct RowGroupBuilder {
  RowGroupWeight w;
  std::vector<int64_t> cols;  // concatenated
  template <typename ValueFn>
  Result<RowGroupWeight> Finish(const std::string& name, DType vt, ValueFn value) {
    w.value_dtype = vt;
    w.idx16 = w.cols <= 65536;
    const int64_t total = static_cast<int64_t>(cols.size());
    if (!w.implicit_cols) {
      SPARQ_ASSIGN_OR_RETURN(w.col_idx, Tensor::TryAlloc(w.idx16 ? DType::kU16 : DType::kU32,
                                                         {total}, name + ".col_idx"));
      for (int64_t p = 0; p < total; ++p) {
        if (w.idx16) {
          w.col_idx.mutable_data_as<uint16_t>()[p] = static_cast<uint16_t>(cols[p]);
        } else {
          w.col_idx.mutable_data_as<uint32_t>()[p] = static_cast<uint32_t>(cols[p]);
        }
      }
    }
    const int64_t ncols = w.group_ptr.back();
    SPARQ_ASSIGN_OR_RETURN(w.values, Tensor::TryAlloc(vt, {ncols * w.g}, name + ".values"));
    for (int64_t gi = 0; gi < w.groups(); ++gi) {
      const int64_t nrows = w.group_row[gi + 1] - w.group_row[gi];
      for (int64_t p = w.group_ptr[gi]; p < w.group_ptr[gi + 1]; ++p) {
        for (int q = 0; q < nrows; ++q) value(gi, p, q, w.values, p * w.g + q);
      }
    }
    return std::move(w);
  }
};

Result<PackedWeight> PackDense(const DenseMatrix& d, const std::string& name, PackedWeight pw) {
  SPARQ_RETURN_IF_ERROR(CheckValues(name, d.values, uint64_t(d.rows) * uint64_t(d.cols)));
  const int64_t rows = d.rows, cols = d.cols;
  if (d.values.dtype() != DType::kBF16) {
    pw.source = "dense f32";
    if (d.values.dtype() == DType::kF32) {
      pw.layout = DenseF32Weight{d.values};  // shares the buffer
    } else {
      SPARQ_ASSIGN_OR_RETURN(Tensor f32, ToF32(d.values));
      pw.layout = DenseF32Weight{std::move(f32)};
    }
    pw.weight_bytes = uint64_t(rows) * cols * 4;
    pw.stored = rows * cols;
    return pw;
  }
  // Dense bf16: groups of 4 rows, implicit columns, values [col][row in group].
  pw.source = "dense bf16";
  RowGroupBuilder b;
  b.w.rows = rows;
  b.w.cols = cols;
  b.w.g = 4;
  b.w.implicit_cols = true;
  for (int64_t r = 0; r < rows; r += 4) {
    b.w.group_row.push_back(r);
    b.w.group_ptr.push_back((r / 4) * cols);
  }
  b.w.group_row.push_back(rows);
  b.w.group_ptr.push_back(CeilDiv(rows, 4) * cols);
  const Tensor& src = d.values;
  SPARQ_ASSIGN_OR_RETURN(pw.layout, b.Finish(name, DType::kBF16,
                                          [&](int64_t gi, int64_t p, int q, Tensor& dst, int64_t at) {
                                            const int64_t r = gi * 4 + q, c = p - gi * cols;
                                            StoreValue(dst, at, src, r * cols + c);
                                          }));
  pw.weight_bytes = uint64_t(rows) * cols * 2;
  pw.stored = rows * cols;
  return pw;
}

// CSR-like input (CSR directly, COO converted): row_start[r]..row_start[r+1] into col/value
// arrays given by accessors.
bool UseMask(CsrLayout layout, double density) {
  if (layout == CsrLayout::kAuto) return density >= kMaskMinDensity;
  return layout == CsrLayout::kBitmask;
}

// kMask from validated CSR arrays (ascending columns < cols per row).
// with_values false: the bits and row_ptr only, for stored codes that KeepMaskCodes puts beside
// them (s.values are codes then, not numbers).
Result<PackedWeight> PackMask(const CsrMatrix& s, const std::string& name, DType vt,
                              PackedWeight pw, bool with_values = true) {
  const int64_t* rp = s.row_ptr.data_as<int64_t>();
  const int64_t nnz = rp[s.rows];
  MaskWeight& w = pw.layout.emplace<MaskWeight>();
  w.rows = s.rows;
  w.cols = s.cols;
  w.chunks = CeilDiv(s.cols, int64_t{kMaskChunk});
  w.value_dtype = vt;
  SPARQ_ASSIGN_OR_RETURN(w.bits, Tensor::TryAlloc(DType::kU16, {s.rows * w.chunks}, name + ".bits"));
  uint16_t* bits = w.bits.mutable_data_as<uint16_t>();
  std::fill(bits, bits + s.rows * w.chunks, uint16_t{0});
  w.row_ptr.assign(rp, rp + s.rows + 1);
  for (int64_t r = 0; r < s.rows; ++r) {
    for (int64_t p = rp[r]; p < rp[r + 1]; ++p) {
      const int64_t c = int64_t(IndexAt(s.col_idx, p));
      bits[r * w.chunks + c / kMaskChunk] |= uint16_t(1u << (c % kMaskChunk));
    }
  }
  pw.stored = nnz;
  if (!with_values) return pw;
  SPARQ_ASSIGN_OR_RETURN(w.values, Tensor::TryAlloc(vt, {nnz + 2 * kMaskChunk}, name + ".values"));
  for (int64_t p = 0; p < nnz; ++p) StoreValue(w.values, p, s.values, p);
  for (int64_t p = nnz; p < nnz + 2 * kMaskChunk; ++p) {
    if (vt == DType::kBF16) {
      w.values.mutable_data_as<uint16_t>()[p] = 0;
    } else {
      w.values.mutable_data_as<float>()[p] = 0.0f;
    }
  }
  pw.source = "csr " + std::string(DTypeName(vt)) + " as bitmask";
  pw.weight_bytes = DTypeBytes(vt, uint64_t(nnz)) + w.bits.nbytes() + 8 * (uint64_t(s.rows) + 1);
  pw.stored = nnz;
  return pw;
}

Result<PackedWeight> PackCsr(const CsrMatrix& s, const std::string& name, PackedWeight pw,
                             CsrLayout layout) {
  if (s.row_ptr.dtype() != DType::kI64 || s.row_ptr.numel() != uint64_t(s.rows) + 1 ||
      s.row_ptr.data() == nullptr) {
    return InvalidInput(name + ".row_ptr: want i64 [" + std::to_string(s.rows + 1) + "], got " +
                        s.row_ptr.ShapeString());
  }
  const int64_t* rp = s.row_ptr.data_as<int64_t>();
  const uint64_t nnz = s.values.numel();
  SPARQ_RETURN_IF_ERROR(CheckValues(name, s.values, nnz));
  SPARQ_RETURN_IF_ERROR(CheckIndexTensor(name, "col_idx", s.col_idx, nnz, true));
  if (rp[0] != 0) return InvalidInput(Pos(name, "row_ptr", 0) + " = " + std::to_string(rp[0]) + ", want 0");
  for (int64_t r = 0; r < s.rows; ++r) {
    if (rp[r + 1] < rp[r] || rp[r + 1] > int64_t(nnz)) {
      return InvalidInput(Pos(name, "row_ptr", r + 1) + " = " + std::to_string(rp[r + 1]) +
                          ": not non-decreasing within [0, nnz=" + std::to_string(nnz) + "]");
    }
    for (int64_t p = rp[r]; p < rp[r + 1]; ++p) {
      const uint64_t c = IndexAt(s.col_idx, p);
      if (c >= uint64_t(s.cols) || (p > rp[r] && c <= IndexAt(s.col_idx, p - 1))) {
        return InvalidInput(Pos(name, "col_idx", p) + " = " + std::to_string(c) + " (row " +
                            std::to_string(r) + "): not ascending or >= cols " +
                            std::to_string(s.cols));
      }
    }
  }
  if (rp[s.rows] != int64_t(nnz)) {
    return InvalidInput(Pos(name, "row_ptr", s.rows) + " = " + std::to_string(rp[s.rows]) +
                        ", want nnz " + std::to_string(nnz));
  }
  const DType vt = PackedValueType(s.values.dtype());
  const double all = static_cast<double>(s.rows) * static_cast<double>(s.cols);
  if (UseMask(layout, all > 0 ? static_cast<double>(nnz) / all : 0.0)) {
    return PackMask(s, name, vt, std::move(pw));
  }
  RowGroupBuilder b;
  b.w.rows = s.rows;
  b.w.cols = s.cols;
  b.w.g = 1;
  b.cols.resize(nnz);
  for (uint64_t p = 0; p < nnz; ++p) b.cols[p] = int64_t(IndexAt(s.col_idx, p));
  for (int64_t r = 0; r <= s.rows; ++r) {
    b.w.group_row.push_back(r);
    b.w.group_ptr.push_back(rp[r]);
  }
  SPARQ_ASSIGN_OR_RETURN(pw.layout, b.Finish(name, vt, [&](int64_t, int64_t p, int, Tensor& dst,
                                                        int64_t at) { StoreValue(dst, at, s.values, p); }));
  pw.source = std::string("csr ") + std::string(DTypeName(vt)) + (pw.row_groups().idx16 ? " u16" : " u32");
  pw.weight_bytes = pw.row_groups().values.nbytes() + pw.row_groups().col_idx.nbytes() + 8 * (uint64_t(s.rows) + 1);
  pw.stored = int64_t(nnz);
  return pw;
}

// Quantized CSR (stored codes, or options' int8 / int4 by round to nearest): where the bit mask is
// the layout, the codes stay packed beside the bits (KeepMaskCodes: the quantized mask rows);
// otherwise (sparse rows, or a group the mask chunks do not tile) the weight runs dequantized to
// f32 through the CSR / bit-mask rows, with the same products (correct, not small or fast).
Result<PackedWeight> PackCsrValues(const CsrMatrix& s, const std::string& name, PackedWeight pw,
                                   const PackOptions& options) {
  const ValueSpec& want = options.values;
  if (!s.quant.quantized() && !want.quantized()) {
    return PackCsr(s, name, std::move(pw), options.csr_layout);
  }
  if (s.quant.quantized() && want.quantized() && want.Name() != s.quant.spec.Name()) {
    return InvalidInput(name + ": values are stored as " + s.quant.spec.Name() + ", not " + want.Name());
  }
  CsrMatrix rounded;
  if (!s.quant.quantized()) {
    SPARQ_ASSIGN_OR_RETURN(rounded, CsrMatrix::Quantize(s, want, {}, name));
  } else {
    SPARQ_RETURN_IF_ERROR(s.Validate(name));
  }
  const CsrMatrix& q = s.quant.quantized() ? s : rounded;
  const double all = static_cast<double>(q.rows) * static_cast<double>(q.cols);
  const std::string why = MaskQuantDeclines(q.quant.spec);
  if (why.empty() && UseMask(options.csr_layout, all > 0 ? static_cast<double>(q.nnz()) / all : 0.0)) {
    // The codes run as they are beside the bits: no f32 twin (this runs on every load of a
    // quantized bit-mask checkpoint, over every kept weight). q is valid (Validate or Quantize).
    SPARQ_ASSIGN_OR_RETURN(pw, PackMask(q, name, DType::kF32, std::move(pw), false));
    SPARQ_RETURN_IF_ERROR(KeepMaskCodes(pw, q, name));
    return pw;
  }
  CsrMatrix twin;
  twin.rows = q.rows, twin.cols = q.cols, twin.row_ptr = q.row_ptr, twin.col_idx = q.col_idx;
  twin.values = q.StoredValuesF32();
  SPARQ_ASSIGN_OR_RETURN(pw, PackCsr(twin, name, std::move(pw), options.csr_layout));
  pw.source = "csr " + q.quant.spec.Name() + " dequantized" +
              (pw.kind() == PackedKind::kMask ? " (" + why + ")" : std::string()) + ", " + pw.source;
  return pw;
}

Result<PackedWeight> PackCoo(const CooMatrix& s, const std::string& name, PackedWeight pw,
                             CsrLayout layout) {
  const uint64_t nnz = s.values.numel();
  SPARQ_RETURN_IF_ERROR(CheckValues(name, s.values, nnz));
  SPARQ_RETURN_IF_ERROR(CheckIndexTensor(name, "row_idx", s.row_idx, nnz, false));
  SPARQ_RETURN_IF_ERROR(CheckIndexTensor(name, "col_idx", s.col_idx, nnz, false));
  CsrMatrix csr;
  csr.rows = s.rows;
  csr.cols = s.cols;
  SPARQ_ASSIGN_OR_RETURN(csr.row_ptr, Tensor::TryAlloc(DType::kI64, {s.rows + 1}, name + ".row_ptr"));
  int64_t* rp = csr.row_ptr.mutable_data_as<int64_t>();
  const uint32_t* ri = s.row_idx.data_as<uint32_t>();
  const uint32_t* ci = s.col_idx.data_as<uint32_t>();
  for (uint64_t p = 0; p < nnz; ++p) {
    const bool sorted = p == 0 || ri[p] > ri[p - 1] || (ri[p] == ri[p - 1] && ci[p] > ci[p - 1]);
    if (ri[p] >= uint64_t(s.rows) || ci[p] >= uint64_t(s.cols) || !sorted) {
      return InvalidInput(Pos(name, "row_idx", p) + " = (" + std::to_string(ri[p]) + ", " +
                          std::to_string(ci[p]) + "): out of range, unsorted or duplicate");
    }
    ++rp[ri[p] + 1];
  }
  for (int64_t r = 0; r < s.rows; ++r) rp[r + 1] += rp[r];
  csr.col_idx = s.col_idx;
  csr.values = s.values;
  return PackCsr(csr, name, std::move(pw), layout);
}

Result<PackedWeight> PackBsr(const BsrMatrix& s, const std::string& name, PackedWeight pw) {
  if (s.bh < 1 || s.bw < 1 || s.bh > 1024 || s.bw > 1024) {
    return InvalidInput(name + ": block " + std::to_string(s.bh) + "x" + std::to_string(s.bw) +
                        " out of range");
  }
  const int64_t brows = CeilDiv(s.rows, s.bh), bcols = CeilDiv(s.cols, s.bw);
  if (s.row_ptr.dtype() != DType::kI64 || s.row_ptr.numel() != uint64_t(brows) + 1 ||
      s.row_ptr.data() == nullptr) {
    return InvalidInput(name + ".row_ptr: want i64 [" + std::to_string(brows + 1) + "], got " +
                        s.row_ptr.ShapeString());
  }
  const int64_t* rp = s.row_ptr.data_as<int64_t>();
  const uint64_t nb = s.col_idx.numel();
  SPARQ_RETURN_IF_ERROR(CheckIndexTensor(name, "col_idx", s.col_idx, nb, true));
  SPARQ_ASSIGN_OR_RETURN(uint64_t nvals, CheckedNumel({int64_t(nb), s.bh, s.bw}, name + ".values"));
  SPARQ_RETURN_IF_ERROR(CheckValues(name, s.values, nvals));
  if (rp[0] != 0 || rp[brows] != int64_t(nb)) {
    return InvalidInput(name + ".row_ptr: first must be 0 and last nblocks " + std::to_string(nb));
  }
  for (int64_t br = 0; br < brows; ++br) {
    if (rp[br + 1] < rp[br] || rp[br + 1] > int64_t(nb)) {
      return InvalidInput(Pos(name, "row_ptr", br + 1) + ": not non-decreasing");
    }
    for (int64_t p = rp[br]; p < rp[br + 1]; ++p) {
      const uint64_t c = IndexAt(s.col_idx, p);
      if (c >= uint64_t(bcols) || (p > rp[br] && c <= IndexAt(s.col_idx, p - 1))) {
        return InvalidInput(Pos(name, "col_idx", p) + " = " + std::to_string(c) +
                            ": not ascending or >= block columns " + std::to_string(bcols));
      }
    }
  }
  RowGroupBuilder b;
  b.w.rows = s.rows;
  b.w.cols = s.cols;
  b.w.g = s.bh == 1 ? 1 : s.bh == 2 ? 2 : 4;
  const int g = b.w.g;
  // Per group: the block row, the first row within the block, and per column its (block, j).
  std::vector<int64_t> g_block_row, g_row_in_block;
  std::vector<std::pair<int64_t, int>> col_src;  // (block p, column j in block)
  for (int64_t br = 0; br < brows; ++br) {
    const int64_t r0 = br * s.bh, r1 = std::min(s.rows, r0 + s.bh);
    for (int64_t r = r0; r < r1; r += g) {
      b.w.group_row.push_back(r);
      b.w.group_ptr.push_back(int64_t(b.cols.size()));
      g_block_row.push_back(br);
      g_row_in_block.push_back(r - r0);
      for (int64_t p = rp[br]; p < rp[br + 1]; ++p) {
        const int64_t c0 = int64_t(IndexAt(s.col_idx, p)) * s.bw;
        for (int j = 0; j < s.bw && c0 + j < s.cols; ++j) {
          b.cols.push_back(c0 + j);
          col_src.emplace_back(p, j);
        }
      }
    }
  }
  // Groups are contiguous, so a group ends where the next starts: never past its block row.
  b.w.group_row.push_back(s.rows);
  b.w.group_ptr.push_back(int64_t(b.cols.size()));
  const int64_t bh = s.bh, bw = s.bw;
  const DType vt = PackedValueType(s.values.dtype());
  SPARQ_ASSIGN_OR_RETURN(
      pw.layout, b.Finish(name, vt, [&](int64_t gi, int64_t p, int q, Tensor& dst, int64_t at) {
        const int64_t row_in_block = g_row_in_block[gi] + q;
        const auto [blk, j] = col_src[p];
        StoreValue(dst, at, s.values, (blk * bh + row_in_block) * bw + j);
      }));
  pw.source = std::string("bsr ") + std::to_string(s.bh) + "x" + std::to_string(s.bw) + " " +
              std::string(DTypeName(vt));
  pw.weight_bytes = pw.row_groups().values.nbytes() + pw.row_groups().col_idx.nbytes() + 8 * (uint64_t(brows) + 1);
  pw.stored = int64_t(nvals);
  return pw;
}

// Replaces w's f32 / bf16 values by codes of `spec`, in groups of spec.group values of a row in
// the chunk layout: round to nearest, or the codes and scales of `stored` (a quantized NmMatrix
// whose value j of a row is the chunk layout's value j). The layout's padding zeros are quantized
// with their group and need not come back as 0 (int4 with a min): padding lanes multiply X padded
// with zeros (decode's xpad, BuildXt's columns past cols), so they add nothing.
Status QuantizeNm(NmWeight& w, const ValueSpec& spec, const std::string& name,
                  const NmMatrix* stored = nullptr) {
  if (spec.group % kNmChunk != 0) {
    return InvalidInput(name + ": group " + std::to_string(spec.group) + " is not a multiple of " +
                        std::to_string(kNmChunk));
  }
  const int64_t row_vals = w.chunks * kNmChunk;
  w.group_shift = __builtin_ctz(static_cast<unsigned>(spec.group));
  if ((1 << w.group_shift) != spec.group) {
    return InvalidInput(name + ": group " + std::to_string(spec.group) + " is not a power of two");
  }
  w.groups_per_row = CeilDiv(row_vals, int64_t{spec.group});
  // Stored codes: per_row values of a row; the chunk layout pads the row to row_vals (no new group:
  // the group size is a multiple of the chunk).
  const int64_t per_row = stored ? stored->groups() * stored->n : 0;
  const int64_t stored_groups = stored ? stored->quant_groups(spec) : 0;
  if (stored && stored_groups != w.groups_per_row) {
    return InvalidInput(name + ": " + std::to_string(stored_groups) + " groups per row stored, the "
                        "layout has " + std::to_string(w.groups_per_row));
  }
  SPARQ_ASSIGN_OR_RETURN(Tensor q, Tensor::TryAlloc(spec.dtype, {w.rows, row_vals}, name + ".values"));
  w.scales.assign(static_cast<size_t>(w.rows * w.groups_per_row), 0.0f);
  if (spec.has_min()) w.mins.assign(w.scales.size(), 0.0f);
  uint8_t* out = q.mutable_data_as<uint8_t>();
  const int64_t code_row_bytes = spec.dtype == DType::kI8 ? per_row : (per_row + 1) / 2;
  if (stored) {
    // Stored codes: moved whole rows (int8) or whole chunks (int4) at a time, as this runs on
    // every load over every kept weight. Padding lanes take the code of 0 where there is one
    // (their value is never used).
    const uint16_t* sc = stored->quant.scales.data_as<uint16_t>();
    const uint16_t* mn = spec.has_min() ? stored->quant.mins.data_as<uint16_t>() : nullptr;
    const uint8_t pad = spec.dtype == DType::kI4 && spec.sym ? 8 : 0;
    for (int64_t r = 0; r < w.rows; ++r) {
      for (int64_t g = 0; g < w.groups_per_row; ++g) {
        const int64_t gi = r * stored_groups + g;
        const QuantGroup qg = QuantGroupFromF16(sc[gi], mn ? mn[gi] : 0, spec);
        w.scales[r * w.groups_per_row + g] = qg.scale;
        if (mn) w.mins[r * w.groups_per_row + g] = qg.min;
      }
      const uint8_t* src = stored->values.data_as<uint8_t>() + r * code_row_bytes;
      if (spec.dtype == DType::kI8) {
        std::memcpy(out + r * row_vals, src, static_cast<size_t>(per_row));
        std::memset(out + r * row_vals + per_row, pad, static_cast<size_t>(row_vals - per_row));
        continue;
      }
      uint8_t* dst = out + r * row_vals / 2;
      for (int64_t c = 0; c < w.chunks; ++c) {
        // Byte b of a chunk: values b (low nibble) and b + 8 (high), from the stored stream's
        // value j at byte j / 2, low nibble first.
        uint64_t x = 0;
        if ((c + 1) * kNmChunk <= per_row) {
          std::memcpy(&x, src + c * (kNmChunk / 2), 8);
        } else {
          for (int i = 0; i < kNmChunk; ++i) {
            const int64_t j = c * kNmChunk + i;
            const uint64_t q = j < per_row ? (src[j / 2] >> (j % 2 ? 4 : 0)) & 0x0F : pad;
            x |= q << (4 * i);
          }
        }
        for (int b = 0; b < kNmChunk / 2; ++b) {
          dst[c * (kNmChunk / 2) + b] =
              static_cast<uint8_t>(((x >> (4 * b)) & 0x0F) | (((x >> (4 * b + 32)) & 0x0F) << 4));
        }
      }
    }
    w.values = std::move(q);
    w.spec = spec;
    return Status::Ok();
  }
  std::vector<float> v(static_cast<size_t>(spec.group));
  std::vector<int8_t> codes(v.size());
  for (int64_t r = 0; r < w.rows; ++r) {
    for (int64_t g = 0; g < w.groups_per_row; ++g) {
      const int64_t at = r * row_vals + g * spec.group;
      const int64_t count = std::min<int64_t>(spec.group, row_vals - g * spec.group);
      for (int64_t i = 0; i < count; ++i) v[i] = ValueAt(w.values, at + i);
      auto fit = QuantizeGroup(v.data(), count, spec, codes.data());
      if (!fit.ok()) {
        return fit.status().WithContext(name + ".values row " + std::to_string(r) + " group " +
                                        std::to_string(g));
      }
      const QuantGroup qg = *fit;
      w.scales[r * w.groups_per_row + g] = qg.scale;
      if (spec.has_min()) w.mins[r * w.groups_per_row + g] = qg.min;
      for (int64_t i = 0; i < count; ++i) {
        const int64_t e = at + i;
        if (spec.dtype == DType::kI8) {
          out[e] = static_cast<uint8_t>(codes[i]);
        } else {
          // Byte b of a chunk: values b and b + 8, so that a vector of the chunk's first or second
          // half unpacks with one shift (nm-inl.h, Nibbles).
          const int64_t byte = e / kNmChunk * (kNmChunk / 2) + e % (kNmChunk / 2);
          const bool hi = e % kNmChunk >= kNmChunk / 2;
          out[byte] = static_cast<uint8_t>((out[byte] & (hi ? 0x0F : 0xF0)) |
                                           ((codes[i] & 0x0F) << (hi ? 4 : 0)));
        }
      }
    }
  }
  w.values = std::move(q);
  w.spec = spec;
  return Status::Ok();
}

// The chunk layout's shape for s (per_row values a row), without values or meta yet.
NmWeight& NewNmWeight(PackedWeight& pw, const NmMatrix& s, int64_t per_row) {
  NmWeight& w = pw.layout.emplace<NmWeight>();
  w.rows = s.rows;
  w.cols = s.cols;
  w.n = s.n;
  w.m = s.m;
  w.bits = s.m <= 4 ? 2 : 4;
  w.chunks = CeilDiv(per_row, kNmChunk);
  w.k_pad = std::max<int64_t>(w.chunks * (kNmChunk / s.n) * s.m, 1);
  return w;
}

Result<PackedWeight> PackNm(const NmMatrix& s, const std::string& name, PackedWeight pw,
                            const ValueSpec& values) {
  if (s.quant.quantized()) {
    // Stored codes run as they are: pack the positions through the f32 twin (the dequantized
    // values), then put the codes and scales in the value slots.
    const ValueSpec& spec = s.quant.spec;
    if (values.quantized() && values.Name() != spec.Name()) {
      return InvalidInput(name + ": values are stored as " + spec.Name() + ", not " + values.Name());
    }
    if (kNmChunk % s.n != 0) {
      return InvalidInput(name + ": " + spec.Name() + " values need N:M with n dividing " +
                          std::to_string(kNmChunk));
    }
    // The positions straight from the stored indices (value j of a row is the layout's value j),
    // the codes and scales by QuantizeNm: no f32 twin, as this runs on every load over every kept
    // weight (the twin's dequantize, pack and requantize were ~60% of a 2:4 int4 model's load).
    SPARQ_RETURN_IF_ERROR(s.Validate(name));
    const int64_t per_row = s.groups() * s.n;
    const int bits = IndexBits(s.m);
    const int64_t row_bytes = CeilDiv(per_row * bits, 8);
    NmWeight& w = NewNmWeight(pw, s, per_row);
    const int64_t words = w.chunks * w.words_per_chunk();
    SPARQ_ASSIGN_OR_RETURN(w.meta, Tensor::TryAlloc(DType::kU32, {s.rows, words}, name + ".meta"));
    for (int64_t r = 0; r < s.rows; ++r) {
      const uint8_t* src = s.meta.data_as<uint8_t>() + r * row_bytes;
      uint32_t* dst = w.meta.mutable_data_as<uint32_t>() + r * words;
      if (bits == w.bits) {
        // The same LSB-first little-endian stream: chunk c's lanes are bits [32 * bits / 2 * c, ..).
        std::memcpy(dst, src, static_cast<size_t>(row_bytes));
        if (const int tail = static_cast<int>(per_row * bits % 8); tail != 0) {
          // Stream padding after the last index is no lane's index.
          reinterpret_cast<uint8_t*>(dst)[row_bytes - 1] &= static_cast<uint8_t>((1u << tail) - 1);
        }
      } else {
        for (int64_t j = 0; j < per_row; ++j) {
          const int bit = w.bits * int(j % kNmChunk);
          dst[j / kNmChunk * w.words_per_chunk() + bit / 32] |=
              static_cast<uint32_t>(ReadBits(src, j, bits)) << (bit % 32);
        }
      }
    }
    SPARQ_RETURN_IF_ERROR(QuantizeNm(w, spec, name, &s));
    pw.source = "nm " + std::to_string(s.n) + ":" + std::to_string(s.m) + " " + spec.Name();
    pw.weight_bytes = pw.nm().values.nbytes() + pw.nm().meta.nbytes() +
                      4 * (pw.nm().scales.size() + pw.nm().mins.size());
    return pw;
  }
  if (s.n < 1 || s.m > 16 || s.n >= s.m) {
    return InvalidInput(name + ": N:M " + std::to_string(s.n) + ":" + std::to_string(s.m) +
                        " out of range (1 <= n < m <= 16)");
  }
  const int64_t groups = CeilDiv(s.cols, s.m);
  const int bits = IndexBits(s.m);
  const int64_t row_bytes = CeilDiv(groups * s.n * bits, 8);
  SPARQ_RETURN_IF_ERROR(CheckValues(name, s.values, uint64_t(s.rows) * groups * s.n));
  if (s.meta.dtype() != DType::kU8 || s.meta.numel() != uint64_t(s.rows) * row_bytes ||
      (row_bytes * s.rows > 0 && s.meta.data() == nullptr)) {
    return InvalidInput(name + ".meta: want u8 [" + std::to_string(s.rows) + ", " +
                        std::to_string(row_bytes) + "], got " + s.meta.ShapeString());
  }
  const DType vt = PackedValueType(s.values.dtype());
  const int64_t per_row = groups * s.n;
  std::vector<int64_t> pos;
  const bool chunkable = kNmChunk % s.n == 0;
  if (chunkable) {
    NmWeight& w = NewNmWeight(pw, s, per_row);
    w.spec.dtype = vt;
    SPARQ_ASSIGN_OR_RETURN(w.values, Tensor::TryAlloc(vt, {s.rows, w.chunks * kNmChunk}, name + ".values"));
    SPARQ_ASSIGN_OR_RETURN(w.meta, Tensor::TryAlloc(DType::kU32, {s.rows, w.chunks * w.words_per_chunk()},
                                                    name + ".meta"));
  }
  RowGroupBuilder b;
  b.w.rows = s.rows;
  b.w.cols = s.cols;
  b.w.g = 1;
  std::vector<std::pair<int64_t, int64_t>> src;  // fallback: (row, value index)
  for (int64_t r = 0; r < s.rows; ++r) {
    SPARQ_RETURN_IF_ERROR(DecodeNmPositions(name, s.meta.data_as<uint8_t>() + r * row_bytes,
                                            groups, s.n, s.m, r, pos));
    for (int64_t j = 0; j < per_row; ++j) {
      if (pos[j] >= s.cols && SourceValue(s.values, r * per_row + j) != 0.0f) {
        return InvalidInput(Pos(name, "values", r * per_row + j) +
                            ": nonzero value in the padded tail group");
      }
    }
    if (chunkable) {
      NmWeight& w = pw.nm();
      uint32_t* meta = w.meta.mutable_data_as<uint32_t>() + r * w.chunks * w.words_per_chunk();
      for (int64_t j = 0; j < per_row; ++j) {
        StoreValue(w.values, r * w.chunks * kNmChunk + j, s.values, r * per_row + j);
        const int64_t idx = pos[j] % s.m;
        const int64_t c = j / kNmChunk, lane = j % kNmChunk;
        const int bit = w.bits * int(lane);
        meta[c * w.words_per_chunk() + bit / 32] |= uint32_t(idx) << (bit % 32);
      }
    } else {
      b.w.group_row.push_back(r);
      b.w.group_ptr.push_back(int64_t(b.cols.size()));
      for (int64_t j = 0; j < per_row; ++j) {
        if (pos[j] >= s.cols) continue;
        b.cols.push_back(pos[j]);
        src.emplace_back(r, j);
      }
    }
  }
  const std::string nm = std::to_string(s.n) + ":" + std::to_string(s.m);
  if (values.quantized() && !chunkable) {
    return InvalidInput(name + ": " + values.Name() + " values need N:M with n dividing " +
                        std::to_string(kNmChunk) + " (this " + nm + " packs as CSR rows)");
  }
  if (chunkable) {
    pw.source = "nm " + nm + " " + std::string(DTypeName(vt));
    if (values.quantized()) {
      SPARQ_RETURN_IF_ERROR(QuantizeNm(pw.nm(), values, name));
      pw.source = "nm " + nm + " " + values.Name();
    }
    // (Scales and mins are streamed as f32.)
    pw.weight_bytes = pw.nm().values.nbytes() + pw.nm().meta.nbytes() +
                      4 * (pw.nm().scales.size() + pw.nm().mins.size());
    pw.stored = s.rows * per_row;
    return pw;
  }
  b.w.group_row.push_back(s.rows);
  b.w.group_ptr.push_back(int64_t(b.cols.size()));
  SPARQ_ASSIGN_OR_RETURN(pw.layout, b.Finish(name, vt, [&](int64_t, int64_t p, int, Tensor& dst, int64_t at) {
                           StoreValue(dst, at, s.values, src[p].first * per_row + src[p].second);
                         }));
  pw.source = "nm " + nm + " as csr " + std::string(DTypeName(vt));
  pw.weight_bytes = pw.row_groups().values.nbytes() + pw.row_groups().col_idx.nbytes() + 8 * (uint64_t(s.rows) + 1);
  pw.stored = int64_t(b.cols.size());
  return pw;
}

Result<PackedWeight> PackVnm(const VnmMatrix& s, const std::string& name, PackedWeight pw) {
  if (s.n < 1 || s.m > 16 || s.n >= s.m || s.v < 1 || s.v > 1024) {
    return InvalidInput(name + ": V:N:M " + std::to_string(s.v) + ":" + std::to_string(s.n) +
                        ":" + std::to_string(s.m) + " out of range");
  }
  const int64_t groups = CeilDiv(s.cols, s.m), slabs = CeilDiv(s.rows, s.v);
  const int bits = IndexBits(s.m);
  const int64_t row_bytes = CeilDiv(groups * s.n * bits, 8);
  const int64_t per_row = groups * s.n;
  SPARQ_RETURN_IF_ERROR(CheckValues(name, s.values, uint64_t(s.rows) * per_row));
  if (s.meta.dtype() != DType::kU8 || s.meta.numel() != uint64_t(slabs) * row_bytes ||
      (row_bytes * slabs > 0 && s.meta.data() == nullptr)) {
    return InvalidInput(name + ".meta: want u8 [" + std::to_string(slabs) + ", " +
                        std::to_string(row_bytes) + "], got " + s.meta.ShapeString());
  }
  RowGroupBuilder b;
  b.w.rows = s.rows;
  b.w.cols = s.cols;
  b.w.g = s.v == 1 ? 1 : s.v == 2 ? 2 : 4;
  const int g = b.w.g;
  std::vector<int64_t> pos, col_j;  // col_j[p]: value index within the row for column p
  std::vector<int64_t> group_first_row;
  for (int64_t sl = 0; sl < slabs; ++sl) {
    SPARQ_RETURN_IF_ERROR(DecodeNmPositions(name, s.meta.data_as<uint8_t>() + sl * row_bytes,
                                            groups, s.n, s.m, sl, pos));
    const int64_t r0 = sl * s.v, r1 = std::min(s.rows, r0 + s.v);
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t j = 0; j < per_row; ++j) {
        if (pos[j] >= s.cols && SourceValue(s.values, r * per_row + j) != 0.0f) {
          return InvalidInput(Pos(name, "values", r * per_row + j) +
                              ": nonzero value in the padded tail group");
        }
      }
    }
    for (int64_t r = r0; r < r1; r += g) {
      b.w.group_row.push_back(r);
      b.w.group_ptr.push_back(int64_t(b.cols.size()));
      group_first_row.push_back(r);
      for (int64_t j = 0; j < per_row; ++j) {
        if (pos[j] >= s.cols) continue;
        b.cols.push_back(pos[j]);
        col_j.push_back(j);
      }
    }
  }
  b.w.group_row.push_back(s.rows);
  b.w.group_ptr.push_back(int64_t(b.cols.size()));
  const int64_t v = s.v;
  const DType vt = PackedValueType(s.values.dtype());
  SPARQ_ASSIGN_OR_RETURN(
      pw.layout, b.Finish(name, vt, [&](int64_t gi, int64_t p, int q, Tensor& dst, int64_t at) {
        const int64_t r = group_first_row[gi] + q;
        if ((r / v) != (group_first_row[gi] / v)) return;  // row of the next slab: padding
        StoreValue(dst, at, s.values, r * per_row + col_j[p]);
      }));
  pw.source = "vnm " + std::to_string(s.v) + ":" + std::to_string(s.n) + ":" +
              std::to_string(s.m) + " " + std::string(DTypeName(vt));
  pw.weight_bytes = pw.row_groups().values.nbytes() + pw.row_groups().col_idx.nbytes();
  pw.stored = s.rows * per_row;
  return pw;
}

// Code j of a row of codes (int8: signed byte; int4: nibble j % 2 of byte j / 2, low first).
int RowCode(const uint8_t* row, const ValueSpec& spec, int64_t j) {
  if (spec.dtype == DType::kI8) return static_cast<int8_t>(row[j]);
  return (row[j / 2] >> (j % 2 ? 4 : 0)) & 0x0F;
}

// Turns f32 row groups whose values are codes (a code twin packed by PackVnm / PackBsr, g of 2 or
// 4) into quantized row groups (RowGroupWeight::spec, spmm_packed.h): segments where every row
// keeps one quantization group (qgroup(gi, p): its index among the row's groups), codes in 16-code
// chunks from each segment's start, the real rows' f32 scales and mins (param(row, index)).
template <typename QGroupFn, typename ParamFn>
Status QuantizeRowGroups(RowGroupWeight* w, const ValueSpec& spec, const std::string& name,
                         QGroupFn qgroup, ParamFn param) {
  const int g = w->g;
  const Tensor codes_f = std::move(w->values);
  const float* cf = codes_f.data_as<float>();
  w->spec = spec;
  w->qseg_ptr.assign(1, 0);
  w->qseg_begin.clear(), w->qseg_end.clear(), w->qseg_code.clear();
  w->qscale.clear(), w->qmin.clear();
  int64_t total = 0;
  for (int64_t gi = 0; gi < w->groups(); ++gi) {
    const int64_t nrows = w->group_row[gi + 1] - w->group_row[gi];
    for (int64_t p = w->group_ptr[gi]; p < w->group_ptr[gi + 1];) {
      const int64_t qi = qgroup(gi, p);
      int64_t e = p + 1;
      while (e < w->group_ptr[gi + 1] && qgroup(gi, e) == qi) ++e;
      w->qseg_begin.push_back(p);
      w->qseg_end.push_back(e);
      w->qseg_code.push_back(total);
      total += CeilDiv((e - p) * g, int64_t{kNmChunk}) * kNmChunk;
      for (int q = 0; q < g; ++q) {
        const QuantGroup qp = q < nrows ? param(w->group_row[gi] + q, qi) : QuantGroup{};
        w->qscale.push_back(qp.scale);
        w->qmin.push_back(qp.min);
      }
      p = e;
    }
    w->qseg_ptr.push_back(static_cast<int64_t>(w->qseg_end.size()));
  }
  const bool i8 = spec.dtype == DType::kI8;
  SPARQ_ASSIGN_OR_RETURN(w->values, Tensor::TryAlloc(i8 ? DType::kI8 : DType::kU8,
                                                     {i8 ? total : total / 2}, name + ".values"));
  uint8_t* out = w->values.mutable_data_as<uint8_t>();
  if (w->values.nbytes() > 0) std::memset(out, 0, w->values.nbytes());
  for (size_t i = 0; i < w->qseg_begin.size(); ++i) {
    for (int64_t p = w->qseg_begin[i]; p < w->qseg_end[i]; ++p) {
      for (int q = 0; q < g; ++q) {
        const int code = static_cast<int>(cf[p * g + q]);
        const int64_t e = w->qseg_code[i] + (p - w->qseg_begin[i]) * g + q;
        if (i8) {
          out[e] = static_cast<uint8_t>(static_cast<int8_t>(code));
        } else {
          const int64_t b = e % kNmChunk;
          out[e / kNmChunk * (kNmChunk / 2) + b % (kNmChunk / 2)] |=
              static_cast<uint8_t>(code << (b >= kNmChunk / 2 ? 4 : 0));
        }
      }
    }
  }
  return Status::Ok();
}

// The quantized matrix a pack of s with `want` values runs: s itself when it holds codes (which
// must be of `want`'s spec if that is quantized too; validated), else s rounded to nearest into
// *rounded.
template <typename M>
Result<const M*> QuantizedSource(const M& s, const ValueSpec& want, const std::string& name,
                                 M* rounded) {
  if (s.quant.quantized()) {
    if (want.quantized() && want.Name() != s.quant.spec.Name()) {
      return InvalidInput(name + ": values are stored as " + s.quant.spec.Name() + ", not " +
                          want.Name());
    }
    SPARQ_RETURN_IF_ERROR(s.Validate(name));
    return &s;
  }
  SPARQ_ASSIGN_OR_RETURN(*rounded, M::Quantize(s, want, {}, name));
  return const_cast<const M*>(rounded);
}

// Quantized V:N:M and BSR (stored codes, or f32 values rounded to `options.values`): in groups of
// 2 or 4 rows their codes run as they are (QuantizeRowGroups above); one row per group (V = 1,
// BSR blocks of one row: CSR rows, whose rows take no codes) runs dequantized to f32.
Result<PackedWeight> PackVnmValues(const VnmMatrix& s, const std::string& name, PackedWeight pw,
                                   const PackOptions& options) {
  if (!s.quant.quantized() && !options.values.quantized()) return PackVnm(s, name, std::move(pw));
  VnmMatrix rounded;
  SPARQ_ASSIGN_OR_RETURN(const VnmMatrix* qp, QuantizedSource(s, options.values, name, &rounded));
  const VnmMatrix& q = *qp;
  const ValueSpec& spec = q.quant.spec;
  VnmMatrix twin;
  twin.rows = q.rows, twin.cols = q.cols, twin.v = q.v, twin.n = q.n, twin.m = q.m;
  twin.meta = q.meta;
  if (q.v == 1) {
    twin.values = q.StoredValuesF32();
    SPARQ_ASSIGN_OR_RETURN(pw, PackVnm(twin, name, std::move(pw)));
    pw.source = "vnm " + spec.Name() + " dequantized, " + pw.source;
    return pw;
  }
  // The code twin: each stored slot's code as an f32 (slots in the padded tail 0).
  const int64_t per_row = q.groups() * q.n;
  const int64_t row_bytes = spec.dtype == DType::kI8 ? per_row : (per_row + 1) / 2;
  twin.values = Tensor::Alloc(DType::kF32, {q.rows, per_row});
  float* tv = twin.values.mutable_data_as<float>();
  for (int64_t r = 0; r < q.rows; ++r) {
    const uint8_t* row = q.values.data_as<uint8_t>() + r * row_bytes;
    for (int64_t j = 0; j < per_row; ++j) {
      const int64_t col = (j / q.n) * q.m + q.Index(r / q.v, j);
      tv[r * per_row + j] = col < q.cols ? static_cast<float>(RowCode(row, spec, j)) : 0.0f;
    }
  }
  SPARQ_ASSIGN_OR_RETURN(pw, PackVnm(twin, name, std::move(pw)));
  RowGroupWeight& w = std::get<RowGroupWeight>(pw.layout);
  const int64_t qg = q.quant_groups(spec);
  const uint16_t* sc = q.quant.scales.data_as<uint16_t>();
  const uint16_t* mn = spec.has_min() ? q.quant.mins.data_as<uint16_t>() : nullptr;
  // A group's columns are its slab's kept slots in order (the padded tail left out at the end),
  // so column position p is kept value p - group_ptr[gi] of each of its rows.
  SPARQ_RETURN_IF_ERROR(QuantizeRowGroups(
      &w, spec, name, [&](int64_t gi, int64_t p) { return (p - w.group_ptr[gi]) / spec.group; },
      [&](int64_t r, int64_t i) {
        return QuantGroupFromF16(sc[r * qg + i], mn ? mn[r * qg + i] : 0, spec);
      }));
  pw.source = "vnm " + std::to_string(q.v) + ":" + std::to_string(q.n) + ":" + std::to_string(q.m) +
              " " + spec.Name();
  pw.weight_bytes = w.values.nbytes() + w.col_idx.nbytes() + w.qscale.size() * 8;
  return pw;
}

Result<PackedWeight> PackBsrValues(const BsrMatrix& s, const std::string& name, PackedWeight pw,
                                   const PackOptions& options) {
  if (!s.quant.quantized() && !options.values.quantized()) return PackBsr(s, name, std::move(pw));
  BsrMatrix rounded;
  SPARQ_ASSIGN_OR_RETURN(const BsrMatrix* qp, QuantizedSource(s, options.values, name, &rounded));
  const BsrMatrix& q = *qp;
  const ValueSpec& spec = q.quant.spec;
  BsrMatrix twin;
  twin.rows = q.rows, twin.cols = q.cols, twin.bh = q.bh, twin.bw = q.bw;
  twin.row_ptr = q.row_ptr, twin.col_idx = q.col_idx;
  if (q.bh == 1) {
    twin.values = q.StoredValuesF32();
    SPARQ_ASSIGN_OR_RETURN(pw, PackBsr(twin, name, std::move(pw)));
    pw.source = "bsr " + spec.Name() + " dequantized, " + pw.source;
    return pw;
  }
  // The code twin: every block slot's code as an f32 (padding codes are 0).
  const int64_t nb = q.nblocks();
  const int64_t rb = spec.dtype == DType::kI8 ? q.bw : (int64_t{q.bw} + 1) / 2;
  twin.values = Tensor::Alloc(DType::kF32, {nb, q.bh, q.bw});
  float* tv = twin.values.mutable_data_as<float>();
  for (int64_t br = 0; br < nb * q.bh; ++br) {
    const uint8_t* row = q.values.data_as<uint8_t>() + br * rb;
    for (int j = 0; j < q.bw; ++j) tv[br * q.bw + j] = static_cast<float>(RowCode(row, spec, j));
  }
  SPARQ_ASSIGN_OR_RETURN(pw, PackBsr(twin, name, std::move(pw)));
  RowGroupWeight& w = std::get<RowGroupWeight>(pw.layout);
  const int64_t qg = q.quant_groups(spec);
  const uint16_t* sc = q.quant.scales.data_as<uint16_t>();
  const uint16_t* mn = spec.has_min() ? q.quant.mins.data_as<uint16_t>() : nullptr;
  SPARQ_RETURN_IF_ERROR(QuantizeRowGroups(
      &w, spec, name, [&](int64_t, int64_t p) { return w.Col(p) / spec.group; },
      [&](int64_t r, int64_t i) {
        return QuantGroupFromF16(sc[r * qg + i], mn ? mn[r * qg + i] : 0, spec);
      }));
  const int64_t brows = CeilDiv(q.rows, int64_t{q.bh});
  pw.source = "bsr " + std::to_string(q.bh) + "x" + std::to_string(q.bw) + " " + spec.Name();
  pw.weight_bytes =
      w.values.nbytes() + w.col_idx.nbytes() + w.qscale.size() * 8 + 8 * (uint64_t(brows) + 1);
  return pw;
}

}  // namespace

float RowGroupWeight::Value(int64_t gi, int64_t p, int q) const {
  if (!quantized()) return ValueAt(values, p * g + q);
  int64_t i = qseg_ptr[gi];
  while (qseg_end[i] <= p) ++i;
  const int64_t e = qseg_code[i] + (p - qseg_begin[i]) * g + q;
  const uint8_t* b = values.data_as<uint8_t>();
  QuantGroup qp;
  qp.scale = qscale[i * g + q];
  qp.min = qmin[i * g + q];
  const int code = spec.dtype == DType::kI8
                       ? int(static_cast<int8_t>(b[e]))
                       : (b[e / kNmChunk * (kNmChunk / 2) + e % kNmChunk % (kNmChunk / 2)] >>
                          (e % kNmChunk >= kNmChunk / 2 ? 4 : 0)) &
                             0x0F;
  return Dequantize(code, qp, spec);
}

float NmWeight::Value(int64_t r, int64_t j) const {
  const int64_t e = r * chunks * kNmChunk + j;
  if (!spec.quantized()) return ValueAt(values, e);
  QuantGroup g;
  const size_t gi = static_cast<size_t>(r * groups_per_row + j / spec.group);
  g.scale = scales[gi];
  g.min = spec.has_min() ? mins[gi] : 0.0f;
  const uint8_t* b = values.data_as<uint8_t>();
  // (kI4: byte b of a chunk holds values b and b + 8, NmWeight::values.)
  const int64_t byte = e / kNmChunk * (kNmChunk / 2) + e % (kNmChunk / 2);
  const int code = spec.dtype == DType::kI8 ? int(static_cast<int8_t>(b[e]))
                                             : (b[byte] >> (e % kNmChunk >= kNmChunk / 2 ? 4 : 0)) & 0x0F;
  return Dequantize(code, g, spec);
}

const int32_t* ExpandTable8() {
  static const std::vector<int32_t> table = [] {
    std::vector<int32_t> t(256 * 8);
    for (int mask = 0; mask < 256; ++mask) {
      int rank = 0;
      for (int j = 0; j < 8; ++j) {
        t[mask * 8 + j] = (mask >> j) & 1 ? rank++ : static_cast<int32_t>(0x80000000u);
      }
    }
    return t;
  }();
  return table.data();
}

const int32_t* CompressTable8() {
  static const std::vector<int32_t> table = [] {
    std::vector<int32_t> t(256 * 8, 0);
    for (int mask = 0; mask < 256; ++mask) {
      int rank = 0;
      for (int j = 0; j < 8; ++j) {
        if ((mask >> j) & 1) t[mask * 8 + rank++] = j;
      }
    }
    return t;
  }();
  return table.data();
}

Result<PackedWeight> Pack(const SparseMatrix& matrix, const std::string& name,
                          const PackOptions& options) {
  PackedWeight pw;
  std::visit([&](const auto& s) { pw.rows = s.rows; pw.cols = s.cols; }, matrix);
  SPARQ_RETURN_IF_ERROR(CheckDims(name, pw.rows, pw.cols));
  return std::visit(
      [&](const auto& s) -> Result<PackedWeight> {
        using T = std::decay_t<decltype(s)>;
        if constexpr (std::is_same_v<T, DenseMatrix>) {
          // Stored codes (a .sparq's dense int8 / int4, a GGUF's Q4_0 / Q4_1 / Q8_0) run as they
          // are, under their own spec.
          if (s.quant.quantized()) {
            const ValueSpec& spec = s.quant.spec;
            if (options.values.quantized() && options.values.Name() != spec.Name()) {
              return InvalidInput(name + ": values are stored as " + spec.Name() + ", not " +
                                  options.values.Name());
            }
            const Tensor& mins = s.quant.mins;
            return PackDenseQuantCodes(
                s.rows, s.cols, spec, s.values.template data_as<uint8_t>(),
                int64_t(s.values.nbytes()), s.quant.scales.template data_as<uint16_t>(),
                mins.numel() > 0 ? mins.template data_as<uint16_t>() : nullptr,
                int64_t(s.quant.scales.numel()), name);
          }
          // Dense int8 / int4: round-to-nearest of the f32 values (bf16 / f16 widened).
          if (options.values.quantized()) {
            const Tensor f = s.ToDense();
            return PackDenseQuant(f.data_as<float>(), s.rows, s.cols, s.cols, options.values, name);
          }
        }
        if constexpr (std::is_same_v<T, CsrMatrix>) return PackCsrValues(s, name, std::move(pw), options);
        if constexpr (std::is_same_v<T, VnmMatrix>) {
          return PackVnmValues(s, name, std::move(pw), options);
        }
        if constexpr (std::is_same_v<T, BsrMatrix>) {
          return PackBsrValues(s, name, std::move(pw), options);
        }
        if constexpr (!std::is_same_v<T, NmMatrix> && !std::is_same_v<T, DenseMatrix>) {
          if (options.values.quantized()) {
            return InvalidInput(name + ": " + options.values.Name() +
                                " values are packed for dense, N:M, V:N:M, BSR and CSR weights, "
                                "not " +
                                std::string(FormatName(KindOf(matrix))) + " (store it as CSR)");
          }
        }
        if constexpr (std::is_same_v<T, DenseMatrix>) return PackDense(s, name, std::move(pw));
        if constexpr (std::is_same_v<T, CooMatrix>) {
          return PackCoo(s, name, std::move(pw), options.csr_layout);
        }
        if constexpr (std::is_same_v<T, NmMatrix>)
          return PackNm(s, name, std::move(pw), options.values);
      },
      matrix);
}

}  // namespace sparq::cpu
