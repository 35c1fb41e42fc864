// Checks shared by the block and the model (src/train/block.cc): tensor sizes and kept lists
// against a LlamaConfig, with errors naming the tensor as the model files do
// ("blk.1.ffn_up.weight").
#pragma once

#include <string>

#include "sparq/model.h"
#include "sparq/status.h"
#include "sparq/train_model.h"

namespace sparq::train {

// "blk.<i>."
std::string BlockName(int block_index);
// Every tensor of w has its SlotShape / [n_embd] size; errors start with prefix + tensor name.
Status CheckBlock(const LlamaConfig& c, const BlockWeights& w, const std::string& prefix);
// Every kept index in [0, m * k) of its slot and listed once.
Status CheckMasks(const LlamaConfig& c, const BlockMasks& masks, const std::string& prefix);

}  // namespace sparq::train
