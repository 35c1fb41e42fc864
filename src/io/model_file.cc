#include "sparq/model_file.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "sparq/checkpoint.h"
#include "sparq/safetensors.h"

namespace sparq {

const char* ModelFileKindName(ModelFileKind k) {
  switch (k) {
    case ModelFileKind::kGguf: return "gguf";
    case ModelFileKind::kSafetensors: return "safetensors";
    case ModelFileKind::kSparq: return "sparq";
    case ModelFileKind::kHfFolder: return "hf-folder";
  }
  return "?";
}

Result<ModelFileKind> DetectModelFile(const std::string& path) {
  struct stat info;
  if (::stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode)) return ModelFileKind::kHfFolder;
  char magic[4] = {0, 0, 0, 0};
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return IoError(path + ": cannot open: " + std::strerror(errno));
  const size_t got = std::fread(magic, 1, sizeof(magic), f);
  std::fclose(f);
  if (got == sizeof(magic) && std::memcmp(magic, "GGUF", 4) == 0) return ModelFileKind::kGguf;
  SPARQ_ASSIGN_OR_RETURN(SafetensorsFile st, SafetensorsFile::Open(path));
  return IsSparqCheckpoint(st) ? ModelFileKind::kSparq : ModelFileKind::kSafetensors;
}

}  // namespace sparq
