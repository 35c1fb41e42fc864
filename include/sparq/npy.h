// NumPy .npy files: the exchange format of `sparq prune-layer` (any framework can write them).
//
// Supported: format versions 1.0, 2.0 and 3.0 (the header dict is the same), dtypes '<f4' (f32) and
// '<f8' (f64), C order, any rank (0-d included). Everything else is rejected with a message that
// names the file and what is wrong: bad magic, unknown version, Fortran order, another dtype or a
// big-endian one, a malformed header, negative or overflowing dimensions, data shorter or longer
// than the shape says. Nothing is allocated before the shape has been checked against the file
// size, so a lying header cannot cause a huge allocation.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sparq/status.h"
#include "sparq/tensor.h"

namespace sparq {

// Reads a .npy file into an owned tensor of dtype kF32 or kF64 with the file's shape.
Result<Tensor> ReadNpy(const std::string& path);
// Reads a .npy file and converts f64 to f32 (values outside the f32 range become +-Inf and are
// reported as an error naming the first such position).
Result<Tensor> ReadNpyF32(const std::string& path);
// Reads and converts to double (f32 widens exactly).
Result<std::vector<double>> ReadNpyF64(const std::string& path, std::vector<int64_t>* shape);

// Writes an f32 or f64 tensor as a version 1.0 .npy (version 2.0 if the header needs it), C order,
// little-endian. Atomic: written to "<path>.tmp.<pid>" in the same folder, then renamed.
Status WriteNpy(const std::string& path, const Tensor& t);
Status WriteNpy(const std::string& path, const float* data, const std::vector<int64_t>& shape);
Status WriteNpy(const std::string& path, const double* data, const std::vector<int64_t>& shape);
Status WriteNpy(const std::string& path, const int32_t* data, const std::vector<int64_t>& shape);

// Parses an in-memory .npy image (what ReadNpy does after reading the file); `name` is used in
// messages. For tests and fuzzing.
Result<Tensor> ParseNpy(const uint8_t* bytes, size_t size, const std::string& name);

}  // namespace sparq
