#include "sparq/atomic_write.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <random>

namespace sparq::io {

namespace {
std::string DirOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}
}  // namespace

AtomicWriter::~AtomicWriter() { Abort(); }

void AtomicWriter::Abort() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  if (!tmp_.empty()) {
    ::unlink(tmp_.c_str());
    tmp_.clear();
  }
}

Status AtomicWriter::Open(const std::string& path) {
  Abort();
  path_ = path;
  std::random_device rd;
  std::mt19937_64 rng(rd() ^ static_cast<uint64_t>(
                                  std::chrono::steady_clock::now().time_since_epoch().count()));
  for (int attempt = 0; attempt < 16; ++attempt) {
    char suffix[32];
    std::snprintf(suffix, sizeof(suffix), ".tmp.%d.%08llx", static_cast<int>(::getpid()),
                  static_cast<unsigned long long>(rng() & 0xffffffffu));
    std::string tmp = path + suffix;
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0) {
      fd_ = fd;
      tmp_ = std::move(tmp);
      return Status::Ok();
    }
    if (errno != EEXIST) {
      return IoError(path + ": cannot create temporary file " + tmp + ": " + std::strerror(errno));
    }
  }
  return IoError(path + ": cannot create a unique temporary file");
}

Status AtomicWriter::Write(const void* data, uint64_t size) {
  if (fd_ < 0) return Internal(path_ + ": write on a closed AtomicWriter");
  const auto* p = static_cast<const uint8_t*>(data);
  while (size > 0) {
    const size_t chunk = size > (uint64_t{1} << 30) ? (size_t{1} << 30) : static_cast<size_t>(size);
    const ssize_t n = ::write(fd_, p, chunk);
    if (n < 0) {
      if (errno == EINTR) continue;
      const Status st = IoError(path_ + ": write failed: " + std::strerror(errno));
      Abort();
      return st;
    }
    p += n;
    size -= static_cast<uint64_t>(n);
  }
  return Status::Ok();
}

Status AtomicWriter::Commit() {
  if (fd_ < 0) return Internal(path_ + ": commit on a closed AtomicWriter");
  if (::fsync(fd_) != 0) {
    const Status st = IoError(path_ + ": fsync failed: " + std::strerror(errno));
    Abort();
    return st;
  }
  if (::close(fd_) != 0) {
    fd_ = -1;
    const Status st = IoError(path_ + ": close failed: " + std::strerror(errno));
    Abort();
    return st;
  }
  fd_ = -1;
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const Status st = IoError(path_ + ": rename from " + tmp_ + " failed: " + std::strerror(errno));
    Abort();
    return st;
  }
  tmp_.clear();
  const std::string dir = DirOf(path_);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);  // best effort: some filesystems refuse fsync on directories
    ::close(dfd);
  }
  return Status::Ok();
}

}  // namespace sparq::io
