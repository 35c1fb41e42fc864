// Read-only bytes of a file (memory-mapped) or of a caller's buffer, with a keepalive that
// tensor views into them can hold. Internal to src/io (and the tools that open model files).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "sparq/status.h"

namespace sparq::io {

struct ByteSource {
  std::string name;                     // file path, or a label for in-memory buffers
  const uint8_t* data = nullptr;        // valid while `keepalive` (or the caller's buffer) lives
  uint64_t size = 0;
  std::shared_ptr<const void> keepalive;  // the mapping; null for borrowed memory
};

// Maps `path` read-only (MAP_PRIVATE). An empty file gives size 0 and data == nullptr.
Result<ByteSource> MapFile(const std::string& path);

// Borrows [data, data + size): the caller keeps it alive as long as any tensor view of it.
ByteSource BorrowMemory(const void* data, uint64_t size, std::string name = "<memory>");

// Owns a copy of the bytes (64-byte aligned), for tests.
ByteSource CopyMemory(const void* data, uint64_t size, std::string name = "<memory>");

}  // namespace sparq::io
