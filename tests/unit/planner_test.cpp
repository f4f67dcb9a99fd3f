// Planner property tests (SPEC §2, §3). Every instance is planned in both modes and checked with the
// independent validator (validate_plan + validate_dst) and with the properties below. Seeds are fixed and
// printed in every failure (SCOPED_TRACE). About 14,000 instances in ~2 s; EVENEP_PLANNER_SOAK=<n> runs the
// shape sweep with n seeds per configuration instead of 1.
//
// Cases:
//   PlannerShapes/PlannerSweep.RandomRoutings/R<r>_epn<n>   R in {1,2,3,4,8,16} x epn in {1..8,48}: random
//       routings (this file's own generator) over K in 1..8, tp in {1,4,128}, B in {epn, smaller}; uniform,
//       skewed, masked, unequal s, hot-set variants. Checks: validators pass; exact balance q_r, conservation,
//       remote <= epn; reference alloc == the greedy re-implemented below from SPEC §3.1/§3.2; optimized no worse
//       than reference on cost 1 (max_rank_copy_traffic) and cost 2 (total_copies); same input twice ->
//       identical plan and dst.
//   PlannerShapes/PlannerSweep.RandomHistograms/R<r>_epn<n>  the same plan-level checks on histograms without a
//       routing (ranks with fewer than s*K entries, heavy skew).
//   PlannerLibraryGenerators.Lognormal / TargetMaxvio / Adversarial   the library generators, every kind.
//   PlannerLibraryGenerators.MoonEPBenchmarkPoint / K3Shape               the SPEC §7 shapes (reduced S).
//   PlannerTheorem2.SeedExampleNeedsTwo          E=8, R=4, S*K=6: rank 0 needs 2 remote experts in both modes.
//   PlannerTheorem2.BoundHoldsAcrossShapes        ceil(E(R-1)/R^2) on rank 0 for many (E, R), both modes.
//   PlannerTheorem2.LibraryGenerator              the same bound on make_adversarial(kTheorem2).
//   PlannerDeterminism.PlannerReuseMatchesFreshPlans   one Planner + one Plan reused over many inputs.
//   PlannerDeterminism.PlanObjectReusedAcrossConfigs    one Plan object filled by planners of different shapes.
//   PlannerEdges.SingleRank / AllMaskedOnSomeRanks / FewerEntriesThanRanks / NoEntriesAtAll / TopOne /
//       AllTokensOnOneExpert / EmptyExperts / FullCapacityEqualS
//   PlannerInputErrors.TpeWrongSize / SWrongSize / SAboveCapacity / SZero / NegativeTpe / RowSumAboveSK /
//       PlannerStaysUsableAfterAnError
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/plan_testing.hpp"
#include "evenep/error.hpp"
#include "evenep/plan.hpp"
#include "evenep/routing.hpp"
#include "evenep/validate.hpp"

