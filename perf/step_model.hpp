// perf/step_model.hpp — the step-time model of `evenep simulate --workload|--trace` (docs/benchmarks.md,
// "Workloads"): one MoE layer step of a system from the histogram it computes, on the CPU.
//
// A system's step is described by where every entry is computed (alloc[e*R + r]: entries of expert e on rank r)
// and the expert weights and gradients it moves (prefetch and reduce_grad moves). The model, per step:
//   compute   max over ranks of  sum over its groups (experts with rows on it) of
//             padded_rows * 18 * H * H' / gemm_tflops  +  group_us
//             (forward 3 projections, backward twice that; groups padded to tp rows; group_us the per-group fixed
//             cost: by default the wgrad tile overhead of the checked-in grouped-GEMM cost model, 13.8 us per
//             128 x 256 tile over 132 SMs: 3 * (H/128) * (H'/256) * 13.8 / 132 us);
//   tokens    one phase = the busiest rank's max(sent, received) entries * H * 2 bytes over link_gbps, where an
//             entry of source s for expert e stays on s as far as alloc[e*R + s] allows (locality first, the
//             EvenEP planner's local_keep) and crosses otherwise; dispatch, combine, combine backward and
//             dispatch backward are four such phases (entries, not deduplicated tokens: every system alike);
//   weights   prefetch (bf16 weights, before compute) and reduce_grad (fp32 gradients, after): the busiest rank's
//             max(sent, received) bytes over link_gbps;
//   step      plan_us + max(dispatch, prefetch) + compute + 3 token phases + reduce_grad (prefetch overlaps
//             dispatch, as in `evenep bench layer`'s overlapped estimate).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "evenep/detail/plan_auto_model.hpp"

namespace evenep::perf {

struct StepModel {
    int H = 3584;
    int ffn_hidden = 2048;
    int tp = 128;               // rows every group is padded to a multiple of
    double gemm_tflops = detail::kAutoGemmTflops;  // row-proportional grouped-GEMM throughput, forward + backward
    double group_us = -1;                          // per-group fixed cost; -1: the wgrad tile overhead above
    double link_gbps = detail::kAutoLinkGbps;      // per direction (the NVLink P2P figure of `bench layer`)

    // Throws evenep::Error naming the value: sizes < 1, throughputs <= 0, group_us < -1.
    void validate() const;
    double group_cost_us() const;
    int64_t weight_bytes() const { return int64_t{3} * H * ffn_hidden * 2; }  // bf16, 3 projections
    int64_t grad_bytes() const { return int64_t{3} * H * ffn_hidden * 4; }    // fp32
    // The auto planner policy's coefficients for this model (detail::make_auto_cost_model: the same throughputs).
    detail::AutoCostModel auto_cost_model() const {
        return detail::make_auto_cost_model(H, ffn_hidden, tp, gemm_tflops, group_us, link_gbps);
    }
};

// One link transfer of `bytes` from rank `from` to rank `to`.
struct Move {
    int32_t from = 0;
    int32_t to = 0;
    int64_t bytes = 0;
};

// What a system does with one histogram.
struct SystemStep {
    std::vector<int64_t> alloc;     // [E*R] entries of expert e computed on rank r; sum_r = T_e
    std::vector<Move> prefetch;     // weights moved before compute (copies, replica refreshes)
    std::vector<Move> reduce_grad;  // gradients moved after compute (copies home, replica synchronisation)
    double plan_us = 0;             // per-step planning on the critical path
};

struct StepCost {
    std::vector<int64_t> rows;  // [R] entries computed per rank (unpadded)
    std::vector<double> rank_compute_ms;  // [R] the compute term of each rank (compute_ms is their max)
    double rows_max_over_mean = 1;
    double compute_ms = 0, token_phase_ms = 0, prefetch_ms = 0, reduce_ms = 0, plan_ms = 0, step_ms = 0;
    int64_t token_bytes = 0;   // every token phase, all ranks' sent bytes
    int64_t weight_bytes = 0;  // prefetch, all ranks' sent bytes
    int64_t grad_bytes = 0;    // reduce_grad, all ranks' sent bytes
};

// The cost of `step` on histogram tpe [R*E] (R ranks, E experts; checks alloc's size and per-expert sums).
StepCost evaluate_step(const StepModel& model, int R, int E, std::span<const int32_t> tpe, const SystemStep& step);

// The groups rank r computes under alloc [E*R]: one per expert with entries on r, in expert order, each its rows
// padded to a multiple of model.tp (the groups evaluate_step's compute term counts; what a GPU timer runs).
std::vector<int64_t> rank_groups(const StepModel& model, int R, int E, std::span<const int64_t> alloc, int r);

// Copies of a dynamic system (EvenEP, LLEP): every (e, r) with alloc > 0 and r not e's home (e / (E/R)) fetches
// e's bf16 weights from the home (prefetch) and returns its fp32 gradient there (reduce_grad).
void add_copy_moves(const StepModel& model, int R, int E, SystemStep& step);

}  // namespace evenep::perf
