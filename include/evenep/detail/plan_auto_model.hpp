// evenep/detail/plan_auto_model.hpp — the coefficients of the auto planner policy's step-cost model (docs/auto.md),
// in integer picoseconds so that the CPU planner and the GPU planner predict the same costs bit for bit.
//
// The decision itself (which budget each step plans with) is plan_auto_slack_ppm in evenep/detail/plan_auto.hpp; this
// header holds only the coefficients and where they come from, so PlanDims (plan_core.hpp) can carry them.
#pragma once

#include <cstdint>

#include "evenep/detail/host_device.hpp"

namespace evenep::detail {

// Checked-in H200 figures the coefficients derive from (none of them measured on this machine, which has no GPU):
// - kAutoGemmTflops: row-proportional grouped-GEMM throughput, forward + backward (18·H·H' flops per entry), the
//   figure `evenep simulate`'s step model uses (docs/benchmarks.md, "Workloads", from the `bench layer` /
//   `bench gemm` runs there);
// - kAutoWgradTileUs, kAutoNumSms: the wgrad output tile's fixed cost of the checked-in grouped-GEMM cost model
//   (src/cuda/kernels/gemm_cost_model.inc, `bench gemm --calibrate` on the H200: 13.8455 µs, used to 3 digits as the
//   workload step model always has, so its published figures stay as they are) and the H200's SMs: a
//   group's wgrad walks every (H/128)·(H'/256) tile of each of the 3 projections however few rows it has;
// - kAutoLinkGbps: NVLink P2P bytes per second and direction (`bench layer`'s figure, docs/benchmarks.md);
// - kAutoPlanCopyUs: GPU planner time per copy (each receiver's fill steps and the copy's slot), from the planner's
//   25 µs at the MoonEP point with its 7–8 copies (docs/benchmarks.md "Planner"): an estimate, small next to the rest.
inline constexpr double kAutoGemmTflops = 700;
inline constexpr double kAutoWgradTileUs = 13.8;
inline constexpr double kAutoNumSms = 132;
inline constexpr double kAutoLinkGbps = 367;
inline constexpr double kAutoPlanCopyUs = 0.5;

// Per-step cost coefficients (picoseconds). All zero (the default) makes every candidate cost 0, so the decision
// falls to the smallest budget (exact balance).
struct AutoCostModel {
    int64_t row_ps = 0;        // expert GEMM time per computed entry (forward + backward of the 3 projections)
    int64_t group_ps = 0;      // fixed GEMM time per non-empty group: wgrad tiles + half a tile of padding rows
    int64_t entry_ps = 0;      // link time of one entry (H bf16 values) in one token phase
    int64_t weight_ps = 0;     // link time of one expert's bf16 weights (prefetch)
    int64_t grad_ps = 0;       // link time of one expert's fp32 weight gradients (reduce_grad)
    int64_t plan_copy_ps = 0;  // planner time per copy
};

// The model for an expert of hidden size H and FFN size H' (3 projections of H·H'), groups padded to tp rows.
// Throughputs: GEMM TFLOP/s, link GB/s per direction; group_us < 0: the wgrad tile overhead above. Host only.
inline AutoCostModel make_auto_cost_model(int H,
                                          int ffn_hidden,
                                          int tp,
                                          double gemm_tflops = kAutoGemmTflops,
                                          double group_us = -1,
                                          double link_gbps = kAutoLinkGbps,
                                          double plan_copy_us = kAutoPlanCopyUs) {
    const double h = H, f = ffn_hidden;
    const double row_us = 18.0 * h * f / (gemm_tflops * 1e12) * 1e6;
    const double tile_us = group_us >= 0 ? group_us : 3.0 * (h / 128.0) * (f / 256.0) * kAutoWgradTileUs / kAutoNumSms;
    const double bytes_per_us = link_gbps * 1e3;
    auto ps = [](double us) { return static_cast<int64_t>(us * 1e6 + 0.5); };
    AutoCostModel m;
    m.row_ps = ps(row_us);
    m.group_ps = ps(tile_us + row_us * (tp - 1) / 2.0);
    m.entry_ps = ps(2.0 * h / bytes_per_us);
    m.weight_ps = ps(3.0 * h * f * 2.0 / bytes_per_us);
    m.grad_ps = ps(3.0 * h * f * 4.0 / bytes_per_us);
    m.plan_copy_ps = ps(plan_copy_us);
    return m;
}

// The default model (no layer shape given: Planner, EpOptions): the MoonEP layer of docs/benchmarks.md, H = 7168,
// H' = 2048, tp = 128.
inline AutoCostModel default_auto_cost_model() { return make_auto_cost_model(7168, 2048, 128); }

}  // namespace evenep::detail
