// sparq's own packer for the A operand of the sparse tensor-core instruction
//
//   mma.sp{::ordered_metadata}.sync.aligned.m16n8k{16,32}.row.col.f32.{bf16,f16}.{bf16,f16}.f32
//
// with sparsity selector 0. W[rows, cols] (m x k in BLAS terms: rows are outputs, the 2:4 groups
// run along k) is cut into tiles of 16 rows x K columns (K = 16 or 32). For every tile the packer
// writes, for each of the 32 lanes of a warp, exactly the registers that lane passes to mma.sp, so
// a kernel loads them with one coalesced vector load per lane and no shuffles.
//
// Register contents (PTX ISA 9.7.14.6.2.1 / .2, "Matrix fragments for sparse mma.m16n8k16 /
// m16n8k32 with .f16 and .bf16"); lane = 4 * g + t (g = groupID, t = threadID_in_group):
//   A register r (r < 2 for k16, r < 4 for k32) holds the two kept values (first in the low half)
//     of the 4-column chunk of row  g + 8 * (r & 1)  that starts at column  4 * t + 16 * (r >> 1).
//   Metadata (operand e): each 4-column chunk is a nibble, the index of its first kept value in
//     bits [1:0], of its second in bits [3:2] (ascending, as ::ordered_metadata requires); 4 chunks
//     (16 columns) of one row make 16 bits. With selector 0, the lanes t < K / 16 of each group
//     supply it: lane (g, t) holds columns [16 t, 16 t + 16) of row g in bits [15:0] and of row
//     g + 8 in bits [31:16]. Other lanes' words are ignored by the hardware.
// sparq's N:M metadata (format.h) is already this nibble code with group q of a row in bits
// [4q, 4q + 4) of a little-endian stream, so a metadata half-word is two bytes of a row's meta.
//
// Storage (what a kernel indexes), tiles in row-major tile order (tile (tm, tk) is number
// tm * tiles_k + tk, so one row tile's k tiles stream contiguously):
//   a:    u32 [tiles, 32 lanes, a_regs]      (a_regs = K / 8: 2 or 4; 16 bytes a lane for k32)
//   meta: u32 [tiles, 8 groups, K / 16]      (the word of lane (g, t), t < K / 16)
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "sparq/dtype.h"
#include "sparq/format.h"
#include "sparq/status.h"

namespace sparq::cuda {

enum class MmaSpShape : uint8_t { kM16N8K16, kM16N8K32 };

inline constexpr int kMmaSpTileRows = 16;  // M of every mma.sp shape sparq uses
inline constexpr int kWarpLanes = 32;
inline constexpr int MmaSpTileK(MmaSpShape s) { return s == MmaSpShape::kM16N8K16 ? 16 : 32; }
// Two 16-bit kept values per register, half of the tile's K columns kept.
inline constexpr int MmaSpARegs(MmaSpShape s) { return MmaSpTileK(s) / 8; }
// Metadata words a group of four lanes supplies (one per 16 columns).
inline constexpr int MmaSpMetaPerGroup(MmaSpShape s) { return MmaSpTileK(s) / 16; }
inline constexpr int MmaSpMetaWords(MmaSpShape s) { return 8 * MmaSpMetaPerGroup(s); }
const char* MmaSpShapeName(MmaSpShape s);  // "m16n8k16", "m16n8k32"

struct MmaSpPacked {
  int64_t rows = 0, cols = 0;  // the logical (expanded) W
  MmaSpShape shape = MmaSpShape::kM16N8K32;
  DType dtype = DType::kBF16;  // of the 16-bit values: kBF16 or kF16
  int64_t tiles_m = 0, tiles_k = 0;
  std::vector<uint32_t> a;     // see the file comment
  std::vector<uint32_t> meta;

  int64_t tiles() const { return tiles_m * tiles_k; }
  uint64_t ByteSize() const { return (a.size() + meta.size()) * sizeof(uint32_t); }
};

// Packs a validated 2:4 NmMatrix. Values: bf16 and f16 are copied bit for bit; f32 values are
// rounded to bf16 (nearest, ties to even). Errors (naming `name`): not 2:4, quantized values,
// rows not a multiple of 16, cols not a multiple of the tile's K, and anything Validate rejects.
Result<MmaSpPacked> PackMmaSp(const NmMatrix& w, MmaSpShape shape, const std::string& name);

// The same from a dense row-major W: an error names the row and the columns of the first group
// of four that holds more than two nonzeros. `dtype` is the values' type (kBF16 or kF16).
Result<MmaSpPacked> PackMmaSpFromDense(std::span<const float> w, int64_t rows, int64_t cols,
                                       MmaSpShape shape, DType dtype, const std::string& name);

}  // namespace sparq::cuda