namespace evenep {
namespace {

using testing::RoutingOptions;

// ---------------------------------------------------------------------------------------------------------
// The reference greedy, written again from the SPEC text (§3.1 rank-level transfers, §3.2 expert split) with
// vectors and plain loops. Returns alloc[e][r] (empty vector if a donor ran out of entries, which Theorem 1
// says cannot happen).
// ---------------------------------------------------------------------------------------------------------
std::vector<int64_t> spec_reference_alloc(const Config& cfg, const std::vector<int32_t>& tpe) {
    const int R = cfg.R, E = cfg.E, epn = cfg.epn();
    std::vector<int64_t> load_of_expert(E, 0);
    int64_t n = 0;
    for (int e = 0; e < E; ++e) {
        for (int r = 0; r < R; ++r) load_of_expert[e] += tpe[r * E + e];
        n += load_of_expert[e];
    }
    std::vector<int64_t> balance(R);
    for (int h = 0; h < R; ++h) {
        int64_t load = 0;
        for (int e = h * epn; e < (h + 1) * epn; ++e) load += load_of_expert[e];
        const int64_t q = n / R + (h < n % R ? 1 : 0);
        balance[h] = load - q;
    }
    std::vector<std::vector<int64_t>> z(R, std::vector<int64_t>(R, 0));
    while (true) {
        int h = 0, u = 0;
        for (int r = 0; r < R; ++r) {
            if (balance[r] > balance[h]) h = r;
            if (balance[r] < balance[u]) u = r;
        }
        if (balance[h] <= 0) break;
        z[h][u] = -balance[u];
        balance[h] -= z[h][u];
        balance[u] = 0;
    }
    std::vector<int64_t> alloc(static_cast<size_t>(E) * R, 0);
    std::vector<int64_t> remaining = load_of_expert;
    for (int e = 0; e < E; ++e) alloc[e * R + e / epn] = load_of_expert[e];
    for (int h = 0; h < R; ++h) {
        while (true) {
            int d = 0;
            for (int r = 0; r < R; ++r)
                if (z[h][r] > z[h][d]) d = r;
            if (z[h][d] == 0) break;
            int e = h * epn;
            for (int f = h * epn; f < (h + 1) * epn; ++f)
                if (remaining[f] > remaining[e]) e = f;
            const int64_t moved = std::min(remaining[e], z[h][d]);
            if (moved <= 0) return {};
            remaining[e] -= moved;
            z[h][d] -= moved;
            alloc[e * R + h] -= moved;
            alloc[e * R + d] += moved;
        }
    }
    return alloc;
}

// Invariants 1-3 checked directly with the test's own arithmetic (the validator checks them too; this keeps the
// property visible in the test and independent of validate.cpp).
void expect_invariants(const Plan& plan, const std::vector<int32_t>& tpe) {
    const int R = plan.R(), E = plan.E(), epn = plan.cfg.epn();
    int64_t n = 0;
    for (int32_t v : tpe) n += v;
    for (int r = 0; r < R; ++r) {
        int64_t on_rank = 0;
        int remote = 0;
        for (int e = 0; e < E; ++e) {
            ASSERT_GE(plan.alloc_at(e, r), 0) << "expert " << e << " rank " << r;
            on_rank += plan.alloc_at(e, r);
            if (e / epn != r && plan.alloc_at(e, r) > 0) ++remote;
        }
        EXPECT_EQ(on_rank, n / R + (r < n % R ? 1 : 0)) << "balance on rank " << r;
        EXPECT_LE(remote, epn) << "remote experts on rank " << r;
        EXPECT_LE(plan.copies_received[r], plan.cfg.num_slots()) << "prefetched copies on rank " << r;
    }
    for (int e = 0; e < E; ++e) {
        int64_t total = 0, routed = 0;
        for (int r = 0; r < R; ++r) {
            total += plan.alloc_at(e, r);
            routed += tpe[r * E + e];
        }
        EXPECT_EQ(total, routed) << "conservation of expert " << e;
    }
}

// All plan-level properties of one (cfg, tpe, s) in both modes. `routing` (optional) adds the dst checks.
void check_instance(const Config& cfg,
                    const std::vector<int32_t>& tpe,
                    const std::vector<int32_t>& s,
                    const Routing* routing) {
    Plan plans[2];
    const PlannerMode modes[2] = {PlannerMode::kReference, PlannerMode::kOptimized};
    for (int m = 0; m < 2; ++m) {
        SCOPED_TRACE(std::string("mode ") + std::string(to_string(modes[m])));
        Plan& plan = plans[m];
        plan = make_plan(cfg, modes[m], tpe, s);
        const ValidationReport report = validate_plan(plan);
        ASSERT_TRUE(report.ok()) << report.summary();
        ASSERT_NO_FATAL_FAILURE(expect_invariants(plan, tpe));
        const Plan again = make_plan(cfg, modes[m], tpe, s);
        ASSERT_EQ(testing::plan_diff(plan, again), "") << "same input twice gave different plans";
        if (routing != nullptr) {
            const auto dst = testing::all_dst(plan, *routing);
            const ValidationReport dst_report = validate_dst(plan, *routing, dst);
            ASSERT_TRUE(dst_report.ok()) << dst_report.summary();
            ASSERT_EQ(dst, testing::all_dst(again, *routing)) << "same input twice gave different dst";
        }
    }
    const std::vector<int64_t> want = spec_reference_alloc(cfg, tpe);
    ASSERT_FALSE(want.empty()) << "the SPEC greedy ran a donor dry (Theorem 1 violated?)";
    for (int e = 0; e < cfg.E; ++e)
        for (int r = 0; r < cfg.R; ++r)
            ASSERT_EQ(plans[0].alloc_at(e, r), want[static_cast<size_t>(e) * cfg.R + r])
                << "reference alloc differs from the SPEC greedy at expert " << e << " rank " << r;
    EXPECT_LE(plans[1].cost.max_rank_copy_traffic, plans[0].cost.max_rank_copy_traffic)
        << "optimized worse than reference on cost 1";
    EXPECT_LE(plans[1].cost.total_copies, plans[0].cost.total_copies) << "optimized worse than reference on cost 2";
}

void check_routing(const Config& cfg, const Routing& routing) {
    check_instance(cfg, testing::histogram_of(routing), routing.s, &routing);
}

std::string config_label(const Config& cfg, uint64_t seed) { return cfg.to_string() + " seed=" + std::to_string(seed); }

// ---------------------------------------------------------------------------------------------------------
// The shape sweep.
// ---------------------------------------------------------------------------------------------------------
struct Shape {
    int R;
    int epn;
};

// Seeds per sweep configuration: 1 in CI; EVENEP_PLANNER_SOAK=<n> runs n seeds per configuration (soak testing).
int soak_rounds() {
    const char* v = std::getenv("EVENEP_PLANNER_SOAK");
    return v != nullptr && std::atoi(v) > 0 ? std::atoi(v) : 1;
}

class PlannerSweep : public ::testing::TestWithParam<Shape> {
  protected:
    // K in 1..8 (K <= E), tp in {1, 4, 128}, B in {epn, smaller}: every combination once, seeds from the shape.
    template <typename F>
    void for_each_config(F&& body) {
        const Shape sh = GetParam();
        const int E = sh.R * sh.epn;
        int counter = 0;
        for (int K = 1; K <= 8; ++K) {
            if (K > E) continue;
            for (int tp : {1, 4, 128})
                for (int b_choice = 0; b_choice < 2; ++b_choice)
                    for (int round = 0; round < soak_rounds(); ++round) {
                        const uint64_t seed = 1000003ull * sh.R + 7919ull * sh.epn + 131ull * K + 17ull * tp +
                                              b_choice + 0x100000000ull * round;
                        testing::TestRng rng(seed);
                        Config cfg;
                        cfg.R = sh.R;
                        cfg.E = E;
                        cfg.K = K;
                        // Small S keeps the sweep fast; big shapes get fewer tokens per expert (sparse, many empty).
                        cfg.S = sh.R * sh.epn >= 256 ? rng.between(1, 12) : rng.between(1, 40);
                        cfg.tp = tp;
                        cfg.B =
                            b_choice == 0 ? (rng.chance(0.5) ? -1 : sh.epn) : rng.between(0, std::max(0, sh.epn - 1));
                        SCOPED_TRACE(config_label(cfg, seed));
                        body(cfg, seed, counter++);
                        if (HasFatalFailure()) return;
                    }
        }
    }
};

TEST_P(PlannerSweep, RandomRoutings) {
    for_each_config([&](const Config& cfg, uint64_t seed, int counter) {
        for (int variant = 0; variant < 2; ++variant) {
            const uint64_t routing_seed = seed + 0x10000ull * variant;
            RoutingOptions opt;
            switch ((2 * counter + variant) % 6) {
                case 0:  // uniform popularity
                    break;
                case 1:
                    opt.skew = 1.0;
                    break;
                case 2:  // heavy tail
                    opt.skew = 3.0;
                    break;
                case 3:
                    opt.mask_prob = 0.3;
                    opt.unequal_s = true;
                    break;
                case 4:
                    opt.skew = 0.5;
                    opt.unequal_s = true;
                    break;
                case 5:  // a hot set of K..2K experts anywhere in the group
                    opt.num_hot = std::min(cfg.E, cfg.K + static_cast<int>(routing_seed % (cfg.K + 1)));
                    opt.hot_first = static_cast<int>(routing_seed % (cfg.E - opt.num_hot + 1));
                    break;
            }
            SCOPED_TRACE(testing::describe(opt) + " routing seed=" + std::to_string(routing_seed));
            check_routing(cfg, testing::random_routing(cfg, routing_seed, opt));
            if (HasFatalFailure()) return;
        }
    });
}

TEST_P(PlannerSweep, RandomHistograms) {
    for_each_config([&](const Config& cfg, uint64_t seed, int counter) {
        testing::TestRng rng(seed ^ 0x5eedull);
        std::vector<int32_t> s(cfg.R);
        for (int32_t& v : s) v = counter % 2 == 0 ? cfg.S : rng.between(1, cfg.S);
        const double skew = 0.25 * (counter % 9);
        SCOPED_TRACE("histogram skew=" + std::to_string(skew));
        check_instance(cfg, testing::random_tpe(cfg, s, seed, skew), s, nullptr);
    });
}

std::vector<Shape> all_shapes() {
    std::vector<Shape> shapes;
    for (int R : {1, 2, 3, 4, 8, 16})
        for (int epn : {1, 2, 3, 4, 5, 6, 7, 8, 48}) shapes.push_back({R, epn});
    return shapes;
}

INSTANTIATE_TEST_SUITE_P(PlannerShapes,
                         PlannerSweep,
                         ::testing::ValuesIn(all_shapes()),
                         [](const ::testing::TestParamInfo<Shape>& info) {
                             return "R" + std::to_string(info.param.R) + "_epn" + std::to_string(info.param.epn);
                         });

// ---------------------------------------------------------------------------------------------------------
// Library generators (src/core/routing.cpp).
// ---------------------------------------------------------------------------------------------------------
struct GenShape {
    int R, E, K, S, tp, B;
};

const std::vector<GenShape>& generator_shapes() {
    static const std::vector<GenShape> shapes = {
        {1, 8, 2, 9, 1, -1},     {2, 2, 1, 5, 4, -1},      {2, 16, 4, 13, 1, 3},     {3, 24, 6, 10, 4, -1},
        {4, 16, 2, 17, 128, -1}, {4, 32, 8, 20, 1, 2},     {8, 64, 4, 32, 4, -1},    {8, 64, 8, 24, 128, 5},
        {16, 128, 6, 12, 1, -1}, {16, 768, 8, 8, 128, 20}, {8, 384, 8, 40, 128, -1},
    };
    return shapes;
}

Config config_of(const GenShape& g) {
    Config cfg;
    cfg.R = g.R;
    cfg.E = g.E;
    cfg.K = g.K;
    cfg.S = g.S;
    cfg.tp = g.tp;
    cfg.B = g.B;
    return cfg;
}

TEST(PlannerLibraryGenerators, Lognormal) {
    for (const GenShape& g : generator_shapes())
        for (double sigma : {0.0, 0.5, 1.5, 4.0})
            for (uint64_t seed : {1ull, 2ull}) {
                const Config cfg = config_of(g);
                SCOPED_TRACE(config_label(cfg, seed) + " lognormal sigma=" + std::to_string(sigma));
                check_routing(cfg, make_lognormal(RoutingSpec{g.R, g.E, g.K, g.S, seed}, sigma));
                if (HasFatalFailure()) return;
            }
}

TEST(PlannerLibraryGenerators, TargetMaxvio) {
    for (const GenShape& g : generator_shapes())
        for (double target : {0.2, 1.0, 10.0}) {
            const Config cfg = config_of(g);
            SCOPED_TRACE(config_label(cfg, 7) + " target maxvio=" + std::to_string(target));
            check_routing(cfg, make_target_maxvio(RoutingSpec{g.R, g.E, g.K, g.S, 7}, target));
            if (HasFatalFailure()) return;
        }
}

TEST(PlannerLibraryGenerators, Adversarial) {
    for (const GenShape& g : generator_shapes())
        for (Adversarial kind : all_adversarial())
            for (uint64_t seed : {3ull, 4ull}) {
                const Config cfg = config_of(g);
                SCOPED_TRACE(config_label(cfg, seed) + " adversarial " + to_string(kind));
                check_routing(cfg, make_adversarial(RoutingSpec{g.R, g.E, g.K, g.S, seed}, kind));
                if (HasFatalFailure()) return;
            }
}

TEST(PlannerLibraryGenerators, MoonEPBenchmarkPoint) {
    // SPEC §7: R=8, E=384, K=8 at maxvio 0.2, 1, 10, 20 (S reduced from 8192 to keep the test fast).
    const Config cfg{.R = 8, .E = 384, .K = 8, .S = 512, .B = -1, .tp = 128};
    for (double target : {0.2, 1.0, 10.0, 20.0}) {
        SCOPED_TRACE(config_label(cfg, 5) + " target maxvio=" + std::to_string(target));
        check_routing(cfg, make_target_maxvio(RoutingSpec{cfg.R, cfg.E, cfg.K, cfg.S, 5}, target));
        if (HasFatalFailure()) return;
    }
}

TEST(PlannerLibraryGenerators, K3Shape) {
    // SPEC §7: E=896, K=16 at R=32 (epn 28), heavy and light skew, B = epn and B < epn.
    for (int b : {-1, 7})
        for (double sigma : {0.3, 2.0}) {
            const Config cfg{.R = 32, .E = 896, .K = 16, .S = 48, .B = b, .tp = 128};
            SCOPED_TRACE(config_label(cfg, 9) + " lognormal sigma=" + std::to_string(sigma));
            check_routing(cfg, make_lognormal(RoutingSpec{cfg.R, cfg.E, cfg.K, cfg.S, 9}, sigma));
            if (HasFatalFailure()) return;
        }
}

// ---------------------------------------------------------------------------------------------------------
// Theorem 2 (SPEC §3.5).
// ---------------------------------------------------------------------------------------------------------
int remote_on_rank0(const Plan& plan) {
    int remote = 0;
    for (int e = plan.cfg.epn(); e < plan.E(); ++e) remote += plan.alloc_at(e, 0) > 0 ? 1 : 0;
    return remote;
}

TEST(PlannerTheorem2, SeedExampleNeedsTwo) {
    // E=8, R=4, S*K=6: every rank routes one entry to each of experts 2..7.
    const Config cfg{.R = 4, .E = 8, .K = 2, .S = 3, .B = -1, .tp = 1};
    ASSERT_EQ(theorem2_lower_bound(8, 4), 2);
    const Routing routing = testing::theorem2_routing(cfg, 1);
    ASSERT_EQ(routing.s[0] * cfg.K, 6);
    for (PlannerMode mode : {PlannerMode::kReference, PlannerMode::kOptimized}) {
        SCOPED_TRACE(std::string(to_string(mode)));
        const Plan plan = make_plan(cfg, mode, testing::histogram_of(routing), routing.s);
        EXPECT_TRUE(validate_dst(plan, routing, testing::all_dst(plan, routing)).ok());
        EXPECT_EQ(plan.q[0], 6);
        EXPECT_EQ(plan.remote_experts[0], remote_on_rank0(plan));
        EXPECT_GE(remote_on_rank0(plan), 2);
        EXPECT_LE(remote_on_rank0(plan), cfg.epn());
    }
}

TEST(PlannerTheorem2, BoundHoldsAcrossShapes) {
    int checked = 0;
    for (int R : {2, 3, 4, 8, 16})
        for (int epn : {1, 2, 3, 4, 8, 48})
            for (int K : {1, 2, 4, 8}) {
                const int E = R * epn, others = E - epn;
                if (K > others) continue;
                // per_rank entries to each non-rank-0 expert; s = per_rank*others/K must be an integer.
                int per_rank = 1;
                while (per_rank * others % K != 0) ++per_rank;
                const Config cfg{.R = R, .E = E, .K = K, .S = per_rank * others / K, .B = -1, .tp = 4};
                const Routing routing = testing::theorem2_routing(cfg, per_rank);
                const std::vector<int32_t> tpe = testing::histogram_of(routing);
                for (PlannerMode mode : {PlannerMode::kReference, PlannerMode::kOptimized}) {
                    SCOPED_TRACE(cfg.to_string() + " " + std::string(to_string(mode)));
                    const Plan plan = make_plan(cfg, mode, tpe, routing.s);
                    ASSERT_TRUE(validate_dst(plan, routing, testing::all_dst(plan, routing)).ok());
                    EXPECT_GE(remote_on_rank0(plan), theorem2_lower_bound(E, R));
                    ++checked;
                }
            }
    EXPECT_GT(checked, 100);
}

TEST(PlannerTheorem2, LibraryGenerator) {
    int bound_checked = 0;
    for (const GenShape& g : generator_shapes()) {
        if (g.R < 2) continue;
        const Config cfg = config_of(g);
        const Routing routing = make_adversarial(RoutingSpec{g.R, g.E, g.K, g.S, 11}, Adversarial::kTheorem2);
        const std::vector<int32_t> tpe = testing::histogram_of(routing);
        // The bound assumes exactly even loads on the other experts; check the instance is that one.
        int64_t first = -1;
        bool even = true;
        for (int e = 0; e < g.E; ++e) {
            int64_t t = 0;
            for (int r = 0; r < g.R; ++r) t += tpe[r * g.E + e];
            if (e < cfg.epn()) {
                EXPECT_EQ(t, 0) << cfg.to_string() << ": rank 0's expert " << e << " has load";
            } else if (first < 0) {
                first = t;
            } else {
                even = even && t == first;
            }
        }
        for (PlannerMode mode : {PlannerMode::kReference, PlannerMode::kOptimized}) {
            SCOPED_TRACE(cfg.to_string() + " " + std::string(to_string(mode)));
            const Plan plan = make_plan(cfg, mode, tpe, routing.s);
            ASSERT_TRUE(validate_dst(plan, routing, testing::all_dst(plan, routing)).ok());
            if (even) {
                EXPECT_GE(remote_on_rank0(plan), theorem2_lower_bound(g.E, g.R));
                ++bound_checked;
            }
        }
    }
    EXPECT_GT(bound_checked, 0) << "make_adversarial(kTheorem2) never produced exactly even loads";
}

// ---------------------------------------------------------------------------------------------------------
// Determinism with Planner reuse.
// ---------------------------------------------------------------------------------------------------------
TEST(PlannerDeterminism, PlannerReuseMatchesFreshPlans) {
    const Config cfg{.R = 8, .E = 48, .K = 4, .S = 30, .B = 4, .tp = 4};
    for (PlannerMode mode : {PlannerMode::kReference, PlannerMode::kOptimized}) {
        Planner planner(cfg, mode);
        Plan reused;
        for (uint64_t seed = 100; seed < 140; ++seed) {
            SCOPED_TRACE(config_label(cfg, seed) + " " + std::string(to_string(mode)));
            RoutingOptions opt;
            opt.skew = 0.1 * static_cast<double>(seed % 30);
            opt.mask_prob = seed % 3 == 0 ? 0.4 : 0.0;
            opt.unequal_s = seed % 2 == 0;
            const Routing routing = testing::random_routing(cfg, seed, opt);
            const std::vector<int32_t> tpe = testing::histogram_of(routing);
            planner.plan(tpe, routing.s, reused);
            const Plan fresh = make_plan(cfg, mode, tpe, routing.s);
            ASSERT_EQ(testing::plan_diff(reused, fresh), "");
            ASSERT_EQ(testing::all_dst(reused, routing), testing::all_dst(fresh, routing));
        }
    }
}

TEST(PlannerDeterminism, PlanObjectReusedAcrossConfigs) {
    // The same Plan object goes through planners of growing and shrinking shapes; every result equals a fresh plan.
    const std::vector<Config> configs = {
        {.R = 8, .E = 64, .K = 6, .S = 20, .B = -1, .tp = 128}, {.R = 2, .E = 4, .K = 2, .S = 9, .B = 1, .tp = 1},
        {.R = 16, .E = 128, .K = 8, .S = 12, .B = 3, .tp = 4},  {.R = 3, .E = 9, .K = 3, .S = 7, .B = -1, .tp = 4},
        {.R = 1, .E = 4, .K = 2, .S = 5, .B = -1, .tp = 1},
    };
    Plan reused;
    for (int round = 0; round < 2; ++round)
        for (size_t i = 0; i < configs.size(); ++i) {
            const Config& cfg = configs[i];
            const uint64_t seed = 500 + 10 * round + i;
            SCOPED_TRACE(config_label(cfg, seed));
            const Routing routing = testing::random_routing(cfg, seed, RoutingOptions{.skew = 2.0, .unequal_s = true});
            const std::vector<int32_t> tpe = testing::histogram_of(routing);
            const PlannerMode mode = (round + i) % 2 == 0 ? PlannerMode::kOptimized : PlannerMode::kReference;
            Planner planner(cfg, mode);
            planner.plan(tpe, routing.s, reused);
            ASSERT_EQ(testing::plan_diff(reused, make_plan(cfg, mode, tpe, routing.s)), "");
            ASSERT_TRUE(validate_dst(reused, routing, testing::all_dst(reused, routing)).ok());
        }
}

// ---------------------------------------------------------------------------------------------------------
// Edge cases.
// ---------------------------------------------------------------------------------------------------------
Routing routing_from(const Config& cfg, const std::vector<std::vector<int32_t>>& ids) {
    Routing r;
    r.R = cfg.R;
    r.E = cfg.E;
    r.K = cfg.K;
    r.S = cfg.S;
    r.topk_idx = ids;
    for (const auto& v : ids) r.s.push_back(static_cast<int32_t>(v.size()) / cfg.K);
    return r;
}

TEST(PlannerEdges, SingleRank) {
    for (int epn : {1, 3, 8}) {
        const Config cfg{.R = 1, .E = epn, .K = std::min(epn, 2), .S = 17, .B = -1, .tp = 4};
        const Routing routing = testing::random_routing(cfg, 5, RoutingOptions{.skew = 2.0, .mask_prob = 0.2});
        SCOPED_TRACE(cfg.to_string());
        check_routing(cfg, routing);
        const Plan plan = make_plan(cfg, PlannerMode::kOptimized, testing::histogram_of(routing), routing.s);
        EXPECT_EQ(plan.remote_experts[0], 0);
        EXPECT_EQ(plan.crossing_out[0], 0);
        EXPECT_EQ(plan.cost.total_copies, 0);
    }
}

TEST(PlannerEdges, AllMaskedOnSomeRanks) {
    const Config cfg{.R = 4, .E = 16, .K = 3, .S = 6, .B = -1, .tp = 4};
    Routing routing = testing::random_routing(cfg, 21, RoutingOptions{.skew = 1.0});
    for (int r : {0, 2}) std::fill(routing.topk_idx[r].begin(), routing.topk_idx[r].end(), -1);
    check_routing(cfg, routing);
    const Plan plan = make_plan(cfg, PlannerMode::kReference, testing::histogram_of(routing), routing.s);
    EXPECT_EQ(plan.total_entries(), 2 * 6 * 3);
    for (int r = 0; r < 4; ++r) EXPECT_EQ(plan.q[r], 9) << "rank " << r;
}

TEST(PlannerEdges, FewerEntriesThanRanks) {
    // N = 3 < R = 8: ranks 0..2 compute one entry each, the rest nothing.
    const Config cfg{.R = 8, .E = 16, .K = 2, .S = 2, .B = -1, .tp = 128};
    std::vector<std::vector<int32_t>> ids(8, std::vector<int32_t>(4, -1));
    ids[5] = {15, -1, -1, 14};
    ids[6] = {-1, -1, 15, -1};
    const Routing routing = routing_from(cfg, ids);
    check_routing(cfg, routing);
    for (PlannerMode mode : {PlannerMode::kReference, PlannerMode::kOptimized}) {
        const Plan plan = make_plan(cfg, mode, testing::histogram_of(routing), routing.s);
        for (int r = 0; r < 8; ++r) EXPECT_EQ(plan.q[r], r < 3 ? 1 : 0) << "rank " << r;
    }
}

TEST(PlannerEdges, NoEntriesAtAll) {
    const Config cfg{.R = 4, .E = 8, .K = 2, .S = 3, .B = -1, .tp = 4};
    const Routing routing = routing_from(cfg, std::vector<std::vector<int32_t>>(4, std::vector<int32_t>(6, -1)));
    check_routing(cfg, routing);
    const Plan plan = make_plan(cfg, PlannerMode::kOptimized, testing::histogram_of(routing), routing.s);
    for (int r = 0; r < 4; ++r) {
        EXPECT_EQ(plan.q[r], 0);
        EXPECT_EQ(plan.rows_used(r), 0);
    }
}

TEST(PlannerEdges, TopOne) {
    for (uint64_t seed : {1ull, 2ull, 3ull}) {
        const Config cfg{.R = 4, .E = 12, .K = 1, .S = 25, .B = -1, .tp = 1};
        SCOPED_TRACE(config_label(cfg, seed));
        check_routing(cfg, testing::random_routing(cfg, seed, RoutingOptions{.skew = 2.5}));
        // Equal s and nothing masked: every rank computes exactly s*K.
        const Routing routing = testing::random_routing(cfg, seed);
        const Plan plan = make_plan(cfg, PlannerMode::kOptimized, testing::histogram_of(routing), routing.s);
        for (int r = 0; r < 4; ++r) EXPECT_EQ(plan.q[r], 25);
    }
}

TEST(PlannerEdges, AllTokensOnOneExpert) {
    for (int R : {2, 4, 8})
        for (int hot : {0, R - 1}) {
            const int epn = 3;
            const Config cfg{.R = R, .E = R * epn, .K = 1, .S = 10, .B = -1, .tp = 4};
            std::vector<std::vector<int32_t>> ids(R, std::vector<int32_t>(10, hot * epn + 1));
            SCOPED_TRACE(cfg.to_string() + " hot expert " + std::to_string(hot * epn + 1));
            const Routing routing = routing_from(cfg, ids);
            check_routing(cfg, routing);
            const Plan plan = make_plan(cfg, PlannerMode::kOptimized, testing::histogram_of(routing), routing.s);
            // Every rank computes 10 entries of the one expert; every rank but its home holds one copy.
            for (int r = 0; r < R; ++r) EXPECT_EQ(plan.alloc_at(hot * epn + 1, r), 10) << "rank " << r;
            EXPECT_EQ(plan.cost.total_copies, R - 1);
        }
}

TEST(PlannerEdges, EmptyExperts) {
    // Only experts 1 and 6 are ever picked (K = 2): most experts are empty, so are most groups.
    const Config cfg{.R = 4, .E = 8, .K = 2, .S = 7, .B = 1, .tp = 4};
    std::vector<std::vector<int32_t>> ids(4);
    for (int r = 0; r < 4; ++r)
        for (int t = 0; t < 7; ++t) {
            ids[r].push_back(t % 2 == 0 ? 1 : 6);
            ids[r].push_back(t % 2 == 0 ? 6 : 1);
        }
    const Routing routing = routing_from(cfg, ids);
    check_routing(cfg, routing);
}

TEST(PlannerEdges, FullCapacityEqualS) {
    // Equal s = S, nothing masked: q_r = S*K exactly on every rank, and the used rows fit NvS.
    for (int tp : {1, 4, 128}) {
        const Config cfg{.R = 8, .E = 64, .K = 8, .S = 16, .B = -1, .tp = tp};
        const Routing routing = testing::random_routing(cfg, 77, RoutingOptions{.skew = 3.0});
        SCOPED_TRACE(cfg.to_string());
        check_routing(cfg, routing);
        const Plan plan = make_plan(cfg, PlannerMode::kOptimized, testing::histogram_of(routing), routing.s);
        for (int r = 0; r < 8; ++r) {
            EXPECT_EQ(plan.q[r], 16 * 8);
            EXPECT_LE(plan.rows_used(r), cfg.recv_rows());
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// Input errors: evenep::Error naming the rank (and the value).
// ---------------------------------------------------------------------------------------------------------
class PlannerInputErrors : public ::testing::Test {
  protected:
    const Config cfg_{.R = 4, .E = 8, .K = 2, .S = 5, .B = -1, .tp = 4};
    std::vector<int32_t> tpe_ = std::vector<int32_t>(4 * 8, 1);  // 8 entries per rank <= 5*2
    std::vector<int32_t> s_ = std::vector<int32_t>(4, 5);

    // Expects make_plan to throw evenep::Error whose message contains every needle.
    void expect_error(const std::vector<int32_t>& tpe,
                      const std::vector<int32_t>& s,
                      const std::vector<std::string>& needles) {
        for (PlannerMode mode : {PlannerMode::kReference, PlannerMode::kOptimized}) {
            try {
                (void)make_plan(cfg_, mode, tpe, s);
                ADD_FAILURE() << "no error thrown";
            } catch (const Error& err) {
                EXPECT_EQ(err.kind(), ErrorKind::kInvalidArgument);
                for (const std::string& n : needles)
                    EXPECT_NE(std::string(err.what()).find(n), std::string::npos)
                        << "message '" << err.what() << "' lacks '" << n << "'";
            }
        }
    }
};

TEST_F(PlannerInputErrors, TpeWrongSize) {
    std::vector<int32_t> tpe(tpe_.begin(), tpe_.end() - 1);
    expect_error(tpe, s_, {"tpe", "31", "32"});
}

TEST_F(PlannerInputErrors, SWrongSize) { expect_error(tpe_, {5, 5, 5}, {"s has 3"}); }

TEST_F(PlannerInputErrors, SAboveCapacity) {
    std::vector<int32_t> s = s_;
    s[2] = 6;
    expect_error(tpe_, s, {"rank 2", "6"});
}

TEST_F(PlannerInputErrors, SZero) {
    std::vector<int32_t> s = s_;
    s[3] = 0;
    std::vector<int32_t> tpe = tpe_;
    for (int e = 0; e < 8; ++e) tpe[3 * 8 + e] = 0;
    expect_error(tpe, s, {"rank 3", "s = 0"});
}

TEST_F(PlannerInputErrors, NegativeTpe) {
    std::vector<int32_t> tpe = tpe_;
    tpe[1 * 8 + 5] = -2;
    expect_error(tpe, s_, {"rank 1", "-2"});
}

TEST_F(PlannerInputErrors, RowSumAboveSK) {
    std::vector<int32_t> tpe = tpe_;
    tpe[2 * 8 + 0] = 4;  // row sum 11 > s*K = 10
    expect_error(tpe, s_, {"rank 2", "11", "10"});
}

TEST_F(PlannerInputErrors, PlannerStaysUsableAfterAnError) {
    Planner planner(cfg_, PlannerMode::kOptimized);
    Plan plan;
    std::vector<int32_t> bad = tpe_;
    bad[0] = -1;
    EXPECT_THROW(planner.plan(bad, s_, plan), Error);
    planner.plan(tpe_, s_, plan);
    EXPECT_TRUE(validate_plan(plan).ok());
    EXPECT_EQ(testing::plan_diff(plan, make_plan(cfg_, PlannerMode::kOptimized, tpe_, s_)), "");
}

}  // namespace
}  // namespace evenep
