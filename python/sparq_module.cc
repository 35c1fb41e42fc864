// sparq._sparq: the nanobind extension behind the `sparq` Python package (python/sparq/).
//
// This layer trusts its array arguments' dtype and rank (nanobind enforces them: a mismatch is a
// TypeError, never a crash) and checks everything else (shapes, strides, NaN, patterns) with the
// library's own Status messages, raised as ValueError (invalid input / unsupported), OSError (I/O)
// or RuntimeError (internal). python/sparq/__init__.py turns user arrays into these layouts (it
// rejects wrong dtypes and copies only where the layout demands it) and documents the API.
// Kernels and pruning run with the GIL released.
//
// Shapes follow sparq (pattern.h): a weight W[m, k] is used as Y[n, m] = X[n, k] W^T.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "sparq/format.h"
#include "sparq/kernel_config.h"
#include "sparq/linear.h"
#include "sparq/machine.h"
#include "sparq/pattern.h"
#include "sparq/prune.h"
#include "sparq/quant.h"
#include "sparq/status.h"
#include "sparq/tensor.h"
#include "sparq/thread_pool.h"
#include "bindings_common.h"

namespace nb = nanobind;

namespace sparq::python {
namespace {

// Read-only inputs: dtype and rank fixed, any strides (checked where it matters).
using CMatrixF32 = nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using MatrixF32 = nb::ndarray<const float, nb::ndim<2>, nb::device::cpu>;
using VectorF32 = nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using CMatrixU8 = nb::ndarray<const uint8_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using CMatrixF64 = nb::ndarray<const double, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using OutArray = nb::ndarray<nb::numpy, float>;
using OutMask = nb::ndarray<nb::numpy, uint8_t>;

// An owned f32 Tensor [rows, cols] handed to NumPy without a copy: the capsule owns it.
template <typename T>
nb::ndarray<nb::numpy, T> ToNumpy(Tensor t, std::initializer_list<size_t> shape,
                                  std::initializer_list<int64_t> strides = {}) {
  auto* owned = new Tensor(std::move(t));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<Tensor*>(p); });
  return nb::ndarray<nb::numpy, T>(owned->mutable_data_as<T>(), shape, owner, strides);
}

// First non-finite element of w [rows, cols], as an error naming `what` and the position.
Status CheckFinite(const float* w, int64_t rows, int64_t cols, const std::string& what) {
  for (int64_t i = 0; i < rows * cols; ++i) {
    if (!std::isfinite(w[i])) {
      return InvalidInput(what + ": element [" + std::to_string(i / cols) + ", " +
                          std::to_string(i % cols) + "] is " + std::to_string(w[i]) +
                          " (must be finite)");
    }
  }
  return Status::Ok();
}

// Deep copy of a matrix: copying a sparq::SparseMatrix shares its tensors' buffers, and a
// LinearWeight owns the matrix it packs, so the Python object keeps its own.
SparseMatrix CloneMatrix(const SparseMatrix& s) {
  return std::visit(
      [](const auto& src) -> SparseMatrix {
        auto c = src;
        auto clone = [](Tensor& t) {
          if (!t.empty()) t = t.Clone();  // an absent part (no scales) stays absent
        };
        if constexpr (requires { c.values; }) clone(c.values);
        if constexpr (requires { c.meta; }) clone(c.meta);
        if constexpr (requires { c.row_idx; }) clone(c.row_idx);
        if constexpr (requires { c.col_idx; }) clone(c.col_idx);
        if constexpr (requires { c.row_ptr; }) clone(c.row_ptr);
        if constexpr (requires { c.quant; }) {
          clone(c.quant.scales);
          clone(c.quant.mins);
        }
        return c;
      },
      s);
}

// ---- SparseMatrix ------------------------------------------------------------------------------

struct Matrix {
  SparseMatrix m;
  double density = 0;  // nonzeros of the dense matrix / (rows * cols)
};

