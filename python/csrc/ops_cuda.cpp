// python/csrc/ops_cuda.cpp — the CUDA kernels of the torch.library ops (TORCH_LIBRARY_IMPL(evenep, CUDA, m)): the
// same schemas and results as the CPU kernels of ops.cpp (bit for bit for plan and data movement; the grouped GEMM
// within bf16 tolerance), over cuda::Ep with R virtual ranks on one GPU or this process's rank of a group= buffer
// over the NCCL team (CudaContext, cuda_context.hpp). Tensors lead with L, the ranks served here (R, or 1).
//
// Every op runs on the current torch stream of the buffer's device (c10::cuda::getCurrentCUDAStream), launches
// asynchronously and never synchronises with the host (except: a copy of a dispatch handle is recognised by value,
// handle_record.hpp; Buffer.check()). An op given a plan tensor uses that plan (cuda_context.hpp). Device memory:
// the Ep's buffers, tables and the Context's scratch rows are allocated once, when the buffer is created; op
// outputs and per-call scratch (GEMM pointer tables and workspaces) come from torch's caching allocator, which
// during CUDA-graph capture serves them from the graph's private pool (allowed: no cudaMalloc, no host
// synchronisation inside the op). No plan is referenced when another replaces it (CudaContext::drop_last_plan), so
// the Ep never copies a plan out.
//
// Outputs never alias the library's buffers: autograd saves dispatch's outputs and the next dispatch (another layer,
// the next step) overwrites the buffers, so a view would silently change saved tensors. With virtual ranks the
// data-path kernels write and read the op's own tensors directly (cuda::RankIo::rows: dispatch writes recv_x and
// combine_backward its rows in place of the buffer's receive rows, combine and dispatch_backward read theirs), so
// no row is copied; with group= the rows live in the NCCL window and are copied out and in (peers write them).
// What an op does not need to write is left as torch.empty leaves it, unless torch's deterministic mode asks for
// initialised memory (unwritten_zero): rows of recv_x and combine_backward's output past the plan's groups, the
// slots without a copy (prefetch_weight, the slot gradients of grouped_gemm_wgrad). No op or autograd formula reads
// them.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <optional>

#include "cuda_context.hpp"
#include "evenep/cuda/check.hpp"
#include "evenep/cuda/grouped_gemm.hpp"

