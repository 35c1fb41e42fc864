// Accumulator macros of the tiled kernels (text only: the same on every Highway target, so this
// header is included once per target pass without a guard; identical redefinitions are legal).

// Accumulators a<q><v> for G rows x NV vectors, spelled out (no vectors in arrays).
#define SPARQ_ACC_ROW(q) \
  auto a##q##0 = hn::Zero(df), a##q##1 = hn::Zero(df), a##q##2 = hn::Zero(df), a##q##3 = hn::Zero(df)
#define SPARQ_ACC_LOAD(q, v)                                            \
  if constexpr (G > q && NV > v) {                                      \
    if (!first) a##q##v = hn::LoadU(df, scr + (q) * NT + (v) * L);       \
  }
#define SPARQ_ACC_STORE(q, v) \
  if constexpr (G > q && NV > v) hn::StoreU(a##q##v, df, scr + (q) * NT + (v) * L)
#define SPARQ_ACC_FMA(q, v) \
  if constexpr (G > q && NV > v) a##q##v = hn::MulAdd(w##q, x##v, a##q##v)
#define SPARQ_FOR_V(M, q) M(q, 0); M(q, 1); M(q, 2); M(q, 3)
#define SPARQ_FOR_QV(M) SPARQ_FOR_V(M, 0); SPARQ_FOR_V(M, 1); SPARQ_FOR_V(M, 2); SPARQ_FOR_V(M, 3)
// Up to 8 vectors per row (the N:M tiled rows on AVX-512, 2 rows x 8 vectors).
#define SPARQ_ACC_ROW8(q)                                                                        \
  SPARQ_ACC_ROW(q);                                                                              \
  auto a##q##4 = hn::Zero(df), a##q##5 = hn::Zero(df), a##q##6 = hn::Zero(df), a##q##7 = hn::Zero(df)
#define SPARQ_FOR_V8(M, q) SPARQ_FOR_V(M, q); M(q, 4); M(q, 5); M(q, 6); M(q, 7)
#define SPARQ_FOR_QV8(M) SPARQ_FOR_V8(M, 0); SPARQ_FOR_V8(M, 1); SPARQ_FOR_V8(M, 2); SPARQ_FOR_V8(M, 3)
