// tests/cuda/perf_rank_compute_test.cu — the per-rank expert timer of `evenep bench layer`
// (perf/cuda/rank_compute.hpp) on tiny configurations (H = 64, H' = 32).
// Cases:
//   SplitsAndCounts      groups {100, 0, 300, 7} with capacity 256 rows: 407 rows in 2 launches, positive finite
//                        forward and backward times; all groups empty: 0 rows, 0 launches, 0 ms (nothing runs)
//   ForwardMatchesHost   the timed forward's gate projection (x·Wg, first and last row of every group of every
//                        launch, a group split between launches included) against host double sums of the same bf16
//                        inputs: relative error < 2^-7 (bf16 output rounding is <= 2^-8)
//   RejectsBadSizes      H not a multiple of 8, more groups than max_groups -> evenep::Error
// Seeds fixed (timer seed 7).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "cuda/gpu_testing.hpp"
#include "evenep/error.hpp"
#include "perf/cuda/rank_compute.hpp"

namespace {

using evenep::perf::cuda::RankComputeTime;
using evenep::perf::cuda::RankComputeTimer;

TEST(RankComputeTimer, SplitsAndCounts) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    RankComputeTimer timer(64, 32, 4, 256, 7);
    const std::vector<int64_t> rows{100, 0, 300, 7};
    const RankComputeTime t = timer.time(rows, 1, 3);
    EXPECT_EQ(t.rows, 407);
    EXPECT_EQ(t.launches, 2);
    EXPECT_TRUE(std::isfinite(t.forward_ms) && t.forward_ms > 0) << t.forward_ms;
    EXPECT_TRUE(std::isfinite(t.backward_ms) && t.backward_ms > 0) << t.backward_ms;
    const std::vector<int64_t> empty{0, 0, 0};
    const RankComputeTime z = timer.time(empty, 1, 3);
    EXPECT_EQ(z.rows, 0);
    EXPECT_EQ(z.launches, 0);
    EXPECT_EQ(z.total_ms(), 0);
}

TEST(RankComputeTimer, ForwardMatchesHost) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    RankComputeTimer timer(64, 32, 4, 256, 7);
    const std::vector<int64_t> rows{100, 0, 300, 7};
    const double err = timer.check_forward(rows);
    EXPECT_LT(err, 1.0 / 128) << "seed 7";
}

TEST(RankComputeTimer, RejectsBadSizes) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    EXPECT_THROW(RankComputeTimer(60, 32, 4, 256), evenep::Error);
    RankComputeTimer timer(64, 32, 2, 64, 7);
    const std::vector<int64_t> rows{1, 2, 3};
    EXPECT_THROW(timer.time(rows, 0, 1), evenep::Error);
}

}  // namespace
