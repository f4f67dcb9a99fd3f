// tools/evenep/simulate_workload.hpp — `evenep simulate --workload W | --trace F`: every system over T steps on the
// same routings (perf/workload_run.hpp), the step table and JSON schema evenep.workload_run/1 (docs/benchmarks.md,
// "Workloads"). simulate.cpp adds these options and calls run_simulate_workload when one of them is given.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "workload_common.hpp"

namespace evenep::cli {

// The shape and shared flags of `simulate` the workload run uses.
struct WorkloadShape {
    std::vector<int> ranks;
    bool ranks_given = false;  // --R on the command line (a trace's R must then match)
    bool experts_given = false;
    int E = 0, K = 0, S = 0, H = 0, ffn_hidden = 0, tp = 0;
    int redundant = -1;
    bool redundant_given = false;  // else EPLB runs with 1, 2, 4 and epn redundant slots per rank
    std::string eplb_sync;
    std::string planner;
    double slack = 0;  // evenep_auto's largest budget when slack_given (else kAutoDefaultSlack)
    bool slack_given = false;
    uint64_t seed = 1;
    std::string json_file;
};

// Refuses (one line naming the flag) flags of the other mode: the grid's --maxvio, --drift, --repeat, --gpu-json
// and a --policy other than auto with --workload/--trace (--slack is evenep_auto's largest budget there); the
// workload flags without them; --micro-batches with --trace.
void check_workload_flags(const CLI::App& cmd, const WorkloadOptions& o);
void run_simulate_workload(const WorkloadOptions& o, const WorkloadShape& shape);

}  // namespace evenep::cli
