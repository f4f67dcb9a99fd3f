#!/usr/bin/env python3
"""PyTorch anchors of `evenep bench gemm` (issue 5): torch._grouped_mm with the same shapes and group offsets, and a
dense torch.matmul (cuBLAS) of the same FLOPs (rows x in x out), per distribution, projection and op.

  python3 gemm_anchor.py --offsets offsets.json [--evenep bench.json] [--json anchor.json] [--iters 10]

offsets.json comes from `evenep bench gemm --offsets-json`: {"G", "H", "ffn_hidden", "offsets": {dist: [G ends]}}.
With --evenep, prints one table: EvenEP's kernels' TFLOP/s (hand-written wgmma fixed / load-aware, mma, CUTLASS
cooperative and ping-pong load-aware) next to the anchors, and the ratios; then, when the bench ran fp8_fwd /
fp8_dgrad, the FP8 block-scaled kernel with CUTLASS's consumer loop (fp8) and with EvenEP's overlapped one (fp8_ov),
the one the library's default runs (auto: fp8_ov where the output has more columns than the inner dimension,
Fp8Mainloop::kAuto), the 128 x 256 tile candidate (wide, Fp8Mainloop::kOverlappedWide),
CUTLASS's unscaled FP8 anchor and the bf16 kernels on the same rows. For wgrad it also times the like-for-like anchor "gmm+f32": the
grouped product in fp32 added into fp32 per-expert gradients (EvenEP's wgrad accumulates into fp32 gradients;
plain _grouped_mm writes a fresh bf16 result).
TFLOP/s = 2 * rows * in * out / median time, rows = the last offset (padded rows), as in the C++ benchmark.
"""
import argparse
import json
import sys

import torch


