// EPLB-style replica placement (perf/eplb.hpp).
#include "perf/eplb.hpp"

#include <algorithm>
#include <numeric>

#include "evenep/error.hpp"

namespace evenep::perf {

void EplbConfig::validate() const {
    EVENEP_CHECK(num_ranks >= 1, "eplb: num_ranks = ", num_ranks, " must be >= 1");
    EVENEP_CHECK(num_experts >= 1, "eplb: num_experts = ", num_experts, " must be >= 1");
    EVENEP_CHECK(num_groups >= 1, "eplb: num_groups = ", num_groups, " must be >= 1");
    EVENEP_CHECK(num_nodes >= 1, "eplb: num_nodes = ", num_nodes, " must be >= 1");
    EVENEP_CHECK(num_experts % num_ranks == 0, "eplb: num_experts = ", num_experts,
                 " is not a multiple of num_ranks = ", num_ranks);
    EVENEP_CHECK(num_experts % num_groups == 0, "eplb: num_experts = ", num_experts,
                 " is not a multiple of num_groups = ", num_groups);
    EVENEP_CHECK(num_groups % num_nodes == 0, "eplb: num_groups = ", num_groups,
                 " is not a multiple of num_nodes = ", num_nodes);
    EVENEP_CHECK(num_ranks % num_nodes == 0, "eplb: num_ranks = ", num_ranks,
                 " is not a multiple of num_nodes = ", num_nodes);
    EVENEP_CHECK(slots_per_rank >= num_experts / num_ranks, "eplb: slots_per_rank = ", slots_per_rank,
                 " is below the experts per rank E/R = ", num_experts / num_ranks);
}

std::vector<int32_t> eplb_replicate(std::span<const double> load, int num_physical) {
    const int n = static_cast<int>(load.size());
    EVENEP_CHECK(n >= 1 && num_physical >= n, "eplb: ", num_physical, " physical slots cannot hold ", n, " experts");
    std::vector<int32_t> count(n, 1);
    // Each extra replica goes to the largest load per replica, the lower id on ties: a max-heap of (load / count, id)
    // makes the same choices as a scan over the items, in O(log n) per replica instead of O(n) (the scan was
    // quadratic in E with epn spare slots: 90 % of `simulate --workload` at E = 65536).
    struct Key {
        double per_replica;
        int32_t id;
    };
    const auto lower = [](const Key& a, const Key& b) {  // a is picked after b
        return a.per_replica < b.per_replica || (a.per_replica == b.per_replica && a.id > b.id);
    };
    std::vector<Key> heap(n);
    for (int i = 0; i < n; ++i) heap[i] = {load[i] / count[i], i};
    std::make_heap(heap.begin(), heap.end(), lower);
    for (int extra = n; extra < num_physical; ++extra) {
        std::pop_heap(heap.begin(), heap.end(), lower);
        const int32_t best = heap.back().id;
        ++count[best];
        heap.back() = {load[best] / count[best], best};
        std::push_heap(heap.begin(), heap.end(), lower);
    }
    return count;
}

Packing eplb_balanced_packing(std::span<const double> weight, int num_packs) {
    const int n = static_cast<int>(weight.size());
    EVENEP_CHECK(num_packs >= 1 && n % num_packs == 0, "eplb: ", n, " items do not split evenly into ", num_packs,
                 " packs");
    const int per_pack = n / num_packs;
    std::vector<int32_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return weight[a] > weight[b]; });
    Packing out{std::vector<int32_t>(n, -1), std::vector<int32_t>(n, -1)};
    std::vector<double> pack_weight(num_packs, 0.0);
    std::vector<int32_t> pack_items(num_packs, 0);
    for (int32_t item : order) {
        int best = -1;
        for (int p = 0; p < num_packs; ++p)
            if (pack_items[p] < per_pack && (best < 0 || pack_weight[p] < pack_weight[best])) best = p;
        out.pack[item] = best;
        out.rank_in_pack[item] = pack_items[best]++;
        pack_weight[best] += weight[item];
    }
    return out;
}

