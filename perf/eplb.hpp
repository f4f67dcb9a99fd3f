// perf/eplb.hpp — EPLB-style static replica placement: the "static replication" baseline of docs/benchmarks.md.
//
// The placement algorithm published with DeepSeek's Expert Parallelism Load Balancer, written anew here:
//   1. expert groups (contiguous id ranges) are packed onto nodes by balanced packing of the group loads;
//   2. inside each node, every redundant physical slot goes to the expert with the largest load per replica
//      (greedy; this minimises the largest load per replica);
//   3. the node's physical experts, each weighing load / replicas, are packed onto the node's ranks by balanced
//      packing, `slots_per_rank` each.
// With one group and one node (the defaults) this is EPLB's global policy. Balanced packing: items by decreasing
// weight (ties: lower item first), each to the lightest pack that still has room (ties: lower pack); every pack
// ends with exactly n/m items. Everything is deterministic. A rank may hold two replicas of one expert.
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <vector>

namespace evenep::perf {

struct EplbConfig {
    int num_ranks = 8;
    int num_experts = 64;
    int slots_per_rank = 16;  // physical experts per rank: E/R plus the redundant slots
    int num_groups = 1;       // expert groups (E % groups == 0); groups % nodes == 0
    int num_nodes = 1;        // nodes (R % nodes == 0)

    // Throws evenep::Error naming the bad value: sizes < 1, E % R, E % groups, groups % nodes, R % nodes,
    // or fewer physical slots per node than logical experts per node.
    void validate() const;
};

struct EplbPlacement {
    int num_ranks = 0;
    int num_experts = 0;
    int slots_per_rank = 0;
    std::vector<int32_t> slot_expert;    // [R*slots_per_rank] logical expert of each physical slot, rank-major
    std::vector<int32_t> replica_count;  // [E] physical replicas of each expert (>= 1)

    int rank_of_slot(int slot) const { return slot / slots_per_rank; }
};

// The placement for per-expert loads `expert_load` [E] (e.g. the previous step's T_e).
EplbPlacement eplb_place(const EplbConfig& cfg, std::span<const int64_t> expert_load);

// Step 2 alone: replica counts [n] (each >= 1, summing to num_physical >= n) of items with loads `load` [n].
std::vector<int32_t> eplb_replicate(std::span<const double> load, int num_physical);

// Balanced packing alone: the pack of each item [n] and its rank inside the pack [n] (order of arrival);
// weight.size() % num_packs == 0.
struct Packing {
    std::vector<int32_t> pack;
    std::vector<int32_t> rank_in_pack;
};
Packing eplb_balanced_packing(std::span<const double> weight, int num_packs);

// entries of expert e computed on rank r [E*R] under `placement` for per-expert loads `expert_load` [E]: the
// replica shares of eplb_rows (perf/baselines.hpp), summed per rank.
std::vector<int64_t> eplb_alloc(const EplbPlacement& placement, std::span<const int64_t> expert_load);

// EPLB as deployed in serving and training stacks: the placement is recomputed every `step_interval` steps
// (steps 0, interval, 2 * interval, ...) from the summed expert loads of the last `window` steps; before any
// step is recorded the loads are uniform (no statistics yet: the greedy replicates the lowest ids).
struct EplbSchedule {
    int step_interval = 10;
    int window = 10;
    // Throws evenep::Error naming the value when either is < 1.
    void validate() const;
};

class EplbWindow {
public:
    EplbWindow(const EplbConfig& cfg, const EplbSchedule& schedule);
    bool due(int64_t step) const { return step % schedule_.step_interval == 0; }
    // Adds one step's per-expert loads [E]; the oldest beyond `window` is dropped.
    void record(std::span<const int64_t> expert_load);
    // The window's summed per-expert loads [E] (all 1 before any record).
    std::vector<int64_t> window_load() const;
    // The placement on window_load().
    EplbPlacement place() const { return eplb_place(cfg_, window_load()); }

private:
    EplbConfig cfg_;
    EplbSchedule schedule_;
    std::deque<std::vector<int64_t>> history_;
};

}  // namespace evenep::perf
