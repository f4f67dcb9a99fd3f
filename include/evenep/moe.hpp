// evenep/moe.hpp — one MoE layer step as a problem and a result, the same for every backend: the CPU layer
// (evenep/cpu/moe_layer.hpp, cpu::run_moe_layer) and the CUDA layer (evenep/cuda/moe_layer.hpp,
// cuda::run_moe_layer) take a MoeProblem and give a MoeResult, so tools and tests compare them field by field.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include "evenep/buffer.hpp"
#include "evenep/detail/bf16.hpp"
#include "evenep/plan.hpp"

namespace evenep {

// Seconds per phase of one layer step (a rank's, the max over ranks, or a GPU stream's span of the served ranks).
struct LayerTimes {
    double plan = 0;  // planning and dst from the gathered histograms (part of dispatch)
    double dispatch = 0;
    double prefetch = 0;
    double expert_forward = 0;  // grouped GEMMs + SwiGLU
    double combine = 0;
    double combine_backward = 0;
    double expert_backward = 0;
    double dispatch_backward = 0;
    double reduce_grad = 0;
    // Sum of the phases except plan (contained in dispatch).
    double total() const {
        return dispatch + prefetch + expert_forward + combine + combine_backward + expert_backward + dispatch_backward +
               reduce_grad;
    }
    void max_with(const LayerTimes& o) {
        auto mx = [](double& a, double b) { a = a > b ? a : b; };
        mx(plan, o.plan), mx(dispatch, o.dispatch), mx(prefetch, o.prefetch), mx(expert_forward, o.expert_forward);
        mx(combine, o.combine), mx(combine_backward, o.combine_backward), mx(expert_backward, o.expert_backward);
        mx(dispatch_backward, o.dispatch_backward), mx(reduce_grad, o.reduce_grad);
    }
};

// All ranks' inputs of one MoE layer step.
struct MoeProblem {
    BufferConfig cfg;
    std::vector<int32_t> s;                      // [R] tokens per rank
    std::vector<std::vector<Bf16>> x;            // [R][s_r*H]
    std::vector<std::vector<int32_t>> topk_idx;  // [R][s_r*K], -1 masked
    std::vector<std::vector<float>> topk_w;      // [R][s_r*K]
    std::vector<std::vector<Bf16>> grad_out;     // [R][s_r*H]
    std::vector<Bf16> w_gate, w_up;              // [E, H, H'] (global expert order)
    std::vector<Bf16> w_down;                    // [E, H', H]
};

struct MoeRunOptions {
    PlannerMode mode = PlannerMode::kOptimized;
    bool backward = true;
    // Every barrier wait (CPU threads; GPU device barriers); equals cpu::kDefaultBarrierTimeout.
    std::chrono::milliseconds barrier_timeout{120000};
    // > 1 (CPU runner only): that many layers with the same weights and inputs share one Buffer and one
    // ExpertPool; all forwards run first, then all backwards in reverse order (as in training). The results are
    // layer 0's.
    int num_layers = 1;
};

// What one step produced. A runner that serves only some ranks (one process of a multi-process group) fills the
// entries of its ranks and of its ranks' experts; the others stay empty (per-rank vectors) or zero (grad_w_*).
struct MoeResult {
    std::vector<std::vector<Bf16>> out;                      // [R][s_r*H]
    std::vector<std::vector<Bf16>> grad_x;                   // [R][s_r*H] (backward)
    std::vector<std::vector<float>> grad_topk_w;             // [R][s_r*K] (backward)
    std::vector<float> grad_w_gate, grad_w_up, grad_w_down;  // [E*H*H'] fp32 at home after reduce_grad
    Plan plan;                                               // as the first served rank computed it
    std::vector<std::vector<int32_t>> dst;                   // [R][s_r*K]
    TrafficReport traffic;                                   // summed over ranks (measured or modelled)
    LayerTimes times;                                        // max over ranks, per phase
    BufferSizes sizes;
};

}  // namespace evenep
