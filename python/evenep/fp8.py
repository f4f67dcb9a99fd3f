"""evenep.fp8: the FP8 data path of the package (docs/fp8.md, docs/python.md "FP8").

The casts are the library's (torch.ops.evenep.quantize_fp8 / quantize_fp8_weight call cpu::quantize_rows_fp8 /
cpu::quantize_weight_fp8, the functions of the library's FP8 dispatch and weight prefetch): e4m3 "FN" codes
(torch.float8_e4m3fn, byte for byte the library's Fp8E4m3) and one fp32 scale per 1x128 block of a row (activations)
or per 128x128 block of an [in, out] matrix (weights); s = max(amax / 448, 2^-126), a power of two with ue8m0;
q = e4m3(x / s) round-to-nearest-even, saturating. dequantize is float(q) * s in fp32 (exact with ue8m0).

Ops (CPU kernels in python/csrc/ops_fp8.cpp, CUDA kernels in ops_fp8_cuda.cpp; the shapes write R for the served
ranks L as in _ops.py):

  quantize_fp8(x [..., D] bf16, ue8m0=False) -> codes [..., D] e4m3, scales [..., D/128] f32
  quantize_fp8_weight(weight [..., a, b] bf16, ue8m0=False) -> codes [..., a, b] e4m3, scales [..., a/128, b/128] f32
  dispatch_fp8(x, x_scales, topk_idx, topk_weights, plan, buffer, num_tokens=None)
      x bf16 [R,s,H] with x_scales None (the library's FP8 dispatch quantises each token once at the source), or
      x e4m3 [R,s,H] with x_scales f32 [R,s,H/128] (moved as given)
      -> recv_x e4m3 [R,NvS,H], recv_scales f32 [R,NvS,H/128], recv_w [R,NvS] f32, cu_seqlens [R,G], handle [R,s*K]
  grouped_gemm_fp8(x e4m3 [R,NvS,in], x_scales [R,NvS,in/128], weight e4m3 [E,a,b], weight_scales [E,a/128,b/128],
      slots [R,B,a,b], slot_scales [R,B,a/128,b/128], plan, buffer, transposed=False, out_dtype=None)
      -> [R,NvS,out] f32 (or bf16): cpu::grouped_gemm_fp8 (per-128-K partials promoted to fp32 and scaled); on CUDA
      the library's CUTLASS block-scaled GEMM (cuda::grouped_gemm_fp8, bf16 epilogue: f32 is its bf16 widened;
      NotImplementedError in a build without EVENEP_CUTLASS or off compute capability 9.0)
"""

from __future__ import annotations

import torch

from . import _ops
from ._ops import _bf16, info, ops

E4M3 = torch.float8_e4m3fn
BLOCK = 128


def quantize(x: torch.Tensor, ue8m0: bool = False):
    """bf16 [..., D] (D a multiple of 128) -> (codes float8_e4m3fn [..., D], scales fp32 [..., D/128]), the library's
    1x128 cast bit for bit (other float dtypes are rounded to bf16 first, as the dispatch sends bf16 rows). A
    non-finite value is refused (ValueError naming row and column)."""
    if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point:
        raise TypeError(f"evenep.fp8.quantize: x must be a floating-point tensor, got {_what(x)}")
    return ops.quantize_fp8(_bf16(x), bool(ue8m0))


def quantize_weight(w: torch.Tensor, ue8m0: bool = False):
    """bf16 [..., in, out] (multiples of 128) -> (codes [..., in, out], scales fp32 [..., in/128, out/128]): the
    library's 128x128 weight cast (fp32 master weights are rounded to bf16 first, as the library stores them)."""
    if not isinstance(w, torch.Tensor) or not w.dtype.is_floating_point:
        raise TypeError(f"evenep.fp8.quantize_weight: w must be a floating-point tensor, got {_what(w)}")
    return ops.quantize_fp8_weight(_bf16(w), bool(ue8m0))


