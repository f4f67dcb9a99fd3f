// The workload baselines (perf/lplb.hpp, perf/llep.hpp, EplbWindow and eplb_alloc of perf/eplb.hpp), the step model
// (perf/step_model.hpp) and the runner (perf/workload_run.hpp), on tiny cases against brute force.
//
// Cases:
//   Lplb.MinMaxMatchesEnumeration       R = 2 and 4, hypercube / ring / torus, 40 random histograms: lplb_solve's
//                                       max load == the minimum over every integer split x_j in [0, T_e] (all
//                                       enumerated), its split achieves it, and moved[j] <= T_e
//   Lplb.GraphShapes                    hypercube R = 8: neighbours r xor 1, 2, 4; torus R = 8: 2 x 4 (3 distinct
//                                       neighbours); each edge's expert homed on its home, distinct, <= epn per
//                                       rank; `cube` refused for R != 8, hypercube for R = 6
//   Llep.FairShareAndConservation       300 random tiny cases: per-expert sums kept, max rows == ceil(N/R) when some
//                                       rank exceeds it (else the conventional max), only overloaded homes spill,
//                                       no rank ends above the cap; the brute-force optimum over every split of
//                                       R = 2, E = 2 equals ceil(N/R)
//   EplbWindow.ScheduleAndWindow        due at 0, interval, 2 interval; place() == eplb_place on the last `window`
//                                       steps' summed loads (uniform before any record)
//   EplbAlloc.MatchesRows               eplb_alloc's per-rank sums == eplb_rows, per-expert sums == the loads
//   StepModel.PhaseArithmetic           a hand-computed 2-rank case: token phase, copies, compute and step_ms
//   WorkloadRunner.EverySystemPerStep   3 steps x 2 micro-batches: every system has 3 step times, rows summing to
//                                       the entries; evenep_exact and llep balanced, lplb never above conventional;
//                                       evenep_auto's budgets and rows within its largest budget; EPLB slot counts
//                                       deduplicated (4 = epn)
//   WorkloadRunner.PlacedHomes          with `placed`: evenep_placed comes last, its rows sum to the entries; on a
//                                       static hot_rank run, after the homes' re-placement it moves fewer copy bytes
//                                       and models a shorter step than evenep_auto on the fixed homes, and the
//                                       re-placement step itself carries the home moves (weight bytes above the
//                                       steady steps'); without `placed` there is no such system
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <vector>

#include "evenep/error.hpp"
#include "evenep/routing.hpp"
#include "evenep/workloads.hpp"
#include "perf/baselines.hpp"
#include "perf/eplb.hpp"
#include "perf/llep.hpp"
#include "perf/lplb.hpp"
#include "perf/step_model.hpp"
#include "perf/workload_run.hpp"

