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
#include "workload_common.hpp"

namespace evenep::cli {

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
                             "--llep-threshold", "--placed", "--plan-us", "--gemm-tflops", "--group-us", "--link-gbps"})
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
    const perf::WorkloadRunConfig rc = workload_run_config(
        o, Config{.R = R, .E = E, .K = shape.K, .S = shape.S, .B = -1, .tp = shape.tp}, shape.H, shape.ffn_hidden,
        shape.redundant_given ? std::vector<int>{shape.redundant} : std::vector<int>{}, shape.eplb_sync,
        shape.planner, from_trace ? trace.L : 1, shape.slack_given ? shape.slack : kAutoDefaultSlack);
    StepSource source = from_trace ? StepSource(std::move(trace), o.steps, shape.K, shape.S)
                                   : StepSource(WorkloadSpec{.kind = parse_workload(o.workload),
                                                             .E = E,
                                                             .K = shape.K,
                                                             .num_tokens = static_cast<int64_t>(R) * shape.S,
                                                             .seed = shape.seed},
                                                R, o.steps, o.micro_batches);
    perf::WorkloadRunner runner(rc);  // validates everything before the run
    OutputFile json("--json", shape.json_file);
    const int T = source.steps(), M = source.micro_batches();
    fmt::print("EvenEP workload run: {} {}, {} steps x {} unit(s); R={} E={} K={} S={} H={} H'={} tp={} planner={} "
               "seed={}; EPLB every {} steps on a window of {}, replica sync {}; LPLB {}; plan {} us; model {} TFLOP/s, "
               "{:.1f} us per group, link {} GB/s\n",
               from_trace ? "trace" : "workload", from_trace ? o.trace : o.workload, T, rc.layers * M, R, E, shape.K,
               shape.S, shape.H, shape.ffn_hidden, shape.tp, shape.planner, shape.seed, o.eplb_interval, o.eplb_window,
               shape.eplb_sync, runner.series()[runner.series().size() - 2].topology, o.plan_us, o.gemm_tflops,
               rc.model.group_cost_us(), o.link_gbps);
    const double t0 = now_seconds();
    for (int t = 0; t < source.steps(); ++t) runner.run_step(t, source.units(t));
    const double seconds = now_seconds() - t0;
    std::vector<const perf::SystemSeries*> table;
    for (const perf::SystemSeries& s : runner.series()) table.push_back(&s);
    print_workload_table(table, "step time of the model (perf/step_model.hpp)");
    fmt::print("total {:.1f} s\n", seconds);
    nlohmann::json systems = nlohmann::json::array();
    for (const perf::SystemSeries& s : runner.series()) systems.push_back(system_json(s, rc));
    nlohmann::json j = workload_run_json(o, source, rc, shape.seed, shape.planner);
    j["systems"] = systems;
    j["seconds"] = seconds;
    json.write(j.dump(1) + "\n");
    json.close();
}

}  // namespace evenep::cli