EplbPlacement eplb_place(const EplbConfig& cfg, std::span<const int64_t> expert_load) {
    cfg.validate();
    const int E = cfg.num_experts, R = cfg.num_ranks, N = cfg.num_nodes, G = cfg.num_groups;
    EVENEP_CHECK(expert_load.size() == static_cast<size_t>(E), "eplb: expert_load has ", expert_load.size(),
                 " entries, expected E = ", E);
    for (int e = 0; e < E; ++e)
        EVENEP_CHECK(expert_load[e] >= 0, "eplb: expert ", e, " has negative load ", expert_load[e]);
    const int group_size = E / G, groups_per_node = G / N, ranks_per_node = R / N;
    const int phys_per_node = R * cfg.slots_per_rank / N;

    // 1. Groups onto nodes.
    std::vector<double> group_load(G, 0.0);
    for (int e = 0; e < E; ++e) group_load[e / group_size] += static_cast<double>(expert_load[e]);
    const Packing groups = eplb_balanced_packing(group_load, N);
    std::vector<int32_t> node_experts(static_cast<size_t>(N) * groups_per_node * group_size);
    for (int g = 0; g < G; ++g)
        for (int j = 0; j < group_size; ++j)
            node_experts[(static_cast<size_t>(groups.pack[g]) * groups_per_node + groups.rank_in_pack[g]) * group_size +
                         j] = g * group_size + j;

    EplbPlacement out;
    out.num_ranks = R;
    out.num_experts = E;
    out.slots_per_rank = cfg.slots_per_rank;
    out.slot_expert.assign(static_cast<size_t>(R) * cfg.slots_per_rank, -1);
    out.replica_count.assign(E, 0);
    const int experts_per_node = E / N;
    for (int node = 0; node < N; ++node) {
        const int32_t* experts = node_experts.data() + static_cast<size_t>(node) * experts_per_node;
        // 2. Replicas inside the node.
        std::vector<double> load(experts_per_node);
        for (int i = 0; i < experts_per_node; ++i) load[i] = static_cast<double>(expert_load[experts[i]]);
        const std::vector<int32_t> count = eplb_replicate(load, phys_per_node);
        // 3. Physical experts (load / replicas each) onto the node's ranks.
        std::vector<int32_t> phys_expert;
        std::vector<double> phys_weight;
        phys_expert.reserve(phys_per_node);
        phys_weight.reserve(phys_per_node);
        for (int i = 0; i < experts_per_node; ++i) {
            out.replica_count[experts[i]] = count[i];
            for (int c = 0; c < count[i]; ++c) {
                phys_expert.push_back(experts[i]);
                phys_weight.push_back(load[i] / count[i]);
            }
        }
        const Packing ranks = eplb_balanced_packing(phys_weight, ranks_per_node);
        for (int p = 0; p < phys_per_node; ++p) {
            const int rank = node * ranks_per_node + ranks.pack[p];
            out.slot_expert[static_cast<size_t>(rank) * cfg.slots_per_rank + ranks.rank_in_pack[p]] = phys_expert[p];
        }
    }
    return out;
}

std::vector<int64_t> eplb_alloc(const EplbPlacement& p, std::span<const int64_t> expert_load) {
    EVENEP_CHECK(expert_load.size() == static_cast<size_t>(p.num_experts), "eplb: expert_load has ",
                 expert_load.size(), " entries, expected E = ", p.num_experts);
    std::vector<int64_t> alloc(static_cast<size_t>(p.num_experts) * p.num_ranks, 0);
    std::vector<int32_t> seen(p.num_experts, 0);
    for (size_t slot = 0; slot < p.slot_expert.size(); ++slot) {
        const int32_t e = p.slot_expert[slot];
        const int64_t load = expert_load[e], count = p.replica_count[e], j = seen[e]++;
        alloc[static_cast<size_t>(e) * p.num_ranks + p.rank_of_slot(static_cast<int>(slot))] +=
            load / count + (j < load % count ? 1 : 0);
    }
    return alloc;
}

void EplbSchedule::validate() const {
    EVENEP_CHECK(step_interval >= 1, "--eplb-interval = ", step_interval, " must be >= 1");
    EVENEP_CHECK(window >= 1, "--eplb-window = ", window, " must be >= 1");
}

EplbWindow::EplbWindow(const EplbConfig& cfg, const EplbSchedule& schedule) : cfg_(cfg), schedule_(schedule) {
    cfg_.validate();
    schedule_.validate();
}

void EplbWindow::record(std::span<const int64_t> expert_load) {
    EVENEP_CHECK(expert_load.size() == static_cast<size_t>(cfg_.num_experts), "eplb: expert_load has ",
                 expert_load.size(), " entries, expected E = ", cfg_.num_experts);
    history_.emplace_back(expert_load.begin(), expert_load.end());
    if (history_.size() > static_cast<size_t>(schedule_.window)) history_.pop_front();
}

std::vector<int64_t> EplbWindow::window_load() const {
    std::vector<int64_t> sum(cfg_.num_experts, history_.empty() ? 1 : 0);  // no statistics yet: uniform
    for (const std::vector<int64_t>& h : history_)
        for (int e = 0; e < cfg_.num_experts; ++e) sum[e] += h[e];
    return sum;
}

}  // namespace evenep::perf
