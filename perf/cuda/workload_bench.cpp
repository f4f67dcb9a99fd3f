// The GPU rank timer of `bench layer --workload|--trace` (perf/cuda/workload_bench.hpp).
#include "perf/cuda/workload_bench.hpp"

#include <algorithm>

#include "evenep/error.hpp"

namespace evenep::perf::cuda {

GpuRankCompute::GpuRankCompute(
    int H, int ffn_hidden, int max_groups, int64_t max_rows, uint64_t seed, int warmup, int iters)
    : timer_(std::make_unique<RankComputeTimer>(H, ffn_hidden, max_groups, max_rows, seed)),
      max_groups_(max_groups),
      warmup_(warmup),
      iters_(iters) {
    EVENEP_CHECK(max_groups >= 1 && warmup >= 0 && iters >= 1, "GpuRankCompute: max_groups = ", max_groups,
                 ", warmup = ", warmup, ", iters = ", iters);
}

double GpuRankCompute::operator()(std::span<const int64_t> group_rows) {
    double ms = 0;
    for (size_t first = 0; first < group_rows.size(); first += static_cast<size_t>(max_groups_)) {
        const size_t n = std::min(group_rows.size() - first, static_cast<size_t>(max_groups_));
        ms += timer_->time(group_rows.subspan(first, n), warmup_, iters_).total_ms();
    }
    return ms;
}

std::vector<double> GpuRankCompute::warm_up(std::span<const int64_t> group_rows, double min_seconds) {
    return timer_->warm_up(group_rows.first(std::min(group_rows.size(), static_cast<size_t>(max_groups_))),
                           min_seconds);
}

}  // namespace evenep::perf::cuda
