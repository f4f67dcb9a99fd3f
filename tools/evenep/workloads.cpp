// `evenep workloads`: lists the step-sequence workloads (evenep/workloads.hpp); with --write-trace, writes one as a
// router trace .npy (evenep/trace.hpp, docs/traces.md) that `evenep simulate --trace` replays.
#include <fmt/format.h>

#include <memory>

#include "commands.hpp"
#include "common.hpp"
#include "evenep/config.hpp"
#include "evenep/error.hpp"
#include "evenep/trace.hpp"
#include "evenep/workloads.hpp"

namespace evenep::cli {
namespace {

struct WorkloadsOptions {
    std::string write_trace;
    std::string workload = "balanced";
    int steps = 10, micro_batches = 1, R = 8, E = 64, K = 4, S = 512;
    uint64_t seed = 1;
};

void run_workloads(const WorkloadsOptions& o) {
    if (o.write_trace.empty()) {
        for (const WorkloadInfo& w : workload_list()) fmt::print("{:<18} {}\n", w.name, w.summary);
        return;
    }
    const WorkloadSpec spec{.kind = parse_workload(o.workload),
                            .E = o.E,
                            .K = o.K,
                            .num_tokens = static_cast<int64_t>(o.R) * o.S,
                            .seed = o.seed};
    spec.validate();
    Config{.R = o.R, .E = o.E, .K = o.K, .S = o.S}.validate();
    const int64_t rows = static_cast<int64_t>(o.steps) * o.micro_batches;
    EVENEP_CHECK(rows * o.R * o.E <= (int64_t{1} << 31), "--steps x --micro-batches x R x E = ", rows * o.R * o.E,
                 " counts: too large a trace (at most 2^31)");
    RouterTrace t;
    t.T = static_cast<int>(rows);
    t.R = o.R;
    t.E = o.E;
    t.counts.reserve(static_cast<size_t>(rows) * o.R * o.E);
    for (int step = 0; step < o.steps; ++step)
        for (int mb = 0; mb < o.micro_batches; ++mb) {
            const WorkloadHistogram h = workload_histogram(spec, o.R, step, mb);
            t.counts.insert(t.counts.end(), h.tpe.begin(), h.tpe.end());
        }
    write_trace(o.write_trace, t);  // written whole at the end (write_npy: a temporary renamed into place)
    fmt::print("wrote {}: {} x [R={}, E={}] int32 counts of workload {} (K={}, S={}, seed {})\n", o.write_trace, t.T,
               o.R, o.E, o.workload, o.K, o.S, o.seed);
}

}  // namespace

void register_workloads(CLI::App& app) {
    auto opt = std::make_shared<WorkloadsOptions>();
    CLI::App* cmd = app.add_subcommand(
        "workloads",
        "List the step-sequence workloads (routings that move between steps and micro-batches; `simulate --workload`)\n"
        "or, with --write-trace, write one as a router trace .npy [T, R, E] (docs/traces.md).");
    add_output_file(*cmd, "--write-trace", opt->write_trace,
                    "write the workload's histograms as a trace (steps x micro-batches rows, step-major)");
    cmd->add_option("--workload", opt->workload, "workload to write")->capture_default_str();
    add_int(*cmd, "--steps", opt->steps, "steps", 1, 1000000)->capture_default_str();
    add_int(*cmd, "--micro-batches", opt->micro_batches, "micro-batches per step (one trace row each)", 1, 1024)
        ->capture_default_str();
    add_int(*cmd, "--R", opt->R, "ranks", 1, kMaxRanks)->capture_default_str();
    add_int(*cmd, "--E", opt->E, "experts", 1, kMaxExperts)->capture_default_str();
    add_int(*cmd, "--K", opt->K, "top-k", 1, 32)->capture_default_str();
    add_int(*cmd, "--S", opt->S, "tokens per rank per micro-batch", 1, 1 << 30)->capture_default_str();
    add_u64(*cmd, "--seed", opt->seed, "workload seed")->capture_default_str();
    set_run(cmd, [opt] { run_workloads(*opt); });
}

}  // namespace evenep::cli
