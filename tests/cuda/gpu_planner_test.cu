// GPU planner tests: every plan array, the costs and every encoded destination bit-identical to the CPU planner.
//
// Cases:
//   GpuPlannerTest.RandomHistogramsMatchCpu/{parallel,serial}_{optimized,reference}  random configurations
//       (R 1..16, epn 1..48, K, tp, B <= epn) and skewed histograms, every rank's plan copy vs make_plan; every
//       second instance with relays (EpOptions::relay vs Planner::set_relay: the copy tree too)
//   FusedPlanTest.FusedPathMatchesCpu/<routing>  histogram on device + all-gather + plan + dst from topk_idx, for the
//       library's routings (lognormal, round robin, every adversarial kind incl. masked and unequal s_r), both modes
//   GpuPlannerRoutingTest.RandomRoutingsMatchCpu  random routings with masks, unequal s, hot subsets, small and large
//   tp GpuPlannerRoutingTest.Theorem2                the Theorem-2 routing: plan equal and rank 0 holds >= the bound
//   GpuPlannerRoutingTest.BenchmarkPointsMatchCpu   MoonEP point (R=8 E=384 K=8 S=8192) at maxvio 0.2/1/10/20 and the
//   K3
//       shape (E=896 K=16) at R=8 and R=64 (planner state in global memory), both modes
//   GpuPlannerSlackTest.RandomHistogramsMatchCpu  slack ε in (0, 1] (plan_slack_targets' closed form on a warp): random
//       configurations and histograms, both kernels, both modes, every rank's plan copy vs make_plan
//   GpuPlannerSlackTest.FusedAndBenchmarkPointsMatchCpu  the fused path with slack on the library's routings, the
//       MoonEP point (maxvio 1, 10) and R=64 (global-memory planner state) at ε 0.01 / 0.05 / 0.1
//   GpuPlannerAutoTest.RandomHistogramsMatchCpu  the auto policy (the budget chosen in phase 1, detail::plan_auto.hpp):
//       random configurations, largest budgets 0 .. 1, the default and a small layer's cost model, random skews, both
//       kernels, both modes: the GPU's chosen budget (Plan::slack_ppm) and plan equal the CPU's bit for bit
//   GpuPlannerAutoTest.ManyRanksMatchCpu  R = 32 .. 100 (several ranks per lane in phase 1b's warp), auto and fixed
//       budgets, block and cluster kernels, both modes: plan and budget equal the CPU's
//   GpuPlannerAutoTest.FusedAndBenchmarkPointsMatchCpu  the fused path under auto: the library's routings, the MoonEP
//       point at maxvio 0.2 / 1 / 10 / 20 and the K3 shape at R = 64 (global-memory planner state); the MoonEP
//       decisions are not all the same budget
//   GpuPlannerRoutingTest.BadExpertIdNamesRankTokenK  an id >= E: Error(kInvalidArgument) naming rank, token, k, value;
//       the next plan succeeds
//   GpuPlannerRoutingTest.GatherTimeoutNamesMissingRank  rank 3 never reaches the all-gather barrier: Error(kTimeout)
//       naming rank 3; the next plan succeeds and matches the CPU
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "common/cpu_testing.hpp"
#include "common/plan_testing.hpp"
#include "evenep/cuda/detail/ep_hooks.hpp"
#include "evenep/cuda/ep.hpp"
#include "evenep/error.hpp"
#include "evenep/plan.hpp"
#include "evenep/routing.hpp"
#include "gpu_testing.hpp"

