"""python -m evenep.bench: one MoE layer forward+backward with EvenEP vs the plain PyTorch MoE, and the cost of each
op as seen from Python.

CPU (--device cpu): virtual ranks as threads; wall-clock medians; the reference is evenep.nn.TorchMoE (a loop).
CUDA (--device cuda): R virtual ranks on one GPU (cuda::Ep); CUDA-event medians; the reference is the plain
PyTorch MoE (argsort permute + torch._grouped_mm + index_add_, the same parameters); both eager and as a replayed
CUDA graph (which removes the launch overhead). Per op: the GPU time (events around each call, the calls issued
back to back and synchronised once, as the C++ benchmark times them) and the host time of the Python call (launch
overhead, no synchronisation). --json PATH also writes the rows as JSON.

--moonep: the MoonEP point (R=8 E=384 K=8 s=8192 H=7168 H'=2048), the data-path ops only (plan, dispatch, combine,
combine_backward, dispatch_backward, prefetch_weight, reduce_grad; bf16 weights): the MoE layer's fp32 parameters
would not fit. --cpp PATH (default: an `evenep` CLI found on PATH or under build*/tools/evenep/) also runs the C++
`evenep bench gpu-plan|dispatch|combine|prefetch|reduce --graph` first, at the same shape and on the same routing
(the Python run's topk_idx, passed as --routing .npy), and prints the Python op next to the C++ figure of the same
call (eager and CUDA-graph replay): reduce_grad_add_ (the in-place form, as the library's reduce) against `reduce`.
Every run checks its own results (combine of the dispatched rows against x * sum of the weights; with --cpp-check
also the C++ runs' --check).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time

import torch
import torch.nn.functional as F

import evenep

CPU_DEFAULTS = dict(ranks=4, experts=16, top_k=4, tokens=64, hidden=128, ffn=128, token_padding=16, iters=5)
CUDA_DEFAULTS = dict(ranks=8, experts=32, top_k=4, tokens=1024, hidden=2048, ffn=1024, token_padding=128, iters=20)
MOONEP = dict(ranks=8, experts=384, top_k=8, tokens=8192, hidden=7168, ffn=2048, token_padding=128, iters=10)
# Python op -> the C++ `evenep bench` subcommand and row of the same call (pull-mode weighted combine, one
# projection per copy for prefetch/reduce: the op moves one [H, H'] matrix per copy).
CPP_ROWS = {
    "plan": ("gpu-plan", "plan_fused_rows"),
    "dispatch": ("dispatch", "dispatch"),
    "combine": ("combine", "combine_pull_weighted"),
    "prefetch_weight": ("prefetch", "prefetch"),
    "reduce_grad_add_": ("reduce", "reduce"),
}


def _median_ms(fn, warmup, iters):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), min(times)


WARM_MS = 100.0  # GPU time run back to back before each CUDA row is timed (_cuda_ms)


def back_to_back_ms(fn, n):
    """GPU ms per call of n calls issued back to back, one CUDA event pair around them all (waited for)."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(n):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / n


def _cuda_ms(fn, warmup, iters):
    """GPU time per call (CUDA events, median and min) and the host time of issuing it (median), timed as the C++
    `evenep bench` times (perf/cuda/timing.cpp time_op): an event pair around each call, the calls issued back to
    back and synchronised once at the end. A call whose host side takes longer than its GPU work still shows it (the
    GPU then waits for the launch); a shorter one is hidden behind the previous call, as in a training step. (Waiting
    for each call before issuing the next would add the launch latency to every figure: about 0.6 ms for the replay
    of a captured dispatch at the MoonEP point on an H100, whose kernels take as long as the eager call's.)

    After the `warmup` calls, the calls go on back to back until WARM_MS of GPU time has passed: after the GPU idled
    (host work between rows, a graph capture) the first 20-35 ms of work run slower. On an H100 at the MoonEP point
    the first 4-7 dispatch or combine calls took 0.4-0.6 ms longer, eager and replayed alike; the C++ bench warms
    the GPU before its rows too (perf/cuda/plan.cpp, rank_compute.cpp)."""
    for _ in range(warmup):
        fn()
    warm = 0.0
    n = 1
    while warm < WARM_MS:
        warm += back_to_back_ms(fn, n) * n
        n *= 2
    events, host = [], []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        t0 = time.perf_counter()
        fn()
        host.append((time.perf_counter() - t0) * 1e3)
        b.record()
        events.append((a, b))
    torch.cuda.synchronize()
    gpu = [a.elapsed_time(b) for a, b in events]
    return statistics.median(gpu), min(gpu), statistics.median(host)


