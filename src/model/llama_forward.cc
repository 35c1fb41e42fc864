// The Llama forward pass: RMSNorm, RoPE (llama.cpp's NORM type), grouped-query attention over a
// KV cache, SwiGLU MLP; linear layers through LinearWeight.
#include <cblas.h>
#include <hwy/targets.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <vector>

#include "sparq/checked.h"
#include "src/core/blas_tiles.h"
#include "src/cpu/attention.h"
#include "src/model/llama_internal.h"

namespace sparq {
namespace {

// cos / sin of pos * theta^(-2i/rope_dim) for the n positions pos0.. and i < rope_dim / 2, into
// s->rope_cos / rope_sin [n][rope_dim / 2]: computed once per forward call and reused by every
// layer (the same for q and k; per layer and row they were ~1M sincos + pow per 512-token
// prefill of SmolLM2: sincos, pow and Rope 2.2% of its CPU time, 2 threads, all on one thread).
void RopeTable(int64_t n, int64_t rope_dim, int64_t pos0, double theta, BlockScratch* s) {
  if (s->rope_n == n && s->rope_pos0 == pos0 && s->rope_dim == rope_dim && s->rope_theta == theta) {
    return;
  }
  const int64_t half = rope_dim / 2;
  s->rope_cos.resize(static_cast<size_t>(n * half));
  s->rope_sin.resize(static_cast<size_t>(n * half));
  std::vector<double> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    inv[i] = std::pow(theta, -2.0 * static_cast<double>(i) / rope_dim);
  }
  for (int64_t r = 0; r < n; ++r) {
    const double pos = static_cast<double>(pos0 + r);
    for (int64_t i = 0; i < half; ++i) {
      const double a = pos * inv[i];
      s->rope_cos[r * half + i] = static_cast<float>(std::cos(a));
      s->rope_sin[r * half + i] = static_cast<float>(std::sin(a));
    }
  }
  s->rope_n = n;
  s->rope_pos0 = pos0;
  s->rope_dim = rope_dim;
  s->rope_theta = theta;
}

// Rotates adjacent pairs (2i, 2i+1) of the first rope_dim dims of every head of x[n, heads*hd]
// by angle pos * theta^(-2i/rope_dim), pos = pos0 + row (ggml's GGML_ROPE_TYPE_NORM), with the
// angles of RopeTable.
void Rope(float* x, int64_t n, int64_t heads, int64_t hd, int64_t rope_dim, const BlockScratch& s) {
  const int64_t half = rope_dim / 2;
  for (int64_t r = 0; r < n; ++r) {
    const float* cs = s.rope_cos.data() + r * half;
    const float* sn = s.rope_sin.data() + r * half;
    float* row = x + r * heads * hd;
    for (int64_t h = 0; h < heads; ++h) {
      float* p = row + h * hd;
      for (int64_t i = 0; i < half; ++i) {
        const float x0 = p[2 * i], x1 = p[2 * i + 1];
        p[2 * i] = x0 * cs[i] - x1 * sn[i];
        p[2 * i + 1] = x0 * sn[i] + x1 * cs[i];
      }
    }
  }
}

// Causal grouped-query attention. q [n, n_head*hd], kv: the layer's cache, [n_head_kv][cap][hd]
// in f32 or f16 (each KV head's rows contiguous, T = pos0 + n of them filled), out
// [n, n_head*hd]. cfg: the target of the vectorized parts (the block's linear layers' own).
void Attention(const LlamaConfig& c, const KernelConfig& cfg, const float* q, const KvLayer& kv,
               int64_t n, int64_t pos0, float* out, BlockScratch* s, ThreadPool* pool) {
  const int64_t hd = c.head_dim(), nh = c.n_head, d = c.n_embd;
  const int64_t group = c.n_head / c.n_head_kv;
  const int64_t total = pos0 + n;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  if (n >= 4) {
    // An f16 cache's filled rows widened once per call, for OpenBLAS's f32 products.
    const float* kc = kv.k;
    const float* vc = kv.v;
    int64_t cap = kv.cap;
    if (kv.f16()) {
      const int64_t rows = c.n_head_kv * total;
      s->kv32.resize(static_cast<size_t>(2 * rows * hd + hd * cpu::kKvTile));
      float* tile = s->kv32.data() + 2 * rows * hd;  // one K tile widened, [hd][kKvTile]
      for (int64_t g = 0; g < c.n_head_kv; ++g) {
        float* kr = s->kv32.data() + g * total * hd;
        for (int64_t j0 = 0; j0 < total; j0 += cpu::kKvTile) {
          cpu::LoadF16(cfg, kv.k16 + g * kv.cap * hd + j0 * hd, hd * cpu::kKvTile, tile);
          for (int64_t j = j0; j < std::min(total, j0 + cpu::kKvTile); ++j) {
            for (int64_t e = 0; e < hd; ++e) kr[j * hd + e] = tile[e * cpu::kKvTile + j - j0];
          }
        }
        cpu::LoadF16(cfg, kv.v16 + g * kv.cap * hd, total * hd,
                     s->kv32.data() + (rows + g * total) * hd);
      }
      kc = s->kv32.data();
      vc = s->kv32.data() + rows * hd;
      cap = total;
    }
    // Batched: tasks of (head, block of query rows): S = Q K^T over the keys the block's last row
    // sees (causal: later keys would be masked anyway, so this skips half the products of a
    // prompt), softmax by row, O = P V. The tasks go to sparq's pool, each running OpenBLAS
    // single-threaded: with OpenBLAS's own threads, its idle workers spin for ~0.1 s after each
    // call, beside the pool's workers that run the linear layers around it.
    constexpr int64_t kRows = 64;
    const int64_t blocks = CeilDiv(n, kRows);
    const int64_t threads = pool != nullptr ? pool->num_threads() : 1;
    s->scores.resize(static_cast<size_t>(threads * kRows * total));  // one block per thread
    blas::OpenBlasThreads pin(1);  // restored on return, like the dense kernel's calls
    auto task = [&](int64_t t, int thread) {
      const int64_t h = t / blocks, g = h / group;
      const int64_t i0 = (t % blocks) * kRows, i1 = std::min(n, i0 + kRows);
      const int64_t keys = pos0 + i1;
      float* sc = s->scores.data() + thread * kRows * total;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, i1 - i0, keys, hd, scale,
                  q + i0 * d + h * hd, d, kc + g * cap * hd, hd, 0.0f, sc, keys);
      for (int64_t i = i0; i < i1; ++i) {
        float* row = sc + (i - i0) * keys;
        const int64_t len = pos0 + i + 1;
        cpu::SoftmaxRow(cfg, row, len);
        std::fill(row + len, row + keys, 0.0f);
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, i1 - i0, hd, keys, 1.0f, sc, keys,
                  vc + g * cap * hd, hd, 0.0f, out + i0 * d + h * hd, d);
    };
    if (pool != nullptr && pool->num_threads() > 1) {
      pool->ParallelFor(nh * blocks, task);
    } else {
      for (int64_t t = 0; t < nh * blocks; ++t) task(t, 0);
    }
    return;
  }
  // Decode: tasks of (KV head, key range). A task runs the `group` query heads that share its KV
  // head over its keys, so the KV rows come from memory once and from cache for the next heads;
  // key ranges (a count fixed by the context length, never by the thread count) balance the
  // threads, and the partials of each query head merge in range order.
  // (An f16 cache's ranges start on its K tiles.)
  const int64_t ranges = std::clamp<int64_t>(total / 128, 1, 8);
  const int64_t chunk = kv.f16() ? CeilDiv(CeilDiv(total, ranges), cpu::kKvTile) * cpu::kKvTile
                                 : CeilDiv(total, ranges);
  const int64_t tasks = c.n_head_kv * ranges;
  const auto stride = static_cast<size_t>(hd + 1);
  s->scores.resize(static_cast<size_t>(tasks * group) * static_cast<size_t>(chunk));
  s->attn_part.resize(static_cast<size_t>(tasks * group * n) * stride);
  std::vector<cpu::AttendPartial> parts(static_cast<size_t>(tasks * group * n));
  for (size_t p = 0; p < parts.size(); ++p) parts[p].out = s->attn_part.data() + p * stride;
  auto task = [&](int64_t t, int) {
    const int64_t g = t / ranges, r = t % ranges;
    const int64_t j0 = r * chunk;
    const int64_t row = (g * kv.cap + j0) * hd;
    float* sc = s->scores.data() + t * group * chunk;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t len = std::clamp<int64_t>(pos0 + i + 1 - j0, 0, chunk);
      cpu::AttendPartial* part = &parts[static_cast<size_t>((t * n + i) * group)];
      if (kv.f16()) {
        // The group's heads at once, on K tiles widened in registers: half an f32 cache's bytes.
        cpu::AttendTilesF16(cfg, q + i * d + g * group * hd, group, kv.k16 + row,
                            hd * cpu::kKvTile, kv.v16 + row, len, hd, scale, sc, chunk, part);
        continue;
      }
      for (int64_t hh = 0; hh < group; ++hh) {
        cpu::AttendRange(cfg, q + i * d + (g * group + hh) * hd, kv.k + row, kv.v + row, len, hd,
                         hd, scale, sc, part + hh);
      }
    }
  };
  if (pool != nullptr && pool->num_threads() > 1) {
    pool->ParallelFor(tasks, task);
  } else {
    for (int64_t t = 0; t < tasks; ++t) task(t, 0);
  }
  std::vector<cpu::AttendPartial> row(static_cast<size_t>(ranges));
  for (int64_t h = 0; h < nh; ++h) {
    const int64_t g = h / group, hh = h % group;
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t r = 0; r < ranges; ++r) {
        row[static_cast<size_t>(r)] = parts[static_cast<size_t>(((g * ranges + r) * n + i) * group + hh)];
      }
      cpu::MergeAttend(row.data(), ranges, hd, out + i * d + h * hd);
    }
  }
}

}  // namespace

