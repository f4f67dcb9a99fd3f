// evenep/cpu/moe_layer.hpp — one MoE layer (SwiGLU experts) forward and backward through the EP data path on
// the CPU, and the dense single-rank fp32 reference it is checked against.
//
// Expert e computes, for a token row x: g = x·W_gate[e], u = x·W_up[e], h = silu(g) ⊙ u, y = h·W_down[e];
// the layer output is out[t] = sum_k topk_w[t,k] · y_{topk_idx[t,k]}(x_t) over unmasked entries.
//
// Precision of the EP path (bf16 storage, fp32 math; "bf16(v)" is round-to-nearest-even):
//   forward   g_b = bf16(x·Wg), u_b = bf16(x·Wu), h_b = bf16(silu(g_b)·u_b), y_b = bf16(h_b·Wd);
//             out = combine(y_b, apply_weights) (fp32 accumulation, one bf16 rounding)
//   backward  rows of grad_out arrive by combine_backward; per row: dw = <grad_row, y_b> (fp32),
//             dy_b = bf16(w·grad_row); dWd += h_b^T·dy_b; dh = dy_b·Wd^T (fp32);
//             dg_b = bf16(dh·u_b·silu'(g_b)), du_b = bf16(dh·silu(g_b)); dWg += x^T·dg_b; dWu += x^T·du_b;
//             dx_b = bf16(dg_b·Wg^T + du_b·Wu^T); grad_x, grad_topk_w = dispatch_backward(dx_b, dw).
//   Weight gradients accumulate in fp32: local experts into ExpertWeights::grad, copies into the pool's reduce
//   buffer, then reduce_grad adds them home.
// FP8 path (BufferConfig::precision.fp8; docs/fp8.md): the dispatched rows arrive as e4m3 + 1x128 scales and feed
// the gate/up GEMMs directly; h_b, dy_b and dg_b/du_b are cast 1x128 before the down, dh and dx GEMMs; every
// weight is the e4m3 cast with 128x128 scales (grouped_gemm_fp8); wgrad stays bf16 (x as bf16(float(q) * s));
// combine stays bf16 (with precision.bf16_partials, multi-entry partials cross as bf16).
// The dense reference does the same mathematics in fp32 without any intermediate rounding, on the same
// bf16-valued inputs; kTolerances states how far the two may differ.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "evenep/buffer.hpp"
#include "evenep/cpu/buffer.hpp"
#include "evenep/cpu/expert_pool.hpp"
#include "evenep/cpu/local_team.hpp"
#include "evenep/detail/bf16.hpp"
#include "evenep/moe.hpp"

namespace evenep::cpu {

using evenep::LayerTimes;  // evenep/moe.hpp: the problem and result types shared with the CUDA layer
using evenep::MoeProblem;
using evenep::MoeResult;
using evenep::MoeRunOptions;

class MoeLayer {
  public:
    // One rank's view of one MoE layer. The buffer and pool are shared with other layers; `weights` is this
    // layer's. All three must outlive the layer and belong to the same rank and configuration. Under the auto
    // policy it sets the buffer's step-cost model to this layer's (detail::layer_auto_cost_model: shape and
    // precision), as cuda::MoeLayer sets its Ep's.
    MoeLayer(Buffer& buffer, ExpertPool& pool, ExpertWeights& weights);

    // Collective. out: [s*H]. Saves the activations backward needs (NvS rows each, sized once).
    void forward(const DispatchArgs& args, std::span<Bf16> out);
    // Collective, after forward. grad_out: [s*H] -> grad_x: [s*H], grad_topk_w: [s*K]. Expert weight gradients
    // accumulate into the layer's ExpertWeights::grad (copies reduced home by reduce_grad before returning).
    void backward(std::span<const Bf16> grad_out, std::span<Bf16> grad_x, std::span<float> grad_topk_w);

    const DispatchHandle& handle() const { return handle_; }
    const LayerTimes& times() const { return times_; }
    // Transfers this rank performed in the last forward/backward, per phase.
    const TrafficReport& traffic() const { return traffic_; }

