// python/csrc/ops_fp8_cuda.cpp — the CUDA kernels of the FP8 ops (ops_fp8.cpp has their schemas and CPU kernels;
// docs/python.md "FP8"): the casts are the library's launch_fp8_cast_rows / launch_fp8_cast_weights
// (evenep/cuda/fp8_cast.hpp: bit for bit cpu::quantize_rows_fp8 / cpu::quantize_weight_fp8), the dispatch is
// cuda::Ep's FP8 dispatch (EpOptions::precision from the buffer's fp8 / ue8m0) writing the op's own tensors
// (RankIo::rows8 / row_scales), from bf16 rows it quantises once per token or from the caller's codes and scales
// (RankIo::x8 / x_scales, moved as given), and the block-scaled grouped GEMM is the library's CUTLASS
// cuda::grouped_gemm_fp8 (NotImplementedError in a build or on a device without it). Virtual ranks only
// (evenep.Buffer refuses fp8 with group=).
//
// The casts check their input for NaN/Inf as the CPU kernels do: the kernels raise a device flag, read back after
// the launch (one 4-byte copy, a synchronisation of the stream) and reported with the first non-finite element;
// inside a CUDA-graph capture nothing is read back (a non-finite block's codes are then undefined). The dispatch
// never synchronises: the device records bad rows (DeviceErrorKind::kNonFiniteInput / kBadFp8Input) and the next op
// of the buffer (or Buffer.check()) raises them. Nor does the GEMM.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda_context.hpp"
#include "evenep/cuda/check.hpp"
#include "evenep/cuda/fp8_cast.hpp"
#include "evenep/cuda/fp8_transpose.hpp"
#include "evenep/cuda/grouped_gemm.hpp"
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
        if (ctx.multi_process()) {  // group=: the rows arrived in this rank's window; copied out as the bf16 op's
            const int r = ctx.rank_begin();
            EVENEP_CUDA_CHECK(cudaMemcpyAsync(recv_x8.data_ptr(), ctx.ep().recv_x8(r), recv_x8.nbytes(),
                                              cudaMemcpyDeviceToDevice, sc.stream));
            EVENEP_CUDA_CHECK(cudaMemcpyAsync(recv_sc.data_ptr(), ctx.ep().recv_scale(r), recv_sc.nbytes(),
                                              cudaMemcpyDeviceToDevice, sc.stream));
        }
        auto [recv_w, cu, handle] = dispatch_results(sc, plan, s_pad, nullptr);
        return std::make_tuple(recv_x8, recv_sc, recv_w, cu, handle);
    });
}

