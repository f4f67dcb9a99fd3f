#!/usr/bin/env python3
"""Calibrates the ViT cost model of `evenep pipeline` (include/evenep/pipeline/vit_calibration.hpp, docs/pipeline.md).

Times one real ViT block on one image of n patches and fits  forward(n) = a*n + c*n^2 + k  seconds by weighted
least squares (weights 1/t: relative error, the times span three orders of magnitude; coefficients >= 0).

Block (stated, change with the flags): hidden 1280, 16 heads (head dim 80), MLP 4x = 5120 with GELU (tanh),
pre-LayerNorm, qkv and output projections with bias, attention by torch.nn.functional.scaled_dot_product_attention
(non-causal: a ViT), residuals; bf16 weights and activations; patches 256 ... 16384 (small images batched).
Also times forward + backward (grad of the input and the weights) and reports backward / forward, which the C++
model fixes at kVitBackwardRatio = 2.

Timing: CUDA events around each call, median of --iters runs after --warmup runs (CPU: perf_counter). Small images
are timed as a batch of B = ceil(--batch-patches / n) images in one call and reported per image, so that launch
overhead (which a pipeline with many images per micro-batch amortises the same way) does not swamp them.

On the GPU machine (torch 2.11, no network):
    python3 scripts/device/vit_calibrate.py --out vit_calibration.json
then paste the three printed `inline constexpr` lines into include/evenep/pipeline/vit_calibration.hpp.
Here (CPU, smoke test):  python3 scripts/device/vit_calibrate.py --device cpu --quick --out /tmp/vit.json
Without torch (numpy):   python3 scripts/device/vit_calibrate.py --self-test   (checks the fit on synthetic times)
"""
import argparse
import json
import sys
import time

GPU_PATCHES = [256, 512, 1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384]
QUICK_PATCHES = [64, 128, 256, 512]


def fit(patches, seconds):
    """Weighted least squares of t = a*n + c*n^2 + k with weights 1/t (relative error: the times span three orders
    of magnitude), all coefficients >= 0: a term whose unconstrained fit is negative is dropped and the rest refit.
    Returns (a, c, k)."""
    import numpy as np

    n = np.asarray(patches, dtype=np.float64)
    t = np.asarray(seconds, dtype=np.float64)
    columns = {"a": n, "c": n * n, "k": np.ones_like(n)}
    active = ["a", "c", "k"]
    while True:
        m = np.stack([columns[name] for name in active], axis=1) / t[:, None]
        coef, *_ = np.linalg.lstsq(m, np.ones_like(t), rcond=None)
        if (coef >= 0).all() or len(active) == 1:
            break
        active.pop(int(np.argmin(coef)))
    got = dict(zip(active, coef))
    return float(got.get("a", 0.0)), float(got.get("c", 0.0)), float(got.get("k", 0.0))


def model(a, c, k, n):
    return a * n + c * n * n + k


def self_test():
    truth = (6.0e-8, 1.3e-11, 3.0e-5)
    patches = GPU_PATCHES
    seconds = [model(*truth, n) * (1 + 0.01 * ((i % 3) - 1)) for i, n in enumerate(patches)]  # +-1% noise
    a, c, k = fit(patches, seconds)
    for got, want, name in zip((a, c, k), truth, "ack"):
        rel = abs(got - want) / want
        print(f"{name}: fitted {got:.4g}, true {want:.4g}, relative error {rel:.3f}")
        if rel > 0.1:
            sys.exit(f"self-test failed: {name}")
    print("self-test: PASS")


def make_block(torch, hidden, heads, device, dtype):
    nn = torch.nn
    F = torch.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(hidden)
            self.qkv = nn.Linear(hidden, 3 * hidden)
            self.proj = nn.Linear(hidden, hidden)
            self.ln2 = nn.LayerNorm(hidden)
            self.fc1 = nn.Linear(hidden, 4 * hidden)
            self.fc2 = nn.Linear(4 * hidden, hidden)

        def forward(self, x):  # x [b, n, hidden]
            b, n, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, n, 3, heads, hidden // heads).permute(2, 0, 3, 1, 4)
            o = F.scaled_dot_product_attention(q, k, v)  # [b, heads, n, head_dim]
            x = x + self.proj(o.transpose(1, 2).reshape(b, n, hidden))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))

    return Block().to(device=device, dtype=dtype)


