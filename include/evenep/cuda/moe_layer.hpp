// evenep/cuda/moe_layer.hpp — one MoE layer (SwiGLU experts) forward and backward on the GPU over a cuda::Ep on
// either team (every rank this process serves: R virtual ranks on one GPU, or one rank per process over NCCL): the
// CUDA twin of evenep::cpu::MoeLayer (evenep/cpu/moe_layer.hpp).
//
// Expert e computes, for a receive row x: g = x·W_gate[e], u = x·W_up[e], h = silu(g) ⊙ u, y = h·W_down[e];
// the layer output is out[t] = sum_k topk_w[t,k] · y_{topk_idx[t,k]}(x_t) over unmasked entries.
//
// Rounding points (bf16 storage, fp32 math; bf16(v) rounds to nearest even) — the CPU layer's, one for one:
//   forward   g_b = bf16(x·Wg), u_b = bf16(x·Wu)          grouped_gemm kForward, bf16 output (two calls: the
//                                                          gate and up matrices of an expert are separate
//                                                          [H, H'] allocations in Experts, so no fused
//                                                          [H, 2H'] product)
//             h_b = bf16(silu(g_b)·u_b)                    swiglu kernel
//             y_b = bf16(h_b·Wd)                           grouped_gemm kForward, bf16 output
//             out = combine(y_b, apply_weights)            Ep::combine (fp32 accumulation, one rounding)
//   backward  grad rows arrive by Ep::combine_backward; per row: dw = <grad_row, y_b> (fp32),
//             dy_b = bf16(w·grad_row)                      row kernel (dw in place into recv_w)
//             dWd += h_b^T·dy_b                            grouped_gemm_wgrad (fp32 +=)
//             dh = dy_b·Wd^T (fp32)                        grouped_gemm kDgrad, fp32 output
//             dg_b = bf16(dh·u_b·silu'(g_b)), du_b = bf16(dh·silu(g_b))   swiglu backward kernel
//             dWg += x^T·dg_b, dWu += x^T·du_b             grouped_gemm_wgrad
//             dx_b = bf16(dg_b·Wg^T + du_b·Wu^T)           two kDgrad calls (fp32) and one add + rounding
//             grad_x, grad_topk_w = Ep::dispatch_backward(dx_b in recv_x, dw in recv_w)
//   Weight gradients accumulate in fp32: local experts into Experts::grad, prefetched copies into the
//   reduce buffer (Experts::slot_grad), then Experts::reduce_grad adds them home.
// What differs from the CPU layer, and so is compared within a tolerance rather than bitwise: the fp32
// summation order inside the GEMMs (tensor-core tiles vs the CPU's ascending loop), the order of the row dot
// product dw (lane-strided, then a fixed butterfly), dx's two fp32 partial sums (the CPU continues one sum),
// and expf (CUDA's, within 2 ulp, vs the host libm's). Every elementwise step is otherwise evaluated as the CPU
// does it (products and sums rounded separately, no FMA contraction, IEEE division). Padding rows of the
// receive buffer (zero payload and weight) are computed too and give zero rows, exactly as the CPU leaves them.
//
// FP8 (ep.options().precision.fp8, docs/fp8.md; the CPU layer's FP8 path, one for one): the dispatch brings e4m3 rows
// with 1 x 128 scales (Ep::recv_x8 / recv_scale), prefetch_weight casts the home's weights once per step (128 x 128
// block scales; the home keeps its bf16 master weights) and copies the e4m3 bytes. The layer's prefetch_weight is the
// caller's Experts', so it honours Experts::reuse_fp8_cast: with reuse on, the micro-batches of one optimizer step
// share one cast (the caller owns the Experts and calls weights_changed() after each optimizer step). Forward and dgrad
// GEMMs run block-scaled on e4m3 operands (cuda::grouped_gemm_fp8, CUTLASS): g, u from the received codes, y from h
// cast 1 x 128; dh from dy cast 1 x 128, dx from dg and du cast 1 x 128. The forward reads each group's weights
// K-major: the layer transposes the e4m3 codes of every group with rows into its own [3][num_local][G][H*H'] copy per
// step. wgrad stays bf16 with x = bf16(float(q)*s), combine and the backward's row exchanges stay bf16. Differences
// from the CPU layer beyond the bf16 path's: the FP8 GEMMs' in-block accumulation (Hopper's FP8 tensor cores), and dh
// and dx's two partials leave the GEMM as bf16 (the CPU keeps them fp32): one more bf16 rounding each, far inside the
// FP8 tolerance (docs/fp8.md section 5). Needs experts with ExpertsShape::fp8 (same ue8m0), H and H' multiples of 128,
// and the CUTLASS FP8 GEMM (EVENEP_CUTLASS=ON, compute capability 9.0): the constructor refuses otherwise.
//
// Usage (every served rank at once; every call asynchronous on `stream`, no host synchronisation, no allocation
// after construction, so a whole step captures into one CUDA graph):
//   DeviceEp ep(cfg, H);                                           // or Ep over any Team, NcclEp
//   Experts experts(ep, {3, int64_t(H) * H', true, true});         // weights uploaded by the caller
//   MoeLayer layer(ep, experts, H');
//   MoeForward f = layer.forward(io, s, s_total, stream);   // plan, dispatch, prefetch_weight, experts, combine -> out
//   layer.backward(f, bwd, stream);                         // combine_backward, experts, dispatch_backward,
//   reduce_grad ep.check(stream);                                       // optional: synchronise and surface
//   device-side errors
// Layers sharing one Ep may interleave: the forward's result holds its plan, which backward makes resident again;
// layers sharing one ExpertPool (Experts(ep, pool, shape)) get their slots prefetched again in backward when another
// layer used them in between (as the CPU layer does).
// One forward's activations are saved per layer (the next forward of the same layer overwrites them).
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "evenep/cuda/device_array.hpp"
#include "evenep/cuda/ep.hpp"
#include "evenep/cuda/experts.hpp"
#include "evenep/cuda/grouped_gemm.hpp"
#include "evenep/cuda/types.hpp"
#include "evenep/moe.hpp"
#include "evenep/plan_tensor.hpp"

