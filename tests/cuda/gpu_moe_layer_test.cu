// GPU MoE layer (evenep/cuda/moe_layer.hpp) against the CPU MoE layer (evenep/cpu/moe_layer.hpp) on the same
// inputs, and both against the dense fp32 reference.
//
// Tolerance GPU vs CPU (kGpuCpuTol = 2^-6 as max|gpu - cpu| / max|cpu| per tensor): both paths round to bf16 at
// the same points, but the GEMMs sum in fp32 in different orders (tensor-core tiles vs the CPU's ascending loop),
// dw's dot product and dx's two partial sums are ordered differently, and expf may differ by an ulp. A sum-order
// difference of ~1e-6 relative occasionally moves a value across a bf16 rounding boundary: that element then
// differs by one bf16 ulp (2^-8 relative), and the flip propagates through the later stages (a flipped g_b
// changes h_b, y_b, out, ...). 2^-6 allows a few such ulps at the tensor's largest magnitude; a real bug (a wrong
// row, a wrong weight, a missing term) is off by O(1). The data-path pieces are exact: the plan and every encoded
// destination are compared bitwise. Against the dense fp32 reference the GPU layer must meet the CPU layer's own
// tolerances (cpu::default_tolerances(), as tests/unit/cpu_moe_layer_test.cpp).
//
// Cases:
//   GpuMoeLayer/MatchesCpu.ForwardBackward/<case>_<planner>   the library runner (cuda::run_moe_layer) over the
//       local team:  output, grad_x, grad_topk_w and each projection's
//       weight gradient (all experts, copies reduced home) vs the CPU layer within kGpuCpuTol; the same vs the
//       dense reference within the CPU tolerances; plan alloc and dst bitwise equal to the CPU ranks'. Cases:
//       R4 E16 K4 S64 H128 H'64 with lognormal (copies), masked entries and unequal s_r; R8 E32 K6 hot expert
//       (H' = 40, not a multiple of 16); R2 E8 K6 (K > R) Theorem 2 with tp = 128 (mostly padding rows); R1.
//       Planner modes reference and optimized.
//   GpuMoeLayerFlow.RepeatedStepsBitwise   two steps (weight gradients zeroed in between) give the same bits
//       (the default weight-gradient schedule, kFixed, is deterministic).
//   GpuMoeLayerFlow.GraphCaptureReplay     forward + backward captured in one CUDA graph; replays equal the eager
//       step bitwise.
//   GpuMoeLayerNccl.OneRankMatchesCpu      the same runner (cuda::run_moe_layer) and comparison over the NCCL team with
//       one rank (in-process bootstrap), both planner modes; and bitwise equal to the local team's one-rank run.
//   GpuMoeLayerFlow.OtherLayersPlanBetweenForwardAndBackward  two layers on one Ep and one ExpertPool; layer B
//       plans (and prefetches into the shared slots) twice between layer A's forward and backward; A's results
//       equal A alone bitwise (A's backward uses A's plan and prefetches A's weights again).
//   GpuMoeLayerFlow.InferenceWithBLessThanEpn   B = 1 < epn, Theorem 2 routing (peer groups): forward only, vs CPU
//       and dense reference; backward throws.
//   GpuMoeLayerFlow.RejectsBadArguments    H' not a multiple of 8, experts of the wrong size, backward before
//       forward, forward with inputs of one rank of two: evenep::Error.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/cpu_testing.hpp"
#include "evenep/cpu/moe_layer.hpp"
#include "evenep/cuda/ep.hpp"
#include "evenep/cuda/experts.hpp"
#include "evenep/cuda/moe_layer.hpp"
#include "evenep/cuda/nccl_team.hpp"
#include "evenep/detail/bf16.hpp"
#include "evenep/error.hpp"
#include "evenep/routing.hpp"
#include "gpu_testing.hpp"