def median_seconds(torch, fn, device, warmup, iters):
    for _ in range(warmup):
        fn()
    times = []
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        for _ in range(iters):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) / 1000.0)
    else:
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="write the coefficients and the measurements as JSON here")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    ap.add_argument("--hidden", type=int, default=1280)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--patches", type=int, nargs="*", help="patch counts (default 256 ... 16384; --quick: 64 ... 512)")
    ap.add_argument("--batch-patches", type=int, default=32768,
                    help="images of n patches are timed B = ceil(this / n) at a time, reported per image")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--quick", action="store_true", help="small sizes, float32 on CPU, few iterations (smoke test)")
    ap.add_argument("--self-test", action="store_true", help="check the fit on synthetic times (no torch needed)")
    args = ap.parse_args()
    if args.self_test:
        self_test()
        return
    if not args.out:
        ap.error("--out FILE is required")

    import torch

    device = args.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("vit_calibrate: no CUDA device (use --device cpu --quick for a smoke test)")
    dtype = torch.float32 if (args.quick and device == "cpu") else torch.bfloat16
    patches = args.patches or (QUICK_PATCHES if args.quick else GPU_PATCHES)
    warmup, iters = (1, 3) if args.quick else (args.warmup, args.iters)
    torch.manual_seed(0)
    block = make_block(torch, args.hidden, args.heads, device, dtype)
    name = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
    print(f"ViT block: hidden {args.hidden}, {args.heads} heads, MLP {4 * args.hidden}, {dtype}, SDPA, on {name}")
    print(f"{'patches':>8} {'batch':>6} {'fwd ms':>10} {'fwd+bwd ms':>11} {'bwd/fwd':>8}   (per image)")
    fwd, bwd_ratio, batches = [], [], []
    for n in patches:
        b = max(1, -(-args.batch_patches // n))
        x = torch.randn(b, n, args.hidden, device=device, dtype=dtype)
        with torch.no_grad():
            t_f = median_seconds(torch, lambda: block(x), device, warmup, iters) / b
        xg = x.clone().requires_grad_(True)
        dy = torch.randn_like(x)

        def step():
            block.zero_grad(set_to_none=True)
            block(xg).backward(dy)

        t_fb = median_seconds(torch, step, device, warmup, iters) / b
        fwd.append(t_f)
        batches.append(b)
        bwd_ratio.append((t_fb - t_f) / t_f)
        print(f"{n:>8} {b:>6} {t_f * 1e3:>10.4f} {t_fb * 1e3:>11.4f} {bwd_ratio[-1]:>8.2f}")

    a, c, k = fit(patches, fwd)
    print(f"\nfit forward(n) = a*n + c*n^2 + k:  a = {a:.4g} s/patch, c = {c:.4g} s/patch^2, k = {k:.4g} s")
    print(f"{'patches':>8} {'measured ms':>12} {'fitted ms':>10} {'rel err':>8}")
    max_rel = 0.0
    for n, t in zip(patches, fwd):
        f = model(a, c, k, n)
        max_rel = max(max_rel, abs(f - t) / t)
        print(f"{n:>8} {t * 1e3:>12.4f} {f * 1e3:>10.4f} {(f - t) / t:>+8.3f}")
    ratios = sorted(bwd_ratio)
    print(f"max relative error {max_rel:.3f}; backward/forward median {ratios[len(ratios) // 2]:.2f} "
          f"(the C++ model uses 2)")
    print("\n// paste into include/evenep/pipeline/vit_calibration.hpp:")
    print(f"inline constexpr double kVitCostA = {a:.4g};  // seconds per patch (projections + MLP)")
    print(f"inline constexpr double kVitCostC = {c:.4g};  // seconds per patch^2 (attention)")
    print(f"inline constexpr double kVitCostK = {k:.4g};   // seconds per call (launch overhead)")
    result = {
        "block": {"hidden": args.hidden, "heads": args.heads, "mlp": 4 * args.hidden, "dtype": str(dtype),
                  "attention": "scaled_dot_product_attention"},
        "device": name,
        "torch": torch.__version__,
        "patches": patches,
        "batch": batches,
        "forward_s": fwd,
        "backward_over_forward": bwd_ratio,
        "fit": {"a": a, "c": c, "k": k, "max_rel_error": max_rel},
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