namespace evenep::cuda {
namespace {

using testing::GroupIo;

// Streams every argument into one string (GCC 12's -Wrestrict misfires on chains of std::string operator+).
template <typename... Args>
std::string testing_cat(const Args&... args) {
    std::ostringstream os;
    ((os << args), ...);
    return os.str();
}
using testing::plan_diff;

Config make_cfg(int R, int E, int K, int S, int tp, int B = -1) {
    Config c;
    c.R = R;
    c.E = E;
    c.K = K;
    c.S = S;
    c.tp = tp;
    c.B = B;
    return c;
}

// Plans `routing` through the fused device path and compares every rank's plan copy and dst with the CPU.
// cpu_out (optional): the CPU plan (its slack_ppm: the auto policy's choice).
void expect_fused_equal(const Config& cfg,
                        const Routing& routing,
                        PlannerMode mode,
                        const std::string& what,
                        PlannerKernel kernel = PlannerKernel::kParallel,
                        Plan* cpu_out = nullptr) {
    EpOptions opt;
    opt.mode = mode;
    opt.planner_kernel = kernel;
    opt.sm_budget = 4;
    DeviceEp ep(cfg, 8, opt);
    GroupIo io(cfg.R, cfg.S, cfg.K, 8);
    for (int r = 0; r < cfg.R; ++r) io.idx[r].upload(routing.topk_idx[r]);
    int64_t s_total = 0;
    bool equal_s = true;
    for (int r = 0; r < cfg.R; ++r) {
        s_total += routing.s[r];
        equal_s = equal_s && routing.s[r] == routing.s[0];
    }
    const EpPlan plan = ep.plan(io.io, routing.s, nullptr, equal_s ? -1 : s_total);
    ep.check(nullptr);
    const Plan cpu = make_plan(cfg, mode, routing.tpe(), routing.s);
    const auto cpu_dst = testing::all_dst(cpu, routing);
    for (int r = 0; r < cfg.R; ++r) {
        const Plan gpu = ep.download_plan(plan, r);
        ASSERT_EQ(plan_diff(gpu, cpu), "") << what << ": rank " << r << "'s plan copy";
        const std::vector<int32_t> dst = ep.download_dst(plan, r);
        ASSERT_EQ(dst.size(), cpu_dst[r].size());
        for (size_t i = 0; i < dst.size(); ++i)
            ASSERT_EQ(dst[i], cpu_dst[r][i]) << what << ": rank " << r << " token " << i / cfg.K << " k " << i % cfg.K;
    }
    if (cpu_out != nullptr) *cpu_out = cpu;
}

// Plans histograms `tpe` on the device (no routing) and compares every rank's plan copy with the CPU planner.
void expect_tpe_plan_equal(const Config& cfg,
                           const std::vector<int32_t>& tpe,
                           const std::vector<int32_t>& s,
                           PlannerMode mode,
                           PlannerKernel kernel,
                           const std::string& what,
                           bool relay = false,
                           const detail::AutoCostModel& auto_model = detail::default_auto_cost_model()) {
    EpOptions opt;
    opt.mode = mode;
    opt.planner_kernel = kernel;
    opt.relay = relay;
    opt.auto_model = auto_model;
    DeviceEp ep(cfg, 8, opt);
    const EpPlan plan = plan_from_tpe(ep, tpe, s, nullptr);
    ep.check(nullptr);
    Planner planner(cfg, mode);
    planner.set_relay(relay);
    planner.set_auto_model(auto_model);
    Plan cpu;
    planner.plan(tpe, s, cpu);
    for (int r = 0; r < cfg.R; ++r) ASSERT_EQ(plan_diff(ep.download_plan(plan, r), cpu), "") << what << ": rank " << r;
}

const char* kernel_name(PlannerKernel k) {
    return k == PlannerKernel::kParallel ? "parallel" : k == PlannerKernel::kSerial ? "serial" : "cluster";
}

class GpuPlannerTest : public ::testing::TestWithParam<std::tuple<PlannerKernel, PlannerMode>> {};

TEST_P(GpuPlannerTest, RandomHistogramsMatchCpu) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    const auto [kernel, mode] = GetParam();
    const int num_instances = kernel != PlannerKernel::kSerial ? 160 : 40;
    testing::TestRng rng(20251129);
    std::printf("seed 20251129, %d instances\n", num_instances);
    const int ranks[] = {1, 2, 3, 4, 5, 8, 8, 16};
    const int epns[] = {1, 2, 3, 4, 6, 8, 16, 48};
    for (int it = 0; it < num_instances; ++it) {
        const int R = ranks[rng.below(8)], epn = epns[rng.below(8)];
        const int E = R * epn, K = rng.between(1, std::min(8, E)), S = rng.between(1, 64);
        const int tp = rng.chance(0.5) ? 1 : rng.between(2, 16);
        const int B = rng.chance(0.25) ? rng.between(0, epn) : -1;
        const Config cfg = make_cfg(R, E, K, S, tp, B);
        std::vector<int32_t> s(R);
        for (int r = 0; r < R; ++r) s[r] = rng.chance(0.5) ? S : rng.between(1, S);
        const double skew = rng.chance(0.3) ? 0.0 : rng.uniform() * 3.0;
        const std::vector<int32_t> tpe = testing::random_tpe(cfg, s, rng.next(), skew);
        const bool relay = it % 2 == 1;  // every second instance plans the relayed copy tree too
        expect_tpe_plan_equal(cfg, tpe, s, mode, kernel,
                              testing_cat("instance ", it, " ", cfg.to_string(), " skew ", skew, " relay ", relay), relay);
        if (HasFatalFailure()) return;
    }
}

INSTANTIATE_TEST_SUITE_P(
    Kernels,
    GpuPlannerTest,
    ::testing::Combine(::testing::Values(PlannerKernel::kParallel, PlannerKernel::kSerial, PlannerKernel::kCluster),
                       ::testing::Values(PlannerMode::kOptimized, PlannerMode::kReference)),
    [](const auto& info) {
        return testing_cat(kernel_name(std::get<0>(info.param)), "_", to_string(std::get<1>(info.param)));
    });

class FusedPlanTest : public ::testing::TestWithParam<int> {};

TEST_P(FusedPlanTest, FusedPathMatchesCpu) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    const Config cfg = make_cfg(4, 32, 4, 96, 8);
    const auto routings = testing::test_routings(cfg, 7);
    const int i = GetParam();
    if (i >= static_cast<int>(routings.size())) GTEST_SKIP() << "no routing " << i;
    for (PlannerMode mode : {PlannerMode::kOptimized, PlannerMode::kReference})
        for (PlannerKernel kernel : {PlannerKernel::kParallel, PlannerKernel::kCluster})
            expect_fused_equal(cfg, routings[i].routing, mode,
                               testing_cat(routings[i].name, "/", to_string(mode), "/", kernel_name(kernel)), kernel);
    expect_fused_equal(cfg, routings[i].routing, PlannerMode::kOptimized, testing_cat(routings[i].name, "/serial"),
                       PlannerKernel::kSerial);
}

