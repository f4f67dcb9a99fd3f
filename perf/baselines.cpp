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
    const std::vector<int64_t> alloc = eplb_alloc(p, expert_load);
    std::vector<int64_t> rows(p.num_ranks, 0);
    for (int e = 0; e < p.num_experts; ++e)
        for (int r = 0; r < p.num_ranks; ++r) rows[r] += alloc[static_cast<size_t>(e) * p.num_ranks + r];
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

EplbSync parse_eplb_sync(const std::string& name) {
    if (name == "star") return EplbSync::kStar;
    if (name == "ring") return EplbSync::kRing;
    if (name == "none") return EplbSync::kNone;
    EVENEP_CHECK(false, "EPLB replica sync '", name, "' must be star, ring or none");
    return EplbSync::kNone;
}

const char* to_string(EplbSync sync) {
    switch (sync) {
        case EplbSync::kStar: return "star";
        case EplbSync::kRing: return "ring";
        case EplbSync::kNone: return "none";
    }
    return "?";
}

std::vector<std::vector<int32_t>> eplb_holders(const EplbPlacement& p) {
    std::vector<std::vector<int32_t>> holders(p.num_experts);
    for (size_t slot = 0; slot < p.slot_expert.size(); ++slot) {
        std::vector<int32_t>& h = holders[p.slot_expert[slot]];
        const int r = p.rank_of_slot(static_cast<int>(slot));
        if (std::find(h.begin(), h.end(), r) == h.end()) h.push_back(r);
    }
    return holders;
}

TrafficReport eplb_traffic(
    const EplbPlacement& p, const Routing& routing, int H, int ffn_hidden, bool training, EplbSync sync) {
    const Config phys{.R = p.num_ranks, .E = p.num_ranks * p.slots_per_rank, .K = routing.K, .S = routing.S, .tp = 1};
    TrafficReport rep = conventional_traffic(phys, eplb_slot_routing(p, routing), H, training);
    if (!training || sync == EplbSync::kNone) return rep;
    const int64_t grad_bytes = int64_t{detail::kNumProjections} * H * ffn_hidden * 4;
    for (const std::vector<int32_t>& h : eplb_holders(p))
        for_each_replica_sync(
            h, sync, grad_bytes, grad_bytes / 2,  // bf16 weights
            [&](int32_t from, int32_t to, int64_t bytes) {
                rep.reduce_grad.rows += 1;
                rep.reduce_grad.move(from, to, bytes);
            },
            [&](int32_t from, int32_t to, int64_t bytes) {
                rep.prefetch.rows += 1;
                rep.prefetch.move(from, to, bytes);
            });
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