namespace evenep::cuda {
namespace {

using namespace std::chrono_literals;
using testing::bits_of;
using testing::DeviceArray;
using testing::GroupIo;

inline constexpr double kGpuCpuTol = 1.0 / 64;

enum class RoutingKind { kLognormal, kMasked, kUnequalS, kHotExpert, kTheorem2 };

struct LayerCase {
    std::string name;
    BufferConfig cfg;
    RoutingKind routing;
};

std::vector<LayerCase> layer_cases() {
    return {
        {"R4_E16_K4_H128_lognormal", testing::buffer_config(4, 16, 4, 64, 8, 128, 64), RoutingKind::kLognormal},
        {"R4_E16_K4_H128_masked", testing::buffer_config(4, 16, 4, 64, 8, 128, 64), RoutingKind::kMasked},
        {"R4_E16_K4_H128_unequal_s", testing::buffer_config(4, 16, 4, 64, 1, 128, 64), RoutingKind::kUnequalS},
        {"R8_E32_K6_H64_F40_hot_expert", testing::buffer_config(8, 32, 6, 32, 8, 64, 40), RoutingKind::kHotExpert},
        {"R2_E8_K6_H96_tp128_theorem2", testing::buffer_config(2, 8, 6, 48, 128, 96, 72), RoutingKind::kTheorem2},
        {"R1_E4_K2_H32", testing::buffer_config(1, 4, 2, 32, 4, 32, 16), RoutingKind::kLognormal},
    };
}

cpu::MoeProblem problem_for(const BufferConfig& bc, RoutingKind kind, uint64_t seed) {
    const Config& c = bc.cfg;
    const RoutingSpec spec{c.R, c.E, c.K, c.S, seed};
    Routing routing;
    switch (kind) {
        case RoutingKind::kLognormal:
            routing = make_lognormal(spec, 1.5);
            break;
        case RoutingKind::kMasked:
            routing = make_adversarial(spec, Adversarial::kMasked);
            break;
        case RoutingKind::kUnequalS:
            routing = make_adversarial(spec, Adversarial::kUnequalS);
            break;
        case RoutingKind::kHotExpert:
            routing = make_adversarial(spec, Adversarial::kSingleHotExpert);
            break;
        case RoutingKind::kTheorem2:
            routing = make_adversarial(spec, Adversarial::kTheorem2);
            break;
    }
    return cpu::make_moe_problem(bc, routing.topk_idx, routing.s, seed);
}

int64_t s_total_of(const std::vector<int32_t>& s) {
    int64_t total = 0;
    bool equal = true;
    for (int32_t v : s) total += v, equal = equal && v == s[0];
    return equal ? -1 : total;
}

std::vector<Bf16> to_bf16(const std::vector<uint16_t>& bits) {
    std::vector<Bf16> v(bits.size());
    for (size_t i = 0; i < bits.size(); ++i) v[i] = Bf16{bits[i]};
    return v;
}

std::vector<std::vector<float>> widen(const std::vector<std::vector<Bf16>>& v) {
    std::vector<std::vector<float>> out(v.size());
    for (size_t r = 0; r < v.size(); ++r) {
        out[r].resize(v[r].size());
        for (size_t i = 0; i < v[r].size(); ++i) out[r][i] = bf16_to_float(v[r][i]);
    }
    return out;
}

// What one GPU step produced, in the CPU result's shapes.
struct GpuResult {
    std::vector<std::vector<Bf16>> out, grad_x;
    std::vector<std::vector<float>> grad_topk_w;
    std::vector<float> grad_w[3];  // [E*H*H'] per projection, global expert order
    Plan plan;
    std::vector<std::vector<int32_t>> dst;
};

// The device side: DeviceEp + Experts + MoeLayer and every rank's inputs and outputs.
struct GpuLayer {
    cpu::MoeProblem problem;
    DeviceEp ep;
    Experts experts;
    GroupIo io;
    std::vector<DeviceArray<uint16_t>> grad_out, grad_x;
    std::vector<DeviceArray<float>> grad_topk_w;
    std::unique_ptr<MoeLayer> layer;
    std::vector<BackwardIo> bio;
    MoeForward last;
    bool training;