def _routing(kind, R, s, E, K, gen):
    idx = torch.rand(R * s, E, generator=gen).topk(K, dim=-1).indices.reshape(R, s, K)  # distinct, uniform
    if kind == "hot_expert":
        idx[..., 0] = 0
        idx[..., 1:] = torch.where(idx[..., 1:] == 0, torch.ones_like(idx[..., 1:]), idx[..., 1:])
    return idx


_GMM_COLUMN_MAJOR = []  # [bool] once known: whether torch._grouped_mm wants the 3-D operand column-major


def _gmm(a, b, offs):
    """torch._grouped_mm(a, b [G, K, N], offs) with b as given, or column-major where this torch requires it."""
    if not _GMM_COLUMN_MAJOR:
        try:
            out = torch._grouped_mm(a, b, offs=offs)
            _GMM_COLUMN_MAJOR.append(False)
            return out
        except RuntimeError:
            _GMM_COLUMN_MAJOR.append(True)
    if _GMM_COLUMN_MAJOR[0]:
        b = b.transpose(-2, -1).contiguous().transpose(-2, -1)
    return torch._grouped_mm(a, b, offs=offs)


def grouped_mm_moe(moe, x, topk_idx, topk_w):
    """The plain PyTorch MoE on one device: argsort permute, torch._grouped_mm (gate|up, down), index_add_ back.
    No host synchronisation (counts by scatter_add_), so it captures into a CUDA graph too. Entries must not be
    masked."""
    E, H = moe.num_experts, moe.hidden
    xf = x.reshape(-1, H).to(torch.bfloat16)
    flat = topk_idx.reshape(-1)
    order = torch.argsort(flat, stable=True)
    tok = order // topk_idx.shape[-1]
    counts = torch.zeros(E, dtype=torch.int32, device=x.device).scatter_add_(
        0, flat.to(torch.int64), torch.ones_like(flat, dtype=torch.int32))
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    w_gu = torch.cat([moe.w_gate, moe.w_up], dim=2).to(torch.bfloat16)
    gu = _gmm(xf[tok], w_gu, offs)
    g, u = gu.split(moe.ffn_hidden, dim=-1)
    h = (F.silu(g.float()) * u.float()).to(torch.bfloat16)
    y = _gmm(h, moe.w_down.to(torch.bfloat16), offs)
    y = y.float() * topk_w.reshape(-1)[order].unsqueeze(-1)
    out = torch.zeros(xf.shape[0], H, device=x.device, dtype=torch.float32).index_add_(0, tok, y)
    return out.reshape(x.shape).to(x.dtype)


def capture(step):
    """Captures step() into a CUDA graph after two warm-up calls on a side stream (allocations, autograd and
    optimizer state); returns (replay, what the captured call returned: static tensors updated by each replay)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = step()
    return g.replay, out


def find_cli():
    """The C++ `evenep` CLI: on PATH, else the newest build*/tools/evenep/evenep under the working directory."""
    found = shutil.which("evenep")
    if found:
        return found
    cands = [c for c in glob.glob("build*/tools/evenep/evenep") + glob.glob("build*/*/tools/evenep/evenep")
             if os.access(c, os.X_OK)]
    return max(cands, key=os.path.getmtime) if cands else None


def cpp_rows(cli, a, idx):
    """Runs the C++ benchmark of every op of CPP_ROWS at the bench's shape on the routing idx [R, s, K] (--graph;
    --check with --cpp-check); returns {row op: median ms}, with the graph rows as '<op>_graph'. Raises when a C++
    run fails or finds errors."""
    import numpy as np

    out = {}
    with tempfile.TemporaryDirectory() as d:
        routing = os.path.join(d, "routing.npy")
        np.save(routing, idx.to(torch.int32).cpu().numpy())
        shape = ["--R", a.ranks, "--E", a.experts, "--K", a.top_k, "--S", a.tokens, "--H", a.hidden,
                 "--ffn-hidden", a.ffn, "--tp", a.token_padding, "--routing", routing, "--projections", 1,
                 "--warmup", a.warmup, "--iters", a.iters, "--graph", "--policy", a.policy]
        shape += (["--slack", a.slack] if a.slack is not None else []) + (["--check"] if a.cpp_check else [])
        wanted = _wanted_ops(a)
        for sub in dict.fromkeys(c for op, (c, _) in CPP_ROWS.items() if wanted is None or op in wanted):
            _cpp_run(cli, sub, shape, d, out)
    return out


def _wanted_ops(a):
    """The op rows --ops names (a set), or None: all."""
    return None if a.ops is None else {o.strip() for o in a.ops.split(",") if o.strip()}


def _cpp_run(cli, sub, shape, d, out):
    """One `evenep bench <sub>` run; adds its rows' medians (ms) to out."""
    path = os.path.join(d, f"{sub}.json")
    cmd = [cli, "bench", sub, *map(str, shape), "--json", path]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {(r.stdout + r.stderr)[-2000:]}")
    with open(path) as f:
        for row in json.load(f)["rows"]:
            if row.get("wrong", 0) > 0:
                raise RuntimeError(f"C++ bench {sub}: {row['op']} has {row['wrong']} wrong results")
            out.setdefault(row["op"], row["median_us"] / 1e3)


