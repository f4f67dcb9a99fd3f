// python/csrc/ops_fp8.cpp — the FP8 ops of the torch binding (docs/fp8.md, docs/python.md "FP8"): the library's casts
// (cpu::quantize_rows_fp8, cpu::quantize_weight_fp8), the FP8 dispatch of a buffer created with fp8=True, and the
// block-scaled grouped GEMM reference (cpu::grouped_gemm_fp8). CPU kernels over evenep::cpu, registered as a
// TORCH_LIBRARY_FRAGMENT of the evenep library (python/csrc/ops.cpp); autograd and fake implementations in
// python/evenep/_ops.py and fp8.py. torch.float8_e4m3fn is the library's Fp8E4m3 byte for byte.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cmath>
#include <cstring>
#include <optional>
#include <span>
#include <tuple>
#include <utility>
#include <vector>

#include "context.hpp"
#include "evenep/cpu/grouped_gemm.hpp"
#include "fp8_args.hpp"

namespace evenep::python {
namespace {

template <typename T>
std::span<T> span_of(const at::Tensor& t) {
    return {reinterpret_cast<T*>(t.data_ptr()), static_cast<size_t>(t.numel())};
}

at::Tensor fp8_zeros(at::IntArrayRef sizes) { return at::zeros(sizes, at::kByte).view(at::kFloat8_e4m3fn); }

// quantize_fp8: x bf16 [..., D] (D a multiple of 128) -> e4m3 codes [..., D], fp32 scales [..., D/128] (one per
// 1x128 block): cpu::quantize_rows_fp8, the cast of the library's FP8 dispatch, bit for bit.
std::tuple<at::Tensor, at::Tensor> quantize_fp8_op(const at::Tensor& x, bool ue8m0) {
    return translate([&] {
        check_blocked(x, "quantize_fp8", "x", 1, at::kBFloat16);
        const int64_t D = x.size(-1), rows = x.numel() / D;
        at::Tensor codes = fp8_zeros(x.sizes());
        at::Tensor scales = at::zeros(scale_sizes(x, 1), at::kFloat);
        cpu::quantize_rows_fp8(span_of<const Bf16>(x), rows, D, ue8m0, span_of<Fp8E4m3>(codes), span_of<float>(scales));
        return std::make_tuple(codes, scales);
    });
}

// quantize_fp8_weight: w bf16 [..., in, out] (multiples of 128) -> codes [..., in, out], scales [..., in/128,
// out/128] (one per 128x128 block): cpu::quantize_weight_fp8 per matrix.
std::tuple<at::Tensor, at::Tensor> quantize_fp8_weight_op(const at::Tensor& w, bool ue8m0) {
    return translate([&] {
        check_blocked(w, "quantize_fp8_weight", "weight", 2, at::kBFloat16);
        const int64_t in = w.size(-2), out = w.size(-1), n = w.numel() / (in * out);
        at::Tensor codes = fp8_zeros(w.sizes());
        at::Tensor scales = at::zeros(scale_sizes(w, 2), at::kFloat);
        const int64_t sm = (in / kBlock) * (out / kBlock);
        for (int64_t i = 0; i < n; ++i)
            cpu::quantize_weight_fp8(reinterpret_cast<const Bf16*>(w.data_ptr()) + i * in * out, in, out, ue8m0,
                                     reinterpret_cast<Fp8E4m3*>(codes.data_ptr()) + i * in * out,
                                     scales.data_ptr<float>() + i * sm);
        return std::make_tuple(codes, scales);
    });
}

// Pre-quantised rows (DeepEP's (x_fp8, scales)): every scale of the first s_r tokens finite and > 0 (a power of
// two with ue8m0), no NaN code (0x7F / 0xFF).
void check_prequantised(const at::Tensor& x8, const at::Tensor& sc, const std::vector<int32_t>& s, bool ue8m0) {
    const int64_t R = x8.size(0), s_pad = x8.size(1), H = x8.size(2), spr = H / kBlock;
    const auto* q = reinterpret_cast<const uint8_t*>(x8.data_ptr());
    const float* f = sc.data_ptr<float>();
    for (int64_t r = 0; r < R; ++r)
        for (int64_t t = 0; t < s[r]; ++t) {
            const int64_t row = r * s_pad + t;
            for (int64_t b = 0; b < spr; ++b) {
                const float v = f[row * spr + b];
                const uint32_t bits = float_as_bits(v);
                TORCH_CHECK_VALUE(
                    std::isfinite(v) && v > 0 && (!ue8m0 || (bits & 0x7FFFFFu) == 0), "evenep.dispatch: scales[", r,
                    ", ", t, ", ", b, "] = ", v, " is not ",
                    ue8m0 ? "a positive finite power of two (the buffer has ue8m0=True)" : "positive and finite");
            }
            for (int64_t c = 0; c < H; ++c)
                TORCH_CHECK_VALUE((q[row * H + c] & 0x7F) != kE4m3NanBits, "evenep.dispatch: x_fp8[", r, ", ", t, ", ",
                                  c, "] is NaN (e4m3 code ", static_cast<int>(q[row * H + c]), ")");
        }
}

// dispatch_fp8: the dispatch of a buffer created with fp8=True. x bf16 [R, s, H] with x_scales None: the library's
// FP8 dispatch (each token quantised once at the source, Context::dispatch_fp8). x float8_e4m3fn [R, s, H] with
// x_scales fp32 [R, s, H/128]: rows quantised by the caller, moved as they are (the plan-reusing dispatch of the
// library moves each row's H code bytes and H/128 scales, packed into the 2H bytes of a bf16 row, with the same
// dedup, chains and padding rule; nothing is requantised). Returns recv_x8 [R, NvS, H] e4m3, recv_scales
// [R, NvS, H/128] fp32 (padding rows codes +0, scale 0; rows past the groups 0), recv_w, cu_seqlens, handle.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> dispatch_fp8_op(
    const at::Tensor& x,
    const std::optional<at::Tensor>& x_scales,
    const at::Tensor& topk_idx,
    const at::Tensor& topk_weights,
    const at::Tensor& plan,
    int64_t buffer,
    std::optional<at::IntArrayRef> num_tokens) {
    auto ctx = context(buffer);
    std::lock_guard lock(ctx->mutex());
    return translate([&] {
        const BufferConfig& bc = ctx->buffer_config();
        TORCH_CHECK_VALUE(bc.precision.fp8, "evenep.dispatch_fp8: buffer ", buffer,
                          " was created without fp8=True (its rows are bf16: use dispatch)");
        const int R = ctx->cfg().R, H = ctx->H();
        const int64_t s_pad = x.dim() == 3 ? x.size(1) : -1, spr = H / kBlock;
        const bool pre = x_scales.has_value();
        check_tensor(x, "dispatch", pre ? "x_fp8" : "x", pre ? at::kFloat8_e4m3fn : at::kBFloat16, {R, s_pad, H});
        if (pre) check_tensor(*x_scales, "dispatch", "scales", at::kFloat, {R, s_pad, spr});
        DispatchSetup d = dispatch_setup(*ctx, topk_idx, topk_weights, plan, s_pad, num_tokens);
        const int64_t nvs = ctx->nvs();
        at::Tensor recv_x8 = fp8_zeros({R, nvs, H});
        at::Tensor recv_sc = at::zeros({R, nvs, spr}, at::kFloat);
        if (pre) {
            check_prequantised(x, *x_scales, d.s, bc.precision.ue8m0);
            at::Tensor packed = at::zeros({R, s_pad, H}, at::kBFloat16);  // per row: H code bytes, then the scales
            auto* dst = static_cast<char*>(packed.data_ptr());
            for (int64_t row = 0; row < R * s_pad; ++row) {
                std::memcpy(dst + row * 2 * H, static_cast<const char*>(x.data_ptr()) + row * H,
                            static_cast<size_t>(H));
                std::memcpy(dst + row * 2 * H + H, x_scales->data_ptr<float>() + row * spr,
                            static_cast<size_t>(spr) * 4);
            }
            ctx->dispatch(std::move(d.hs), packed, plan, d.handle, topk_weights);
        } else {
            ctx->dispatch_fp8(d.hs, x, d.idx, plan, d.handle, topk_weights);
        }
        ctx->record_handle(d.handle, plan);
        for (int r = 0; r < R; ++r) {
            cpu::Buffer& b = ctx->buffer(r);
            const int64_t rows = d.plan->rows_used(r);
            auto* q = static_cast<char*>(recv_x8.data_ptr()) + r * nvs * H;
            float* sc = recv_sc.data_ptr<float>() + r * nvs * spr;
            if (pre) {
                const auto* src = reinterpret_cast<const char*>(b.recv_x().data());
                for (int64_t row = 0; row < rows; ++row) {
                    std::memcpy(q + row * H, src + row * 2 * H, static_cast<size_t>(H));
                    std::memcpy(sc + row * spr, src + row * 2 * H + H, static_cast<size_t>(spr) * 4);
                }
            } else {
                std::memcpy(q, b.recv_x8().data(), static_cast<size_t>(rows * H));
                std::memcpy(sc, b.recv_scale().data(), static_cast<size_t>(rows * spr * 4));
            }
        }
        auto [recv_w, cu] = dispatch_weights(*ctx, *d.plan);
        return std::make_tuple(recv_x8, recv_sc, recv_w, cu, d.handle);
    });
}

// grouped_gemm_fp8: per receive-buffer group, out = x · W_g (transposed: x · W_g^T) in the block-scaled order of
// cpu::grouped_gemm_fp8. x e4m3 [R, NvS, in] with x_scales [R, NvS, in/128]; weight e4m3 [E, a, b] with
// weight_scales [E, a/128, b/128]; slots [R, B, a, b] with slot_scales [R, B, a/128, b/128] (the copies, e.g.
// prefetch_weight of the codes and of the scales). Out fp32 [R, NvS, out] (or out_dtype bf16); padding rows 0.
at::Tensor grouped_gemm_fp8_op(const at::Tensor& x,
                               const at::Tensor& x_scales,
                               const at::Tensor& weight,
                               const at::Tensor& weight_scales,
                               const at::Tensor& slots,
                               const at::Tensor& slot_scales,
                               const at::Tensor& plan,
                               int64_t buffer,
                               bool transposed,
                               std::optional<at::ScalarType> out_dtype) {
    auto ctx = context(buffer);
    return translate([&] {
        const char* op = "grouped_gemm_fp8";
        const Config& c = ctx->cfg();
        const at::ScalarType dtype = gemm_out_dtype(out_dtype, op);
        check_gemm_weights(c, op, weight, slots);
        TORCH_CHECK_VALUE(weight.scalar_type() == at::kFloat8_e4m3fn, "evenep.", op, ": weight has dtype ",
                          weight.scalar_type(), ", expected Float8_e4m3fn (quantize_fp8_weight)");
        check_blocked(weight, op, "weight", 2);
        const int64_t a = weight.size(1), b = weight.size(2), in = transposed ? b : a, out_dim = transposed ? a : b;
        check_tensor(weight_scales, op, "weight_scales", at::kFloat, {c.E, a / kBlock, b / kBlock});
        check_tensor(slot_scales, op, "slot_scales", at::kFloat, {c.R, c.num_slots(), a / kBlock, b / kBlock});
        check_tensor(plan, op, "plan", at::kInt, {c.R, ctx->plan_layout().width});
        const int64_t nvs = ctx->nvs();
        check_tensor(x, op, "x", at::kFloat8_e4m3fn, {c.R, nvs, in});
        check_tensor(x_scales, op, "x_scales", at::kFloat, {c.R, nvs, in / kBlock});
        at::Tensor out = at::zeros({c.R, nvs, out_dim}, at::kFloat);
        const PlanRowLayout& L = ctx->plan_layout();
        const int64_t mat = a * b, smat = (a / kBlock) * (b / kBlock);
        for (int r = 0; r < c.R; ++r) {
            const int32_t* row = plan.data_ptr<int32_t>() + static_cast<int64_t>(r) * L.width;
            auto codes = group_table<const Fp8E4m3>(*ctx, plan, r, span_of<const Fp8E4m3>(weight).data(),
                                                    span_of<const Fp8E4m3>(slots).data(), mat);
            auto scales = group_table<const float>(*ctx, plan, r, weight_scales.data_ptr<float>(),
                                                   slot_scales.data_ptr<float>(), smat);
            std::vector<cpu::Fp8Weight> table(L.G);
            for (int g = 0; g < L.G; ++g) table[g] = {codes[g], scales[g]};
            cpu::GroupedGemmShape shape{{row + L.cu_seqlens, static_cast<size_t>(L.G)},
                                        {row + L.group_count, static_cast<size_t>(L.G)},
                                        static_cast<int>(in),
                                        static_cast<int>(out_dim)};
            const auto part = [r](int64_t n) { return std::pair{static_cast<size_t>(r * n), static_cast<size_t>(n)}; };
            const auto [xo, xn] = part(nvs * in);
            const auto [so, sn] = part(nvs * (in / kBlock));
            const auto [oo, on] = part(nvs * out_dim);
            cpu::grouped_gemm_fp8(shape, table, transposed, span_of<const Fp8E4m3>(x).subspan(xo, xn),
                                  span_of<const float>(x_scales).subspan(so, sn), span_of<float>(out).subspan(oo, on),
                                  false);
        }
        return dtype == at::kFloat ? out : out.to(dtype);
    });
}

}  // namespace
}  // namespace evenep::python