    static EpOptions ep_options(PlannerMode mode) {
        EpOptions o;
        o.mode = mode;
        return o;
    }

    GpuLayer(const cpu::MoeProblem& p, PlannerMode mode, const MoeLayerOptions& lo = {})
        : problem(p),
          ep(p.cfg.cfg, p.cfg.H, ep_options(mode)),
          experts(ep,
                  ExpertsShape{3, static_cast<int64_t>(p.cfg.H) * p.cfg.ffn_hidden, true,
                               p.cfg.cfg.num_slots() == p.cfg.cfg.epn()}),
          io(p.cfg.cfg.R, p.cfg.cfg.S, p.cfg.cfg.K, p.cfg.H),
          training(p.cfg.cfg.num_slots() == p.cfg.cfg.epn()) {
        const Config& c = p.cfg.cfg;
        const int R = c.R, S = c.S, K = c.K, H = p.cfg.H, epn = c.epn();
        const size_t n = static_cast<size_t>(H) * p.cfg.ffn_hidden;
        for (int r = 0; r < R; ++r) {
            grad_out.emplace_back(static_cast<size_t>(S) * H);
            grad_x.emplace_back(static_cast<size_t>(S) * H);
            grad_topk_w.emplace_back(static_cast<size_t>(S) * K);
            io.x[r].upload(bits_of(p.x[r]));
            io.idx[r].upload(p.topk_idx[r]);
            io.w[r].upload(p.topk_w[r]);
            grad_out[r].upload(bits_of(p.grad_out[r]));
            bio.push_back(BackwardIo{grad_out[r].get(), grad_x[r].get(), grad_topk_w[r].get(), nullptr});
        }
        const std::vector<Bf16>* src[3] = {&p.w_gate, &p.w_up, &p.w_down};
        for (int r = 0; r < R; ++r)
            for (int proj = 0; proj < 3; ++proj)
                for (int le = 0; le < epn; ++le) {
                    const std::vector<uint16_t> w = bits_of(std::vector<Bf16>(
                        src[proj]->begin() + (r * epn + le) * n, src[proj]->begin() + (r * epn + le + 1) * n));
                    EVENEP_CUDA_CHECK(cudaMemcpy(experts.weight(r, proj, le), w.data(), n * 2, cudaMemcpyHostToDevice));
                }
        layer = std::make_unique<MoeLayer>(ep, experts, p.cfg.ffn_hidden, lo);
        EVENEP_CUDA_CHECK(cudaDeviceSynchronize());  // uploads done before work on other streams
    }

    void step(cudaStream_t stream) {
        last = layer->forward(io.io, problem.s, s_total_of(problem.s), stream);
        if (training) layer->backward(last, bio, stream);
    }

    void zero_grads(cudaStream_t stream) {
        const Config& c = problem.cfg.cfg;
        const size_t n = static_cast<size_t>(problem.cfg.H) * problem.cfg.ffn_hidden;
        for (int r = 0; r < c.R; ++r)
            for (int proj = 0; proj < 3; ++proj)
                for (int le = 0; le < c.epn(); ++le)
                    EVENEP_CUDA_CHECK(cudaMemsetAsync(experts.grad(r, proj, le), 0, n * 4, stream));
    }

