// python/csrc/ops_fp8_cuda.cpp — the CUDA kernels of the FP8 ops (ops_fp8.cpp has their schemas and CPU kernels;
// docs/python.md "FP8"): the casts are the library's launch_fp8_cast_rows / launch_fp8_cast_weights
// (evenep/cuda/fp8_cast.hpp: bit for bit cpu::quantize_rows_fp8 / cpu::quantize_weight_fp8), the dispatch is
// cuda::Ep's FP8 dispatch (EpOptions::precision from the buffer's fp8 / ue8m0) writing the op's own tensors
// (RankIo::rows8 / row_scales), from bf16 rows it quantises once per token or from the caller's codes and scales
// (RankIo::x8 / x_scales, moved as given). Virtual ranks only (evenep.Buffer refuses fp8 with group=).
//
// The casts check their input for NaN/Inf as the CPU kernels do: the kernels raise a device flag, read back after
// the launch (one 4-byte copy, a synchronisation of the stream) and reported with the first non-finite element;
// inside a CUDA-graph capture nothing is read back (a non-finite block's codes are then undefined). The dispatch
// never synchronises: the device records bad rows (DeviceErrorKind::kNonFiniteInput / kBadFp8Input) and the next op
// of the buffer (or Buffer.check()) raises them.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <optional>
#include <tuple>
#include <vector>

#include "cuda_context.hpp"
#include "evenep/cuda/check.hpp"
#include "evenep/cuda/fp8_cast.hpp"
#include "fp8_args.hpp"