void BlockScratch::Reserve(const LlamaConfig& c, int64_t n, int64_t total_len) {
  const auto nd = static_cast<size_t>(n * c.n_embd);
  const auto nkv = static_cast<size_t>(n * c.kv_dim());
  const auto nff = static_cast<size_t>(n * c.n_ff);
  attn_in.resize(nd);
  q.resize(nd);
  k.resize(nkv);
  v.resize(nkv);
  att.resize(nd);
  hidden.resize(nd);
  ffn_in.resize(nd);
  gate.resize(nff);
  up.resize(nff);
  act.resize(nff);
  (void)total_len;
}

namespace {

// fn(r0, r1) over rows [0, n): in 64-row tasks on the pool for a prompt, in one call otherwise.
// For the norms, the gathers and the unfused gate * up product (RmsNorm was 1.5% and RunBlock,
// with that product, 1.4% of a 512-token 2:4 prefill's CPU time, 2 threads, all on one thread).
// Each row is computed alone, so the bits do not depend on the split.
template <class Fn>
void ForRowBlocks(int64_t n, ThreadPool* pool, const Fn& fn) {
  constexpr int64_t kRows = 64;
  if (pool == nullptr || pool->num_threads() == 1 || n < 2 * kRows) {
    fn(int64_t{0}, n);
    return;
  }
  pool->ParallelFor(CeilDiv(n, kRows),
                    [&](int64_t t, int) { fn(t * kRows, std::min(n, (t + 1) * kRows)); });
}

}  // namespace

