// The SparseMatrix variant: names, uniform accessors, PickFormat and Encode.
#include <string>
#include <variant>

#include "sparq/format.h"
#include "src/formats/format_util.h"

namespace sparq {

std::string_view FormatName(FormatKind f) {
  switch (f) {
    case FormatKind::kDense: return "dense";
    case FormatKind::kCoo: return "coo";
    case FormatKind::kCsr: return "csr";
    case FormatKind::kBsr: return "bsr";
    case FormatKind::kNM: return "nm";
    case FormatKind::kVNM: return "vnm";
  }
  return "unknown";
}

std::optional<FormatKind> ParseFormatName(std::string_view s) {
  for (FormatKind f : {FormatKind::kDense, FormatKind::kCoo, FormatKind::kCsr, FormatKind::kBsr,
                       FormatKind::kNM, FormatKind::kVNM}) {
    if (FormatName(f) == s) return f;
  }
  return std::nullopt;
}

FormatKind KindOf(const SparseMatrix& s) {
  static constexpr FormatKind kKinds[] = {FormatKind::kDense, FormatKind::kCoo, FormatKind::kCsr,
                                          FormatKind::kBsr,   FormatKind::kNM,  FormatKind::kVNM};
  static_assert(std::variant_size_v<SparseMatrix> == 6, "keep kKinds in variant order");
  return kKinds[s.index()];
}

int64_t Rows(const SparseMatrix& s) {
  return std::visit([](const auto& x) { return x.rows; }, s);
}

int64_t Cols(const SparseMatrix& s) {
  return std::visit([](const auto& x) { return x.cols; }, s);
}

DType ValueDType(const SparseMatrix& s) {
  return std::visit([](const auto& x) { return x.values.dtype(); }, s);
}

namespace {

// The QuantParts of the formats that can hold quantized values (all but COO), else nullptr.
const QuantParts* QuantOf(const SparseMatrix& s) {
  if (const auto* nm = std::get_if<NmMatrix>(&s)) return &nm->quant;
  if (const auto* vnm = std::get_if<VnmMatrix>(&s)) return &vnm->quant;
  if (const auto* b = std::get_if<BsrMatrix>(&s)) return &b->quant;
  if (const auto* c = std::get_if<CsrMatrix>(&s)) return &c->quant;
  if (const auto* d = std::get_if<DenseMatrix>(&s)) return &d->quant;
  return nullptr;
}

}  // namespace

bool IsQuantized(const SparseMatrix& s) {
  const QuantParts* q = QuantOf(s);
  return q != nullptr && q->quantized();
}

std::string ValuesName(const SparseMatrix& s) {
  if (const QuantParts* q = QuantOf(s); q != nullptr && q->quantized()) return q->spec.Name();
  return std::string(DTypeName(ValueDType(s)));
}

Result<SparseMatrix> QuantizeMatrix(const SparseMatrix& s, const ValueSpec& spec,
                                    std::span<const QuantGroup> fitted, const std::string& name) {
  auto wrap = [](auto r) -> Result<SparseMatrix> {
    if (!r.ok()) return r.status();
    return SparseMatrix(std::move(r).value());
  };
  if (const auto* x = std::get_if<NmMatrix>(&s)) {
    return wrap(NmMatrix::Quantize(*x, spec, fitted, name));
  }
  if (const auto* x = std::get_if<VnmMatrix>(&s)) {
    return wrap(VnmMatrix::Quantize(*x, spec, fitted, name));
  }
  if (const auto* x = std::get_if<BsrMatrix>(&s)) {
    return wrap(BsrMatrix::Quantize(*x, spec, fitted, name));
  }
  if (const auto* x = std::get_if<CsrMatrix>(&s)) {
    return wrap(CsrMatrix::Quantize(*x, spec, fitted, name));
  }
  if (const auto* x = std::get_if<DenseMatrix>(&s)) {
    return wrap(DenseMatrix::Quantize(*x, spec, fitted, name));
  }
  return InvalidInput(name + ": quantized values (" + spec.Name() +
                      ") are stored for nm, vnm, bsr, csr and dense matrices, not " +
                      std::string(FormatName(KindOf(s))));
}

Tensor ToDense(const SparseMatrix& s) {
  return std::visit([](const auto& x) { return x.ToDense(); }, s);
}

Status Validate(const SparseMatrix& s, const std::string& name) {
  return std::visit([&](const auto& x) { return x.Validate(name); }, s);
}

uint64_t ByteSize(const SparseMatrix& s) {
  return std::visit([](const auto& x) { return x.ByteSize(); }, s);
}

FormatKind PickFormat(const Pattern& p) {
  switch (p.kind) {
    case PatternKind::kDense: return FormatKind::kDense;
    case PatternKind::kNM: return FormatKind::kNM;
    case PatternKind::kVNM: return FormatKind::kVNM;
    case PatternKind::kBlock: return FormatKind::kBsr;
    default: return FormatKind::kCsr;
  }
}

Result<SparseMatrix> Encode(std::span<const float> w, int64_t rows, int64_t cols,
                            FormatKind format, const Pattern& p, DType value_dtype) {
  auto wrap = [](auto r) -> Result<SparseMatrix> {
    if (!r.ok()) return r.status();
    return SparseMatrix(std::move(r).value());
  };
  const std::string fmt(FormatName(format));
  if (format != FormatKind::kDense && format != FormatKind::kCoo &&
      format != FormatKind::kCsr) {
    Status st = p.Validate();
    if (!st.ok()) return st.WithContext("Encode as " + fmt + ": pattern " + p.ToString());
  }
  switch (format) {
    case FormatKind::kDense:
      return wrap(DenseMatrix::FromDense(w, rows, cols, value_dtype));
    case FormatKind::kCoo:
      return wrap(CooMatrix::FromDense(w, rows, cols, value_dtype));
    case FormatKind::kCsr:
      return wrap(CsrMatrix::FromDense(w, rows, cols, value_dtype));
    case FormatKind::kBsr:
      if (p.kind != PatternKind::kBlock) {
        return InvalidInput("Encode: format bsr needs a block pattern (block:HxW), got " +
                            p.ToString());
      }
      return wrap(BsrMatrix::FromDense(w, rows, cols, p.bh, p.bw, value_dtype));
    case FormatKind::kNM:
      // A V:N:M tensor satisfies N:M too.
      if (p.kind != PatternKind::kNM && p.kind != PatternKind::kVNM) {
        return InvalidInput("Encode: format nm needs an N:M pattern (e.g. 2:4), got " +
                            p.ToString());
      }
      return wrap(NmMatrix::FromDense(w, rows, cols, p.n, p.m, value_dtype));
    case FormatKind::kVNM:
      if (p.kind != PatternKind::kVNM) {
        return InvalidInput("Encode: format vnm needs a V:N:M pattern (vnm:V:N:M), got " +
                            p.ToString());
      }
      return wrap(VnmMatrix::FromDense(w, rows, cols, p.v, p.n, p.m, value_dtype));
  }
  return InvalidInput("Encode: unknown format " + std::to_string(static_cast<int>(format)));
}

}  // namespace sparq
