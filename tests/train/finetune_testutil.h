// Tiny .sparq model files for the finetune tests (library and command line): the tiny Llama of
// tiny_model_testutil.h written as a checkpoint whose slots are stored in chosen formats and value
// types, with the one-letter tokenizer ('a'..'k'), and a learnable letter text.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "sparq/checkpoint.h"
#include "sparq/format.h"
#include "sparq/model.h"
#include "sparq/pattern.h"
#include "sparq/quant.h"
#include "sparq/tokenizer.h"
#include "tests/train/tiny_model_testutil.h"

namespace sparq::train::testing {

// How each slot of a tiny student is stored.
// The quantized kinds (int8:g32, int4:g32:sym, int4:g32 with a min) store one kept weight as a
// code that means exactly 0 (N:M, V:N:M, BSR and CSR: row 1's first stored value; row 0 of ffn_up
// feeds a pruned column of a CSR ffn_down, so its gradient is 0), to check that it trains.
enum class TinyStore {
  kDenseF32,
  kNm24F32,
  kNm24Bf16,
  kCsrF32,
  kNm24PermF32,
  kNm24Int8,
  kNm24Int4Sym,
  kNm24PermInt4Sym,
  kCsrInt8,
  kDenseInt4,
  kVnm24Int8,  // V:N:M 2:2:4 (rows in pairs share each group's kept columns), int8:g32
  kBsrInt8     // BSR 2 x 4 blocks, one of each pair of block columns kept, int8:g32
};

// The value spec of a quantized kind, else "".
inline const char* TinyQuantSpec(TinyStore st) {
  switch (st) {
    case TinyStore::kNm24Int8:
    case TinyStore::kCsrInt8:
    case TinyStore::kVnm24Int8:
    case TinyStore::kBsrInt8:
      return "int8:g32";
    case TinyStore::kNm24Int4Sym:
    case TinyStore::kNm24PermInt4Sym:
      return "int4:g32:sym";
    case TinyStore::kDenseInt4:
      return "int4:g32";
    default:
      return "";
  }
}

// The slot storages of the mixed student: every kind at least once over 2 blocks x 7 slots.
inline TinyStore MixedStore(int64_t l, int s) {
  static constexpr TinyStore kKinds[] = {TinyStore::kNm24F32, TinyStore::kNm24Bf16,
                                         TinyStore::kCsrF32, TinyStore::kNm24PermF32,
                                         TinyStore::kDenseF32};
  return kKinds[(l * kNumSlots + s) % 5];
}

inline Tensor F32Tensor(const std::vector<float>& v, std::vector<int64_t> shape) {
  Tensor t = Tensor::Alloc(DType::kF32, std::move(shape));
  std::memcpy(t.mutable_data(), v.data(), v.size() * sizeof(float));
  return t;
}

// Writes the tiny model with weights from `seed` (pruned where the storage says so) to path;
// store(l, s) picks each slot's storage. n_vocab: the config's (the tokenizer follows it);
// n_layer: the config's (a teacher of another depth).
// embd_values: "" stores token_embd as a plain f32 tensor, a quantized spec as a dense quantized
// matrix of that spec.
inline void WriteTinySparq(const std::string& path, uint64_t seed, TinyStore (*store)(int64_t, int),
                           int64_t n_vocab = 11, int64_t n_layer = 2,
                           const std::string& embd_values = "") {
  LlamaConfig c = TinyConfig();
  c.n_vocab = n_vocab;
  c.n_layer = n_layer;
  std::mt19937_64 gen(seed);
  ModelWeights w = TinyWeights(c, &gen);
  Checkpoint ck;
  if (embd_values.empty()) {
    ck.tensors.push_back({"token_embd.weight", F32Tensor(w.token_embd, {c.n_vocab, c.n_embd})});
  } else {
    auto e = DenseMatrix::FromDense(w.token_embd, c.n_vocab, c.n_embd);
    ASSERT_TRUE(e.ok());
    auto q = DenseMatrix::Quantize(*e, ValueSpec::Parse(embd_values).value());
    ASSERT_TRUE(q.ok()) << q.status().ToString();
    ck.matrices.push_back({"token_embd.weight", std::move(*q), Pattern::Dense()});
  }
  ck.tensors.push_back({"output_norm.weight", F32Tensor(w.output_norm, {c.n_embd})});
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const std::string blk = "blk." + std::to_string(l) + ".";
    BlockWeights& b = w.blocks[l];
    ck.tensors.push_back({blk + "attn_norm.weight", F32Tensor(b.attn_norm, {c.n_embd})});
    ck.tensors.push_back({blk + "ffn_norm.weight", F32Tensor(b.ffn_norm, {c.n_embd})});
    for (int s = 0; s < kNumSlots; ++s) {
      const auto [m, k] = SlotShape(c, static_cast<LinearSlot>(s));
      const std::string name = blk + std::string(SlotName(static_cast<LinearSlot>(s))) + ".weight";
      std::vector<float>& wv = b.linear[s];
      const TinyStore st = store(l, s);
      FormatKind fmt = FormatKind::kNM;
      Pattern pat = Pattern::Parse("2:4").value();
      DType dt = DType::kF32;
      const std::string spec = TinyQuantSpec(st);
      if (st == TinyStore::kDenseF32 || st == TinyStore::kDenseInt4) {
        fmt = FormatKind::kDense;
        pat = Pattern::Dense();
        wv[1] = 0.0f;  // an exact 0 of a dense slot trains (dequantized GGUF weights have them)
      } else if (st == TinyStore::kVnm24Int8) {
        fmt = FormatKind::kVNM;
        pat = Pattern::VNM(2, 2, 4);
        // Each pair of rows keeps the two columns of each group of 4 with the largest summed |w|.
        const int64_t kc = k;  // (a lambda may not name a structured binding before C++20's fix)
        for (int64_t r = 0; r < m; r += 2) {
          const int64_t r1 = std::min(m - 1, r + 1);
          for (int64_t g = 0; g < k; g += 4) {
            int64_t idx[4] = {0, 1, 2, 3};
            auto mag = [&](int64_t j) {
              return std::abs(wv[r * kc + g + j]) +
                     (r1 != r ? std::abs(wv[r1 * kc + g + j]) : 0.0f);
            };
            std::sort(idx, idx + 4, [&](int64_t a, int64_t b) { return mag(a) > mag(b); });
            for (int64_t j : {idx[2], idx[3]}) {
              wv[r * k + g + j] = 0.0f;
              wv[r1 * k + g + j] = 0.0f;
            }
          }
        }
      } else if (st == TinyStore::kBsrInt8) {
        fmt = FormatKind::kBsr;
        pat = Pattern::Block(2, 4, 0.5);
        // Of each pair of 2 x 4 blocks side by side, the one with the larger summed |w| is kept.
        const int64_t kc = k;
        auto mag = [&](int64_t r, int64_t c0) {
          float a = 0.0f;
          for (int64_t i = r; i < r + 2; ++i) {
            for (int64_t j = c0; j < c0 + 4; ++j) a += std::abs(wv[i * kc + j]);
          }
          return a;
        };
        for (int64_t r = 0; r < m; r += 2) {
          for (int64_t c = 0; c < k; c += 8) {
            const int64_t drop = mag(r, c) >= mag(r, c + 4) ? c + 4 : c;
            for (int64_t i = r; i < r + 2; ++i) {
              for (int64_t j = drop; j < drop + 4; ++j) wv[i * k + j] = 0.0f;
            }
          }
        }
      } else if (st == TinyStore::kCsrF32 || st == TinyStore::kCsrInt8) {
        fmt = FormatKind::kCsr;
        pat = Pattern::Parse("unstructured:0.5").value();
        for (int64_t i = 0; i < m * k; i += 2) wv[i] = 0.0f;  // every other weight pruned
      } else {
        if (st == TinyStore::kNm24Bf16) dt = DType::kBF16;
        if (st == TinyStore::kNm24PermF32 || st == TinyStore::kNm24PermInt4Sym) {
          std::vector<int32_t> perm(k);
          for (int64_t j = 0; j < k; ++j) perm[j] = static_cast<int32_t>(j);
          std::shuffle(perm.begin(), perm.end(), gen);
          Tensor pt = Tensor::Alloc(DType::kI32, {k});
          std::memcpy(pt.mutable_data(), perm.data(), k * sizeof(int32_t));
          ck.tensors.push_back({name + ".perm", std::move(pt)});
        }
        Prune24(&wv, m, k);  // stored order: for a permuted slot, wv is W_p
      }
      auto sm = Encode(wv, m, k, fmt, pat, dt);
      ASSERT_TRUE(sm.ok()) << name << ": " << sm.status().ToString();
      if (!spec.empty()) {
        const ValueSpec vs = ValueSpec::Parse(spec).value();
        if (auto* nm = std::get_if<NmMatrix>(&*sm)) {
          nm->values.mutable_data_as<float>()[nm->groups() * nm->n] = 0.0f;  // a kept 0 in row 1
          auto q = NmMatrix::Quantize(*nm, vs);
          ASSERT_TRUE(q.ok()) << name << ": " << q.status().ToString();
          sm = SparseMatrix(std::move(*q));
        } else if (auto* vm = std::get_if<VnmMatrix>(&*sm)) {
          vm->values.mutable_data_as<float>()[vm->groups() * vm->n] = 0.0f;  // a kept 0 in row 1
          auto q = VnmMatrix::Quantize(*vm, vs);
          ASSERT_TRUE(q.ok()) << name << ": " << q.status().ToString();
          sm = SparseMatrix(std::move(*q));
        } else if (auto* bm = std::get_if<BsrMatrix>(&*sm)) {
          bm->values.mutable_data_as<float>()[bm->bw] = 0.0f;  // block 0's row 1 (row 1): a kept 0
          auto q = BsrMatrix::Quantize(*bm, vs);
          ASSERT_TRUE(q.ok()) << name << ": " << q.status().ToString();
          sm = SparseMatrix(std::move(*q));
        } else if (auto* cm = std::get_if<CsrMatrix>(&*sm)) {
          cm->values.mutable_data_as<float>()[cm->row_ptr.data_as<int64_t>()[1]] = 0.0f;
          auto q = CsrMatrix::Quantize(*cm, vs);
          ASSERT_TRUE(q.ok()) << name << ": " << q.status().ToString();
          sm = SparseMatrix(std::move(*q));
        } else {
          auto q = DenseMatrix::Quantize(std::get<DenseMatrix>(*sm), vs);
          ASSERT_TRUE(q.ok()) << name << ": " << q.status().ToString();
          sm = SparseMatrix(std::move(*q));
        }
      }
      ck.matrices.push_back({name, std::move(*sm), pat});
    }
  }
  TokenizerData td;
  for (int64_t t = 0; t < c.n_vocab; ++t) td.tokens.push_back(std::string(1, char('a' + t)));
  ck.metadata["sparq.model"] = c.ToJson();
  ck.metadata["sparq.tokenizer"] = td.ToJson();
  const Status st = WriteCheckpoint(path, ck);
  ASSERT_TRUE(st.ok()) << st.ToString();
}

