// `evenep bench dispatch|combine|prefetch|reduce|gpu-plan|gpu-copy|gpu-suite`: the GPU benchmarks (R virtual ranks on
// one GPU). Each run measures the copy-bandwidth anchor first and reports every kernel against it. Method and
// formulas: docs/benchmarks.md. Without a CUDA build the subcommands exist and say that they need one.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.hpp"
#include "common.hpp"
#include "evenep/config.hpp"
#include "evenep/error.hpp"
#if defined(EVENEP_HAVE_CUDA)
#include "perf/cuda/bench.hpp"
#endif

namespace evenep::cli {
namespace {

struct GpuBenchOptions {
    int R = 8, E = 384, K = 8, S = 8192, H = 7168, ffn_hidden = 2048, tp = 128;
    std::vector<double> maxvios{0.2, 1, 10, 20};
    uint64_t seed = 1;
    int sm_budget = 32;
    int warmup = 5, iters = 20;
    bool check = false;
    bool graph = false;
    bool fp8 = false;  // bench dispatch --fp8
    std::string planner = "optimized";
    double slack = 0;
    std::string policy;  // --policy (apply_policy; docs/auto.md)
    std::vector<std::string>
        policies;                      // gpu-plan: --policy P... (several: each point under each, and their difference)
    CLI::Option* opt_slack = nullptr;  // --slack, to tell whether it was given
    int projections = 3;
    double copy_mib = 2048;
    std::string json_file;
    std::string npy_dir;  // gpu-suite: rank 0's routing per point, for the PyTorch anchor
    std::string routing;  // a routing [R, S, K] int32 .npy instead of the generator (one point)
    ResourceLimits limits;
};

// The host side of a GPU benchmark, checked before the device is touched (so it holds on any machine): per point
// one routing per maxvio (routing_near_maxvio) and the host plan (estimate.hpp), plus the host copy of the tokens
// (R*S*H bf16). Device memory is checked by the benchmark against what the device reports. Unverified on a
// device here (docs/estimates.md).
Estimate gpu_host_estimate(const GpuBenchOptions& o, const std::vector<std::array<int, 5>>& points) {
    Estimate e;
    for (const auto& [R, E, K, S, H] : points) {
        Estimate point;
        add_near_maxvio_estimate(R, E, K, S, static_cast<int>(std::max<size_t>(1, o.maxvios.size())), point);
        point.add_bytes(plan_bytes(R, E) + 4.0 * R * E, fmt::format("host plan of R*E = {} pairs", R * E));
        point.add_bytes(2.0 * R * S * H, "host tokens R*S*H bf16");
        const size_t runs = o.maxvios.size() * std::max<size_t>(1, o.policies.size());  // a run per point and policy
        point.add_seconds(runs * (o.warmup + o.iters + 1) * plan_seconds(R, E), "host plans");
        e.add_stage(point);
    }
    return e;
}

void add_common(CLI::App* cmd, GpuBenchOptions& o, bool shape_flags, bool policies = false) {
    if (shape_flags) {
        add_int(*cmd, "--R", o.R, "virtual ranks", 1, kMaxRanks);
        add_int(*cmd, "--E", o.E, "routed experts", 1, kMaxExperts);
        add_int(*cmd, "--K", o.K, "top-k", 1, 32);
        add_int(*cmd, "--S", o.S, "tokens per rank", 1, std::numeric_limits<int>::max());
        add_int(*cmd, "--H", o.H, "hidden size", 1, kMaxHidden);
        add_int(*cmd, "--ffn-hidden", o.ffn_hidden, "expert intermediate size H'", 1, kMaxHidden);
        add_int(*cmd, "--tp", o.tp, "token padding", 1, kMaxTokenPad);
        add_reals(*cmd, "--maxvio", o.maxvios, "target maxvio values", 0, std::numeric_limits<double>::infinity());
        add_u64(*cmd, "--seed", o.seed, "routing seed");
        add_input_file(*cmd, "--routing", o.routing,
                       "use this routing (int32 [R, S, K] .npy, -1 = masked; R, S, K must match) instead of "
                       "generating one per --maxvio")
            ->excludes("--maxvio");
        add_string(*cmd, "--planner", o.planner, "reference or optimized")
            ->check(CLI::IsMember({"reference", "optimized"}))
            ->capture_default_str();
        o.opt_slack = add_real(*cmd, "--slack", o.slack,
                               "imbalance budget eps (docs/slack.md); with --policy auto the largest", 0, 1);
        if (policies)
            cmd->add_option("--policy", o.policies,
                            "planner policies: exact, slack (budget --slack) or auto (largest budget --slack, default "
                            "0.1; docs/auto.md); default: slack if --slack > 0, else exact. Several (e.g. --policy "
                            "exact auto): every point planned under each in turn, then each row's p50 difference to "
                            "the first policy's (exact ignores --slack then)")
                ->check(CLI::IsMember({"auto", "exact", "slack"}))
                ->expected(1, 3);
        else
            add_policy_option(*cmd, o.policy);
        add_int(*cmd, "--projections", o.projections, "prefetch/reduce: projections per copy (1..3)", 1, 3);
    }
    add_int(*cmd, "--sm-budget", o.sm_budget, "SMs per virtual rank (clamped to co-residency)", 1, 1 << 16);
    add_int(*cmd, "--warmup", o.warmup, "untimed runs", 0, 1000000);
    add_int(*cmd, "--iters", o.iters, "timed runs (median reported)", 1, 1000000);
    cmd->add_flag("--check", o.check, "verify results first and report #wrong");
    cmd->add_flag("--graph", o.graph, "also time each op as CUDA graph replays (rows <op>_graph)");
    add_real(*cmd, "--copy-mib", o.copy_mib, "size of the copy-bandwidth anchor buffer", 1, 1 << 20)
        ->capture_default_str();
    add_output_file(*cmd, "--json", o.json_file, "write all rows as JSON");
    o.limits.add_to(*cmd);
}

#if defined(EVENEP_HAVE_CUDA)

using perf::BenchConfig;
using perf::BenchRow;

nlohmann::json to_json(const BenchRow& r) {
    return nlohmann::json{{"op", r.op},
                          {"shape", r.shape},
                          {"maxvio", r.maxvio},
                          {"min_us", r.min_us},
                          {"median_us", r.median_us},
                          {"mean_us", r.mean_us},
                          {"max_us", r.max_us},
                          {"bytes", r.bytes},
                          {"gbps", r.gbps},
                          {"frac_copy", r.frac_copy},
                          {"wrong", r.wrong},
                          {"blocks_per_rank", r.blocks_per_rank},
                          {"iters", r.iters},
                          {"note", r.note}};
}

void print_header() {
    fmt::print("{:<22} {:<26} {:>6} {:>10} {:>10} {:>10} {:>9} {:>8} {:>6} {:>6} {:>5}\n", "op", "shape", "maxvio",
               "p50 us", "min us", "max us", "MB", "GB/s", "%copy", "wrong", "blk/r");
}

void print_row(const BenchRow& r) {
    fmt::print("{:<22} {:<26} {:>6.2f} {:>10.1f} {:>10.1f} {:>10.1f} {:>9.1f} {:>8.0f} {:>6.1f} {:>6} {:>5}\n", r.op,
               r.shape, r.maxvio, r.median_us, r.min_us, r.max_us, r.bytes / 1e6, r.gbps, 100.0 * r.frac_copy,
               r.wrong < 0 ? std::string("-") : std::to_string(r.wrong), r.blocks_per_rank);
}

// Several policies at one point: each row's p50 under every policy after the first, minus the first's (the same op
// under each; e.g. auto - exact, the auto decision's cost in the planner). Printed and in the JSON's policy_diff.
void print_policy_diff(const std::vector<std::string>& policies,
                       const std::vector<std::vector<BenchRow>>& by_policy,
                       const char* shape_name,
                       double target_maxvio,
                       nlohmann::json& out) {
    for (size_t p = 1; p < policies.size(); ++p) {
        fmt::print("{} - {} (p50 us):\n", policies[p], policies[0]);
        fmt::print("{:<28} {:>6} {:>10} {:>10} {:>10}\n", "op", "maxvio", policies[0], policies[p], "diff");
        for (const BenchRow& b : by_policy[p]) {
            const BenchRow* a = nullptr;
            for (const BenchRow& r : by_policy[0])
                if (r.op == b.op) a = &r;
            if (a == nullptr) continue;
            const double diff = b.median_us - a->median_us;
            fmt::print("{:<28} {:>6.2f} {:>10.1f} {:>10.1f} {:>+10.1f}\n", b.op, b.maxvio, a->median_us, b.median_us,
                       diff);
            out["policy_diff"].push_back(nlohmann::json{{"op", b.op},
                                                        {"shape_name", shape_name},
                                                        {"target_maxvio", target_maxvio},
                                                        {"maxvio", b.maxvio},
                                                        {"base", policies[0]},
                                                        {"policy", policies[p]},
                                                        {"base_median_us", a->median_us},
                                                        {"median_us", b.median_us},
                                                        {"diff_us", diff}});
        }
    }
    std::fflush(stdout);
}

struct Shape {
    const char* name;
    int R, E, K, S, H, ffn_hidden;
};

// Runs `ops` at every maxvio of every shape; prints, collects JSON; returns the number of wrong results.
int64_t run(const GpuBenchOptions& o, const std::vector<Shape>& shapes, const std::vector<std::string>& ops) {
    // The JSON target is checked before the run (a bad path fails in seconds) and written atomically at the end.
    OutputFile json("--json", o.json_file);     // inactive when no path was given
    OutputDir npy_dir("--npy-dir", o.npy_dir);  // a temporary folder, moved into place at the end
    fmt::print("device: {}\n", perf::device_summary());
    nlohmann::json out{{"device", perf::device_summary()}, {"rows", nlohmann::json::array()}};
    const std::vector<BenchRow> anchors =
        perf::bench_copy(static_cast<size_t>(o.copy_mib * (1 << 20)), o.warmup, o.iters);
    const double copy_gbps = perf::copy_anchor_gbps(anchors);
    print_header();
    for (const BenchRow& r : anchors) {
        print_row(r);
        out["rows"].push_back(to_json(r));
    }
    out["copy_gbps"] = copy_gbps;
    int64_t wrong = 0;
    // The policies each point is planned under (gpu-plan's --policy P...; otherwise the one --policy).
    const std::vector<std::string> policies = o.policies.empty() ? std::vector<std::string>{o.policy} : o.policies;
    const bool several = policies.size() > 1;
    const bool slack_given = o.opt_slack != nullptr && o.opt_slack->count() > 0;
    for (const Shape& sh : shapes)
        for (double mv : o.routing.empty() ? o.maxvios : std::vector<double>{0.0}) {  // a given routing: one point
            std::vector<std::vector<BenchRow>> by_policy;
            for (const std::string& policy : policies) {
                BenchConfig bc;
                bc.R = sh.R, bc.E = sh.E, bc.K = sh.K, bc.S = sh.S, bc.H = sh.H, bc.ffn_hidden = sh.ffn_hidden;
                bc.tp = o.tp;
                bc.maxvio = mv;
                bc.seed = o.seed;
                bc.sm_budget = o.sm_budget;
                bc.warmup = o.warmup;
                bc.iters = o.iters;
                bc.check = o.check;
                bc.graph = o.graph;
                bc.fp8 = o.fp8;
                bc.mode = parse_planner_mode(o.planner);
                // Several policies: exact plans with budget 0 whatever --slack (the others' budget).
                const bool exact_beside = several && policy == "exact";
                bc.slack = exact_beside ? 0.0 : o.slack;
                bc.policy = apply_policy(policy, slack_given && !exact_beside, bc.slack);
                bc.expert_projections = o.projections;
                bc.routing_in = o.routing;
                if (npy_dir.active())
                    bc.routing_npy = npy_dir.file(fmt::format("routing_{}_maxvio{}.npy", sh.name, mv));
                if (several) fmt::print("policy {} (slack {:g})\n", policy, bc.slack);
                by_policy.push_back(perf::bench_point(bc, ops, copy_gbps));
                for (const BenchRow& r : by_policy.back()) {
                    print_row(r);
                    std::fflush(stdout);
                    nlohmann::json j = to_json(r);
                    j["shape_name"] = sh.name;
                    j["target_maxvio"] = mv;
                    if (several) j["policy"] = policy;
                    out["rows"].push_back(j);
                    if (r.wrong > 0) wrong += r.wrong;
                }
            }
            if (several) print_policy_diff(policies, by_policy, sh.name, mv, out);
        }
    npy_dir.close();
    json.write(out.dump(2) + "\n");
    json.close();
    if (o.check) fmt::print("check: {} wrong\n", wrong);
    return wrong;
}

void finish(int64_t wrong) {
    EVENEP_CHECK_KIND(ErrorKind::kRuntime, wrong == 0, "bench: --check found ", wrong, " wrong results");
}

#endif  // EVENEP_HAVE_CUDA

void add_gpu_command(
    CLI::App& bench, const char* name, const char* help, std::vector<std::string> ops, bool plan_only) {
    auto opt = std::make_shared<GpuBenchOptions>();
    CLI::App* cmd = bench.add_subcommand(name, help);
    add_common(cmd, *opt, true, plan_only);
    if (std::string(name) == "dispatch")
        cmd->add_flag("--fp8", opt->fp8,
                      "the FP8 dispatch (e4m3 rows + 1x128 fp32 scales; H a multiple of 128): rows dispatch_fp8 "
                      "(quantised in the send, into the buffers), dispatch_fp8_rows (into caller-owned codes and "
                      "scales, as the PyTorch op) and dispatch_fp8_quantised (from rows the caller quantised, as "
                      "DeepEP's (x_fp8, scales)); not checked by --check (gpu_fp8_dispatch_test checks the bytes)");
    set_run(cmd, [opt, ops, plan_only, name] {
        const int hidden = plan_only ? 8 : opt->H;  // as run() below
        check_estimate(fmt::format("bench {}", name),
                       gpu_host_estimate(*opt, {{opt->R, opt->E, opt->K, opt->S, hidden}}), opt->limits);
        require_cuda_device(fmt::format("bench {}", name));
#if defined(EVENEP_HAVE_CUDA)
        GpuBenchOptions o = *opt;
        const int H = plan_only ? 8 : o.H;  // the planner does not touch rows
        finish(run(o, {{"custom", o.R, o.E, o.K, o.S, H, o.ffn_hidden}}, ops));
#else
        (void)ops, (void)plan_only;
        EVENEP_CHECK_KIND(ErrorKind::kRuntime, false, "bench ", name,
                          ": needs a CUDA build (this evenep was built without the CUDA backend)");
#endif
    });
}

}  // namespace

void register_bench_cuda(CLI::App& bench) {
    add_gpu_command(bench, "dispatch", "GPU dispatch over R virtual ranks vs the copy bandwidth", {"dispatch"}, false);
    add_gpu_command(bench, "combine", "GPU combine (pull, push partials, weighted) vs the copy bandwidth", {"combine"},
                    false);
    add_gpu_command(bench, "prefetch", "GPU prefetch_weight vs the copy bandwidth", {"prefetch"}, false);
    add_gpu_command(bench, "reduce", "GPU reduce_grad vs the copy bandwidth", {"reduce"}, false);
    add_gpu_command(bench, "gpu-plan",
                    "GPU planner: one rank's plan from gathered histograms (one block: plan_rank; a cluster of 8 "
                    "blocks: plan_rank_cluster, early launches, and plan_rank_cluster_serialized), and Ep::plan of "
                    "all ranks (plan_fused: the default cluster planner; plan_fused_block: the one-block planner)",
                    {"plan"}, true);

    auto opt = std::make_shared<GpuBenchOptions>();
    CLI::App* suite = bench.add_subcommand(
        "gpu-suite",
        "every GPU benchmark at the MoonEP point (R=8 S=8192 E=384 K=8 H=7168 H'=2048) and the K3 shape "
        "(E=896 K=16 H=3584), maxvio 0.2/1/10/20");
    add_common(suite, *opt, false);
    add_reals(*suite, "--maxvio", opt->maxvios, "target maxvio values", 0, std::numeric_limits<double>::infinity());
    add_output_dir(*suite, "--npy-dir", opt->npy_dir,
                   "write rank 0's routing of every point here (PyTorch anchor; created when missing)");
    add_int(*suite, "--projections", opt->projections, "prefetch/reduce: projections per copy (1..3)", 1, 3);
    set_run(suite, [opt] {
        check_estimate("bench gpu-suite", gpu_host_estimate(*opt, {{8, 384, 8, 8192, 7168}, {8, 896, 16, 8192, 3584}}),
                       opt->limits);
        require_cuda_device("bench gpu-suite");
#if defined(EVENEP_HAVE_CUDA)
        finish(run(*opt, {{"moonep", 8, 384, 8, 8192, 7168, 2048}, {"k3", 8, 896, 16, 8192, 3584, 2048}},
                   {"plan", "dispatch", "combine", "prefetch", "reduce"}));
#else
        EVENEP_CHECK_KIND(ErrorKind::kRuntime, false, "bench gpu-suite: needs a CUDA build");
#endif
    });
    auto copy_opt = std::make_shared<GpuBenchOptions>();
    CLI::App* copy = bench.add_subcommand("gpu-copy", "device-to-device copy bandwidth anchors");
    add_common(copy, *copy_opt, false);
    set_run(copy, [copy_opt] {
        require_cuda_device("bench gpu-copy");
#if defined(EVENEP_HAVE_CUDA)
        GpuBenchOptions o = *copy_opt;
        o.maxvios.clear();
        finish(run(o, {}, {}));
#else
        EVENEP_CHECK_KIND(ErrorKind::kRuntime, false, "bench gpu-copy: needs a CUDA build");
#endif
    });
}

}  // namespace evenep::cli
