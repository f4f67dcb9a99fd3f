// `evenep simulate --workload W | --trace F` (simulate_workload.hpp).
#include "simulate_workload.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "common.hpp"
#include "evenep/error.hpp"
#include "evenep/trace.hpp"
#include "evenep/workloads.hpp"
#include "perf/workload_run.hpp"

namespace evenep::cli {
namespace {

// The q-quantile of v (nearest rank: the smallest value with at least q of the values at or below it).
double quantile(std::vector<double> v, double q) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    const size_t i = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
    return v[std::min(v.size() - 1, i == 0 ? 0 : i - 1)];
}

double mean(const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return v.empty() ? 0 : s / static_cast<double>(v.size());
}

nlohmann::json system_json(const perf::SystemSeries& s, const perf::WorkloadRunConfig& rc) {
    nlohmann::json params = nlohmann::json::object();
    if (s.name == "eplb" || s.name == "lplb") {
        params["step_interval"] = rc.eplb_schedule.step_interval;
        params["window"] = rc.eplb_schedule.window;
        params["replica_sync"] = perf::to_string(rc.eplb_sync);
    }
    if (s.name == "eplb") params["num_redundant"] = s.num_redundant;
    if (s.name == "lplb") params["topology"] = s.topology;
    if (s.name == "llep") params["threshold"] = rc.llep_threshold;
    if (s.name == "evenep_auto") params["max_slack"] = rc.auto_slack;
    if (s.name != "conventional" && s.name != "eplb") params["plan_us"] = rc.plan_us;
    nlohmann::json j{
        {"name", s.name},
        {"label", s.label},
        {"params", params},
        {"step_ms", s.step_ms},
        {"rows_max_over_mean", s.rows_max_over_mean},
        {"summary",
         {{"median_ms", median(s.step_ms)}, {"p90_ms", quantile(s.step_ms, 0.9)}, {"max_ms", quantile(s.step_ms, 1)}}},
        {"token_bytes", s.token_bytes},
        {"weight_bytes", s.weight_bytes},
        {"grad_bytes", s.grad_bytes},
        {"rows", s.rows}};
    if (s.name == "evenep_auto") j["slack_ppm"] = s.slack_ppm;  // per step: the mean budget its units chose
    return j;
}

void print_table(const std::vector<perf::SystemSeries>& series) {
    const perf::SystemSeries& exact = *std::find_if(
        series.begin(), series.end(), [](const perf::SystemSeries& s) { return s.name == "evenep_exact"; });
    const double ev_med = median(exact.step_ms), ev_p90 = quantile(exact.step_ms, 0.9);
    fmt::print("{:<14} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}\n", "system", "median ms", "p90 ms", "max ms",
               "rows imb", "med/evn", "p90/evn");
    for (const perf::SystemSeries& s : series) {
        const double med = median(s.step_ms), p90 = quantile(s.step_ms, 0.9);
        fmt::print("{:<14} {:>10.3f} {:>10.3f} {:>10.3f} {:>10.4f} {:>9.3f}x {:>9.3f}x\n", s.label, med, p90,
                   quantile(s.step_ms, 1), mean(s.rows_max_over_mean), med / ev_med, p90 / ev_p90);
    }
    fmt::print(
        "columns: step time of the model (perf/step_model.hpp) over the steps: median, p90, max; rows imb = mean over "
        "steps of max/mean per-rank rows; med/evn, p90/evn = the system's median (p90) over evenep_exact's (> 1: "
        "EvenEP faster); evenep_auto = the auto planner policy (docs/auto.md), mean budget {:.4f}.\n",
        mean(series[0].slack_ppm) * 1e-6);
}

}  // namespace

