// python/csrc/ops_cuda.cpp — the CUDA kernels of the torch.library ops (TORCH_LIBRARY_IMPL(evenep, CUDA, m)): the
// same schemas and results as the CPU kernels of ops.cpp (bit for bit for plan and data movement; the grouped GEMM
// within bf16 tolerance), over cuda::Ep with R virtual ranks on one GPU (CudaContext, cuda_context.hpp).
//
// Every op runs on the current torch stream of the buffer's device (c10::cuda::getCurrentCUDAStream), launches
// asynchronously and never synchronises with the host (except: a plan tensor the buffer did not make is matched
// by value, see cuda_context.hpp; Buffer.check()). Device memory: the Ep's buffers, tables and the Context's
// scratch rows are allocated once, when the buffer is created; op outputs and per-call scratch (GEMM pointer
// tables and workspaces) come from torch's caching allocator, which during CUDA-graph capture serves them from the
// graph's private pool (allowed: no cudaMalloc, no host synchronisation inside the op). The only allocation the
// library itself may make is the copy of a plan that is replaced while still referenced (cuda::Ep: a recycled
// pool, grown only outside capture).
//
// Outputs are copies of the receive buffers, never aliasing views: autograd saves dispatch's outputs and the next
// dispatch (another layer, the next step) overwrites the buffers, so a view would silently change saved tensors.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <optional>

#include "cuda_context.hpp"
#include "evenep/cuda/grouped_gemm.hpp"

