// BSR: blocks of bh x bw; row_ptr i64 over block rows, col_idx u16/u32 block columns, values
// [nblocks, bh, bw] with edge blocks padded with zeros.
#include <algorithm>
#include <string>
#include <vector>

#include "sparq/format.h"
#include "src/formats/format_util.h"

namespace sparq {
namespace {

using namespace formats_internal;  // NOLINT: the codecs and checks of this room

// Block sides above this are refused: a block is a unit of work for a kernel, and the cap keeps
// bh * bw * nblocks far from overflow for any input.
constexpr int kMaxBlockSide = 4096;

template <typename C, typename I>
void BsrFill(const float* w, const std::vector<int64_t>& block_cols, BsrMatrix* out) {
  const int64_t rows = out->rows, cols = out->cols;
  const int bh = out->bh, bw = out->bw;
  const int64_t* rp = out->row_ptr.mutable_data_as<int64_t>();
  I* ci = out->col_idx.mutable_data_as<I>();
  auto* v = out->values.mutable_data_as<typename C::Storage>();
  const int64_t brows = CeilDiv(rows, bh);
  for (int64_t br = 0; br < brows; ++br) {
    const int64_t r0 = br * bh, r1 = std::min(rows, r0 + bh);
    for (int64_t p = rp[br]; p < rp[br + 1]; ++p) {
      const int64_t bc = block_cols[p];
      ci[p] = static_cast<I>(bc);
      const int64_t c0 = bc * bw, c1 = std::min(cols, c0 + bw);
      auto* blk = v + p * bh * bw;
      for (int64_t i = r0; i < r1; ++i) {
        for (int64_t j = c0; j < c1; ++j) blk[(i - r0) * bw + (j - c0)] = C::Enc(w[i * cols + j]);
      }
    }
  }
}

}  // namespace

Result<BsrMatrix> BsrMatrix::FromDense(std::span<const float> w, int64_t rows, int64_t cols,
                                       int bh, int bw, DType value_dtype) {
  SPARQ_RETURN_IF_ERROR(CheckDenseInput(w, rows, cols, value_dtype, "BsrMatrix::FromDense"));
  if (bh < 1 || bw < 1 || bh > kMaxBlockSide || bw > kMaxBlockSide) {
    return InvalidInput("BsrMatrix::FromDense: block " + std::to_string(bh) + "x" +
                        std::to_string(bw) + ": each side must be in 1.." +
                        std::to_string(kMaxBlockSide));
  }
  BsrMatrix out;
  out.rows = rows;
  out.cols = cols;
  out.bh = bh;
  out.bw = bw;
  const int64_t brows = CeilDiv(rows, bh), bcols = CeilDiv(cols, bw);
  out.row_ptr = Tensor::Alloc(DType::kI64, {brows + 1});
  int64_t* rp = out.row_ptr.mutable_data_as<int64_t>();
  std::vector<int64_t> block_cols;  // block column of every stored block, in order
  DispatchValue(value_dtype, [&](auto codec) {
    using C = decltype(codec);
    std::vector<uint8_t> stored(bcols);
    for (int64_t br = 0; br < brows; ++br) {
      std::fill(stored.begin(), stored.end(), uint8_t{0});
      const int64_t r1 = std::min(rows, (br + 1) * bh);
      for (int64_t i = br * bh; i < r1; ++i) {
        for (int64_t j = 0; j < cols; ++j) stored[j / bw] |= C::Bits(C::Enc(w[i * cols + j])) != 0;
      }
      for (int64_t bc = 0; bc < bcols; ++bc) {
        if (stored[bc]) block_cols.push_back(bc);
      }
      rp[br + 1] = static_cast<int64_t>(block_cols.size());
    }
    const int64_t nblocks = static_cast<int64_t>(block_cols.size());
    const DType idx = IndexDTypeFor(bcols);
    out.col_idx = Tensor::Alloc(idx, {nblocks});
    out.values = Tensor::Alloc(value_dtype, {nblocks, bh, bw});
    DispatchIndex(idx, [&](auto i) { BsrFill<C, decltype(i)>(w.data(), block_cols, &out); });
  });
  return out;
}

Tensor BsrMatrix::ToDense() const {
  Tensor out = ZeroDense(rows, cols);
  if (bh < 1 || bw < 1) return out;
  if (quant.quantized()) {
    // Precondition is a valid matrix; malformed parts give zeros rather than a bad read.
    if (!Validate("").ok()) return out;
    BsrMatrix twin = *this;
    twin.quant = QuantParts{};
    twin.values = StoredValuesF32();
    return twin.ToDense();
  }
  float* d = out.mutable_data_as<float>();
  const int64_t* rp = row_ptr.data_as<int64_t>();
  const int64_t brows = CeilDiv(rows, bh), bcols = CeilDiv(cols, bw), n = nblocks();
  DispatchValue(values.dtype(), [&](auto codec) {
    using C = decltype(codec);
    const auto* v = values.data_as<typename C::Storage>();
    DispatchIndex(col_idx.dtype(), [&](auto itag) {
      const auto* ci = col_idx.data_as<decltype(itag)>();
      for (int64_t br = 0; br < brows; ++br) {
        const int64_t r0 = br * bh, r1 = std::min(rows, r0 + bh);
        for (int64_t p = rp[br]; p < rp[br + 1]; ++p) {
          if (p < 0 || p >= n || ci[p] >= bcols) continue;  // only on unvalidated input
          const int64_t c0 = static_cast<int64_t>(ci[p]) * bw, c1 = std::min(cols, c0 + bw);
          const auto* blk = v + p * bh * bw;
          for (int64_t i = r0; i < r1; ++i) {
            for (int64_t j = c0; j < c1; ++j) d[i * cols + j] = C::Dec(blk[(i - r0) * bw + (j - c0)]);
          }
        }
      }
    });
  });
  return out;
}

Status BsrMatrix::Validate(const std::string& name) const {
  SPARQ_RETURN_IF_ERROR(CheckDims(rows, cols, name));
  if (bh < 1 || bw < 1 || bh > kMaxBlockSide || bw > kMaxBlockSide) {
    return InvalidInput(name + ": block " + std::to_string(bh) + "x" + std::to_string(bw) +
                        ": each side must be in 1.." + std::to_string(kMaxBlockSide));
  }
  const int64_t brows = CeilDiv(rows, bh), bcols = CeilDiv(cols, bw);
  if (col_idx.rank() != 1) {
    return InvalidInput(name + ".col_idx: expected a 1-D tensor [nblocks], got " +
                        col_idx.ShapeString());
  }
  const int64_t n = static_cast<int64_t>(col_idx.numel());
  SPARQ_RETURN_IF_ERROR(
      CheckPart(col_idx, name + ".col_idx", {DType::kU16, DType::kU32}, {n}));
  if (!quant.quantized()) {
    SPARQ_RETURN_IF_ERROR(
        CheckPart(values, name + ".values", {DType::kF32, DType::kBF16, DType::kF16}, {n, bh, bw}));
  }
  SPARQ_RETURN_IF_ERROR(CheckPart(row_ptr, name + ".row_ptr", {DType::kI64}, {brows + 1}));
  const int64_t* rp = row_ptr.data_as<int64_t>();
  if (rp[0] != 0) {
    return InvalidInput(name + ".row_ptr[0] = " + std::to_string(rp[0]) + ", must be 0");
  }
  for (int64_t br = 0; br < brows; ++br) {
    if (rp[br + 1] < rp[br]) {
      return InvalidInput(name + ".row_ptr[" + std::to_string(br + 1) + "] = " +
                          std::to_string(rp[br + 1]) + " < row_ptr[" + std::to_string(br) +
                          "] = " + std::to_string(rp[br]) +
                          ": row pointers must be non-decreasing (block row " +
                          std::to_string(br) + ")");
    }
  }
  if (rp[brows] != n) {
    return InvalidInput(name + ".row_ptr[" + std::to_string(brows) + "] = " +
                        std::to_string(rp[brows]) + ", expected nblocks = " + std::to_string(n) +
                        " (the length of col_idx)");
  }
  Status st = DispatchIndex(col_idx.dtype(), [&](auto itag) -> Status {
    const auto* ci = col_idx.data_as<decltype(itag)>();
    for (int64_t br = 0; br < brows; ++br) {
      for (int64_t p = rp[br]; p < rp[br + 1]; ++p) {
        const int64_t c = ci[p];
        const bool out_of_range = c >= bcols;
        const bool unordered = p > rp[br] && c <= static_cast<int64_t>(ci[p - 1]);
        if (!out_of_range && !unordered) continue;
        const std::string where = name + ".col_idx[" + std::to_string(p) + "] = " +
                                  std::to_string(c) + " (block row " + std::to_string(br) + ")";
        if (out_of_range) {
          return InvalidInput(where + ": block column out of range, block columns = " +
                              std::to_string(bcols));
        }
        return InvalidInput(where + (c == static_cast<int64_t>(ci[p - 1])
                                         ? ": duplicate block column index in the block row"
                                         : ": block column indices unsorted in the block row "
                                           "(previous " +
                                               std::to_string(ci[p - 1]) + ")"));
      }
    }
    return Status::Ok();
  });
  SPARQ_RETURN_IF_ERROR(st);
  if (quant.quantized()) return ValidateBsrQuant(*this, name);  // codes, padding, scales
  // Edge blocks: the padding outside the matrix must hold zeros (+0), so a kernel may compute
  // with whole blocks.
  const int64_t edge_rows = rows - (brows - 1) * bh, edge_cols = cols - (bcols - 1) * bw;
  if (edge_rows == bh && edge_cols == bw) return Status::Ok();
  return DispatchValue(values.dtype(), [&](auto codec) -> Status {
    using C = decltype(codec);
    const auto* v = values.data_as<typename C::Storage>();
    const auto* ci_u16 = col_idx.data_as<uint16_t>();
    const auto* ci_u32 = col_idx.data_as<uint32_t>();
    for (int64_t br = 0; br < brows; ++br) {
      const int64_t valid_r = br == brows - 1 ? edge_rows : bh;
      for (int64_t p = rp[br]; p < rp[br + 1]; ++p) {
        const int64_t bc = col_idx.dtype() == DType::kU16 ? ci_u16[p] : ci_u32[p];
        const int64_t valid_c = bc == bcols - 1 ? edge_cols : bw;
        if (valid_r == bh && valid_c == bw) continue;
        const auto* blk = v + p * bh * bw;
        for (int64_t i = 0; i < bh; ++i) {
          for (int64_t j = 0; j < bw; ++j) {
            if ((i < valid_r && j < valid_c) || C::Bits(blk[i * bw + j]) == 0) continue;
            return InvalidInput(name + ".values: block " + std::to_string(p) + " (block row " +
                                std::to_string(br) + ", block column " + std::to_string(bc) +
                                ") holds a nonzero at (" + std::to_string(i) + ", " +
                                std::to_string(j) +
                                ") in its padding beyond the matrix edge; padding must be zero");
          }
        }
      }
    }
    return Status::Ok();
  });
}

uint64_t BsrMatrix::ByteSize() const {
  return row_ptr.nbytes() + col_idx.nbytes() + values.nbytes() + quant.scales.nbytes() +
         quant.mins.nbytes();
}

}  // namespace sparq
