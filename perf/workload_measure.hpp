// perf/workload_measure.hpp — `evenep bench layer --workload W | --trace F`: every system of perf/workload_run.hpp
// over a step sequence, on the same histograms, with the compute term of the step model (perf/step_model.hpp)
// replaced by a measurement (docs/benchmarks.md, "Workloads on the GPU").
//
// Per unit (layer x micro-batch) and system: the model gives every rank's groups (rank_groups: one per expert with
// rows on the rank, padded to tp) and compute; the `timed_ranks` ranks the model predicts busiest are timed by
// `time_rank` (the GPU: perf/cuda/workload_bench.hpp, forward + backward of exactly those groups, alone on the
// GPU, as `bench layer` times a rank), and the unit's measured compute is the largest of those times. Its step is
// the model's step with the compute term swapped:  step_ms = model step_ms - model compute_ms + measured compute.
// Link phases, prefetch, reduce_grad and the plan time stay the model's (the same pieces for every system).
// Identical group lists are timed once (memo): a rank whose groups repeat (a calm workload, a system without
// copies) costs nothing more.
//
// evenep_auto: the runner's own series, planned under the auto policy (docs/auto.md; largest budget
// WorkloadRunConfig::auto_slack, the step-cost model of the run's StepModel), its compute measured as every system's.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "perf/workload_run.hpp"

namespace evenep::perf {

// Milliseconds of one rank's expert forward + backward over groups of `group_rows` rows each.
using RankComputeFn = std::function<double(std::span<const int64_t> group_rows)>;

struct MeasuredSeries {
    SystemSeries series;                      // step_ms: the measured steps (model step, compute measured)
    std::vector<double> step_ms_model;        // [T] the model's step (perf/step_model.hpp), for comparison
    std::vector<double> compute_ms_model;     // [T] sum over the step's units of the model's compute term
    std::vector<double> compute_ms_measured;  // [T] sum over the step's units of the measured compute
    std::string policy;                       // evenep_* systems: the planner policy (auto, exact)
};

class MeasuredWorkloadRun {
  public:
    // timed_ranks >= 1: ranks timed per (unit, system), the busiest by the model (min(timed_ranks, R)).
    MeasuredWorkloadRun(const WorkloadRunConfig& cfg, RankComputeFn time_rank, int timed_ranks);
    // The runner's observer holds `this`: neither copied nor moved.
    MeasuredWorkloadRun(const MeasuredWorkloadRun&) = delete;
    MeasuredWorkloadRun& operator=(const MeasuredWorkloadRun&) = delete;
    void run_step(int64_t step, std::span<const StepUnit> units);
    // The runner's systems in its order (evenep_auto, evenep_exact, conventional, eplb..., lplb, llep).
    std::vector<MeasuredSeries> series() const;
    int64_t timed() const { return timed_; }     // time_rank calls
    int64_t memo_hits() const { return hits_; }  // group lists answered from the memo
    const WorkloadRunner& runner() const { return runner_; }

  private:
    WorkloadRunConfig cfg_;
    WorkloadRunner runner_;
    RankComputeFn time_rank_;
    int timed_ranks_;
    std::map<std::vector<int64_t>, double> memo_;
    int64_t timed_ = 0, hits_ = 0;
    // [system] per step
    std::vector<std::vector<double>> step_model_, compute_model_, compute_measured_;
    std::vector<double> unit_model_, unit_compute_model_, unit_measured_;  // [system] this step's sums
};

}  // namespace evenep::perf