def _check_data_path(buf, xb, idx, w, plan):
    """combine(dispatch(x)) = x * (sum of the token's unmasked weights), one bf16 rounding: the bench's self-check."""
    recv_x, _, _, h = buf.dispatch(xb, idx, w, plan)
    y = buf.combine(recv_x, h).float()
    ref = xb.float() * (w * (idx >= 0)).sum(-1, keepdim=True)
    err = ((y - ref).abs() / ref.abs().clamp_min(1e-3)).max().item()
    if not err <= 2 ** -7:
        raise RuntimeError(f"evenep.bench: combine(dispatch(x)) is off by {err:.3g} (relative), expected <= 2^-7")
    return err


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m evenep.bench", description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cpu")
    for name in ("ranks", "experts", "top-k", "tokens", "hidden", "ffn", "token-padding", "iters"):
        p.add_argument(f"--{name}", type=int, default=None)
    p.add_argument("--routing", choices=["random", "hot_expert"], default="random")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--no-graph", action="store_true", help="CUDA: skip the CUDA-graph replays")
    p.add_argument("--moonep", action="store_true", help="the MoonEP point, data-path ops only (CUDA)")
    p.add_argument("--ops-only", action="store_true", help="skip the MoE layer and the grouped GEMM ops")
    p.add_argument("--ops", default=None,
                   help="comma-separated op rows to time (e.g. plan,dispatch,combine: the MoonEP point's data path "
                        "without the expert tensors, which fits an 80 GB GPU); default: all")
    p.add_argument("--cpp", default=None, help="the C++ evenep CLI to compare with ('none': skip; default: found)")
    p.add_argument("--cpp-check", action="store_true", help="the C++ runs verify against the CPU oracle (slow)")
    p.add_argument("--policy", choices=["auto", "exact", "slack"], default="auto",
                   help="planner policy of the buffer and of the C++ runs (docs/auto.md; default auto, as Buffer's)")
    p.add_argument("--slack", type=float, default=None, help="the policy's budget (auto: the largest; default 0.1)")
    p.add_argument("--json", default=None, help="also write the rows to this file")
    a = p.parse_args(argv)
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    if a.moonep:
        a.ops_only = True
    wanted = _wanted_ops(a)
    if wanted is not None:  # before the C++ runs and the layer rows
        known = [o for o in OP_ROWS if not (a.ops_only and o in GEMM_OPS)]
        unknown = wanted - set(known)
        if unknown:
            raise SystemExit(f"python -m evenep.bench: --ops names {sorted(unknown)}, not among {sorted(known)}")
    for k, v in (MOONEP if a.moonep else CUDA_DEFAULTS if cuda else CPU_DEFAULTS).items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    R, E, K, s, H, Fh = a.ranks, a.experts, a.top_k, a.tokens, a.hidden, a.ffn
    gen = torch.Generator().manual_seed(0)
    idx = _routing(a.routing, R, s, E, K, gen)
    cpp = {}
    if cuda and a.cpp != "none":
        cli = a.cpp or find_cli()
        if cli:  # first: the C++ process needs the GPU's memory to itself
            cpp = cpp_rows(cli, a, idx)
        else:
            print("# no C++ evenep CLI found (--cpp PATH): the C++ columns are empty")

    buf = evenep.Buffer(E, K, s, H, virtual_ranks=R, ffn_hidden=Fh, token_padding=a.token_padding, device=dev,
                        policy=a.policy, slack=a.slack)
    idx = idx.to(dev)
    w = torch.rand(R, s, K, generator=gen).to(dev)
    x = torch.randn(R, s, H, generator=gen).to(dev)
    rows = []  # (what, median ms, min ms, host ms or None)

    def add(name, fn):
        if cuda:
            rows.append((name, *_cuda_ms(fn, a.warmup, a.iters)))
        else:
            rows.append((name, *_median_ms(fn, a.warmup, a.iters), None))

    if not a.ops_only:
        _layer_rows(a, buf, x, idx, w, add, cuda)
    xb = x.bfloat16()
    del x
    idx = idx.int()  # the library's index type: the ops then convert nothing (as the C++ calls)
    plan = buf.plan(idx)
    check_err = _check_data_path(buf, xb, idx, w, plan)
    _op_rows(a, buf, xb, idx, w, plan, add, cuda)
    buf.check()

    head = (f"# evenep.bench ({'CUDA ' + torch.cuda.get_device_name(dev) if cuda else 'CPU backend'}): R={R} E={E} "
            f"K={K} s={s} H={H} H'={Fh} tp={a.token_padding} NvS={buf.num_recv_rows} routing={a.routing} "
            f"policy={a.policy}{'' if a.slack is None else f' slack={a.slack:g}'} "
            f"iters={a.iters} torch {torch.__version__}; self-check combine(dispatch(x)) rel err {check_err:.2g}")
    print(head)
    if cuda:
        print("# GPU ms: CUDA events around each call, the calls issued back to back as the C++ bench issues them "
              "(median, min); host ms: issuing the call from Python; C++ ms: `evenep bench` median of the same call "
              "on the same routing, graph rows vs its _graph rows")
        print(f"{'what':<44}{'GPU ms':>10}{'min ms':>10}{'host ms':>10}{'C++ ms':>10}{'py/C++':>8}")
        for name, med, mn, host in rows:
            c = _cpp_of(name, cpp)
            tail = f"{c:>10.3f}{med / c:>8.3f}" if c else ""
            print(f"{name:<44}{med:>10.3f}{mn:>10.3f}{host:>10.3f}{tail}")
    else:
        print(f"{'what':<44}{'median ms':>12}{'min ms':>12}")
        for name, med, mn, _ in rows:
            print(f"{name:<44}{med:>12.3f}{mn:>12.3f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"config": head, "self_check_rel_err": check_err, "cpp_ms": cpp,
                       "rows": [dict(what=r[0], median_ms=r[1], min_ms=r[2], host_ms=r[3], cpp_ms=_cpp_of(r[0], cpp))
                                for r in rows]}, f, indent=1)
    return rows