void RmsNorm(const float* x, int64_t n, int64_t d, const float* w, double eps, float* out,
             ThreadPool* pool) {
  auto rows = [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * d;
      double ss = 0.0;
      for (int64_t i = 0; i < d; ++i) ss += static_cast<double>(xr[i]) * xr[i];
      const float scale = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(d) + eps));
      float* o = out + r * d;
      for (int64_t i = 0; i < d; ++i) o[i] = (xr[i] * scale) * w[i];
    }
  };
  ForRowBlocks(n, pool, rows);
}

void HeadForward(const LlamaWeights& w, const float* xn, int64_t n, float* logits,
                 ThreadPool* pool) {
  w.output.Forward(xn, n, logits, pool);
  const auto k = static_cast<int64_t>(w.output_row_ids.size());
  if (k == 0) return;
  // The few rows apart run as their own product (K x n_embd, ~2% of the head's bytes) and
  // overwrite their logits: the main head stays one dense kernel call over every row. The
  // buffer is kept per thread: no allocation per decoded token.
  thread_local std::vector<float> part;
  part.resize(static_cast<size_t>(n * k));
  w.output_rows.Forward(xn, n, part.data(), pool);
  const int64_t vocab = w.output.rows();
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < k; ++j) logits[t * vocab + w.output_row_ids[j]] = part[t * k + j];
  }
}

