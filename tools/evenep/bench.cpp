// `evenep bench`: benchmarks with built-in checks. `bench plan` (CPU planner) lives here; the GPU benchmarks are
// added by register_bench_cuda (bench_cuda.cpp). Method and formulas: docs/benchmarks.md.
#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "common.hpp"
#include "evenep/error.hpp"
#include "evenep/plan.hpp"
#include "evenep/routing.hpp"
#include "evenep/validate.hpp"

namespace evenep::cli {
namespace {

struct BenchPlanOptions {
    std::vector<std::string> shapes{"moonep", "k3"};
    std::vector<double> maxvios{0.2, 1, 10, 20};
    bool maxvio_given = false;  // --maxvio on the command line: an unreachable target is refused (as in plan, a
                                // default target that this shape cannot reach is drawn as close as it gets)
    std::vector<std::string> planners{"reference", "optimized"};
    int warmup = 3;
    int iters = 20;
    bool check = true;
    uint64_t seed = 1;
    std::string json_file;
    ResourceLimits limits;
};

struct Shape {
    std::string name;
    RoutingSpec spec;
};

Shape shape_of(const std::string& name, uint64_t seed) {
    if (name == "moonep") return {name, RoutingSpec{.R = 8, .E = 384, .K = 8, .S = 8192, .seed = seed}};
    if (name == "k3") return {name, RoutingSpec{.R = 64, .E = 896, .K = 16, .S = 8192, .seed = seed}};
    if (name == "small") return {name, RoutingSpec{.R = 8, .E = 64, .K = 4, .S = 512, .seed = seed}};
    EVENEP_CHECK(false, "bench plan: unknown shape '", name, "' (expected moonep, k3 or small)");
}

// Per shape and maxvio one routing (routing_near_maxvio) and per planner warmup + iters plans (the model of
// `evenep plan`, estimate.hpp), iters/4 dst of one rank and, with --check, the validator and every rank's dst
// (~16 B per pair, ~100 ns per entry; validate_dst ~16 B per receive row of the group, R*NvS, and 8 B per
// entry, as in `evenep plan --check`). One routing alive at a time.
Estimate bench_plan_estimate(const BenchPlanOptions& opt) {
    Estimate e;
    for (const std::string& name : opt.shapes) {
        const RoutingSpec sp = shape_of(name, opt.seed).spec;
        const double pairs = static_cast<double>(sp.R) * sp.E, entries = static_cast<double>(sp.R) * sp.S * sp.K;
        const double plans = static_cast<double>(opt.planners.size()) * (opt.warmup + std::max(1, opt.iters));
        const double count = static_cast<double>(opt.maxvios.size());
        Estimate shape;
        add_near_maxvio_estimate(sp.R, sp.E, sp.K, sp.S, static_cast<int>(opt.maxvios.size()), shape);
        const Config cfg{.R = sp.R, .E = sp.E, .K = sp.K, .S = sp.S, .B = -1, .tp = 128};
        const double rows = static_cast<double>(sp.R) * static_cast<double>(cfg.recv_rows());
        shape.add_bytes(plan_bytes(sp.R, sp.E) + 20 * pairs + (opt.check ? 8 * entries + 16 * rows : 0),
                        fmt::format("shape {}: planner and validator state", name));
        shape.add_seconds(count * plans * plan_seconds(sp.R, sp.E), fmt::format("shape {}: {:.0f} plans", name,
                                                                                 count * plans));
        const double dst_seconds = std::max(1, opt.iters / 4) * 55e-9 * entries / sp.R;
        shape.add_seconds(count * opt.planners.size() * (dst_seconds + (opt.check ? 100e-9 * entries : 0)),
                          fmt::format("shape {}: dst and checks", name));
        e.add_stage(shape);
    }
    return e;
}

void run_bench_plan(const BenchPlanOptions& opt) {
    OutputFile json("--json", opt.json_file);  // checked now, written atomically at the end
    for (const std::string& name : opt.shapes)  // the rule of every command: refused, never clamped
        if (opt.maxvio_given) check_maxvio_reachable(shape_of(name, opt.seed).spec, opt.maxvios);
    check_estimate("bench plan", bench_plan_estimate(opt), opt.limits);
    nlohmann::json rows = nlohmann::json::array();
    fmt::print("{:<7} {:>4} {:>4} {:>3} {:>7} {:<9} {:>10} {:>10} {:>10} {:>10} {:>7} {:>7} {:>6}\n", "shape", "R",
               "E", "K", "maxvio", "planner", "plan p50", "plan min", "plan max", "dst/rank", "copies", "traffic",
               "check");
    int failures = 0;
    for (const std::string& shape_name : opt.shapes) {
        const Shape shape = shape_of(shape_name, opt.seed);
        for (double target : opt.maxvios) {
            const Routing routing = routing_near_maxvio(shape.spec, target);
            const std::vector<int32_t> tpe = routing.tpe();
            const Config cfg{.R = routing.R, .E = routing.E, .K = routing.K, .S = routing.S, .B = -1, .tp = 128};
            for (const std::string& mode_name : opt.planners) {
                const PlannerMode mode = parse_planner_mode(mode_name);
                Planner planner(cfg, mode);
                Plan plan;
                for (int i = 0; i < opt.warmup; ++i) planner.plan(tpe, routing.s, plan);
                std::vector<double> t;
                for (int i = 0; i < std::max(1, opt.iters); ++i) {
                    const double t0 = now_seconds();
                    planner.plan(tpe, routing.s, plan);
                    t.push_back(now_seconds() - t0);
                }
                // One rank's dst (rank 0), timed separately: every rank does this for its own tokens.
                std::vector<int32_t> dst0(static_cast<size_t>(routing.s[0]) * cfg.K);
                std::vector<double> td;
                for (int i = 0; i < std::max(1, opt.iters / 4); ++i) {
                    const double t0 = now_seconds();
                    compute_dst(plan, 0, routing.topk_idx[0], dst0);
                    td.push_back(now_seconds() - t0);
                }
                std::string check = "-";
                if (opt.check) {
                    ValidationReport rep = validate_plan(plan);
                    if (rep.ok()) {
                        std::vector<std::vector<int32_t>> dst(cfg.R);
                        for (int r = 0; r < cfg.R; ++r) {
                            dst[r].resize(static_cast<size_t>(routing.s[r]) * cfg.K);
                            compute_dst(plan, r, routing.topk_idx[r], dst[r]);
                        }
                        rep = validate_dst(plan, routing, dst);
                    }
                    check = rep.ok() ? "ok" : "WRONG";
                    if (!rep.ok()) {
                        ++failures;
                        fmt::print(stderr, "{}\n", rep.summary());
                    }
                }
                const double p50 = median(t), mn = *std::min_element(t.begin(), t.end()),
                             mx = *std::max_element(t.begin(), t.end());
                fmt::print("{:<7} {:>4} {:>4} {:>3} {:>7.3f} {:<9} {:>8.1f}us {:>8.1f}us {:>8.1f}us {:>8.1f}us {:>7} "
                           "{:>7} {:>6}\n",
                           shape.name, cfg.R, cfg.E, cfg.K, routing.maxvio(), mode_name, p50 * 1e6, mn * 1e6,
                           mx * 1e6, median(td) * 1e6, plan.cost.total_copies, plan.cost.max_rank_copy_traffic, check);
                rows.push_back({{"shape", shape.name},
                                {"R", cfg.R},
                                {"E", cfg.E},
                                {"K", cfg.K},
                                {"S", cfg.S},
                                {"target_maxvio", target},
                                {"maxvio", routing.maxvio()},
                                {"planner", mode_name},
                                {"plan_us_p50", p50 * 1e6},
                                {"plan_us_min", mn * 1e6},
                                {"plan_us_max", mx * 1e6},
                                {"dst_us_per_rank_p50", median(td) * 1e6},
                                {"total_copies", plan.cost.total_copies},
                                {"max_rank_copy_traffic", plan.cost.max_rank_copy_traffic},
                                {"crossing_rows", plan.cost.crossing_rows},
                                {"check", check}});
            }
        }
    }
    fmt::print("plan = all ranks' plan from the gathered histograms on one CPU thread (every rank runs the same);\n"
               "dst/rank = one rank's encoded destinations for its own tokens. #wrong = {}\n",
               failures);
    json.write(nlohmann::json{{"bench", "plan"}, {"rows", rows}, {"wrong", failures}}.dump(2) + "\n");
    json.close();
    EVENEP_CHECK_KIND(ErrorKind::kInternal, failures == 0, "bench plan: ", failures, " plan(s) failed the check");
}

}  // namespace

void register_bench(CLI::App& app) {
    CLI::App* bench = app.add_subcommand("bench", "Benchmarks with built-in correctness checks (docs/benchmarks.md)");
    bench->require_subcommand(1);
    auto opt = std::make_shared<BenchPlanOptions>();
    CLI::App* plan = bench->add_subcommand(
        "plan", "CPU planner wall time at the MoonEP point (R=8 E=384 K=8 S=8192) and the K3 shape (R=64 E=896 K=16)");
    plan->add_option("--shapes", opt->shapes, "moonep, k3, small")->capture_default_str();
    add_reals(*plan, "--maxvio", opt->maxvios, "routing skews (target maxvio)", 0, 1e6);
    plan->add_option("--planners", opt->planners, "reference, optimized")
        ->check(CLI::IsMember({"reference", "optimized"}))
        ->capture_default_str();
    add_int(*plan, "--warmup", opt->warmup, "untimed runs first", 0, 1000000);
    add_int(*plan, "--iters", opt->iters, "timed runs (median reported)", 1, 1000000);
    add_u64(*plan, "--seed", opt->seed, "routing seed");
    plan->add_option("--check", opt->check, "validate every plan and dst (#wrong)")->capture_default_str();
    add_output_file(*plan, "--json", opt->json_file, "write the rows as JSON (written whole at the end; the old file stays on any error)");
    opt->limits.add_to(*plan);
    set_run(plan, [opt, plan] {
        opt->maxvio_given = plan->count("--maxvio") > 0;
        run_bench_plan(*opt);
    });
    register_bench_cuda(*bench);
}

}  // namespace evenep::cli