namespace evenep::cuda {

namespace kernels {
struct MoeKernelParams;  // src/cuda/kernels/swiglu.hpp
}

struct MoeLayerOptions {
    CombineMode combine_mode = CombineMode::kPull;     // forward combine and dispatch_backward
    GemmSchedule schedule = GemmSchedule::kLoadAware;  // forward and dgrad GEMMs (deterministic either way)
    // Weight-gradient GEMMs. kFixed keeps the weight gradients bitwise reproducible; kLoadAware may split a long
    // group into row chunks whose fp32 partial sums land in an unspecified order (grouped_gemm.hpp).
    GemmSchedule wgrad_schedule = GemmSchedule::kFixed;
    // Record a CUDA event at every phase boundary (times() reads them). Off: no event is recorded.
    bool timing = false;
};

// What backward needs from a forward: its plan and the route weights of every served rank (recv_w = topk_w).
struct MoeForward {
    EpPlan plan;
    std::vector<const float*> topk_w;  // [num_local]
    uint64_t serial = 0;               // which forward of the layer (backward checks that it is the last one)
};

class MoeLayer {
  public:
    // One MoE layer over ep's served ranks with expert weights in `experts` (3 projections of H*H' elements;
    // with_weights required; with_grads required for backward). ffn_hidden = H' (a positive multiple of 8).
    // Allocates every buffer the layer needs, sized by the configuration (NvS rows per served rank), once.
    // ep and experts must outlive the layer. Throws evenep::Error(kInvalidArgument) on a mismatch.
    // The planner policy is ep's Config's (the caller's: the layer builds no Config of its own and cannot resize ep's
    // buffers); under PlannerPolicy::kAuto the layer sets its shape's step-cost coefficients (docs/auto.md).
    MoeLayer(Ep& ep, Experts& experts, int ffn_hidden, const MoeLayerOptions& options = {});
    ~MoeLayer();
    MoeLayer(const MoeLayer&) = delete;
    MoeLayer& operator=(const MoeLayer&) = delete;

