"""evenep.nn: a drop-in MoE layer over an evenep.Buffer, and the plain PyTorch MoE it is checked against.

Both compute, per token x and entry k (expert e = topk_idx[k], weight w_k):
    y_e(x) = (silu(x·W_gate[e]) * (x·W_up[e])) · W_down[e];   out = sum_k w_k · y_{e_k}(x)  (+ shared expert)
with the router  logits = x·W_router (fp32); softmax (or sigmoid) scores; top-k; weights renormalised over the
top-k. Tokens use the virtual-rank layout [R, s, H].
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from . import fp8 as _fp8
from . import trace as _trace
from .buffer import Buffer


def route(x: torch.Tensor, router_weight: torch.Tensor, top_k: int, router: str):
    """Router: x [..., H] -> (topk_idx int64 [..., K], topk_weights fp32 [..., K]) (fp32 throughout)."""
    logits = x.float() @ router_weight.float()
    if router == "softmax":
        scores = torch.softmax(logits, dim=-1)
    elif router == "sigmoid":
        scores = torch.sigmoid(logits)
    else:
        raise ValueError(f"router = {router!r}, expected 'softmax' or 'sigmoid'")
    vals, idx = torch.topk(scores, top_k, dim=-1)
    return idx, vals / vals.sum(dim=-1, keepdim=True)


class _Experts(nn.Module):
    """Home expert weights [E_home, in, out] (global expert order; rank r homes experts r*E/R .. (r+1)*E/R - 1):
    every expert (E_home = E) in one process, this rank's E/R with a group= buffer."""

    def __init__(self, hidden, ffn_hidden, num_experts, top_k, router, shared_expert, dtype, num_home=None):
        super().__init__()
        self.hidden, self.ffn_hidden, self.num_experts, self.top_k, self.router = (
            hidden, ffn_hidden, num_experts, top_k, router,
        )
        if router not in ("softmax", "sigmoid"):
            raise ValueError(f"router = {router!r}, expected 'softmax' or 'sigmoid'")
        n = num_experts if num_home is None else num_home
        self.router_weight = nn.Parameter(torch.empty(hidden, num_experts, dtype=dtype))
        self.w_gate = nn.Parameter(torch.empty(n, hidden, ffn_hidden, dtype=dtype))
        self.w_up = nn.Parameter(torch.empty(n, hidden, ffn_hidden, dtype=dtype))
        self.w_down = nn.Parameter(torch.empty(n, ffn_hidden, hidden, dtype=dtype))
        self.shared_expert = shared_expert
        self.reset_parameters()

    def reset_parameters(self):
        for w, fan_in in (
            (self.router_weight, self.hidden),
            (self.w_gate, self.hidden),
            (self.w_up, self.hidden),
            (self.w_down, self.ffn_hidden),
        ):
            bound = math.sqrt(3.0 / fan_in)
            nn.init.uniform_(w, -bound, bound)

    def _route(self, x, routing):
        # routing = (topk_idx, topk_weights) replaces the router (custom routers, tests: -1 masks an entry).
        return route(x, self.router_weight, self.top_k, self.router) if routing is None else routing

    def _shared(self, x):
        return 0 if self.shared_expert is None else self.shared_expert(x)


