// LinearWeight: a weight matrix prepared ("packed") once at load time for fast products, and the
// one entry point every linear layer of a model runs through.
//
//   Y[n, m] = act(X[n, k] * W[m, k]^T + bias[m]) + residual[n, m]
//
// W is any SparseMatrix (format.h): dense f32 (runs through OpenBLAS), dense bf16 (sparq's own
// kernel), or N:M / V:N:M / BSR / CSR / COO with f32, bf16 or f16 values (all but COO with int8 /
// int4 ones too). FromMatrix picks the
// kernel for the stored format and packs the weight into that kernel's internal layout; packing
// cost is paid here, not per call. X and Y are dense f32, row-major with leading dimensions.
// Forward is thread-safe for concurrent calls on the same LinearWeight (it is const); results do
// not depend on the number of threads, and the same call twice gives identical bits (dense f32
// too: it runs a fixed grid of single-threaded OpenBLAS calls, src/core/blas_tiles.h).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "sparq/format.h"
#include "sparq/kernel_config.h"
#include "sparq/quant.h"
#include "sparq/status.h"
#include "sparq/thread_pool.h"

namespace sparq {

enum class Activation : uint8_t { kNone, kRelu, kGelu, kSilu };

struct Epilogue {
  const float* bias = nullptr;      // [m] or null
  Activation act = Activation::kNone;
  const float* residual = nullptr;  // [n, ld_residual] or null; added after the activation
  int64_t ld_residual = 0;          // 0 means m
};

class LinearWeight {
 public:
  LinearWeight();
  ~LinearWeight();
  LinearWeight(LinearWeight&&) noexcept;
  LinearWeight& operator=(LinearWeight&&) noexcept;

  // Validates the matrix (Validate(matrix, name)) and packs it for cfg's machine and target (every
  // product of this weight runs with cfg). The matrix is moved in.
  static Result<LinearWeight> FromMatrix(SparseMatrix matrix, const std::string& name,
                                         const KernelConfig& cfg);
  // The same with the values stored as `values` (sparq/quant.h): int8 / int4 specs quantize the
  // matrix's values round-to-nearest (every format but COO, which is an error naming the weight);
  // float specs keep the matrix's values. A CSR weight with int8 / int4 values (stored, or
  // quantized here) keeps its codes where it packs as a bit mask (>= 20% kept); sparser, it runs
  // dequantized to f32 through the CSR rows. V:N:M and BSR keep their codes in groups of 2 or 4
  // rows; V = 1 and 1-row blocks (CSR rows) run dequantized to f32.
  static Result<LinearWeight> FromMatrix(SparseMatrix matrix, const ValueSpec& values,
                                         const std::string& name, const KernelConfig& cfg);
  // A dense [rows, cols] weight stored quantized (GGUF Q8_0 = int8:g32, Q4_0 = int4:g32:sym,
  // Q4_1 = int4:g32; .sparq int8 / int4), run as stored (no requantization). codes: int8 i8
  // [rows, cols], or int4 u8 [rows, ceil(cols / 2)] with code 2i in the low nibble of byte i;
  // scales (and mins, int4 with a min; else empty) f16 bits [rows, ceil(cols / values.group)].
  // Values are Dequantize(code) of sparq/quant.h. Sizes are checked; errors name `name`.
  static Result<LinearWeight> FromDenseQuant(int64_t rows, int64_t cols, const ValueSpec& values,
                                             std::span<const uint8_t> codes,
                                             std::span<const uint16_t> scales,
                                             std::span<const uint16_t> mins,
                                             const std::string& name, const KernelConfig& cfg);