void Embed(const LlamaWeights& w, int64_t n_embd, std::span<const int32_t> tokens, float* x) {
  if (w.token_embd.empty()) {
    // The tied quantized head's rows (checked at load: FromParts): 1.3 us a token (measured),
    // against the table's 113 MB (SmolLM2) of resident f32.
    const std::vector<int32_t>& ids = w.output_row_ids;
    for (size_t i = 0; i < tokens.size(); ++i) {
      const auto it = std::lower_bound(ids.begin(), ids.end(), tokens[i]);
      if (it != ids.end() && *it == tokens[i]) {
        w.output_rows.DequantizeRow(it - ids.begin(), x + i * n_embd);
      } else {
        w.output.DequantizeRow(tokens[i], x + i * n_embd);
      }
    }
    return;
  }
  const float* e = w.token_embd.data_as<float>();
  for (size_t i = 0; i < tokens.size(); ++i) {
    std::memcpy(x + i * n_embd, e + static_cast<int64_t>(tokens[i]) * n_embd,
                sizeof(float) * n_embd);
  }
}

namespace {

// x's columns gathered by `perm` into *out (layers stored permuted read their input so).
const float* Gather(const std::vector<int32_t>& perm, const float* x, int64_t n,
                    std::vector<float>* out, ThreadPool* pool) {
  const auto k = static_cast<int64_t>(perm.size());
  out->resize(static_cast<size_t>(n * k));
  auto rows = [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * k;
      float* g = out->data() + r * k;
      for (int64_t j = 0; j < k; ++j) g[j] = xr[perm[j]];
    }
  };
  ForRowBlocks(n, pool, rows);
  return out->data();
}

// y = W x for one slot, gathering x's columns first when the layer was stored permuted.
void Linear(const LlamaBlock& b, LinearSlot slot, const float* x, int64_t n, float* y,
            const Epilogue& ep, BlockScratch* s, ThreadPool* pool) {
  const int i = static_cast<int>(slot);
  const std::vector<int32_t>& perm = b.perm[i];
  b.linear[i].Forward(perm.empty() ? x : Gather(perm, x, n, &s->gathered, pool), n, 0, y, 0, ep,
                      pool);
}

// Several slots on the same input: one shared call (LinearWeight::ForwardShared) when they read
// it with the same column permutation (or none), else one call each.
struct SlotOut {
  LinearSlot slot;
  float* y;
  Epilogue ep;
};
void LinearShared(const LlamaBlock& b, std::initializer_list<SlotOut> outs, const float* x,
                  int64_t n, BlockScratch* s, ThreadPool* pool) {
  const std::vector<int32_t>& perm = b.perm[static_cast<int>(outs.begin()->slot)];
  bool same = true;
  for (const SlotOut& o : outs) same = same && b.perm[static_cast<int>(o.slot)] == perm;
  if (!same) {
    for (const SlotOut& o : outs) Linear(b, o.slot, x, n, o.y, o.ep, s, pool);
    return;
  }
  std::vector<LinearWeight::Output> shared;
  for (const SlotOut& o : outs) shared.push_back({&b.linear[static_cast<int>(o.slot)], o.y, o.ep});
  LinearWeight::ForwardShared(perm.empty() ? x : Gather(perm, x, n, &s->gathered, pool), n, shared,
                              pool);
}

