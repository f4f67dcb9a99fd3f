#!/usr/bin/env python3
"""Train a small MoE transformer LM on synthetic data with EvenEP's MoE layer or the plain PyTorch one.

    python examples/train_moe.py --backend evenep --steps 50
    python examples/train_moe.py --backend reference --steps 50
    python examples/train_moe.py --steps 50 --trace trace.npy   # record the router trace [T, L, R, E]
    python examples/train_moe.py --fp8 --hidden 128 --steps 200   # the FP8 path (H, H' multiples of 128)
    python examples/train_moe.py --compare-fp8 --hidden 128 --steps 200   # bf16 then FP8, final losses compared

The data: sequences of a fixed random "grammar" (next token = table[prev token], with 10% noise), so the loss
falls well below log(vocab). Tokens of a batch are split evenly over the virtual ranks ([R, s, H] layout of
evenep.nn.MoE). Both back-ends start from the same weights (same seed) and see the same batches; their losses
agree within bf16 noise (the EvenEP path stores bf16 between its GEMMs). Prints loss and tokens/s per step.
"""

from __future__ import annotations

import argparse
import math
import time

import torch
import torch.nn.functional as F
from torch import nn

import evenep


class Block(nn.Module):
    def __init__(self, args, buffer):
        super().__init__()
        H = args.hidden
        self.ln1, self.ln2 = nn.LayerNorm(H), nn.LayerNorm(H)
        self.attn = nn.MultiheadAttention(H, args.heads, batch_first=True)
        if args.backend == "evenep":
            self.moe = evenep.nn.MoE(H, args.ffn, args.experts, args.top_k, buffer=buffer, router=args.router,
                                     fp8=args.fp8)
        else:
            self.moe = evenep.nn.TorchMoE(H, args.ffn, args.experts, args.top_k, router=args.router)
        self.ranks = args.ranks

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        B, T, H = x.shape
        tokens = self.ln2(x).reshape(self.ranks, B * T // self.ranks, H)  # [R, s, H]
        return x + self.moe(tokens).reshape(B, T, H)


class MoeLM(nn.Module):
    def __init__(self, args, buffer):
        super().__init__()
        self.embed = nn.Embedding(args.vocab, args.hidden)
        self.pos = nn.Parameter(torch.randn(args.seq, args.hidden) * 0.02)
        self.blocks = nn.ModuleList(Block(args, buffer) for _ in range(args.layers))
        self.ln = nn.LayerNorm(args.hidden)
        self.head = nn.Linear(args.hidden, args.vocab, bias=False)

    def forward(self, tokens):
        T = tokens.shape[1]
        mask = torch.triu(torch.full((T, T), float("-inf"), device=tokens.device), diagonal=1)
        x = self.embed(tokens) + self.pos[:T]
        for b in self.blocks:
            x = b(x, mask)
        return self.head(self.ln(x))


def batches(args, device):
    g = torch.Generator().manual_seed(args.seed + 1)
    table = torch.randint(0, args.vocab, (args.vocab,), generator=g)
    while True:
        seq = torch.empty(args.batch, args.seq + 1, dtype=torch.long)
        seq[:, 0] = torch.randint(0, args.vocab, (args.batch,), generator=g)
        for t in range(args.seq):
            noise = torch.rand(args.batch, generator=g) < 0.1
            seq[:, t + 1] = torch.where(noise, torch.randint(0, args.vocab, (args.batch,), generator=g),
                                        table[seq[:, t]])
        yield seq[:, :-1].to(device), seq[:, 1:].to(device)


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", choices=["evenep", "reference"], default="evenep")
    p.add_argument("--device", default="cpu")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--ranks", type=int, default=4, help="virtual EP ranks")
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--ffn", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--vocab", type=int, default=128)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--router", choices=["softmax", "sigmoid"], default="softmax")
    p.add_argument("--token-padding", type=int, default=16)
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fp8", action="store_true",
                   help="the FP8 path (evenep.Buffer(fp8=True), evenep.nn.MoE(fp8=True); CPU, or --device cuda "
                        "with the CUTLASS kernels (H100/H200); hidden and ffn multiples of 128; docs/python.md, FP8)")
    p.add_argument("--ue8m0", action="store_true", help="with --fp8: power-of-two (UE8M0) scales")
    p.add_argument("--bf16-partials", action="store_true",
                   help="combine's multi-entry partial sums cross as bf16 (evenep.Buffer(bf16_partials=True), upstream "
                        "MoonEP's format: fewer combine bytes, one more rounding); with --compare-fp8, in both runs")
    p.add_argument("--compare-fp8", action="store_true",
                   help="run the bf16 and then the FP8 path from the same weights on the same batches and print both "
                        "final losses (and the mean of the last 10 steps) with their relative difference")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--trace", metavar="F.npy",
                   help="record every step's router histograms (int32 [steps, layers, ranks, experts], docs/traces.md;"
                        " replay: evenep simulate --trace F.npy --K TOP_K --S BATCH*SEQ/RANKS)")
    args = p.parse_args(argv)
    if args.trace and args.backend != "evenep":
        p.error("--trace records the plans of --backend evenep")
    if (args.fp8 or args.compare_fp8 or args.ue8m0 or args.bf16_partials) and args.backend != "evenep":
        p.error("--fp8, --ue8m0, --bf16-partials and --compare-fp8 run --backend evenep")
    if args.ue8m0 and not (args.fp8 or args.compare_fp8):
        p.error("--ue8m0 needs --fp8 (or --compare-fp8)")
    if (args.fp8 or args.compare_fp8) and (args.hidden % 128 or args.ffn % 128):
        p.error(f"--fp8 needs --hidden and --ffn multiples of 128 (got {args.hidden} and {args.ffn}): one scale per "
                "128 channels")
    return args


