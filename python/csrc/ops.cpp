// python/csrc/ops.cpp — the torch.library binding of EvenEP (TORCH_LIBRARY(evenep, ...)): CPU kernels of every op
// over the CPU backend (evenep::cpu, R virtual ranks as threads of this process). A thin binding: tensor checks,
// packing, and calls into the library; autograd and fake (meta) implementations are registered in Python
// (python/evenep/_ops.py), where the schemas are documented.
//
// State: a Context per evenep.Buffer (context.hpp, looked up by an int id passed to every op) owns the
// LocalTeamGroup, one cpu::Buffer per virtual rank and a Planner. Every op is a function of its tensor arguments:
// the plan and the dispatch handle are tensors (evenep::plan_columns, docs/python.md), so the op that finds the
// communication buffer holding another dispatch's rows first dispatches its own handle again (re-dispatch, no
// planning). Normal call orders (dispatch → combine, combine_backward → dispatch_backward) never re-dispatch.
//
// CUDA: python/csrc/ops_cuda.cpp registers the CUDA kernels of the same schemas (TORCH_LIBRARY_IMPL(evenep, CUDA,
// m)) over cuda::Ep, and the CUDA buffer ops (create_cuda_buffer, ...) as a TORCH_LIBRARY_FRAGMENT.
// NOTE: Python.h first (it may redefine feature macros the standard headers read).
#include <Python.h>
// clang-format off
#include <ATen/ATen.h>
#include <torch/library.h>
// clang-format on

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <optional>

#include "context.hpp"
#include "evenep/cpu/grouped_gemm.hpp"
#include "evenep/detail/layout.hpp"
#include "evenep/detail/row_grad.hpp"

