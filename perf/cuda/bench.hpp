// perf/cuda/bench.hpp — GPU benchmarks behind `evenep bench` (host functions of evenep::perf, not linked into
// evenep::evenep; method and formulas in docs/benchmarks.md). One file per op: copy.cpp (anchors), plan.cpp,
// data_path.cpp (dispatch, combine), experts.cpp (prefetch, reduce), point.cpp (one benchmark point); the loop is
// perf/cuda/timing.hpp's.
//
// Every timing is a CUDA-event pair around one launch on a dedicated stream, repeated `iters` times after
// `warmup` untimed runs; rows report min/median/mean/max in microseconds. Bandwidth is bytes actually read plus
// written by the kernel (counted from the plan and the routing, all virtual ranks together) over the median time,
// and the fraction is that over the copy-bandwidth anchor measured in the same process. With BenchConfig::graph
// every timed op is also captured once into a CUDA graph and its replays are timed the same way (one event pair
// around each cudaGraphLaunch), reported as a second row "<op>_graph".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "evenep/config.hpp"

namespace evenep::perf {

struct BenchConfig {
    int R = 8, E = 384, K = 8, S = 8192, H = 7168, ffn_hidden = 2048, tp = 128;
    double maxvio = 1.0;  // target maxvio of the lognormal routing (SPEC §7)
    uint64_t seed = 1;
    int sm_budget = 32;  // SMs per virtual rank (clamped: the R ranks share one GPU)
    int warmup = 5, iters = 20;
    bool check =
        false;  // verify (full plan and dst; data path against the CPU oracle on sampled columns), report #wrong
    bool graph = false;  // also capture each timed op once into a CUDA graph and time its replays ("<op>_graph" rows)
    bool fp8 = false;    // the Ep has precision.fp8 (fp32 scales): dispatch rows are dispatch_fp8 (into the buffers),
                         // dispatch_fp8_rows (into caller-owned codes and scales) and dispatch_fp8_quantised (from
                         // caller-quantised rows, RankIo::x8), e4m3 bytes; no combine rows
    PlannerMode mode = PlannerMode::kOptimized;
    double slack = 0;                              // Config::slack (the largest budget under the auto policy)
    PlannerPolicy policy = PlannerPolicy::kFixed;  // Config::policy (docs/auto.md; auto's model: this H, H', tp)
    int expert_projections = 3;  // prefetch/reduce: projections moved per copy (3 = gate, up, down), fewer when the
                                 // op's pool would not fit in free device memory (the row's note says how many)
    std::string routing_npy;     // if set, rank 0's routing [1, S, K] int32 is written here (PyTorch anchor)
    std::string routing_in;      // if set, the routing [R, S, K] int32 .npy to use instead of generating one (the
                                 // Python benchmark's, for the same call on both sides); maxvio is then measured
};

struct BenchRow {
    std::string op;     // copy_memcpy, copy_kernel, plan_rank, plan_rank_serial, plan_fused(_rows, _block), dispatch,
                        // combine_pull, combine_push, combine_pull_weighted, prefetch, reduce; "<op>_graph": the
                        // same op timed as CUDA graph replays (BenchConfig::graph)
    std::string shape;  // "R8 E384 K8 S8192 H7168"
    double maxvio = 0;  // achieved maxvio of the routing (0 for anchors)
    double min_us = 0, median_us = 0, mean_us = 0, max_us = 0;
    double bytes = 0;      // read + written by the launch, all virtual ranks
    double gbps = 0;       // bytes / median, GB/s (1e9)
    double frac_copy = 0;  // gbps / copy anchor
    int64_t wrong = -1;    // --check: mismatches found, -1: not checked
    int blocks_per_rank = 0;
    int iters = 0;
    std::string note;
};

// Copy anchors over `bytes` bytes: cudaMemcpyAsync device-to-device and the 16-byte vector copy kernel.
std::vector<BenchRow> bench_copy(size_t bytes, int warmup, int iters);
// The best copy bandwidth of `anchors` (GB/s).
double copy_anchor_gbps(const std::vector<BenchRow>& anchors);

// One benchmark point: builds the routing, then runs the named ops (any of plan, dispatch, combine, prefetch,
// reduce; "plan" gives plan_rank, plan_rank_serial and plan_fused; "combine" gives pull, push, pull weighted).
// Throws evenep::Error on a CUDA error or a failed device check.
std::vector<BenchRow> bench_point(const BenchConfig& cfg, const std::vector<std::string>& ops, double copy_gbps);

// Device name, SM count, memory clock etc. in one line.
std::string device_summary();

}  // namespace evenep::perf