namespace evenep::python {
namespace {

template <typename T>
T* ptr(const at::Tensor& t) {
    return reinterpret_cast<T*>(t.data_ptr());
}

at::TensorOptions on(const CudaContext& ctx, at::ScalarType dtype) {
    return at::TensorOptions().dtype(dtype).device(at::kCUDA, ctx.device());
}

// Plans from idx (int32 [R, s_pad, K] on the device) with s_r tokens each: the device plan, its packed tensor and
// its entry, registered under `key` (the packed tensor when undefined).
std::shared_ptr<PlanEntry> new_plan(
    OpScope& sc, const at::Tensor& idx, const std::vector<int32_t>& s, const at::Tensor& key, at::Tensor* packed) {
    CudaContext& ctx = *sc.ctx;
    const int R = ctx.cfg().R, K = ctx.cfg().K;
    const int64_t s_pad = idx.size(1), W = ctx.plan_layout().width();
    std::vector<cuda::RankIo> io(R);
    for (int r = 0; r < R; ++r) io[r].topk_idx = ptr<const int32_t>(idx) + r * s_pad * K;
    ctx.prune_plans();
    cuda::EpPlan p = ctx.ep().plan(io, s, sc.stream, group_total(s));
    at::Tensor t = at::empty({R, W}, on(ctx, at::kInt));
    cukernels::pack_plan(ctx.offsets(), ctx.bases(), ptr<int32_t>(t), W, sc.stream);
    if (packed) *packed = t;
    return ctx.add_plan(key.defined() ? key : t, std::move(p));
}

at::Tensor plan_cuda(const at::Tensor& topk_idx, int64_t buffer, std::optional<at::IntArrayRef> num_tokens) {
    return translate([&] {
        OpScope sc(buffer, "plan");
        at::Tensor idx = topk_int32(*sc.ctx, topk_idx, "plan");
        at::Tensor packed;
        new_plan(sc, idx, token_counts(sc.ctx->cfg(), idx.size(1), num_tokens, "plan"), {}, &packed);
        return packed;
    });
}

// The checks of the ops that take (topk_weights, plan, handle); returns the plan's entry.
std::shared_ptr<PlanEntry> handle_plan(
    OpScope& sc, const at::Tensor& topk_w, const at::Tensor& plan, const at::Tensor& handle, const char* op) {
    const CudaContext& ctx = *sc.ctx;
    const int R = ctx.cfg().R, K = ctx.cfg().K;
    const int64_t s_pad = topk_w.dim() == 3 ? topk_w.size(1) : -1;
    check_cuda(ctx, topk_w, op, "topk_weights", at::kFloat, {R, s_pad, K});
    check_cuda(ctx, handle, op, "handle", at::kInt, {R, s_pad * K});
    std::shared_ptr<PlanEntry> p = sc.ctx->plan_of(plan, sc.capturing, op);
    const std::span<const int32_t> s = p->plan.s();
    for (int r = 0; r < R; ++r)
        TORCH_CHECK_VALUE(s[r] <= s_pad, "evenep.", op, ": the plan gives rank ", r, " ", s[r],
                          " tokens but the handle holds ", s_pad);
    return p;
}

// Makes the receive buffers hold the dispatch (plan, handle, topk_w): dispatches zero rows with the plan again
// unless they already do (cuda_context.hpp).
void hold(OpScope& sc, const std::shared_ptr<PlanEntry>& p, const at::Tensor& handle, const at::Tensor& topk_w) {
    CudaContext& ctx = *sc.ctx;
    if (ctx.holds(*p, handle, topk_w)) return;
    const int R = ctx.cfg().R, K = ctx.cfg().K;
    const int64_t s_pad = topk_w.size(1), rows = static_cast<int64_t>(ctx.cfg().S) * ctx.H();
    std::vector<cuda::RankIo> io(R);
    for (int r = 0; r < R; ++r) {
        io[r].x = ptr<const uint16_t>(ctx.zero_rows()) + r * rows;
        io[r].topk_w = ptr<const float>(topk_w) + r * s_pad * K;
    }
    ctx.ep().dispatch(p->plan, io, sc.stream);
    ctx.set_held(p, handle, topk_w);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> dispatch_cuda(const at::Tensor& x,
                                                                         const at::Tensor& topk_idx,
                                                                         const at::Tensor& topk_weights,
                                                                         const at::Tensor& plan,
                                                                         int64_t buffer,
                                                                         std::optional<at::IntArrayRef> num_tokens) {
    return translate([&] {
        OpScope sc(buffer, "dispatch");
        CudaContext& ctx = *sc.ctx;
        const int R = ctx.cfg().R, K = ctx.cfg().K, H = ctx.H();
        const PlanLayout L = ctx.plan_layout();
        const int64_t s_pad = x.dim() == 3 ? x.size(1) : -1, nvs = ctx.nvs();
        check_cuda(ctx, x, "dispatch", "x", at::kBFloat16, {R, s_pad, H});
        at::Tensor idx = topk_int32(ctx, topk_idx, "dispatch");
        check_cuda(ctx, topk_weights, "dispatch", "topk_weights", at::kFloat, {R, s_pad, K});
        check_cuda(ctx, plan, "dispatch", "plan", at::kInt, {R, L.width()});
        const std::vector<int32_t> s = token_counts(ctx.cfg(), s_pad, num_tokens, "dispatch");
        std::shared_ptr<PlanEntry> p = ctx.find_plan(plan, sc.capturing);
        // A plan tensor this buffer did not make (a copy): the plan is a pure function of the routing, plan again.
        if (!p) p = new_plan(sc, idx, s, plan, nullptr);
        const std::span<const int32_t> ps = p->plan.s();
        for (int r = 0; r < R; ++r)
            TORCH_CHECK_VALUE(ps[r] == s[r], "evenep.dispatch: the plan was made for ", ps[r], " tokens on rank ", r,
                              " but x holds ", s[r]);
        std::vector<cuda::RankIo> io(R);
        for (int r = 0; r < R; ++r) {
            io[r].x = ptr<const uint16_t>(x) + r * s_pad * H;
            io[r].topk_w = ptr<const float>(topk_weights) + r * s_pad * K;
        }
        ctx.ep().dispatch(p->plan, io, sc.stream);
        at::Tensor recv_x = at::empty({R, nvs, H}, on(ctx, at::kBFloat16));
        at::Tensor recv_w = at::empty({R, nvs}, on(ctx, at::kFloat));
        cukernels::gather_recv(ctx.offsets(), ctx.bases(), ptr<uint16_t>(recv_x), ptr<float>(recv_w), sc.stream);
        at::Tensor cu = plan.narrow(1, L.cu_seqlens(), L.G).clone(at::MemoryFormat::Contiguous);
        at::Tensor handle = at::empty({R, s_pad * K}, on(ctx, at::kInt));
        cukernels::pack_handle(ctx.offsets(), ctx.bases(), ptr<int32_t>(handle), s_pad, sc.stream);
        ctx.set_held(p, handle, topk_weights);
        return std::make_tuple(recv_x, recv_w, cu, handle);
    });
}

at::Tensor combine_cuda(const at::Tensor& expert_out,
                        const at::Tensor& recv_w,
                        const at::Tensor& topk_weights,
                        const at::Tensor& plan,
                        const at::Tensor& handle,
                        int64_t buffer,
                        bool apply_weights) {
    return translate([&] {
        OpScope sc(buffer, "combine");
        CudaContext& ctx = *sc.ctx;
        const int R = ctx.cfg().R, K = ctx.cfg().K, H = ctx.H();
        check_cuda(ctx, expert_out, "combine", "expert_out", at::kBFloat16, {R, ctx.nvs(), H});
        check_cuda(ctx, recv_w, "combine", "recv_w", at::kFloat, {R, ctx.nvs()});
        std::shared_ptr<PlanEntry> p = handle_plan(sc, topk_weights, plan, handle, "combine");
        const int64_t s_pad = topk_weights.size(1);
        hold(sc, p, handle, topk_weights);
        cukernels::scatter_recv(ctx.offsets(), ctx.bases(), ptr<const uint16_t>(expert_out), sc.stream);
        at::Tensor out = at::zeros({R, s_pad, H}, on(ctx, at::kBFloat16));
        std::vector<cuda::RankIo> io(R);
        for (int r = 0; r < R; ++r) {
            io[r].topk_w = ptr<const float>(topk_weights) + r * s_pad * K;
            io[r].out = ptr<uint16_t>(out) + r * s_pad * H;
        }
        ctx.ep().combine(p->plan, io, apply_weights, cuda::CombineMode::kPull, sc.stream);
        return out;
    });
}

// combine_backward(h, g) = dispatch of g with the plan reused (SPEC §4.3): [R, s, H] -> [R, NvS, H].
at::Tensor combine_backward_cuda(const at::Tensor& grad_out,
                                 const at::Tensor& topk_weights,
                                 const at::Tensor& plan,
                                 const at::Tensor& handle,
                                 int64_t buffer) {
    return translate([&] {
        OpScope sc(buffer, "combine_backward");
        CudaContext& ctx = *sc.ctx;
        const int R = ctx.cfg().R, H = ctx.H();
        const int64_t s_pad = topk_weights.dim() == 3 ? topk_weights.size(1) : -1;
        check_cuda(ctx, grad_out, "combine_backward", "grad_out", at::kBFloat16, {R, s_pad, H});
        std::shared_ptr<PlanEntry> p = handle_plan(sc, topk_weights, plan, handle, "combine_backward");
        const int64_t rows = static_cast<int64_t>(ctx.cfg().S) * H;
        std::vector<cuda::BackwardIo> io(R);
        for (int r = 0; r < R; ++r) {
            io[r].grad_out = ptr<const uint16_t>(grad_out) + r * s_pad * H;
            io[r].grad_x = ptr<uint16_t>(ctx.scratch_rows()) + r * rows;  // not written by this call
            io[r].topk_w = ptr<const float>(topk_weights) + r * s_pad * ctx.cfg().K;
        }
        ctx.ep().combine_backward(p->plan, io, sc.stream);
        at::Tensor out = at::empty({R, ctx.nvs(), H}, on(ctx, at::kBFloat16));
        cukernels::gather_recv(ctx.offsets(), ctx.bases(), ptr<uint16_t>(out), nullptr, sc.stream);
        ctx.set_held(p, handle, topk_weights);
        return out;
    });
}

// dispatch_backward = combine of the row gradients (unweighted) + the gathered route-weight gradients.
std::tuple<at::Tensor, at::Tensor> dispatch_backward_cuda(const at::Tensor& grad_recv_x,
                                                          const at::Tensor& grad_recv_w,
                                                          const at::Tensor& topk_weights,
                                                          const at::Tensor& plan,
                                                          const at::Tensor& handle,
                                                          int64_t buffer) {
    return translate([&] {
        OpScope sc(buffer, "dispatch_backward");
        CudaContext& ctx = *sc.ctx;
        const int R = ctx.cfg().R, K = ctx.cfg().K, H = ctx.H();
        const int64_t nvs = ctx.nvs();
        check_cuda(ctx, grad_recv_x, "dispatch_backward", "grad_recv_x", at::kBFloat16, {R, nvs, H});
        check_cuda(ctx, grad_recv_w, "dispatch_backward", "grad_recv_w", at::kFloat, {R, nvs});
        std::shared_ptr<PlanEntry> p = handle_plan(sc, topk_weights, plan, handle, "dispatch_backward");
        const int64_t s_pad = topk_weights.size(1), rows = static_cast<int64_t>(ctx.cfg().S) * H;
        hold(sc, p, handle, topk_weights);
        cukernels::scatter_recv(ctx.offsets(), ctx.bases(), ptr<const uint16_t>(grad_recv_x), sc.stream);
        at::Tensor grad_x = at::zeros({R, s_pad, H}, on(ctx, at::kBFloat16));
        at::Tensor grad_w = at::zeros({R, s_pad, K}, on(ctx, at::kFloat));
        std::vector<cuda::BackwardIo> io(R);
        for (int r = 0; r < R; ++r) {
            io[r].grad_out = ptr<const uint16_t>(ctx.scratch_rows()) + r * rows;  // not read by this call
            io[r].grad_x = ptr<uint16_t>(grad_x) + r * s_pad * H;
            io[r].grad_topk_w = ptr<float>(grad_w) + r * s_pad * K;
            io[r].grad_recv_w = ptr<const float>(grad_recv_w) + r * nvs;
            io[r].topk_w = ptr<const float>(topk_weights) + r * s_pad * K;
        }
        ctx.ep().dispatch_backward(p->plan, io, cuda::CombineMode::kPull, sc.stream);
        ctx.invalidate();  // recv_w now holds the row-weight gradients
        return std::make_tuple(grad_x, grad_w);
    });
}

// ---- expert weights: pure functions of the plan tensor's copies table (no Ep state) ----

void check_plan(const CudaContext& ctx, const at::Tensor& plan, const char* op) {
    check_cuda(ctx, plan, op, "plan", at::kInt, {ctx.cfg().R, ctx.plan_layout().width()});
}

// slots[r, b] = weight[copies[r][b]] (zero for empty slots).
at::Tensor prefetch_weight_cuda(const at::Tensor& w, const at::Tensor& plan, int64_t buffer) {
    return translate([&] {
        OpScope sc(buffer, "prefetch_weight");
        const CudaContext& ctx = *sc.ctx;
        const Config& c = ctx.cfg();
        const PlanLayout L = ctx.plan_layout();
        TORCH_CHECK_VALUE(w.dim() == 3 && w.size(0) == c.E, "evenep.prefetch_weight: weight has shape ", w.sizes(),
                          ", expected [E = ", c.E, ", in, out]");
        check_cuda(ctx, w, "prefetch_weight", "weight", w.scalar_type(), {c.E, w.size(1), w.size(2)});
        check_plan(ctx, plan, "prefetch_weight");
        at::Tensor slots = at::empty({c.R, L.B, w.size(1), w.size(2)}, w.options());
        cukernels::prefetch(ptr<const int32_t>(plan), L.width(), c.R, c.E, L.G, L.B, ptr<const char>(w),
                            ptr<char>(slots), w.size(1) * w.size(2) * w.element_size(), sc.stream);
        return slots;
    });
}

// grad[e] = sum of the slot gradients of e's copies (ranks ascending, slots ascending), fp32.
at::Tensor reduce_grad_cuda(const at::Tensor& sg, const at::Tensor& plan, int64_t buffer) {
    return translate([&] {
        OpScope sc(buffer, "reduce_grad");
        const CudaContext& ctx = *sc.ctx;
        const Config& c = ctx.cfg();
        const PlanLayout L = ctx.plan_layout();
        TORCH_CHECK_VALUE(sg.dim() == 4, "evenep.reduce_grad: slot_grads has shape ", sg.sizes(),
                          ", expected [R, B, in, out]");
        check_cuda(ctx, sg, "reduce_grad", "slot_grads", at::kFloat, {c.R, L.B, sg.size(2), sg.size(3)});
        check_plan(ctx, plan, "reduce_grad");
        at::Tensor grad = at::empty({c.E, sg.size(2), sg.size(3)}, on(ctx, at::kFloat));
        cukernels::reduce_grad(ptr<const int32_t>(plan), L.width(), c.R, c.E, L.G, L.B, ptr<const float>(sg),
                               ptr<float>(grad), sg.size(2) * sg.size(3), sc.stream);
        return grad;
    });
}

// ---- grouped GEMM (EvenEP's: the Hopper kernel on H100/H200, mma.sync elsewhere) ----

// Per-call device scratch: the [R*G] pointer table, then one GEMM workspace per rank (torch's allocator).
struct GemmScratch {
    at::Tensor bytes;
    size_t ws_bytes = 0;
    GemmScratch(const CudaContext& ctx) {
        const int R = ctx.cfg().R, G = ctx.plan_layout().G;
        ws_bytes = (cuda::grouped_gemm_workspace_bytes(G) + 255) / 256 * 256;
        const size_t table = (static_cast<size_t>(R) * G * sizeof(void*) + 255) / 256 * 256;
        bytes = at::empty({static_cast<int64_t>(table + R * ws_bytes)}, on(ctx, at::kByte));
        table_bytes = table;
    }
    const void** table() const { return reinterpret_cast<const void**>(bytes.data_ptr()); }
    template <typename T>
    T* const* table_as(int r, int G) const {
        return reinterpret_cast<T* const*>(static_cast<char*>(bytes.data_ptr()) + sizeof(void*) * r * G);
    }
    void* workspace(int r) const { return static_cast<char*>(bytes.data_ptr()) + table_bytes + r * ws_bytes; }
    size_t table_bytes = 0;
};

// fwd (transposed = false): out[r] = x[r] · W_g per group, x [R, NvS, a] -> [R, NvS, b] fp32.
// dgrad (transposed = true): out[r] = x[r] · W_g^T, x [R, NvS, b] -> [R, NvS, a] fp32. Rows past the groups are 0.
at::Tensor grouped_gemm_impl(const char* op,
                             const at::Tensor& x,
                             const at::Tensor& w,
                             const at::Tensor& slots,
                             const at::Tensor& plan,
                             int64_t buffer,
                             bool transposed) {
    return translate([&] {
        OpScope sc(buffer, op);
        const CudaContext& ctx = *sc.ctx;
        const Config& c = ctx.cfg();
        const PlanLayout L = ctx.plan_layout();
        check_gemm_weights(c, op, w, slots, c10::DeviceType::CUDA);
        check_cuda(ctx, w, op, "weight", w.scalar_type(), {c.E, w.size(1), w.size(2)});  // and the buffer's GPU
        check_cuda(ctx, slots, op, "slots", w.scalar_type(), {c.R, L.B, w.size(1), w.size(2)});
        check_plan(ctx, plan, op);
        const int64_t a = w.size(1), b = w.size(2), in = transposed ? b : a, out_dim = transposed ? a : b;
        const int64_t nvs = ctx.nvs();
        check_cuda(ctx, x, op, "x", at::kBFloat16, {c.R, nvs, in});
        at::Tensor wb = w.to(at::kBFloat16).contiguous(), sb = slots.to(at::kBFloat16).contiguous();
        at::Tensor out = at::zeros({c.R, nvs, out_dim}, on(ctx, at::kFloat));
        GemmScratch scratch(ctx);
        cukernels::group_table(ptr<const int32_t>(plan), L.width(), c.R, c.E, L.G, L.B, ptr<const char>(wb),
                               ptr<const char>(sb), a * b * 2, scratch.table(), sc.stream);
        for (int r = 0; r < c.R; ++r) {
            cuda::GroupedGemmArgs g;
            g.x = ptr<const uint16_t>(x) + r * nvs * in;
            g.cu_seqlens = ptr<const int32_t>(plan) + r * L.width() + L.cu_seqlens();
            g.weights = scratch.table_as<const uint16_t>(r, L.G);
            g.y = ptr<float>(out) + r * nvs * out_dim;
            g.y_fp32 = true;
            g.num_groups = L.G;
            g.in_dim = static_cast<int>(a);
            g.out_dim = static_cast<int>(b);
            g.op = transposed ? cuda::GemmOp::kDgrad : cuda::GemmOp::kForward;
            g.schedule = cuda::GemmSchedule::kLoadAware;
            g.workspace = scratch.workspace(r);
            cuda::grouped_gemm(g, sc.stream);
        }
        return out;
    });
}

at::Tensor grouped_gemm_cuda(
    const at::Tensor& x, const at::Tensor& w, const at::Tensor& slots, const at::Tensor& plan, int64_t buffer) {
    return grouped_gemm_impl("grouped_gemm", x, w, slots, plan, buffer, false);
}
at::Tensor grouped_gemm_dgrad_cuda(
    const at::Tensor& dy, const at::Tensor& w, const at::Tensor& slots, const at::Tensor& plan, int64_t buffer) {
    return grouped_gemm_impl("grouped_gemm_dgrad", dy, w, slots, plan, buffer, true);
}

// wgrad: grad_W_g += x_g^T · dy_g (fp32) per group into the home gradient [E, a, b] (local and peer groups) or the
// slot gradient [R, B, a, b]; ranks one after the other (peer groups of one expert add up in rank order), the
// deterministic schedule (no row split).
std::tuple<at::Tensor, at::Tensor> grouped_gemm_wgrad_cuda(const at::Tensor& x,
                                                           const at::Tensor& dy,
                                                           const at::Tensor& plan,
                                                           int64_t buffer) {
    return translate([&] {
        OpScope sc(buffer, "grouped_gemm_wgrad");
        const CudaContext& ctx = *sc.ctx;
        const Config& c = ctx.cfg();
        const PlanLayout L = ctx.plan_layout();
        check_plan(ctx, plan, "grouped_gemm_wgrad");
        const int64_t a = x.dim() == 3 ? x.size(2) : -1, b = dy.dim() == 3 ? dy.size(2) : -1, nvs = ctx.nvs();
        check_cuda(ctx, x, "grouped_gemm_wgrad", "x", at::kBFloat16, {c.R, nvs, a});
        check_cuda(ctx, dy, "grouped_gemm_wgrad", "dy", at::kBFloat16, {c.R, nvs, b});
        at::Tensor gw = at::zeros({c.E, a, b}, on(ctx, at::kFloat));
        at::Tensor gs = at::zeros({c.R, L.B, a, b}, on(ctx, at::kFloat));
        GemmScratch scratch(ctx);
        cukernels::group_table(ptr<const int32_t>(plan), L.width(), c.R, c.E, L.G, L.B, ptr<const char>(gw),
                               ptr<const char>(gs), a * b * 4, scratch.table(), sc.stream);
        for (int r = 0; r < c.R; ++r) {
            cuda::GroupedWgradArgs g;
            g.x = ptr<const uint16_t>(x) + r * nvs * a;
            g.dy = ptr<const uint16_t>(dy) + r * nvs * b;
            g.cu_seqlens = ptr<const int32_t>(plan) + r * L.width() + L.cu_seqlens();
            g.grads = scratch.table_as<float>(r, L.G);
            g.num_groups = L.G;
            g.in_dim = static_cast<int>(a);
            g.out_dim = static_cast<int>(b);
            g.schedule = cuda::GemmSchedule::kFixed;
            g.workspace = scratch.workspace(r);
            cuda::grouped_gemm_wgrad(g, sc.stream);
        }
        return std::make_tuple(gw, gs);
    });
}

}  // namespace
}  // namespace evenep::python

TORCH_LIBRARY_IMPL(evenep, CUDA, m) {
    using namespace evenep::python;
    m.impl("plan", &plan_cuda);
    m.impl("dispatch", &dispatch_cuda);
    m.impl("combine", &combine_cuda);
    m.impl("combine_backward", &combine_backward_cuda);
    m.impl("dispatch_backward", &dispatch_backward_cuda);
    m.impl("prefetch_weight", &prefetch_weight_cuda);
    m.impl("reduce_grad", &reduce_grad_cuda);
    m.impl("grouped_gemm", &grouped_gemm_cuda);
    m.impl("grouped_gemm_dgrad", &grouped_gemm_dgrad_cuda);
    m.impl("grouped_gemm_wgrad", &grouped_gemm_wgrad_cuda);
}