    // Forward of every served rank: io [num_local] (x, topk_idx, topk_w, out; out_w optional), s: [R] tokens per
    // rank (s_total: their sum when they differ, else -1; see Ep::plan). Writes out [s_r, H] (route weights
    // applied) and saves the activations.
    MoeForward forward(std::span<const RankIo> io, std::span<const int32_t> s, int64_t s_total, cudaStream_t stream);
    // Backward of the layer's last forward `f` (with its plan, even when other layers planned since) and the same
    // weights: bwd [num_local] (grad_out, grad_x, grad_topk_w; grad_recv_w and topk_w are set by the layer) reads
    // grad_out, writes grad_x [s_r, H] and grad_topk_w [s_r, K] (0 for masked entries), accumulates weight gradients
    // into experts.grad (copies via reduce_grad). Requires training (B = epn) and experts with gradients.
    void backward(const MoeForward& f, std::span<const BackwardIo> bwd, cudaStream_t stream);

    // Per-phase GPU times of the last forward (and backward, if it ran after it), seconds, from CUDA events on the
    // caller's stream (every served rank's work of a phase is one span of the stream; plan is part of dispatch).
    // Requires options.timing; synchronises on the last recorded event.
    LayerTimes times() const;

    int ffn_hidden() const { return ffn_hidden_; }
    bool fp8() const { return fp8_; }  // the FP8 path (ep's precision.fp8)
    const MoeLayerOptions& options() const { return options_; }
    // Device bytes the layer allocated (saved activations, scratch, tables, GEMM workspace).
    size_t allocated_bytes() const { return allocated_bytes_; }

    // Saved activations of served rank `rank` ([NvS, dim] bf16, rows [0, cu_seqlens[G-1]) valid after forward).
    const uint16_t* saved_x(int rank) const;  // [NvS, H]
    const uint16_t* saved_h(int rank) const;  // [NvS, H']
    const uint16_t* saved_y(int rank) const;  // [NvS, H]

  private:
    enum Event : int {
        kFwdStart,
        kFwdPlanned,
        kFwdDispatched,
        kFwdPrefetched,
        kFwdExperts,
        kFwdCombined,
        kBwdStart,
        kBwdCombined,
        kBwdExperts,
        kBwdDispatched,
        kBwdReduced,
        kNumEvents
    };
    void record(Event e, cudaStream_t stream);
    void gemm(int rank, int proj, GemmOp op, const uint16_t* x, void* y, bool y_fp32, cudaStream_t stream);
    void wgrad(int rank, int proj, const uint16_t* x, const uint16_t* dy, cudaStream_t stream);
    uint16_t* bf16_at(size_t region, int rank, int dim) const;
    float* f32_at(size_t region, int rank, size_t dim) const;
    kernels::MoeKernelParams kernel_params() const;
    size_t table_index(int rank, int proj) const;  // the first of rank's G+1 entries of projection proj's table
    void build_tables(cudaStream_t stream);
    // The FP8 path (src/cuda/runtime/moe_layer_fp8.cpp).
    void fp8_check_options() const;
    size_t fp8_take_regions(size_t offset, size_t rows);  // lays out fp8_regions_ from offset; returns the end
    void fp8_init();                                      // uploads the FP8 tables' sources (arena allocated)
    void fp8_build_tables(const kernels::MoeKernelParams& p, cudaStream_t stream);
    void fp8_gemm(int rank, int proj, GemmOp op, const uint8_t* x, const float* xs, uint16_t* y, cudaStream_t stream);
    void fp8_forward_experts(const kernels::MoeKernelParams& p, cudaStream_t stream);
    void fp8_backward_experts(const kernels::MoeKernelParams& p, cudaStream_t stream);
    uint8_t* codes_at(size_t region, int rank, int dim) const;
    float* scales_at(size_t region, int rank, int dim) const;

