// perf/cuda/layer_bench.hpp — one MoE layer step (plan, dispatch, prefetch, SwiGLU experts forward, combine, combine
// backward, experts backward, dispatch backward, reduce_grad) of EvenEP, conventional EP and EPLB-style static
// replication on one routing, emulating R GPUs on one GPU: `evenep bench layer` (docs/benchmarks.md, "Layer step").
//
// Method:
//   expert compute  measured: each rank's groups (rows from the plan, padding included) run alone on the whole
//                   GPU by RankComputeTimer (perf/cuda/rank_compute.hpp); a system's step compute is the max over
//                   ranks (mean reported too). Every rank of every system is timed: EvenEP (its plan's groups),
//                   conventional EP (its home experts, all their rows, padded to tp like EvenEP's groups) and EPLB
//                   (the replicas in its slots, each with its share of the expert's rows, perf/baselines.hpp). The
//                   GPU first runs EvenEP's rank 0 for `warm_seconds` (clocks out of the idle state the host-side
//                   preparation leaves), then the ranks are timed interleaved (rank r of every system, then r + 1),
//                   so that a drift of the clocks during the point lands on every system alike.
//   data movement   modelled: per phase, the busiest rank's link bytes max(send, receive) of the traffic model
//                   (evenep/buffer.hpp: evenep_traffic, conventional_traffic; perf::eplb_traffic) over a link
//                   bandwidth per direction. Measured too (EvenEP only), as the library runs it on one GPU: all R
//                   virtual ranks in one launch (cuda::bench_point) — reported beside the model, never mixed into
//                   the step estimate (one GPU's HBM carries every rank's traffic there).
//   EPLB replicas   one EPLB placement per entry of `redundant` (slots per rank), and for each one EPLB system per
//                   replica synchronisation model in `eplb_syncs` (star, ring, none: perf/baselines.hpp): the same
//                   placement and compute, only the sync phases differ (the compute is timed once per placement).
//   step estimate   no overlap: every phase back to back; overlapped: prefetch ‖ dispatch (EvenEP; the baselines
//                   have no prefetch, so both estimates agree). The layer has no shared expert, so "shared expert ‖
//                   communication" adds nothing here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "evenep/config.hpp"
#include "evenep/routing.hpp"
#include "perf/baselines.hpp"