INSTANTIATE_TEST_SUITE_P(Routings, FusedPlanTest, ::testing::Range(0, 9), [](const auto& info) {
    const Config cfg = make_cfg(4, 32, 4, 96, 8);
    const auto routings = testing::test_routings(cfg, 7);
    return info.param < static_cast<int>(routings.size()) ? routings[info.param].name : testing_cat("r", info.param);
});

TEST(GpuPlannerRoutingTest, RandomRoutingsMatchCpu) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    testing::TestRng rng(77);
    std::printf("seed 77\n");
    for (int it = 0; it < 24; ++it) {
        const int R = 1 << rng.below(4), epn = rng.between(1, 6), E = R * epn;
        const int K = rng.between(1, std::min(6, E)), S = rng.between(1, 80), tp = rng.chance(0.5) ? 1 : 16;
        const Config cfg = make_cfg(R, E, K, S, tp);
        testing::RoutingOptions ro;
        ro.skew = rng.uniform() * 3;
        ro.mask_prob = rng.chance(0.5) ? 0.3 : 0.0;
        ro.unequal_s = rng.chance(0.5);
        if (rng.chance(0.3)) ro.num_hot = std::max(1, E / 3), ro.hot_first = rng.below(E - ro.num_hot + 1);
        const Routing routing = testing::random_routing(cfg, rng.next(), ro);
        const PlannerMode mode = rng.chance(0.5) ? PlannerMode::kOptimized : PlannerMode::kReference;
        const PlannerKernel kernel = it % 2 == 0 ? PlannerKernel::kParallel : PlannerKernel::kCluster;
        expect_fused_equal(
            cfg, routing, mode,
            testing_cat("instance ", it, " ", cfg.to_string(), " ", testing::describe(ro), " ", kernel_name(kernel)),
            kernel);
        if (HasFatalFailure()) return;
    }
}