Result<Matrix> FromDense(const float* w, int64_t rows, int64_t cols,
                         const std::optional<Pattern>& pattern, const uint8_t* mask,
                         const std::string& format, const std::string& values) {
  SPARQ_RETURN_IF_ERROR(CheckFinite(w, rows, cols, "w"));
  SPARQ_ASSIGN_OR_RETURN(ValueSpec spec, ValueSpec::Parse(values));
  if (spec.quantized()) {
    return Unsupported("values '" + values +
                       "': quantized values are not in the Python API yet (use f32, bf16, f16)");
  }
  std::optional<FormatKind> kind;
  if (format != "auto") {
    kind = ParseFormatName(format);
    if (!kind) {
      return InvalidInput("format '" + format + "': one of auto, dense, coo, csr, bsr, nm, vnm");
    }
  }
  const Pattern p = pattern.value_or(Pattern::Dense());
  if (pattern) SPARQ_RETURN_IF_ERROR(CheckPatternFits(p, rows, cols, "w"));
  const size_t size = static_cast<size_t>(rows * cols);
  std::vector<float> masked;
  std::span<const float> src(w, size);
  if (mask) {  // the weight is w * mask; a mask alone is stored exactly (CSR, zeros included)
    masked.assign(w, w + size);
    for (size_t i = 0; i < size; ++i) {
      if (!mask[i]) masked[i] = 0.0f;
    }
    src = masked;
    if (!kind) kind = pattern ? PickFormat(p) : FormatKind::kCsr;
  }
  if (pattern && !Satisfies(p, src, rows, cols)) {
    return InvalidInput("w [" + std::to_string(rows) + ", " + std::to_string(cols) +
                        "] does not satisfy pattern " + p.ToString() +
                        " (prune it first: sparq.prune, or pass a mask)");
  }
  if (!kind) kind = PickFormat(p);
  Matrix out;
  if (mask && *kind == FormatKind::kCsr) {
    std::span<const uint8_t> keep(mask, size);
    SPARQ_ASSIGN_OR_RETURN(CsrMatrix csr,
                           CsrMatrix::FromDenseMasked(src, keep, rows, cols, spec.dtype));
    out.m = std::move(csr);
  } else {
    SPARQ_ASSIGN_OR_RETURN(out.m, Encode(src, rows, cols, *kind, p, spec.dtype));
  }
  SPARQ_RETURN_IF_ERROR(Validate(out.m, "w"));
  const Tensor dense = ToDense(out.m);  // what the kernels multiply with (values rounded)
  const float* d = dense.data_as<float>();
  int64_t nnz = 0;
  for (size_t i = 0; i < size; ++i) nnz += d[i] != 0.0f;
  out.density = size ? static_cast<double>(nnz) / static_cast<double>(size) : 0.0;
  return out;
}

// ---- Linear ------------------------------------------------------------------------------------

struct Linear {
  LinearWeight w;
  std::vector<float> bias;
  std::unique_ptr<ThreadPool> pool;
  // One product at a time on the pool: with the GIL released, Python threads may call the same
  // Linear concurrently, and a ThreadPool runs one ParallelFor at a time.
  std::unique_ptr<std::mutex> mu = std::make_unique<std::mutex>();
};

