// tools/evenep/bench_layer_workload.hpp — `evenep bench layer --workload W | --trace F.npy --steps T`: every system
// (evenep_auto, evenep_exact, conventional, eplb at 1, 2, 4 and epn redundant slots, lplb, llep) over T steps of the
// same routings, each unit's compute measured on the GPU the way `bench layer` times a rank, the link phases and
// weight moves from the step model (perf/workload_measure.hpp; docs/benchmarks.md, "Workloads on the GPU").
// bench_layer.cpp adds these options and calls check_layer_workload, then run_layer_workload.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "evenep/config.hpp"
#include "evenep/trace.hpp"
#include "workload_common.hpp"

namespace evenep::cli {

// One shape of bench layer (moonep, k3_R<R>): R ranks of S tokens, E experts, top-K, H, H'.
struct LayerShape {
    std::string shape;
    int R, E, K, S, H, ffn_hidden;
};

struct LayerWorkloadOptions {
    WorkloadOptions wl;   // --workload, --trace, --steps, ... (simulate's flags, without its model flags)
    int timed_ranks = 1;  // ranks timed per unit and system: the busiest by the model
    // bench layer's own flags, copied in by bench_layer.cpp
    std::vector<LayerShape> shapes;  // --points / --k3-R
    uint64_t seed = 1;
    std::vector<int> redundant;  // empty: 1, 2, 4, epn
    std::string eplb_sync = "ring";
    double link_gbps = 367;
    double auto_slack = kAutoDefaultSlack;  // evenep_auto's largest budget (--slack)
    int warmup = 1, iters = 1;
    double warm_seconds = 1, max_seconds = 1800;
    std::string json_file;
    RouterTrace trace;  // --trace, read by check_layer_workload
};

void add_layer_workload_options(CLI::App& cmd, LayerWorkloadOptions& o);

// Checks every flag of the workload mode (CPU, before any device is looked for; one line naming the flag or value):
// the grid's flags (--maxvio, --drift, --quick, --check, --no-measure) refused; one --eplb-sync model; --steps >= 1
// with --workload; a trace read and validated against each shape's K and S, keeping the shapes whose R and E match
// it (none: refused). Leaves the shapes to run in o.shapes.
void check_layer_workload(const CLI::App& cmd, LayerWorkloadOptions& o);

// The JSON file of one shape: --json itself when one shape runs, else <--json without .json>_<shape>.json.
std::string layer_workload_json_path(const std::string& json_file, const std::string& shape, size_t num_shapes);

// Runs every shape (CUDA build and device required).
void run_layer_workload(const LayerWorkloadOptions& o);

}  // namespace evenep::cli