void add_workload_options(CLI::App& cmd, WorkloadOptions& o) {
    std::string names;
    for (const WorkloadInfo& w : workload_list()) names += (names.empty() ? "" : ", ") + std::string(w.name);
    cmd.add_option(
           "--workload", o.workload,
           "run every system (evenep_auto, evenep_exact, conventional, eplb, lplb, llep) over --steps steps of this "
           "workload (`evenep workloads`): " +
               names)
        ->check(CLI::IsMember([] {
            std::vector<std::string> v;
            for (const WorkloadInfo& w : workload_list()) v.emplace_back(w.name);
            return v;
        }()));
    add_input_file(cmd, "--trace", o.trace,
                   "replay a router trace .npy [T, R, E] or [T, L, R, E] through every system (docs/traces.md)");
    cmd.get_option("--workload")->excludes(cmd.get_option("--trace"));
    add_int(cmd, "--steps", o.steps, "workload: steps; trace: the first steps (0 = all)", 0, 1000000)
        ->capture_default_str();
    add_int(cmd, "--micro-batches", o.micro_batches, "workload: micro-batches per step (each planned on its own)", 1,
            1024)
        ->capture_default_str();
    add_int(cmd, "--eplb-interval", o.eplb_interval, "workload/trace: EPLB (and LPLB) re-placed every this many steps",
            1, 1000000)
        ->capture_default_str();
    add_int(cmd, "--eplb-window", o.eplb_window, "workload/trace: from the loads of this many past steps", 1, 1000000)
        ->capture_default_str();
    cmd.add_option("--lplb-topology", o.lplb_topology,
                   "workload/trace: LPLB's replica graph (auto: hypercube for R a power of two, else torus)")
        ->check(CLI::IsMember({"auto", "hypercube", "cube", "torus", "ring"}))
        ->capture_default_str();
    add_real(cmd, "--llep-threshold", o.llep_threshold, "workload/trace: LLEP spills above threshold x the fair share",
             1, 1e6)
        ->capture_default_str();
    add_real(cmd, "--plan-us", o.plan_us,
             "workload/trace: per-unit planning time of evenep_auto, evenep_exact, lplb and llep", 0, 1e9)
        ->capture_default_str();
    add_real(cmd, "--gemm-tflops", o.gemm_tflops, "workload/trace: step model's grouped-GEMM TFLOP/s", 1e-6, 1e9)
        ->capture_default_str();
    add_real(cmd, "--group-us", o.group_us, "workload/trace: step model's per-group cost (-1: wgrad tile overhead)", -1,
             1e9)
        ->capture_default_str();
    add_real(cmd, "--link-gbps", o.link_gbps, "workload/trace: step model's link GB/s per direction", 1e-6, 1e9)
        ->capture_default_str();
}

void check_workload_flags(const CLI::App& cmd, const WorkloadOptions& o) {
    if (o.active()) {
        for (const char* flag : {"--maxvio", "--drift", "--repeat", "--gpu-json"})
            EVENEP_CHECK(cmd.count(flag) == 0, flag, " applies to the R x maxvio grid, not to --workload/--trace");
        // Every run has evenep_auto (largest budget --slack) beside evenep_exact: the only policy that changes it.
        const CLI::Option* policy = cmd.get_option("--policy");
        EVENEP_CHECK(policy->count() == 0 || policy->as<std::string>() == "auto", "--policy ",
                     policy->count() ? policy->as<std::string>() : "",
                     " with --workload/--trace: the run plans "
                     "evenep_auto and evenep_exact side by side (--policy auto, --slack its largest budget)");
        EVENEP_CHECK(o.trace.empty() || cmd.count("--micro-batches") == 0,
                     "--micro-batches applies to --workload (a trace's steps are its rows)");
        return;
    }
    for (const char* flag : {"--steps", "--micro-batches", "--eplb-interval", "--eplb-window", "--lplb-topology",
                             "--llep-threshold", "--plan-us", "--gemm-tflops", "--group-us", "--link-gbps"})
        EVENEP_CHECK(cmd.count(flag) == 0, flag, " applies to --workload or --trace");
}