// y [n, m] = x [n, k] W^T + bias; x rows may be padded (stride(0) >= k), columns contiguous.
OutArray Forward(const Linear& lin, const MatrixF32& x) {
  const int64_t n = static_cast<int64_t>(x.shape(0)), k = static_cast<int64_t>(x.shape(1));
  const int64_t m = lin.w.rows();
  if (k != lin.w.cols()) {
    Raise(InvalidInput("x has " + std::to_string(k) + " columns (its last axis), the weight [" +
                       std::to_string(m) + ", " + std::to_string(lin.w.cols()) + "] needs " +
                       std::to_string(lin.w.cols())));
  }
  const int64_t ldx = n > 1 ? x.stride(0) : k;
  if (n > 0 && k > 0 && (x.stride(1) != 1 || ldx < k)) {  // NumPy may give empty arrays strides 0
    Raise(InvalidInput("x: rows must be contiguous (strides " + std::to_string(x.stride(0)) + ", " +
                       std::to_string(x.stride(1)) + " elements)"));
  }
  Tensor y = Tensor::Alloc(DType::kF32, {n, m});
  if (k == 0 && !lin.bias.empty()) {  // an empty product: y = bias, no kernel needs to see k = 0
    float* yd = y.mutable_data_as<float>();
    for (int64_t i = 0; i < n; ++i) std::copy(lin.bias.begin(), lin.bias.end(), yd + i * m);
  } else if (n > 0 && m > 0 && k > 0) {
    Epilogue ep;
    ep.bias = lin.bias.empty() ? nullptr : lin.bias.data();
    float* yd = y.mutable_data_as<float>();
    nb::gil_scoped_release release;  // before the lock: a waiting thread must not hold the GIL
    std::lock_guard<std::mutex> lock(*lin.mu);
    lin.w.Forward(x.data(), n, ldx, yd, m, ep, lin.pool.get());
  }
  return ToNumpy<float>(std::move(y), {static_cast<size_t>(n), static_cast<size_t>(m)});
}

// ---- prune -------------------------------------------------------------------------------------

// Prunes a copy of w [m, k]; returns (pruned w, mask = pruned != 0, report as JSON).
std::tuple<OutArray, OutMask, std::string> PruneLayer(const CMatrixF32& w, const Pattern& pattern,
                                                      const std::string& method,
                                                      const std::optional<CMatrixF32>& inputs,
                                                      const std::optional<CMatrixF64>& hessian,
                                                      double damp, int64_t blocksize, int threads) {
  const int64_t m = static_cast<int64_t>(w.shape(0)), k = static_cast<int64_t>(w.shape(1));
  const PruneMethod pm = Take(ParsePruneMethod(method));
  if (inputs && hessian) Raise(InvalidInput("prune: give inputs or hessian, not both"));
  if (pm != PruneMethod::kMagnitude && !inputs && !hessian) {
    Raise(
        InvalidInput("prune: method " + method + " needs inputs (X [N, k]) or hessian (H [k, k])"));
  }
  if (inputs && static_cast<int64_t>(inputs->shape(1)) != k) {
    Raise(InvalidInput("prune: inputs must be [N, " + std::to_string(k) + "] (w is [" +
                       std::to_string(m) + ", " + std::to_string(k) + "]), got [" +
                       std::to_string(inputs->shape(0)) + ", " + std::to_string(inputs->shape(1)) +
                       "]"));
  }
  if (inputs && inputs->shape(0) == 0) Raise(InvalidInput("prune: inputs has no rows"));
  if (hessian && (static_cast<int64_t>(hessian->shape(0)) != k ||
                  static_cast<int64_t>(hessian->shape(1)) != k)) {
    Raise(InvalidInput("prune: hessian must be [" + std::to_string(k) + ", " + std::to_string(k) +
                       "], got [" + std::to_string(hessian->shape(0)) + ", " +
                       std::to_string(hessian->shape(1)) + "]"));
  }
  Tensor out = Tensor::Alloc(DType::kF32, {m, k});
  float* wd = out.mutable_data_as<float>();
  std::copy(w.data(), w.data() + m * k, wd);
  Tensor mask = Tensor::Alloc(DType::kU8, {m, k});
  std::string report;
  Status failed;
  {
    nb::gil_scoped_release release;
    ThreadPool pool(threads);
    std::vector<double> h;
    Status st;
    if (inputs) {
      HessianAccumulator acc(k);
      st = acc.Add(inputs->data(), static_cast<int64_t>(inputs->shape(0)), k, &pool, "inputs");
      if (st.ok()) h = acc.Hessian();
    } else if (hessian) {
      h.assign(hessian->data(), hessian->data() + k * k);
    }
    Result<PruneReport> rep = st;
    if (st.ok()) {
      PruneOptions opt;
      opt.method = pm;
      opt.damp = damp;
      opt.blocksize = blocksize;
      opt.pool = &pool;
      opt.what = "w";
      rep = Prune(std::span<float>(wd, static_cast<size_t>(m * k)), m, k, h, pattern, opt);
    }
    if (rep.ok()) {
      report = rep->ToJson();
      uint8_t* md = mask.mutable_data_as<uint8_t>();
      for (int64_t i = 0; i < m * k; ++i) md[i] = wd[i] != 0.0f;
    } else {
      failed = rep.status();
    }
  }
  Check(failed);  // with the GIL held
  const size_t um = static_cast<size_t>(m), uk = static_cast<size_t>(k);
  return {ToNumpy<float>(std::move(out), {um, uk}), ToNumpy<uint8_t>(std::move(mask), {um, uk}),
          report};
}

}  // namespace
}  // namespace sparq::python