class MoE(_Experts):
    """SwiGLU MoE layer over EvenEP: router -> plan -> dispatch -> prefetch -> grouped GEMMs -> combine.

    Args:
        hidden, ffn_hidden: H and H' of the experts.
        num_experts, top_k: E and K (must match the buffer's).
        buffer: the evenep.Buffer (shared by all MoE layers of the model).
        router: "softmax" or "sigmoid" scores; top-k weights renormalised to sum to 1.
        shared_expert: optional module applied to every token and added to the output.
        dtype: parameter dtype (fp32 master weights by default; the data path is bf16).
        trace: optional path of a router trace to record: every forward's gathered histogram [R, E] (the plan's
            tpe), written as int32 [T, R, E] by flush_trace() and at exit (evenep.trace, docs/traces.md).
        fp8: the FP8 path of the CPU oracle (docs/fp8.md; the buffer must be created with fp8=True, and fp8=True
            needs such a buffer): e4m3 dispatch with 1x128 scales, e4m3 weights with 128x128 block scales for the
            home and the copies (cast once per weight change, see cache_fp8_weights), block-scaled GEMMs forward and
            dgrad with fp32 accumulation, wgrad in bf16 on the dequantised operands, bf16 combine. The casts are
            straight-through in the backward (docs/python.md, FP8). On a CUDA buffer (virtual ranks) the GEMMs are
            the library's CUTLASS FP8 grouped GEMM: a build without EVENEP_CUTLASS, or a device other than
            H100/H200, raises NotImplementedError at the first forward.
        cache_fp8_weights: with fp8, keep each expert weight's e4m3 cast and reuse it while the weight is unchanged
            (evenep.fp8.WeightCastCache: version counters, every torch.optim step, identity and storage of the
            parameters), so gradient accumulation and inference cast once per weight change instead of once per
            forward; costs one byte per expert weight element between forwards. Writes through .data (`p.data.copy_`)
            are not seen: call fp8_weights_changed() after them, or pass False (a cast per forward, as before).

    With a group= buffer (one rank per process) x is [1, s, H], the expert weights are this rank's E/R home experts
    (global ids rank*E/R ...) and the router weight is replicated (the framework reduces its gradient as usual).

    forward(x [R, s, H], num_tokens=None, routing=None) -> [R, s, H] in x's dtype; num_tokens: s_r per rank
    (rows past s_r are ignored and give 0); routing: (topk_idx, topk_weights) [R, s, K] instead of the router. Expert weights are home nn.Parameters;
    the copies each rank computes without owning are prefetched from their bf16 cast (Buffer.expert_linear) and
    their gradients reduced home in place inside autograd, before the optimizer or any gradient hook sees them.
    """

    def __init__(self, hidden, ffn_hidden, num_experts, top_k, *, buffer: Buffer, router="softmax",
                 shared_expert: Optional[nn.Module] = None, dtype=torch.float32, trace=None, fp8: bool = False,
                 cache_fp8_weights: bool = True):
        super().__init__(hidden, ffn_hidden, num_experts, top_k, router, shared_expert, dtype, buffer.info.home)
        if not isinstance(fp8, bool):
            raise ValueError(f"evenep.nn.MoE: fp8 = {fp8!r}, expected True or False")
        if fp8 != buffer.fp8:
            raise ValueError(f"evenep.nn.MoE(fp8={fp8}) needs a buffer created with fp8={fp8} (the buffer has "
                             f"fp8={buffer.fp8})")
        if not isinstance(cache_fp8_weights, bool):
            raise ValueError(f"evenep.nn.MoE: cache_fp8_weights = {cache_fp8_weights!r}, expected True or False")
        self.fp8 = fp8
        # The kept e4m3 casts of (w_gate|w_up) and w_down (fp8 with cache_fp8_weights; plain attributes, not state).
        self._fp8_casts = (_fp8.WeightCastCache(), _fp8.WeightCastCache()) if fp8 and cache_fp8_weights else None
        if trace is not None and buffer.group is not None:
            raise NotImplementedError("evenep.nn.MoE(trace=...): a group= buffer plans this rank's row only; record "
                                      "a trace on virtual ranks for now")
        i = buffer.info
        if (i.E, i.K, i.H) != (num_experts, top_k, hidden):
            raise ValueError(
                f"MoE(E={num_experts}, K={top_k}, H={hidden}) does not match the buffer's (E={i.E}, K={i.K}, H={i.H})"
            )
        self.buffer = buffer
        # trace="F.npy": this layer's plans, one step each, written as a router trace [T, R, E] (evenep.trace)
        self.trace = None if trace is None else _trace.TraceRecorder(trace)

    def flush_trace(self):
        """Writes this layer's trace (trace= given) with every step so far; returns its path (None: no trace or
        no step yet). Also written when the interpreter exits."""
        return None if self.trace is None else self.trace.flush()

    def fp8_weights_changed(self):
        """Drops the kept FP8 casts of the expert weights (cache_fp8_weights): the next forward casts them again.
        Needed only after a write the cache cannot see (through .data, or outside torch's in-place ops:
        evenep.fp8.WeightCastCache); a no-op without them."""
        for cache in self._fp8_casts or ():
            cache.clear()

    def forward(self, x: torch.Tensor, num_tokens: Optional[Sequence[int]] = None, routing=None) -> torch.Tensor:
        buf = self.buffer
        if x.dim() != 3 or x.shape[-1] != self.hidden:  # before the router's matmul (its error names no layer)
            raise ValueError(f"evenep.nn.MoE: x has shape {list(x.shape)}, expected [R = {buf.info.L}, s, H = "
                             f"{self.hidden}]")
        shared, side = None, None
        if self.shared_expert is not None and x.is_cuda and not torch.compiler.is_compiling():
            # The shared expert on a side stream, overlapping plan/dispatch/GEMMs/combine (eager and CUDA graphs;
            # autograd runs its backward on the same side stream). Compiled: on the main stream.
            side = self._side_stream(x.device)
            side.wait_stream(torch.cuda.current_stream(x.device))
            with torch.cuda.stream(side):
                shared = self.shared_expert(x)
        topk_idx, topk_w = self._route(x, routing)
        xb = x.to(torch.bfloat16)
        plan = buf.plan(topk_idx, num_tokens)
        _trace.record_plan(self.trace, plan, buf.layout)
        # Gate and up projections as one GEMM ([H, 2H']): one dgrad, one bf16 rounding of grad x.
        w_gu = torch.cat([self.w_gate, self.w_up], dim=2)
        if self.fp8:
            y, handle = self._experts_fp8(xb, topk_idx, topk_w, plan, num_tokens, w_gu)
        else:
            recv_x, _, _, handle = buf.dispatch(xb, topk_idx, topk_w, plan, num_tokens)
            # bf16 straight from the GEMMs' epilogues (one rounding of the fp32 sums, as a cast would make).
            gu = buf.expert_linear(recv_x, w_gu, plan, torch.bfloat16)
            g, u = gu.split(self.ffn_hidden, dim=-1)
            h = (F.silu(g.float()) * u.float()).to(torch.bfloat16)
            y = buf.expert_linear(h, self.w_down, plan, torch.bfloat16)
        out = buf.combine(y, handle).to(x.dtype)
        if side is None:
            return out + self._shared(x)
        main = torch.cuda.current_stream(x.device)
        main.wait_stream(side)
        shared.record_stream(main)
        return out + shared

    def _experts_fp8(self, xb, topk_idx, topk_w, plan, num_tokens, w_gu):
        """FP8 dispatch and expert GEMMs (docs/fp8.md section 2): the rows arrive as e4m3 + 1x128 scales and feed the
        gate/up GEMM; h is cast 1x128 before the down GEMM; the weights are 128x128 e4m3 casts (kept while the
        weights are unchanged with cache_fp8_weights). Returns (y bf16 [R, NvS, H], handle)."""
        buf, ue8m0 = self.buffer, self.buffer.ue8m0
        recv_x8, recv_sc, recv_x, _, cu, handle = buf._dispatch_fp8(xb, topk_idx, topk_w, plan, num_tokens)
        w8, ws = self._weight_fp8(0, w_gu, (self.w_gate, self.w_up), ue8m0)
        gu = _fp8.ExpertLinearFp8.apply(recv_x, recv_x8, recv_sc, w_gu, plan, cu, buf.id, ue8m0, torch.bfloat16,
                                        w8, ws)
        g, u = gu.split(self.ffn_hidden, dim=-1)
        h = (F.silu(g.float()) * u.float()).to(torch.bfloat16)
        # h's rows past the groups are the GEMM's unwritten rows on CUDA: zeroed before the cast (which refuses NaN)
        h8, hs = _fp8.quantize(_fp8._in_groups(h.detach(), cu), ue8m0)
        w8, ws = self._weight_fp8(1, self.w_down, (self.w_down,), ue8m0)
        y = _fp8.ExpertLinearFp8.apply(h, h8, hs, self.w_down, plan, cu, buf.id, ue8m0, torch.bfloat16, w8, ws)
        return y, handle

    def _weight_fp8(self, slot, weight, sources, ue8m0):
        """The 128x128 e4m3 cast of weight (a function of sources): kept in self._fp8_casts[slot], or made now."""
        if self._fp8_casts is None:
            return _fp8.quantize_weight(weight.detach(), ue8m0)
        return self._fp8_casts[slot].cast(weight, sources, ue8m0)

    def _side_stream(self, device):
        if getattr(self, "_side", None) is None or self._side.device != device:
            self._side = torch.cuda.Stream(device)
        return self._side


