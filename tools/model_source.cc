#include "tools/model_source.h"

#include <unistd.h>

#include "sparq/checked.h"
#include "sparq/format.h"

namespace sparq::cli {

namespace {

uint64_t PhysicalMemory() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return uint64_t{1} << 34;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
}

Status CheckDensifiable(const std::string& what, const std::vector<int64_t>& shape) {
  // Half the physical memory: a hostile file must get an error, not an allocation that the
  // allocator (or ASan) refuses with an abort.
  const uint64_t limit = PhysicalMemory() / 2;
  auto n = CheckedNumel(std::span<const int64_t>(shape), what, limit / 4);
  if (!n.ok()) {
    return InvalidInput(what + ": dense f32 form is larger than half of this machine's memory");
  }
  return Status::Ok();
}

bool IsFloat(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

}  // namespace

Result<ModelSource> ModelSource::Open(const std::string& path) {
  ModelSource s;
  s.path = path;
  SPARQ_ASSIGN_OR_RETURN(s.kind, DetectModelFile(path));
  if (s.kind == ModelFileKind::kHfFolder) {
    // A Hugging Face folder is one model over several files; this lists one file's tensors.
    return InvalidInput(path + ": is a folder; inspect and convert read one GGUF, safetensors or "
                        ".sparq file (pass one of its *.safetensors files; the commands that run "
                        "a model, such as eval and generate, take a Hugging Face folder whole)");
  }
  if (s.kind == ModelFileKind::kGguf) {
    SPARQ_ASSIGN_OR_RETURN(GgufFile g, GgufFile::Open(path));
    s.gguf = std::move(g);
    s.file_bytes = s.gguf->file_size();
    const auto& infos = s.gguf->tensors();
    for (size_t i = 0; i < infos.size(); ++i) {
      SourceTensor t;
      t.name = infos[i].name;
      t.shape = infos[i].shape();
      t.dtype = GgmlTypeName(infos[i].type);
      t.format = "dense";
      t.stored_bytes = infos[i].nbytes;
      t.can_read = GgmlTypeCanDequantize(infos[i].type);
      t.gguf_index = static_cast<int>(i);
      s.tensors.push_back(std::move(t));
    }
    return s;
  }
  SPARQ_ASSIGN_OR_RETURN(SafetensorsFile st, SafetensorsFile::Open(path));
  s.file_bytes = st.file_size();
  SPARQ_ASSIGN_OR_RETURN(Checkpoint ck, CheckpointFromSafetensors(st));
  s.ckpt = std::move(ck);
  for (size_t i = 0; i < s.ckpt->matrices.size(); ++i) {
    const CheckpointTensor& m = s.ckpt->matrices[i];
    SourceTensor t;
    t.name = m.name;
    t.shape = {Rows(m.matrix), Cols(m.matrix)};
    t.dtype = ValuesName(m.matrix);  // "int4:g64" rather than the codes' u8
    t.format = std::string(FormatName(KindOf(m.matrix)));
    t.stored_bytes = FileByteSize(st, m.name, m.matrix);  // as this file holds it
    t.matrix_index = static_cast<int>(i);
    s.tensors.push_back(std::move(t));
  }
  for (size_t i = 0; i < s.ckpt->tensors.size(); ++i) {
    const NamedTensor& p = s.ckpt->tensors[i];
    SourceTensor t;
    t.name = p.name;
    t.shape = p.tensor.shape();
    t.dtype = std::string(DTypeName(p.tensor.dtype()));
    t.format = "dense";
    t.stored_bytes = p.tensor.nbytes();
    const DType d = p.tensor.dtype();
    t.can_read = IsFloat(d) || d == DType::kF64 || d == DType::kI8 || d == DType::kU8 ||
                 d == DType::kI16 || d == DType::kI32;
    t.plain_index = static_cast<int>(i);
    s.tensors.push_back(std::move(t));
  }
  return s;
}

Result<Tensor> ModelSource::ReadF32(const SourceTensor& t) const {
  const std::string what = path + ": tensor '" + t.name + "'";
  if (!t.can_read) {
    return Unsupported(what + ": dtype " + t.dtype + " cannot be converted to f32");
  }
  SPARQ_RETURN_IF_ERROR(CheckDensifiable(what, t.shape));
  if (t.gguf_index >= 0) return gguf->ReadF32(gguf->tensors()[t.gguf_index]);
  if (t.matrix_index >= 0) return ToDense(ckpt->matrices[t.matrix_index].matrix);
  return ToF32(ckpt->tensors[t.plain_index].tensor);
}

std::optional<Tensor> ModelSource::PlainFloat(const SourceTensor& t) const {
  if (t.plain_index >= 0) {
    const Tensor& x = ckpt->tensors[t.plain_index].tensor;
    if (IsFloat(x.dtype())) return x;
    return std::nullopt;
  }
  if (t.gguf_index >= 0) {
    const GgufTensorInfo& info = gguf->tensors()[t.gguf_index];
    DType d;
    switch (info.type) {
      case GgmlType::kF32: d = DType::kF32; break;
      case GgmlType::kF16: d = DType::kF16; break;
      case GgmlType::kBF16: d = DType::kBF16; break;
      default: return std::nullopt;
    }
    const uint8_t* p = gguf->TensorData(info);
    Tensor view = Tensor::View(d, info.shape(), p, nullptr);
    // GgufFile keeps its mapping private; copy so the tensor does not depend on this source's
    // lifetime (and is aligned even when general.alignment is 1).
    return view.Clone();
  }
  return std::nullopt;
}

}  // namespace sparq::cli
