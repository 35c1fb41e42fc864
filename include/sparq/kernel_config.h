// KernelConfig: what the kernels know about the machine and every knob they have, built once (from
// the measured machine, optionally capped to an instruction set) and passed down to each weight.
// The library reads no environment variable: the CLI turns a user's flag (--max-isa) into this,
// and tests build their own (a target, a forced loop order) instead of setting process state.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sparq/status.h"

namespace sparq {

// The CPU the kernels run on, as cpuid and the OS report it.
struct CpuInfo {
  std::string vendor;    // "GenuineIntel", "AuthenticAMD", ...
  std::string model;     // brand string, e.g. "AMD EPYC 7B13"
  int family = 0;        // display family (base + extended), e.g. 0x19 for AMD Zen 3 / Zen 4
  int model_id = 0;      // display model
  int64_t l1d_bytes = 0; // per core; 0 where the OS does not say
  int64_t l2_bytes = 0;  // per core
  int64_t llc_bytes = 0; // last-level cache, whole
  bool amd_family_19h() const { return vendor == "AuthenticAMD" && family == 0x19; }
};

// How CSR / COO rows are packed: by density (kAuto: bit mask from kMaskMinDensity up), or forced.
enum class CsrLayout : uint8_t { kAuto, kColumns, kBitmask };
// Loop order of the row-group tiled kernel: by bytes moved (kAuto) or forced (the order changes
// no sum, so tests run both and compare bits).
enum class TiledOrder : uint8_t { kAuto, kTaskOuter, kTileOuter };
// Non-temporal stores of Y in the tiled kernels: by size (kAuto), always or never.
enum class StreamYMode : uint8_t { kAuto, kAlways, kNever };

struct KernelConfig {
  // The Highway target every kernel runs (one bit of HWY_TARGETS, e.g. HWY_AVX2), and its index in
  // the dispatch tables. Set through FromMachine / WithTarget, never by hand.
  int64_t target = 0;
  int dispatch_index = 0;
  CpuInfo cpu;
  // X^T tile budget of the tile-outer order: three quarters of L2 (1 MiB where L2 is unknown).
  int64_t xt_tile_bytes = int64_t{1} << 20;
  // X^T slice of one k block of the row-group tiled kernels (V:N:M, BSR, CSR, dense bf16): stays
  // in L1 beside the weights.
  int64_t xt_block_bytes = 16 * 1024;
  // The same for the N:M and bit-mask row kernels (FromMachine: two thirds of L1 rounded down to a
  // power of two; 16 KiB where L1 is unknown).
  int64_t row_xt_block_bytes = 16 * 1024;
  // Prefetch of the next k block's X^T slice where it pays (prefetch.h); false: never.
  bool xt_prefetch = true;
  CsrLayout csr_layout = CsrLayout::kAuto;
  TiledOrder tiled_order = TiledOrder::kAuto;
  StreamYMode stream_y = StreamYMode::kAuto;
  // Decode with X rounded to int8 per block of 32 columns (llama.cpp's Q8 activations) where the
  // table has such a row (2:4 int4 on AVX-512 VNNI + VBMI, groups of >= 64): about twice the
  // f32 row, at ~0.5% relative error per product on Gaussian inputs instead of f32 rounding.
  // Off: every product has the bits of the f32 product with the dequantized weights. Off in a
  // config the library makes; the command line (`--activations`, default int8) and Python's
  // sparq.load (int8_activations=True) turn it on.
  bool int8_activations = false;
  // The KV cache a model makes for generation and perplexity (LlamaModel::NewCache) holds f16
  // instead of f32: half the bytes decode attention reads per token (at 512 positions of
  // context SmolLM2's f32 cache is ~24 MB a token, a third of a 2:4 int4 model's weights), as
  // llama.cpp's default cache. Off: K and V keep f32's bits.
  bool kv_f16 = false;

  // This machine with the best target it supports, capped at max_isa when given ("AVX3_DL",
  // "AVX3" (or "AVX512"), "AVX2", "SSE4", "SSSE3", "SCALAR"); an unknown name is an error. The
  // targets are Highway's supported ones, so hwy::DisableTargets (the tests' SPARQ_MAX_ISA) caps
  // this too. There is no process-wide default: whoever packs a weight passes its config.
  static Result<KernelConfig> FromMachine(const std::string& max_isa = "");
  // The same machine on another compiled target (tests: every target the CPU supports).
  KernelConfig WithTarget(int64_t target) const;
  // Compiled targets this CPU can run, best first.
  static std::vector<int64_t> SupportedTargets();
  std::string target_name() const;  // "AVX2", "AVX3", ...
};

}  // namespace sparq
