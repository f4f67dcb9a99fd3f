// perf/workload_run.hpp — every system of `evenep simulate --workload|--trace` over a sequence of steps, on the
// same histograms, through the step model of perf/step_model.hpp (docs/benchmarks.md, "Workloads").
//
// Systems, in this order:
//   evenep_auto   the planner under the auto policy (docs/auto.md: each unit's budget in [0, auto_slack] chosen by the
//                 step-cost model with the coefficients of this run's StepModel), copies as evenep_exact's;
//   evenep_exact  the current planner (exact balance), its copies fetched and their gradients returned each unit;
//   conventional  every entry on its expert's home rank;
//   eplb          one per distinct `eplb_redundant` slot count (labelled eplb/epn when it equals epn): EplbWindow
//                 (perf/eplb.hpp) re-placed every step_interval steps from the last `window` steps' loads; a
//                 re-placement fetches the changed slots' weights; replicas synchronised once per step (`eplb_sync`,
//                 perf/baselines.hpp's models, ring by default);
//   lplb          perf/lplb.hpp: the replica graph re-chosen on EPLB's schedule, an exact min-max split per unit,
//                 each replica synchronised with its home once per step (same model);
//   llep          perf/llep.hpp: spills per unit, copies fetched and gradients returned as EvenEP's;
//   evenep_placed (only with `placed`) evenep_auto over homes that are themselves re-placed on EPLB's schedule: an
//                 EplbWindow with no redundant slot (a permutation of the experts over the ranks, epn each) re-chosen
//                 every step_interval steps from the window's loads; the step's histogram is relabelled so that the
//                 placement's rank r holds experts r*epn .. (r+1)*epn - 1 and planned as evenep_auto's; a
//                 re-placement moves each expert whose home changed (bf16 weights, model.weight_bytes, as EPLB's
//                 re-placements are counted). A design study (the library's homes are fixed): docs/benchmarks.md.
// A step is a list of units (layers x micro-batches); a system's step time is the sum of its units' step_ms.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "evenep/config.hpp"
#include "perf/baselines.hpp"
#include "perf/eplb.hpp"
#include "perf/lplb.hpp"
#include "perf/step_model.hpp"

namespace evenep::perf {

struct WorkloadRunConfig {
    Config cfg;  // R, E, K, S (tokens per rank per unit), tp; the planner's configuration
    PlannerMode mode = PlannerMode::kOptimized;
    StepModel model;
    int layers = 1;
    double plan_us = 50;                           // per-unit planning of evenep_auto, evenep_exact, lplb and llep
    double auto_slack = kAutoDefaultSlack;         // evenep_auto's largest budget (its buffers' size)
    std::vector<int> eplb_redundant{1, 2, 4, -1};  // redundant slots per rank; -1 = epn
    EplbSchedule eplb_schedule;
    EplbSync eplb_sync = EplbSync::kRing;
    std::string lplb_topology = "auto";  // auto: hypercube when R is a power of two, else torus
    double llep_threshold = 1.0;
    bool placed = false;  // add evenep_placed (see above)

    // Throws evenep::Error naming the value.
    void validate() const;
};

struct SystemSeries {
    std::string name;   // evenep_auto, evenep_exact, conventional, eplb, lplb, llep, evenep_placed
    std::string label;  // the table's label (eplb/2, eplb/epn, ...)
    int num_redundant = 0;  // eplb: redundant slots per rank
    std::string topology;   // lplb
    std::vector<double> step_ms;             // [T]
    std::vector<double> rows_max_over_mean;  // [T] mean over the step's units of max/mean of per-rank rows
    std::vector<std::vector<int64_t>> rows;  // [T][R] per-rank rows summed over the step's units
    std::vector<int64_t> token_bytes, weight_bytes, grad_bytes;  // [T] all ranks' sent bytes
    std::vector<double> slack_ppm;  // evenep_auto: [T] mean over the step's units of the chosen budget (ppm)
};

struct StepUnit {
    int layer = 0;
    std::span<const int32_t> tpe;  // [R*E]
    std::span<const int32_t> s;    // [R]
};

class WorkloadRunner {
public:
    explicit WorkloadRunner(const WorkloadRunConfig& cfg);
    ~WorkloadRunner();
    // Runs every system on one step's units (each layer's units in micro-batch order).
    void run_step(int64_t step, std::span<const StepUnit> units);
    const std::vector<SystemSeries>& series() const { return series_; }
    // Called by run_step for every unit (its index in the step's list) and system (index in series()) with what
    // the system does on that unit and the model's cost of it, before the step's totals are added: the hook of
    // perf/workload_measure.hpp, which times the same rows on the GPU.
    using UnitObserver = std::function<void(size_t unit, size_t system, const SystemStep& step, const StepCost& cost)>;
    void set_unit_observer(UnitObserver observer) { observer_ = std::move(observer); }

private:
    struct State;
    WorkloadRunConfig cfg_;
    std::vector<SystemSeries> series_;
    std::unique_ptr<State> state_;
    UnitObserver observer_;
};

// Replica synchronisation moves of experts held by several ranks (holders[e], the first the primary): star sends
// every other holder's fp32 gradient to the primary (reduce_grad) and bf16 weights back (prefetch); ring all-reduces
// the gradient over the holders in rank order (2(n-1)/n of it to the next); none moves nothing.
void add_replica_sync_moves(const StepModel& model, const std::vector<std::vector<int32_t>>& holders, EplbSync sync,
                            std::vector<Move>& prefetch, std::vector<Move>& reduce_grad);

}  // namespace evenep::perf