    GpuResult download() const {
        const Config& c = problem.cfg.cfg;
        const int R = c.R, K = c.K, H = problem.cfg.H, epn = c.epn();
        const size_t n = static_cast<size_t>(H) * problem.cfg.ffn_hidden;
        EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
        GpuResult g;
        for (int r = 0; r < R; ++r) {
            const size_t s = static_cast<size_t>(problem.s[r]);
            g.out.push_back(to_bf16(io.out[r].download(s * H)));
            g.dst.push_back(ep.download_dst(last.plan, r));
            if (training) {
                g.grad_x.push_back(to_bf16(grad_x[r].download(s * H)));
                g.grad_topk_w.push_back(grad_topk_w[r].download(s * K));
            }
        }
        g.plan = ep.download_plan(last.plan, 0);
        if (training)
            for (int proj = 0; proj < 3; ++proj) {
                g.grad_w[proj].resize(static_cast<size_t>(c.E) * n);
                for (int r = 0; r < R; ++r)
                    for (int le = 0; le < epn; ++le)
                        EVENEP_CUDA_CHECK(cudaMemcpy(g.grad_w[proj].data() + (r * epn + le) * n,
                                                     experts.grad(r, proj, le), n * 4, cudaMemcpyDeviceToHost));
            }
        return g;
    }
};

void expect_within(const std::string& what, const cpu::ErrorStats& st, double tol) {
    std::printf("[ info ] %-34s max abs %.3e  max |ref| %.3e  rel %.3e (tol %.1e)\n", what.c_str(), st.max_abs,
                st.max_ref, st.rel(), tol);
    EXPECT_FALSE(st.nonfinite) << what;
    EXPECT_LE(st.rel(), tol) << what << ": max abs " << st.max_abs << ", max |ref| " << st.max_ref;
    EXPECT_GT(st.max_ref, 0.0) << what << ": the reference is all zero, the comparison proves nothing";
}

void expect_bitwise(const GpuResult& a, const GpuResult& b, const std::string& what) {
    EXPECT_EQ(a.out, b.out) << what << ": out";
    EXPECT_EQ(a.grad_x, b.grad_x) << what << ": grad_x";
    for (size_t r = 0; r < a.grad_topk_w.size(); ++r)
        EXPECT_EQ(std::memcmp(a.grad_topk_w[r].data(), b.grad_topk_w[r].data(), a.grad_topk_w[r].size() * 4), 0)
            << what << ": grad_topk_w rank " << r;
    for (int p = 0; p < 3; ++p)
        EXPECT_EQ(std::memcmp(a.grad_w[p].data(), b.grad_w[p].data(), a.grad_w[p].size() * 4), 0)
            << what << ": grad_w projection " << p;
}

// A library runner's result (cuda::run_moe_layer) in the test's shapes.
GpuResult from_result(const MoeResult& r) {
    GpuResult g;
    g.out = r.out;
    g.grad_x = r.grad_x;
    g.grad_topk_w = r.grad_topk_w;
    g.grad_w[0] = r.grad_w_gate, g.grad_w[1] = r.grad_w_up, g.grad_w[2] = r.grad_w_down;
    g.plan = r.plan;
    g.dst = r.dst;
    return g;
}

// The GPU step vs the CPU layer (within kGpuCpuTol; plan and dst bitwise) and vs the dense reference.
void expect_matches_cpu(const GpuResult& gpu,
                        const cpu::MoeResult& cpu,
                        const cpu::DenseResult& ref,
                        const LayerCase& lc) {
    // The data path is exact: same plan, same destinations.
    ASSERT_EQ(gpu.plan.alloc, cpu.plan.alloc) << "the GPU ranks planned differently";
    ASSERT_EQ(gpu.dst, cpu.dst);

    expect_within("out vs cpu", cpu::compare(gpu.out, widen(cpu.out)), kGpuCpuTol);
    expect_within("grad_x vs cpu", cpu::compare(gpu.grad_x, widen(cpu.grad_x)), kGpuCpuTol);
    expect_within("grad_topk_w vs cpu", cpu::compare(gpu.grad_topk_w, cpu.grad_topk_w), kGpuCpuTol);
    const std::vector<float>* cpu_w[] = {&cpu.grad_w_gate, &cpu.grad_w_up, &cpu.grad_w_down};
    const std::vector<float>* ref_w[] = {&ref.grad_w_gate, &ref.grad_w_up, &ref.grad_w_down};
    const char* names[] = {"gate", "up", "down"};
    for (int p = 0; p < 3; ++p)
        expect_within(std::string("grad W_") + names[p] + " vs cpu",
                      cpu::compare(std::span<const float>(gpu.grad_w[p]), std::span<const float>(*cpu_w[p])),
                      kGpuCpuTol);

    const cpu::Tolerances tol = cpu::default_tolerances();
    expect_within("out vs dense", cpu::compare(gpu.out, ref.out), tol.out);
    expect_within("grad_x vs dense", cpu::compare(gpu.grad_x, ref.grad_x), tol.grad_x);
    expect_within("grad_topk_w vs dense", cpu::compare(gpu.grad_topk_w, ref.grad_topk_w), tol.grad_topk_w);
    // Every expert's weight gradient separately (as the CPU test does), skipping experts without entries.
    const int64_t n = int64_t{lc.cfg.H} * lc.cfg.ffn_hidden;
    for (int p = 0; p < 3; ++p) {
        double worst = 0;
        for (int e = 0; e < lc.cfg.cfg.E; ++e) {
            if (cpu.plan.expert_load[e] == 0) continue;
            const cpu::ErrorStats st = cpu::compare(std::span<const float>(gpu.grad_w[p].data() + e * n, n),
                                                    std::span<const float>(ref_w[p]->data() + e * n, n));
            EXPECT_FALSE(st.nonfinite) << names[p] << " expert " << e;
            EXPECT_LE(st.rel(), tol.grad_w) << "grad W_" << names[p] << " expert " << e << " vs dense";
            worst = std::max(worst, st.rel());
        }
        std::printf("[ info ] grad W_%-5s vs dense (worst expert)  rel %.3e (tol %.1e)\n", names[p], worst, tol.grad_w);
    }
}

using Param = std::tuple<int, PlannerMode>;
class MatchesCpu : public ::testing::TestWithParam<Param> {};

// The library runner (cuda::run_moe_layer) over the local team: R virtual ranks on one GPU.
TEST_P(MatchesCpu, ForwardBackward) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    const auto [ci, mode] = GetParam();
    const LayerCase lc = layer_cases()[ci];
    const uint64_t seed = 700 + ci;
    SCOPED_TRACE("seed " + std::to_string(seed) + " " + lc.cfg.to_string());
    const cpu::MoeProblem problem = problem_for(lc.cfg, lc.routing, seed);
    cpu::MoeRunOptions opt;
    opt.mode = mode;
    opt.barrier_timeout = 60000ms;
    const cpu::MoeResult cpu = cpu::run_moe_layer(problem, opt);
    const cpu::DenseResult ref = cpu::dense_moe_reference(problem, true);
    LocalTeam team(lc.cfg.cfg.R, 0);
    expect_matches_cpu(from_result(run_moe_layer(team, problem, opt)), cpu, ref, lc);
}

INSTANTIATE_TEST_SUITE_P(GpuMoeLayer,
                         MatchesCpu,
                         ::testing::Combine(::testing::Range(0, static_cast<int>(layer_cases().size())),
                                            ::testing::Values(PlannerMode::kReference, PlannerMode::kOptimized)),
                         [](const ::testing::TestParamInfo<Param>& info) {
                             return layer_cases()[std::get<0>(info.param)].name + "_" +
                                    std::string(to_string(std::get<1>(info.param)));
                         });

TEST(GpuMoeLayerFlow, RepeatedStepsBitwise) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    const LayerCase lc = layer_cases()[0];
    const cpu::MoeProblem problem = problem_for(lc.cfg, lc.routing, 41);
    GpuLayer g(problem, PlannerMode::kOptimized);
    g.step(nullptr);
    const GpuResult first = g.download();
    g.zero_grads(nullptr);
    g.step(nullptr);
    g.ep.check(nullptr);
    expect_bitwise(first, g.download(), "second step");
}

