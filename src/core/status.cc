#include "sparq/status.h"

namespace sparq {

std::string Status::ToString() const {
  switch (code_) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kInvalidInput: return "invalid input: " + message_;
    case StatusCode::kIoError: return "i/o error: " + message_;
    case StatusCode::kUnsupported: return "unsupported: " + message_;
    case StatusCode::kInternal: return "internal error: " + message_;
  }
  return message_;
}

Status Status::WithContext(const std::string& context) const {
  if (ok()) return *this;
  return Status(code_, context + ": " + message_);
}

}  // namespace sparq