TEST(GpuPlannerRoutingTest, Theorem2) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    const Config cfg = make_cfg(4, 8, 2, 64, 1);
    const Routing routing = testing::theorem2_routing(cfg, 4);
    expect_fused_equal(cfg, routing, PlannerMode::kReference, "theorem2");
    DeviceEp ep(cfg, 8);
    GroupIo io(cfg.R, cfg.S, cfg.K, 8);
    for (int r = 0; r < cfg.R; ++r) io.idx[r].upload(routing.topk_idx[r]);
    const EpPlan plan = ep.plan(io.io, routing.s, nullptr);
    ep.check(nullptr);
    EXPECT_GE(ep.download_plan(plan, 0).remote_experts[0], theorem2_lower_bound(cfg.E, cfg.R));
}

TEST(GpuPlannerRoutingTest, BenchmarkPointsMatchCpu) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    const Config moon = make_cfg(8, 384, 8, 8192, 128);
    for (double maxvio : {0.2, 1.0, 10.0, 20.0}) {
        const Routing routing = make_target_maxvio(RoutingSpec{8, 384, 8, 8192, 1}, maxvio);
        for (PlannerMode mode : {PlannerMode::kOptimized, PlannerMode::kReference})
            for (PlannerKernel kernel : {PlannerKernel::kParallel, PlannerKernel::kCluster})
                expect_fused_equal(moon, routing, mode, testing_cat("moonep maxvio ", maxvio, " ", kernel_name(kernel)),
                                   kernel);
    }
    const Config k3 = make_cfg(8, 896, 16, 2048, 128);
    const Routing routing = make_target_maxvio(RoutingSpec{8, 896, 16, 2048, 3}, 5.0);
    for (PlannerMode mode : {PlannerMode::kOptimized, PlannerMode::kReference})
        for (PlannerKernel kernel : {PlannerKernel::kParallel, PlannerKernel::kCluster})
            expect_fused_equal(k3, routing, mode, testing_cat("k3 maxvio 5 ", kernel_name(kernel)), kernel);
    // R = 64: the planner state and the route tables no longer fit in shared memory (global-memory paths); the
    // cluster form plans the 64 ranks in waves of clusters.
    const Config k3_64 = make_cfg(64, 896, 16, 256, 128);
    const Routing routing64 = make_lognormal(RoutingSpec{64, 896, 16, 256, 4}, 1.0);
    for (PlannerMode mode : {PlannerMode::kOptimized, PlannerMode::kReference})
        for (PlannerKernel kernel : {PlannerKernel::kParallel, PlannerKernel::kCluster})
            expect_fused_equal(k3_64, routing64, mode, testing_cat("k3 R=64 ", kernel_name(kernel)), kernel);
}

// The cluster planner at the benchmark shapes: the fill blocks' three histogram sources (int32 copy at R = 8 and 32,
// uint16 copy at R = 64, global memory at R = 128) and both modes, against the CPU planner.
TEST(GpuPlannerClusterTest, BenchmarkShapesMatchCpu) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    struct Shape {
        int R, E, K, S;
        double maxvio;
    };
    const Shape shapes[] = {{8, 384, 8, 8192, 0.2},   {8, 384, 8, 8192, 1.0},  {8, 384, 8, 8192, 20.0},
                            {8, 896, 16, 2048, 5.0},  {32, 896, 16, 512, 1.0}, {64, 896, 16, 256, 1.0},
                            {64, 896, 16, 256, 20.0}, {128, 896, 16, 128, 1.0}};
    for (const Shape& sh : shapes) {
        const Config cfg = make_cfg(sh.R, sh.E, sh.K, sh.S, 128);
        const Routing routing = make_target_maxvio(RoutingSpec{sh.R, sh.E, sh.K, sh.S, 5}, sh.maxvio);
        for (PlannerMode mode : {PlannerMode::kOptimized, PlannerMode::kReference}) {
            expect_tpe_plan_equal(cfg, routing.tpe(), routing.s, mode, PlannerKernel::kCluster,
                                  testing_cat(cfg.to_string(), " maxvio ", sh.maxvio, " ", to_string(mode)));
            if (HasFatalFailure()) return;
        }
    }
}

