// What kind of model a path names (io room), told by content, never by the file name: the one
// place sparq sniffs a model file. Used by `sparq inspect` and `sparq convert`.
#pragma once

#include <string>

#include "sparq/status.h"

namespace sparq {

enum class ModelFileKind {
  kGguf,         // starts with the GGUF magic
  kSafetensors,  // a safetensors file without sparq metadata
  kSparq,        // a sparq checkpoint (checkpoint.h): safetensors with the "sparq" metadata key
  kHfFolder,     // a folder: the Hugging Face layout (config.json, *.safetensors, tokenizer.json)
};

// "gguf", "safetensors", "sparq", "hf-folder".
const char* ModelFileKindName(ModelFileKind k);

// A folder is kHfFolder (its contents are not checked here: LlamaModel::FromHfFolder names what
// it lacks). A file that starts with "GGUF" is kGguf (not parsed further: GgufFile::Open checks
// it). Any other file must be a safetensors file; its header is read to tell kSparq from
// kSafetensors. Errors: IoError when the path cannot be opened; the safetensors reader's
// InvalidInput (naming the file and what is wrong) for a file that is neither GGUF nor safetensors.
Result<ModelFileKind> DetectModelFile(const std::string& path);

}  // namespace sparq