    Ep& ep_;
    Experts& experts_;
    int ffn_hidden_;
    MoeLayerOptions options_;
    bool training_ = false;  // experts with gradients and B = epn
    bool has_forward_ = false, has_backward_ = false;
    uint64_t forwards_ = 0;
    // One allocation: per region [num_local][NvS][dim].
    DeviceArray<char> arena_;
    struct Regions {
        size_t x, g, u, h, y;       // saved activations, bf16
        size_t dy, dg, du;          // backward operands, bf16
        size_t f32a, f32b;          // fp32 scratch: dh [NvS, H'] in f32a; dx partials [NvS, H] in f32a and f32b
        size_t f32a_dim, f32b_dim;  // row widths of the fp32 regions (elements)
        size_t tables, sources, plan_rows, workspace, views, total;
    } regions_{};
    bool fp8_ = false;
    struct Fp8Regions {
        size_t codes_a, scales_a;  // [num_local][NvS][max(H, H')] e4m3 and [..][/128] fp32: h, dy, dg cast 1 x 128
        size_t codes_b, scales_b;  // [num_local][NvS][H']: du cast 1 x 128 (backward)
        size_t dxu;                // [num_local][NvS][H] bf16: du·Wu^T (backward)
        size_t tables;   // [5 kinds: codes, scales, transposed, slot codes, slot transposed][3][num_local][G+1]
        size_t sources;  // [3][5 kinds][2*num_local + R]: homes | slots | peers of each kind
        size_t views;    // [num_local] kernels::MoeFp8RankView
    } fp8_regions_{};
    const uint16_t** weight_tables_ = nullptr;    // device [3][num_local][G+1] (cuda::build_group_table)
    float** grad_tables_ = nullptr;               // device [3][num_local][G+1] (null entries without gradients)
    const void* const* table_sources_ = nullptr;  // device: the tables' sources (MoeLayer::build_tables)
    int32_t* plan_rows_ = nullptr;                // device [num_local, W]: the resident plan as a tensor
    PlanRowLayout plan_layout_{};
    void* gemm_workspace_ = nullptr;
    void* rank_views_ = nullptr;  // device [R] kernels::MoeRankView
    size_t allocated_bytes_ = 0;
    int blocks_per_rank_ = 1;  // grid.x of the elementwise launches
    std::array<cudaEvent_t, kNumEvents> events_{};
};

// The byte model of the FP8 layer (docs/fp8.md, "Bytes") from the bf16 model of the same step (evenep_traffic of
// plan and dst with H, ffn_hidden): dispatch rows of e4m3 codes and H/128 fp32 scales (H + H/32 bytes instead of
// 2H; entry records unchanged), copies of the 3 e4m3 matrices with their 128 x 128 scales (3 (H H' + 4 H H'/16384)
// bytes instead of 6 H H'); combine, the backward's row exchanges and reduce_grad stay bf16. H and ffn_hidden
// multiples of 128. Host only (no device needed).
TrafficReport fp8_traffic(
    const TrafficReport& bf16, const Plan& plan, const std::vector<std::vector<int32_t>>& dst, int H, int ffn_hidden);

// What run_moe_layer measured besides the result.
struct MoeRunInfo {
    int warmup_steps = 0;          // untimed steps before the reported one
    double step_wall_seconds = 0;  // host wall time of the reported step (launches + synchronisation)
    size_t layer_bytes = 0;        // device bytes of the layer's activations and scratch
};

// One MoE layer step of `problem` on the ranks `team` serves (the GPU twin of cpu::run_moe_layer): an Ep, the
// layer's Experts (the served ranks' weights uploaded from the problem) and a MoeLayer over `team`; `warmup`
// untimed steps (weight gradients zeroed after them), then the reported step with CUDA events at every phase
// boundary. Fills, for the served ranks: out, grad_x, grad_topk_w (backward), dst, and grad_w_* of their experts
// (at home after reduce_grad); plan (the first served rank's device copy), times (GPU seconds per phase, the
// served ranks together), sizes, and traffic (the byte model on the device's plan and dst; only when the team
// serves every rank). options.num_layers must be 1; options.barrier_timeout becomes the team's timeout.
// Collective on the NCCL team. Throws evenep::Error on a bad problem or a device failure. The Ep's and the
// experts' windows are freed into `team` before it returns (the team holds no more windows than before).
MoeResult run_moe_layer(Team& team,
                        const MoeProblem& problem,
                        const MoeRunOptions& options = {},
                        int warmup = 0,
                        MoeRunInfo* info = nullptr);

}  // namespace evenep::cuda
