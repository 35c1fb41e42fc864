// Status and Result<T>: how every user-reachable sparq call reports failure.
//
// A Status is either OK or carries a code and a one-line message that names the file, tensor and
// what is wrong ("model.gguf: tensor 'blk.0.attn_q.weight': data offset 123 beyond end of file").
// Nothing that came from a file, a flag or a Python call may abort the process; it returns one of
// these instead. Codes map to the CLI's exit status: kInvalidInput -> 1, everything else -> 2.
#pragma once

#include <cstdlib>
#include <string>
#include <utility>
#include <variant>

namespace sparq {

enum class StatusCode {
  kOk = 0,
  kInvalidInput,  // bad file, bad flag, wrong shape, pattern that does not fit: the user's to fix
  kIoError,       // open/read/write/rename failed
  kUnsupported,   // a valid request sparq does not implement (yet)
  kInternal,      // a bug in sparq
};

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "invalid input: <message>" style, for logs.
  std::string ToString() const;
  // Prefix the message with context, e.g. the file name: "model.gguf: <message>".
  Status WithContext(const std::string& context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidInput(std::string msg) { return {StatusCode::kInvalidInput, std::move(msg)}; }
inline Status IoError(std::string msg) { return {StatusCode::kIoError, std::move(msg)}; }
inline Status Unsupported(std::string msg) { return {StatusCode::kUnsupported, std::move(msg)}; }
inline Status Internal(std::string msg) { return {StatusCode::kInternal, std::move(msg)}; }

// Result<T>: a T or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT
    if (std::get<Status>(v_).ok()) v_ = Status(StatusCode::kInternal, "Result built from OK status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  // Precondition: ok(). Calling these on an error is a programming bug and aborts.
  T& value() & { return Get(); }
  const T& value() const& { return const_cast<Result*>(this)->Get(); }
  T&& value() && { return std::move(Get()); }
  T& operator*() & { return Get(); }
  const T& operator*() const& { return const_cast<Result*>(this)->Get(); }
  T* operator->() { return &Get(); }
  const T* operator->() const { return &const_cast<Result*>(this)->Get(); }

 private:
  T& Get() {
    if (!ok()) std::abort();
    return std::get<T>(v_);
  }
  std::variant<T, Status> v_;
};

}  // namespace sparq

#define SPARQ_CONCAT_INNER_(a, b) a##b
#define SPARQ_CONCAT_(a, b) SPARQ_CONCAT_INNER_(a, b)

// Return the Status if it is not OK.
#define SPARQ_RETURN_IF_ERROR(expr)          \
  do {                                       \
    ::sparq::Status sparq_st_ = (expr);      \
    if (!sparq_st_.ok()) return sparq_st_;   \
  } while (0)

// `SPARQ_ASSIGN_OR_RETURN(auto x, MakeX());` declares x or returns the error.
#define SPARQ_ASSIGN_OR_RETURN(lhs, expr) \
  SPARQ_ASSIGN_OR_RETURN_IMPL_(SPARQ_CONCAT_(sparq_res_, __LINE__), lhs, expr)
#define SPARQ_ASSIGN_OR_RETURN_IMPL_(res, lhs, expr) \
  auto res = (expr);                                 \
  if (!res.ok()) return res.status();                \
  lhs = std::move(res).value()

// Debug-only invariant checks for kernels (on in asan/debug presets). Never for file data.
#if defined(SPARQ_DEBUG_CHECKS)
#include <cstdio>
#define SPARQ_DCHECK(cond)                                                              \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      std::fprintf(stderr, "%s:%d: SPARQ_DCHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                     \
    }                                                                                   \
  } while (0)
#else
#define SPARQ_DCHECK(cond) \
  do {                     \
  } while (0)
#endif
