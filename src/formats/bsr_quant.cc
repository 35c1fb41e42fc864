// Quantized values of a BsrMatrix (format.h): quantizing, checking and dequantizing. As CSR's, a
// group is a range of spec.group dense columns of a row; a row's stored values are the row's
// segments of the blocks of its block row, in ascending columns.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "sparq/format.h"
#include "src/formats/format_util.h"

namespace sparq {

using namespace formats_internal;  // NOLINT: the codecs and checks of this room

namespace {

// Bytes of one block row of codes: int8 one a value, int4 two a byte.
int64_t BlockRowBytes(const ValueSpec& spec, int bw) {
  return spec.dtype == DType::kI8 ? bw : (int64_t{bw} + 1) / 2;
}

// Code j of block p's row i (int8: signed byte; int4: the nibble).
int CodeAt(const uint8_t* codes, const ValueSpec& spec, int64_t rb, int bh, int64_t p, int i,
           int64_t j) {
  const uint8_t* row = codes + (p * bh + i) * rb;
  if (spec.dtype == DType::kI8) return static_cast<int8_t>(row[j]);
  return (row[j / 2] >> (j % 2 ? 4 : 0)) & 0x0F;
}

// Calls fn(r, p, i, c0, c1) for every row r of the matrix and every stored block p of its block
// row, in ascending columns: row i of block p holds the row's values of dense columns [c0, c1)
// (c1 - c0 <= bw; the block's columns past c1 are padding). Precondition: row_ptr, col_idx valid.
template <typename Fn>
void ForEachRowSegment(const BsrMatrix& s, Fn&& fn) {
  const int64_t brows = CeilDiv(s.rows, int64_t{s.bh});
  const int64_t* rp = s.row_ptr.data_as<int64_t>();
  DispatchIndex(s.col_idx.dtype(), [&](auto itag) {
    const auto* ci = s.col_idx.data_as<decltype(itag)>();
    for (int64_t br = 0; br < brows; ++br) {
      const int64_t r0 = br * s.bh, r1 = std::min(s.rows, r0 + s.bh);
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t p = rp[br]; p < rp[br + 1]; ++p) {
          const int64_t c0 = static_cast<int64_t>(ci[p]) * s.bw;
          fn(r, p, static_cast<int>(r - r0), c0, std::min(s.cols, c0 + s.bw));
        }
      }
    }
  });
}

}  // namespace

int64_t BsrMatrix::quant_groups(const ValueSpec& spec) const {
  return spec.group > 0 ? CeilDiv(cols, int64_t{spec.group}) : 0;
}

namespace formats_internal {

Status ValidateBsrQuant(const BsrMatrix& s, const std::string& name) {
  const ValueSpec& spec = s.quant.spec;
  if (!QuantSpecOk(spec)) {
    return InvalidInput(name + ": quantized values with an unsupported spec (" + spec.Name() + ")");
  }
  const int64_t n = s.nblocks(), rb = BlockRowBytes(spec, s.bw);
  const DType code_dtype = spec.dtype == DType::kI8 ? DType::kI8 : DType::kU8;
  SPARQ_RETURN_IF_ERROR(CheckPart(s.values, name + ".values", {code_dtype}, {n, s.bh, rb}));
  SPARQ_RETURN_IF_ERROR(ValidateGroupParams(s.quant, s.rows, s.quant_groups(spec), name, false));
  const uint8_t* codes = s.values.data_as<uint8_t>();
  const int lo = MinCode(spec), hi = MaxCode(spec);
  const int64_t brows = CeilDiv(s.rows, int64_t{s.bh});
  const int64_t* rp = s.row_ptr.data_as<int64_t>();
  return DispatchIndex(s.col_idx.dtype(), [&](auto itag) -> Status {
    const auto* ci = s.col_idx.data_as<decltype(itag)>();
    for (int64_t br = 0; br < brows; ++br) {
      const int64_t real_rows = std::min<int64_t>(s.bh, s.rows - br * s.bh);
      for (int64_t p = rp[br]; p < rp[br + 1]; ++p) {
        const int64_t real_cols =
            std::min<int64_t>(s.bw, s.cols - static_cast<int64_t>(ci[p]) * s.bw);
        // Every slot of the block's code bytes, the spare nibble of an odd bw included.
        const int64_t slots = spec.dtype == DType::kI8 ? s.bw : 2 * rb;
        for (int i = 0; i < s.bh; ++i) {
          for (int64_t j = 0; j < slots; ++j) {
            const int q = CodeAt(codes, spec, rb, s.bh, p, i, j);
            const bool real = i < real_rows && j < real_cols;
            if (real && (q < lo || q > hi)) {
              return InvalidInput(name + ".values: block " + std::to_string(p) + " row " +
                                  std::to_string(i) + " value " + std::to_string(j) + " has code " +
                                  std::to_string(q) + ", outside " + spec.Name() + "'s " +
                                  std::to_string(lo) + ".." + std::to_string(hi));
            }
            if (!real && q != 0) {
              return InvalidInput(name + ".values: block " + std::to_string(p) + " holds code " +
                                  std::to_string(q) + " at (" + std::to_string(i) + ", " +
                                  std::to_string(j) + ") in its padding; padding codes must be 0");
            }
          }
        }
      }
    }
    return Status::Ok();
  });
}

}  // namespace formats_internal

