#include "io/io_testutil.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "data_testutil.h"

namespace sparq::testing {

namespace {
template <typename T>
Bytes Enc(T v) {
  Bytes b(sizeof(T));
  std::memcpy(b.data(), &v, sizeof(T));
  return b;
}
}  // namespace

Bytes EncU8(uint8_t v) { return Enc(v); }
Bytes EncU16(uint16_t v) { return Enc(v); }
Bytes EncU32(uint32_t v) { return Enc(v); }
Bytes EncU64(uint64_t v) { return Enc(v); }
Bytes EncF32(float v) { return Enc(v); }
Bytes EncF64(double v) { return Enc(v); }
Bytes EncStr(const std::string& s) {
  // Sized once and filled by copy: GCC 12 misreads insert() after an 8-byte vector as an
  // out-of-bounds memcpy (-Warray-bounds false positive).
  Bytes b(8 + s.size());
  const uint64_t n = s.size();
  std::memcpy(b.data(), &n, 8);
  std::copy(s.begin(), s.end(), b.begin() + 8);
  return b;
}
Bytes EncArray(uint32_t elem_type, uint64_t count, const Bytes& elems) {
  Bytes b = EncU32(elem_type);
  Append(b, EncU64(count));
  Append(b, elems);
  return b;
}
void Append(Bytes& dst, const Bytes& src) { dst.insert(dst.end(), src.begin(), src.end()); }

GgufBuilder& GgufBuilder::Kv(const std::string& key, uint32_t type, Bytes payload) {
  kvs.push_back({key, {type, std::move(payload)}});
  return *this;
}
GgufBuilder& GgufBuilder::Tensor(GgufTensorSpec t) {
  tensors.push_back(std::move(t));
  return *this;
}

Bytes GgufBuilder::Build() const {
  Bytes b = EncU32(0x46554747u);
  Append(b, EncU32(version));
  Append(b, EncU64(tensors.size()));
  Append(b, EncU64(kvs.size()));
  for (const auto& [key, tv] : kvs) {
    Append(b, EncStr(key));
    Append(b, EncU32(tv.first));
    Append(b, tv.second);
  }
  std::vector<uint64_t> offsets;
  uint64_t next = 0;
  for (const auto& t : tensors) {
    const uint64_t off = t.offset >= 0 ? static_cast<uint64_t>(t.offset) : next;
    offsets.push_back(off);
    next = (off + t.data.size() + alignment - 1) / alignment * alignment;
    Append(b, EncStr(t.name));
    Append(b, EncU32(static_cast<uint32_t>(t.ne.size())));
    for (int64_t d : t.ne) Append(b, EncU64(static_cast<uint64_t>(d)));
    Append(b, EncU32(t.type));
    Append(b, EncU64(off));
  }
  while (b.size() % alignment) b.push_back(0);
  const size_t data_start = b.size();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const size_t need = data_start + offsets[i] + tensors[i].data.size();
    if (b.size() < need) b.resize(need, 0);
    if (!tensors[i].data.empty()) {
      std::memcpy(b.data() + data_start + offsets[i], tensors[i].data.data(), tensors[i].data.size());
    }
  }
  return b;
}

Bytes MakeSafetensors(const std::string& header, const Bytes& data) {
  Bytes b = EncStr(header);  // u64 length, then the header's bytes
  Append(b, data);
  return b;
}

std::string TempDir() {
  // One folder per test process, removed with everything in it when the process exits.
  struct Holder {
    std::string path;
    bool owned = false;
    ~Holder() {
      std::error_code ec;
      if (owned) std::filesystem::remove_all(path, ec);
    }
  };
  static Holder dir = [] {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/sparq_io_test_XXXXXX";
    char* d = mkdtemp(tmpl.data());
    return d ? Holder{std::string(d), true} : Holder{"/tmp", false};
  }();
  return dir.path;
}

void WriteFile(const std::string& path, const Bytes& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

Bytes ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

std::string SmolLm2Path() {
  const std::string path = SmolLmModelPath();
  return FileExists(path) ? path : "";
}

int RunCommand(const std::string& cmd, std::string* out) {
  if (out) out->clear();
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) {
    if (out) out->append(buf, n);
  }
  const int status = ::pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace sparq::testing