def dequantize(codes: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """float(q) * s per 1x128 block (fp32, as the library's fp8_dequantize), then cast to dtype: with bf16 the
    operand the library's bf16 wgrad sees (bf16(float(q) * s))."""
    if codes.dtype != E4M3:
        raise ValueError(f"evenep.fp8.dequantize: codes has dtype {codes.dtype}, expected torch.float8_e4m3fn")
    D = codes.shape[-1]
    if D % BLOCK or scales.shape != (*codes.shape[:-1], D // BLOCK) or scales.dtype != torch.float32:
        raise ValueError(f"evenep.fp8.dequantize: scales {tuple(scales.shape)} {scales.dtype} do not match codes "
                         f"{tuple(codes.shape)} (expected fp32 [..., {D}/128])")
    out = codes.float().unflatten(-1, (D // BLOCK, BLOCK)) * scales.unsqueeze(-1)
    return out.flatten(-2).to(dtype)


def _what(x):
    return f"{x.dtype} tensor" if isinstance(x, torch.Tensor) else type(x).__name__


def _in_groups(t: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """t [R, NvS, D] with the rows past each rank's groups (from cu_seqlens[r, -1]) set to 0. The CUDA ops leave
    those rows as torch.empty does (docs/python.md), and the casts refuse a non-finite value anywhere in their input,
    so the layer's own rows are masked before they are cast (on the CPU they are 0 already)."""
    live = torch.arange(t.shape[1], device=t.device)[None, :] < cu_seqlens[:, -1:]
    return torch.where(live.unsqueeze(-1), t, torch.zeros((), dtype=t.dtype, device=t.device))


# ---------------------------------------------------------------------------------------------------------------
# Fake implementations
# ---------------------------------------------------------------------------------------------------------------


@torch.library.register_fake("evenep::quantize_fp8")
def _quantize_fake(x, ue8m0=False):
    return x.new_empty(x.shape, dtype=E4M3), x.new_empty((*x.shape[:-1], x.shape[-1] // BLOCK), dtype=torch.float32)


@torch.library.register_fake("evenep::quantize_fp8_weight")
def _quantize_weight_fake(weight, ue8m0=False):
    *lead, a, b = weight.shape
    return (weight.new_empty(weight.shape, dtype=E4M3),
            weight.new_empty((*lead, a // BLOCK, b // BLOCK), dtype=torch.float32))


@torch.library.register_fake("evenep::dispatch_fp8")
def _dispatch_fp8_fake(x, x_scales, topk_idx, topk_weights, plan, buffer, num_tokens=None):
    i = info(buffer)
    return (
        x.new_empty((i.L, i.nvs, i.H), dtype=E4M3),
        x.new_empty((i.L, i.nvs, i.H // BLOCK), dtype=torch.float32),
        x.new_empty((i.L, i.nvs), dtype=torch.float32),
        x.new_empty((i.L, i.G), dtype=torch.int32),
        x.new_empty((i.L, x.shape[1] * i.K), dtype=torch.int32),
    )


@torch.library.register_fake("evenep::grouped_gemm_fp8")
def _grouped_gemm_fp8_fake(x, x_scales, weight, weight_scales, slots, slot_scales, plan, buffer, transposed=False,
                           out_dtype=None):
    i = info(buffer)
    return x.new_empty((i.L, i.nvs, weight.shape[1] if transposed else weight.shape[2]),
                       dtype=out_dtype or torch.float32)


# ---------------------------------------------------------------------------------------------------------------
# Autograd: straight-through estimators of the casts (docs/python.md "FP8"); the communication backward is the bf16
# one (combine_backward / dispatch_backward stay bf16 in the library).
# ---------------------------------------------------------------------------------------------------------------


class DispatchFp8(torch.autograd.Function):
    """dispatch_fp8 with a straight-through gradient: returns (recv_x8, recv_scales, recv_deq, recv_w, cu_seqlens,
    handle), recv_deq = bf16(float(q) * s) the dequantised rows. The gradient of recv_deq (and of recv_w) goes back by
    the bf16 dispatch_backward as if the rows had not been quantised (to x when x is bf16; pre-quantised input gets
    none). The codes, scales, cu_seqlens and handle are not differentiable. dequantized=False (Buffer.dispatch, which
    returns the codes and scales only): recv_deq is an empty tensor and nothing is dequantised (at the MoonEP point the
    dequantisation costs ten times the dispatch)."""

    @staticmethod
    def forward(ctx, x, x_scales, topk_idx, topk_weights, plan, buffer, num_tokens, dequantized=True):
        recv_x8, recv_sc, recv_w, cu, dst = ops.dispatch_fp8(x, x_scales, topk_idx, topk_weights, plan, buffer,
                                                             num_tokens)
        if dequantized:
            recv_deq = dequantize(recv_x8, recv_sc)
        else:
            recv_deq = recv_x8.new_empty(0, dtype=torch.bfloat16)
            ctx.mark_non_differentiable(recv_deq)
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None (_dispatch_backward fills zeros)
        ctx.mark_non_differentiable(recv_x8, recv_sc, cu, dst)
        ctx.save_for_backward(topk_weights, plan, dst)
        ctx.buffer, ctx.x_dtype, ctx.pre = buffer, x.dtype, x_scales is not None
        return recv_x8, recv_sc, recv_deq, recv_w, cu, dst

    @staticmethod
    def backward(ctx, _g8, _gs, grad_deq, grad_recv_w, _gcu, _gdst):
        # The bf16 dispatch's backward (the same saved tensors: topk_weights, plan, handle; buffer, x_dtype).
        grad_x, _, grad_w, *_ = _ops._dispatch_backward(ctx, grad_deq, grad_recv_w, None, None)
        return None if ctx.pre else grad_x, None, None, grad_w, None, None, None, None


class ExpertLinearFp8(torch.autograd.Function):
    """The FP8 expert GEMM of evenep.nn.MoE(fp8=True): out = x8 · W_g block-scaled per receive-buffer group
    (grouped_gemm_fp8), W_g the 128x128 e4m3 cast of the group's home weight (cast once per call from its bf16
    rounding; the copies are prefetched as codes + scales, half the bf16 bytes).

    x is the bf16 value of the FP8 operand (x8, x_scales), used by the backward: dgrad in FP8 (dy cast 1x128,
    grouped_gemm_fp8 transposed; the gradient of x is this, straight through the cast of x), wgrad in bf16 on x
    (as DeepSeek-V3) with every copy's gradient reduced home in place (reduce_grad_add_). cu_seqlens [R, G] (the
    dispatch's): dy's rows past the groups are zeroed before its cast (_in_groups)."""

    @staticmethod
    def forward(ctx, x, x8, x_scales, weight, plan, cu_seqlens, buffer, ue8m0, out_dtype=None):
        w8, ws = ops.quantize_fp8_weight(_bf16(weight.detach()), ue8m0)
        s8, ss = ops.prefetch_weight(w8, plan, buffer), ops.prefetch_weight(ws, plan, buffer)
        ctx.save_for_backward(x, w8, ws, s8, ss, plan, cu_seqlens)
        ctx.buffer, ctx.ue8m0, ctx.w_dtype = buffer, ue8m0, weight.dtype
        return ops.grouped_gemm_fp8(x8, x_scales, w8, ws, s8, ss, plan, buffer, False, out_dtype)

    @staticmethod
    def backward(ctx, grad):
        x, w8, ws, s8, ss, plan, cu = ctx.saved_tensors
        dy = _bf16(grad)
        grad_x = grad_w = None
        if ctx.needs_input_grad[0]:
            dy8, dys = ops.quantize_fp8(_in_groups(dy, cu), ctx.ue8m0)
            grad_x = ops.grouped_gemm_fp8(dy8, dys, w8, ws, s8, ss, plan, ctx.buffer, True, torch.bfloat16).to(x.dtype)
        if ctx.needs_input_grad[3]:
            gw, gs = ops.grouped_gemm_wgrad(_bf16(x), dy, plan, ctx.buffer)
            ops.reduce_grad_add_(gw, gs, plan, ctx.buffer)
            grad_w = gw.to(ctx.w_dtype)
        return grad_x, None, None, grad_w, None, None, None, None, None