// The MLP as one LinearWeight::ForwardSwiGlu call (x = hidden + down(silu(gate) * up)) when its
// weights allow; false (nothing written) otherwise. gate and up read their input through their
// own column permutations (each gathered once; up gets its own X^T when they differ); down's is
// applied by writing each intermediate column where down's gather would have read it from.
// BlockScratch::fuse_mlp = false turns the fusion off (A/B timing; the bits are the same).
bool FusedMlp(const LlamaBlock& b, int64_t n, float* x, BlockScratch* s, ThreadPool* pool) {
  if (!s->fuse_mlp) return false;
  const LinearWeight& gate = b.linear[static_cast<int>(LinearSlot::kGate)];
  const LinearWeight& up = b.linear[static_cast<int>(LinearSlot::kUp)];
  const LinearWeight& down = b.linear[static_cast<int>(LinearSlot::kDown)];
  if (!LinearWeight::SwiGluFuses(gate, up, down, n)) return false;
  const std::vector<int32_t>& gate_perm = b.perm[static_cast<int>(LinearSlot::kGate)];
  const std::vector<int32_t>& up_perm = b.perm[static_cast<int>(LinearSlot::kUp)];
  const std::vector<int32_t>& down_perm = b.perm[static_cast<int>(LinearSlot::kDown)];
  const int32_t* down_row = nullptr;
  if (!down_perm.empty()) {  // down's input column j is intermediate column down_perm[j]
    s->down_row.resize(down_perm.size());
    for (size_t j = 0; j < down_perm.size(); ++j) {
      s->down_row[static_cast<size_t>(down_perm[j])] = static_cast<int32_t>(j);
    }
    down_row = s->down_row.data();
  }
  const float* ffn_in = s->ffn_in.data();
  const float* in = gate_perm.empty() ? ffn_in : Gather(gate_perm, ffn_in, n, &s->gathered, pool);
  const float* in_up = in;
  if (up_perm != gate_perm) {
    in_up = up_perm.empty() ? ffn_in : Gather(up_perm, ffn_in, n, &s->gathered_up, pool);
  }
  return LinearWeight::ForwardSwiGlu(gate, up, down, in, in_up, n, down_row, s->hidden.data(), x,
                                     pool);
}

// The attention of one sequence's n rows at positions pos0 .. pos0+n-1: RoPE on q / k [n, ...],
// their K/V rows into the layer's cache kv (f32, or rounded to f16), and attention into att
// [n, n_embd]. RunBlock calls it once for its n rows, RunBlockBatch once per sequence with n = 1.
void SequenceAttention(const LlamaConfig& c, const LlamaBlock& b, float* q, float* k,
                       const float* v, int64_t n, int64_t pos0, const KvLayer& kv, float* att,
                       BlockScratch* s, ThreadPool* pool) {
  const int64_t kvd = c.kv_dim(), hd = c.head_dim();
  // Attention runs on the target of the block's layers (their KernelConfig: --max-isa caps both).
  const KernelConfig& cfg = b.linear[static_cast<int>(LinearSlot::kQ)].config();
  RopeTable(n, c.rope_dim, pos0, c.rope_theta, s);
  Rope(q, n, c.n_head, hd, c.rope_dim, *s);
  Rope(k, n, c.n_head_kv, hd, c.rope_dim, *s);
  for (int64_t g = 0; g < c.n_head_kv; ++g) {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t pos = pos0 + i, row = (g * kv.cap + pos) * hd;
      if (kv.f16()) {
        // K into lane pos % kKvTile of its tile, [hd][kKvTile] (cpu::AttendTilesF16).
        uint16_t kh[512];
        for (int64_t e0 = 0; e0 < hd; e0 += 512) {
          const int64_t m = std::min<int64_t>(512, hd - e0);
          cpu::StoreF16(cfg, k + i * kvd + g * hd + e0, m, kh);
          uint16_t* tile = kv.k16 + (g * kv.cap + pos / cpu::kKvTile * cpu::kKvTile) * hd;
          for (int64_t e = 0; e < m; ++e) tile[(e0 + e) * cpu::kKvTile + pos % cpu::kKvTile] = kh[e];
        }
        cpu::StoreF16(cfg, v + i * kvd + g * hd, hd, kv.v16 + row);
      } else {
        std::memcpy(kv.k + row, k + i * kvd + g * hd, sizeof(float) * hd);
        std::memcpy(kv.v + row, v + i * kvd + g * hd, sizeof(float) * hd);
      }
    }
  }
  Attention(c, cfg, q, kv, n, pos0, att, s, pool);
}