def main(argv=None):
    args = parse(argv)
    if args.compare_fp8:
        return compare_fp8(args)
    return train(args)


def compare_fp8(args):
    """The bf16 run, then the FP8 run (same seed: same weights and batches); returns both loss lists."""
    runs = {}
    for fp8 in (False, True):
        run = argparse.Namespace(**{**vars(args), "fp8": fp8, "ue8m0": fp8 and args.ue8m0, "compare_fp8": False})
        runs[fp8] = train(run)
    b, f = runs[False], runs[True]
    tail = min(10, len(b))
    mb, mf = sum(b[-tail:]) / tail, sum(f[-tail:]) / tail
    print(f"after {len(b)} steps: bf16 loss {b[-1]:.4f}, fp8 loss {f[-1]:.4f} ({(f[-1] - b[-1]) / b[-1]:+.2%}); "
          f"mean of the last {tail} steps: bf16 {mb:.4f}, fp8 {mf:.4f} ({(mf - mb) / mb:+.2%})")
    return b, f


def train(args):
    device = torch.device(args.device)
    tokens_per_rank = args.batch * args.seq // args.ranks
    buffer = None
    if args.backend == "evenep":
        buffer = evenep.Buffer(args.experts, args.top_k, tokens_per_rank, args.hidden, virtual_ranks=args.ranks,
                               ffn_hidden=args.ffn, token_padding=args.token_padding, device=device, fp8=args.fp8,
                               ue8m0=args.ue8m0, bf16_partials=args.bf16_partials)
    if args.trace:
        buffer.record_trace(args.trace, layers=args.layers)
    torch.manual_seed(args.seed)
    model = MoeLM(args, buffer).to(device)
    step_fn = torch.compile(model) if args.compile else model
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    data = batches(args, device)
    losses = []
    t_start = None
    for step in range(args.steps):
        x, y = next(data)
        t0 = time.perf_counter()
        loss = F.cross_entropy(step_fn(x).reshape(-1, args.vocab), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        dt = time.perf_counter() - t0
        if step == 1:
            t_start = time.perf_counter() - dt  # tokens/s over steps >= 1 (step 0 warms up)
        losses.append(loss.item())
        if not args.quiet:
            print(f"step {step:3d}  loss {losses[-1]:.4f}  tokens/s {x.numel() / dt:9.0f}")
    if args.trace:
        written = buffer.stop_trace()
        if not args.quiet:
            print(f"trace: {written}")
    if not args.quiet and args.steps > 1:
        rate = x.numel() * (args.steps - 1) / (time.perf_counter() - t_start)
        name = args.backend + (" fp8" if args.fp8 else "")
        print(f"{name}: final loss {losses[-1]:.4f} (start {losses[0]:.4f}, log(vocab) {math.log(args.vocab):.4f}), "
              f"{rate:.0f} tokens/s")
    return losses


if __name__ == "__main__":
    main()
