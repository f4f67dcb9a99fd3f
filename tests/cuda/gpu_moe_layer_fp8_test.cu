// GPU MoE layer on the FP8 path (evenep/cuda/moe_layer.hpp, EpOptions::precision.fp8; docs/fp8.md) against the CPU
// MoE layer's FP8 path (the oracle) on the same problem, and against the dense references.
//
// Tolerance GPU vs CPU (kFp8GpuCpuTol = 2^-5 as max|gpu - cpu| / max|cpu| per tensor). Both paths quantise the same
// values with the same functions (dispatch rows, weights, h, dy, dg, du: bitwise equal casts when their inputs are
// equal) and round to bf16 at the same points, except: the FP8 GEMMs accumulate on Hopper's FP8 tensor cores
// (in-block partial sums of ~14 significant bits, promoted to fp32 every 128-deep k-block; docs/fp8.md section 3),
// and dh and the dx partials leave the GPU GEMM as bf16 where the CPU keeps fp32. A value that then lands on the
// other side of an e4m3 rounding boundary changes by one e4m3 ulp (up to 2^-3 of that element) in the next cast;
// dh's extra bf16 rounding (2^-9) moves dg/du codes that way in about one element of 32, which a dot product over
// H' averages to ~1 % of dx. 2^-5 leaves 3x margin on that; a wrong row, weight, scale or layout is off by O(1).
// The data path is exact: plan and every destination bitwise. Against the dense references the GPU layer meets the
// CPU FP8 layer's own tolerance (cpu::kFp8LayerTolerance: out vs float64, grad_x and grad W vs fp32).
//
// Cases (GpuMoeLayerFp8/MatchesCpu.ForwardBackward/<case>_<scales>, the library runner cuda::run_moe_layer over the
// local team, fp32 and UE8M0 scales): R4 E16 K4 H256 H'128 lognormal (copies); R4 E8 K2 hot expert (every token's
// first entry on expert 0); R4 E8 K3 amax outliers and zero-input tokens (out 0 there); R2 E8 K6 Theorem 2
// with tp = 128 (mostly padding rows); R8 E32 K4 H128 H'256 masked entries.
// GpuMoeLayerFp8Flow.InferencePeerGroups: B = 1 and B = 0 < epn, Theorem 2 routing (kPeer groups read the peers'
// e4m3 casts), forward only. GpuMoeLayerFp8Flow.RejectsMismatch: experts without fp8 casts under an fp8 Ep are refused;
// without the CUTLASS FP8 GEMM (a build with EVENEP_CUTLASS off) the constructor refuses naming the build option.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "common/cpu_testing.hpp"
#include "evenep/cpu/moe_layer.hpp"
#include "evenep/cuda/ep.hpp"
#include "evenep/cuda/experts.hpp"
#include "evenep/cuda/grouped_gemm.hpp"
#include "evenep/cuda/moe_layer.hpp"
#include "evenep/detail/bf16.hpp"
#include "evenep/error.hpp"
#include "evenep/routing.hpp"
#include "gpu_testing.hpp"

