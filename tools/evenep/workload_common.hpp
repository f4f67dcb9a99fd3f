// tools/evenep/workload_common.hpp — what `simulate --workload|--trace` (simulate_workload.cpp) and `bench layer
// --workload|--trace` (bench_layer_workload.cpp) share: the step source (a workload's histograms or a trace's), the
// summary table, and the JSON of schema evenep.workload_run/1 (docs/benchmarks.md, "Workloads and traces").
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "evenep/trace.hpp"
#include "evenep/workloads.hpp"
#include "perf/workload_run.hpp"

namespace evenep::cli {

struct WorkloadOptions {
    std::string workload;  // a name of workload_list()
    std::string trace;     // a router trace .npy (docs/traces.md)
    int steps = 50;        // workload: steps generated; trace: the first `steps` (0: all)
    int micro_batches = 1;
    int eplb_interval = 10;
    int eplb_window = 10;
    std::string lplb_topology = "auto";
    double llep_threshold = 1.0;
    double plan_us = 50;
    double gemm_tflops = 700;
    double group_us = -1;
    double link_gbps = 367;
    bool placed = false;  // --placed: the evenep_placed system (perf/workload_run.hpp)

    bool active() const { return !workload.empty() || !trace.empty(); }
};

// The workload/trace flags of simulate and bench layer: --workload, --trace, --steps, --micro-batches, --eplb-interval,
// --eplb-window, --lplb-topology, --llep-threshold, --placed, --plan-us, and with model_flags the step model's
// --gemm-tflops, --group-us, --link-gbps (bench layer has its own --link-gbps and measures the compute).
void add_workload_options(CLI::App& cmd, WorkloadOptions& o, bool model_flags);

// The run configuration of both commands (validated): redundant empty = EPLB at 1, 2, 4 and epn slots per rank;
// auto_slack = evenep_auto's largest budget (the auto policy's ε_max; --slack, else kAutoDefaultSlack).
perf::WorkloadRunConfig workload_run_config(const WorkloadOptions& o,
                                            const Config& cfg,
                                            int H,
                                            int ffn_hidden,
                                            const std::vector<int>& redundant,
                                            const std::string& eplb_sync,
                                            const std::string& planner,
                                            int layers,
                                            double auto_slack);

// The q-quantile of v (nearest rank: the smallest value with at least q of the values at or below it); 0 if empty.
double quantile(std::vector<double> v, double q);

// The histograms of every step: a workload's (M micro-batches per step, units of layer 0) or a trace's (its L
// layers per step, one unit each).
class StepSource {
  public:
    // A workload: R ranks of S tokens per micro-batch.
    StepSource(const WorkloadSpec& spec, int R, int steps, int micro_batches);
    // A trace (already read and validated): its first `steps` steps (0 or more than it has: all); K, S as replayed.
    StepSource(RouterTrace trace, int steps, int K, int S);
    int steps() const { return steps_; }
    int layers() const { return from_trace_ ? trace_.L : 1; }
    int micro_batches() const { return from_trace_ ? 1 : micro_batches_; }
    // Step t's units (valid until the next call).
    const std::vector<perf::StepUnit>& units(int t);

  private:
    bool from_trace_ = false;
    WorkloadSpec spec_;
    RouterTrace trace_;
    int R_ = 0, steps_ = 0, micro_batches_ = 1, K_ = 1, S_ = 1;
    std::vector<std::vector<int32_t>> s_store_, tpe_store_;
    std::vector<perf::StepUnit> units_;
};

// The top level of evenep.workload_run/1 without "systems" and "seconds" (the caller adds them); "evenep_auto" is
// {policy: auto, max_slack: rc.auto_slack}.
nlohmann::json workload_run_json(const WorkloadOptions& o,
                                 const StepSource& source,
                                 const perf::WorkloadRunConfig& rc,
                                 uint64_t seed,
                                 const std::string& planner);

// One system's JSON object of evenep.workload_run/1 (name, label, params, step_ms, rows_max_over_mean, summary,
// bytes, rows; evenep_auto: params.max_slack and the per-step mean budget slack_ppm).
nlohmann::json system_json(const perf::SystemSeries& s, const perf::WorkloadRunConfig& rc);

// The summary table (median, p90, max, rows imbalance, each over evenep_exact's), evenep_auto's mean budget, then the
// best baseline (median and p90 separately: conventional, eplb, lplb, llep) against every evenep_* system. `what`
// names the step time.
void print_workload_table(const std::vector<const perf::SystemSeries*>& series, const std::string& what);

}  // namespace evenep::cli