def median_ms(fn, warmup, iters):
    for _ in range(warmup):
        fn()
    start = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    end = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        start[i].record()
        fn()
        end[i].record()
    torch.cuda.synchronize()
    t = sorted(s.elapsed_time(e) for s, e in zip(start, end))
    return t[len(t) // 2]


def warm_gpu(seconds, dev):
    """Dense bf16 matmuls back to back for `seconds`: clocks out of the idle state before anything is timed (the C++
    benchmark does the same, perf::warm_gpu)."""
    if seconds <= 0:
        return
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    spent = 0.0
    while spent < seconds * 1e3:
        start.record()
        for _ in range(10):
            a @ a
        end.record()
        torch.cuda.synchronize()
        spent += start.elapsed_time(end)


def grouped_operand(x, w, offs):
    """w [G, K, N] as torch._grouped_mm accepts it: as given if it runs, else column-major (the transpose of a
    contiguous [G, N, K]); the conversion happens here, outside the timed region."""
    try:
        torch._grouped_mm(x, w, offs=offs)
        return w
    except RuntimeError:
        return w.transpose(-2, -1).contiguous().transpose(-2, -1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--offsets", required=True)
    ap.add_argument("--evenep", default="")
    ap.add_argument("--json", default="")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--ops", nargs="*", default=["fwd", "dgrad", "wgrad", "wgrad_set"])
    ap.add_argument("--warm-seconds", type=float, default=1.0, help="GPU warm-up before the first timing")
    args = ap.parse_args()
    spec = json.load(open(args.offsets))
    G, H, F = spec["G"], spec["H"], spec["ffn_hidden"]
    dev = torch.device("cuda")
    torch.manual_seed(0)
    max_rows = max(v[-1] for v in spec["offsets"].values())
    wide = max(H, F)
    xbuf = (torch.rand(max_rows * wide, device=dev, dtype=torch.float32) * 2 - 1).to(torch.bfloat16)
    wbuf = ((torch.rand(G * H * F, device=dev, dtype=torch.float32) * 2 - 1) / 32).to(torch.bfloat16)
    rows_out = []
    print(f"torch {torch.__version__}, device {torch.cuda.get_device_name()}", flush=True)
    warm_gpu(args.warm_seconds, dev)
    for dist, ends in spec["offsets"].items():
        rows = ends[-1]
        offs = torch.tensor(ends, device=dev, dtype=torch.int32)
        for proj, din, dout in (("gate_up", H, F), ("down", F, H)):
            w = wbuf.view(G, din, dout)  # W_g [in, out]
            for op in args.ops:
                flops = 2.0 * rows * din * dout
                rec = {"dist": dist, "proj": proj, "op": op, "rows": rows}
                if op in ("wgrad", "wgrad_set"):  # dW_g = x_g^T dy_g: 2D x 2D with offsets along the rows
                    x = xbuf[: rows * din].view(rows, din)
                    dy = xbuf[: rows * dout].view(rows, dout)
                    try:
                        ms = median_ms(lambda: torch._grouped_mm(x.t(), dy, offs=offs), args.warmup, args.iters)
                        rec["grouped_mm_tflops"] = flops / (ms * 1e-3) / 1e12
                    except Exception as e:  # noqa: BLE001 - report and continue
                        rec["grouped_mm_error"] = str(e)[:200]
                    # Like for like with EvenEP's wgrad (dW += into fp32 gradients): the grouped product in fp32
                    # added into fp32 per-expert gradients, as a training step with fp32 main gradients does.
                    try:
                        g32 = torch.zeros(G, din, dout, device=dev, dtype=torch.float32)

                        def acc32():
                            try:
                                part = torch._grouped_mm(x.t(), dy, offs=offs, out_dtype=torch.float32)
                            except (TypeError, RuntimeError):  # out_dtype must match the inputs in some versions
                                part = torch._grouped_mm(x.t(), dy, offs=offs).float()
                            g32.add_(part)

                        ms = median_ms(acc32, args.warmup, args.iters)
                        rec["grouped_mm_acc32_tflops"] = flops / (ms * 1e-3) / 1e12
                        del g32
                    except Exception as e:  # noqa: BLE001 - report and continue
                        rec["grouped_mm_acc32_error"] = str(e)[:200]
                    ms = median_ms(lambda: torch.matmul(x.t(), dy), args.warmup, args.iters)
                    rec["dense_tflops"] = flops / (ms * 1e-3) / 1e12
                    rows_out.append(rec)
                    print(json.dumps(rec), flush=True)
                    continue
                K, N = (din, dout) if op == "fwd" else (dout, din)
                x = xbuf[: rows * K].view(rows, K)
                b = w if op == "fwd" else w.transpose(-2, -1)  # [G, K, N]
                try:
                    bg = grouped_operand(x, b, offs)
                    rec["grouped_mm_b_strides"] = list(bg.stride())
                    ms = median_ms(lambda: torch._grouped_mm(x, bg, offs=offs), args.warmup, args.iters)
                    rec["grouped_mm_tflops"] = flops / (ms * 1e-3) / 1e12
                except Exception as e:  # noqa: BLE001 - report and continue
                    rec["grouped_mm_error"] = str(e)[:200]
                bd = b[0].contiguous()
                ms = median_ms(lambda: torch.matmul(x, bd), args.warmup, args.iters)
                rec["dense_tflops"] = flops / (ms * 1e-3) / 1e12
                rows_out.append(rec)
                print(json.dumps(rec), flush=True)
    if args.json:
        json.dump({"torch": torch.__version__, "rows": rows_out}, open(args.json, "w"), indent=1)
    if args.evenep:
        ev = json.load(open(args.evenep))["rows"]
        key = lambda r: (r["dist"], r["proj"], r["op"])  # noqa: E731
        ours = {}
        for r in ev:
            ours.setdefault(key(r), {})[r["schedule"]] = r["tflops"]
        print()
        print(f"{'dist':<20} {'proj':<8} {'op':<9} {'fixed':>7} {'l-aware':>7} {'mma':>7} {'cutlass':>7} "
              f"{'cut_pp':>7} {'_grp_mm':>7} {'dense':>7} {'la/gmm':>7} {'cut/gmm':>7} {'pp/gmm':>7} "
              f"{'la/dense':>8} {'cut/dns':>7} {'gmm+f32':>7} {'la/gmm32':>8} {'cut/g32':>7}")
        nan = float("nan")
        for r in rows_out:
            o = ours.get(key(r), {})
            fx = o.get("wgmma/fixed", o.get("fixed", nan))
            la = o.get("wgmma/load_aware", o.get("load_aware", nan))
            mm = o.get("mma/load_aware", nan)
            ct = o.get("cutlass/load_aware", nan)
            pp = o.get("cutlass_pingpong/load_aware", nan)
            gm = r.get("grouped_mm_tflops", nan)
            dn = r["dense_tflops"]
            g32 = r.get("grouped_mm_acc32_tflops", nan)
            print(f"{r['dist']:<20} {r['proj']:<8} {r['op']:<9} {fx:7.1f} {la:7.1f} {mm:7.1f} {ct:7.1f} {pp:7.1f} "
                  f"{gm:7.1f} {dn:7.1f} {la / gm:7.2f} {ct / gm:7.2f} {pp / gm:7.2f} {la / dn:8.2f} {ct / dn:7.2f} "
                  f"{g32:7.1f} {la / g32:8.2f} {ct / g32:7.2f}")
        fp8_keys = sorted({k for k in ours if k[2].startswith("fp8_")})
        if fp8_keys:  # FP8 block-scaled against CUTLASS's unscaled FP8 and the bf16 kernels on the same rows
            print()
            print(f"{'dist':<20} {'proj':<8} {'op':<9} {'fp8':>7} {'fp8_ov':>7} {'auto':>7} {'wide':>7} {'fp8_uns':>7} "
                  f"{'bf16_cut':>8} {'bf16_la':>7} {'ov/fp8':>7} {'wid/aut':>7} {'aut/uns':>7} {'aut/cut':>7} "
                  f"{'aut/la':>7}")
            for k in fp8_keys:
                o = ours[k]
                bf = ours.get((k[0], k[1], k[2][len("fp8_"):]), {})
                f8 = o.get("cutlass_fp8/load_aware", nan)
                ov = o.get("cutlass_fp8_overlap/load_aware", nan)
                un = o.get("cutlass_fp8_unscaled/load_aware", nan)
                wd = o.get("cutlass_fp8_wide/load_aware", nan)
                ct = bf.get("cutlass/load_aware", nan)
                la = bf.get("wgmma/load_aware", nan)
                din, dout = (H, F) if k[1] == "gate_up" else (F, H)
                n, kd = (dout, din) if k[2] == "fp8_fwd" else (din, dout)
                au = ov if n > kd else f8  # Fp8Mainloop::kAuto: EvenEP's loop where N > K
                print(f"{k[0]:<20} {k[1]:<8} {k[2]:<9} {f8:7.1f} {ov:7.1f} {au:7.1f} {wd:7.1f} {un:7.1f} {ct:8.1f} "
                      f"{la:7.1f} {ov / f8:7.2f} {wd / au:7.2f} {au / un:7.2f} {au / ct:7.2f} {au / la:7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
