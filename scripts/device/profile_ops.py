"""The CUDA ops of evenep.Buffer at the MoonEP point (R=8 E=384 K=8 s=8192 H=7168 H'=2048, exact policy), eagerly and
as CUDA-graph replays: per op the CUDA-event time of one call waited for (median/min/max), the device time of each
kernel it launches (torch.profiler, 5 calls), and the time per call of 10 back-to-back calls. It separates what a
call costs on the GPU from the launch latency a per-call synchronisation adds (docs/python.md, "Benchmark on the GPU").

On the GPU machine, with the extension built (scripts/device/run_checks.sh or run_python.sh):
    PYTHONPATH=python python3 scripts/device/profile_ops.py [--ops dispatch,combine,plan]
Fits an 80 GB GPU (no expert tensors)."""

import argparse
import statistics
import sys

import torch
from torch.profiler import ProfilerActivity, profile

import evenep
from evenep.bench import _routing, back_to_back_ms, capture

R, E, K, S, H, F = 8, 384, 8, 8192, 7168, 2048


def events(fn, n=10):
    """CUDA-event ms of n calls, each waited for: (median, min, max)."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    t = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        t.append(a.elapsed_time(b))
    return statistics.median(t), min(t), max(t)


def back_to_back(fn, n=10):
    """ms per call of n calls issued back to back (one event pair around all)."""
    torch.cuda.synchronize()
    return back_to_back_ms(fn, n)


def kernels(fn, tag, n=5):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA], acc_events=True) as p:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    for e in p.key_averages():
        if e.device_time_total > 0:
            print(f"   {tag:<16}{e.key[:70]:<72}{e.count:>4}{e.device_time_total / e.count:>10.1f} us")


def main(argv=None):
    ap = argparse.ArgumentParser(prog="profile_ops.py", description=__doc__.split("\n")[0])
    ap.add_argument("--ops", default="dispatch,combine,plan", help="comma-separated: dispatch, combine, plan")
    a = ap.parse_args(argv)
    gen = torch.Generator().manual_seed(0)
    idx = _routing("random", R, S, E, K, gen).int().cuda()
    w = torch.rand(R, S, K, generator=gen).cuda()
    x = torch.randn(R, S, H, generator=gen).cuda().bfloat16()
    buf = evenep.Buffer(E, K, S, H, virtual_ranks=R, ffn_hidden=F, token_padding=128, device="cuda", policy="exact")
    plan = buf.plan(idx)
    recv_x, _, _, h = buf.dispatch(x, idx, w, plan)
    calls = {"plan": lambda: buf.plan(idx), "dispatch": lambda: buf.dispatch(x, idx, w, plan),
             "combine": lambda: buf.combine(recv_x, h)}
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}")
    torch.cuda.empty_cache()
    for name in a.ops.split(","):  # plan last: a plan captured in a graph replaces the resident plan without a copy
        buf.dispatch(x, idx, w, plan)
        print(name, "eager ms med/min/max", ["%.3f" % v for v in events(calls[name])],
              "back to back %.3f" % back_to_back(calls[name]))
        kernels(calls[name], name + " eager")
        buf.dispatch(x, idx, w, plan)
        replay, _ = capture(calls[name])
        print(name, "graph ms med/min/max", ["%.3f" % v for v in events(replay)],
              "back to back %.3f" % back_to_back(replay))
        kernels(replay, name + " graph")
        del replay
        torch.cuda.empty_cache()
    buf.check()
    return 0


if __name__ == "__main__":
    sys.exit(main())