NB_MODULE(_sparq, mod) {
  using namespace sparq;
  using namespace sparq::python;
  mod.doc() = "sparq's C++ core (use the `sparq` package, not this module)";
  BindModel(mod);

  nb::class_<Pattern>(mod, "Pattern",
                      "A sparsity pattern: dense | unstructured:0.9 | unstructured-row:0.9 | "
                      "rows:0.3 | cols:0.3 | 2:4 | 4:8 | block:16x16 | block:32x32:0.9 | vnm:8:2:4")
      .def(
          "__init__",
          [](Pattern* p, const std::string& spec) { new (p) Pattern(Take(Pattern::Parse(spec))); },
          nb::arg("spec"))
      .def("__str__", &Pattern::ToString)
      .def("__repr__", [](const Pattern& p) { return "Pattern('" + p.ToString() + "')"; })
      .def("__eq__", [](const Pattern& a, const Pattern& b) { return a == b; })
      .def("__hash__", [](const Pattern& p) { return nb::hash(nb::str(p.ToString().c_str())); })
      .def_prop_ro(
          "n", [](const Pattern& p) { return p.n; }, "N of N:M and V:N:M (else 0)")
      .def_prop_ro(
          "m", [](const Pattern& p) { return p.m; }, "M of N:M and V:N:M (else 0)")
      .def_prop_ro(
          "fraction", [](const Pattern& p) { return p.fraction; },
          "sparsity of unstructured / rows / cols / block patterns (else 0)");

  nb::class_<Matrix>(mod, "_Matrix")
      .def_static(
          "from_dense",
          [](const CMatrixF32& w, const std::optional<Pattern>& pattern,
             const std::optional<CMatrixU8>& mask, const std::string& format,
             const std::string& values) {
            const int64_t rows = static_cast<int64_t>(w.shape(0));
            const int64_t cols = static_cast<int64_t>(w.shape(1));
            if (mask && (mask->shape(0) != w.shape(0) || mask->shape(1) != w.shape(1))) {
              Raise(InvalidInput("mask has shape [" + std::to_string(mask->shape(0)) + ", " +
                                 std::to_string(mask->shape(1)) + "], w has [" +
                                 std::to_string(rows) + ", " + std::to_string(cols) + "]"));
            }
            const uint8_t* md = mask ? mask->data() : nullptr;
            Result<Matrix> r = Status();
            {
              nb::gil_scoped_release release;
              r = FromDense(w.data(), rows, cols, pattern, md, format, values);
            }
            return Take(std::move(r));
          },
          nb::arg("w"), nb::arg("pattern").none(), nb::arg("mask").none(), nb::arg("format"),
          nb::arg("values"))
      .def("to_dense",
           [](const Matrix& s) {
             return ToNumpy<float>(
                 ToDense(s.m), {static_cast<size_t>(Rows(s.m)), static_cast<size_t>(Cols(s.m))});
           })
      .def_prop_ro("rows", [](const Matrix& s) { return Rows(s.m); })
      .def_prop_ro("cols", [](const Matrix& s) { return Cols(s.m); })
      .def_prop_ro("nbytes", [](const Matrix& s) { return ByteSize(s.m); })
      .def_prop_ro("format", [](const Matrix& s) { return std::string(FormatName(KindOf(s.m))); })
      .def_prop_ro("values", [](const Matrix& s) { return ValuesName(s.m); })
      .def_prop_ro("density", [](const Matrix& s) { return s.density; });

  nb::class_<Linear>(mod, "_Linear")
      .def(
          "__init__",
          [](Linear* lin, const Matrix& w, const std::optional<VectorF32>& bias, int threads,
             const std::string& isa) {
            if (bias && static_cast<int64_t>(bias->shape(0)) != Rows(w.m)) {
              Raise(InvalidInput("bias has " + std::to_string(bias->shape(0)) +
                                 " entries, the weight has " + std::to_string(Rows(w.m)) +
                                 " rows"));
            }
            if (bias) Check(CheckFinite(bias->data(), 1, bias->shape(0), "bias"));
            const KernelConfig& cfg = Config(isa);
            Result<LinearWeight> lw = Status();
            {
              nb::gil_scoped_release release;  // packing can take a while on big weights
              lw = LinearWeight::FromMatrix(CloneMatrix(w.m), "weight", cfg);
            }
            new (lin) Linear{Take(std::move(lw)), {}, std::make_unique<ThreadPool>(threads)};
            if (bias) lin->bias.assign(bias->data(), bias->data() + bias->shape(0));
          },
          nb::arg("w"), nb::arg("bias").none(), nb::arg("threads"), nb::arg("isa"))
      .def("forward", &Forward, nb::arg("x"))
      .def_prop_ro("rows", [](const Linear& l) { return l.w.rows(); })
      .def_prop_ro("cols", [](const Linear& l) { return l.w.cols(); })
      .def_prop_ro("threads", [](const Linear& l) { return l.pool->num_threads(); })
      .def_prop_ro("format", [](const Linear& l) { return l.w.format(); })
      .def_prop_ro("isa", [](const Linear& l) { return l.w.config().target_name(); })
      .def(
          "kernel_name", [](const Linear& l, int64_t n) { return l.w.kernel_name(n); },
          nb::arg("n"));

  mod.def("prune", &PruneLayer, nb::arg("w"), nb::arg("pattern"), nb::arg("method"),
          nb::arg("inputs").none(), nb::arg("hessian").none(), nb::arg("damp"),
          nb::arg("blocksize"), nb::arg("threads"));
  mod.def("hardware_threads", &ThreadPool::HardwareThreads);
  mod.def(
      "supported_isas",
      [] {
        std::vector<std::string> names;
        const KernelConfig& best = Config("");
        for (int64_t t : KernelConfig::SupportedTargets()) {
          names.push_back(best.WithTarget(t).target_name());
        }
        return names;
      },
      "The kernel targets this CPU runs, best first (names for Linear's isa).");
  // sparq/__init__.py asks a child process for these before it loads this module (OpenBLAS picks
  // its kernels when it loads): the `sparq` command's choice, so Python computes what it computes.
  mod.def("_blas_core", &sparq::cpu::BlasCoreName, "OpenBLAS's kernel family in this process.");
  mod.def(
      "_suggested_blas_core",
      [] {
        const char* core = sparq::cpu::SuggestedOpenBlasCore(false);
        return std::string(core != nullptr ? core : "");
      },
      "The OPENBLAS_CORETYPE the sparq command would set here ('' where OpenBLAS chose well).");
}
