#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <vector>

#include "sparq/checked.h"
#include "sparq/tensor.h"
#include "sparq/thread_pool.h"

namespace sparq {
namespace {

TEST(Checked, NumelOverflowAndNegative) {
  EXPECT_EQ(*CheckedNumel({3, 4, 5}, "t"), 60u);
  EXPECT_FALSE(CheckedNumel({-1, 4}, "t").ok());
  auto r = CheckedNumel({int64_t{1} << 40, int64_t{1} << 40}, "w");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("overflow"), std::string::npos);
  EXPECT_FALSE(CheckedNumel({1000, 1000}, "t", 999999).ok());
}

TEST(Tensor, AllocAlignedZeroedAndViews) {
  Tensor t = Tensor::Alloc(DType::kBF16, {3, 5});
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % kTensorAlignment, 0u);
  EXPECT_EQ(t.nbytes(), 30u);
  for (uint64_t i = 0; i < t.numel(); ++i) EXPECT_EQ(t.data_as<uint16_t>()[i], 0);
  EXPECT_EQ(t.strides(), (std::vector<int64_t>{5, 1}));
  Tensor q = Tensor::Alloc(DType::kI4, {7});
  EXPECT_EQ(q.nbytes(), 4u);
  float buf[4] = {1, 2, 3, 4};
  Tensor v = Tensor::View(DType::kF32, {2, 2}, buf);
  EXPECT_FALSE(v.owned());
  EXPECT_EQ(v.data_as<float>()[3], 4.f);
  Tensor c = v.Clone();
  EXPECT_TRUE(c.owned());
  EXPECT_EQ(c.data_as<float>()[2], 3.f);
  EXPECT_FALSE(Tensor::TryAlloc(DType::kF32, {int64_t{1} << 62, 4}, "x").ok());
  EXPECT_FALSE(Tensor::TryAlloc(DType::kF32, {4, -2}, "x").ok());
  EXPECT_EQ(v.ShapeString(), "f32[2, 2]");
}

TEST(Tensor, ConvertF32RoundTrip) {
  Tensor t = Tensor::Alloc(DType::kF32, {4});
  float* p = t.mutable_data_as<float>();
  p[0] = 1.0f; p[1] = -2.5f; p[2] = 1e-3f; p[3] = 65504.f;
  for (DType d : {DType::kF16, DType::kBF16}) {
    auto h = FromF32(t, d);
    ASSERT_TRUE(h.ok());
    auto back = ToF32(*h);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(back->data_as<float>()[0], 1.0f);
    EXPECT_EQ(back->data_as<float>()[1], -2.5f);
    EXPECT_NEAR(back->data_as<float>()[2], 1e-3f, 1e-5f);
  }
}

TEST(ThreadPool, RunsEveryTaskOnceForAnyThreadCount) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    for (int rep = 0; rep < 20; ++rep) {
      std::vector<std::atomic<int>> hits(97);
      pool.ParallelFor(97, [&](int64_t task, int thread) {
        ASSERT_GE(thread, 0);
        ASSERT_LT(thread, threads);
        hits[task].fetch_add(1);
      });
      for (auto& h : hits) ASSERT_EQ(h.load(), 1);
    }
    pool.ParallelFor(0, [](int64_t, int) { FAIL(); });
  }
}

}  // namespace
}  // namespace sparq