def _cpp_of(name, cpp):
    """The C++ median (ms) of the row `op <op>[ graph]`, or None."""
    parts = name.split()
    if len(parts) < 2 or parts[0] != "op" or parts[1] not in CPP_ROWS:
        return None
    row = CPP_ROWS[parts[1]][1] + ("_graph" if parts[-1] == "graph" else "")
    return cpp.get(row)


def _layer_rows(a, buf, x, idx, w, add, cuda):
    dev, (E, K, H, Fh) = x.device, (a.experts, a.top_k, a.hidden, a.ffn)
    torch.manual_seed(0)
    moe = evenep.nn.MoE(H, Fh, E, K, buffer=buf).to(dev)
    ref = evenep.nn.TorchMoE(H, Fh, E, K).to(dev)
    ref.load_state_dict(moe.state_dict())
    xs = x.clone().requires_grad_()

    def layer(fn):
        def step():
            fn(xs).sum().backward()
        return step

    evenep_step = layer(lambda t: moe(t, routing=(idx, w)))
    if cuda:
        torch_step = layer(lambda t: grouped_mm_moe(moe, t, idx, w))
        torch_name = "torch (_grouped_mm)"
    else:
        torch_step = layer(lambda t: ref(t, routing=(idx, w)))
        torch_name = "torch (loop)"
    add("MoE fwd+bwd evenep", evenep_step)
    try:
        add(f"MoE fwd+bwd {torch_name}", torch_step)
    except RuntimeError as e:  # e.g. torch._grouped_mm unsupported on this GPU
        print(f"# reference skipped: {str(e).splitlines()[0]}")
        torch_step = None
    if cuda and not a.no_graph:
        for name, step in (("evenep", evenep_step), (torch_name, torch_step)):
            if step is None:
                continue
            try:
                add(f"MoE fwd+bwd {name} graph", capture(step)[0])
            except RuntimeError as e:
                print(f"# {name} graph skipped: {str(e).splitlines()[0]}")