namespace evenep::perf::cuda {

struct LayerBenchConfig {
    std::string shape = "moonep";  // a name for the tables and the JSON
    int R = 8, E = 384, K = 8, S = 8192, H = 7168, ffn_hidden = 2048, tp = 128;
    double target_maxvio = 1;  // of the routing given to run_layer_point
    double sigma = 0;          // lognormal sigma of that routing (step 0 of the drift, perf/drift.hpp)
    uint64_t seed = 1;
    double slack = kAutoDefaultSlack;             // EvenEP's budget: auto's largest, or the fixed one
    PlannerPolicy policy = PlannerPolicy::kAuto;  // EvenEP's planner policy (docs/auto.md)
    double drift = 0.1;  // EPLB: log-popularity random-walk step between the planning step and this one
    // EPLB redundant slots per rank, one EPLB placement (and its rows for every sync model) per entry; -1: EvenEP's
    // prefetch slots B = epn (the baseline).
    std::vector<int> redundant = {-1};
    // How a training step keeps EPLB's replicas in sync (perf/baselines.hpp): one EPLB system per entry.
    std::vector<EplbSync> eplb_syncs = {EplbSync::kRing, EplbSync::kStar};
    double link_gbps = 367;  // per direction, GB/s (1e9), for the modelled data movement
    int warmup = 1, iters = 3;
    double warm_seconds = 1;            // GPU warm-up before the point's first timed rank (RankComputeTimer::warm_up)
    bool measure_data_movement = true;  // also time plan/dispatch/combine/prefetch/reduce on one GPU (bench_point)
    double copy_gbps = 1;               // copy anchor for bench_point's rows
    bool check = false;                 // bench_point --check and a sampled check of the timed GEMMs (rank 0 of EvenEP)
    // Also the FP8 layer (docs/fp8.md): system "evenep_fp8" right after "evenep", same plan and groups; its compute is
    // the FP8 path's kernels (RankComputeTimer with fp8: the home's weight cast of epn experts, the forward's weight
    // transposes, FP8 forward and dgrad GEMMs, bf16 wgrad), its data movement the traffic model with e4m3 dispatch
    // rows (H + 4H/128 bytes) and e4m3 weight copies (3 H H' (1 + 1/4096) bytes); the other phases stay bf16.
    // H and ffn_hidden multiples of 128; needs the CUTLASS FP8 GEMM.
    bool fp8 = false;
    // FP8: micro-batches per optimizer step (gradient accumulation, >= 1), which share one home weight cast under
    // cuda::Experts::reuse_fp8_cast: the FP8 forward is timed as (forward without the cast) + (cast) / micro_batches
    // (RankComputeTimer::time). 1: the cast every forward. No effect on the other systems.
    int micro_batches = 1;
};

// Modelled (or measured) time of each phase of one step, milliseconds.
struct PhaseMs {
    double plan = 0;  // planner (GPU, measured when data movement is measured) + histogram all-gather (modelled)
    double dispatch = 0, prefetch = 0, combine = 0, combine_backward = 0, dispatch_backward = 0, reduce_grad = 0;
    double communication() const {
        return plan + dispatch + prefetch + combine + combine_backward + dispatch_backward + reduce_grad;
    }
};

struct SystemStep {
    std::string system;              // "evenep", "evenep_fp8", "conventional", "eplb"
    bool fp8 = false;                // the FP8 data path (evenep_fp8)
    std::string replica_sync;        // EPLB: the replica synchronisation model (to_string(EplbSync)); empty otherwise
    int redundant_slots = 0;         // EPLB: redundant slots per rank of its placement (-1 resolved to epn)
    std::vector<int64_t> rows;       // [R] rows each rank computes (unpadded entries)
    std::vector<int> timed_ranks;    // ranks whose compute was timed
    std::vector<double> compute_ms;  // forward + backward of each timed rank
    std::vector<double> forward_ms, backward_ms;  // forward_ms: FP8, with the home cast / cfg.micro_batches
    std::vector<double> fp8_home_cast_ms;         // FP8: each timed rank's home weight cast alone (else empty)
    double fp8_home_cast_median_ms = 0;           // FP8: median of fp8_home_cast_ms over the timed ranks (else 0)
    double compute_max_ms = 0, compute_mean_ms = 0;
    double imbalance = 1;             // max/mean of rows
    PhaseMs comm;                     // modelled, R GPUs
    int64_t max_rank_link_bytes = 0;  // whole step
    double step_no_overlap_ms = 0, step_overlapped_ms = 0;
};

struct MeasuredOp {
    std::string op;  // bench_point's row name (plan_rank, dispatch, combine_pull_weighted, prefetch, reduce, ...)
    double median_us = 0;
    double bytes = 0;
    int64_t wrong = -1;
    std::string note;
};

struct LayerPointResult {
    LayerBenchConfig cfg;
    double maxvio = 0;                // achieved by the routing
    double eplb_prev_maxvio = 0;      // the step EPLB was planned on
    int64_t slack_ppm = 0;            // EvenEP's plan: the budget it used (Plan::slack_ppm; under auto, the one chosen)
    std::vector<SystemStep> systems;  // evenep, [evenep_fp8,] conventional, then the eplb systems (LayerPointWork)
    std::vector<double> warm_up_ms;   // the warm-up runs (EvenEP's rank 0, forward + backward), in order
    std::vector<MeasuredOp> measured;  // EvenEP data movement on one GPU (empty when not measured)
    std::string measured_note;         // why not measured, or what was measured
    double gemm_check_error = -1;      // --check: RankComputeTimer::check_forward on EvenEP's rank 0 (-1: not run)
    int64_t wrong = 0;                 // --check: bench_point's mismatches
    double seconds = 0;                // wall time of the point
};

// The host part of a point (no GPU): every system's rows, modelled phases (EvenEP's plan phase without the GPU
// planner) and link bytes, and the groups of the ranks to time: groups[system][i] are the padded rows of each group of
// rank timed_ranks[system][i]. Systems in order evenep, evenep_fp8 (cfg.fp8), conventional, then for each
// cfg.redundant entry one eplb per
// cfg.eplb_syncs entry; of each placement's eplb systems only the first is timed, the others have compute_as = its
// index (same ranks, same groups).
struct LayerPointWork {
    double maxvio = 0, eplb_prev_maxvio = 0;
    int64_t slack_ppm = 0;  // EvenEP's plan's budget (Plan::slack_ppm)
    std::vector<SystemStep> systems;
    std::vector<std::vector<int>> timed_ranks;
    std::vector<std::vector<std::vector<int64_t>>> groups;
    std::vector<std::vector<char>> slot_groups;  // [rank][g] EvenEP's groups that are copies (kSlot): the FP8 path
                                                 // transposes their codes each step
    std::vector<int> compute_as;                 // [system] -1: timed itself; else the system whose compute it shares
    int max_groups = 0;                          // groups per rank at most (2 epn)
    int64_t max_rows = 0;  // the receive buffer's rows NvS (ranks with more are timed in several launches)
};
LayerPointWork prepare_layer_point(const LayerBenchConfig& cfg, const Routing& routing);

// Device bytes and seconds a point is expected to take (for refusing a point before it runs): the per-rank timer's
// allocation, the data-movement benchmark's (R virtual ranks' buffers), and the GEMM time at `tflops` for every
// timed rank and iteration (all ranks of EvenEP, conventional EP and EPLB) and the warm-up.
struct LayerPointEstimate {
    double compute_bytes = 0, movement_bytes = 0, seconds = 0;
};
LayerPointEstimate estimate_layer_point(const LayerBenchConfig& cfg, double tflops = 400);

// Runs one point on `routing` (R ranks of S tokens, the routing of cfg.sigma / cfg.seed). Throws evenep::Error on a
// bad configuration or a device failure; a data-movement measurement that fails (memory) is reported in
// measured_note instead.
LayerPointResult run_layer_point(const LayerBenchConfig& cfg, const Routing& routing);

}  // namespace evenep::perf::cuda
