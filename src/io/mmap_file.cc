#include "src/io/mmap_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace sparq::io {

namespace {
struct Mapping {
  void* addr = nullptr;
  size_t len = 0;
  ~Mapping() {
    if (addr) munmap(addr, len);
  }
};
}  // namespace

Result<ByteSource> MapFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return IoError(path + ": cannot open: " + std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    return IoError(path + ": cannot stat: " + std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return IoError(path + ": not a regular file");
  }
  ByteSource src;
  src.name = path;
  src.size = static_cast<uint64_t>(st.st_size);
  if (src.size == 0) {
    ::close(fd);
    return src;
  }
  void* addr = ::mmap(nullptr, src.size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int e = errno;
  ::close(fd);
  if (addr == MAP_FAILED) return IoError(path + ": cannot mmap: " + std::strerror(e));
  auto m = std::make_shared<Mapping>();
  m->addr = addr;
  m->len = src.size;
  src.data = static_cast<const uint8_t*>(addr);
  src.keepalive = std::move(m);
  return src;
}

ByteSource BorrowMemory(const void* data, uint64_t size, std::string name) {
  ByteSource src;
  src.name = std::move(name);
  src.data = static_cast<const uint8_t*>(data);
  src.size = size;
  return src;
}

ByteSource CopyMemory(const void* data, uint64_t size, std::string name) {
  const size_t rounded = (size + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  if (size) std::memcpy(p, data, size);
  ByteSource src;
  src.name = std::move(name);
  src.data = static_cast<const uint8_t*>(p);
  src.size = size;
  src.keepalive = std::shared_ptr<const void>(p, [](const void* q) { std::free(const_cast<void*>(q)); });
  return src;
}

}  // namespace sparq::io
