#include "sparq/tensor.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "sparq/checked.h"

namespace sparq {

namespace {
std::shared_ptr<void> AllocAligned(uint64_t bytes) {
  const uint64_t rounded = (bytes + kTensorAlignment - 1) / kTensorAlignment * kTensorAlignment;
  void* p = std::aligned_alloc(kTensorAlignment, rounded == 0 ? kTensorAlignment : rounded);
  if (!p) return nullptr;
  std::memset(p, 0, rounded == 0 ? kTensorAlignment : rounded);
  return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
}

uint64_t NumelOf(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}
}  // namespace

Tensor Tensor::Alloc(DType dtype, std::vector<int64_t> shape) {
  Tensor t;
  t.dtype_ = dtype;
  t.numel_ = NumelOf(shape);
  t.shape_ = std::move(shape);
  auto buf = AllocAligned(t.nbytes());
  if (!buf) throw std::bad_alloc();
  t.data_ = buf.get();
  t.holder_ = std::move(buf);
  t.writable_ = true;
  return t;
}

Result<Tensor> Tensor::TryAlloc(DType dtype, std::vector<int64_t> shape, const std::string& what,
                                uint64_t max_bytes) {
  SPARQ_ASSIGN_OR_RETURN(uint64_t n, CheckedNumel(std::span<const int64_t>(shape), what));
  auto bits = CheckedMul(n, static_cast<uint64_t>(DTypeBits(dtype)));
  if (!bits || (*bits + 7) / 8 > max_bytes) {
    return InvalidInput(what + ": tensor of " + std::to_string(n) + " elements is too large");
  }
  Tensor t;
  t.dtype_ = dtype;
  t.numel_ = n;
  t.shape_ = std::move(shape);
  auto buf = AllocAligned(t.nbytes());
  if (!buf) return IoError(what + ": out of memory allocating " + std::to_string(t.nbytes()) + " bytes");
  t.data_ = buf.get();
  t.holder_ = std::move(buf);
  t.writable_ = true;
  return t;
}

Tensor Tensor::View(DType dtype, std::vector<int64_t> shape, const void* data,
                    std::shared_ptr<const void> keepalive) {
  Tensor t;
  t.dtype_ = dtype;
  t.numel_ = NumelOf(shape);
  t.shape_ = std::move(shape);
  t.data_ = const_cast<void*>(data);
  t.holder_ = std::move(keepalive);
  t.writable_ = false;
  return t;
}

Tensor Tensor::Clone() const {
  Tensor t = Alloc(dtype_, shape_);
  if (nbytes()) std::memcpy(t.data_, data_, nbytes());
  return t;
}

std::vector<int64_t> Tensor::strides() const {
  std::vector<int64_t> s(shape_.size());
  int64_t acc = 1;
  for (int i = rank() - 1; i >= 0; --i) {
    s[i] = acc;
    acc *= shape_[i];
  }
  return s;
}

void* Tensor::mutable_data() {
  if (!writable_) std::abort();  // programming error: views are read-only
  return data_;
}

Result<Tensor> Tensor::Reshape(std::vector<int64_t> shape) const {
  SPARQ_ASSIGN_OR_RETURN(uint64_t n, CheckedNumel(std::span<const int64_t>(shape), "reshape"));
  if (n != numel_) return InvalidInput("reshape: element count mismatch");
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

std::string Tensor::ShapeString() const {
  std::string s(DTypeName(dtype_));
  s += "[";
  for (size_t i = 0; i < shape_.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape_[i]);
  }
  return s + "]";
}

Result<Tensor> ToF32(const Tensor& t) {
  Tensor out = Tensor::Alloc(DType::kF32, t.shape());
  float* o = out.mutable_data_as<float>();
  const uint64_t n = t.numel();
  switch (t.dtype()) {
    case DType::kF32: if (n) std::memcpy(o, t.data(), n * 4); break;
    case DType::kF16: { auto* s = t.data_as<uint16_t>(); for (uint64_t i = 0; i < n; ++i) o[i] = F16ToF32(s[i]); break; }
    case DType::kBF16: { auto* s = t.data_as<uint16_t>(); for (uint64_t i = 0; i < n; ++i) o[i] = BF16ToF32(s[i]); break; }
    case DType::kF64: { auto* s = t.data_as<double>(); for (uint64_t i = 0; i < n; ++i) o[i] = static_cast<float>(s[i]); break; }
    case DType::kI8: { auto* s = t.data_as<int8_t>(); for (uint64_t i = 0; i < n; ++i) o[i] = s[i]; break; }
    case DType::kU8: { auto* s = t.data_as<uint8_t>(); for (uint64_t i = 0; i < n; ++i) o[i] = s[i]; break; }
    case DType::kI16: { auto* s = t.data_as<int16_t>(); for (uint64_t i = 0; i < n; ++i) o[i] = s[i]; break; }
    case DType::kI32: { auto* s = t.data_as<int32_t>(); for (uint64_t i = 0; i < n; ++i) o[i] = static_cast<float>(s[i]); break; }
    default:
      return Unsupported(std::string("cannot convert ") + std::string(DTypeName(t.dtype())) + " to f32");
  }
  return out;
}

Result<Tensor> FromF32(const Tensor& t, DType target) {
  if (t.dtype() != DType::kF32) return InvalidInput("FromF32: source is not f32");
  const float* s = t.data_as<float>();
  const uint64_t n = t.numel();
  Tensor out = Tensor::Alloc(target, t.shape());
  switch (target) {
    case DType::kF32: if (n) std::memcpy(out.mutable_data(), s, n * 4); break;
    case DType::kF16: { auto* o = out.mutable_data_as<uint16_t>(); for (uint64_t i = 0; i < n; ++i) o[i] = F32ToF16(s[i]); break; }
    case DType::kBF16: { auto* o = out.mutable_data_as<uint16_t>(); for (uint64_t i = 0; i < n; ++i) o[i] = F32ToBF16(s[i]); break; }
    default:
      return Unsupported(std::string("cannot convert f32 to ") + std::string(DTypeName(target)));
  }
  return out;
}

}  // namespace sparq