TEST(GpuMoeLayerFlow, GraphCaptureReplay) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    const LayerCase lc = layer_cases()[1];
    const cpu::MoeProblem problem = problem_for(lc.cfg, lc.routing, 43);
    GpuLayer g(problem, PlannerMode::kOptimized);
    cudaStream_t stream;
    EVENEP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    g.step(stream);
    g.ep.check(stream);
    const GpuResult eager = g.download();
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    EVENEP_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    g.step(stream);
    EVENEP_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    EVENEP_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int rep = 0; rep < 2; ++rep) {
        g.zero_grads(stream);
        for (int r = 0; r < lc.cfg.cfg.R; ++r) {
            EVENEP_CUDA_CHECK(cudaMemsetAsync(g.io.out[r].get(), 0xff, g.io.out[r].size() * 2, stream));
            EVENEP_CUDA_CHECK(cudaMemsetAsync(g.grad_x[r].get(), 0xff, g.grad_x[r].size() * 2, stream));
        }
        EVENEP_CUDA_CHECK(cudaGraphLaunch(exec, stream));
        g.ep.check(stream);
        expect_bitwise(eager, g.download(), "graph replay " + std::to_string(rep));
    }
    EVENEP_CUDA_CHECK(cudaGraphExecDestroy(exec));
    EVENEP_CUDA_CHECK(cudaGraphDestroy(graph));
    EVENEP_CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST(GpuMoeLayerFlow, InferenceWithBLessThanEpn) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    LayerCase lc = layer_cases()[3];
    lc.cfg.cfg.B = 1;
    const cpu::MoeProblem problem = problem_for(lc.cfg, RoutingKind::kTheorem2, 45);
    cpu::MoeRunOptions opt;
    opt.backward = false;
    const cpu::MoeResult cpu = cpu::run_moe_layer(problem, opt);
    int64_t peer = 0;
    for (int r = 0; r < lc.cfg.cfg.R; ++r) peer += cpu.plan.peer_reads[r];
    ASSERT_GT(peer, 0) << "no expert overflowed B = 1";
    GpuLayer g(problem, PlannerMode::kOptimized);
    ASSERT_FALSE(g.training);
    g.step(nullptr);
    g.ep.check(nullptr);
    const GpuResult gpu = g.download();
    ASSERT_EQ(gpu.dst, cpu.dst);
    expect_within("out vs cpu (B = 1)", cpu::compare(gpu.out, widen(cpu.out)), kGpuCpuTol);
    const cpu::DenseResult ref = cpu::dense_moe_reference(problem, false);
    expect_within("out vs dense (B = 1)", cpu::compare(gpu.out, ref.out), cpu::default_tolerances().out);
    EXPECT_THROW(g.layer->backward(g.last, g.bio, nullptr), Error);
}

