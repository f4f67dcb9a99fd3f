"""python -m evenep.bench: one MoE layer forward+backward with EvenEP vs the plain PyTorch MoE, and the cost of each
op as seen from Python.

This version times the CPU backend (virtual ranks as threads; wall-clock medians). The GPU comparison of the issue
(torch._grouped_mm reference, CUDA events, CUDA-graph replay, the C++ `evenep bench` figure of the same call) plugs
in with the CUDA ops: see docs/python.md.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import evenep


def _median_ms(fn, warmup, iters):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), min(times)


def _routing(kind, R, s, E, K, gen):
    idx = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(R * s)]).reshape(R, s, K)
    if kind == "hot_expert":
        idx[..., 0] = 0
        idx[..., 1:] = torch.where(idx[..., 1:] == 0, torch.ones_like(idx[..., 1:]), idx[..., 1:])
    return idx


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m evenep.bench", description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--experts", type=int, default=16)
    p.add_argument("--top-k", type=int, default=4)
    p.add_argument("--tokens", type=int, default=64, help="tokens per rank (s = max_tokens)")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--ffn", type=int, default=128)
    p.add_argument("--token-padding", type=int, default=16)
    p.add_argument("--routing", choices=["random", "hot_expert"], default="random")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--device", default="cpu")
    a = p.parse_args(argv)
    if torch.device(a.device).type != "cpu":
        raise SystemExit("evenep.bench: only the CPU backend is built in this version (GPU comparison: next phase)")

    R, E, K, s, H, F = a.ranks, a.experts, a.top_k, a.tokens, a.hidden, a.ffn
    buf = evenep.Buffer(E, K, s, H, virtual_ranks=R, ffn_hidden=F, token_padding=a.token_padding)
    gen = torch.Generator().manual_seed(0)
    idx = _routing(a.routing, R, s, E, K, gen)
    w = torch.rand(R, s, K, generator=gen)
    x = torch.randn(R, s, H, generator=gen)
    torch.manual_seed(0)
    moe = evenep.nn.MoE(H, F, E, K, buffer=buf)
    ref = evenep.nn.TorchMoE(H, F, E, K)
    ref.load_state_dict(moe.state_dict())

    def layer(mod):
        def step():
            xx = x.clone().requires_grad_()
            mod(xx, routing=(idx, w)).sum().backward()
        return step

    rows = []
    for name, mod in (("MoE fwd+bwd  evenep", moe), ("MoE fwd+bwd  torch", ref)):
        rows.append((name, *_median_ms(layer(mod), a.warmup, a.iters)))

    ops = torch.ops.evenep
    xb = x.bfloat16()
    plan = buf.plan(idx)
    recv_x, recv_w, _, h = buf.dispatch(xb, idx, w, plan)
    W = torch.randn(E, H, F)
    slots = buf.prefetch_weight(W, plan)
    dy = torch.randn(R, buf.num_recv_rows, F).bfloat16()
    g = torch.randn(R, s, H).bfloat16()
    calls = {
        "plan": lambda: buf.plan(idx),
        "dispatch": lambda: buf.dispatch(xb, idx, w, plan),
        "combine": lambda: buf.combine(recv_x, h),
        "combine_backward": lambda: ops.combine_backward(g, h.topk_weights, plan, h.dst, buf.id),
        "dispatch_backward": lambda: ops.dispatch_backward(recv_x, recv_w, h.topk_weights, plan, h.dst, buf.id),
        "prefetch_weight": lambda: buf.prefetch_weight(W, plan),
        "reduce_grad": lambda: buf.reduce_grad(torch.zeros(R, buf.num_slots, H, F), plan),
        "grouped_gemm fwd": lambda: buf.grouped_gemm(recv_x, W, slots, plan),
        "grouped_gemm dgrad": lambda: ops.grouped_gemm_dgrad(dy, W, slots, plan, buf.id),
        "grouped_gemm wgrad": lambda: ops.grouped_gemm_wgrad(recv_x, dy, plan, buf.id),
    }
    for name, fn in calls.items():
        if name in ("combine", "combine_backward", "dispatch_backward"):
            buf.dispatch(xb, idx, w, plan)  # the buffer holds h: no re-dispatch inside the timed call
        rows.append((f"op {name}", *_median_ms(fn, a.warmup, a.iters)))

    print(f"# evenep.bench (CPU backend): R={R} E={E} K={K} s={s} H={H} H'={F} tp={a.token_padding} "
          f"NvS={buf.num_recv_rows} routing={a.routing} iters={a.iters} torch threads={torch.get_num_threads()}")
    print(f"{'what':<28}{'median ms':>12}{'min ms':>12}")
    for name, med, mn in rows:
        print(f"{name:<28}{med:>12.3f}{mn:>12.3f}")
    return rows


if __name__ == "__main__":
    main()