namespace evenep::python {
namespace {

std::mutex g_registry_mutex;
std::map<int64_t, std::shared_ptr<Context>> g_registry;
std::atomic<int64_t> g_next_id{1};
std::atomic<BufferInfoHook> g_cuda_info{nullptr};

std::vector<int32_t> tokens(const Context& ctx,
                            int64_t s_pad,
                            const std::optional<at::IntArrayRef>& num_tokens,
                            const char* op) {
    return token_counts(ctx.cfg(), s_pad, num_tokens, op);
}

// Copies rank r's first `rows` receive rows into out[r] (the rest of out stays zero).
void copy_rows(at::Tensor& out, int r, const void* src, int64_t rows) {
    const int64_t row_bytes = out.numel() / (out.size(0) * out.size(1)) * out.element_size();
    std::memcpy(static_cast<char*>(out.data_ptr()) + r * out.size(1) * row_bytes, src,
                static_cast<size_t>(rows * row_bytes));
}

// ---------------------------------------------------------------------------------------------------------
// Ops (CPU kernels). The CUDA kernels of the same schemas live in ops_cuda.cpp (over cuda::Ep).
// ---------------------------------------------------------------------------------------------------------

int64_t create_buffer(int64_t num_ranks,
                      int64_t num_experts,
                      int64_t top_k,
                      int64_t max_tokens,
                      int64_t hidden,
                      int64_t ffn_hidden,
                      int64_t num_slots,
                      int64_t token_padding,
                      std::string planner,
                      std::string policy,
                      double slack,
                      bool fp8,
                      bool ue8m0,
                      bool bf16_partials) {
    return translate([&] {
        const BufferConfig cfg =
            make_buffer_config(num_ranks, num_experts, top_k, max_tokens, hidden, ffn_hidden, num_slots, token_padding,
                               policy, slack, DataPrecision{fp8, ue8m0, bf16_partials});
        auto ctx = std::make_shared<Context>(cfg, parse_planner_mode(planner));
        const int64_t id = new_buffer_id();
        std::lock_guard lock(g_registry_mutex);
        g_registry[id] = ctx;
        return id;
    });
}

void release_buffer(int64_t id) {
    std::lock_guard lock(g_registry_mutex);
    g_registry.erase(id);
}

// [R, E, K, S, H, H', B, tp, NvS, G, plan width, L, rank_begin, home experts] (buffer_info_of)
std::vector<int64_t> buffer_info(int64_t id) {
    if (BufferInfoHook hook = g_cuda_info.load()) {
        std::vector<int64_t> info = hook(id);
        if (!info.empty()) return info;
    }
    const BufferConfig& b = context(id)->buffer_config();
    return buffer_info_of(b, b.cfg.R, 0);
}

// The plan tensor's columns (evenep::plan_columns of the buffer's configuration): names, first columns, counts.
std::tuple<std::vector<std::string>, std::vector<int64_t>, std::vector<int64_t>> plan_columns_op(int64_t id) {
    const std::vector<int64_t> info = buffer_info(id);  // [R, E, K, S, H, H', B, tp, ...]
    Config c;
    c.R = static_cast<int>(info[0]);
    c.E = static_cast<int>(info[1]);
    c.K = static_cast<int>(info[2]);
    c.S = static_cast<int>(info[3]);
    c.B = static_cast<int>(info[6]);
    c.tp = static_cast<int>(info[7]);
    std::vector<std::string> names;
    std::vector<int64_t> offsets, counts;
    for (const PlanColumn& col : plan_columns(c)) {
        names.emplace_back(col.name);
        offsets.push_back(col.offset);
        counts.push_back(col.count);
    }
    return {names, offsets, counts};
}

at::Tensor plan_op(const at::Tensor& topk_idx, int64_t buffer, std::optional<at::IntArrayRef> num_tokens) {
    auto ctx = context(buffer);
    std::lock_guard lock(ctx->mutex());
    return translate([&] {
        at::Tensor idx = topk_int32(*ctx, topk_idx, "plan");
        return ctx->plan(idx, tokens(*ctx, idx.size(1), num_tokens, "plan"));
    });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> dispatch_op(const at::Tensor& x,
                                                                       const at::Tensor& topk_idx,
                                                                       const at::Tensor& topk_weights,
                                                                       const at::Tensor& plan,
                                                                       int64_t buffer,
                                                                       std::optional<at::IntArrayRef> num_tokens) {
    auto ctx = context(buffer);
    std::lock_guard lock(ctx->mutex());
    return translate([&] {
        const int R = ctx->cfg().R, H = ctx->H();
        const int64_t s_pad = x.dim() == 3 ? x.size(1) : -1;
        check_tensor(x, "dispatch", "x", at::kBFloat16, {R, s_pad, H});
        DispatchSetup d = dispatch_setup(*ctx, topk_idx, topk_weights, plan, s_pad, num_tokens);
        at::Tensor recv_x = at::zeros({R, ctx->nvs(), H}, at::kBFloat16);
        ctx->dispatch(std::move(d.hs), x, plan, d.handle, topk_weights);
        ctx->record_handle(d.handle, plan);
        for (int r = 0; r < R; ++r) copy_rows(recv_x, r, ctx->buffer(r).recv_x().data(), d.plan->rows_used(r));
        auto [recv_w, cu] = dispatch_weights(*ctx, *d.plan);
        return std::make_tuple(recv_x, recv_w, cu, d.handle);
    });
}

// combine (apply_weights) and dispatch_backward (grad_recv_w given): both are the library's combine.
std::tuple<at::Tensor, at::Tensor> combine_impl(const char* op,
                                                const at::Tensor& y,
                                                const std::optional<at::Tensor>& recv_w_grad,
                                                const at::Tensor& topk_weights,
                                                const at::Tensor& plan,
                                                const at::Tensor& handle,
                                                int64_t buffer,
                                                bool apply_weights) {
    auto ctx = context(buffer);
    std::lock_guard lock(ctx->mutex());
    return translate([&] {
        const int R = ctx->cfg().R, K = ctx->cfg().K, H = ctx->H();
        const int64_t nvs = ctx->nvs();
        check_tensor(y, op, recv_w_grad ? "grad_recv_x" : "expert_out", at::kBFloat16, {R, nvs, H});
        if (recv_w_grad) check_tensor(*recv_w_grad, op, "grad_recv_w", at::kFloat, {R, nvs});
        std::vector<cpu::DispatchHandle>& hs = ctx->hold(plan, handle, topk_weights, op);
        const int64_t s_pad = topk_weights.size(1);
        at::Tensor out = at::zeros({R, s_pad, H}, at::kBFloat16);
        at::Tensor gw = at::zeros({R, s_pad, K}, at::kFloat);
        if (recv_w_grad) ctx->invalidate();  // the row weights are about to be replaced by their gradients
        cpu::run_ranks_or_throw(ctx->group(), [&](Team& t) {
            const int r = t.rank();
            const cpu::DispatchHandle& h = hs[r];
            const size_t sh = static_cast<size_t>(h.s) * H, sk = static_cast<size_t>(h.s) * K;
            std::span<const Bf16> yr{reinterpret_cast<const Bf16*>(y.data_ptr()) + r * nvs * H,
                                     static_cast<size_t>(nvs * H)};
            std::span<Bf16> outr{reinterpret_cast<Bf16*>(out.data_ptr()) + r * s_pad * H, sh};
            if (recv_w_grad) {
                std::span<const float> gr{recv_w_grad->data_ptr<float>() + r * nvs, static_cast<size_t>(nvs)};
                ctx->buffer(r).dispatch_backward(h, yr, gr, outr, {gw.data_ptr<float>() + r * s_pad * K, sk});
            } else {
                cpu::CombineArgs a;
                a.y = yr;
                a.apply_weights = apply_weights;
                a.out = outr;
                ctx->buffer(r).combine(h, a);
            }
        });
        return std::make_tuple(out, gw);
    });
}

at::Tensor combine_op(const at::Tensor& expert_out,
                      const at::Tensor& recv_w,
                      const at::Tensor& topk_weights,
                      const at::Tensor& plan,
                      const at::Tensor& handle,
                      int64_t buffer,
                      bool apply_weights) {
    auto ctx = context(buffer);
    check_tensor(recv_w, "combine", "recv_w", at::kFloat, {ctx->cfg().R, ctx->nvs()});
    return std::get<0>(
        combine_impl("combine", expert_out, std::nullopt, topk_weights, plan, handle, buffer, apply_weights));
}

std::tuple<at::Tensor, at::Tensor> dispatch_backward_op(const at::Tensor& grad_recv_x,
                                                        const at::Tensor& grad_recv_w,
                                                        const at::Tensor& topk_weights,
                                                        const at::Tensor& plan,
                                                        const at::Tensor& handle,
                                                        int64_t buffer) {
    return combine_impl("dispatch_backward", grad_recv_x, grad_recv_w, topk_weights, plan, handle, buffer, false);
}

// combine_backward(h, g) = dispatch of g with the plan reused (SPEC §4.3): [R, s, H] → [R, NvS, H].
at::Tensor combine_backward_op(const at::Tensor& grad_out,
                               const at::Tensor& topk_weights,
                               const at::Tensor& plan,
                               const at::Tensor& handle,
                               int64_t buffer) {
    auto ctx = context(buffer);
    std::lock_guard lock(ctx->mutex());
    return translate([&] {
        const int R = ctx->cfg().R, H = ctx->H();
        const int64_t s_pad = topk_weights.dim() == 3 ? topk_weights.size(1) : -1;
        check_tensor(grad_out, "combine_backward", "grad_out", at::kBFloat16, {R, s_pad, H});
        std::vector<cpu::DispatchHandle>& hs = ctx->dispatch(ctx->hold(plan, handle, topk_weights, "combine_backward"),
                                                             grad_out, plan, handle, topk_weights);
        at::Tensor rows = at::zeros({R, ctx->nvs(), H}, at::kBFloat16);
        for (int r = 0; r < R; ++r) copy_rows(rows, r, ctx->buffer(r).recv_x().data(), hs[r].plan.rows_used(r));
        return rows;
    });
}

// The backward of a weighted combine (out_t = sum over t's entries n of w_n * y_n) in one op: rows = combine_backward
// (grad_out), then per receive row n of the groups: grad_y_n = bf16(w_n * rows_n) and grad_w_n = <rows_n, y_n> (fp32,
// the order of evenep/detail/row_grad.hpp, bit for bit the CUDA op's); grad_w_n = 0 past the groups.
std::tuple<at::Tensor, at::Tensor> combine_backward_weighted_op(const at::Tensor& grad_out,
                                                                const at::Tensor& expert_out,
                                                                const at::Tensor& recv_w,
                                                                const at::Tensor& topk_weights,
                                                                const at::Tensor& plan,
                                                                const at::Tensor& handle,
                                                                int64_t buffer) {
    at::Tensor rows = combine_backward_op(grad_out, topk_weights, plan, handle, buffer);
    auto ctx = context(buffer);
    return translate([&] {
        const int R = ctx->cfg().R;
        check_tensor(expert_out, "combine_backward_weighted", "expert_out", at::kBFloat16, {R, ctx->nvs(), ctx->H()});
        check_tensor(recv_w, "combine_backward_weighted", "recv_w", at::kFloat, {R, ctx->nvs()});
        // Per row of the groups, the library's row backward (evenep/detail/row_grad.hpp: the CUDA op's order).
        const PlanRowLayout& L = ctx->plan_layout();
        const int64_t nvs = ctx->nvs(), H = ctx->H();
        at::Tensor grad_w = at::zeros({R, nvs}, at::kFloat);
        Bf16* g = reinterpret_cast<Bf16*>(rows.data_ptr());
        const Bf16* y = reinterpret_cast<const Bf16*>(expert_out.data_ptr());
        const float* w = recv_w.data_ptr<float>();
        for (int r = 0; r < R; ++r) {
            const int64_t used =
                std::clamp<int64_t>(plan.data_ptr<int32_t>()[r * L.width + L.cu_seqlens + L.G - 1], 0, nvs);
            for (int64_t n = r * nvs; n < r * nvs + used; ++n)
                grad_w.data_ptr<float>()[n] = detail::row_grad(g + n * H, y + n * H, w[n], g + n * H, H);
        }
        return std::make_tuple(rows, grad_w);
    });
}

// Calls fn(r, b, e) for every prefetch slot b of every rank r holding a copy of expert e (the plan's copies table),
// ranks ascending, slots ascending: the library's deterministic order.
template <typename F>
void for_each_copy(const Context& ctx, const at::Tensor& plan, const char* op, F&& fn) {
    const Config& c = ctx.cfg();
    const PlanRowLayout& L = ctx.plan_layout();
    check_tensor(plan, op, "plan", at::kInt, {c.R, L.width});
    for (int r = 0; r < c.R; ++r)
        for (int b = 0; b < L.B; ++b) {
            const int32_t e = plan.data_ptr<int32_t>()[r * L.width + L.copies + b];
            TORCH_CHECK_VALUE(e >= -1 && e < c.E, "evenep.", op, ": plan copies[", r, "][", b, "] = ", e);
            if (e >= 0) fn(r, b, e);
        }
}

// prefetch_weight: slots[r, b] = w[copies[r][b]] (zero where the slot is empty). w: [E, a, b] (the home weights of
// every expert, global order), slots: [R, B, a, b]. In-process ranks read every home directly.
at::Tensor prefetch_weight_op(const at::Tensor& w, const at::Tensor& plan, int64_t buffer) {
    auto ctx = context(buffer);
    return translate([&] {
        const Config& c = ctx->cfg();
        TORCH_CHECK_VALUE(w.dim() == 3 && w.size(0) == c.E, "evenep.prefetch_weight: weight has shape ", w.sizes(),
                          ", expected [E = ", c.E, ", in, out]");
        TORCH_CHECK_VALUE(w.device().is_cpu(), "evenep.prefetch_weight: weight is on ", w.device());
        at::Tensor slots = at::zeros({c.R, c.num_slots(), w.size(1), w.size(2)}, w.options());
        for_each_copy(*ctx, plan, "prefetch_weight", [&](int r, int b, int e) { slots[r][b].copy_(w[e]); });
        return slots;
    });
}

// reduce_grad: grad[e] = sum over ranks r ascending, slots b ascending with copies[r][b] = e of slot_grads[r, b]
// (fp32); experts without copies get 0.
at::Tensor reduce_grad_op(const at::Tensor& slot_grads, const at::Tensor& plan, int64_t buffer) {
    auto ctx = context(buffer);
    return translate([&] {
        const Config& c = ctx->cfg();
        TORCH_CHECK_VALUE(slot_grads.dim() == 4, "evenep.reduce_grad: slot_grads has shape ", slot_grads.sizes(),
                          ", expected [R, B, in, out]");
        check_tensor(slot_grads, "reduce_grad", "slot_grads", at::kFloat,
                     {c.R, c.num_slots(), slot_grads.size(2), slot_grads.size(3)});
        at::Tensor grad = at::zeros({c.E, slot_grads.size(2), slot_grads.size(3)}, at::kFloat);
        for_each_copy(*ctx, plan, "reduce_grad", [&](int r, int b, int e) { grad[e].add_(slot_grads[r][b]); });
        return grad;
    });
}

// reduce_grad_add_: grad[e] += each slot gradient of e's copies in turn (ranks then slots ascending) for every expert
// with copies, in place (fp32; the order of the CUDA op and of the library's expert pools: (g + s1) + s2); the other
// experts' rows are not touched.
void reduce_grad_add_op(at::Tensor& grad, const at::Tensor& slot_grads, const at::Tensor& plan, int64_t buffer) {
    auto ctx = context(buffer);
    translate([&] {
        const Config& c = ctx->cfg();
        TORCH_CHECK_VALUE(slot_grads.dim() == 4, "evenep.reduce_grad_add_: slot_grads has shape ", slot_grads.sizes(),
                          ", expected [R, B, in, out]");
        check_tensor(slot_grads, "reduce_grad_add_", "slot_grads", at::kFloat,
                     {c.R, c.num_slots(), slot_grads.size(2), slot_grads.size(3)});
        check_tensor(grad, "reduce_grad_add_", "grad", at::kFloat, {c.E, slot_grads.size(2), slot_grads.size(3)});
        for_each_copy(*ctx, plan, "reduce_grad_add_", [&](int r, int b, int e) { grad[e].add_(slot_grads[r][b]); });
        return 0;
    });
}

// fwd (transposed = false): out[r] = x[r] · W_g per group, x [R, NvS, a] → [R, NvS, b] fp32 (or bf16: out_dtype).
// dgrad (transposed = true): out[r] = x[r] · W_g^T, x [R, NvS, b] → [R, NvS, a]. Padding rows are 0.
// Weights are used as bf16 (fp32 weights are rounded to bf16 first, as stored in the library's pools).
at::Tensor grouped_gemm_impl(const char* op,
                             const at::Tensor& x,
                             const at::Tensor& w,
                             const at::Tensor& slots,
                             const at::Tensor& plan,
                             int64_t buffer,
                             std::optional<at::ScalarType> out_dtype,
                             bool transposed) {
    auto ctx = context(buffer);
    return translate([&] {
        const Config& c = ctx->cfg();
        const at::ScalarType dtype = gemm_out_dtype(out_dtype, op);
        check_gemm_weights(c, op, w, slots);
        check_tensor(plan, op, "plan", at::kInt, {c.R, ctx->plan_layout().width});
        const int64_t a = w.size(1), b = w.size(2), in = transposed ? b : a, out_dim = transposed ? a : b;
        check_tensor(x, op, "x", at::kBFloat16, {c.R, ctx->nvs(), in});
        at::Tensor wb = w.to(at::kBFloat16).contiguous(), sb = slots.to(at::kBFloat16).contiguous();
        at::Tensor out = at::zeros({c.R, ctx->nvs(), out_dim}, at::kFloat);
        const PlanRowLayout& L = ctx->plan_layout();
        for (int r = 0; r < c.R; ++r) {
            const int32_t* row = plan.data_ptr<int32_t>() + static_cast<int64_t>(r) * L.width;
            auto table = group_table<const Bf16>(*ctx, plan, r, reinterpret_cast<const Bf16*>(wb.data_ptr()),
                                                 reinterpret_cast<const Bf16*>(sb.data_ptr()), a * b);
            cpu::GroupedGemmShape shape{{row + L.cu_seqlens, static_cast<size_t>(L.G)},
                                        {row + L.group_count, static_cast<size_t>(L.G)},
                                        static_cast<int>(in),
                                        static_cast<int>(out_dim)};
            cpu::grouped_gemm(
                shape, table, transposed,
                {reinterpret_cast<const Bf16*>(x.data_ptr()) + r * ctx->nvs() * in,
                 static_cast<size_t>(ctx->nvs() * in)},
                {out.data_ptr<float>() + r * ctx->nvs() * out_dim, static_cast<size_t>(ctx->nvs() * out_dim)}, false);
        }
        return dtype == at::kFloat ? out : out.to(dtype);
    });
}

// wgrad: for every used row of every group, grad_W_g += x_row^T · dy_row (fp32), W_g the group's weight: the home
// expert's gradient [E, a, b] (local and peer groups) or the slot's gradient [R, B, a, b].
std::tuple<at::Tensor, at::Tensor> grouped_gemm_wgrad_op(const at::Tensor& x,
                                                         const at::Tensor& dy,
                                                         const at::Tensor& plan,
                                                         int64_t buffer) {
    auto ctx = context(buffer);
    return translate([&] {
        const Config& c = ctx->cfg();
        const PlanRowLayout& L = ctx->plan_layout();
        check_tensor(plan, "grouped_gemm_wgrad", "plan", at::kInt, {c.R, L.width});
        const int64_t a = x.dim() == 3 ? x.size(2) : -1, b = dy.dim() == 3 ? dy.size(2) : -1;
        check_tensor(x, "grouped_gemm_wgrad", "x", at::kBFloat16, {c.R, ctx->nvs(), a});
        check_tensor(dy, "grouped_gemm_wgrad", "dy", at::kBFloat16, {c.R, ctx->nvs(), b});
        at::Tensor gw = at::zeros({c.E, a, b}, at::kFloat);
        at::Tensor gs = at::zeros({c.R, L.B, a, b}, at::kFloat);
        for (int r = 0; r < c.R; ++r) {  // ranks in order: peer groups of one expert add up deterministically
            const int32_t* row = plan.data_ptr<int32_t>() + static_cast<int64_t>(r) * L.width;
            auto table = group_table<float>(*ctx, plan, r, gw.data_ptr<float>(), gs.data_ptr<float>(), a * b);
            cpu::GroupedGemmShape shape{{row + L.cu_seqlens, static_cast<size_t>(L.G)},
                                        {row + L.group_count, static_cast<size_t>(L.G)},
                                        static_cast<int>(a),
                                        static_cast<int>(b)};
            cpu::grouped_gemm_wgrad(
                shape,
                {reinterpret_cast<const Bf16*>(x.data_ptr()) + r * ctx->nvs() * a, static_cast<size_t>(ctx->nvs() * a)},
                {reinterpret_cast<const Bf16*>(dy.data_ptr()) + r * ctx->nvs() * b,
                 static_cast<size_t>(ctx->nvs() * b)},
                table);
        }
        return std::make_tuple(gw, gs);
    });
}

}  // namespace

std::shared_ptr<Context> context(int64_t id) {
    std::lock_guard lock(g_registry_mutex);
    auto it = g_registry.find(id);
    TORCH_CHECK_VALUE(it != g_registry.end(), "evenep: no buffer with id ", id, " (released or never created)");
    return it->second;
}

int64_t new_buffer_id() { return g_next_id++; }
void set_cuda_buffer_info_hook(BufferInfoHook hook) { g_cuda_info = hook; }

}  // namespace evenep::python

TORCH_LIBRARY(evenep, m) {
    using namespace evenep::python;
    m.def(
        "create_buffer(int num_ranks, int num_experts, int top_k, int max_tokens, int hidden, int ffn_hidden, "
        "int num_slots, int token_padding, str planner, str policy=\"auto\", float slack=-1., bool fp8=False, "
        "bool ue8m0=False, bool bf16_partials=False) -> int",
        &create_buffer);
    m.def("release_buffer(int buffer) -> ()", &release_buffer);
    m.def("buffer_info(int buffer) -> int[]", &buffer_info);
    m.def("plan_columns(int buffer) -> (str[] names, int[] offsets, int[] counts)", &plan_columns_op);
    m.def("plan(Tensor topk_idx, int buffer, int[]? num_tokens=None) -> Tensor");
    m.def(
        "dispatch(Tensor x, Tensor topk_idx, Tensor topk_weights, Tensor plan, int buffer, "
        "int[]? num_tokens=None) -> (Tensor recv_x, Tensor recv_w, Tensor cu_seqlens, Tensor handle)");
    m.def(
        "combine(Tensor expert_out, Tensor recv_w, Tensor topk_weights, Tensor plan, Tensor handle, int buffer, "
        "bool apply_weights=True) -> Tensor");
    m.def("combine_backward(Tensor grad_out, Tensor topk_weights, Tensor plan, Tensor handle, int buffer) -> Tensor");
    m.def(
        "dispatch_backward(Tensor grad_recv_x, Tensor grad_recv_w, Tensor topk_weights, Tensor plan, "
        "Tensor handle, int buffer) -> (Tensor grad_x, Tensor grad_topk_weights)");
    m.def("prefetch_weight(Tensor weight, Tensor plan, int buffer) -> Tensor");
    m.def("reduce_grad(Tensor slot_grads, Tensor plan, int buffer) -> Tensor");
    m.def("reduce_grad_add_(Tensor(a!) grad, Tensor slot_grads, Tensor plan, int buffer) -> ()");
    m.def(
        "combine_backward_weighted(Tensor grad_out, Tensor expert_out, Tensor recv_w, Tensor topk_weights, "
        "Tensor plan, Tensor handle, int buffer) -> (Tensor grad_expert_out, Tensor grad_recv_w)");
    m.def(
        "grouped_gemm(Tensor x, Tensor weight, Tensor slots, Tensor plan, int buffer, "
        "ScalarType? out_dtype=None) -> Tensor");
    m.def(
        "grouped_gemm_dgrad(Tensor dy, Tensor weight, Tensor slots, Tensor plan, int buffer, "
        "ScalarType? out_dtype=None) -> Tensor");
    m.def(
        "grouped_gemm_wgrad(Tensor x, Tensor dy, Tensor plan, int buffer) -> (Tensor grad_weight, "
        "Tensor grad_slots)");
}

TORCH_LIBRARY_IMPL(evenep, CPU, m) {
    using namespace evenep::python;
    m.impl("plan", &plan_op);
    m.impl("dispatch", &dispatch_op);
    m.impl("combine", &combine_op);
    m.impl("combine_backward", &combine_backward_op);
    m.impl("combine_backward_weighted", &combine_backward_weighted_op);
    m.impl("dispatch_backward", &dispatch_backward_op);
    m.impl("prefetch_weight", &prefetch_weight_op);
    m.impl("reduce_grad", &reduce_grad_op);
    m.impl("reduce_grad_add_", &reduce_grad_add_op);
    m.impl("grouped_gemm", &grouped_gemm_kernel<grouped_gemm_impl, false>);
    m.impl("grouped_gemm_dgrad", &grouped_gemm_kernel<grouped_gemm_impl, true>);
    m.impl("grouped_gemm_wgrad", &grouped_gemm_wgrad_op);
}
// CUDA kernels of the same schemas: TORCH_LIBRARY_IMPL(evenep, CUDA, m) in python/csrc/ops_cuda.cpp (built where
// nvcc and a CUDA torch exist); without it a CUDA tensor reaches no kernel and torch raises NotImplementedError.

// `import evenep._C` loads this library (the ops register at load time); the module itself is empty.
PyMODINIT_FUNC PyInit__C(void) {
    static PyModuleDef module = {PyModuleDef_HEAD_INIT,
                                 "_C",
                                 "EvenEP torch ops (torch.ops.evenep)",
                                 -1,
                                 nullptr,
                                 nullptr,
                                 nullptr,
                                 nullptr,
                                 nullptr};
    return PyModule_Create(&module);
}