  int64_t rows() const;  // m (outputs)
  int64_t cols() const;  // k (inputs)
  // Bytes of weight data a product streams (the packed representation, incl. indices/metadata).
  uint64_t weight_bytes() const;
  // Name of the kernel Forward runs for `n` tokens, e.g. "f32_nm_window_decode_4xT" (a row of the
  // kernel table, src/cpu/dispatch.cc).
  std::string kernel_name(int64_t n) const;
  // Which kernel runs `n` tokens and why every other kernel of the weight's layout declined, one
  // "  name: reason" line each after a "chosen: name (tile, targets)" line.
  std::string explain(int64_t n) const;
  // Forward of `n` tokens rounds X to int8 (a decode row of KernelConfig::int8_activations).
  bool rounds_x(int64_t n) const;
  // How the weight is stored for compute, e.g. "dense f32", "nm 2:4 bf16", "csr f32 u16".
  const std::string& format() const;
  // The values as the kernels read them: f32, bf16, or a quantized spec (int4:g64, ...).
  ValueSpec values() const;
  // The weights [rows, cols] row-major when stored dense f32 (what pruning starts from), else null.
  const float* dense_f32() const;
  // A dense weight stored quantized (a GGUF's Q4_0 / Q4_1 / Q8_0 run as stored, a .sparq's dense
  // int8 / int4) as the checkpoint stores it (format.h DenseMatrix with QuantParts): the same
  // codes, scales and mins; nullopt for every other layout.
  std::optional<DenseMatrix> dense_quant() const;
  // Row r (< rows()) of a dense weight stored quantized, dequantized into out[0, cols()): the
  // values the kernels multiply (Dequantize of quant.h), bit for bit those of the dequantized
  // matrix. False, writing nothing, for every other layout. What a tied quantized head's
  // embedding lookup reads instead of an f32 copy of the table.
  bool DequantizeRow(int64_t r, float* out) const;
  // The configuration the weight was packed for and runs with (a default-constructed one, target
  // 0, for an empty weight, which runs nothing).
  const KernelConfig& config() const;

  // ldx >= k, ldy >= m (0 means k resp. m). pool may be null (single thread).
  void Forward(const float* x, int64_t n, int64_t ldx, float* y, int64_t ldy, const Epilogue& ep,
               ThreadPool* pool) const;
  void Forward(const float* x, int64_t n, float* y, ThreadPool* pool) const {
    Forward(x, n, 0, y, 0, Epilogue{}, pool);
  }

  // One product of ForwardShared: y [n, weight->rows()] (row-major, no padding) = ep(x W^T).
  struct Output {
    const LinearWeight* weight;
    float* y;
    Epilogue ep;
  };
  // Several weights on the same input x [n, cols] (every weight has the same cols), e.g. an
  // attention block's q/k/v or an MLP's gate/up. Where their kernels allow (the few-token decode
  // kernels of one storage kind; the many-token N:M and bit-mask kernels, which also transpose X
  // once for all), all products go out as one parallel call, so the threads wait once instead of
  // once per weight. Each output's bits equal those of its own Forward.
  static void ForwardShared(const float* x, int64_t n, std::span<const Output> outputs,
                            ThreadPool* pool);

  // A SwiGLU MLP in one call:
  //   y[n, down.rows()] = residual + (silu(x gate^T) * (x_up up^T)) down^T
  // x [n, gate.cols()]; x_up: up's input where it differs from gate's (each read through its own
  // column permutation), else null (x); residual [n, down.rows()] or null; row-major, no padding.
  // Runs fused where the three weights' kernels allow (SwiGluFuses: N:M or bit-mask weights on
  // their tiled, many-token kernels), so the [n, gate.rows()] intermediate stays in the kernels'
  // own layout; returns false, having written nothing, elsewhere: run the three products then.
  // down_row (gate.rows() entries, or null for the identity) names the column of down each
  // intermediate column feeds, i.e. the inverse of a column permutation down's input is gathered
  // with. The bits equal those of the separate products (SiLU epilogue on gate, gate * up in
  // float, residual epilogue on down).
  static bool SwiGluFuses(const LinearWeight& gate, const LinearWeight& up,
                          const LinearWeight& down, int64_t n);
  static bool ForwardSwiGlu(const LinearWeight& gate, const LinearWeight& up,
                            const LinearWeight& down, const float* x, const float* x_up, int64_t n,
                            const int32_t* down_row, const float* residual, float* y,
                            ThreadPool* pool);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sparq