namespace evenep::cuda {
namespace {

using namespace std::chrono_literals;

inline constexpr double kFp8GpuCpuTol = 1.0 / 32;

enum class Kind { kLognormal, kHotExpert, kOutliers, kTheorem2, kMasked };

struct Fp8Case {
    std::string name;
    BufferConfig cfg;
    Kind kind;
};

std::vector<Fp8Case> cases() {
    return {
        {"R4_E16_K4_H256_lognormal", testing::buffer_config(4, 16, 4, 64, 8, 256, 128), Kind::kLognormal},
        {"R4_E8_K2_H256_hot_expert", testing::buffer_config(4, 8, 2, 16, 1, 256, 128), Kind::kHotExpert},
        {"R4_E8_K3_H256_outliers_zero_rows", testing::buffer_config(4, 8, 3, 16, 1, 256, 128), Kind::kOutliers},
        {"R2_E8_K6_H128_tp128_theorem2", testing::buffer_config(2, 8, 6, 48, 128, 128, 128), Kind::kTheorem2},
        {"R8_E32_K4_H128_F256_masked", testing::buffer_config(8, 32, 4, 32, 8, 128, 256), Kind::kMasked},
    };
}

BufferConfig with_fp8(BufferConfig c, bool ue8m0) {
    c.precision.fp8 = true;
    c.precision.ue8m0 = ue8m0;
    return c;
}

cpu::MoeProblem problem_for(const Fp8Case& fc, bool ue8m0, uint64_t seed) {
    const BufferConfig bc = with_fp8(fc.cfg, ue8m0);
    const Config& c = bc.cfg;
    const RoutingSpec spec{c.R, c.E, c.K, c.S, seed};
    Routing routing;
    switch (fc.kind) {
        case Kind::kLognormal:
        case Kind::kOutliers:
            routing = make_lognormal(spec, 1.5);
            break;
        case Kind::kHotExpert:
            routing = make_adversarial(spec, Adversarial::kSingleHotExpert);
            break;
        case Kind::kTheorem2:
            routing = make_adversarial(spec, Adversarial::kTheorem2);
            break;
        case Kind::kMasked:
            routing = make_adversarial(spec, Adversarial::kMasked);
            break;
    }
    cpu::MoeProblem p = cpu::make_moe_problem(bc, routing.topk_idx, routing.s, seed);
    if (fc.kind == Kind::kOutliers) {  // as tests/unit/cpu_fp8_path_test.cpp: 60x one channel, token 2 all zero
        const int H = bc.H;
        for (int r = 0; r < c.R; ++r)
            for (int t = 0; t < p.s[r]; ++t) {
                if (t % 3 == 0) p.x[r][t * H + 128 + (t % 128)] = float_to_bf16(t % 2 ? 60.0f : -60.0f);
                if (t == 2)
                    for (int i = 0; i < H; ++i) p.x[r][t * H + i] = Bf16{0};
            }
    }
    return p;
}

std::vector<std::vector<float>> widen(const std::vector<std::vector<Bf16>>& v) {
    std::vector<std::vector<float>> out(v.size());
    for (size_t r = 0; r < v.size(); ++r) {
        out[r].resize(v[r].size());
        for (size_t i = 0; i < v[r].size(); ++i) out[r][i] = bf16_to_float(v[r][i]);
    }
    return out;
}

void expect_within(const std::string& what, const cpu::ErrorStats& st, double tol) {
    std::printf("[ info ] %-30s max abs %.3e  max |ref| %.3e  rel %.3e  mean rel %.3e (tol %.1e)\n", what.c_str(),
                st.max_abs, st.max_ref, st.rel(), st.mean_rel(), tol);
    EXPECT_FALSE(st.nonfinite) << what;
    EXPECT_LE(st.rel(), tol) << what << ": max abs " << st.max_abs << ", max |ref| " << st.max_ref;
    EXPECT_GT(st.max_ref, 0.0) << what << ": the reference is all zero, the comparison proves nothing";
}

bool fp8_gemm_available() { return grouped_gemm_has_cutlass(); }

using Param = std::tuple<int, bool>;
class MatchesCpu : public ::testing::TestWithParam<Param> {};

TEST_P(MatchesCpu, ForwardBackward) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    if (!fp8_gemm_available()) GTEST_SKIP() << "no CUTLASS FP8 GEMM in this build or on this device";
    const auto [ci, ue8m0] = GetParam();
    const Fp8Case fc = cases()[ci];
    const uint64_t seed = 900 + ci;
    const cpu::MoeProblem problem = problem_for(fc, ue8m0, seed);
    SCOPED_TRACE("seed " + std::to_string(seed) + " " + problem.cfg.to_string());
    cpu::MoeRunOptions opt;
    opt.barrier_timeout = 60000ms;
    const cpu::MoeResult cpu = cpu::run_moe_layer(problem, opt);
    LocalTeam team(fc.cfg.cfg.R, 0);
    const cpu::MoeResult gpu = run_moe_layer(team, problem, opt);

    ASSERT_EQ(gpu.plan.alloc, cpu.plan.alloc) << "the GPU ranks planned differently";
    ASSERT_EQ(gpu.dst, cpu.dst);
    expect_within("out vs cpu fp8", cpu::compare(gpu.out, widen(cpu.out)), kFp8GpuCpuTol);
    expect_within("grad_x vs cpu fp8", cpu::compare(gpu.grad_x, widen(cpu.grad_x)), kFp8GpuCpuTol);
    expect_within("grad_topk_w vs cpu fp8", cpu::compare(gpu.grad_topk_w, cpu.grad_topk_w), kFp8GpuCpuTol);
    const std::vector<float>* g[] = {&gpu.grad_w_gate, &gpu.grad_w_up, &gpu.grad_w_down};
    const std::vector<float>* c[] = {&cpu.grad_w_gate, &cpu.grad_w_up, &cpu.grad_w_down};
    const char* names[] = {"gate", "up", "down"};
    for (int p = 0; p < 3; ++p)
        expect_within(std::string("grad W_") + names[p] + " vs cpu fp8",
                      cpu::compare(std::span<const float>(*g[p]), std::span<const float>(*c[p])), kFp8GpuCpuTol);

