// Shared by the binding files of sparq._sparq: Status -> Python exceptions, the KernelConfig per
// ISA cap, and the binders each file defines.
#pragma once

#include <nanobind/nanobind.h>

#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

#include "sparq/kernel_config.h"
#include "sparq/status.h"

namespace sparq::python {

namespace nb = nanobind;

// ValueError (invalid input / unsupported), OSError (I/O) or RuntimeError (internal), carrying the
// library's message: the one the command line prints.
[[noreturn]] inline void Raise(const Status& st) {
  switch (st.code()) {
    case StatusCode::kIoError:
      PyErr_SetString(PyExc_OSError, st.message().c_str());
      throw nb::python_error();
    case StatusCode::kInternal:
      throw std::runtime_error(st.message());
    default:  // invalid input, unsupported: the caller's to fix
      throw nb::value_error(st.message().c_str());
  }
}
inline void Check(const Status& st) {
  if (!st.ok()) Raise(st);
}
template <typename T>
T Take(Result<T> r) {
  if (!r.ok()) Raise(r.status());
  return std::move(r).value();
}

// The machine's configuration for each ISA cap asked for ("" = the best target), built once per
// process and cap (the library has no global default: whoever packs a weight passes one).
// Called with the GIL held, which guards the map.
inline const KernelConfig& Config(const std::string& max_isa) {
  static std::map<std::string, std::unique_ptr<KernelConfig>> configs;
  auto& cfg = configs[max_isa];
  if (!cfg) {
    Result<KernelConfig> r = KernelConfig::FromMachine(max_isa);
    if (!r.ok()) {
      configs.erase(max_isa);
      Raise(r.status());
    }
    cfg = std::make_unique<KernelConfig>(std::move(r).value());
  }
  return *cfg;
}

// python/model_bindings.cc: sparq.Model and prune_model.
void BindModel(nb::module_& mod);

}  // namespace sparq::python
