"""torch.ops.evenep: fake (meta) implementations and autograd of the ops registered by evenep._C.

Schemas (python/csrc/ops.cpp). Tensors lead with L, the ranks of the group served by this process: L = R with
virtual ranks (all R in this process), L = 1 with group= (one rank per process). The shapes below write R for L.
s is the token dimension of the call (1 <= s <= max_tokens), NvS the fixed receive-buffer rows per rank,
G = 2 * E / R groups per rank, B prefetch slots per rank. Expert weights [E, a, b] are the home weights of the
served ranks: all E with virtual ranks, the E/R experts of this rank with group= (info().home).

  plan(topk_idx [R,s,K] int, buffer, num_tokens=None) -> plan int32 [R, W]
  dispatch(x [R,s,H] bf16, topk_idx, topk_weights [R,s,K] f32, plan, buffer, num_tokens=None)
      -> recv_x [R,NvS,H] bf16, recv_w [R,NvS] f32, cu_seqlens [R,G] int32, handle int32 [R, s*K]
  combine(expert_out [R,NvS,H] bf16, recv_w, topk_weights, plan, handle, buffer, apply_weights=True) -> [R,s,H] bf16
  combine_backward(grad_out [R,s,H] bf16, topk_weights, plan, handle, buffer) -> [R,NvS,H] bf16
  dispatch_backward(grad_recv_x [R,NvS,H] bf16, grad_recv_w [R,NvS] f32, topk_weights, plan, handle, buffer)
      -> grad_x [R,s,H] bf16, grad_topk_weights [R,s,K] f32
  prefetch_weight(weight [E,a,b], plan, buffer) -> slots [R,B,a,b] (weight's dtype)
  reduce_grad(slot_grads [R,B,a,b] f32, plan, buffer) -> [E,a,b] f32
  reduce_grad_add_(grad [E,a,b] f32 (mutated), slot_grads [R,B,a,b] f32, plan, buffer) -> ()
      grad[e] += the sum of e's copies' gradients, only for experts with copies (no dense zero-fill)
  combine_backward_weighted(grad_out [R,s,H] bf16, expert_out [R,NvS,H] bf16, recv_w [R,NvS] f32, topk_weights,
      plan, handle, buffer) -> grad_expert_out [R,NvS,H] bf16, grad_recv_w [R,NvS] f32
      the backward of combine(apply_weights=True): rows = combine_backward; bf16(w * rows), <rows, y>
  grouped_gemm(x [R,NvS,a] bf16, weight [E,a,b], slots [R,B,a,b], plan, buffer, out_dtype=None)
      -> [R,NvS,b] f32 (or out_dtype: torch.bfloat16)
  grouped_gemm_dgrad(dy [R,NvS,b] bf16, weight, slots, plan, buffer, out_dtype=None) -> [R,NvS,a] f32 (or bf16)
  grouped_gemm_wgrad(x [R,NvS,a] bf16, dy [R,NvS,b] bf16, plan, buffer) -> [E,a,b] f32, [R,B,a,b] f32

Every output shape follows from the static configuration and the input shapes alone (never from data).
On CUDA what an op need not write is left as torch.empty leaves it (zero under torch.use_deterministic_algorithms
with fill_uninitialized_memory): rows of recv_x / combine_backward(_weighted) / the grouped GEMMs' outputs past
rank r's groups (cu_seqlens[r, -1]), prefetch slots without a copy and their gradients in grouped_gemm_wgrad.
Nothing reads them. The CPU ops write 0.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from . import _C  # noqa: F401  (loading the extension registers torch.ops.evenep)

ops = torch.ops.evenep


class BufferInfo(NamedTuple):
    R: int
    E: int
    K: int
    S: int
    H: int
    ffn_hidden: int
    B: int
    tp: int
    nvs: int
    G: int
    plan_width: int
    L: int  # ranks served by this process (the ops' leading dimension)
    rank_begin: int  # the first of them
    home: int  # their home experts (E*L/R: the expert weights' dimension 0)


@functools.lru_cache(maxsize=None)
def info(buffer: int) -> BufferInfo:
    return BufferInfo(*ops.buffer_info(buffer))


# ---------------------------------------------------------------------------------------------------------------
# Fake implementations: shapes from the configuration and the input shapes.
# ---------------------------------------------------------------------------------------------------------------


@torch.library.register_fake("evenep::plan")
def _plan_fake(topk_idx, buffer, num_tokens=None):
    i = info(buffer)
    return topk_idx.new_empty((i.L, i.plan_width), dtype=torch.int32)


@torch.library.register_fake("evenep::dispatch")
def _dispatch_fake(x, topk_idx, topk_weights, plan, buffer, num_tokens=None):
    i = info(buffer)
    s = x.shape[1]
    return (
        x.new_empty((i.L, i.nvs, i.H), dtype=torch.bfloat16),
        x.new_empty((i.L, i.nvs), dtype=torch.float32),
        x.new_empty((i.L, i.G), dtype=torch.int32),
        x.new_empty((i.L, s * i.K), dtype=torch.int32),
    )


@torch.library.register_fake("evenep::combine")
def _combine_fake(expert_out, recv_w, topk_weights, plan, handle, buffer, apply_weights=True):
    i = info(buffer)
    return expert_out.new_empty((i.L, topk_weights.shape[1], i.H), dtype=torch.bfloat16)


@torch.library.register_fake("evenep::combine_backward")
def _combine_backward_fake(grad_out, topk_weights, plan, handle, buffer):
    i = info(buffer)
    return grad_out.new_empty((i.L, i.nvs, i.H), dtype=torch.bfloat16)


@torch.library.register_fake("evenep::combine_backward_weighted")
def _combine_backward_weighted_fake(grad_out, expert_out, recv_w, topk_weights, plan, handle, buffer):
    i = info(buffer)
    return (grad_out.new_empty((i.L, i.nvs, i.H), dtype=torch.bfloat16),
            grad_out.new_empty((i.L, i.nvs), dtype=torch.float32))


@torch.library.register_fake("evenep::dispatch_backward")
def _dispatch_backward_fake(grad_recv_x, grad_recv_w, topk_weights, plan, handle, buffer):
    i = info(buffer)
    s = topk_weights.shape[1]
    return (
        grad_recv_x.new_empty((i.L, s, i.H), dtype=torch.bfloat16),
        grad_recv_x.new_empty((i.L, s, i.K), dtype=torch.float32),
    )


@torch.library.register_fake("evenep::prefetch_weight")
def _prefetch_weight_fake(weight, plan, buffer):
    i = info(buffer)
    return weight.new_empty((i.L, i.B, weight.shape[1], weight.shape[2]))


@torch.library.register_fake("evenep::reduce_grad")
def _reduce_grad_fake(slot_grads, plan, buffer):
    i = info(buffer)
    return slot_grads.new_empty((i.home, slot_grads.shape[2], slot_grads.shape[3]), dtype=torch.float32)


@torch.library.register_fake("evenep::reduce_grad_add_")
def _reduce_grad_add_fake(grad, slot_grads, plan, buffer):
    return None


@torch.library.register_fake("evenep::grouped_gemm")
def _grouped_gemm_fake(x, weight, slots, plan, buffer, out_dtype=None):
    i = info(buffer)
    return x.new_empty((i.L, i.nvs, weight.shape[2]), dtype=out_dtype or torch.float32)


@torch.library.register_fake("evenep::grouped_gemm_dgrad")
def _grouped_gemm_dgrad_fake(dy, weight, slots, plan, buffer, out_dtype=None):
    i = info(buffer)
    return dy.new_empty((i.L, i.nvs, weight.shape[1]), dtype=out_dtype or torch.float32)


@torch.library.register_fake("evenep::grouped_gemm_wgrad")
def _grouped_gemm_wgrad_fake(x, dy, plan, buffer):
    i = info(buffer)
    a, b = x.shape[2], dy.shape[2]
    return (
        x.new_empty((i.home, a, b), dtype=torch.float32),
        x.new_empty((i.L, i.B, a, b), dtype=torch.float32),
    )


# ---------------------------------------------------------------------------------------------------------------
# Autograd. dispatch and combine follow SPEC §4.3 (combine_backward = dispatch of grad_out with the plan reused,
# dispatch_backward = combine of the row gradients plus the gathered route-weight gradient); the grouped GEMM's
# backward is its dgrad and wgrad; prefetch_weight and reduce_grad are each other's transpose.
# ---------------------------------------------------------------------------------------------------------------


def _bf16(t):
    return t.to(torch.bfloat16).contiguous()


def _dispatch_setup(ctx, inputs, output):
    x, topk_idx, topk_weights, plan, buffer, num_tokens = inputs
    ctx.save_for_backward(topk_weights, plan, output[3])
    ctx.buffer = buffer
    ctx.x_dtype = x.dtype


def _dispatch_backward(ctx, grad_recv_x, grad_recv_w, _grad_cu, _grad_handle):
    topk_weights, plan, handle = ctx.saved_tensors
    i = info(ctx.buffer)
    if grad_recv_x is None:
        grad_recv_x = plan.new_zeros((i.L, i.nvs, i.H), dtype=torch.bfloat16)
    if grad_recv_w is None:
        grad_recv_w = plan.new_zeros((i.L, i.nvs), dtype=torch.float32)
    grad_x, grad_w = ops.dispatch_backward(
        _bf16(grad_recv_x), grad_recv_w.float().contiguous(), topk_weights, plan, handle, ctx.buffer
    )
    return grad_x.to(ctx.x_dtype), None, grad_w, None, None, None


torch.library.register_autograd("evenep::dispatch", _dispatch_backward, setup_context=_dispatch_setup)


def _combine_setup(ctx, inputs, output):
    expert_out, recv_w, topk_weights, plan, handle, buffer, apply_weights = inputs
    ctx.save_for_backward(expert_out, recv_w, topk_weights, plan, handle)
    ctx.buffer = buffer
    ctx.apply_weights = apply_weights


def _combine_backward(ctx, grad_out):
    expert_out, recv_w, topk_weights, plan, handle = ctx.saved_tensors
    if not ctx.apply_weights:
        rows = ops.combine_backward(_bf16(grad_out), topk_weights, plan, handle, ctx.buffer)
        return rows, None, None, None, None, None, None
    # out_t = sum over t's entries n of w_n * y_n: dy_n = w_n * g_t (bf16), dw_n = <g_t, y_n> (fp32), in one op.
    grad_y, grad_w = ops.combine_backward_weighted(_bf16(grad_out), expert_out, recv_w, topk_weights, plan, handle,
                                                   ctx.buffer)
    return grad_y, grad_w, None, None, None, None, None


torch.library.register_autograd("evenep::combine", _combine_backward, setup_context=_combine_setup)


def _gemm_setup(ctx, inputs, output):
    x, weight, slots, plan, buffer, _out_dtype = inputs
    ctx.save_for_backward(x, weight, slots, plan)
    ctx.buffer = buffer


def _gemm_backward(ctx, grad):
    x, weight, slots, plan = ctx.saved_tensors
    dy = _bf16(grad)
    grad_x = grad_w = grad_slots = None
    if ctx.needs_input_grad[0]:
        grad_x = _dgrad(x, dy, weight, slots, plan, ctx.buffer)
    if ctx.needs_input_grad[1] or ctx.needs_input_grad[2]:
        gw, gs = ops.grouped_gemm_wgrad(x, dy, plan, ctx.buffer)
        grad_w, grad_slots = gw.to(weight.dtype), gs.to(slots.dtype)
    return grad_x, grad_w, grad_slots, None, None, None


def _dgrad(x, dy, weight, slots, plan, buffer):
    """The grouped GEMM's input gradient in x's dtype: bf16 straight from the epilogue, else fp32 cast to it."""
    out_dtype = torch.bfloat16 if x.dtype == torch.bfloat16 else None
    return ops.grouped_gemm_dgrad(dy, weight, slots, plan, buffer, out_dtype).to(x.dtype)


torch.library.register_autograd("evenep::grouped_gemm", _gemm_backward, setup_context=_gemm_setup)


def _prefetch_setup(ctx, inputs, output):
    weight, plan, buffer = inputs
    ctx.save_for_backward(plan)
    ctx.buffer = buffer
    ctx.dtype = weight.dtype


def _prefetch_backward(ctx, grad_slots):
    (plan,) = ctx.saved_tensors
    return ops.reduce_grad(grad_slots.float().contiguous(), plan, ctx.buffer).to(ctx.dtype), None, None


torch.library.register_autograd("evenep::prefetch_weight", _prefetch_backward, setup_context=_prefetch_setup)


def _reduce_setup(ctx, inputs, output):
    slot_grads, plan, buffer = inputs
    ctx.save_for_backward(plan)
    ctx.buffer = buffer


def _reduce_backward(ctx, grad):
    (plan,) = ctx.saved_tensors
    return ops.prefetch_weight(grad.float().contiguous(), plan, ctx.buffer), None, None


torch.library.register_autograd("evenep::reduce_grad", _reduce_backward, setup_context=_reduce_setup)


class ExpertLinear(torch.autograd.Function):
    """out = x · W_g per receive-buffer group (fp32), W_g the group's home weight or its prefetched copy, with the
    copies made inside: weight (any float dtype, e.g. fp32 master weights) is cast to bf16 once, the copies are
    prefetched from that cast (bf16: half the bytes, no slot conversion), and the backward returns the weight
    gradient in weight's dtype with every copy's gradient reduced home in place (reduce_grad_add_), so no
    zero-filled slot tensor and no dense add of a reduced gradient is made. Equal in value to
    grouped_gemm(x, weight, prefetch_weight(weight, plan), plan) and its autograd."""

    @staticmethod
    def forward(ctx, x, weight, plan, buffer, out_dtype=None):
        wb = weight.detach().to(torch.bfloat16).contiguous()
        slots = ops.prefetch_weight(wb, plan, buffer)
        ctx.save_for_backward(x, wb, slots, plan)
        ctx.buffer = buffer
        ctx.w_dtype = weight.dtype
        return ops.grouped_gemm(x, wb, slots, plan, buffer, out_dtype)

    @staticmethod
    def backward(ctx, grad):
        x, wb, slots, plan = ctx.saved_tensors
        dy = _bf16(grad)
        grad_x = grad_w = None
        if ctx.needs_input_grad[0]:
            grad_x = _dgrad(x, dy, wb, slots, plan, ctx.buffer)
        if ctx.needs_input_grad[1]:
            gw, gs = ops.grouped_gemm_wgrad(x, dy, plan, ctx.buffer)
            ops.reduce_grad_add_(gw, gs, plan, ctx.buffer)
            grad_w = gw.to(ctx.w_dtype)
        return grad_x, grad_w, None, None, None