// Entries so large that the spread fills' key fields exceed 32 bits (pushes 5 + fills 1 + piece 28 bits + valid): the
// fill blocks take the 64-bit, two-round key path (plan_cluster.cuh FillKeyBits::fits32).
TEST(GpuPlannerClusterTest, WideKeysMatchCpu) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    const Config cfg = make_cfg(4, 8, 8, 5000000, 128);
    std::vector<int32_t> tpe(static_cast<size_t>(cfg.R) * cfg.E);
    for (int r = 0; r < cfg.R; ++r)
        for (int e = 0; e < cfg.E; ++e)
            tpe[static_cast<size_t>(r) * cfg.E + e] = e == 0 ? 39990000 : 100 + 37 * r + 11 * e;
    const std::vector<int32_t> s(cfg.R, cfg.S);
    for (PlannerMode mode : {PlannerMode::kOptimized, PlannerMode::kReference})
        expect_tpe_plan_equal(cfg, tpe, s, mode, PlannerKernel::kCluster, testing_cat("wide keys ", to_string(mode)));
}

// 96 random instances with budgets (R 1..16, epn 1..16, K, S, tp, B <= epn, unequal s, skewed histograms; the
// budget from `slacks`, `policy` and, under auto, the default or a small layer's cost model), each planned by the three
// kernels in both modes and compared with the CPU planner. Stops at the first fatal failure.
void expect_random_budget_plans_equal(uint64_t seed, const std::vector<double>& slacks, PlannerPolicy policy) {
    testing::TestRng rng(seed);
    std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
    const int ranks[] = {1, 2, 3, 4, 5, 8, 8, 16};
    for (int it = 0; it < 96; ++it) {
        const int R = ranks[rng.below(8)], epn = rng.between(1, 16);
        const int E = R * epn, K = rng.between(1, std::min(8, E)), S = rng.between(1, 64);
        const int tp = rng.chance(0.5) ? 1 : rng.between(2, 16);
        const int B = rng.chance(0.25) ? rng.between(0, epn) : -1;
        Config cfg = make_cfg(R, E, K, S, tp, B);
        cfg.slack = slacks[rng.below(static_cast<int>(slacks.size()))];
        cfg.policy = policy;
        // The default model (copies dear: mostly the no-copy or the largest budget) or a small layer's (mixed).
        const detail::AutoCostModel model = policy == PlannerPolicy::kAuto && rng.chance(0.5)
                                                ? detail::make_auto_cost_model(64, 64, tp)
                                                : detail::default_auto_cost_model();
        std::vector<int32_t> s(R);
        for (int r = 0; r < R; ++r) s[r] = rng.chance(0.5) ? S : rng.between(1, S);
        const std::vector<int32_t> tpe = testing::random_tpe(cfg, s, rng.next(), rng.uniform() * 3.0);
        for (PlannerKernel kernel : {PlannerKernel::kParallel, PlannerKernel::kSerial, PlannerKernel::kCluster})
            for (PlannerMode mode : {PlannerMode::kOptimized, PlannerMode::kReference}) {
                expect_tpe_plan_equal(
                    cfg, tpe, s, mode, kernel,
                    testing_cat("instance ", it, " ", cfg.to_string(), " ", kernel_name(kernel), " ", to_string(mode)),
                    /*relay=*/false, model);
                if (::testing::Test::HasFatalFailure()) return;
            }
    }
}

TEST(GpuPlannerSlackTest, RandomHistogramsMatchCpu) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    expect_random_budget_plans_equal(20261201, {0.01, 0.02, 0.05, 0.1, 0.3, 1.0}, PlannerPolicy::kFixed);
}

