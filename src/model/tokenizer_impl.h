// Tokenizer internals shared by tokenizer.cc (encode/decode) and tokenizer_load.cc (loading).
#pragma once

#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "sparq/tokenizer.h"

namespace sparq {

struct Tokenizer::Impl {
  TokenizerData data;
  int pre = 0;  // pretok::Kind
  std::unordered_map<std::string, int32_t> token_to_id;
  std::unordered_map<std::string, int32_t> merge_rank;  // "left\0right" -> rank
  std::vector<std::pair<std::string, int32_t>> specials;  // control/user-defined, longest first
  uint32_t byte_to_cp[256] = {};
  std::unordered_map<uint32_t, uint8_t> cp_to_byte;
  int32_t byte_token[256] = {};  // token of each single byte, -1 if absent
};

// Builds the lookup tables from impl->data and validates it.
Status TokenizerImplInit(Tokenizer::Impl* impl, const std::string& what);

}  // namespace sparq
