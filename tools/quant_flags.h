// The quantization flags `prune` and `quantize` share: --embedding-values and --quant-method.
#pragma once

#include <string>

#include "sparq/model.h"

namespace sparq::cli {

inline Status ApplyQuantFlags(const std::string& embedding_values, const std::string& quant_method,
                              ModelPruneOptions* opt) {
  if (!embedding_values.empty()) {
    auto ev = ValueSpec::Parse(embedding_values);
    if (!ev.ok()) return ev.status().WithContext("--embedding-values");
    opt->embedding_values = *ev;
  }
  if (quant_method == "gptq") {
    opt->quant_method = ModelPruneOptions::QuantMethod::kGptq;
  } else if (quant_method == "rtn") {
    opt->quant_method = ModelPruneOptions::QuantMethod::kRtn;
  } else {
    return InvalidInput("--quant-method must be gptq or rtn, not '" + quant_method + "'");
  }
  return Status::Ok();
}

// --act-order / --no-act-order: on where it applies unless turned off (ActOrderApplies);
// --act-order insists, so that the library names what excludes it.
inline Status ApplyActOrderFlags(bool act_order, bool no_act_order, ModelPruneOptions* opt) {
  if (act_order && no_act_order) {
    return InvalidInput("--act-order and --no-act-order exclude each other");
  }
  opt->act_order = act_order || (!no_act_order && ActOrderApplies(*opt));
  return Status::Ok();
}

}  // namespace sparq::cli