    // The CPU FP8 layer's own yardsticks.
    const cpu::ErrorStats f64 = cpu::compare(gpu.out, cpu::dense_moe_forward_f64(problem));
    expect_within("out vs dense f64", f64, cpu::kFp8LayerTolerance.max_rel);
    EXPECT_LE(f64.mean_rel(), cpu::kFp8LayerTolerance.mean_rel);
    const cpu::DenseResult dense = cpu::dense_moe_reference(problem, true);
    expect_within("grad_x vs dense", cpu::compare(gpu.grad_x, dense.grad_x), cpu::kFp8LayerTolerance.max_rel);
    expect_within("grad W_down vs dense",
                  cpu::compare(std::span<const float>(gpu.grad_w_down), std::span<const float>(dense.grad_w_down)),
                  cpu::kFp8LayerTolerance.max_rel);
    if (fc.kind == Kind::kOutliers)
        for (int r = 0; r < fc.cfg.cfg.R; ++r)
            for (int i = 0; i < fc.cfg.H; ++i)
                ASSERT_EQ(bf16_to_float(gpu.out[r][2 * fc.cfg.H + i]), 0.0f)
                    << "zero-input token, rank " << r << ", channel " << i;
}

INSTANTIATE_TEST_SUITE_P(GpuMoeLayerFp8,
                         MatchesCpu,
                         ::testing::Combine(::testing::Range(0, static_cast<int>(cases().size())), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<Param>& info) {
                             return cases()[std::get<0>(info.param)].name +
                                    (std::get<1>(info.param) ? "_ue8m0" : "_fp32_scales");
                         });

// B = 1 and B = 0 (no slots: prefetch_weight still runs for the home's casts), forward only.
TEST(GpuMoeLayerFp8Flow, InferencePeerGroups) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    if (!fp8_gemm_available()) GTEST_SKIP() << "no CUTLASS FP8 GEMM in this build or on this device";
    for (const int B : {1, 0}) {
        SCOPED_TRACE("B = " + std::to_string(B));
        Fp8Case fc{"peer", testing::buffer_config(8, 32, 6, 32, 8, 128, 128), Kind::kTheorem2};
        fc.cfg.cfg.B = B;
        const cpu::MoeProblem problem = problem_for(fc, false, 45);
        cpu::MoeRunOptions opt;
        opt.backward = false;
        const cpu::MoeResult cpu = cpu::run_moe_layer(problem, opt);
        int64_t peer = 0;
        for (int r = 0; r < fc.cfg.cfg.R; ++r) peer += cpu.plan.peer_reads[r];
        ASSERT_GT(peer, 0) << "no expert overflowed B = " << B;
        LocalTeam team(fc.cfg.cfg.R, 0);
        const cpu::MoeResult gpu = run_moe_layer(team, problem, opt);
        ASSERT_EQ(gpu.dst, cpu.dst);
        const std::string b = " (B = " + std::to_string(B) + ")";
        expect_within("out vs cpu fp8" + b, cpu::compare(gpu.out, widen(cpu.out)), kFp8GpuCpuTol);
        expect_within("out vs dense f64" + b, cpu::compare(gpu.out, cpu::dense_moe_forward_f64(problem)),
                      cpu::kFp8LayerTolerance.max_rel);
    }
}

TEST(GpuMoeLayerFp8Flow, RejectsMismatch) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    const BufferConfig bc = with_fp8(testing::buffer_config(2, 8, 2, 16, 4, 128, 128), false);
    EpOptions eo;
    eo.precision = bc.precision;
    DeviceEp ep(bc.cfg, bc.H, eo);
    Experts bf16_experts(ep, ExpertsShape{3, 128 * 128, true, true});
    EXPECT_THROW(MoeLayer(ep, bf16_experts, 128), Error);  // the Ep dispatches fp8, the experts have no casts
    Experts fp8_experts(ep, ExpertsShape{3, 128 * 128, true, true, true, false, 128, 128});
    if (!fp8_gemm_available()) {
        try {
            MoeLayer layer(ep, fp8_experts, 128);
            ADD_FAILURE() << "an fp8 layer without the CUTLASS FP8 GEMM was built";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("EVENEP_CUTLASS"), std::string::npos) << e.what();
        }
        return;
    }
    MoeLayer layer(ep, fp8_experts, 128);
    EXPECT_TRUE(layer.fp8());
}

}  // namespace
}  // namespace evenep::cuda