Tensor BsrMatrix::StoredValuesF32() const {
  const int64_t n = nblocks();
  Tensor out = Tensor::Alloc(DType::kF32, {n, bh, bw});
  float* o = out.mutable_data_as<float>();
  if (!quant.quantized()) {
    DispatchValue(values.dtype(), [&](auto codec) {
      using C = decltype(codec);
      const auto* v = values.data_as<typename C::Storage>();
      for (int64_t e = 0; e < n * bh * bw; ++e) o[e] = C::Dec(v[e]);
    });
    return out;
  }
  const ValueSpec& spec = quant.spec;
  const int64_t qg = quant_groups(spec), rb = BlockRowBytes(spec, bw);
  const uint8_t* codes = values.data_as<uint8_t>();
  const uint16_t* sc = quant.scales.data_as<uint16_t>();
  const uint16_t* mn = spec.has_min() ? quant.mins.data_as<uint16_t>() : nullptr;
  ForEachRowSegment(*this, [&](int64_t r, int64_t p, int i, int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t gi = r * qg + c / spec.group;
      const QuantGroup g = QuantGroupFromF16(sc[gi], mn ? mn[gi] : 0, spec);
      o[(p * bh + i) * bw + (c - c0)] =
          Dequantize(CodeAt(codes, spec, rb, bh, p, i, c - c0), g, spec);
    }
  });
  return out;
}

Result<BsrMatrix> BsrMatrix::Quantize(const BsrMatrix& src, const ValueSpec& spec,
                                      std::span<const QuantGroup> fitted, const std::string& name) {
  if (!QuantSpecOk(spec)) {
    return InvalidInput(name + ": '" + spec.Name() + "' is not a quantized spec");
  }
  if (src.quant.quantized()) return InvalidInput(name + ": values are quantized already");
  SPARQ_RETURN_IF_ERROR(src.Validate(name));
  const int64_t qg = src.quant_groups(spec), n = src.nblocks(), rb = BlockRowBytes(spec, src.bw);
  if (!fitted.empty() && fitted.size() != static_cast<size_t>(src.rows * qg)) {
    return InvalidInput(name + ": " + std::to_string(fitted.size()) + " fitted groups, want " +
                        std::to_string(src.rows * qg));
  }
  const Tensor v = src.StoredValuesF32();
  const float* x = v.data_as<float>();
  BsrMatrix out;
  out.rows = src.rows;
  out.cols = src.cols;
  out.bh = src.bh;
  out.bw = src.bw;
  out.row_ptr = src.row_ptr;
  out.col_idx = src.col_idx;
  out.values = Tensor::Alloc(spec.dtype == DType::kI8 ? DType::kI8 : DType::kU8, {n, src.bh, rb});
  if (out.values.nbytes() > 0) std::memset(out.values.mutable_data(), 0, out.values.nbytes());
  out.quant.spec = spec;
  out.quant.scales = Tensor::Alloc(DType::kF16, {src.rows, qg});
  out.quant.mins = spec.has_min() ? Tensor::Alloc(DType::kF16, {src.rows, qg}) : Tensor();
  uint8_t* codes = out.values.mutable_data_as<uint8_t>();
  uint16_t* sc = out.quant.scales.mutable_data_as<uint16_t>();
  uint16_t* mn = spec.has_min() ? out.quant.mins.mutable_data_as<uint16_t>() : nullptr;
  // Row by row: each row's stored values by group (their flat positions in `values`), then each
  // group fitted (or taken) and its values coded.
  std::vector<std::vector<int64_t>> at(static_cast<size_t>(qg));
  std::vector<float> vals;
  const float none = 0.0f;
  Status st = Status::Ok();
  auto flush = [&](int64_t r) {
    for (int64_t g = 0; g < qg && st.ok(); ++g) {
      std::vector<int64_t>& pos = at[g];
      QuantGroup qp;
      if (fitted.empty()) {
        vals.resize(pos.size());
        for (size_t e = 0; e < pos.size(); ++e) vals[e] = x[pos[e]];
        auto f = FitQuantGroup(vals.empty() ? &none : vals.data(),
                               static_cast<int64_t>(vals.size()), spec);
        if (!f.ok()) {
          st = f.status().WithContext(name + ".values row " + std::to_string(r) + " group " +
                                      std::to_string(g));
          return;
        }
        qp = *f;
      } else {
        const QuantGroup& in = fitted[r * qg + g];
        qp = QuantGroupFromF16(in.scale_f16, in.min_f16, spec);
      }
      sc[r * qg + g] = qp.scale_f16;
      if (mn != nullptr) mn[r * qg + g] = qp.min_f16;
      for (const int64_t e : pos) {
        const int q = NearestCode(x[e], qp, spec);
        const int64_t pi = e / src.bw, j = e % src.bw;  // block row pi = p * bh + i, column j
        if (spec.dtype == DType::kI8) {
          codes[pi * rb + j] = static_cast<uint8_t>(static_cast<int8_t>(q));
        } else {
          codes[pi * rb + j / 2] |= static_cast<uint8_t>(q << (j % 2 ? 4 : 0));
        }
      }
      pos.clear();
    }
  };
  // Rows come in order; a row of a block row without blocks has only empty groups (RTN: scale 0).
  int64_t row = 0;  // the row whose positions `at` collects
  ForEachRowSegment(src, [&](int64_t r, int64_t p, int i, int64_t c0, int64_t c1) {
    while (row < r && st.ok()) flush(row++);
    for (int64_t c = c0; c < c1; ++c) {
      at[c / spec.group].push_back((p * src.bh + i) * src.bw + (c - c0));
    }
  });
  while (row < src.rows && st.ok()) flush(row++);
  SPARQ_RETURN_IF_ERROR(st);
  SPARQ_RETURN_IF_ERROR(out.Validate(name));
  return out;
}

}  // namespace sparq
