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
//   25 µs at the MoonEP point with its 7–8 copies (docs/benchmarks.md "Planner"): an estimate, small next to the rest;
// - kAutoFp8GemmSpeedup: the FP8 layer's block-scaled forward / dgrad GEMM throughput over the bf16 kernel's on the
//   same rows (CUTLASS, measured on an H100: 1.27–1.55× at the MoonEP point, 1.38–1.56× at the K3-like point,
//   docs/benchmarks.md "The full table and kAuto per op"; the middle of the range). Its wgrad stays bf16.
inline constexpr double kAutoGemmTflops = 700;
inline constexpr double kAutoWgradTileUs = 13.8;
inline constexpr double kAutoNumSms = 132;
inline constexpr double kAutoLinkGbps = 367;
inline constexpr double kAutoPlanCopyUs = 0.5;
inline constexpr double kAutoFp8GemmSpeedup = 1.45;

// Per-step cost coefficients (picoseconds). All zero (the default) makes every candidate cost 0, so the decision
// falls to the smallest budget (exact balance).
struct AutoCostModel {
    int64_t row_ps = 0;        // expert GEMM time per computed entry (forward + backward of the 3 projections)
    int64_t group_ps = 0;      // fixed GEMM time per non-empty group: wgrad tiles + half a tile of padding rows
    int64_t entry_ps = 0;      // link time of one entry (H bf16 values) in one token phase
    int64_t weight_ps = 0;     // link time of one expert's bf16 weights (prefetch)
    int64_t grad_ps = 0;       // link time of one expert's fp32 weight gradients (reduce_grad)
    int64_t plan_copy_ps = 0;  // planner time per copy
    // link time of one entry in the dispatch phase (the one the prefetch overlaps) where its rows differ from the
    // other phases' (FP8: H e4m3 codes and H/128 fp32 scales); 0: entry_ps
    int64_t dispatch_entry_ps = 0;
};

// Microseconds as the model's integer picoseconds (rounded to nearest).
inline int64_t auto_model_ps(double us) { return static_cast<int64_t>(us * 1e6 + 0.5); }

// A group's fixed GEMM time (µs): its wgrad tiles (tile_us, or when < 0 every (H/128)·(H'/256) tile of the 3
// projections at kAutoWgradTileUs over kAutoNumSms) plus half a tp tile of padding rows at row_us each.
inline double auto_group_us(double h, double f, int tp, double row_us, double tile_us = -1) {
    const double tiles = tile_us >= 0 ? tile_us : 3.0 * (h / 128.0) * (f / 256.0) * kAutoWgradTileUs / kAutoNumSms;
    return tiles + row_us * (tp - 1) / 2.0;
}

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
    const double bytes_per_us = link_gbps * 1e3;
    AutoCostModel m;
    m.row_ps = auto_model_ps(row_us);
    m.group_ps = auto_model_ps(auto_group_us(h, f, tp, row_us, group_us));
    m.entry_ps = auto_model_ps(2.0 * h / bytes_per_us);
    m.weight_ps = auto_model_ps(3.0 * h * f * 2.0 / bytes_per_us);
    m.grad_ps = auto_model_ps(3.0 * h * f * 4.0 / bytes_per_us);
    m.plan_copy_ps = auto_model_ps(plan_copy_us);
    return m;
}

// The FP8 layer's model (DataPrecision::fp8, docs/fp8.md): the bf16 model with the forward and dgrad GEMMs (two
// thirds of an entry's 18·H·H' flops) at fp8_speedup × gemm_tflops and the wgrad (the other third, and the wgrad
// tile overhead) bf16; dispatch entries of H + H/32 bytes (e4m3 codes and one fp32 scale per 128 channels; combine
// and the backward phases stay bf16); copies of 3·H·H'·(1 + 1/4096) bytes (e4m3 codes and one fp32 scale per 128 ×
// 128 block); gradients fp32 as before. Host only.
inline AutoCostModel make_auto_cost_model_fp8(int H,
                                              int ffn_hidden,
                                              int tp,
                                              double gemm_tflops = kAutoGemmTflops,
                                              double fp8_speedup = kAutoFp8GemmSpeedup,
                                              double link_gbps = kAutoLinkGbps,
                                              double plan_copy_us = kAutoPlanCopyUs) {
    AutoCostModel m = make_auto_cost_model(H, ffn_hidden, tp, gemm_tflops, -1, link_gbps, plan_copy_us);
    const double h = H, f = ffn_hidden, bytes_per_us = link_gbps * 1e3;
    const double row_us = (12.0 / fp8_speedup + 6.0) * h * f / (gemm_tflops * 1e12) * 1e6;
    m.row_ps = auto_model_ps(row_us);
    m.group_ps = auto_model_ps(auto_group_us(h, f, tp, row_us));
    m.dispatch_entry_ps = auto_model_ps((h + h / 32.0) / bytes_per_us);
    m.weight_ps = auto_model_ps(3.0 * h * f * (1.0 + 1.0 / 4096.0) / bytes_per_us);
    return m;
}

// The model of a layer of this shape and precision: what the layers set on the planners of their buffer or Ep
// (cpu::MoeLayer, cuda::MoeLayer) and the Python buffers use, so that the CPU oracle, the GPU layer and the ops plan
// the same plans. Host only.
inline AutoCostModel layer_auto_cost_model(int H, int ffn_hidden, int tp, bool fp8) {
    return fp8 ? make_auto_cost_model_fp8(H, ffn_hidden, tp) : make_auto_cost_model(H, ffn_hidden, tp);
}

// The default model (no layer shape given: Planner, EpOptions): the MoonEP layer of docs/benchmarks.md, H = 7168,
// H' = 2048, tp = 128.
inline AutoCostModel default_auto_cost_model() { return make_auto_cost_model(7168, 2048, 128); }

}  // namespace evenep::detail
