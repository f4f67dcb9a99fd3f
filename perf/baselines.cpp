// Conventional EP and EPLB-style baselines (perf/baselines.hpp).
#include "perf/baselines.hpp"

#include <algorithm>

#include "evenep/error.hpp"

namespace evenep::perf {
namespace {

// Entries replica j of an expert with `load` entries and `count` replicas computes.
int64_t replica_share(int64_t load, int count, int j) { return load / count + (j < load % count ? 1 : 0); }

void check_load(const EplbPlacement& p, std::span<const int64_t> expert_load) {
    EVENEP_CHECK(expert_load.size() == static_cast<size_t>(p.num_experts), "baselines: expert_load has ",
                 expert_load.size(), " entries, expected E = ", p.num_experts);
}

}  // namespace

std::vector<int64_t> expert_loads(const Config& cfg, std::span<const int32_t> tpe) {
    EVENEP_CHECK(tpe.size() == static_cast<size_t>(cfg.R) * cfg.E, "baselines: tpe has ", tpe.size(),
                 " entries, expected R*E = ", static_cast<int64_t>(cfg.R) * cfg.E);
    std::vector<int64_t> load(cfg.E, 0);
    for (int r = 0; r < cfg.R; ++r)
        for (int e = 0; e < cfg.E; ++e) load[e] += tpe[static_cast<size_t>(r) * cfg.E + e];
    return load;
}

std::vector<int64_t> conventional_rows(const Config& cfg, std::span<const int64_t> expert_load) {
    EVENEP_CHECK(expert_load.size() == static_cast<size_t>(cfg.E), "baselines: expert_load has ", expert_load.size(),
                 " entries, expected E = ", cfg.E);
    std::vector<int64_t> rows(cfg.R, 0);
    for (int e = 0; e < cfg.E; ++e) rows[cfg.home(e)] += expert_load[e];
    return rows;
}

std::vector<int64_t> eplb_rows(const EplbPlacement& p, std::span<const int64_t> expert_load) {
    check_load(p, expert_load);
    std::vector<int64_t> rows(p.num_ranks, 0);
    std::vector<int32_t> seen(p.num_experts, 0);
    for (size_t slot = 0; slot < p.slot_expert.size(); ++slot) {
        const int32_t e = p.slot_expert[slot];
        rows[p.rank_of_slot(static_cast<int>(slot))] += replica_share(expert_load[e], p.replica_count[e], seen[e]++);
    }
    return rows;
}

std::vector<std::vector<int32_t>> eplb_slot_routing(const EplbPlacement& p, const Routing& routing) {
    EVENEP_CHECK(routing.E == p.num_experts && routing.R == p.num_ranks, "baselines: routing R = ", routing.R,
                 ", E = ", routing.E, " does not match the placement's R = ", p.num_ranks, ", E = ", p.num_experts);
    const Config cfg{.R = routing.R, .E = routing.E, .K = routing.K, .S = routing.S};
    const std::vector<int64_t> load = expert_loads(cfg, routing.tpe());
    // Replica slots of each expert in slot order, and the cursor of the replica being filled.
    std::vector<int32_t> first(p.num_experts + 1, 0), slots(p.slot_expert.size());
    for (int32_t e : p.slot_expert) ++first[e + 1];
    for (int e = 0; e < p.num_experts; ++e) first[e + 1] += first[e];
    {
        std::vector<int32_t> fill(first.begin(), first.end() - 1);
        for (size_t slot = 0; slot < p.slot_expert.size(); ++slot) slots[fill[p.slot_expert[slot]]++] = slot;
    }
    std::vector<int32_t> replica(p.num_experts, 0);
    std::vector<int64_t> left(p.num_experts);
    for (int e = 0; e < p.num_experts; ++e) left[e] = replica_share(load[e], p.replica_count[e], 0);
    std::vector<std::vector<int32_t>> out(routing.R);
    for (int r = 0; r < routing.R; ++r) {
        out[r].resize(routing.topk_idx[r].size());
        for (size_t i = 0; i < routing.topk_idx[r].size(); ++i) {
            const int32_t e = routing.topk_idx[r][i];
            if (e < 0) {
                out[r][i] = -1;
                continue;
            }
            while (left[e] == 0) left[e] = replica_share(load[e], p.replica_count[e], ++replica[e]);
            --left[e];
            out[r][i] = slots[first[e] + replica[e]];
        }
    }
    return out;
}

TrafficReport eplb_traffic(const EplbPlacement& p, const Routing& routing, int H, int ffn_hidden, bool training) {
    const Config phys{.R = p.num_ranks, .E = p.num_ranks * p.slots_per_rank, .K = routing.K, .S = routing.S, .tp = 1};
    TrafficReport rep = conventional_traffic(phys, eplb_slot_routing(p, routing), H, training);
    if (!training) return rep;
    // Replica synchronisation: one gradient and one weight refresh per (expert, rank) other than the primary's.
    const int64_t expert_elems = int64_t{detail::kNumProjections} * H * ffn_hidden;
    std::vector<int32_t> primary(p.num_experts, -1);
    std::vector<uint8_t> held(static_cast<size_t>(p.num_experts) * p.num_ranks, 0);
    for (size_t slot = 0; slot < p.slot_expert.size(); ++slot) {
        const int e = p.slot_expert[slot], r = p.rank_of_slot(static_cast<int>(slot));
        uint8_t& seen = held[static_cast<size_t>(e) * p.num_ranks + r];
        if (seen) continue;
        seen = 1;
        if (primary[e] < 0) {
            primary[e] = r;
            continue;
        }
        rep.reduce_grad.rows += 1;
        rep.reduce_grad.move(r, primary[e], expert_elems * 4);
        rep.prefetch.rows += 1;
        rep.prefetch.move(primary[e], r, expert_elems * 2);
    }
    return rep;
}

double imbalance(std::span<const int64_t> rows) {
    if (rows.empty()) return 1.0;
    int64_t total = 0, mx = 0;
    for (int64_t v : rows) {
        total += v;
        mx = std::max(mx, v);
    }
    return total > 0 ? static_cast<double>(mx) * static_cast<double>(rows.size()) / static_cast<double>(total) : 1.0;
}

}  // namespace evenep::perf
