// perf/cuda/workload_bench.hpp — the GPU rank timer of `evenep bench layer --workload|--trace`
// (perf/workload_measure.hpp): one rank's groups timed alone on the whole GPU by RankComputeTimer, exactly as
// `bench layer` times a rank (perf/cuda/layer_bench.hpp), as a perf::RankComputeFn.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "perf/cuda/rank_compute.hpp"

namespace evenep::perf::cuda {

class GpuRankCompute {
  public:
    // A timer for up to max_groups groups per launch and max_rows rows per launch (RankComputeTimer); each call times
    // `warmup` untimed and `iters` timed runs (median). Throws evenep::Error when the allocation fails.
    GpuRankCompute(int H, int ffn_hidden, int max_groups, int64_t max_rows, uint64_t seed, int warmup, int iters);
    // Forward + backward milliseconds of one rank with these groups. A list longer than max_groups is timed in
    // chunks of max_groups groups, summed (more launches: never faster than one launch would be).
    double operator()(std::span<const int64_t> group_rows);
    // RankComputeTimer::warm_up: brings the clocks to the sustained state before the first timed rank.
    std::vector<double> warm_up(std::span<const int64_t> group_rows, double min_seconds);
    static size_t bytes_needed(int H, int ffn_hidden, int max_groups, int64_t max_rows) {
        return RankComputeTimer::bytes_needed(H, ffn_hidden, max_groups, max_rows);
    }

  private:
    std::unique_ptr<RankComputeTimer> timer_;
    int max_groups_, warmup_, iters_;
};

}  // namespace evenep::perf::cuda