void run_simulate_workload(const WorkloadOptions& o, const WorkloadShape& shape) {
    const bool from_trace = !o.trace.empty();
    RouterTrace trace;
    int R = 0, E = shape.E;
    if (from_trace) {
        trace = read_trace(o.trace, shape.K, shape.S);
        EVENEP_CHECK(!shape.ranks_given || (shape.ranks.size() == 1 && shape.ranks[0] == trace.R), "--R: the trace '",
                     o.trace, "' has R = ", trace.R);
        EVENEP_CHECK(!shape.experts_given || shape.E == trace.E, "--E = ", shape.E, ": the trace '", o.trace,
                     "' has E = ", trace.E);
        R = trace.R;
        E = trace.E;
    } else {
        EVENEP_CHECK(!shape.ranks_given || shape.ranks.size() == 1, "--R: --workload takes one group size (got ",
                     shape.ranks.size(), ")");
        R = shape.ranks_given ? shape.ranks[0] : 8;
        EVENEP_CHECK(o.steps >= 1, "--steps = ", o.steps, " must be >= 1 with --workload");
    }
    perf::WorkloadRunConfig rc;
    rc.cfg = Config{.R = R, .E = E, .K = shape.K, .S = shape.S, .B = -1, .tp = shape.tp};
    rc.cfg.validate();
    rc.mode = parse_planner_mode(shape.planner);
    rc.model = perf::StepModel{.H = shape.H,
                               .ffn_hidden = shape.ffn_hidden,
                               .tp = shape.tp,
                               .gemm_tflops = o.gemm_tflops,
                               .group_us = o.group_us,
                               .link_gbps = o.link_gbps};
    rc.layers = from_trace ? trace.L : 1;
    rc.plan_us = o.plan_us;
    if (shape.slack_given) rc.auto_slack = shape.slack;
    if (shape.redundant_given) rc.eplb_redundant = {shape.redundant};
    rc.eplb_schedule = perf::EplbSchedule{.step_interval = o.eplb_interval, .window = o.eplb_window};
    rc.eplb_sync = perf::parse_eplb_sync(shape.eplb_sync);
    rc.lplb_topology = o.lplb_topology;
    rc.llep_threshold = o.llep_threshold;
    WorkloadSpec spec;
    if (!from_trace) {
        spec = WorkloadSpec{.kind = parse_workload(o.workload),
                            .E = E,
                            .K = shape.K,
                            .num_tokens = static_cast<int64_t>(R) * shape.S,
                            .seed = shape.seed};
        spec.validate();
    }
    perf::WorkloadRunner runner(rc);  // validates everything before the run
    OutputFile json("--json", shape.json_file);
    const int T = from_trace ? (o.steps > 0 ? std::min(o.steps, trace.T) : trace.T) : o.steps;
    const int M = from_trace ? 1 : o.micro_batches;
    fmt::print("EvenEP workload run: {} {}, {} steps x {} unit(s); R={} E={} K={} S={} H={} H'={} tp={} planner={} "
               "seed={}; EPLB every {} steps on a window of {}, replica sync {}; LPLB {}; plan {} us; model {} TFLOP/s, "
               "{:.1f} us per group, link {} GB/s\n",
               from_trace ? "trace" : "workload", from_trace ? o.trace : o.workload, T, rc.layers * M, R, E, shape.K,
               shape.S, shape.H, shape.ffn_hidden, shape.tp, shape.planner, shape.seed, o.eplb_interval, o.eplb_window,
               shape.eplb_sync, runner.series()[runner.series().size() - 2].topology, o.plan_us, o.gemm_tflops,
               rc.model.group_cost_us(), o.link_gbps);
    const double t0 = now_seconds();
    std::vector<std::vector<int32_t>> s_store, tpe_store;
    std::vector<perf::StepUnit> units;
    for (int t = 0; t < T; ++t) {
        s_store.clear();
        tpe_store.clear();
        units.clear();
        if (from_trace) {
            for (int l = 0; l < trace.L; ++l) {
                const std::span<const int32_t> h = trace.histogram(t, l);
                tpe_store.emplace_back(h.begin(), h.end());
                std::vector<int32_t> s(R);
                for (int r = 0; r < R; ++r) {
                    int64_t sum = 0;
                    for (int e = 0; e < E; ++e) sum += h[static_cast<size_t>(r) * E + e];
                    s[r] = static_cast<int32_t>(std::clamp<int64_t>((sum + shape.K - 1) / shape.K, 1, shape.S));
                }
                s_store.push_back(std::move(s));
            }
        } else {
            for (int mb = 0; mb < M; ++mb) {
                WorkloadHistogram h = workload_histogram(spec, R, t, mb);
                tpe_store.push_back(std::move(h.tpe));
                s_store.push_back(std::move(h.s));
            }
        }
        for (size_t u = 0; u < tpe_store.size(); ++u)
            units.push_back({.layer = from_trace ? static_cast<int>(u) : 0, .tpe = tpe_store[u], .s = s_store[u]});
        runner.run_step(t, units);
    }
    const double seconds = now_seconds() - t0;
    print_table(runner.series());
    fmt::print("total {:.1f} s\n", seconds);
    nlohmann::json systems = nlohmann::json::array();
    for (const perf::SystemSeries& s : runner.series()) systems.push_back(system_json(s, rc));
    nlohmann::json j{{"schema", "evenep.workload_run/1"},
                     {"workload", from_trace ? nlohmann::json(nullptr) : nlohmann::json(o.workload)},
                     {"trace", from_trace ? nlohmann::json(o.trace) : nlohmann::json(nullptr)},
                     {"steps", T},
                     {"micro_batches", M},
                     {"layers", rc.layers},
                     {"R", R},
                     {"E", E},
                     {"K", shape.K},
                     {"S", shape.S},
                     {"H", shape.H},
                     {"ffn_hidden", shape.ffn_hidden},
                     {"tp", shape.tp},
                     {"seed", shape.seed},
                     {"planner", shape.planner},
                     {"model",
                      {{"gemm_tflops", o.gemm_tflops},
                       {"group_us", rc.model.group_cost_us()},
                       {"link_gbps", o.link_gbps},
                       {"plan_us", o.plan_us}}},
                     {"evenep_auto", {{"policy", "auto"}, {"max_slack", rc.auto_slack}}},
                     {"systems", systems},
                     {"seconds", seconds}};
    json.write(j.dump(1) + "\n");
    json.close();
}

}  // namespace evenep::cli