// The same runner and comparison over the NCCL team with one rank (one process, in-process bootstrap).
TEST(GpuMoeLayerNccl, OneRankMatchesCpu) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    if (!nccl_team_built()) GTEST_SKIP() << "this build has no NCCL team";
    const LayerCase lc = layer_cases()[5];  // R1_E4_K2_H32
    ASSERT_EQ(lc.cfg.cfg.R, 1);
    const cpu::MoeProblem problem = problem_for(lc.cfg, lc.routing, 705);
    for (PlannerMode mode : {PlannerMode::kReference, PlannerMode::kOptimized}) {
        SCOPED_TRACE(to_string(mode));
        cpu::MoeRunOptions opt;
        opt.mode = mode;
        opt.barrier_timeout = 60000ms;
        const cpu::MoeResult cpu = cpu::run_moe_layer(problem, opt);
        const cpu::DenseResult ref = cpu::dense_moe_reference(problem, true);
        NcclBootstrap boot;
        boot.unique_id = nccl_new_unique_id();
        NcclTeam team(boot, 0);
        expect_matches_cpu(from_result(run_moe_layer(team, problem, opt)), cpu, ref, lc);
        // The local team with the same one rank gives the same bits (same kernels, only the team differs).
        LocalTeam local(1, 0);
        const MoeResult a = run_moe_layer(local, problem, opt), b = run_moe_layer(team, problem, opt);
        expect_bitwise(from_result(a), from_result(b), "nccl vs local team");
    }
}