namespace evenep::python {
namespace {

// The current torch stream of t's device (the casts run on it).
cudaStream_t stream_of(const at::Tensor& t) { return c10::cuda::getCurrentCUDAStream(t.device().index()).stream(); }

// Raises when the cast's device flag is set: names the first non-finite element of x (outside graph capture).
void check_finite_cast(const at::Tensor& flag, const at::Tensor& x, const char* op, const char* name) {
    if (stream_capturing(stream_of(x)) || flag.item<int32_t>() == 0) return;
    const at::Tensor bad = at::nonzero(at::logical_not(at::isfinite(x.reshape({-1})))).cpu();
    const int64_t i = bad.numel() > 0 ? bad[0][0].item<int64_t>() : -1;
    std::vector<int64_t> at_index(static_cast<size_t>(x.dim()), 0);
    for (int64_t d = x.dim() - 1, rest = i; d >= 0 && i >= 0; --d) {
        at_index[static_cast<size_t>(d)] = rest % x.size(d);
        rest /= x.size(d);
    }
    TORCH_CHECK_VALUE(false, "evenep.", op, ": ", name, at::IntArrayRef(at_index), " = ",
                      i >= 0 ? x.reshape({-1})[i].item<float>() : 0.0f,
                      " is not finite; the FP8 cast scales each block by its amax");
}

std::tuple<at::Tensor, at::Tensor> quantize_fp8_cuda(const at::Tensor& x, bool ue8m0) {
    return translate([&] {
        check_blocked(x, "quantize_fp8", "x", 1, at::kBFloat16, x.device());
        const c10::cuda::CUDAGuard guard(x.device());
        const int64_t D = x.size(-1), rows = x.numel() / D;
        at::Tensor codes = at::empty(x.sizes(), x.options().dtype(at::kFloat8_e4m3fn));
        at::Tensor scales = at::empty(scale_sizes(x, 1), x.options().dtype(at::kFloat));
        at::Tensor flag = at::zeros({1}, x.options().dtype(at::kInt));
        cuda::launch_fp8_cast_rows(ptr<const Bf16>(x), rows, static_cast<int>(D), ue8m0, ptr<Fp8E4m3>(codes),
                                   ptr<float>(scales), ptr<uint32_t>(flag), stream_of(x));
        check_finite_cast(flag, x, "quantize_fp8", "x");
        return std::make_tuple(codes, scales);
    });
}

std::tuple<at::Tensor, at::Tensor> quantize_fp8_weight_cuda(const at::Tensor& w, bool ue8m0) {
    return translate([&] {
        check_blocked(w, "quantize_fp8_weight", "weight", 2, at::kBFloat16, w.device());
        const c10::cuda::CUDAGuard guard(w.device());
        const int64_t in = w.size(-2), out = w.size(-1), n = w.numel() / (in * out);
        at::Tensor codes = at::empty(w.sizes(), w.options().dtype(at::kFloat8_e4m3fn));
        at::Tensor scales = at::empty(scale_sizes(w, 2), w.options().dtype(at::kFloat));
        at::Tensor flag = at::zeros({1}, w.options().dtype(at::kInt));
        TORCH_CHECK_VALUE(n <= INT32_MAX, "evenep.quantize_fp8_weight: ", n, " matrices do not fit in int32");
        cuda::Fp8WeightCast c;
        c.w = ptr<const Bf16>(w);
        c.w_stride = in * out;
        c.count = static_cast<int>(n);
        c.in = static_cast<int>(in);
        c.out = static_cast<int>(out);
        c.ue8m0 = ue8m0;
        c.codes = ptr<Fp8E4m3>(codes);
        c.codes_stride = in * out;
        c.scales = ptr<float>(scales);
        c.scale_stride = (in / kBlock) * (out / kBlock);
        c.nonfinite = ptr<uint32_t>(flag);
        cuda::launch_fp8_cast_weights(c, stream_of(w));
        check_finite_cast(flag, w, "quantize_fp8_weight", "weight");
        return std::make_tuple(codes, scales);
    });
}

// dispatch_fp8 of a CUDA buffer created with fp8=True: the same results as the CPU kernel (ops_fp8.cpp), bit for
// bit on the rows before the plan's last group end; rows past it are left as torch.empty leaves them (zero under
// unwritten_zero), as the bf16 dispatch's.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> dispatch_fp8_cuda(
    const at::Tensor& x,
    const std::optional<at::Tensor>& x_scales,
    const at::Tensor& topk_idx,
    const at::Tensor& topk_weights,
    const at::Tensor& plan,
    int64_t buffer,
    std::optional<at::IntArrayRef> num_tokens) {
    return translate([&] {
        OpScope sc(buffer, "dispatch");
        CudaContext& ctx = *sc.ctx;
        TORCH_CHECK_VALUE(ctx.buffer_config().precision.fp8, "evenep.dispatch_fp8: buffer ", buffer,
                          " was created without fp8=True (its rows are bf16: use dispatch)");
        TORCH_CHECK(!ctx.multi_process(), "evenep.dispatch_fp8: FP8 buffers with group= are not supported");
        const int R = ctx.L(), K = ctx.cfg().K, H = ctx.H();
        const int64_t s_pad = x.dim() == 3 ? x.size(1) : -1, nvs = ctx.nvs(), spr = H / kBlock;
        const bool pre = x_scales.has_value();
        check_cuda(ctx, x, "dispatch", pre ? "x_fp8" : "x", pre ? at::kFloat8_e4m3fn : at::kBFloat16, {R, s_pad, H});
        if (pre) check_cuda(ctx, *x_scales, "dispatch", "scales", at::kFloat, {R, s_pad, spr});
        const cuda::EpPlan p = dispatch_plan(sc, topk_idx, topk_weights, plan, s_pad, num_tokens);
        at::Tensor recv_x8 = output(ctx, {R, nvs, H}, at::kFloat8_e4m3fn);
        at::Tensor recv_sc = output(ctx, {R, nvs, spr}, at::kFloat);
        std::vector<cuda::RankIo> io(R);
        for (int r = 0; r < R; ++r) {
            if (pre) {
                io[r].x8 = ptr<const uint8_t>(x) + r * s_pad * H;
                io[r].x_scales = ptr<const float>(*x_scales) + r * s_pad * spr;
            } else {
                io[r].x = ptr<const uint16_t>(x) + r * s_pad * H;
            }
            io[r].topk_w = ptr<const float>(topk_weights) + r * s_pad * K;
            io[r].rows8 = rows_of<uint8_t>(ctx, recv_x8, r, H);
            io[r].row_scales = rows_of<float>(ctx, recv_sc, r, spr);
        }
        ctx.ep().dispatch(p, io, sc.stream);
        auto [recv_w, cu, handle] = dispatch_results(sc, plan, s_pad, nullptr);
        return std::make_tuple(recv_x8, recv_sc, recv_w, cu, handle);
    });
}

// No block-scaled grouped GEMM op on CUDA yet (the library's cuda::grouped_gemm_fp8 needs W^T group tables the
// binding does not build): refused by name rather than by the dispatcher's "no CUDA kernel".
at::Tensor grouped_gemm_fp8_cuda(const at::Tensor&,
                                 const at::Tensor&,
                                 const at::Tensor&,
                                 const at::Tensor&,
                                 const at::Tensor&,
                                 const at::Tensor&,
                                 const at::Tensor&,
                                 int64_t,
                                 bool,
                                 std::optional<at::ScalarType>) {
    TORCH_CHECK_NOT_IMPLEMENTED(false,
                                "evenep.grouped_gemm_fp8: no CUDA kernel in this package yet (the FP8 expert GEMM "
                                "runs on the CPU backend; on CUDA, FP8 buffers dispatch and combine only)");
    return {};
}

}  // namespace
}  // namespace evenep::python

TORCH_LIBRARY_IMPL(evenep, CUDA, m) {
    using namespace evenep::python;
    m.impl("quantize_fp8", &quantize_fp8_cuda);
    m.impl("quantize_fp8_weight", &quantize_fp8_weight_cuda);
    m.impl("dispatch_fp8", &dispatch_fp8_cuda);
    m.impl("grouped_gemm_fp8", &grouped_gemm_fp8_cuda);
}
