// EPLB-style replica placement (perf/eplb.hpp) and the EPLB baseline's rows and slot routing (perf/baselines.hpp).
//
// Cases:
//   EplbReplicate.GreedyIsOptimal          replica counts minimise max load/replicas: equal to a brute force over
//                                          every count vector on small random loads (seeds 1..40 printed on failure)
//   EplbReplicate.TiesGoToLowerId          equal loads: the extra replicas go to the lowest ids first
//   EplbReplicate.SameAsLinearScan         the heap picks what a scan for the largest load/replicas (lowest id on
//                                          ties) picks, replica by replica: random loads with many ties, n up to 300
//   EplbPacking.HandExample                weights {10,3,3,3,3,3} into 2 packs: the exact packs and ranks in pack
//   EplbPacking.EveryPackFull              random weights: every pack gets exactly n/m items, ranks 0..n/m-1
//   EplbPlace.HandExample                  E=4 R=2 3 slots, loads {60,30,20,10}: exact slots, rows 60/60
//   EplbPlace.Properties                   random loads at several shapes: every expert >= 1 replica, every slot
//                                          filled, slot counts == replica_count, rows conserve entries, rows never
//                                          worse than conventional EP's busiest rank, deterministic
//   EplbPlace.UniformLoadIsPerfect         equal loads with E redundant slots: every rank computes the mean
//   EplbPlace.HierarchicalKeepsGroupsOnNodes  groups=4 nodes=2: every replica of a group's experts is on one node
//   EplbPlace.BadConfigThrows              E % R, slots < E/R, groups % nodes, load size mismatch
//   EplbRouting.SlotRoutingMatchesRows     the slot of every entry holds its expert; entries per rank == eplb_rows
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <vector>

#include "evenep/error.hpp"
#include "evenep/routing.hpp"
#include "perf/baselines.hpp"
#include "perf/eplb.hpp"

