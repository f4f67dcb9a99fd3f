// evenep/cuda/moe_layer.hpp — one MoE layer (SwiGLU experts) forward and backward on the GPU, for all R virtual
// ranks of a DeviceEp: the CUDA twin of evenep::cpu::MoeLayer (evenep/cpu/moe_layer.hpp).
//
// Expert e computes, for a receive row x: g = x·W_gate[e], u = x·W_up[e], h = silu(g) ⊙ u, y = h·W_down[e];
// the layer output is out[t] = sum_k topk_w[t,k] · y_{topk_idx[t,k]}(x_t) over unmasked entries.
//
// Rounding points (bf16 storage, fp32 math; bf16(v) rounds to nearest even) — the CPU layer's, one for one:
//   forward   g_b = bf16(x·Wg), u_b = bf16(x·Wu)          grouped_gemm kForward, bf16 output (two calls: the
//                                                          gate and up matrices of an expert are separate
//                                                          [H, H'] allocations in DeviceExperts, so no fused
//                                                          [H, 2H'] product)
//             h_b = bf16(silu(g_b)·u_b)                    swiglu kernel
//             y_b = bf16(h_b·Wd)                           grouped_gemm kForward, bf16 output
//             out = combine(y_b, apply_weights)            DeviceEp::combine (fp32 accumulation, one rounding)
//   backward  grad rows arrive by DeviceEp::combine_backward; per row: dw = <grad_row, y_b> (fp32),
//             dy_b = bf16(w·grad_row)                      row kernel (dw in place into recv_w)
//             dWd += h_b^T·dy_b                            grouped_gemm_wgrad (fp32 +=)
//             dh = dy_b·Wd^T (fp32)                        grouped_gemm kDgrad, fp32 output
//             dg_b = bf16(dh·u_b·silu'(g_b)), du_b = bf16(dh·silu(g_b))   swiglu backward kernel
//             dWg += x^T·dg_b, dWu += x^T·du_b             grouped_gemm_wgrad
//             dx_b = bf16(dg_b·Wg^T + du_b·Wu^T)           two kDgrad calls (fp32) and one add + rounding
//             grad_x, grad_topk_w = DeviceEp::dispatch_backward(dx_b in recv_x, dw in recv_w)
//   Weight gradients accumulate in fp32: local experts into DeviceExperts::grad, prefetched copies into the
//   reduce buffer (DeviceExperts::slot_grad), then DeviceExperts::reduce_grad adds them home.
// What differs from the CPU layer, and so is compared within a tolerance rather than bitwise: the fp32
// summation order inside the GEMMs (tensor-core tiles vs the CPU's ascending loop), the order of the row dot
// product dw (lane-strided, then a fixed butterfly), dx's two fp32 partial sums (the CPU continues one sum),
// and expf (CUDA's, within 2 ulp, vs the host libm's). Every elementwise step is otherwise evaluated as the CPU
// does it (products and sums rounded separately, no FMA contraction, IEEE division). Padding rows of the
// receive buffer (zero payload and weight) are computed too and give zero rows, exactly as the CPU leaves them.
//
// Usage (all R ranks at once; every call asynchronous on `stream`, no host synchronisation, no allocation after
// construction, so a whole step captures into one CUDA graph):
//   DeviceEp ep(cfg, H);
//   DeviceExperts experts(ep, {3, int64_t(H) * H', true, true});   // weights uploaded by the caller
//   DeviceMoeLayer layer(ep, experts, H');
//   layer.bind(io, bwd);          // once: every rank's x, topk_idx, topk_w, out (+ grad_out, grad_x, grad_topk_w)
//   layer.forward(s, s_total, stream);   // plan, dispatch, prefetch_weight, expert forward, combine -> out
//   layer.backward(stream);              // combine_backward, expert backward, dispatch_backward, reduce_grad
//   ep.check(stream);                    // optional: synchronise and surface device-side errors
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "evenep/cuda/ep.hpp"
#include "evenep/cuda/experts.hpp"
#include "evenep/cuda/grouped_gemm.hpp"
#include "evenep/cuda/types.hpp"

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