// One block over x [n, n_embd] in place: the linear layers, norms and MLP over all n rows at once;
// `attend(s)` turns s->q / k / v into s->att (RoPE, cache writes, attention), for however many
// sequences the rows belong to.
template <class AttendFn>
void RunBlockRows(const LlamaConfig& c, const LlamaBlock& b, float* x, int64_t n, BlockScratch* s,
                  ThreadPool* pool, const AttendFn& attend) {
  const int64_t d = c.n_embd;
  s->Reserve(c, n, n);
  const Epilogue none;
  RmsNorm(x, n, d, b.attn_norm.data(), c.rms_eps, s->attn_in.data(), pool);
  LinearShared(b, {{LinearSlot::kQ, s->q.data(), none}, {LinearSlot::kK, s->k.data(), none},
                   {LinearSlot::kV, s->v.data(), none}},
               s->attn_in.data(), n, s, pool);
  attend(s);
  // hidden = x + Wo att
  Epilogue res;
  res.residual = x;
  Linear(b, LinearSlot::kO, s->att.data(), n, s->hidden.data(), res, s, pool);
  RmsNorm(s->hidden.data(), n, d, b.ffn_norm.data(), c.rms_eps, s->ffn_in.data(), pool);
  // x = hidden + Wdown (silu(Wgate ffn_in) * Wup ffn_in): fused where the kernels allow.
  if (!s->keep_inputs && FusedMlp(b, n, x, s, pool)) return;
  Epilogue silu;
  silu.act = Activation::kSilu;
  LinearShared(b, {{LinearSlot::kGate, s->gate.data(), silu}, {LinearSlot::kUp, s->up.data(), none}},
               s->ffn_in.data(), n, s, pool);
  const int64_t nff = c.n_ff;
  auto product = [&](int64_t t0, int64_t t1) {
    for (int64_t i = t0 * nff; i < t1 * nff; ++i) s->act[i] = s->gate[i] * s->up[i];
  };
  ForRowBlocks(n, pool, product);
  Epilogue res2;
  res2.residual = s->hidden.data();
  Linear(b, LinearSlot::kDown, s->act.data(), n, x, res2, s, pool);
}

}  // namespace

KvLayer CacheLayer(KvCache* cache, int64_t layer) {
  KvLayer kv;
  kv.k = cache->k(layer);
  kv.v = cache->v(layer);
  kv.k16 = cache->k16(layer);
  kv.v16 = cache->v16(layer);
  kv.cap = cache->rows();
  return kv;
}

void RunBlock(const LlamaConfig& c, const LlamaBlock& b, float* x, int64_t n, int64_t pos0,
              const KvLayer& kv, BlockScratch* s, ThreadPool* pool) {
  RunBlockRows(c, b, x, n, s, pool, [&](BlockScratch* sc) {
    SequenceAttention(c, b, sc->q.data(), sc->k.data(), sc->v.data(), n, pos0, kv,
                      sc->att.data(), sc, pool);
  });
}

