#include "tools/json_output.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "sparq/atomic_write.h"

namespace sparq::cli {

void JsonOutput::Register(CLI::App& sub, const std::string& what) {
  opt_ = sub.add_option("--json", path_,
                        "Print " + what + " as JSON on stdout (nothing else there), or with FILE "
                        "write it to FILE")
             ->expected(0, 1)
             ->type_name("[FILE]");
}

Status JsonOutput::Write(const std::string& doc) const {
  if (!requested()) return Status::Ok();
  const std::string text = doc + "\n";
  if (to_stdout()) {
    std::fflush(stdout);
    size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = ::write(stdout_fd_, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return IoError(std::string("--json: writing stdout: ") + std::strerror(errno));
      done += static_cast<size_t>(n);
    }
    return Status::Ok();
  }
  io::AtomicWriter w;
  Status st = w.Open(path_);
  if (st.ok()) st = w.Write(text.data(), text.size());
  if (st.ok()) st = w.Commit();
  return st.ok() ? st : st.WithContext("--json");
}

StdoutToStderr::StdoutToStderr(JsonOutput* json) {
  if (!json->to_stdout()) return;
  std::fflush(stdout);
  saved_ = ::dup(1);
  if (saved_ < 0 || ::dup2(2, 1) < 0) {  // cannot redirect: the table stays on stdout
    if (saved_ >= 0) ::close(saved_);
    saved_ = -1;
    return;
  }
  json_ = json;
  json_->stdout_fd_ = saved_;
}

StdoutToStderr::~StdoutToStderr() {
  if (saved_ < 0) return;
  std::fflush(stdout);
  ::dup2(saved_, 1);
  ::close(saved_);
  json_->stdout_fd_ = 1;
}

}  // namespace sparq::cli