namespace evenep::perf {
namespace {

double max_per_replica(const std::vector<double>& load, const std::vector<int32_t>& count) {
    double m = 0;
    for (size_t i = 0; i < load.size(); ++i) m = std::max(m, load[i] / count[i]);
    return m;
}

// The best max load/replicas over every count vector with counts >= 1 summing to num_physical.
double brute_force_replicate(const std::vector<double>& load, int num_physical) {
    const int n = static_cast<int>(load.size());
    std::vector<int32_t> count(n, 1);
    double best = 1e300;
    std::function<void(int, int)> rec = [&](int i, int left) {
        if (i == n - 1) {
            count[i] = 1 + left;
            best = std::min(best, max_per_replica(load, count));
            return;
        }
        for (int extra = 0; extra <= left; ++extra) {
            count[i] = 1 + extra;
            rec(i + 1, left - extra);
        }
    };
    rec(0, num_physical - n);
    return best;
}

std::vector<int64_t> random_loads(int E, uint64_t seed, double sigma) {
    Rng rng(seed);
    std::vector<int64_t> load(E);
    for (int64_t& v : load) v = static_cast<int64_t>(1000.0 * std::exp(sigma * rng.normal()));
    return load;
}

TEST(EplbReplicate, GreedyIsOptimal) {
    for (uint64_t seed = 1; seed <= 40; ++seed) {
        Rng rng(seed);
        const int n = 2 + static_cast<int>(rng.uniform() * 4);     // 2..5 experts
        const int phys = n + static_cast<int>(rng.uniform() * 6);  // 0..5 redundant
        std::vector<double> load(n);
        for (double& v : load) v = std::floor(1 + 100 * rng.uniform() * rng.uniform());
        const std::vector<int32_t> count = eplb_replicate(load, phys);
        ASSERT_EQ(std::accumulate(count.begin(), count.end(), 0), phys) << "seed " << seed;
        for (int32_t c : count) ASSERT_GE(c, 1) << "seed " << seed;
        EXPECT_DOUBLE_EQ(max_per_replica(load, count), brute_force_replicate(load, phys)) << "seed " << seed;
    }
}

TEST(EplbReplicate, TiesGoToLowerId) {
    const std::vector<double> load{5, 5, 5, 5};
    EXPECT_EQ(eplb_replicate(load, 6), (std::vector<int32_t>{2, 2, 1, 1}));
}

TEST(EplbReplicate, SameAsLinearScan) {
    for (uint64_t seed = 1; seed <= 30; ++seed) {
        Rng rng(seed);
        const int n = 1 + static_cast<int>(rng.uniform() * 300);
        const int phys = n + static_cast<int>(rng.uniform() * 2 * n);
        std::vector<double> load(n);
        for (double& v : load) v = std::floor(8 * rng.uniform()) * (seed % 3 == 0 ? 1.0 : 1.0 + rng.uniform());
        std::vector<int32_t> expected(n, 1);
        for (int extra = n; extra < phys; ++extra) {
            int best = 0;
            for (int i = 1; i < n; ++i)
                if (load[i] / expected[i] > load[best] / expected[best]) best = i;
            ++expected[best];
        }
        EXPECT_EQ(eplb_replicate(load, phys), expected) << "seed " << seed << " n " << n << " phys " << phys;
    }
}

TEST(EplbPacking, HandExample) {
    const std::vector<double> w{10, 3, 3, 3, 3, 3};
    const Packing p = eplb_balanced_packing(w, 2);
    EXPECT_EQ(p.pack, (std::vector<int32_t>{0, 1, 1, 1, 0, 0}));
    EXPECT_EQ(p.rank_in_pack, (std::vector<int32_t>{0, 0, 1, 2, 1, 2}));
}

TEST(EplbPacking, EveryPackFull) {
    for (uint64_t seed = 1; seed <= 10; ++seed) {
        Rng rng(seed);
        const int m = 1 + static_cast<int>(rng.uniform() * 6), per = 1 + static_cast<int>(rng.uniform() * 5);
        std::vector<double> w(m * per);
        for (double& v : w) v = rng.uniform();
        const Packing p = eplb_balanced_packing(w, m);
        std::vector<std::vector<int32_t>> ranks(m);
        for (size_t i = 0; i < w.size(); ++i) ranks[p.pack[i]].push_back(p.rank_in_pack[i]);
        for (int k = 0; k < m; ++k) {
            std::sort(ranks[k].begin(), ranks[k].end());
            std::vector<int32_t> expect(per);
            std::iota(expect.begin(), expect.end(), 0);
            EXPECT_EQ(ranks[k], expect) << "seed " << seed << " pack " << k;
        }
    }
}

TEST(EplbPlace, HandExample) {
    // Replicas: expert 0 gets both redundant slots (60 -> 30 -> tie 30/30 goes to the lower id -> 20 each).
    // Physical weights [20,20,20 | 30 | 20 | 10] packed: 30->r0, 20->r1, 20->r1, 20->r0, 20->r1 (full), 10->r0.
    const std::vector<int64_t> load{60, 30, 20, 10};
    const EplbPlacement p = eplb_place({.num_ranks = 2, .num_experts = 4, .slots_per_rank = 3}, load);
    EXPECT_EQ(p.replica_count, (std::vector<int32_t>{3, 1, 1, 1}));
    EXPECT_EQ(p.slot_expert, (std::vector<int32_t>{1, 0, 3, 0, 0, 2}));
    EXPECT_EQ(eplb_rows(p, load), (std::vector<int64_t>{60, 60}));
}

TEST(EplbPlace, Properties) {
    struct Shape {
        int R, E, slots;
        double sigma;
    };
    for (const Shape& sh : {Shape{4, 16, 8, 1.0}, Shape{8, 64, 16, 2.0}, Shape{8, 64, 9, 0.5}, Shape{1, 8, 8, 1.5},
                            Shape{16, 32, 2, 1.0}, Shape{56, 896, 32, 1.5}}) {
        for (uint64_t seed = 1; seed <= 3; ++seed) {
            SCOPED_TRACE(::testing::Message()
                         << "R=" << sh.R << " E=" << sh.E << " slots=" << sh.slots << " seed=" << seed);
            const std::vector<int64_t> load = random_loads(sh.E, seed, sh.sigma);
            const EplbConfig cfg{.num_ranks = sh.R, .num_experts = sh.E, .slots_per_rank = sh.slots};
            const EplbPlacement p = eplb_place(cfg, load);
            ASSERT_EQ(p.slot_expert.size(), static_cast<size_t>(sh.R) * sh.slots);
            std::vector<int32_t> seen(sh.E, 0);
            for (int32_t e : p.slot_expert) {
                ASSERT_GE(e, 0);
                ASSERT_LT(e, sh.E);
                ++seen[e];
            }
            EXPECT_EQ(seen, p.replica_count);
            for (int32_t c : p.replica_count) EXPECT_GE(c, 1);
            const std::vector<int64_t> rows = eplb_rows(p, load);
            EXPECT_EQ(std::accumulate(rows.begin(), rows.end(), int64_t{0}),
                      std::accumulate(load.begin(), load.end(), int64_t{0}));
            const Config conv{.R = sh.R, .E = sh.E, .K = 1, .S = 1};
            EXPECT_LE(imbalance(rows), imbalance(conventional_rows(conv, load)) + 1e-12);
            const EplbPlacement again = eplb_place(cfg, load);
            EXPECT_EQ(again.slot_expert, p.slot_expert);
            EXPECT_EQ(again.replica_count, p.replica_count);
        }
    }
}

TEST(EplbPlace, UniformLoadIsPerfect) {
    const std::vector<int64_t> load(64, 1000);
    const EplbPlacement p = eplb_place({.num_ranks = 8, .num_experts = 64, .slots_per_rank = 16}, load);
    for (int32_t c : p.replica_count) EXPECT_EQ(c, 2);
    for (int64_t r : eplb_rows(p, load)) EXPECT_EQ(r, 8000);
}

TEST(EplbPlace, HierarchicalKeepsGroupsOnNodes) {
    const std::vector<int64_t> load = random_loads(32, 7, 1.5);
    const EplbConfig cfg{.num_ranks = 8, .num_experts = 32, .slots_per_rank = 6, .num_groups = 4, .num_nodes = 2};
    const EplbPlacement p = eplb_place(cfg, load);
    std::vector<int> node_of_group(4, -1);
    for (size_t slot = 0; slot < p.slot_expert.size(); ++slot) {
        const int node = p.rank_of_slot(static_cast<int>(slot)) / 4, group = p.slot_expert[slot] / 8;
        if (node_of_group[group] < 0) node_of_group[group] = node;
        EXPECT_EQ(node_of_group[group], node) << "slot " << slot << " expert " << p.slot_expert[slot];
    }
    for (int32_t c : p.replica_count) EXPECT_GE(c, 1);
    EXPECT_EQ(std::count(node_of_group.begin(), node_of_group.end(), 0), 2);
}

TEST(EplbPlace, BadConfigThrows) {
    const std::vector<int64_t> load(16, 1);
    EXPECT_THROW(eplb_place({.num_ranks = 3, .num_experts = 16, .slots_per_rank = 8}, load), Error);
    EXPECT_THROW(eplb_place({.num_ranks = 4, .num_experts = 16, .slots_per_rank = 3}, load), Error);
    EXPECT_THROW(
        eplb_place({.num_ranks = 4, .num_experts = 16, .slots_per_rank = 4, .num_groups = 3, .num_nodes = 2}, load),
        Error);
    EXPECT_THROW(eplb_place({.num_ranks = 4, .num_experts = 8, .slots_per_rank = 4}, load), Error);
}

TEST(EplbRouting, SlotRoutingMatchesRows) {
    const RoutingSpec spec{.R = 4, .E = 32, .K = 4, .S = 300, .seed = 3};
    const Routing routing = make_adversarial(spec, Adversarial::kMasked);
    const Config cfg{.R = 4, .E = 32, .K = 4, .S = 300};
    const std::vector<int64_t> load = expert_loads(cfg, routing.tpe());
    const EplbPlacement p =
        eplb_place({.num_ranks = 4, .num_experts = 32, .slots_per_rank = 12}, random_loads(32, 5, 1.0));
    const std::vector<std::vector<int32_t>> slots = eplb_slot_routing(p, routing);
    std::vector<int64_t> rows(4, 0);
    for (int r = 0; r < 4; ++r)
        for (size_t i = 0; i < slots[r].size(); ++i) {
            const int32_t e = routing.topk_idx[r][i];
            if (e < 0) {
                EXPECT_EQ(slots[r][i], -1);
                continue;
            }
            ASSERT_GE(slots[r][i], 0);
            EXPECT_EQ(p.slot_expert[slots[r][i]], e);
            ++rows[p.rank_of_slot(slots[r][i])];
        }
    EXPECT_EQ(rows, eplb_rows(p, load));
    const TrafficReport t = eplb_traffic(p, routing, 64, 32, /*training=*/true);
    EXPECT_EQ(t.total_entries, routing.total_entries());
    EXPECT_EQ(t.max_rank_entries, *std::max_element(rows.begin(), rows.end()));
    // Training keeps the replicas in sync: per expert, every rank holding it other than its first slot's sends one
    // fp32 gradient there and receives the bf16 weights back (3 projections of [64, 32]).
    int64_t syncs = 0, ring_sends = 0;
    for (int e = 0; e < 32; ++e) {
        std::vector<bool> on(4, false);
        for (size_t slot = 0; slot < p.slot_expert.size(); ++slot)
            if (p.slot_expert[slot] == e) on[p.rank_of_slot(static_cast<int>(slot))] = true;
        const int64_t n = std::count(on.begin(), on.end(), true);
        syncs += n - 1;
        ring_sends += n >= 2 ? n : 0;
    }
    EXPECT_GT(syncs, 0);
    EXPECT_EQ(t.reduce_grad.rows, syncs);
    EXPECT_EQ(t.prefetch.rows, syncs);
    EXPECT_EQ(t.reduce_grad.bytes, syncs * 3 * 64 * 32 * 4);
    EXPECT_EQ(t.prefetch.bytes, syncs * 3 * 64 * 32 * 2);
    const TrafficReport inference = eplb_traffic(p, routing, 64, 32, /*training=*/false);
    EXPECT_EQ(inference.prefetch.bytes + inference.reduce_grad.bytes, 0);
    // A ring all-reduce instead: every holder of a replicated expert sends 2(n-1)/n of its gradient, no weights move.
    const TrafficReport ring = eplb_traffic(p, routing, 64, 32, true, EplbSync::kRing);
    EXPECT_EQ(ring.reduce_grad.rows, ring_sends);
    EXPECT_EQ(ring.prefetch.bytes, 0);
    EXPECT_GT(ring.reduce_grad.bytes, 0);
    EXPECT_EQ(ring.dispatch.bytes, t.dispatch.bytes);
    const TrafficReport none = eplb_traffic(p, routing, 64, 32, true, EplbSync::kNone);
    EXPECT_EQ(none.prefetch.bytes + none.reduce_grad.bytes, 0);
    EXPECT_EQ(parse_eplb_sync("ring"), EplbSync::kRing);
    EXPECT_THROW(parse_eplb_sync("mesh"), Error);
}

}  // namespace
}  // namespace evenep::perf