inline TinyStore AllDense(int64_t, int) { return TinyStore::kDenseF32; }
// A quantized student: every quantized kind at least once over 2 blocks x 7 slots, and one slot of
// numbers (f32 2:4).
inline TinyStore QuantStore(int64_t l, int s) {
  static constexpr TinyStore kKinds[] = {TinyStore::kNm24Int4Sym, TinyStore::kCsrInt8,
                                         TinyStore::kDenseInt4,   TinyStore::kNm24PermInt4Sym,
                                         TinyStore::kNm24Int8,    TinyStore::kNm24F32,
                                         TinyStore::kVnm24Int8,   TinyStore::kBsrInt8};
  return kKinds[(l * kNumSlots + s) % 8];
}
// The same without channel permutations (GPTQ's re-quantization refuses permuted layers).
inline TinyStore QuantStoreNoPerm(int64_t l, int s) {
  const TinyStore st = QuantStore(l, s);
  return st == TinyStore::kNm24PermInt4Sym ? TinyStore::kNm24Int4Sym : st;
}

// A learnable letter text over 'a'..'a'+vocab-1: mostly the bigram t -> (3 t + 1) mod V.
inline std::string LetterText(int64_t len, uint64_t seed, int64_t vocab = 11) {
  std::mt19937_64 gen(seed);
  std::string s;
  int64_t t = 0;
  for (int64_t i = 0; i < len; ++i) {
    t = gen() % 8 == 0 ? static_cast<int64_t>(gen() % vocab) : (3 * t + 1) % vocab;
    s.push_back(static_cast<char>('a' + t));
  }
  return s;
}

}  // namespace sparq::train::testing