void RunBlock(const LlamaConfig& c, const LlamaBlock& b, float* x, int64_t n, int64_t pos0,
              float* kc, float* vc, int64_t cap, BlockScratch* s, ThreadPool* pool) {
  KvLayer kv;
  kv.k = kc;
  kv.v = vc;
  kv.cap = cap;
  RunBlock(c, b, x, n, pos0, kv, s, pool);
}

void RunBlockBatch(const LlamaConfig& c, const LlamaBlock& b, float* x,
                   std::span<const int64_t> pos, std::span<const KvLayer> kv, BlockScratch* s,
                   ThreadPool* pool) {
  const auto n = static_cast<int64_t>(pos.size());
  const int64_t d = c.n_embd, kvd = c.kv_dim();
  RunBlockRows(c, b, x, n, s, pool, [&](BlockScratch* sc) {
    for (int64_t r = 0; r < n; ++r) {
      SequenceAttention(c, b, sc->q.data() + r * d, sc->k.data() + r * kvd,
                        sc->v.data() + r * kvd, 1, pos[r], kv[r], sc->att.data() + r * d, sc,
                        pool);
    }
  });
}

void LlamaModel::set_fuse_mlp(bool on) { impl_->fuse_mlp = on; }
bool LlamaModel::fuse_mlp() const { return impl_->fuse_mlp; }

Status LlamaModel::Forward(std::span<const int32_t> tokens, KvCache* cache, float* logits,
                           bool all_logits, ThreadPool* pool) const {
  const LlamaConfig& c = impl_->config;
  const LlamaWeights& w = impl_->weights;
  const auto n = static_cast<int64_t>(tokens.size());
  if (n == 0) return InvalidInput("forward: no tokens");
  for (int64_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= c.n_vocab) {
      return InvalidInput("forward: token " + std::to_string(i) + " has id " +
                          std::to_string(tokens[i]) + " outside the vocabulary [0, " +
                          std::to_string(c.n_vocab) + ")");
    }
  }
  const int64_t pos0 = cache->length();
  if (pos0 + n > cache->capacity()) {
    return InvalidInput("forward: " + std::to_string(pos0 + n) +
                        " positions exceed the KV cache capacity " +
                        std::to_string(cache->capacity()));
  }
  const int64_t d = c.n_embd;
  std::vector<float> x(static_cast<size_t>(n * d));
  Embed(w, d, tokens, x.data());
  BlockScratch s;
  s.fuse_mlp = impl_->fuse_mlp;
  for (int64_t l = 0; l < c.n_layer; ++l) {
    RunBlock(c, w.blocks[l], x.data(), n, pos0, CacheLayer(cache, l), &s, pool);
  }
  cache->set_length(pos0 + n);
  if (logits == nullptr) return Status::Ok();
  const int64_t first = all_logits ? 0 : n - 1;
  const int64_t rows = n - first;
  std::vector<float> xn(static_cast<size_t>(rows * d));
  RmsNorm(x.data() + first * d, rows, d, w.output_norm.data(), c.rms_eps, xn.data(), pool);
  HeadForward(w, xn.data(), rows, logits, pool);
  return Status::Ok();
}