namespace evenep::perf {
namespace {

std::vector<int64_t> random_loads(Rng& rng, int E, int max_load) {
    std::vector<int64_t> l(E);
    for (int64_t& v : l) v = static_cast<int64_t>(rng.next_u64() % static_cast<uint64_t>(max_load + 1));
    return l;
}

// Minimum over every integer split of the largest rank load (exhaustive).
int64_t brute_force_lplb(int R, int E, const std::vector<int64_t>& load, const std::vector<LplbEdge>& edges) {
    const int epn = E / R;
    std::vector<int64_t> base(R, 0);
    for (int e = 0; e < E; ++e) base[e / epn] += load[e];
    int64_t best = INT64_MAX;
    std::vector<int64_t> x(edges.size(), 0);
    std::function<void(size_t)> rec = [&](size_t j) {
        if (j == edges.size()) {
            std::vector<int64_t> l = base;
            for (size_t i = 0; i < edges.size(); ++i) {
                l[edges[i].home] -= x[i];
                l[edges[i].holder] += x[i];
            }
            best = std::min(best, *std::max_element(l.begin(), l.end()));
            return;
        }
        for (x[j] = 0; x[j] <= load[edges[j].expert]; ++x[j]) rec(j + 1);
    };
    rec(0);
    return best;
}

TEST(Lplb, MinMaxMatchesEnumeration) {
    Rng rng(2026);
    int improved = 0;  // cases where the split beats conventional EP (the test is not vacuous)
    struct Case {
        int R, E;
        LplbTopology topo;
    };
    for (const Case c : {Case{2, 4, LplbTopology::kHypercube}, Case{4, 8, LplbTopology::kHypercube},
                         Case{4, 8, LplbTopology::kRing}, Case{4, 12, LplbTopology::kTorus}})
        for (int trial = 0; trial < 10; ++trial) {
            const std::vector<int64_t> placed_on = random_loads(rng, c.E, 9);
            const std::vector<int64_t> load = random_loads(rng, c.E, c.R == 2 ? 9 : 3);
            const std::vector<LplbEdge> edges = lplb_edges(c.topo, c.R, c.E, placed_on);
            const LplbSplit split = lplb_solve(c.R, c.E, load, edges);
            EXPECT_EQ(split.max_load, brute_force_lplb(c.R, c.E, load, edges))
                << "R " << c.R << " E " << c.E << " " << to_string(c.topo) << " trial " << trial;
            for (size_t j = 0; j < edges.size(); ++j) {
                EXPECT_GE(split.moved[j], 0);
                EXPECT_LE(split.moved[j], load[edges[j].expert]);
            }
            const std::vector<int64_t> alloc = lplb_alloc(c.R, c.E, load, edges, split);
            std::vector<int64_t> rows(c.R, 0);
            for (int e = 0; e < c.E; ++e) {
                int64_t sum = 0;
                for (int r = 0; r < c.R; ++r) {
                    EXPECT_GE(alloc[static_cast<size_t>(e) * c.R + r], 0);
                    sum += alloc[static_cast<size_t>(e) * c.R + r];
                    rows[r] += alloc[static_cast<size_t>(e) * c.R + r];
                }
                EXPECT_EQ(sum, load[e]);
            }
            EXPECT_EQ(rows, split.rank_load);
            std::vector<int64_t> base(c.R, 0);
            for (int e = 0; e < c.E; ++e) base[e / (c.E / c.R)] += load[e];
            improved += split.max_load < *std::max_element(base.begin(), base.end()) ? 1 : 0;
        }
    EXPECT_GE(improved, 20);
}

TEST(Lplb, GraphShapes) {
    const std::vector<std::vector<int32_t>> h = lplb_neighbours(LplbTopology::kHypercube, 8);
    for (int r = 0; r < 8; ++r) {
        std::vector<int32_t> want{r ^ 1, r ^ 2, r ^ 4};
        std::sort(want.begin(), want.end());
        EXPECT_EQ(h[r], want) << r;
    }
    const std::vector<std::vector<int32_t>> t = lplb_neighbours(LplbTopology::kTorus, 8);
    EXPECT_EQ(t[0], (std::vector<int32_t>{1, 3, 4}));  // 2 x 4: (0, 1), (0, 3), (1, 0)
    std::vector<int64_t> load(16);
    std::iota(load.begin(), load.end(), 0);
    const std::vector<LplbEdge> edges = lplb_edges(LplbTopology::kHypercube, 8, 16, load);
    std::vector<int> per_rank(8, 0);
    std::vector<int> seen(16, 0);
    for (const LplbEdge& e : edges) {
        EXPECT_EQ(e.expert / 2, e.home);
        EXPECT_NE(e.home, e.holder);
        ++per_rank[e.home];
        ++seen[e.expert];
    }
    for (int r = 0; r < 8; ++r) EXPECT_EQ(per_rank[r], 2) << "at most epn = 2 edges per rank";
    for (int e = 0; e < 16; ++e) EXPECT_LE(seen[e], 1);
    EXPECT_EQ(edges[0].expert, 1) << "rank 0's heaviest expert first";
    EXPECT_THROW(parse_lplb_topology("cube", 16), Error);
    EXPECT_THROW(lplb_neighbours(LplbTopology::kHypercube, 6), Error);
    EXPECT_THROW(parse_lplb_topology("mesh", 8), Error);
}

TEST(Llep, FairShareAndConservation) {
    Rng rng(7);
    for (int trial = 0; trial < 300; ++trial) {
        const int R = 1 + static_cast<int>(rng.next_u64() % 4), epn = 1 + static_cast<int>(rng.next_u64() % 3);
        const int E = R * epn;
        const std::vector<int64_t> load = random_loads(rng, E, trial % 2 ? 20 : 3);
        const std::vector<int64_t> alloc = llep_alloc(R, E, load);
        const int64_t N = std::accumulate(load.begin(), load.end(), int64_t{0});
        const int64_t cap = (N + R - 1) / R;
        std::vector<int64_t> base(R, 0), rows(R, 0);
        for (int e = 0; e < E; ++e) base[e / epn] += load[e];
        for (int e = 0; e < E; ++e) {
            int64_t sum = 0;
            for (int r = 0; r < R; ++r) {
                const int64_t a = alloc[static_cast<size_t>(e) * R + r];
                sum += a;
                rows[r] += a;
                if (r != e / epn && a > 0) {
                    EXPECT_GT(base[e / epn], cap) << "only an overloaded home spills";
                }
            }
            EXPECT_EQ(sum, load[e]);
        }
        for (int r = 0; r < R; ++r)
            if (rows[r] > base[r]) {
                EXPECT_LT(base[r], cap) << "only ranks below the cap receive";
            }
        const int64_t base_max = *std::max_element(base.begin(), base.end());
        EXPECT_EQ(*std::max_element(rows.begin(), rows.end()), base_max > cap ? cap : base_max) << "trial " << trial;
    }
    // Brute force, R = 2, E = 2: the best split of every expert's entries over both ranks is ceil(N / 2).
    for (int a = 0; a <= 6; ++a)
        for (int b = 0; b <= 6; ++b) {
            int64_t best = INT64_MAX;
            for (int x = 0; x <= a; ++x)
                for (int y = 0; y <= b; ++y) best = std::min<int64_t>(best, std::max(x + y, a + b - x - y));
            const std::vector<int64_t> alloc = llep_alloc(2, 2, std::vector<int64_t>{a, b});
            EXPECT_EQ(std::max(alloc[0] + alloc[2], alloc[1] + alloc[3]), best) << a << " " << b;
        }
}

TEST(EplbWindow, ScheduleAndWindow) {
    const EplbConfig cfg{.num_ranks = 2, .num_experts = 4, .slots_per_rank = 3};
    EplbWindow w(cfg, EplbSchedule{.step_interval = 3, .window = 2});
    EXPECT_TRUE(w.due(0));
    EXPECT_FALSE(w.due(1));
    EXPECT_TRUE(w.due(3));
    EXPECT_TRUE(w.due(6));
    EXPECT_EQ(w.place().slot_expert, eplb_place(cfg, std::vector<int64_t>{1, 1, 1, 1}).slot_expert);
    w.record(std::vector<int64_t>{100, 0, 0, 0});
    w.record(std::vector<int64_t>{0, 0, 5, 1});
    w.record(std::vector<int64_t>{0, 9, 5, 1});  // the first record leaves the window
    EXPECT_EQ(w.window_load(), (std::vector<int64_t>{0, 9, 10, 2}));
    EXPECT_EQ(w.place().slot_expert, eplb_place(cfg, std::vector<int64_t>{0, 9, 10, 2}).slot_expert);
    EXPECT_THROW(EplbWindow(cfg, EplbSchedule{.step_interval = 0, .window = 1}), Error);
}

TEST(EplbAlloc, MatchesRows) {
    Rng rng(3);
    for (int trial = 0; trial < 20; ++trial) {
        const EplbConfig cfg{.num_ranks = 4, .num_experts = 8, .slots_per_rank = 2 + trial % 3};
        const EplbPlacement p = eplb_place(cfg, random_loads(rng, 8, 50));
        const std::vector<int64_t> load = random_loads(rng, 8, 50);
        const std::vector<int64_t> alloc = eplb_alloc(p, load);
        const std::vector<int64_t> rows = eplb_rows(p, load);
        for (int r = 0; r < 4; ++r) {
            int64_t s = 0;
            for (int e = 0; e < 8; ++e) s += alloc[static_cast<size_t>(e) * 4 + r];
            EXPECT_EQ(s, rows[r]);
        }
        for (int e = 0; e < 8; ++e) {
            int64_t s = 0;
            for (int r = 0; r < 4; ++r) s += alloc[static_cast<size_t>(e) * 4 + r];
            EXPECT_EQ(s, load[e]);
        }
    }
}

TEST(StepModel, PhaseArithmetic) {
    const StepModel m{.H = 128, .ffn_hidden = 256, .tp = 16, .gemm_tflops = 1, .group_us = 2, .link_gbps = 1};
    // R = 2, E = 2: rank 0 sends 10 entries to expert 1 (home rank 1), rank 1 sends 6 to expert 1.
    const std::vector<int32_t> tpe{0, 10, 0, 6};
    SystemStep conv;
    conv.alloc = {0, 0, 0, 16};  // [E*R]: expert 1 all on rank 1
    const StepCost c = evaluate_step(m, 2, 2, tpe, conv);
    EXPECT_EQ(c.rows, (std::vector<int64_t>{0, 16}));
    EXPECT_DOUBLE_EQ(c.rows_max_over_mean, 2.0);
    const double token_ms = 10.0 * 128 * 2 / 1e6;  // rank 0 sends / rank 1 receives 10 rows of H bf16
    EXPECT_DOUBLE_EQ(c.token_phase_ms, token_ms);
    const double compute_ms = (16 * 18.0 * 128 * 256 / 1e12 * 1e6 + 2) * 1e-3;
    EXPECT_NEAR(c.compute_ms, compute_ms, 1e-12);
    EXPECT_NEAR(c.step_ms, 4 * token_ms + compute_ms, 1e-12);
    // Split 8 / 8 with a copy of expert 1 on rank 0: rank 0 keeps 8 of its 10, sends 2; weights and gradients move.
    SystemStep split;
    split.alloc = {0, 0, 8, 8};
    split.plan_us = 5;
    add_copy_moves(m, 2, 2, split);
    ASSERT_EQ(split.prefetch.size(), 1u);
    EXPECT_EQ(split.prefetch[0].from, 1);
    EXPECT_EQ(split.prefetch[0].to, 0);
    const StepCost s = evaluate_step(m, 2, 2, tpe, split);
    const double tok = 2.0 * 128 * 2 / 1e6, pre = m.weight_bytes() / 1e6, red = m.grad_bytes() / 1e6;
    const double comp = (16 * 18.0 * 128 * 256 / 1e12 * 1e6 + 2) * 1e-3;  // 8 rows pad to 16 on each rank
    EXPECT_NEAR(s.step_ms, 5e-3 + std::max(tok, pre) + comp + 3 * tok + red, 1e-12);
    EXPECT_EQ(s.weight_bytes, m.weight_bytes());
    EXPECT_EQ(s.grad_bytes, m.grad_bytes());
    SystemStep bad;
    bad.alloc = {0, 0, 0, 15};
    EXPECT_THROW(evaluate_step(m, 2, 2, tpe, bad), Error);
}

TEST(WorkloadRunner, EverySystemPerStep) {
    WorkloadRunConfig rc;
    rc.cfg = Config{.R = 4, .E = 16, .K = 2, .S = 64};
    rc.model = StepModel{.H = 64, .ffn_hidden = 64, .tp = 8};
    rc.eplb_schedule = EplbSchedule{.step_interval = 2, .window = 1};
    WorkloadRunner run(rc);
    const WorkloadSpec spec{.kind = Workload::kHotRank, .E = 16, .K = 2, .num_tokens = 256, .seed = 5};
    for (int step = 0; step < 3; ++step) {
        std::vector<WorkloadHistogram> h;
        for (int mb = 0; mb < 2; ++mb) h.push_back(workload_histogram(spec, 4, step, mb));
        std::vector<StepUnit> units;
        for (const WorkloadHistogram& x : h) units.push_back({.layer = 0, .tpe = x.tpe, .s = x.s});
        run.run_step(step, units);
    }
    const std::vector<SystemSeries>& s = run.series();
    ASSERT_EQ(s.size(), 3u + 3u + 2u) << "eplb at 1, 2 and 4 = epn slots (4 and -1 are one system)";
    EXPECT_EQ(s[5].label, "eplb/epn");
    for (const SystemSeries& x : s) {
        ASSERT_EQ(x.step_ms.size(), 3u) << x.label;
        for (int t = 0; t < 3; ++t) {
            EXPECT_GT(x.step_ms[t], 0) << x.label;
            EXPECT_EQ(std::accumulate(x.rows[t].begin(), x.rows[t].end(), int64_t{0}), 2 * 256 * 2) << x.label;
        }
    }
    const SystemSeries &au = s[0], &ev = s[1], &conv = s[2], &lplb = s[s.size() - 2], &llep = s.back();
    EXPECT_EQ(au.name, "evenep_auto");
    EXPECT_EQ(ev.name, "evenep_exact");
    EXPECT_EQ(lplb.name, "lplb");
    EXPECT_EQ(llep.name, "llep");
    for (int t = 0; t < 3; ++t) {
        EXPECT_DOUBLE_EQ(ev.rows_max_over_mean[t], 1.0);
        // evenep_auto: each unit's budget within [0, auto_slack], its rows within it (+ rounding of ⌈(1+ε)q⌉).
        ASSERT_EQ(au.slack_ppm.size(), 3u);
        EXPECT_GE(au.slack_ppm[t], 0);
        EXPECT_LE(au.slack_ppm[t], rc.auto_slack * 1e6);
        EXPECT_LE(au.rows_max_over_mean[t], 1.0 + rc.auto_slack + 0.01);
        EXPECT_DOUBLE_EQ(llep.rows_max_over_mean[t], 1.0);
        EXPECT_LE(lplb.rows_max_over_mean[t], conv.rows_max_over_mean[t]);
        EXPECT_GT(conv.rows_max_over_mean[t], 1.2) << "hot_rank is skewed";
    }
}

TEST(WorkloadRunner, PlacedHomes) {
    WorkloadRunConfig rc;
    rc.cfg = Config{.R = 4, .E = 64, .K = 2, .S = 1024};
    rc.model = StepModel{.H = 256, .ffn_hidden = 256, .tp = 8};
    rc.eplb_schedule = EplbSchedule{.step_interval = 4, .window = 2};
    rc.eplb_redundant = {1};
    rc.placed = true;
    // 4 contiguous hot experts (8x): one home rank holds about 35 % of the entries until the homes are re-placed.
    const WorkloadSpec spec{.kind = Workload::kHotRank, .E = 64, .K = 2, .num_tokens = 4096, .seed = 7};
    WorkloadRunner run(rc);
    constexpr int kSteps = 8;
    for (int step = 0; step < kSteps; ++step) {
        const WorkloadHistogram h = workload_histogram(spec, 4, step, 0);
        const StepUnit unit{.layer = 0, .tpe = h.tpe, .s = h.s};
        run.run_step(step, std::span<const StepUnit>(&unit, 1));
    }
    const std::vector<SystemSeries>& s = run.series();
    const SystemSeries &au = s[0], &pl = s.back();
    ASSERT_EQ(pl.name, "evenep_placed");
    for (int t = 0; t < kSteps; ++t)
        EXPECT_EQ(std::accumulate(pl.rows[t].begin(), pl.rows[t].end(), int64_t{0}), 4096 * 2);
    // Step 4 re-places the homes from steps 2..3's loads; steps 5.. run on the new homes.
    for (int t = 5; t < kSteps; ++t) {
        EXPECT_LT(pl.weight_bytes[t], au.weight_bytes[t]) << "step " << t << ": fewer copies on spread homes";
        EXPECT_LT(pl.step_ms[t], au.step_ms[t]) << "step " << t;
    }
    EXPECT_GT(pl.weight_bytes[4], pl.weight_bytes[5]) << "the re-placement step moves the homes";
    rc.placed = false;
    WorkloadRunner plain(rc);
    for (const SystemSeries& x : plain.series()) EXPECT_NE(x.name, "evenep_placed");
}

}  // namespace
}  // namespace evenep::perf
