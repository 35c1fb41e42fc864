// Hand-built GGUF and safetensors bytes for the io tests (and the fuzz seed generator's checks).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace sparq::testing {

using Bytes = std::vector<uint8_t>;

// Little-endian encoders for GGUF payloads.
Bytes EncU8(uint8_t v);
Bytes EncU16(uint16_t v);
Bytes EncU32(uint32_t v);
Bytes EncU64(uint64_t v);
Bytes EncF32(float v);
Bytes EncF64(double v);
Bytes EncStr(const std::string& s);  // u64 length + bytes
// Array value payload: element type, count, then the concatenated element payloads.
Bytes EncArray(uint32_t elem_type, uint64_t count, const Bytes& elems);
void Append(Bytes& dst, const Bytes& src);

struct GgufTensorSpec {
  std::string name;
  std::vector<int64_t> ne;
  uint32_t type = 0;
  Bytes data;
  int64_t offset = -1;  // -1: next aligned position after the previous tensor
};

// Builds a GGUF file: header, metadata (in insertion order), tensor infos, padding, data.
struct GgufBuilder {
  uint32_t version = 3;
  uint64_t alignment = 32;  // layout only; add a general.alignment entry to declare another one
  std::vector<std::pair<std::string, std::pair<uint32_t, Bytes>>> kvs;
  std::vector<GgufTensorSpec> tensors;

  GgufBuilder& Kv(const std::string& key, uint32_t type, Bytes payload);
  GgufBuilder& Tensor(GgufTensorSpec t);
  Bytes Build() const;
};

// safetensors file from a raw header string and data bytes (no validation).
Bytes MakeSafetensors(const std::string& header, const Bytes& data);

// A writable temporary directory for this test process (created on first use).
std::string TempDir();
void WriteFile(const std::string& path, const Bytes& bytes);
Bytes ReadFile(const std::string& path);

// SmolLmModelPath() (data_testutil.h) if the file exists, else ""; a test that needs it starts
// with SPARQ_REQUIRE_MODEL().
std::string SmolLm2Path();

// Runs `cmd` through the shell; returns the exit status and replaces *out with its stdout.
int RunCommand(const std::string& cmd, std::string* out);

}  // namespace sparq::testing
