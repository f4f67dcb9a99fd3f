// perf/cuda/gemm.hpp — the grouped GEMM benchmark behind `evenep bench gemm` (the CLI parses and prints; method and
// formulas in docs/benchmarks.md, "Grouped GEMM"). Internal to evenep::perf (not a contract of the library).
//
// The GPU grouped GEMM (evenep/cuda/grouped_gemm.hpp) on one rank's receive buffer. Row distributions: the
// planner's cu_seqlens of rank 0 at each maxvio (lognormal routing bisected to that maxvio, optimized planner) and a
// Zipf split of S*K rows over the G = 2*epn groups (each padded to tp). For each distribution, projection (gate/up:
// H -> H', down: H' -> H), op (fwd, dgrad, wgrad, wgrad_set) it times the kernels/schedules interleaved with
// perf/cuda/timing.hpp (time_interleaved: one call of each per round, each waited for; the GPU warmed for
// warm_seconds first) and reports the median and TFLOP/s = 2 * rows * in * out / t (rows = padded rows computed). calibrate_gemm fits the scheduler's cost model (src/cuda/kernels/gemm_cost_model.inc).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace evenep::perf {

struct GemmBenchConfig {
    int R = 8, E = 384, K = 8, S = 8192, H = 7168, ffn_hidden = 2048, tp = 128;
    std::vector<double> maxvios{0.2, 1, 10, 20};
    double zipf = 1.0;  // exponent; <= 0 skips the Zipf split
    uint64_t seed = 1;
    int warmup = 3, iters = 10;
    double warm_seconds = 1;  // GPU warm-up before the first timed row (perf::warm_gpu)
    bool check = false;  // schedules compared bitwise, 16 sampled elements (wgrad: 8) against a host dot product
    std::vector<std::string> ops{"fwd", "dgrad", "wgrad", "wgrad_set"};
    // wgmma: the hand-written Hopper kernel (fixed, load_aware); mma: the portable one; cutlass / cutlass_pingpong:
    // CUTLASS's grouped GEMM (fixed and load_aware / load_aware), where built (EVENEP_CUTLASS) and on Hopper.
    std::vector<std::string> kernels{"wgmma", "mma", "cutlass", "cutlass_pingpong"};
};

struct GemmDistribution {
    std::string name;         // planner_maxvio<v>, zipf<a>
    std::vector<int32_t> cu;  // [G] inclusive padded ends
};

struct GemmBenchRow {
    std::string dist, proj, op, schedule, kernel;  // kernel: wgmma, mma, cutlass, cutlass_pingpong;
                                                   // schedule: "<kernel>/<schedule>"
    int64_t rows = 0;
    int in = 0, out = 0;
    double median_us = 0, tflops = 0;
    double max_rel_err = -1;  // --check: largest sampled error relative to the sum of magnitudes; -1: unchecked
    double model_us = 0;      // the scheduler's cost model for the call (0 for the mma kernel)
    std::string check = "-";  // as printed: "=<err>" (schedules bitwise equal), "<err>", "-"
};

struct GemmBenchInfo {
    std::string device;
    int sms = 0, G = 0, grid_fwd = 0, grid_dgrad = 0;
    std::string model_source;
    double c_tile = 0, c_tile_wgrad = 0, c_kblock = 0, c_kblock_wgrad = 0;
};

// The row distributions of the benchmark (host only).
std::vector<GemmDistribution> gemm_distributions(const GemmBenchConfig& config);

// Runs the benchmark over `dists` (gemm_distributions(config); at least one): `on_start` once the device is known,
// `on_row` after every measured row.
// Throws evenep::Error (kRuntime) when --check finds schedules that differ or a sampled error over the tolerance
// (1e-2; wgrad 1e-3), or when no requested kernel runs on this device.
std::vector<GemmBenchRow> bench_gemm(const GemmBenchConfig& config,
                                     const std::vector<GemmDistribution>& dists,
                                     const std::function<void(const GemmBenchInfo&)>& on_start,
                                     const std::function<void(const GemmBenchRow&)>& on_row);

struct GemmCalibrationPoint {
    std::string op;  // fwd or wgrad
    int kblocks = 0;
    int groups = 0;
    double call_us = 0, tile_us = 0;
};

struct GemmCalibration {
    std::string device;
    int sms = 0;
    std::vector<GemmCalibrationPoint> points;
    double fwd_c_tile = 0, fwd_c_kblock = 0, fwd_residual = 0;
    double wgrad_c_tile = 0, wgrad_c_kblock = 0, wgrad_residual = 0;
    double split_fraction = 0;  // the current model's (not fitted)
};

// Times the Hopper kernel on problems whose tiles all cost the same and give every SM exactly 16 and then 48 tiles,
// for several k-block counts; the difference of the two times over 32 is the time one SM spends per tile, free of
// the call's fixed costs (launch, scheduler, first and last wave). It is fitted as c_tile + c_kblock * k-blocks.
// Forward: in = 64 kb, out = 2048, 1024 rows per group; wgrad: in = out = 1024, 64 kb rows per group, fixed
// schedule. `on_point` after every point. Throws evenep::Error (kRuntime) without the Hopper kernel.
GemmCalibration calibrate_gemm(int warmup, int iters, const std::function<void(const GemmCalibrationPoint&)>& on_point);

}  // namespace evenep::perf
