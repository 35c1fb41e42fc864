// The plain reference of every packed layout: one output at a time, summed in double. It walks
// the packed data (so it also checks the packing against the tests' own densified reference).
#include <vector>

#include "src/cpu/spmm.h"

namespace sparq::cpu {

void SpmmReference(const PackedWeight& w, const SpmmArgs& a, ThreadPool* /*pool*/) {
  std::vector<double> acc(w.rows);
  for (int64_t t = 0; t < a.n; ++t) {
    const float* x = a.x + t * a.ldx;
    std::fill(acc.begin(), acc.end(), 0.0);
    std::visit(
        Overloaded{
            [&](const DenseF32Weight& d) {
              const float* wd = d.values.data_as<float>();
              for (int64_t r = 0; r < w.rows; ++r) {
                for (int64_t c = 0; c < w.cols; ++c) acc[r] += double(wd[r * w.cols + c]) * x[c];
              }
            },
            [&](const NmWeight& nm) {
              for (int64_t r = 0; r < w.rows; ++r) {
                for (int64_t c = 0; c < nm.chunks; ++c) {
                  for (int j = 0; j < kNmChunk; ++j) {
                    const int64_t col = nm.Col(r, c, j);
                    const float v = nm.Value(r, c * kNmChunk + j);
                    if (col < w.cols) acc[r] += double(v) * x[col];
                  }
                }
              }
            },
            [&](const RowGroupWeight& s) {
              for (int64_t gi = 0; gi < s.groups(); ++gi) {
                for (int64_t r = s.group_row[gi]; r < s.group_row[gi + 1]; ++r) {
                  const int q = static_cast<int>(r - s.group_row[gi]);
                  for (int64_t p = s.group_ptr[gi]; p < s.group_ptr[gi + 1]; ++p) {
                    acc[r] += double(s.Value(gi, p, q)) * x[s.Col(p)];
                  }
                }
              }
            },
            [&](const DenseQuantWeight& d) {
              for (int64_t r = 0; r < w.rows; ++r) {
                for (int64_t c = 0; c < w.cols; ++c) acc[r] += double(d.Value(r, c)) * x[c];
              }
            },
            [&](const MaskWeight& mw) {
              const uint16_t* bits = mw.bits.data_as<uint16_t>();
              for (int64_t r = 0; r < w.rows; ++r) {
                int64_t p = mw.row_ptr[r];
                for (int64_t c = 0; c < mw.chunks; ++c) {
                  for (int j = 0; j < kMaskChunk; ++j) {
                    if ((bits[r * mw.chunks + c] >> j) & 1) {
                      const int64_t col = c * kMaskChunk + j;
                      acc[r] += double(mw.Value(r, col, p++)) * x[col];
                    }
                  }
                }
              }
            },
        },
        w.layout);
    for (int64_t r = 0; r < w.rows; ++r) {
      a.y[t * a.ldy + r] = ApplyEpilogue(static_cast<float>(acc[r]), t, r, w.rows, a.ep);
    }
  }
}

}  // namespace sparq::cpu