// Two layers on one Ep: layer B plans (forward and backward) between layer A's forward and backward. A's backward
// must use A's plan (made resident again from its copy): every result of A equals A run alone, bit for bit.
TEST(GpuMoeLayerFlow, OtherLayersPlanBetweenForwardAndBackward) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    const LayerCase lc = layer_cases()[0];
    const cpu::MoeProblem pa = problem_for(lc.cfg, RoutingKind::kLognormal, 51);
    const cpu::MoeProblem pb = problem_for(lc.cfg, RoutingKind::kHotExpert, 52);
    GpuLayer alone(pa, PlannerMode::kOptimized);
    alone.step(nullptr);
    alone.ep.check(nullptr);
    const GpuResult want = alone.download();

    // Layer A owns the Ep and the expert pool; layer B shares both, with its own weights (zero) and inputs, so its
    // prefetches overwrite A's slots: A's backward must prefetch again.
    GpuLayer a(pa, PlannerMode::kOptimized);
    Experts eb(a.ep, a.experts.pool(), a.experts.shape());
    MoeLayer lb(a.ep, eb, lc.cfg.ffn_hidden);
    const int R = lc.cfg.cfg.R, S = lc.cfg.cfg.S, K = lc.cfg.cfg.K, H = lc.cfg.H;
    GroupIo iob(R, S, K, H);
    std::vector<DeviceArray<uint16_t>> gob, gxb;
    std::vector<DeviceArray<float>> gwb;
    std::vector<BackwardIo> bb;
    for (int r = 0; r < R; ++r) {
        iob.x[r].upload(bits_of(pb.x[r]));
        iob.idx[r].upload(pb.topk_idx[r]);
        iob.w[r].upload(pb.topk_w[r]);
        gob.emplace_back(static_cast<size_t>(S) * H);
        gxb.emplace_back(static_cast<size_t>(S) * H);
        gwb.emplace_back(static_cast<size_t>(S) * K);
        gob[r].upload(bits_of(pb.grad_out[r]));
        bb.push_back(BackwardIo{gob[r].get(), gxb[r].get(), gwb[r].get(), nullptr, nullptr});
    }
    EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
    a.last = a.layer->forward(a.io.io, pa.s, s_total_of(pa.s), nullptr);
    const MoeForward fb = lb.forward(iob.io, pb.s, s_total_of(pb.s), nullptr);
    lb.backward(fb, bb, nullptr);
    const MoeForward fb2 = lb.forward(iob.io, pb.s, s_total_of(pb.s), nullptr);  // one more plan in between
    a.layer->backward(a.last, a.bio, nullptr);
    a.ep.check(nullptr);
    expect_bitwise(want, a.download(), "layer A with layer B planning in between");
    EXPECT_EQ(a.ep.download_dst(fb2.plan, 0).size(), static_cast<size_t>(pb.s[0]) * K);  // B's plan still readable
    EXPECT_THROW(lb.backward(fb, bb, nullptr), Error);  // B's first forward is no longer the saved one
}

TEST(GpuMoeLayerFlow, RejectsBadArguments) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    const BufferConfig bc = testing::buffer_config(2, 8, 2, 16, 4, 32, 16);
    DeviceEp ep(bc.cfg, bc.H);
    Experts good(ep, ExpertsShape{3, 32 * 16, true, true});
    Experts wrong_size(ep, ExpertsShape{3, 32 * 24, true, true});
    Experts one_proj(ep, ExpertsShape{1, 32 * 16, true, true});
    EXPECT_THROW(MoeLayer(ep, good, 12), Error);  // H' % 8 != 0
    EXPECT_THROW(MoeLayer(ep, wrong_size, 16), Error);
    EXPECT_THROW(MoeLayer(ep, one_proj, 16), Error);
    MoeLayer layer(ep, good, 16);
    const std::vector<int32_t> s(2, 16);
    GroupIo io(2, bc.cfg.S, bc.cfg.K, bc.H);
    EXPECT_THROW(layer.forward(std::span<const RankIo>(io.io).first(1), s, -1, nullptr), Error);  // one rank of two
    EXPECT_THROW(layer.backward(MoeForward{}, {}, nullptr), Error);                               // before forward
    EXPECT_THROW((void)layer.times(), Error);                                                     // timing off
}

}  // namespace
}  // namespace evenep::cuda
