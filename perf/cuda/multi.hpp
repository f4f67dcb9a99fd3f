// perf/cuda/multi.hpp — the multi-process benchmark behind `evenep bench multi` (one process per GPU; run it
// under `evenep launch -n R -- evenep bench multi ...`; evenep::perf, not the library). Method: docs/multi-gpu.md.
//
// Per maxvio point every rank builds the same lognormal routing (SPEC §7, target maxvio, shared seed), takes its
// own part, and times with CUDA events on its stream, each iteration preceded by a device-side team barrier so
// that all ranks start together: plan, dispatch, combine (pull and push), prefetch_weight, reduce_grad, the whole
// forward prefix (plan, then dispatch beside prefetch_weight on a second stream and team channel), and the
// conventional all-to-all over NCCL on the same routing (counts exchanged first; dispatch and combine). A row
// reports the slowest rank's median. Anchors measured in the same run: the peer-to-peer NVLink copy bandwidth of
// the plain copy kernel (every rank writing into its next peer's window at once) and the local HBM copy.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "evenep/config.hpp"
#include "evenep/cuda/nccl_team.hpp"

namespace evenep::perf {

struct MultiBenchConfig {
    int experts_per_rank = 48;  // E = experts_per_rank * R (the MoonEP point: 384 experts on 8 ranks)
    int K = 8, S = 8192, H = 7168, ffn_hidden = 2048, tp = 128;
    std::vector<double> maxvios{0.2, 1, 10, 20};
    uint64_t seed = 1;
    int sm_budget = 32;  // SMs of each rank's communication kernels
    int warmup = 5, iters = 20;
    bool check = false;  // verify plan, dst, prefetch; dispatch and combine against the CPU oracle; #wrong
    PlannerMode mode = PlannerMode::kOptimized;
    int projections = 1;           // prefetch/reduce: projections moved per copy (3 = gate, up and down)
    double copy_mib = 1024;        // size of the copy anchors
    std::vector<std::string> ops;  // subset of: plan dispatch combine prefetch reduce total a2a (empty: all)
};

struct MultiBenchRow {
    std::string op;     // p2p_copy, hbm_copy, plan, dispatch, combine_pull, combine_push, prefetch, reduce,
                        // total_plan_dispatch_prefetch, a2a_dispatch, a2a_combine
    std::string shape;  // "R2 E96 K8 S8192 H7168"
    double maxvio = 0;  // achieved maxvio of the routing (0 for anchors)
    double median_us = 0, min_us = 0, max_us = 0;  // median: slowest rank's median; min/max over ranks and iters
    double bytes = 0;                              // logical bytes of the busiest rank (formulas in docs/multi-gpu.md)
    double link_bytes = 0;                         // bytes that crossed NVLink from/to the busiest rank
    double gbps = 0;                               // bytes / median (GB/s, 1e9)
    double link_gbps = 0;                          // link_bytes / median
    double frac_p2p = 0;                           // gbps / the p2p copy anchor
    int64_t wrong = -1;                            // --check: mismatches, summed over ranks (-1: not checked)
    int blocks_per_rank = 0;
    int iters = 0;
    std::string note;
};

struct MultiBenchResult {
    int R = 0;
    int nccl_version = 0;
    std::string device;   // one line per the GPU of rank 0
    double p2p_gbps = 0;  // the NVLink anchor: bytes one rank writes into a peer per second, all ranks at once
    double hbm_gbps = 0;  // the local copy anchor (read + write bytes)
    std::vector<MultiBenchRow> rows;  // identical on every rank
};

// Collective: every rank of the group calls it with the same configuration. Throws evenep::Error on a CUDA/NCCL
// error, a device-side failure (barrier timeout naming the missing rank) or a bad configuration.
MultiBenchResult bench_multi(const cuda::NcclBootstrap& boot, const MultiBenchConfig& cfg);

}  // namespace evenep::perf
