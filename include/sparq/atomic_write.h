// Atomic file output: bytes go to a temporary file in the destination's directory, which is
// fsync'ed and renamed over the destination on Commit(). A writer destroyed without Commit()
// (an error, an exception) removes its temporary file, so a crash or a failed write never leaves
// a half-written model under the destination name.
#pragma once

#include <cstdint>
#include <string>

#include "sparq/status.h"

namespace sparq::io {

class AtomicWriter {
 public:
  AtomicWriter() = default;
  ~AtomicWriter();
  AtomicWriter(const AtomicWriter&) = delete;
  AtomicWriter& operator=(const AtomicWriter&) = delete;

  // Creates the temporary file next to `path` (mode 0666 & ~umask, like a plain open()).
  Status Open(const std::string& path);
  Status Write(const void* data, uint64_t size);
  // fsync, close, rename to the destination, fsync the directory.
  Status Commit();
  const std::string& path() const { return path_; }

 private:
  void Abort();
  std::string path_, tmp_;
  int fd_ = -1;
};

}  // namespace sparq::io