Status LlamaModel::ForwardBatch(std::span<const int32_t> tokens, std::span<KvCache* const> caches,
                                float* logits, ThreadPool* pool) const {
  const LlamaConfig& c = impl_->config;
  const LlamaWeights& w = impl_->weights;
  const auto n = static_cast<int64_t>(tokens.size());
  if (n == 0) return InvalidInput("forward batch: no tokens");
  if (caches.size() != tokens.size()) {
    return InvalidInput("forward batch: " + std::to_string(n) + " tokens but " +
                        std::to_string(caches.size()) + " KV caches (one per sequence)");
  }
  for (int64_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= c.n_vocab) {
      return InvalidInput("forward batch: token " + std::to_string(i) + " has id " +
                          std::to_string(tokens[i]) + " outside the vocabulary [0, " +
                          std::to_string(c.n_vocab) + ")");
    }
    const KvCache* kv = caches[i];
    if (kv == nullptr) return InvalidInput("forward batch: KV cache " + std::to_string(i) + " is null");
    for (int64_t j = 0; j < i; ++j) {
      if (caches[j] == kv) {
        return InvalidInput("forward batch: sequences " + std::to_string(j) + " and " +
                            std::to_string(i) + " share one KV cache");
      }
    }
    if (kv->length() + 1 > kv->capacity()) {
      return InvalidInput("forward batch: sequence " + std::to_string(i) + " is full: " +
                          std::to_string(kv->length() + 1) +
                          " positions exceed its KV cache capacity " +
                          std::to_string(kv->capacity()));
    }
  }
  const int64_t d = c.n_embd;
  std::vector<float> x(static_cast<size_t>(n * d));
  Embed(w, d, tokens, x.data());
  std::vector<int64_t> pos(static_cast<size_t>(n));
  std::vector<KvLayer> kv(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) pos[i] = caches[i]->length();
  BlockScratch s;
  s.fuse_mlp = impl_->fuse_mlp;
  for (int64_t l = 0; l < c.n_layer; ++l) {
    for (int64_t i = 0; i < n; ++i) kv[i] = CacheLayer(caches[i], l);
    RunBlockBatch(c, w.blocks[l], x.data(), pos, kv, &s, pool);
  }
  for (int64_t i = 0; i < n; ++i) caches[i]->set_length(pos[i] + 1);
  if (logits == nullptr) return Status::Ok();
  std::vector<float> xn(static_cast<size_t>(n * d));
  RmsNorm(x.data(), n, d, w.output_norm.data(), c.rms_eps, xn.data(), pool);
  HeadForward(w, xn.data(), n, logits, pool);
  return Status::Ok();
}

Result<KvCache> KvCache::Create(const LlamaConfig& c, int64_t capacity, DType dtype) {
  if (dtype != DType::kF32 && dtype != DType::kF16) {
    return InvalidInput("KV cache: values f32 or f16, not " + std::string(DTypeName(dtype)));
  }
  if (capacity <= 0 || capacity > (int64_t{1} << 20)) {
    return InvalidInput("KV cache capacity " + std::to_string(capacity) + " out of range");
  }
  const int64_t per_layer = capacity * c.kv_dim();
  if (per_layer * c.n_layer > (int64_t{1} << 32)) {
    return InvalidInput("KV cache of " + std::to_string(capacity) + " positions is too large");
  }
  KvCache kv;
  kv.capacity_ = capacity;
  kv.dtype_ = dtype;
  // An f16 cache's rows per KV head: whole K tiles (cpu::kKvTile positions each).
  kv.rows_ = dtype == DType::kF16 ? CeilDiv(capacity, cpu::kKvTile) * cpu::kKvTile : capacity;
  kv.layer_stride_ = kv.rows_ * c.kv_dim();
  const auto size = static_cast<size_t>(kv.layer_stride_ * c.n_layer);
  if (dtype == DType::kF16) {
    kv.k16_.assign(size, 0);
    kv.v16_.assign(size, 0);
  } else {
    kv.k_.assign(size, 0.0f);
    kv.v_.assign(size, 0.0f);
  }
  return kv;
}

Result<KvCache> LlamaModel::NewCache(int64_t capacity) const {
  const LlamaWeights& w = weights();
  const bool f16 = !w.blocks.empty() && w.blocks[0].at(LinearSlot::kQ).config().kv_f16;
  return KvCache::Create(config(), capacity, f16 ? DType::kF16 : DType::kF32);
}

std::string LlamaModel::attention_target() const {
  const LlamaWeights& w = weights();
  if (w.blocks.empty()) return "";
  return hwy::TargetName(cpu::AttentionTarget(w.blocks[0].at(LinearSlot::kQ).config()));
}

}  // namespace sparq
