// `evenep bench gemm`: the GPU grouped GEMM (include/evenep/cuda/grouped_gemm.hpp) on one rank's receive buffer; the
// measuring is perf/cuda/gemm.hpp's (distributions, variants, checks, the cost-model calibration), this file parses
// the options and prints. --offsets-json writes each distribution's cu_seqlens for scripts/device/gemm_anchor.py
// (torch anchors). Every output file is checked before the run and written atomically at its end. Without a CUDA build
// the subcommand says that it needs one.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common.hpp"
#include "evenep/error.hpp"
#include "perf/cuda/gemm.hpp"  // plain C++ (the options struct); the measuring is linked in CUDA builds only

namespace evenep::cli {
namespace {

struct GemmCliOptions {
    perf::GemmBenchConfig bench;  // shapes, distributions, ops, kernels, iterations, --check
    std::string json_file, offsets_file;
    bool calibrate = false;
    std::string write_model;  // --calibrate: the generated cost-model include to write
    ResourceLimits limits;
};

// The host side, checked before the device is touched: per maxvio one routing of the group and its plan (for
// rank 0's row counts; estimate.hpp). Device memory is checked against what the device reports. Unverified on a
// device here (docs/estimates.md).
Estimate gemm_host_estimate(const perf::GemmBenchConfig& b) {
    Estimate e;
    const int count = static_cast<int>(std::max<size_t>(1, b.maxvios.size()));
    add_near_maxvio_estimate(b.R, b.E, b.K, b.S, count, e);
    e.add_bytes(plan_bytes(b.R, b.E) + 4.0 * b.R * b.E, "host plan");
    e.add_seconds(count * plan_seconds(b.R, b.E), "host plans");
    return e;
}

#if defined(EVENEP_HAVE_CUDA)

void run_gemm_bench(const GemmCliOptions& o) {
    OutputFile json("--json", o.json_file);  // checked now, written atomically at the end (inactive without a path)
    OutputFile offsets_file("--offsets-json", o.offsets_file);
    const perf::GemmBenchConfig& cfg = o.bench;
    const std::vector<perf::GemmDistribution> dists = perf::gemm_distributions(cfg);
    nlohmann::json out{{"rows", nlohmann::json::array()}};
    auto on_start = [&](const perf::GemmBenchInfo& info) {
        fmt::print("device: {} ({} SMs), G = {}, H = {}, H' = {}, grid fwd {} dgrad {}\n", info.device, info.sms,
                   info.G, cfg.H, cfg.ffn_hidden, info.grid_fwd, info.grid_dgrad);
        fmt::print("cost model ({}): c_tile {} us, c_tile_wgrad {} us, c_kblock {} us, c_kblock_wgrad {} us\n",
                   info.model_source, info.c_tile, info.c_tile_wgrad, info.c_kblock, info.c_kblock_wgrad);
        fmt::print("{:<20} {:<8} {:<9} {:<27} {:>8} {:>10} {:>9} {:>9} {:>10}\n", "dist", "proj", "op",
                   "kernel/schedule", "rows", "p50 us", "TFLOP/s", "model us", "check");
        for (const perf::GemmDistribution& d : dists) {
            int32_t prev = 0, biggest = 0, smallest = d.cu.back();
            for (int32_t e : d.cu)
                biggest = std::max(biggest, e - prev), smallest = std::min(smallest, e - prev), prev = e;
            fmt::print("# {}: {} padded rows, group rows min {} max {}\n", d.name, d.cu.back(), smallest, biggest);
        }
        out["device"] = info.device;
        out["G"] = info.G;
    };
    auto on_row = [&](const perf::GemmBenchRow& r) {
        fmt::print("{:<20} {:<8} {:<9} {:<27} {:>8} {:>10.1f} {:>9.1f} {:>9.1f} {:>10}\n", r.dist, r.proj, r.op,
                   r.schedule, r.rows, r.median_us, r.tflops, r.kernel == "mma" ? 0.0 : r.model_us, r.check);
        std::fflush(stdout);
        out["rows"].push_back({{"dist", r.dist},
                               {"proj", r.proj},
                               {"op", r.op},
                               {"schedule", r.schedule},
                               {"rows", r.rows},
                               {"in", r.in},
                               {"out", r.out},
                               {"median_us", r.median_us},
                               {"tflops", r.tflops},
                               {"max_rel_err", r.max_rel_err},
                               {"kernel", r.kernel},
                               {"model_us", r.model_us}});
    };
    perf::bench_gemm(cfg, dists, on_start, on_row);
    json.write(out.dump(1) + "\n");
    json.close();
    nlohmann::json offsets = nlohmann::json::object();
    for (const perf::GemmDistribution& d : dists) offsets[d.name] = d.cu;
    const int G = dists.empty() ? 0 : static_cast<int>(dists.front().cu.size());
    offsets_file.write(
        nlohmann::json{{"G", G}, {"H", cfg.H}, {"ffn_hidden", cfg.ffn_hidden}, {"offsets", offsets}}.dump() + "\n");
    offsets_file.close();
}

// The fitted model as the generated C++ include (src/cuda/kernels/gemm_cost_model.inc).
std::string cost_model_include(const perf::GemmCalibration& c) {
    return "// Cost model of the Hopper grouped GEMM's scheduler (src/cuda/kernels/grouped_gemm_sm90.cu): the time one "
           "SM spends\n// on a 128 x 256 output tile is c_tile + c_kblock * (k-blocks of 64). GENERATED by `evenep "
           "bench gemm --calibrate\n// --write-model <this file>` (docs/benchmarks.md, \"Grouped GEMM cost "
           "model\"); do not edit by hand.\n" +
           fmt::format("// Device: {} ({} SMs). Max fit residual: forward {:.1f}%, wgrad {:.1f}%.\n", c.device, c.sms,
                       100 * c.fwd_residual, 100 * c.wgrad_residual) +
           fmt::format("constexpr float kCostKBlockUs = {:.5f}f;\n", c.fwd_c_kblock) +
           fmt::format("constexpr float kCostKBlockWgradUs = {:.5f}f;\n", c.wgrad_c_kblock) +
           fmt::format("constexpr float kCostTileUs = {:.4f}f;\n", std::max(c.fwd_c_tile, 0.0)) +
           fmt::format("constexpr float kCostTileWgradUs = {:.4f}f;\n", std::max(c.wgrad_c_tile, 0.0)) +
           fmt::format(
               "constexpr const char* kCostModelSource = \"calibrated on {} by evenep bench gemm "
               "--calibrate\";\n",
               c.device);
}

// `evenep bench gemm --calibrate` (perf::calibrate_gemm): prints every point and the fits, writes the include.
void run_calibration(const GemmCliOptions& o) {
    OutputFile json("--json", o.json_file);
    OutputFile model("--write-model", o.write_model);
    fmt::print("{:<6} {:>4} {:>8} {:>10} {:>12}\n", "op", "kb", "groups", "call us", "us per tile");  // call: 48/SM
    nlohmann::json points = nlohmann::json::array();
    const perf::GemmCalibration c =
        perf::calibrate_gemm(o.bench.warmup, o.bench.iters, [&](const perf::GemmCalibrationPoint& p) {
            fmt::print("{:<6} {:>4} {:>8} {:>10.1f} {:>12.3f}\n", p.op, p.kblocks, p.groups, p.call_us, p.tile_us);
            points.push_back({{"op", p.op}, {"kblocks", p.kblocks}, {"call_us", p.call_us}, {"tile_us", p.tile_us}});
        });
    fmt::print("fit forward: c_tile {:.3f} us + c_kblock {:.4f} us x kb (max residual {:.1f}%)\n", c.fwd_c_tile,
               c.fwd_c_kblock, 100 * c.fwd_residual);
    fmt::print("fit wgrad:   c_tile {:.3f} us + c_kblock {:.4f} us x kb (max residual {:.1f}%)\n", c.wgrad_c_tile,
               c.wgrad_c_kblock, 100 * c.wgrad_residual);
    if (model.active()) {
        model.write(cost_model_include(c));
        model.close();
        fmt::print("wrote {}\n", o.write_model);
    }
    json.write(
        nlohmann::json{
            {"device", c.device},
            {"points", points},
            {"fwd", {{"c_tile", c.fwd_c_tile}, {"c_kblock", c.fwd_c_kblock}, {"max_residual", c.fwd_residual}}},
            {"wgrad", {{"c_tile", c.wgrad_c_tile}, {"c_kblock", c.wgrad_c_kblock}, {"max_residual", c.wgrad_residual}}}}
            .dump(1) +
        "\n");
    json.close();
}

#endif

}  // namespace

void register_bench_gemm(CLI::App& bench) {
    auto o = std::make_shared<GemmCliOptions>();
    CLI::App* cmd = bench.add_subcommand("gemm", "GPU grouped GEMM of the expert FFN (fixed vs load-aware schedule)");
    add_int(*cmd, "--R", o->bench.R, "ranks (for the planner's row counts)", 1, kMaxRanks);
    add_int(*cmd, "--E", o->bench.E, "routed experts", 1, kMaxExperts);
    add_int(*cmd, "--K", o->bench.K, "top-k", 1, 32);
    add_int(*cmd, "--S", o->bench.S, "tokens per rank", 1, std::numeric_limits<int>::max());
    add_int(*cmd, "--H", o->bench.H, "hidden size", 1, kMaxHidden);
    add_int(*cmd, "--ffn-hidden", o->bench.ffn_hidden, "expert intermediate size H'", 1, kMaxHidden);
    add_int(*cmd, "--tp", o->bench.tp, "token padding", 1, kMaxTokenPad);
    add_reals(*cmd, "--maxvio", o->bench.maxvios, "target maxvio values (planner rows of rank 0)", 0,
              std::numeric_limits<double>::infinity());
    add_real(*cmd, "--zipf", o->bench.zipf, "Zipf exponent of the extra split (<= 0: none)", -1000, 1000)
        ->capture_default_str();
    add_u64(*cmd, "--seed", o->bench.seed, "routing and data seed");
    cmd->add_option(
           "--ops", o->bench.ops,
           "any of fwd, dgrad, dgrad_f32 (fp32 output, the layer's dgrads; timing only), wgrad (dW += x^T dy into "
           "fp32), wgrad_set (dW = x^T dy, no read); wgrad --check: 8 sampled elements; fp8_fwd, fp8_dgrad (CUTLASS "
           "FP8 grouped GEMM, 1x128 / 128x128 block-scaled, with CUTLASS's consumer loop and with EvenEP's overlapped "
           "one, then the 128x256-tile candidate and CUTLASS's unscaled FP8 anchor where the tuning candidates are "
           "built; timing only, not checked), fp8_wgrad (FP8 wgrad from the wgrad cols casts, dW += into fp32; a "
           "tuning candidate, EVENEP_CUTLASS_CANDIDATES)")
        ->capture_default_str();
    add_int(*cmd, "--warmup", o->bench.warmup, "untimed runs", 0, 1000000);
    add_int(*cmd, "--iters", o->bench.iters, "timed runs (median reported)", 1, 1000000);
    add_real(*cmd, "--warm-seconds", o->bench.warm_seconds,
             "GPU warm-up before the first timed row (clocks out of idle; the schedules are then timed interleaved)", 0,
             600)
        ->capture_default_str();
    cmd->add_flag("--check", o->bench.check, "compare schedules bitwise and sample 16 elements against the host");
    add_output_file(*cmd, "--json", o->json_file, "write all rows as JSON");
    add_output_file(*cmd, "--offsets-json", o->offsets_file,
                    "write each distribution's cu_seqlens (for gemm_anchor.py)");
    cmd->add_option("--kernels", o->bench.kernels,
                    "any of wgmma (Hopper kernel, fixed and load-aware schedules), mma (portable kernel), cutlass "
                    "(CUTLASS cooperative grouped GEMM, fixed and load-aware), cutlass_pingpong (CUTLASS ping-pong, "
                    "load-aware; a tuning candidate, EVENEP_CUTLASS_CANDIDATES); kernels not built or not supported "
                    "by the device are left out")
        ->capture_default_str();
    cmd->add_flag("--calibrate", o->calibrate,
                  "fit the scheduler's cost model (us per tile = c_tile + c_kblock * k-blocks) on this GPU");
    add_output_file(*cmd, "--write-model", o->write_model,
                    "with --calibrate: write the fitted model as a C++ include (src/cuda/kernels/gemm_cost_model.inc)");
    o->limits.add_to(*cmd);
    set_run(cmd, [o]() {
        for (const std::string& op : o->bench.ops)
            EVENEP_CHECK(op == "fwd" || op == "dgrad" || op == "dgrad_f32" || op == "wgrad" || op == "wgrad_set" ||
                             op == "fp8_fwd" || op == "fp8_dgrad" || op == "fp8_wgrad",
                         "bench gemm: --ops entry '", op,
                         "' must be fwd, dgrad, dgrad_f32, wgrad, wgrad_set, fp8_fwd, fp8_dgrad or fp8_wgrad");
        for (const std::string& k : o->bench.kernels)
            EVENEP_CHECK(k == "wgmma" || k == "mma" || k == "cutlass" || k == "cutlass_pingpong",
                         "bench gemm: --kernels entry '", k, "' must be wgmma, mma, cutlass or cutlass_pingpong");
        check_estimate("bench gemm", gemm_host_estimate(o->bench), o->limits);
        require_cuda_device("bench gemm");
#if defined(EVENEP_HAVE_CUDA)
        if (o->calibrate)
            run_calibration(*o);
        else
            run_gemm_bench(*o);
#else
        EVENEP_CHECK(false, "bench gemm needs a CUDA build (configure with EVENEP_CUDA=ON on a machine with nvcc)");
#endif
    });
}

}  // namespace evenep::cli