// The fused path with budgets under `policy`: the library's routings at R = 4 (budget `small`), then for each budget of
// `budgets` the MoonEP point at `maxvios` (with each kernel of `kernels`) and the K3 shape at R = 64 (global-memory
// planner state). chosen (optional): the budget of each MoonEP plan (Plan::slack_ppm).
void expect_fused_budgets_equal(PlannerPolicy policy,
                                double small,
                                const std::vector<double>& budgets,
                                const std::vector<double>& maxvios,
                                const std::vector<PlannerKernel>& kernels,
                                std::vector<int32_t>* chosen = nullptr) {
    const char* name = policy == PlannerPolicy::kAuto ? "auto" : "slack";
    Config cfg = make_cfg(4, 32, 4, 96, 8);
    cfg.slack = small;
    cfg.policy = policy;
    for (const auto& named : testing::test_routings(cfg, 7))
        for (PlannerMode mode : {PlannerMode::kOptimized, PlannerMode::kReference})
            expect_fused_equal(cfg, named.routing, mode,
                               testing_cat(name, " ", small, " ", named.name, "/", to_string(mode)));
    for (double eps : budgets) {
        Config moon = make_cfg(8, 384, 8, 8192, 128);
        moon.slack = eps;
        moon.policy = policy;
        for (double maxvio : maxvios) {
            const Routing routing = make_target_maxvio(RoutingSpec{8, 384, 8, 8192, 1}, maxvio);
            for (PlannerKernel kernel : kernels) {
                Plan cpu;
                expect_fused_equal(moon, routing, PlannerMode::kOptimized,
                                   testing_cat("moonep maxvio ", maxvio, " ", name, " ", eps, " ", kernel_name(kernel)),
                                   kernel, &cpu);
                if (chosen != nullptr) chosen->push_back(cpu.slack_ppm);
            }
        }
        Config k3_64 = make_cfg(64, 896, 16, 256, 128);
        k3_64.slack = eps;
        k3_64.policy = policy;
        const Routing routing64 = make_lognormal(RoutingSpec{64, 896, 16, 256, 4}, 1.0);
        for (PlannerMode mode : {PlannerMode::kOptimized, PlannerMode::kReference})
            expect_fused_equal(k3_64, routing64, mode, testing_cat("k3 R=64 ", name, " ", eps));
    }
}

TEST(GpuPlannerSlackTest, FusedAndBenchmarkPointsMatchCpu) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    expect_fused_budgets_equal(PlannerPolicy::kFixed, 0.05, {0.01, 0.05, 0.1}, {1.0, 10.0}, {PlannerKernel::kParallel});
}

TEST(GpuPlannerAutoTest, RandomHistogramsMatchCpu) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    expect_random_budget_plans_equal(20261204, {0.0, 0.02, 0.1, 0.25, 0.5, 1.0}, PlannerPolicy::kAuto);
}

// More ranks than a warp has lanes (phase 1b's warp keeps ranks l, l + 32, ... on lane l, src/cuda/device/plan_auto.cuh):
// R = 32 .. 100, auto (largest budget 0.1 or 1, the default or a small layer's model) and fixed budgets, the block and
// cluster kernels, both modes.
TEST(GpuPlannerAutoTest, ManyRanksMatchCpu) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    testing::TestRng rng(20261206);
    const int ranks[] = {32, 33, 64, 65, 100};
    for (int it = 0; it < 15; ++it) {
        const int R = ranks[it % 5], epn = rng.between(1, 6);
        const int E = R * epn, K = rng.between(1, std::min(8, E)), S = rng.between(8, 64);
        Config cfg = make_cfg(R, E, K, S, rng.chance(0.5) ? 1 : 8);
        cfg.policy = it % 3 == 2 ? PlannerPolicy::kFixed : PlannerPolicy::kAuto;
        cfg.slack = rng.chance(0.5) ? 0.1 : 1.0;
        const detail::AutoCostModel model = rng.chance(0.5) ? detail::make_auto_cost_model(64, 64, cfg.tp)
                                                            : detail::default_auto_cost_model();
        std::vector<int32_t> s(R);
        for (int r = 0; r < R; ++r) s[r] = rng.chance(0.5) ? S : rng.between(1, S);
        const std::vector<int32_t> tpe = testing::random_tpe(cfg, s, rng.next(), rng.uniform() * 3.0);
        for (PlannerKernel kernel : {PlannerKernel::kParallel, PlannerKernel::kCluster})
            for (PlannerMode mode : {PlannerMode::kOptimized, PlannerMode::kReference}) {
                expect_tpe_plan_equal(
                    cfg, tpe, s, mode, kernel,
                    testing_cat("instance ", it, " ", cfg.to_string(), " ", kernel_name(kernel), " ", to_string(mode)),
                    /*relay=*/false, model);
                if (::testing::Test::HasFatalFailure()) return;
            }
    }
}

TEST(GpuPlannerAutoTest, FusedAndBenchmarkPointsMatchCpu) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    std::vector<int32_t> chosen;
    expect_fused_budgets_equal(PlannerPolicy::kAuto, 0.2, {0.1}, {0.2, 1.0, 10.0, 20.0},
                               {PlannerKernel::kParallel, PlannerKernel::kCluster}, &chosen);
    std::printf("moonep budgets (ppm) at maxvio 0.2 1 10 20:");
    for (size_t i = 0; i < chosen.size(); i += 2) std::printf(" %d", chosen[i]);
    std::printf("\n");
    ASSERT_EQ(chosen.size(), 8u);
    EXPECT_NE(*std::min_element(chosen.begin(), chosen.end()), *std::max_element(chosen.begin(), chosen.end()));
}

