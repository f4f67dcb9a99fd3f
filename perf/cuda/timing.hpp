// perf/cuda/timing.hpp — the one timing loop of the GPU benchmarks (`evenep bench gpu-*`, `bench multi`,
// `bench gemm`). Internal to evenep::perf (not a contract of the library).
//
// Every timing is a CUDA-event pair around one call of `op` on `stream`, repeated `iters` times after `warmup`
// untimed calls (then one stream synchronisation before the events are created). Options reproduce the three
// callers' loops exactly: `before_each` runs before every warmup and timed call outside the event pair (the team
// barrier of `bench multi`), `finish` replaces the final stream synchronisation (the team check surfacing device
// errors), `sync_each` waits for each iteration's end event before the next one starts (`bench gemm`).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace evenep::cuda {
class NcclTeam;
}

namespace evenep::perf {

struct Stats {
    double min_us = 0, median_us = 0, mean_us = 0, max_us = 0;
    double p50_us = 0;  // element iters/2 of the sorted times (the upper median for even iters; `bench gemm`)
};

struct TimingOptions {
    int warmup = 5, iters = 20;
    std::function<void()> before_each;  // before every call, outside the event pair (may be empty)
    std::function<void()> finish;       // after the timed calls instead of cudaStreamSynchronize (may be empty)
    bool sync_each = false;             // cudaEventSynchronize on each end event before the next iteration
};

// Sorted per-iteration times (µs) -> min, median (mean of the two middle ones for even counts), mean, p50, max.
Stats stats_of(std::vector<double> us);
// Every field divided by `k` (k back-to-back launches in one timed call).
Stats per_call(Stats s, double k);

// Times `op` (launches on `stream`) with one event pair per iteration.
Stats time_op(const std::function<void()>& op, cudaStream_t stream, const TimingOptions& options);
Stats time_op(const std::function<void()>& op, cudaStream_t stream, int warmup, int iters);

// Times several ops interleaved: `warmup` untimed rounds, then `iters` rounds, each round one call of every op in
// order, each call in its own event pair and waited for. A slow drift of the GPU (clocks, power capping) then lands
// on every op alike instead of on whichever was timed last. One Stats per op.
std::vector<Stats> time_interleaved(const std::vector<std::function<void()>>& ops, cudaStream_t stream, int warmup,
                                    int iters);

// Calls `op` back to back (each waited for) until `seconds` of GPU time have passed, at least once: clocks out of
// the idle state before anything is timed. Returns each call's µs.
std::vector<double> warm_gpu(const std::function<void()>& op, cudaStream_t stream, double seconds);

// Captures `op` (launches on `stream`, no synchronisation) into a CUDA graph once and times its replays like
// time_op: one event pair around each cudaGraphLaunch.
Stats time_graph(const std::function<void()>& op, cudaStream_t stream, int warmup, int iters);

// Collective over the NCCL team: every call preceded by a device-side team barrier (all ranks start together),
// the team's check after the timed calls; returns the slowest rank's median and mean and min/max over ranks.
Stats time_team(::evenep::cuda::NcclTeam& team, const std::function<void()>& op, cudaStream_t stream, int warmup,
                int iters);

// Cross-rank reductions through the team's host all-gather (collective): the maximum of v (truncated to an
// integer, as the row byte counts are) and the sum.
double team_max(::evenep::cuda::NcclTeam& team, double v);
int64_t team_sum(::evenep::cuda::NcclTeam& team, int64_t v);

}  // namespace evenep::perf
