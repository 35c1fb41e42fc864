// .sparq checkpoints of Llama models: configuration and tokenizer in the metadata, linear layers
// in any sparse format, everything else dense.
#include "src/model/llama_internal.h"

namespace sparq {

Result<LlamaModel> LlamaModel::FromSparq(const std::string& path) {
  return Unsupported(path + ": loading .sparq models is not implemented yet");
}

}  // namespace sparq
