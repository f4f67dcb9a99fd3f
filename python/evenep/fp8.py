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

WeightCastCache keeps nn.MoE(fp8=True)'s weight casts while the weights are unchanged (what it detects: its
docstring).
"""

from __future__ import annotations

import weakref

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

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
    (grouped_gemm_fp8), W_g the 128x128 e4m3 cast of the group's home weight (cast from its bf16 rounding once per
    call, or given as (w8, ws), the cast of weight, e.g. from a WeightCastCache; the copies are prefetched as codes +
    scales, half the bf16 bytes). w8 and ws are saved for the backward as given and are not differentiable.

    x is the bf16 value of the FP8 operand (x8, x_scales), used by the backward: dgrad in FP8 (dy cast 1x128,
    grouped_gemm_fp8 transposed; the gradient of x is this, straight through the cast of x), wgrad in bf16 on x
    (as DeepSeek-V3) with every copy's gradient reduced home in place (reduce_grad_add_). cu_seqlens [R, G] (the
    dispatch's): dy's rows past the groups are zeroed before its cast (_in_groups)."""

    @staticmethod
    def forward(ctx, x, x8, x_scales, weight, plan, cu_seqlens, buffer, ue8m0, out_dtype=None, w8=None, ws=None):
        if w8 is None:
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
        return grad_x, None, None, grad_w, None, None, None, None, None, None, None


# ---------------------------------------------------------------------------------------------------------------
# The weight cast cache of nn.MoE(fp8=True): one 128x128 cast per weight change, not one per forward.
# ---------------------------------------------------------------------------------------------------------------

_optimizer_steps = 0  # torch.optim steps taken in this process since the hook below was installed
_step_hook = None


def _count_optimizer_step(optimizer, args, kwargs):
    global _optimizer_steps
    _optimizer_steps += 1


def _watch_optimizers():
    """Installs (once per process) a torch.optim post-step hook counting every Optimizer.step(): fused optimizers
    (fused=True) update the weights without bumping their version counters (checked with torch 2.15, SGD and Adam
    on the CPU), so a step has to invalidate the casts by itself."""
    global _step_hook
    if _step_hook is None:
        _step_hook = register_optimizer_step_post_hook(_count_optimizer_step)


def _cachable(tensors) -> bool:
    # NOTE: is_compiling() first: under dynamo nothing below is traced (the cast stays in the graph).
    if torch.compiler.is_compiling():
        return False
    for t in tensors:
        if type(t) not in (torch.Tensor, torch.nn.Parameter) or t.is_inference():
            return False  # a subclass (FakeTensor, DTensor, ...) or an inference tensor (no version counter)
        if t.is_cuda and torch.cuda.is_current_stream_capturing():
            return False  # a replay must cast the weights the captured step updates
    return True


def _state(t: torch.Tensor):
    return (t._version, t.data_ptr(), t.dtype, t.device, tuple(t.shape), t.stride())


class WeightCastCache:
    """The 128x128 cast (w8, ws) of one expert weight (quantize_weight of its bf16 rounding), reused while the
    parameters it is made of are unchanged. nn.MoE(fp8=True) holds one per weight (the gate/up concatenation and the
    down projection), so an unchanged weight is cast once, not once per forward: gradient accumulation (several
    micro-batches per optimizer step), inference, activation recomputation. At most one entry: a miss drops the old
    cast before making the new one.

    cast(weight, sources, ue8m0) returns the cast of weight (a tensor computed from sources, or one of them) and
    keeps it; the next call returns the kept tensors when all of these are as they were:
      * each source's version counter: every in-place torch op on the parameter or on an alias sharing its counter
        (.detach(), views) bumps it, with or without grad mode: optimizer.step() of torch.optim's for-loop and foreach
        implementations, `with torch.no_grad(): p.add_(...)` / `p.copy_(...)`, load_state_dict (copies in place),
        nn.init's in-place initialisers;
      * the number of torch.optim.Optimizer.step() calls in the process (a post-step hook installed at the first
        cast kept): fused optimizers (fused=True) do not bump the version counter, and are detected this way; any
        optimizer's step, whichever parameters it holds, invalidates every cache;
      * each source's identity (a weak reference): a replaced Parameter (`moe.w_down = nn.Parameter(...)`,
        load_state_dict(assign=True)) is not mistaken for the old one even at the same address;
      * each source's storage (a weak reference to it, its address) and dtype, shape, stride and device: `p.data =
        t` and Module.to() / .cuda() / .half(), which assign .data;
      * ue8m0, and inference mode: a cast made under torch.inference_mode() (an inference tensor, which autograd
        cannot save) is reused only under inference mode.
    Not detected: in-place writes through .data (`p.data.copy_(w)`, `p.data.mul_(...)`, `p.data -= lr * p.grad`:
    .data is a tensor with a version counter of its own) and writes no torch in-place op makes (NumPy or DLPack
    aliases, kernels or collectives writing into the storage). After such a write call clear()
    (nn.MoE.fp8_weights_changed()), or build the layer with cache_fp8_weights=False.

    Cast every call and not kept: while torch.compile / torch.export trace (torch.compiler.is_compiling(): the cast
    stays in the graph), during CUDA-graph capture (a replay must cast the weights the captured step changed),
    tensor subclasses and inference tensors as sources. The kept tensors are never written in place, so autograd may
    save them (several graphs share one cast under gradient accumulation). Memory: one byte per weight element plus
    an fp32 scale per 128x128 block, held between calls (the cast of the uncached path lives only as long as the
    autograd graph). Copies (deepcopy, pickle) start empty."""

    def __init__(self):
        self.clear()

    def clear(self):
        """Drops the kept cast: the next cast() casts."""
        self._key, self._refs, self._cast = None, (), None

    def __reduce__(self):
        return (WeightCastCache, ())  # weak references do not copy: a copy starts empty

    def cast(self, weight: torch.Tensor, sources, ue8m0: bool):
        """(codes e4m3 [..., a, b], scales fp32 [..., a/128, b/128]) of weight, reused while sources are unchanged
        (above). weight must be a function of sources alone (nn.MoE: torch.cat([w_gate, w_up], 2) of (w_gate,
        w_up))."""
        sources = tuple(sources)
        if not _cachable(sources):
            return ops.quantize_fp8_weight(_bf16(weight.detach()), bool(ue8m0))
        _watch_optimizers()
        key = (bool(ue8m0), _optimizer_steps, tuple(_state(t) for t in sources))
        if self._cast is not None and key == self._key and self._same_tensors(sources) and (
            not self._cast[0].is_inference() or torch.is_inference_mode_enabled()
        ):
            return self._cast
        self.clear()
        self._cast = ops.quantize_fp8_weight(_bf16(weight.detach()), bool(ue8m0))
        self._key = key
        self._refs = tuple((weakref.ref(t), weakref.ref(t.untyped_storage())) for t in sources)
        return self._cast

    def _same_tensors(self, sources) -> bool:
        return len(self._refs) == len(sources) and all(
            tensor() is t and storage() is t.untyped_storage() for (tensor, storage), t in zip(self._refs, sources)
        )