class TorchMoE(_Experts):
    """The plain PyTorch MoE (the same parameters and mathematics, fp32 on bf16-valued inputs, one expert at a
    time: gather its tokens, three matmuls, index_add_ back). The reference of the tests and of
    examples/train_moe.py --backend reference."""

    def __init__(self, hidden, ffn_hidden, num_experts, top_k, *, router="softmax",
                 shared_expert: Optional[nn.Module] = None, dtype=torch.float32):
        super().__init__(hidden, ffn_hidden, num_experts, top_k, router, shared_expert, dtype)

    def forward(self, x: torch.Tensor, num_tokens: Optional[Sequence[int]] = None, routing=None) -> torch.Tensor:
        topk_idx, topk_w = self._route(x, routing)
        lead = x.shape[:-1]
        xf = x.to(torch.bfloat16).float().reshape(-1, self.hidden)
        idx = topk_idx.reshape(-1, self.top_k)
        w = topk_w.reshape(-1, self.top_k)
        if num_tokens is not None:  # tokens past s_r on rank r do not exist
            s = x.shape[1]
            valid = torch.arange(s, device=x.device)[None, :] < torch.tensor(num_tokens, device=x.device)[:, None]
            w = w * valid.reshape(-1, 1)
        out = torch.zeros_like(xf)
        wg, wu, wd = (p.to(torch.bfloat16).float() for p in (self.w_gate, self.w_up, self.w_down))
        for e in range(self.num_experts):
            tok, k = torch.nonzero(idx == e, as_tuple=True)
            if tok.numel() == 0:
                continue
            xe = xf[tok]
            ye = (F.silu(xe @ wg[e]) * (xe @ wu[e])) @ wd[e]
            out = out.index_add(0, tok, ye * w[tok, k].unsqueeze(-1))
        return out.reshape(*lead, self.hidden).to(x.dtype) + self._shared(x)