// GPU time per phase of the last forward/backward, seconds, measured with CUDA events on the caller's stream
// (every rank's work of a phase is one span of the stream: these are times of the whole group).
struct MoeLayerTimes {
    double plan = 0;  // histogram, all-gather, planning, encoded dst (part of dispatch)
    double dispatch = 0;
    double prefetch = 0;
    double expert_forward = 0;  // weight tables, grouped GEMMs, SwiGLU, saving x and y
    double combine = 0;
    double combine_backward = 0;
    double expert_backward = 0;
    double dispatch_backward = 0;
    double reduce_grad = 0;
    double total() const;  // every phase except plan (contained in dispatch)
};

class DeviceMoeLayer {
  public:
    // One MoE layer over ep's R virtual ranks with expert weights in `experts` (3 projections of H*H' elements;
    // with_weights required; with_grads required for backward). ffn_hidden = H' (a positive multiple of 8).
    // Allocates every buffer the layer needs, sized by the configuration (NvS rows per rank), once.
    // ep and experts must outlive the layer. Throws evenep::Error(kInvalidArgument) on a mismatch.
    DeviceMoeLayer(DeviceEp& ep, DeviceExperts& experts, int ffn_hidden, const MoeLayerOptions& options = {});
    ~DeviceMoeLayer();
    DeviceMoeLayer(const DeviceMoeLayer&) = delete;
    DeviceMoeLayer& operator=(const DeviceMoeLayer&) = delete;

    // Binds the caller's per-rank device pointers ([R] entries each; synchronous). bwd may be empty (forward only).
    // bwd[r].grad_recv_w is ignored: the layer writes the route-weight gradients into recv_w(r) itself, so it binds
    // nullptr there. Calls DeviceEp::bind / bind_backward; binding the DeviceEp directly afterwards is the
    // caller's responsibility.
    void bind(std::span<const RankIo> io, std::span<const BackwardIo> bwd = {});

    // Forward of every rank: s: [R] tokens per rank (s_total: their sum when they differ, else -1; see
    // DeviceEp::plan). Writes every rank's out [s_r, H] (route weights applied) and saves the activations.
    void forward(std::span<const int32_t> s, int64_t s_total, cudaStream_t stream);
    // Backward after forward, with the same plan (ep's last plan and receive buffers: no other plan() or dispatch
    // on ep in between, so layers trained together need a DeviceEp each) and the same weights: reads grad_out, writes
    // grad_x [s_r, H] and grad_topk_w [s_r, K] (0 for masked entries), accumulates weight gradients into experts.grad
    // (copies via reduce_grad). Requires training (B = epn) and experts with gradients.
    void backward(cudaStream_t stream);

    // Per-phase GPU times of the last forward (and backward, if it ran after it). Requires options.timing;
    // synchronises on the last recorded event.
    MoeLayerTimes times() const;

    int ffn_hidden() const { return ffn_hidden_; }
    const MoeLayerOptions& options() const { return options_; }
    // Device bytes the layer allocated (saved activations, scratch, tables, GEMM workspace).
    size_t allocated_bytes() const { return allocated_bytes_; }

    // Saved activations of rank `rank` ([NvS, dim] bf16, rows [0, cu_seqlens[G-1]) valid after forward).
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

    DeviceEp& ep_;
    DeviceExperts& experts_;
    int ffn_hidden_;
    MoeLayerOptions options_;
    bool training_ = false;  // experts with gradients and B = epn
    bool bound_ = false, bound_backward_ = false, has_forward_ = false, has_backward_ = false;
    // One allocation: per region [R][NvS][dim].
    char* arena_ = nullptr;
    struct Regions {
        size_t x, g, u, h, y;       // saved activations, bf16
        size_t dy, dg, du;          // backward operands, bf16
        size_t f32a, f32b;          // fp32 scratch: dh [NvS, H'] in f32a; dx partials [NvS, H] in f32a and f32b
        size_t f32a_dim, f32b_dim;  // row widths of the fp32 regions (elements)
        size_t tables, workspace, views, total;
    } regions_{};
    const uint16_t** weight_tables_ = nullptr;  // device [R][3][G]
    float** grad_tables_ = nullptr;             // device [R][3][G] (null entries without gradients)
    void* gemm_workspace_ = nullptr;
    void* rank_views_ = nullptr;  // device [R] kernels::MoeRankView
    size_t allocated_bytes_ = 0;
    int blocks_per_rank_ = 1;  // grid.x of the elementwise launches
    std::array<cudaEvent_t, kNumEvents> events_{};
};

}  // namespace evenep::cuda
