#!/usr/bin/env python3
"""The PyTorch anchor of the GPU benchmarks: what a PyTorch user writes in one process for the same routing.

For rank 0's routing of each benchmark point (written by `evenep bench gpu-suite --npy-dir DIR` as
routing_<shape>_maxvio<v>.npy, int32 [1, S, K]) and one rank-sized batch x [S, H] bf16:
  permute    order = argsort(topk_idx.flatten(), stable); xp = x.index_select(0, order // K)
  unpermute  out = zeros(S, H).index_add_(0, order // K, yp * w.flatten()[order, None])   (weighted)
Times: CUDA events around each step, median of --iters runs after --warmup runs. Writes one JSON row per point.
"""
import argparse
import glob
import json
import os
import re

import numpy as np
import torch

HIDDEN = {"moonep": 7168, "k3": 3584, "custom": 7168}


def median_us(fn, warmup, iters):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000.0)
    times.sort()
    return times[len(times) // 2], times[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--npy-dir", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    rows = []
    dev = torch.device("cuda")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
    print(f"{'shape':<8} {'maxvio':>7} {'S':>6} {'K':>3} {'H':>6} {'permute us':>11} {'unpermute us':>13}")
    for path in sorted(glob.glob(os.path.join(args.npy_dir, "routing_*_maxvio*.npy"))):
        m = re.match(r"routing_(\w+?)_maxvio([0-9.]+)\.npy", os.path.basename(path))
        shape, maxvio = m.group(1), float(m.group(2))
        idx = torch.from_numpy(np.load(path)[0].astype(np.int64)).to(dev)
        S, K = idx.shape
        H = HIDDEN.get(shape, 7168)
        g = torch.Generator(device=dev).manual_seed(1)
        x = torch.randn(S, H, device=dev, dtype=torch.bfloat16, generator=g)
        w = torch.rand(S, K, device=dev, dtype=torch.float32, generator=g)
        state = {}

        def permute():
            order = torch.argsort(idx.flatten(), stable=True)
            src = order // K
            state["yp"] = x.index_select(0, src)
            state["order"], state["src"] = order, src

        permute()

        def unpermute():
            ws = w.flatten()[state["order"]].unsqueeze(1).to(torch.bfloat16)
            out = torch.zeros(S, H, device=dev, dtype=torch.bfloat16)
            out.index_add_(0, state["src"], state["yp"] * ws)
            state["out"] = out

        p50, pmin = median_us(permute, args.warmup, args.iters)
        u50, umin = median_us(unpermute, args.warmup, args.iters)
        print(f"{shape:<8} {maxvio:>7.2f} {S:>6} {K:>3} {H:>6} {p50:>11.1f} {u50:>13.1f}")
        rows.append({"shape_name": shape, "target_maxvio": maxvio, "S": S, "K": K, "H": H,
                     "permute_median_us": p50, "permute_min_us": pmin,
                     "unpermute_median_us": u50, "unpermute_min_us": umin})
    with open(args.json, "w") as f:
        json.dump({"torch": torch.__version__, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
