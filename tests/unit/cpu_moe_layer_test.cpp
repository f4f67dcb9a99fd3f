// A MoE layer (SwiGLU experts) forward and backward through the CPU EP path on virtual ranks.
//
// Tolerances (cpu::default_tolerances()): the EP path stores bf16 between the GEMMs (SPEC §4, moe_layer.hpp);
// the reference is fp32 throughout. Each output is compared as max|ep - ref| / max|ref| over the tensor.
//
// Cases:
//   MoeLayer/DenseReference.WithinTolerance/<config>_<mode>
//       output, input gradient, router-weight gradient and every expert's weight gradient (copies reduced home)
//       against the dense fp32 reference; measured traffic equals the plan model in every phase.
//   CpuMoeLayer.PlannerModesAgree        reference vs optimized plans: router-weight gradients bitwise equal
//                                        (each row's expert math does not depend on where it runs); outputs and
//                                        input gradients within one bf16 ulp; weight gradients within fp32
//                                        summation-order noise.
//   CpuMoeLayer.AutoPolicyPlansWithTheLayersModel  under auto the layer's plan has its own shape's budget
//                                        (detail::layer_auto_cost_model) on a routing where the default model differs.
//   CpuMoeLayer.RepeatedRunsBitwise      two runs, every output bit for bit.
//   CpuMoeLayer.TwoLayersShareBufferAndPool  two layers interleaved through one Buffer and ExpertPool (the pool
//                                        re-prefetches in backward) give layer 0 the single-layer results bitwise.
//   CpuMoeLayer.InferenceWithBLessThanEpn  B = 1 < epn, Theorem 2 routing: overflow experts are read through peer
//   pointers; the
//                                        forward output matches the dense reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

#include "common/cpu_testing.hpp"
#include "evenep/cpu/moe_layer.hpp"
#include "evenep/routing.hpp"