// grouped_gemm_fp8 of a CUDA buffer created with fp8=True: the library's cuda::grouped_gemm_fp8 (CUTLASS, block-scaled:
// 1 x 128 activation and 128 x 128 weight scales, fp32 accumulation promoted per 128-deep k-block, bf16 epilogue),
// one launch over the groups of every rank. The tables are the bf16 op's (group_table, cuda_context.hpp): the codes
// and the scales of each group's home expert or prefetched slot. transposed (out = x · W_g^T, x [R, NvS, b]) is the
// library's dgrad, which reads W_g [a][b] as stored. The forward (out = x · W_g, x [R, NvS, a]) reads W_g^T [b][a]
// (fp8 wgmma takes K-major operands only): the groups with rows are first transposed into per-call scratch
// (cuda::launch_fp8_transpose_groups: one copy per group, 2ab bytes moved each). The scales go as they are to both.
// Output: bf16 from the epilogue; fp32 (out_dtype None, the CPU op's default) is that bf16 widened, so it matches the
// CPU op's fp32 sums within the GEMM's tolerance (the bf16 rounding of the output included: 2^-7 |ref| + 2^-9
// sum |terms|, tests/cuda/grouped_gemm_fp8_test.cu). Every row of a group is computed, padding rows included (0 for
// the dispatch's zero rows); rows past the groups are not written (unwritten_zero: 0). No host synchronisation.
at::Tensor grouped_gemm_fp8_cuda(const at::Tensor& x,
                                 const at::Tensor& x_scales,
                                 const at::Tensor& weight,
                                 const at::Tensor& weight_scales,
                                 const at::Tensor& slots,
                                 const at::Tensor& slot_scales,
                                 const at::Tensor& plan,
                                 int64_t buffer,
                                 bool transposed,
                                 std::optional<at::ScalarType> out_dtype) {
    return translate([&] {
        const char* op = "grouped_gemm_fp8";
        OpScope sc(buffer, op);
        const CudaContext& ctx = *sc.ctx;
        TORCH_CHECK_NOT_IMPLEMENTED(cuda::grouped_gemm_has_cutlass(),
                                    "evenep.grouped_gemm_fp8: the CUDA kernel is the library's CUTLASS FP8 grouped "
                                    "GEMM (cuda::grouped_gemm_fp8), which needs a build with EVENEP_CUTLASS=ON "
                                    "(CUTLASS headers, CMAKE_CUDA_ARCHITECTURES with 90a) and a compute capability "
                                    "9.0 device (H100/H200); this build or device has none (the CPU backend has the "
                                    "FP8 GEMM)");
        const PlanRowLayout& L = ctx.plan_layout();
        const at::ScalarType dtype = gemm_out_dtype(out_dtype, op);
        TORCH_CHECK_VALUE(weight.scalar_type() == at::kFloat8_e4m3fn, "evenep.", op, ": weight has dtype ",
                          weight.scalar_type(), ", expected Float8_e4m3fn (quantize_fp8_weight)");
        check_home(ctx, weight, op, "weight", at::kFloat8_e4m3fn);  // [E, a, b]; group=: this rank's [E/R, a, b]
        check_blocked(weight, op, "weight", 2);
        const int64_t a = weight.size(1), b = weight.size(2), in = transposed ? b : a, out_dim = transposed ? a : b;
        check_cuda(ctx, slots, op, "slots", at::kFloat8_e4m3fn, {ctx.L(), L.B, a, b});
        check_cuda(ctx, weight_scales, op, "weight_scales", at::kFloat, {ctx.num_home(), a / kBlock, b / kBlock});
        check_cuda(ctx, slot_scales, op, "slot_scales", at::kFloat, {ctx.L(), L.B, a / kBlock, b / kBlock});
        check_cuda(ctx, plan, op, "plan", at::kInt, {ctx.L(), L.width});
        const int64_t nvs = ctx.nvs();
        check_cuda(ctx, x, op, "x", at::kFloat8_e4m3fn, {ctx.L(), nvs, in});
        check_cuda(ctx, x_scales, op, "x_scales", at::kFloat, {ctx.L(), nvs, in / kBlock});
        // The GEMM skips a group whose weight is not 16-byte aligned (TMA): refused here instead (a view at an
        // unaligned offset), with x for the same reason.
        for (const auto& [t, name] : {std::pair{&x, "x"}, std::pair{&weight, "weight"}, std::pair{&slots, "slots"}})
            TORCH_CHECK_VALUE(reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 == 0, "evenep.", op, ": ", name,
                              " is not 16-byte aligned (a view at storage offset ", t->storage_offset(), ")");
        const int groups = ctx.L() * (L.G + 1);
        const int64_t mat = a * b, smat = (a / kBlock) * (b / kBlock);
        constexpr int kCodes = 0, kScales = 1, kTransposed = 2;  // the scratch's tables
        GemmScratch scratch(ctx, groups, 1, transposed ? 2 : 3, transposed ? 0 : static_cast<size_t>(groups * mat));
        group_table(ctx, plan, weight, slots, mat, scratch.table(kCodes), scratch.cu(), sc.stream);
        group_table(ctx, plan, weight_scales, slot_scales, smat * 4, scratch.table(kScales), nullptr, sc.stream);
        if (!transposed) {
            cuda::Fp8GroupTranspose t;
            t.weights = scratch.table_as<const uint8_t>(0, kCodes);
            t.cu_seqlens = scratch.cu();
            t.num_groups = groups;
            t.in_dim = static_cast<int>(a);
            t.out_dim = static_cast<int>(b);
            t.transposed = static_cast<uint8_t*>(scratch.extra());
            t.transposed_table = reinterpret_cast<const uint8_t**>(scratch.table(kTransposed));
            cuda::launch_fp8_transpose_groups(t, sc.stream);
        }
        at::Tensor y = output(ctx, {ctx.L(), nvs, out_dim}, at::kBFloat16);
        cuda::GroupedGemmFp8Args g;
        g.x = ptr<const uint8_t>(x);
        g.x_scales = ptr<const float>(x_scales);
        g.cu_seqlens = scratch.cu();
        g.weights = scratch.table_as<const uint8_t>(0, transposed ? kCodes : kTransposed);
        g.weight_scales = scratch.table_as<const float>(0, kScales);
        g.y = ptr<uint16_t>(y);
        g.num_groups = groups;
        g.in_dim = static_cast<int>(a);
        g.out_dim = static_cast<int>(b);
        g.op = transposed ? cuda::GemmOp::kDgrad : cuda::GemmOp::kForward;
        g.schedule = cuda::GemmSchedule::kLoadAware;
        g.block_scaled = true;
        g.workspace = scratch.workspace(0);
        g.rows_capacity = ctx.L() * nvs;
        cuda::grouped_gemm_fp8(g, sc.stream);
        return dtype == at::kBFloat16 ? y : y.to(dtype);
    });
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
