// LinearWeight: pack once (spmm_pack.cc), then run the registry's kernel for each call.
#include "sparq/linear.h"

#include <vector>

#include "src/cpu/spmm.h"

namespace sparq {

struct LinearWeight::Impl {
  cpu::PackedWeight packed;
  std::string name;
  KernelConfig cfg;  // the machine and knobs every product of this weight runs with
};

LinearWeight::LinearWeight() = default;
LinearWeight::~LinearWeight() = default;
LinearWeight::LinearWeight(LinearWeight&&) noexcept = default;
LinearWeight& LinearWeight::operator=(LinearWeight&&) noexcept = default;

Result<LinearWeight> LinearWeight::FromMatrix(SparseMatrix matrix, const std::string& name,
                                              const KernelConfig& cfg) {
  return FromMatrix(std::move(matrix), ValueSpec{}, name, cfg);
}

Result<LinearWeight> LinearWeight::FromMatrix(SparseMatrix matrix, const ValueSpec& values,
                                              const std::string& name, const KernelConfig& cfg) {
  // The format's own Validate() is the single source of truth for a well-formed matrix (kernels
  // assume valid input); Pack additionally checks what its layouts rely on.
  SPARQ_RETURN_IF_ERROR(Validate(matrix, name));
  cpu::PackOptions options = cpu::PackOptionsFor(cfg);
  options.values = values;
  SPARQ_ASSIGN_OR_RETURN(cpu::PackedWeight packed, cpu::Pack(matrix, name, options));
  LinearWeight lw;
  lw.impl_ = std::make_unique<Impl>();
  lw.impl_->packed = std::move(packed);
  cpu::CacheDecodeBounds(&lw.impl_->packed);
  lw.impl_->name = name;
  lw.impl_->cfg = cfg;
  return lw;
}

Result<LinearWeight> LinearWeight::FromDenseQuant(int64_t rows, int64_t cols,
                                                  const ValueSpec& values,
                                                  std::span<const uint8_t> codes,
                                                  std::span<const uint16_t> scales,
                                                  std::span<const uint16_t> mins,
                                                  const std::string& name,
                                                  const KernelConfig& cfg) {
  if (values.has_min() && mins.size() != scales.size()) {
    return InvalidInput(name + ".mins: " + std::to_string(mins.size()) + " groups, expected " +
                        std::to_string(scales.size()));
  }
  SPARQ_ASSIGN_OR_RETURN(
      cpu::PackedWeight packed,
      cpu::PackDenseQuantCodes(rows, cols, values, codes.data(), int64_t(codes.size()),
                               scales.data(), mins.empty() ? nullptr : mins.data(),
                               int64_t(scales.size()), name));
  LinearWeight lw;
  lw.impl_ = std::make_unique<Impl>();
  lw.impl_->packed = std::move(packed);
  cpu::CacheDecodeBounds(&lw.impl_->packed);
  lw.impl_->name = name;
  lw.impl_->cfg = cfg;
  return lw;
}

int64_t LinearWeight::rows() const { return impl_ ? impl_->packed.rows : 0; }
int64_t LinearWeight::cols() const { return impl_ ? impl_->packed.cols : 0; }
uint64_t LinearWeight::weight_bytes() const { return impl_ ? impl_->packed.weight_bytes : 0; }
const std::string& LinearWeight::format() const {
  static const std::string kNone = "none";
  return impl_ ? impl_->packed.source : kNone;
}
ValueSpec LinearWeight::values() const {
  if (!impl_) return ValueSpec{};
  auto of = [](DType dt) {
    ValueSpec v;
    v.dtype = dt;
    return v;
  };
  return std::visit(
      cpu::Overloaded{
          [](const cpu::DenseF32Weight&) { return ValueSpec{}; },
          [](const cpu::NmWeight& nm) { return nm.spec; },
          [](const cpu::DenseQuantWeight& d) { return d.values; },
          [&](const cpu::RowGroupWeight& g) { return g.quantized() ? g.spec : of(g.value_dtype); },
          [&](const cpu::MaskWeight& m) { return m.quantized() ? m.spec : of(m.value_dtype); },
      },
      impl_->packed.layout);
}
const float* LinearWeight::dense_f32() const {
  if (!impl_ || impl_->packed.kind() != cpu::PackedKind::kDenseF32) return nullptr;
  return impl_->packed.dense().data_as<float>();
}
std::optional<DenseMatrix> LinearWeight::dense_quant() const {
  if (!impl_ || impl_->packed.kind() != cpu::PackedKind::kDenseQuant) return std::nullopt;
  const cpu::DenseQuantWeight& q = impl_->packed.dense_quant();
  DenseMatrix dm;
  dm.rows = q.rows;
  dm.cols = q.cols;
  dm.quant.spec = q.values;
  const bool i8 = q.values.dtype == DType::kI8;
  // The packed rows interleave int4 codes per 16-column chunk (spmm_packed.h); the checkpoint
  // keeps code 2i in the low nibble of byte i.
  const int64_t row_bytes = i8 ? q.cols : (q.cols + 1) / 2;
  dm.values = Tensor::Alloc(i8 ? DType::kI8 : DType::kU8, {q.rows, row_bytes});
  auto* out = static_cast<uint8_t*>(dm.values.mutable_data());
  for (int64_t r = 0; r < q.rows; ++r) {
    uint8_t* row = out + r * row_bytes;
    for (int64_t c = 0; c < q.cols; ++c) {
      const int code = q.Code(r, c);
      if (i8) {
        row[c] = static_cast<uint8_t>(static_cast<int8_t>(code));
      } else {
        row[c / 2] = static_cast<uint8_t>(row[c / 2] | (code << (c % 2 == 0 ? 0 : 4)));
      }
    }
  }
  auto f16 = [&](const std::vector<float>& v) {
    Tensor t = Tensor::Alloc(DType::kF16, {q.rows, q.groups_per_row});
    auto* h = static_cast<uint16_t*>(t.mutable_data());
    // Exact: the packed f32 values were widened from f16.
    for (size_t i = 0; i < v.size(); ++i) h[i] = F32ToF16(v[i]);
    return t;
  };
  dm.quant.scales = f16(q.scales);
  if (q.values.has_min()) dm.quant.mins = f16(q.mins);
  return dm;
}

bool LinearWeight::DequantizeRow(int64_t r, float* out) const {
  if (!impl_ || impl_->packed.kind() != cpu::PackedKind::kDenseQuant) return false;
  const cpu::DenseQuantWeight& q = impl_->packed.dense_quant();
  for (int64_t c = 0; c < q.cols; ++c) out[c] = q.Value(r, c);
  return true;
}

const KernelConfig& LinearWeight::config() const {
  static const KernelConfig kNone;
  return impl_ ? impl_->cfg : kNone;
}

std::string LinearWeight::kernel_name(int64_t n) const {
  if (!impl_) return "none";
  return std::string(cpu::ChooseKernel(impl_->packed, n, impl_->cfg).name) + "(" +
         impl_->packed.source + ")";
}

bool LinearWeight::rounds_x(int64_t n) const {
  return impl_ &&
         cpu::ChooseKernel(impl_->packed, n, impl_->cfg).mode == cpu::KernelMode::kDecodeInt8X;
}

std::string LinearWeight::explain(int64_t n) const {
  if (!impl_) return "none\n";
  const cpu::KernelChoice c = cpu::ExplainKernel(impl_->packed, n, impl_->cfg);
  std::string out = "chosen: ";
  out += c.chosen ? c.chosen->name : "none";
  if (c.chosen) {
    out += " (" + std::string(cpu::LayoutName(c.chosen->layout)) + ", tile " + c.chosen->tile +
           ", on " + impl_->cfg.target_name() + ")";
  }
  out += "\n";
  for (const auto& [row, why] : c.declined) out += "  declined " + std::string(row->name) + ": " + why + "\n";
  return out;
}

void LinearWeight::Forward(const float* x, int64_t n, int64_t ldx, float* y, int64_t ldy,
                           const Epilogue& ep, ThreadPool* pool) const {
  if (!impl_ || n <= 0) return;
  const cpu::PackedWeight& w = impl_->packed;
  cpu::SpmmArgs a;
  a.x = x;
  a.n = n;
  a.ldx = ldx > 0 ? ldx : w.cols;
  a.y = y;
  a.ldy = ldy > 0 ? ldy : w.rows;
  a.ep = ep;
  a.cfg = &impl_->cfg;
  SPARQ_DCHECK(a.ldx >= w.cols && a.ldy >= w.rows);
  cpu::ChooseKernel(w, n, impl_->cfg).Run(w, a, pool);
}

void LinearWeight::ForwardShared(const float* x, int64_t n, std::span<const Output> outputs,
                                 ThreadPool* pool) {
  if (n <= 0) return;
  std::vector<cpu::SharedInputJob> jobs;
  jobs.reserve(outputs.size());
  [[maybe_unused]] int64_t cols = -1;  // read by SPARQ_DCHECK only
  const KernelConfig* cfg = nullptr;   // the first weight's: the products run on one target
  for (const Output& o : outputs) {
    if (o.weight == nullptr || !o.weight->impl_) continue;
    const cpu::PackedWeight& w = o.weight->impl_->packed;
    SPARQ_DCHECK(cols < 0 || cols == w.cols);
    cols = w.cols;
    jobs.push_back({&w, o.y, 0, o.ep});
    if (cfg == nullptr) cfg = &o.weight->impl_->cfg;
  }
  if (cfg == nullptr) return;
  cpu::RunSharedInput(x, n, 0, jobs.data(), jobs.size(), *cfg, pool);
}

bool LinearWeight::SwiGluFuses(const LinearWeight& gate, const LinearWeight& up,
                               const LinearWeight& down, int64_t n) {
  if (!gate.impl_ || !up.impl_ || !down.impl_) return false;
  return cpu::SwiGluFuses(gate.impl_->packed, up.impl_->packed, down.impl_->packed, n,
                          gate.impl_->cfg);
}

bool LinearWeight::ForwardSwiGlu(const LinearWeight& gate, const LinearWeight& up,
                                 const LinearWeight& down, const float* x, const float* x_up,
                                 int64_t n, const int32_t* down_row, const float* residual,
                                 float* y, ThreadPool* pool) {
  if (!gate.impl_ || !up.impl_ || !down.impl_) return false;
  return cpu::RunSwiGlu(gate.impl_->packed, up.impl_->packed, down.impl_->packed, x, x_up, n,
                        down_row, residual, y, gate.impl_->cfg, pool);
}

}  // namespace sparq
