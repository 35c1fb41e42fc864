#include "src/cuda/mma_sp_pack.h"

#include <string>

namespace sparq::cuda {

const char* MmaSpShapeName(MmaSpShape s) {
  return s == MmaSpShape::kM16N8K16 ? "m16n8k16" : "m16n8k32";
}

Result<MmaSpPacked> PackMmaSp(const NmMatrix& w, MmaSpShape shape, const std::string& name) {
  const std::string what = name + " (mma.sp " + MmaSpShapeName(shape) + " packing)";
  SPARQ_RETURN_IF_ERROR(w.Validate(name));
  if (w.n != 2 || w.m != 4) {
    return InvalidInput(what + ": the sparse tensor cores take 2:4, the matrix is " +
                        std::to_string(w.n) + ":" + std::to_string(w.m));
  }
  if (w.quant.quantized()) {
    return Unsupported(what + ": quantized values (" + w.quant.spec.Name() +
                       ") are not packed for mma.sp; it takes bf16 or f16 values");
  }
  const int tile_k = MmaSpTileK(shape);
  if (w.rows % kMmaSpTileRows != 0) {
    return InvalidInput(what + ": rows " + std::to_string(w.rows) +
                        " is not a multiple of the tile's 16 rows");
  }
  if (w.cols % tile_k != 0) {
    return InvalidInput(what + ": cols " + std::to_string(w.cols) +
                        " is not a multiple of the tile's " + std::to_string(tile_k) + " columns");
  }
  const DType vt = w.values.dtype();
  if (vt != DType::kBF16 && vt != DType::kF16 && vt != DType::kF32) {
    return InvalidInput(what + ": values are " + std::string(DTypeName(vt)) +
                        "; expected bf16, f16 or f32");
  }

  MmaSpPacked p;
  p.rows = w.rows;
  p.cols = w.cols;
  p.shape = shape;
  p.dtype = vt == DType::kF16 ? DType::kF16 : DType::kBF16;
  p.tiles_m = w.rows / kMmaSpTileRows;
  p.tiles_k = w.cols / tile_k;
  const int a_regs = MmaSpARegs(shape);
  const int meta_per_group = MmaSpMetaPerGroup(shape);
  p.a.resize(static_cast<size_t>(p.tiles()) * kWarpLanes * a_regs);
  p.meta.resize(static_cast<size_t>(p.tiles()) * MmaSpMetaWords(shape));

  const int64_t vrow = w.groups() * 2;  // stored values per row
  // Kept value j of row r as 16-bit bits (f32 values rounded to bf16).
  auto bits = [&](int64_t r, int64_t j) -> uint32_t {
    const int64_t i = r * vrow + j;
    if (vt == DType::kF32) return F32ToBF16(w.values.data_as<float>()[i]);
    return w.values.data_as<uint16_t>()[i];
  };
  // The 16-bit metadata of 4 groups (16 columns) of row r from column c0: nibble j for group j.
  auto meta16 = [&](int64_t r, int64_t c0) -> uint32_t {
    uint32_t h = 0;
    for (int j = 0; j < 4; ++j) {
      const int64_t q = c0 / 4 + j;
      const uint32_t lo = static_cast<uint32_t>(w.Index(r, 2 * q));
      const uint32_t hi = static_cast<uint32_t>(w.Index(r, 2 * q + 1));
      h |= (lo | hi << 2) << (4 * j);
    }
    return h;
  };

  for (int64_t tm = 0; tm < p.tiles_m; ++tm) {
    for (int64_t tk = 0; tk < p.tiles_k; ++tk) {
      const int64_t tile = tm * p.tiles_k + tk;
      const int64_t r0 = tm * kMmaSpTileRows, c0 = tk * tile_k;
      uint32_t* a = p.a.data() + tile * kWarpLanes * a_regs;
      for (int lane = 0; lane < kWarpLanes; ++lane) {
        const int g = lane / 4, t = lane % 4;
        for (int r = 0; r < a_regs; ++r) {
          const int64_t row = r0 + g + 8 * (r & 1);
          const int64_t q = (c0 + 4 * t + 16 * (r >> 1)) / 4;  // the chunk's group in its row
          a[lane * a_regs + r] = bits(row, 2 * q) | bits(row, 2 * q + 1) << 16;
        }
      }
      uint32_t* e = p.meta.data() + tile * MmaSpMetaWords(shape);
      for (int g = 0; g < 8; ++g) {
        for (int t = 0; t < meta_per_group; ++t) {
          e[g * meta_per_group + t] =
              meta16(r0 + g, c0 + 16 * t) | meta16(r0 + g + 8, c0 + 16 * t) << 16;
        }
      }
    }
  }
  return p;
}

Result<MmaSpPacked> PackMmaSpFromDense(std::span<const float> w, int64_t rows, int64_t cols,
                                       MmaSpShape shape, DType dtype, const std::string& name) {
  if (dtype != DType::kBF16 && dtype != DType::kF16) {
    return InvalidInput(name + " (mma.sp packing): value type " + std::string(DTypeName(dtype)) +
                        "; the sparse tensor cores take bf16 or f16");
  }
  auto nm = NmMatrix::FromDense(w, rows, cols, 2, 4, dtype);
  if (!nm.ok()) return nm.status().WithContext(name + " (mma.sp packing)");
  return PackMmaSp(*nm, shape, name);
}

}  // namespace sparq::cuda
