// Shared by the quantized-checkpoint tests (tests/io/*_quant_checkpoint_test.cc): a checkpoint
// flattened into its safetensors parts and metadata, edited, and read back for its error.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "sparq/checkpoint.h"
#include "sparq/safetensors.h"

namespace sparq::testing {

inline void ExpectSameBytesOf(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.dtype(), b.dtype()) << what;
  ASSERT_EQ(a.shape(), b.shape()) << what;
  if (a.nbytes()) {
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0) << what;
  }
}

// The stored parts of two quantized CSR or BSR matrices (row_ptr, col_idx, codes, scales, mins)
// are the same bytes.
template <typename M>
void ExpectSameQuantizedRowParts(const M& a, const M& b) {
  ExpectSameBytesOf(a.row_ptr, b.row_ptr, "row_ptr");
  ExpectSameBytesOf(a.col_idx, b.col_idx, "col_idx");
  ExpectSameBytesOf(a.values, b.values, "values");
  ExpectSameBytesOf(a.quant.scales, b.quant.scales, "scales");
  ExpectSameBytesOf(a.quant.mins, b.quant.mins, "mins");
}

// A checkpoint's parts and metadata, its "sparq" entry parsed for editing.
struct Flat {
  std::vector<NamedTensor> tensors;
  std::map<std::string, std::string> meta;
  nlohmann::json doc;
};

inline Flat Flatten(const Checkpoint& ck, const CheckpointWriteOptions& opt = {}) {
  Flat f;
  EXPECT_TRUE(FlattenCheckpoint(ck, &f.tensors, &f.meta, opt).ok());
  f.doc = nlohmann::json::parse(f.meta["sparq"]);
  return f;
}

// The message of reading f back as "c.sparq" (which must fail).
inline std::string ErrorOf(Flat f) {
  f.meta["sparq"] = f.doc.dump();
  auto bytes = SerializeSafetensors(f.tensors, f.meta);
  EXPECT_TRUE(bytes.ok());
  auto r = ReadCheckpointFromMemory(bytes->data(), bytes->size(), "c.sparq");
  EXPECT_FALSE(r.ok());
  return r.ok() ? "" : r.status().message();
}

// Replaces part `name` by edit(copy of it).
template <typename Fn>
void EditPart(Flat& f, const std::string& name, Fn edit) {
  for (auto& t : f.tensors) {
    if (t.name == name) {
      Tensor c = t.tensor.Clone();
      edit(c);
      t.tensor = c;
      return;
    }
  }
  ADD_FAILURE() << "no part " << name;
}

}  // namespace sparq::testing