TORCH_LIBRARY_FRAGMENT(evenep, m) {
    m.def("quantize_fp8(Tensor x, bool ue8m0=False) -> (Tensor codes, Tensor scales)");
    m.def("quantize_fp8_weight(Tensor weight, bool ue8m0=False) -> (Tensor codes, Tensor scales)");
    m.def(
        "dispatch_fp8(Tensor x, Tensor? x_scales, Tensor topk_idx, Tensor topk_weights, Tensor plan, int buffer, "
        "int[]? num_tokens=None) -> (Tensor recv_x, Tensor recv_scales, Tensor recv_w, Tensor cu_seqlens, "
        "Tensor handle)");
    m.def(
        "grouped_gemm_fp8(Tensor x, Tensor x_scales, Tensor weight, Tensor weight_scales, Tensor slots, "
        "Tensor slot_scales, Tensor plan, int buffer, bool transposed=False, ScalarType? out_dtype=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(evenep, CPU, m) {
    using namespace evenep::python;
    m.impl("quantize_fp8", &quantize_fp8_op);
    m.impl("quantize_fp8_weight", &quantize_fp8_weight_op);
    m.impl("dispatch_fp8", &dispatch_fp8_op);
    m.impl("grouped_gemm_fp8", &grouped_gemm_fp8_op);
}