  private:
    Buffer& buffer_;
    ExpertPool& pool_;
    ExpertWeights& weights_;
    DispatchHandle handle_;
    bool has_forward_ = false;
    // Saved activations, [NvS * dim] each.
    std::vector<Bf16> x_rows_, g_rows_, u_rows_, h_rows_, y_rows_;
    LayerTimes times_;
    TrafficReport traffic_;
};

// ---------------------------------------------------------------------------------------------------------
// Group level: all ranks' inputs in, all ranks' outputs out (the oracle API).
// ---------------------------------------------------------------------------------------------------------

// Deterministic data for a routing (topk_idx[r] has s[r]*K ids): x, grad_out ~ U(-1, 1); each weight matrix
// ~ U(-1, 1)·sqrt(3/in); route weights positive and normalised per token over its unmasked entries.
// Every value is a counter-based hash of (seed, tensor, index): the same on every platform.
MoeProblem make_moe_problem(const BufferConfig& cfg,
                            std::vector<std::vector<int32_t>> topk_idx,
                            std::vector<int32_t> s,
                            uint64_t seed);

// Runs R virtual ranks (threads) through forward (and backward). Throws the lowest failing rank's error.
MoeResult run_moe_layer(const MoeProblem& problem, const MoeRunOptions& options = {});

struct DenseResult {
    std::vector<std::vector<float>> out;          // [R][s_r*H]
    std::vector<std::vector<float>> grad_x;       // [R][s_r*H]
    std::vector<std::vector<float>> grad_topk_w;  // [R][s_r*K]
    std::vector<float> grad_w_gate, grad_w_up, grad_w_down;
};
// The dense single-rank reference: fp32 mathematics, no intermediate rounding, experts processed in parallel
// on `num_threads` threads (results independent of it).
DenseResult dense_moe_reference(const MoeProblem& problem, bool backward, int num_threads = 2);

// The dense forward in float64: every product and sum in double (no intermediate rounding) on the bf16-valued
// inputs of `problem`, out[r] = [s_r*H] rounded to fp32 once at the end. The yardstick of the FP8 path
// (docs/fp8.md), where the fp32 reference's own rounding would be visible next to the bf16 path's error.
std::vector<std::vector<float>> dense_moe_forward_f64(const MoeProblem& problem);

// max |got - ref| and max |ref| over a tensor; rel = max_abs / max(max_ref, tiny); mean_rel = the mean |got - ref|
// over the mean |ref| (sum_abs / sum_ref).
struct ErrorStats {
    double max_abs = 0;
    double max_ref = 0;
    double sum_abs = 0;
    double sum_ref = 0;
    double rel() const;
    double mean_rel() const;
    bool nonfinite = false;  // got has a NaN/inf where ref is finite
};
ErrorStats compare(std::span<const Bf16> got, std::span<const float> ref);
ErrorStats compare(std::span<const float> got, std::span<const float> ref);
ErrorStats compare(const std::vector<std::vector<Bf16>>& got, const std::vector<std::vector<float>>& ref);
ErrorStats compare(const std::vector<std::vector<float>>& got, const std::vector<std::vector<float>>& ref);

// Tolerances of the EP path against the dense fp32 reference, as rel() = max_abs / max|ref| per tensor.
struct Tolerances {
    double out = 0;
    double grad_x = 0;
    double grad_topk_w = 0;
    double grad_w = 0;  // each of the three expert weight gradients
};
Tolerances default_tolerances();

// The FP8 layer's forward output against dense_moe_forward_f64 (docs/fp8.md, "Layer tolerance"): max_rel bounds
// ErrorStats::rel(), mean_rel ErrorStats::mean_rel(). Derived from the per-GEMM bound with the measured margin.
struct Fp8Tolerance {
    double max_rel;
    double mean_rel;
};
inline constexpr Fp8Tolerance kFp8LayerTolerance{0.15, 0.10};

}  // namespace evenep::cpu