GEMM_OPS = ("grouped_gemm fwd", "grouped_gemm dgrad", "grouped_gemm wgrad")  # not with --ops-only
EXPERT_OPS = ("prefetch_weight", "reduce_grad", "reduce_grad_add_") + GEMM_OPS
# The op rows of _op_rows, in its order (the names --ops takes).
OP_ROWS = ("plan", "dispatch", "combine", "combine_backward", "combine_backward+dispatch_backward", *EXPERT_OPS)


def _op_rows(a, buf, xb, idx, w, plan, add, cuda):
    dev, (R, E, s, H, Fh) = xb.device, (a.ranks, a.experts, a.tokens, a.hidden, a.ffn)
    ops = torch.ops.evenep
    wanted = _wanted_ops(a)
    recv_x, recv_w, _, h = buf.dispatch(xb, idx, w, plan)
    W = slots = zero_slots = home_grad = None
    if wanted is None or wanted & set(EXPERT_OPS):  # the expert tensors (56 GB at the MoonEP point) only when timed
        W = torch.randn(E, H, Fh, device=dev, dtype=torch.bfloat16 if a.ops_only else torch.float32)
        slots = buf.prefetch_weight(W, plan)
        zero_slots = torch.zeros(R, buf.num_slots, H, Fh, device=dev)
        home_grad = torch.zeros(E, H, Fh, device=dev)
    g = torch.randn(R, s, H, device=dev).bfloat16()
    calls = {
        "plan": lambda: buf.plan(idx),
        "dispatch": lambda: buf.dispatch(xb, idx, w, plan),
        "combine": lambda: buf.combine(recv_x, h),
        "combine_backward": lambda: ops.combine_backward(g, h.topk_weights, plan, h.dst, buf.id),
        # dispatch_backward leaves the buffer without a dispatch: timed with the combine_backward it follows
        "combine_backward+dispatch_backward": lambda: (
            ops.combine_backward(g, h.topk_weights, plan, h.dst, buf.id),
            ops.dispatch_backward(recv_x, recv_w, h.topk_weights, plan, h.dst, buf.id)),
        "prefetch_weight": lambda: buf.prefetch_weight(W, plan),
        "reduce_grad": lambda: buf.reduce_grad(zero_slots, plan),
        "reduce_grad_add_": lambda: buf.reduce_grad_add_(home_grad, zero_slots, plan),
    }
    if not a.ops_only:
        dy = torch.randn(R, buf.num_recv_rows, Fh, device=dev).bfloat16()
        calls.update({
            "grouped_gemm fwd": lambda: buf.grouped_gemm(recv_x, W, slots, plan),
            "grouped_gemm dgrad": lambda: ops.grouped_gemm_dgrad(dy, W, slots, plan, buf.id),
            "grouped_gemm wgrad": lambda: ops.grouped_gemm_wgrad(recv_x, dy, plan, buf.id),
        })
    assert tuple(calls) == OP_ROWS[:len(calls)], "OP_ROWS names the calls of _op_rows"
    if wanted is not None:  # checked in main, before anything ran
        calls = {k: v for k, v in calls.items() if k in wanted}
    # The dense reduce_grad (an [E, a, b] fp32 result: 22.5 GB at the MoonEP point) runs after the graph replays, so
    # that its heavy writes do not precede the rows compared with the C++ figures.
    last = tuple(k for k in ("reduce_grad",) if k in calls)
    for name, fn in calls.items():
        if name in last:
            continue
        if name == "combine":
            buf.dispatch(xb, idx, w, plan)  # the buffer holds h: no re-dispatch inside the timed calls
        add(f"op {name}", fn)
    if cuda and not a.no_graph:
        torch.cuda.empty_cache()  # the MoonEP point: the graphs' private pools need the memory eager calls cached
        # CUDA-graph replay of the ops the C++ benchmark times (no launch overhead); plan last: a plan captured in a
        # graph replaces the resident plan without a copy.
        for name in ("dispatch", "combine", "prefetch_weight", "reduce_grad_add_", "plan"):
            if name not in calls:
                continue
            try:
                buf.dispatch(xb, idx, w, plan)
                add(f"op {name} graph", capture(calls[name])[0])
            except RuntimeError as e:
                print(f"# op {name} graph skipped: {str(e).splitlines()[0]}")
    for name in last:
        add(f"op {name}", calls[name])


if __name__ == "__main__":
    main()