namespace evenep {
namespace {

using namespace std::chrono_literals;

struct LayerCase {
    std::string name;
    BufferConfig cfg;
    int routing;  // 0 lognormal sigma 1.5, 1 single hot expert, 2 masked, 3 unequal s, 4 Theorem 2
};

std::vector<LayerCase> layer_cases() {
    return {
        {"R4_E16_K4_lognormal", testing::buffer_config(4, 16, 4, 32, 4, 32, 16), 0},
        {"R8_E32_K6_hot_expert", testing::buffer_config(8, 32, 6, 24, 8, 48, 24), 1},
        {"R4_E8_K3_masked", testing::buffer_config(4, 8, 3, 20, 16, 16, 8), 2},
        {"R4_E16_K2_unequal_s", testing::buffer_config(4, 16, 2, 30, 1, 24, 40), 3},
        {"R1_E4_K2", testing::buffer_config(1, 4, 2, 16, 4, 16, 8), 0},
    };
}

cpu::MoeProblem problem_for(const LayerCase& lc, uint64_t seed) {
    const Config& c = lc.cfg.cfg;
    const RoutingSpec spec{c.R, c.E, c.K, c.S, seed};
    Routing routing;
    switch (lc.routing) {
        case 0:
            routing = make_lognormal(spec, 1.5);
            break;
        case 1:
            routing = make_adversarial(spec, Adversarial::kSingleHotExpert);
            break;
        case 2:
            routing = make_adversarial(spec, Adversarial::kMasked);
            break;
        case 3:
            routing = make_adversarial(spec, Adversarial::kUnequalS);
            break;
        default:
            routing = make_adversarial(spec, Adversarial::kTheorem2);
            break;
    }
    return cpu::make_moe_problem(lc.cfg, routing.topk_idx, routing.s, seed);
}

void expect_within(const char* what, const cpu::ErrorStats& st, double tol) {
    if (std::getenv("EVENEP_PRINT_ERRORS")) std::printf("[ info ] %-24s rel %.3e\n", what, st.rel());
    EXPECT_FALSE(st.nonfinite) << what;
    EXPECT_LE(st.rel(), tol) << what << ": max abs " << st.max_abs << ", max |ref| " << st.max_ref;
    EXPECT_GT(st.max_ref, 0.0) << what << ": the reference is all zero, the comparison proves nothing";
}

using Param = std::tuple<int, PlannerMode>;
class DenseReference : public ::testing::TestWithParam<Param> {};

TEST_P(DenseReference, WithinTolerance) {
    const auto [ci, mode] = GetParam();
    const LayerCase lc = layer_cases()[ci];
    const uint64_t seed = 500 + ci;
    SCOPED_TRACE("seed " + std::to_string(seed) + " " + lc.cfg.to_string());
    const cpu::MoeProblem problem = problem_for(lc, seed);
    cpu::MoeRunOptions opt;
    opt.mode = mode;
    opt.barrier_timeout = 60000ms;
    const cpu::MoeResult ep = cpu::run_moe_layer(problem, opt);
    const cpu::DenseResult ref = cpu::dense_moe_reference(problem, true);
    const cpu::Tolerances tol = cpu::default_tolerances();
    expect_within("out", cpu::compare(ep.out, ref.out), tol.out);
    expect_within("grad_x", cpu::compare(ep.grad_x, ref.grad_x), tol.grad_x);
    expect_within("grad_topk_w", cpu::compare(ep.grad_topk_w, ref.grad_topk_w), tol.grad_topk_w);
    // Every expert's weight gradient separately (copies reduced home), skipping experts without entries.
    const int64_t n = int64_t{lc.cfg.H} * lc.cfg.ffn_hidden;
    const std::vector<float>* got[] = {&ep.grad_w_gate, &ep.grad_w_up, &ep.grad_w_down};
    const std::vector<float>* want[] = {&ref.grad_w_gate, &ref.grad_w_up, &ref.grad_w_down};
    for (int p = 0; p < 3; ++p)
        for (int e = 0; e < lc.cfg.cfg.E; ++e) {
            if (ep.plan.expert_load[e] == 0) continue;
            const auto st = cpu::compare(std::span<const float>(got[p]->data() + e * n, n),
                                         std::span<const float>(want[p]->data() + e * n, n));
            expect_within(("grad_w proj " + std::to_string(p) + " expert " + std::to_string(e)).c_str(), st,
                          tol.grad_w);
        }
    // Every rank computed exactly q_r entries, and the traffic the ranks counted is the model's.
    const TrafficReport model = evenep_traffic(ep.plan, ep.dst, lc.cfg.H, lc.cfg.ffn_hidden, true);
    EXPECT_EQ(ep.traffic.gather, model.gather);
    EXPECT_EQ(ep.traffic.dispatch, model.dispatch);
    EXPECT_EQ(ep.traffic.combine.rows, model.combine.rows);
    EXPECT_EQ(ep.traffic.combine, model.combine);
    EXPECT_EQ(ep.traffic.combine_backward, model.combine_backward);
    EXPECT_EQ(ep.traffic.dispatch_backward, model.dispatch_backward);
    EXPECT_EQ(ep.traffic.prefetch, model.prefetch);
    EXPECT_EQ(ep.traffic.reduce_grad, model.reduce_grad);
    EXPECT_EQ(ep.traffic.max_rank_entries, model.max_rank_entries);
}

INSTANTIATE_TEST_SUITE_P(MoeLayer,
                         DenseReference,
                         ::testing::Combine(::testing::Range(0, static_cast<int>(layer_cases().size())),
                                            ::testing::Values(PlannerMode::kReference, PlannerMode::kOptimized)),
                         [](const ::testing::TestParamInfo<Param>& info) {
                             return layer_cases()[std::get<0>(info.param)].name + "_" +
                                    std::string(to_string(std::get<1>(info.param)));
                         });

// |a - b| <= one bf16 ulp of the larger magnitude.
bool within_one_ulp(Bf16 a, Bf16 b) {
    const float fa = bf16_to_float(a), fb = bf16_to_float(b);
    const float m = std::max(std::fabs(fa), std::fabs(fb));
    if (m == 0.0f) return true;
    int exp = 0;
    std::frexp(m, &exp);
    return std::fabs(fa - fb) <= std::ldexp(1.0f, exp - 8);
}

TEST(CpuMoeLayer, PlannerModesAgree) {
    const LayerCase lc = layer_cases()[0];
    const cpu::MoeProblem problem = problem_for(lc, 77);
    cpu::MoeRunOptions opt;
    opt.mode = PlannerMode::kReference;
    const auto a = cpu::run_moe_layer(problem, opt);
    opt.mode = PlannerMode::kOptimized;
    const auto b = cpu::run_moe_layer(problem, opt);
    ASSERT_NE(a.dst, b.dst) << "the two modes placed every entry alike; the test compares nothing";
    EXPECT_EQ(a.grad_topk_w, b.grad_topk_w);
    int64_t differ = 0;
    for (size_t r = 0; r < a.out.size(); ++r)
        for (size_t i = 0; i < a.out[r].size(); ++i) {
            ASSERT_TRUE(within_one_ulp(a.out[r][i], b.out[r][i])) << "out rank " << r << " element " << i;
            ASSERT_TRUE(within_one_ulp(a.grad_x[r][i], b.grad_x[r][i])) << "grad_x rank " << r << " element " << i;
            differ += a.out[r][i] != b.out[r][i];
        }
    const cpu::ErrorStats st[] = {cpu::compare(std::span<const float>(a.grad_w_gate), b.grad_w_gate),
                                  cpu::compare(std::span<const float>(a.grad_w_up), b.grad_w_up),
                                  cpu::compare(std::span<const float>(a.grad_w_down), b.grad_w_down)};
    for (const auto& s : st) EXPECT_LE(s.rel(), 1e-5) << s.max_abs << " / " << s.max_ref;
    std::printf("[ info ] outputs differing by one bf16 ulp between planner modes: %lld\n",
                static_cast<long long>(differ));
}

// Under the auto policy the layer plans with its own shape's step-cost model (detail::layer_auto_cost_model, as
// cuda::MoeLayer sets its Ep's), not the planner's default (the MoonEP layer's): on a routing where the two models
// choose different budgets, the layer's plan has the layer model's budget.
TEST(CpuMoeLayer, AutoPolicyPlansWithTheLayersModel) {
    BufferConfig bc = testing::buffer_config(4, 16, 4, 32, 4, 32, 16);
    bc.cfg.policy = PlannerPolicy::kAuto;
    bc.cfg.slack = 0.2;
    const Config& c = bc.cfg;
    const detail::AutoCostModel layer = detail::layer_auto_cost_model(bc.H, bc.ffn_hidden, c.tp, false);
    auto budget = [&](const Routing& r, const detail::AutoCostModel& m) {
        Planner planner(c, PlannerMode::kOptimized);
        planner.set_auto_model(m);
        Plan p;
        planner.plan(r.tpe(), r.s, p);
        return p.slack_ppm;
    };
    for (uint64_t seed = 1; seed <= 400; ++seed) {
        const Routing r = make_lognormal(RoutingSpec{c.R, c.E, c.K, c.S, seed}, 1.5);
        const int32_t mine = budget(r, layer), dflt = budget(r, detail::default_auto_cost_model());
        if (mine == dflt) continue;
        const cpu::MoeProblem problem = cpu::make_moe_problem(bc, r.topk_idx, r.s, seed);
        cpu::MoeRunOptions opt;
        opt.backward = false;
        EXPECT_EQ(cpu::run_moe_layer(problem, opt).plan.slack_ppm, mine) << "seed " << seed << ", default " << dflt;
        return;
    }
    FAIL() << "no routing in 400 seeds where the layer's model and the default choose different budgets";
}

TEST(CpuMoeLayer, RepeatedRunsBitwise) {
    const cpu::MoeProblem problem = problem_for(layer_cases()[0], 91);
    const auto a = cpu::run_moe_layer(problem);
    const auto b = cpu::run_moe_layer(problem);
    EXPECT_EQ(a.out, b.out);
    EXPECT_EQ(a.grad_x, b.grad_x);
    EXPECT_EQ(a.grad_topk_w, b.grad_topk_w);
    EXPECT_EQ(a.grad_w_gate, b.grad_w_gate);
    EXPECT_EQ(a.grad_w_up, b.grad_w_up);
    EXPECT_EQ(a.grad_w_down, b.grad_w_down);
}

TEST(CpuMoeLayer, TwoLayersShareBufferAndPool) {
    const cpu::MoeProblem problem = problem_for(layer_cases()[1], 93);
    cpu::MoeRunOptions opt;
    const auto one = cpu::run_moe_layer(problem, opt);
    opt.num_layers = 2;
    const auto two = cpu::run_moe_layer(problem, opt);
    EXPECT_EQ(one.out, two.out);
    EXPECT_EQ(one.grad_x, two.grad_x);
    EXPECT_EQ(one.grad_topk_w, two.grad_topk_w);
    EXPECT_EQ(one.grad_w_gate, two.grad_w_gate);
    EXPECT_EQ(one.grad_w_up, two.grad_w_up);
    EXPECT_EQ(one.grad_w_down, two.grad_w_down);
    // Layer 0 re-prefetched its copies in backward (layer 1 had used the pool in between).
    EXPECT_EQ(two.traffic.prefetch.rows, 2 * one.traffic.prefetch.rows);
}

TEST(CpuMoeLayer, InferenceWithBLessThanEpn) {
    LayerCase lc = layer_cases()[1];
    lc.cfg.cfg.B = 1;
    lc.routing = 4;
    const cpu::MoeProblem problem = problem_for(lc, 95);
    cpu::MoeRunOptions opt;
    opt.backward = false;
    const auto ep = cpu::run_moe_layer(problem, opt);
    int64_t peer = 0;
    for (int r = 0; r < lc.cfg.cfg.R; ++r) peer += ep.plan.peer_reads[r];
    ASSERT_GT(peer, 0) << "no expert overflowed B = 1";
    const auto ref = cpu::dense_moe_reference(problem, false);
    expect_within("out", cpu::compare(ep.out, ref.out), cpu::default_tolerances().out);
}

}  // namespace
}  // namespace evenep