namespace evenep::python {
namespace {

// Plans from idx (int32 [L, s_pad, K] on the device) with s_r tokens on each of the R ranks: the new resident plan.
// plan_out: the plan tensor [L, W] the planner writes in its last phase (RankIo::plan), or null.
cuda::EpPlan new_plan(OpScope& sc, const at::Tensor& idx, const std::vector<int32_t>& s, int32_t* plan_out) {
    CudaContext& ctx = *sc.ctx;
    const int L = ctx.L(), K = ctx.cfg().K;
    const int64_t s_pad = idx.size(1), W = ctx.plan_layout().width;
    std::vector<cuda::RankIo> io(L);
    for (int i = 0; i < L; ++i) {
        io[i].topk_idx = ptr<const int32_t>(idx) + i * s_pad * K;
        if (plan_out) io[i].plan = plan_out + i * W;
    }
    ctx.drop_last_plan();
    return ctx.ep().plan(io, s, sc.stream, group_total(s));
}

}  // namespace

cuda::EpPlan dispatch_plan(OpScope& sc,
                           const at::Tensor& topk_idx,
                           const at::Tensor& topk_weights,
                           const at::Tensor& plan,
                           int64_t s_pad,
                           std::optional<at::IntArrayRef> num_tokens) {
    CudaContext& ctx = *sc.ctx;
    const int L = ctx.L(), K = ctx.cfg().K;
    at::Tensor idx = topk_int32(ctx, topk_idx, "dispatch");
    check_cuda(ctx, topk_weights, "dispatch", "topk_weights", at::kFloat, {L, s_pad, K});
    check_cuda(ctx, plan, "dispatch", "plan", at::kInt, {L, ctx.plan_layout().width});
    const std::vector<int32_t> s = token_counts(ctx.cfg(), s_pad, num_tokens, "dispatch", ctx.rank_begin(), L);
    // The kernels read the encoded destinations, which the plan tensor lacks: the plan of the latest plan op when
    // this is its tensor and it is still resident, else planned again (a pure function of the routing).
    cuda::EpPlan p = ctx.last_plan(plan);
    if (!p.valid()) {
        p = new_plan(sc, idx, s, nullptr);
        ctx.set_last_plan(plan, p);  // the plan of this tensor now: the next dispatch of it plans no more
    }
    const std::span<const int32_t> ps = p.s();
    for (int r = ctx.rank_begin(); r < ctx.rank_begin() + ctx.L(); ++r)
        TORCH_CHECK_VALUE(ps[r] == s[r], "evenep.dispatch: the plan was made for ", ps[r], " tokens on rank ", r,
                          " but x holds ", s[r]);
    return p;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> dispatch_results(OpScope& sc,
                                                                const at::Tensor& plan,
                                                                int64_t s_pad,
                                                                const at::Tensor* recv_x) {
    CudaContext& ctx = *sc.ctx;
    const PlanRowLayout& L = ctx.plan_layout();
    at::Tensor recv_w = at::empty({ctx.L(), ctx.nvs()}, on(ctx, at::kFloat));
    cuda::gather_recv(ctx.ep(), recv_x ? ptr<uint16_t>(*recv_x) : nullptr, ptr<float>(recv_w), sc.stream);
    at::Tensor cu = plan.narrow(1, L.cu_seqlens, L.G).clone(at::MemoryFormat::Contiguous);
    at::Tensor handle = at::empty({ctx.L(), s_pad * ctx.cfg().K}, on(ctx, at::kInt));
    cuda::pack_handle(ctx.ep(), ptr<int32_t>(handle), s_pad, sc.stream);
    ctx.handles().add(handle, plan, plan.clone());
    return {recv_w, cu, handle};
}

namespace {

at::Tensor plan_cuda(const at::Tensor& topk_idx, int64_t buffer, std::optional<at::IntArrayRef> num_tokens) {
    return translate([&] {
        OpScope sc(buffer, "plan");
        at::Tensor idx = topk_int32(*sc.ctx, topk_idx, "plan");
        CudaContext& ctx = *sc.ctx;
        at::Tensor t = at::empty({ctx.L(), ctx.plan_layout().width}, on(ctx, at::kInt));
        cuda::EpPlan p =
            new_plan(sc, idx, token_counts(ctx.cfg(), idx.size(1), num_tokens, "plan", ctx.rank_begin(), ctx.L()),
                     ptr<int32_t>(t));
        ctx.set_last_plan(t, std::move(p));
        return t;
    });
}

// The ops that take (topk_weights, plan, handle): checks them (the handle is one dispatch made for this plan,
// handle_record.hpp) and makes the plan resident from the tensor and the handle (CudaContext::unpack; every rank
// with s_pad tokens: the handle masks the entries past s_r).
cuda::EpPlan handle_plan(
    OpScope& sc, const at::Tensor& topk_w, const at::Tensor& plan, const at::Tensor& handle, const char* op) {
    CudaContext& ctx = *sc.ctx;
    const int L = ctx.L(), K = ctx.cfg().K;
    const int64_t s_pad = topk_w.dim() == 3 ? topk_w.size(1) : -1;
    check_cuda(ctx, topk_w, op, "topk_weights", at::kFloat, {L, s_pad, K});
    check_cuda(ctx, handle, op, "handle", at::kInt, {L, s_pad * K});
    check_cuda(ctx, plan, op, "plan", at::kInt, {L, ctx.plan_layout().width});
    ctx.handles().check(handle, plan, sc.capturing, op);
    return ctx.unpack(plan, ptr<const int32_t>(handle), s_pad, sc.stream);
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
        const int R = ctx.L(), K = ctx.cfg().K, H = ctx.H();  // R: the served ranks (L)
        const int64_t s_pad = x.dim() == 3 ? x.size(1) : -1, nvs = ctx.nvs();
        check_cuda(ctx, x, "dispatch", "x", at::kBFloat16, {R, s_pad, H});
        const cuda::EpPlan p = dispatch_plan(sc, topk_idx, topk_weights, plan, s_pad, num_tokens);
        at::Tensor recv_x = output(ctx, {R, nvs, H}, at::kBFloat16);
        std::vector<cuda::RankIo> io(R);
        for (int r = 0; r < R; ++r) {
            io[r].x = ptr<const uint16_t>(x) + r * s_pad * H;
            io[r].topk_w = ptr<const float>(topk_weights) + r * s_pad * K;
            io[r].rows = rows_of(ctx, recv_x, r);
        }
        ctx.ep().dispatch(p, io, sc.stream);
        auto [recv_w, cu, handle] = dispatch_results(sc, plan, s_pad, ctx.multi_process() ? &recv_x : nullptr);
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
        const int R = ctx.L(), K = ctx.cfg().K, H = ctx.H();
        check_cuda(ctx, expert_out, "combine", "expert_out", at::kBFloat16, {R, ctx.nvs(), H});
        check_cuda(ctx, recv_w, "combine", "recv_w", at::kFloat, {R, ctx.nvs()});
        const cuda::EpPlan p = handle_plan(sc, topk_weights, plan, handle, "combine");
        const int64_t s_pad = topk_weights.size(1);
        if (ctx.multi_process()) {
            ctx.peer_barrier(sc.stream, ctx.ep().options().channel);
            cuda::scatter_recv(ctx.ep(), ptr<const uint16_t>(expert_out), sc.stream);
        }
        at::Tensor out = at::empty({R, s_pad, H}, on(ctx, at::kBFloat16));  // every row written (0 past s_r)
        std::vector<cuda::RankIo> io(R);
        for (int r = 0; r < R; ++r) {
            io[r].topk_w = ptr<const float>(topk_weights) + r * s_pad * K;
            io[r].out = ptr<uint16_t>(out) + r * s_pad * H;
            io[r].rows = rows_of(ctx, expert_out, r);
        }
        // Pull mode reads the destinations, the weights and the rows only (not the chain metadata dispatch left in
        // the buffers): whatever ran since that dispatch, nothing is dispatched again.
        ctx.ep().combine(p, io, apply_weights, cuda::CombineMode::kPull, sc.stream);
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
        const int R = ctx.L(), H = ctx.H();
        const int64_t s_pad = topk_weights.dim() == 3 ? topk_weights.size(1) : -1;
        check_cuda(ctx, grad_out, "combine_backward", "grad_out", at::kBFloat16, {R, s_pad, H});
        const cuda::EpPlan p = handle_plan(sc, topk_weights, plan, handle, "combine_backward");
        const int64_t rows = static_cast<int64_t>(ctx.cfg().S) * H;
        at::Tensor out = output(ctx, {R, ctx.nvs(), H}, at::kBFloat16);
        std::vector<cuda::BackwardIo> io(R);
        for (int r = 0; r < R; ++r) {
            io[r].grad_out = ptr<const uint16_t>(grad_out) + r * s_pad * H;
            io[r].grad_x = ptr<uint16_t>(ctx.scratch_rows()) + r * rows;  // not written by this call
            io[r].topk_w = ptr<const float>(topk_weights) + r * s_pad * ctx.cfg().K;
            io[r].rows = rows_of(ctx, out, r);
        }
        ctx.ep().combine_backward(p, io, sc.stream);
        if (ctx.multi_process()) cuda::gather_recv(ctx.ep(), ptr<uint16_t>(out), nullptr, sc.stream);
        return out;
    });
}

// The backward of a weighted combine: combine_backward's rows (written into grad_expert_out), then one pass over
// each rank's rows in the groups: grad_y = bf16(w * rows) in place and grad_w = <rows, y> (fp32; 0 past the groups).
std::tuple<at::Tensor, at::Tensor> combine_backward_weighted_cuda(const at::Tensor& grad_out,
                                                                  const at::Tensor& expert_out,
                                                                  const at::Tensor& recv_w,
                                                                  const at::Tensor& topk_weights,
                                                                  const at::Tensor& plan,
                                                                  const at::Tensor& handle,
                                                                  int64_t buffer) {
    at::Tensor rows = combine_backward_cuda(grad_out, topk_weights, plan, handle, buffer);
    return translate([&] {
        OpScope sc(buffer, "combine_backward_weighted");
        const CudaContext& ctx = *sc.ctx;
        check_cuda(ctx, expert_out, "combine_backward_weighted", "expert_out", at::kBFloat16,
                   {ctx.L(), ctx.nvs(), ctx.H()});
        check_cuda(ctx, recv_w, "combine_backward_weighted", "recv_w", at::kFloat, {ctx.L(), ctx.nvs()});
        at::Tensor grad_w = at::empty({ctx.L(), ctx.nvs()}, on(ctx, at::kFloat));
        cuda::WeightRowsArgs args;
        args.plan = ctx.plan_rows(plan, ctx.L());
        args.nvs = ctx.nvs();
        args.H = ctx.H();
        args.rows = ptr<uint16_t>(rows);
        args.y = ptr<const uint16_t>(expert_out);
        args.recv_w = ptr<const float>(recv_w);
        args.grad_w = ptr<float>(grad_w);
        cuda::weight_rows(args, sc.stream);
        return std::make_tuple(rows, grad_w);
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
        const int R = ctx.L(), K = ctx.cfg().K, H = ctx.H();
        const int64_t nvs = ctx.nvs();
        check_cuda(ctx, grad_recv_x, "dispatch_backward", "grad_recv_x", at::kBFloat16, {R, nvs, H});
        check_cuda(ctx, grad_recv_w, "dispatch_backward", "grad_recv_w", at::kFloat, {R, nvs});
        const cuda::EpPlan p = handle_plan(sc, topk_weights, plan, handle, "dispatch_backward");
        const int64_t s_pad = topk_weights.size(1), rows = static_cast<int64_t>(ctx.cfg().S) * H;
        if (ctx.multi_process()) {
            ctx.peer_barrier(sc.stream, ctx.ep().options().channel);
            cuda::scatter_recv(ctx.ep(), ptr<const uint16_t>(grad_recv_x), sc.stream);
        }
        at::Tensor grad_x = at::empty({R, s_pad, H}, on(ctx, at::kBFloat16));  // every row written (0 past s_r)
        at::Tensor grad_w = at::zeros({R, s_pad, K}, on(ctx, at::kFloat));
        std::vector<cuda::BackwardIo> io(R);
        for (int r = 0; r < R; ++r) {
            io[r].grad_out = ptr<const uint16_t>(ctx.scratch_rows()) + r * rows;  // not read by this call
            io[r].grad_x = ptr<uint16_t>(grad_x) + r * s_pad * H;
            io[r].grad_topk_w = ptr<float>(grad_w) + r * s_pad * K;
            io[r].grad_recv_w = ptr<const float>(grad_recv_w) + r * nvs;
            io[r].topk_w = ptr<const float>(topk_weights) + r * s_pad * K;
            io[r].rows = rows_of(ctx, grad_recv_x, r);
        }
        // Pull mode (see combine): the gathered weights are grad_recv_w, copied over recv_w by the call.
        ctx.ep().dispatch_backward(p, io, cuda::CombineMode::kPull, sc.stream);
        return std::make_tuple(grad_x, grad_w);
    });
}

// ---- expert weights: with virtual ranks every home weight is in this process and the ops are functions of the
// plan tensor's tables; with group= the peers' weights and slot gradients move through the library's pools
// (cuda::Experts of CudaContext::experts, shared by every layer) ----

void check_plan(const CudaContext& ctx, const at::Tensor& plan, const char* op) {
    check_cuda(ctx, plan, op, "plan", at::kInt, {ctx.L(), ctx.plan_layout().width});
}

// slots[i, b] = weight of expert copies[i][b]; slots without a copy are not written (unwritten_zero: zero).
at::Tensor prefetch_weight_cuda(const at::Tensor& w, const at::Tensor& plan, int64_t buffer) {
    return translate([&] {
        OpScope sc(buffer, "prefetch_weight");
        CudaContext& ctx = *sc.ctx;
        const Config& c = ctx.cfg();
        const PlanRowLayout& L = ctx.plan_layout();
        check_home(ctx, w, "prefetch_weight", "weight", w.scalar_type());
        check_plan(ctx, plan, "prefetch_weight");
        const int64_t mat_bytes = w.size(1) * w.size(2) * w.element_size();
        at::Tensor slots = at::empty({ctx.L(), L.B, w.size(1), w.size(2)}, w.options());
        if (!ctx.multi_process()) {  // every rank here: the function cuda::Experts uses on the local team
            cuda::prefetch_copies(
                cuda::ExpertCopies::of_tensors(ctx.plan_rows(plan, c.R), w.data_ptr(), slots.data_ptr(), mat_bytes),
                unwritten_zero(), sc.stream);
            return slots;
        }
        // group=: the owners push their weights (raw bytes of w's dtype) into the holders' slots. The pool's
        // matrices are 16-byte multiples: a smaller stride (the FP8 weights' scales, [in/128, out/128] fp32) is
        // padded on the way in and out.
        if (mat_bytes == 0) return slots;
        const int64_t pool_bytes = (mat_bytes + 15) / 16 * 16;
        const bool padded = pool_bytes != mat_bytes;
        cuda::Experts& ex = ctx.experts(pool_bytes / 2, false, sc.capturing);
        const int r = ctx.rank_begin();
        // The owners push into this rank's slots (the last copy-out is done) and the plan rows go into every rank's
        // copies table (no peer still reads it).
        ctx.peer_barrier(sc.stream, 1);
        EVENEP_CUDA_CHECK(cudaMemcpy2DAsync(ex.weight(r, 0, 0), pool_bytes, w.data_ptr(), mat_bytes, mat_bytes,
                                            ctx.num_home(), cudaMemcpyDeviceToDevice, sc.stream));
        ex.prefetch_weight(ctx.ep(), ctx.unpack(plan, nullptr, 1, sc.stream), sc.stream);
        at::Tensor staged = padded ? output(ctx, {L.B, pool_bytes}, at::kByte) : slots;
        cuda::select_slots(ctx.plan_rows(plan, 1), ex.slot(r, 0, 0), staged.data_ptr(), pool_bytes, sc.stream);
        if (padded)
            EVENEP_CUDA_CHECK(cudaMemcpy2DAsync(slots.data_ptr(), mat_bytes, staged.data_ptr(), pool_bytes, mat_bytes,
                                                L.B, cudaMemcpyDeviceToDevice, sc.stream));
        return slots;
    });
}

// Adds every copy's gradient home: grad[e] = (accumulate ? grad[e] : 0) + each slot gradient of e's copies in turn
// (ranks ascending, slots ascending), fp32, for the home experts of the served ranks: cuda::reduce_copies (virtual
// ranks) and cuda::Experts::reduce_grad (group=) add in that one order. With accumulate the experts without copies
// are not touched (no dense zero-fill or add); without, they get 0.
void reduce_into(
    OpScope& sc, const char* op, const at::Tensor& sg, const at::Tensor& plan, at::Tensor& grad, bool accumulate) {
    CudaContext& ctx = *sc.ctx;
    const Config& c = ctx.cfg();
    const PlanRowLayout& L = ctx.plan_layout();
    TORCH_CHECK_VALUE(sg.dim() == 4, "evenep.", op, ": slot_grads has shape ", sg.sizes(),
                      ", expected [L, B, in, out]");
    check_cuda(ctx, sg, op, "slot_grads", at::kFloat, {ctx.L(), L.B, sg.size(2), sg.size(3)});
    check_plan(ctx, plan, op);
    if (!grad.defined()) grad = at::empty({ctx.num_home(), sg.size(2), sg.size(3)}, on(ctx, at::kFloat));
    check_cuda(ctx, grad, op, "grad", at::kFloat, {ctx.num_home(), sg.size(2), sg.size(3)});
    const int64_t n = sg.size(2) * sg.size(3);
    if (!ctx.multi_process()) {
        cuda::reduce_copies(cuda::ExpertCopies::of_tensors(ctx.plan_rows(plan, c.R), grad.data_ptr(),
                                                           const_cast<void*>(sg.data_ptr()), n * 4),
                            accumulate, /*zero_consumed=*/false, sc.stream);
        return;
    }
    // group=: slot gradients into the reduce buffer, the home ranks pull them (cuda::Experts::reduce_grad adds them
    // to its home gradients: 0, or grad when accumulating).
    TORCH_CHECK_VALUE(n > 0 && n % 8 == 0, "evenep.", op, ": one matrix of slot_grads has ", n,
                      " elements, expected a positive multiple of 8");
    cuda::Experts& ex = ctx.experts(n, true, sc.capturing);
    const int r = ctx.rank_begin();
    const size_t home_bytes = static_cast<size_t>(n) * ctx.num_home() * sizeof(float);
    EVENEP_CUDA_CHECK(cudaMemcpyAsync(ex.slot_grad(r, 0, 0), sg.data_ptr(), sg.numel() * sizeof(float),
                                      cudaMemcpyDeviceToDevice, sc.stream));
    if (accumulate)
        EVENEP_CUDA_CHECK(
            cudaMemcpyAsync(ex.grad(r, 0, 0), grad.data_ptr(), home_bytes, cudaMemcpyDeviceToDevice, sc.stream));
    else
        EVENEP_CUDA_CHECK(cudaMemsetAsync(ex.grad(r, 0, 0), 0, home_bytes, sc.stream));
    ctx.peer_barrier(sc.stream, 1);  // no peer still reads its copies table: the plan rows go into every rank's
    ex.reduce_grad(ctx.ep(), ctx.unpack(plan, nullptr, 1, sc.stream), sc.stream);
    EVENEP_CUDA_CHECK(
        cudaMemcpyAsync(grad.data_ptr(), ex.grad(r, 0, 0), home_bytes, cudaMemcpyDeviceToDevice, sc.stream));
}

at::Tensor reduce_grad_cuda(const at::Tensor& sg, const at::Tensor& plan, int64_t buffer) {
    return translate([&] {
        OpScope sc(buffer, "reduce_grad");
        at::Tensor grad;
        reduce_into(sc, "reduce_grad", sg, plan, grad, false);
        return grad;
    });
}

// In place: the home gradient the GEMM's wgrad wrote, completed by the copies' gradients.
void reduce_grad_add_cuda(at::Tensor& grad, const at::Tensor& sg, const at::Tensor& plan, int64_t buffer) {
    translate([&] {
        OpScope sc(buffer, "reduce_grad_add_");
        reduce_into(sc, "reduce_grad_add_", sg, plan, grad, true);
        return 0;
    });
}

// ---- grouped GEMM (EvenEP's: the Hopper kernel on H100/H200, mma.sync elsewhere) ----

// fwd (transposed = false): out[i] = x[i] · W_g per group, x [L, NvS, a] -> [L, NvS, b] fp32 (or bf16: out_dtype,
// rounded in the epilogue). dgrad (transposed = true): out[i] = x[i] · W_g^T, x [L, NvS, b] -> [L, NvS, a]. Padding
// rows are 0; rows past the groups are not written (unwritten_zero: 0).
// One GEMM launch for the groups of every served rank (cuda::build_group_table).
at::Tensor grouped_gemm_impl(const char* op,
                             const at::Tensor& x,
                             const at::Tensor& w,
                             const at::Tensor& slots,
                             const at::Tensor& plan,
                             int64_t buffer,
                             std::optional<at::ScalarType> out_dtype,
                             bool transposed) {
    return translate([&] {
        OpScope sc(buffer, op);
        const at::ScalarType dtype = gemm_out_dtype(out_dtype, op);
        const CudaContext& ctx = *sc.ctx;
        const PlanRowLayout& L = ctx.plan_layout();
        check_home(ctx, w, op, "weight", w.scalar_type());
        check_cuda(ctx, slots, op, "slots", w.scalar_type(), {ctx.L(), L.B, w.size(1), w.size(2)});
        check_plan(ctx, plan, op);
        const int64_t a = w.size(1), b = w.size(2), in = transposed ? b : a, out_dim = transposed ? a : b;
        const int64_t nvs = ctx.nvs();
        check_cuda(ctx, x, op, "x", at::kBFloat16, {ctx.L(), nvs, in});
        at::Tensor wb = w.to(at::kBFloat16).contiguous(), sb = slots.to(at::kBFloat16).contiguous();
        at::Tensor out = output(ctx, {ctx.L(), nvs, out_dim}, dtype);
        const int groups = ctx.L() * (L.G + 1);
        GemmScratch scratch(ctx, groups, 1);
        group_table(ctx, plan, wb, sb, a * b * 2, scratch, sc.stream);
        cuda::GroupedGemmArgs g;
        g.x = ptr<const uint16_t>(x);
        g.cu_seqlens = scratch.cu();
        g.weights = scratch.table_as<const uint16_t>(0);
        g.y = out.data_ptr();
        g.y_fp32 = dtype == at::kFloat;
        g.num_groups = groups;
        g.in_dim = static_cast<int>(a);
        g.out_dim = static_cast<int>(b);
        g.op = transposed ? cuda::GemmOp::kDgrad : cuda::GemmOp::kForward;
        g.schedule = cuda::GemmSchedule::kLoadAware;
        g.workspace = scratch.workspace(0);
        g.rows_capacity = ctx.L() * nvs;
        cuda::grouped_gemm(g, sc.stream);
        return out;
    });
}

// wgrad: grad_W_g = x_g^T · dy_g (fp32) per group into the home gradient [E*L/R, a, b] (local and peer groups) or
// the slot gradient [L, B, a, b]. With B >= E/R (training: no peer groups) every gradient matrix belongs to at most
// one group: one launch for every served rank, written without being read (never split: deterministic). With
// B < E/R peer groups of one expert add into its home gradient: one launch per rank, in rank order (kFixed).
std::tuple<at::Tensor, at::Tensor> grouped_gemm_wgrad_cuda(const at::Tensor& x,
                                                           const at::Tensor& dy,
                                                           const at::Tensor& plan,
                                                           int64_t buffer) {
    return translate([&] {
        OpScope sc(buffer, "grouped_gemm_wgrad");
        const CudaContext& ctx = *sc.ctx;
        const Config& c = ctx.cfg();
        const PlanRowLayout& L = ctx.plan_layout();
        check_plan(ctx, plan, "grouped_gemm_wgrad");
        const int64_t a = x.dim() == 3 ? x.size(2) : -1, b = dy.dim() == 3 ? dy.size(2) : -1, nvs = ctx.nvs();
        check_cuda(ctx, x, "grouped_gemm_wgrad", "x", at::kBFloat16, {ctx.L(), nvs, a});
        check_cuda(ctx, dy, "grouped_gemm_wgrad", "dy", at::kBFloat16, {ctx.L(), nvs, b});
        const bool one_launch = c.num_slots() >= c.E / c.R;
        at::Tensor gw = at::zeros({ctx.num_home(), a, b}, on(ctx, at::kFloat));
        // One launch: each used slot's gradient is written by its one group; the others stay unwritten.
        at::Tensor gs = one_launch ? output(ctx, {ctx.L(), L.B, a, b}, at::kFloat)
                                   : at::zeros({ctx.L(), L.B, a, b}, on(ctx, at::kFloat));
        const int groups = ctx.L() * (L.G + 1);
        GemmScratch scratch(ctx, groups, one_launch ? 1 : ctx.L());
        group_table(ctx, plan, gw, gs, a * b * 4, scratch, sc.stream);
        cuda::GroupedWgradArgs g;
        g.in_dim = static_cast<int>(a);
        g.out_dim = static_cast<int>(b);
        if (one_launch) {
            g.x = ptr<const uint16_t>(x);
            g.dy = ptr<const uint16_t>(dy);
            g.cu_seqlens = scratch.cu();
            g.grads = scratch.table_as<float>(0);
            g.num_groups = groups;
            g.schedule = cuda::GemmSchedule::kLoadAware;
            g.accumulate = false;
            g.workspace = scratch.workspace(0);
            cuda::grouped_gemm_wgrad(g, sc.stream);
            return std::make_tuple(gw, gs);
        }
        for (int i = 0; i < ctx.L(); ++i) {  // ranks in order: peer groups of one expert add up deterministically
            g.x = ptr<const uint16_t>(x) + i * nvs * a;
            g.dy = ptr<const uint16_t>(dy) + i * nvs * b;
            g.cu_seqlens = ptr<const int32_t>(plan) + i * L.width + L.cu_seqlens;
            g.grads = scratch.table_as<float>(static_cast<int64_t>(i) * (L.G + 1));
            g.num_groups = L.G;
            g.schedule = cuda::GemmSchedule::kFixed;
            g.workspace = scratch.workspace(i);
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
    m.impl("combine_backward_weighted", &combine_backward_weighted_cuda);
    m.impl("dispatch_backward", &dispatch_backward_cuda);
    m.impl("prefetch_weight", &prefetch_weight_cuda);
    m.impl("reduce_grad", &reduce_grad_cuda);
    m.impl("reduce_grad_add_", &reduce_grad_add_cuda);
    m.impl("grouped_gemm", &grouped_gemm_kernel<grouped_gemm_impl, false>);
    m.impl("grouped_gemm_dgrad", &grouped_gemm_kernel<grouped_gemm_impl, true>);
    m.impl("grouped_gemm_wgrad", &grouped_gemm_wgrad_cuda);
}