// Both forms of Ep::plan: the fused launch (kParallel) and the three launches around the cluster planner (kCluster,
// where an earlier launch's error must stop the later ones: the gate and the abort flag).
TEST(GpuPlannerRoutingTest, BadExpertIdNamesRankTokenK) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    const Config cfg = make_cfg(2, 8, 4, 16, 4);
    Routing routing = make_round_robin(RoutingSpec{2, 8, 4, 16, 1});
    for (PlannerKernel kernel : {PlannerKernel::kParallel, PlannerKernel::kCluster}) {
        SCOPED_TRACE(kernel_name(kernel));
        EpOptions opt;
        opt.planner_kernel = kernel;
        DeviceEp ep(cfg, 8, opt);
        GroupIo io(cfg.R, cfg.S, cfg.K, 8);
        std::vector<int32_t> bad = routing.topk_idx[1];
        bad[3 * 4 + 2] = 99;
        io.idx[0].upload(routing.topk_idx[0]);
        io.idx[1].upload(bad);
        const EpPlan plan = ep.plan(io.io, routing.s, nullptr);
        try {
            ep.check(nullptr);
            FAIL() << "expected an invalid expert id error";
        } catch (const Error& e) {
            EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
            EXPECT_NE(std::string(e.what()).find("rank 1, token 3, k 2: expert id 99"), std::string::npos) << e.what();
        }
        ep.team().recover();  // check() leaves the error state (Team::check)
        io.idx[1].upload(routing.topk_idx[1]);
        const EpPlan again = ep.plan(io.io, routing.s, nullptr);
        ep.check(nullptr);
        const Plan cpu = make_plan(cfg, PlannerMode::kOptimized, routing.tpe(), routing.s);
        EXPECT_EQ(plan_diff(ep.download_plan(again, 1), cpu), "");
        const auto cpu_dst = testing::all_dst(cpu, routing);
        for (int r = 0; r < cfg.R; ++r) EXPECT_EQ(ep.download_dst(again, r), cpu_dst[r]) << "rank " << r;
    }
}

TEST(GpuPlannerRoutingTest, GatherTimeoutNamesMissingRank) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    const Config cfg = make_cfg(4, 16, 2, 32, 4);
    const Routing routing = make_lognormal(RoutingSpec{4, 16, 2, 32, 5}, 1.0);
    for (PlannerKernel kernel : {PlannerKernel::kParallel, PlannerKernel::kCluster}) {
        SCOPED_TRACE(kernel_name(kernel));
        EpOptions opt;
        opt.team.timeout_ms = 100;
        opt.planner_kernel = kernel;
        DeviceEp ep(cfg, 8, opt);
        GroupIo io(cfg.R, cfg.S, cfg.K, 8);
        for (int r = 0; r < cfg.R; ++r) io.idx[r].upload(routing.topk_idx[r]);
        ep.team().inject_fault(3, Phase::kPlanGather);
        const EpPlan plan = ep.plan(io.io, routing.s, nullptr);
        try {
            ep.check(nullptr);
            FAIL() << "expected a barrier timeout";
        } catch (const Error& e) {
            EXPECT_EQ(e.kind(), ErrorKind::kTimeout);
            const std::string msg = e.what();
            EXPECT_NE(msg.find("missing rank 3"), std::string::npos) << msg;
            EXPECT_NE(msg.find("plan/gather"), std::string::npos) << msg;
        }
        ep.team().inject_fault(-1, Phase::kNone);
        ep.team().recover();  // check() leaves the error state (Team::check)
        const EpPlan again = ep.plan(io.io, routing.s, nullptr);
        ep.check(nullptr);
        EXPECT_EQ(
            plan_diff(ep.download_plan(again, 2), make_plan(cfg, PlannerMode::kOptimized, routing.tpe(), routing.s)),
            "");
    }
}

}  // namespace
}  // namespace evenep::cuda
