"""FP8 against bf16 dispatch through the PyTorch ops at the MoonEP point (R=8 E=384 K=8 s=8192 H=7168 H'=2048, exact
policy, uniform random top-k): Buffer.dispatch of bf16 rows on a bf16 and on an FP8 buffer, of DeepEP's
(x_fp8, scales), and evenep.fp8.quantize of the same rows — GPU ms from CUDA events, calls back to back after the
warm-up of evenep.bench._cuda_ms (docs/fp8.md section 6, docs/python.md FP8).

On the GPU machine, with the extension built (scripts/device/run_checks.sh):
    PYTHONPATH=python python3 scripts/device/fp8_dispatch.py
Fits an 80 GB GPU."""
import torch

import evenep
from evenep import fp8
from evenep.bench import _cuda_ms, _routing

R, E, K, S, H, F = 8, 384, 8, 8192, 7168, 2048
gen = torch.Generator().manual_seed(0)
idx = _routing("random", R, S, E, K, gen).int().cuda()
w = torch.rand(R, S, K, generator=gen).cuda()
x = torch.randn(R, S, H, generator=gen).cuda().bfloat16()
print(torch.cuda.get_device_name())
for name, f8 in (("bf16", False), ("fp8", True)):
    buf = evenep.Buffer(E, K, S, H, virtual_ranks=R, ffn_hidden=F, token_padding=128, device="cuda", policy="exact",
                        fp8=f8)
    plan = buf.plan(idx)
    rows = []
    rows.append((f"dispatch {name}", _cuda_ms(lambda: buf.dispatch(x, idx, w, plan), 2, 10)))
    if f8:
        q = fp8.quantize(x)
        rows.append(("dispatch fp8 (x_fp8, scales)", _cuda_ms(lambda: buf.dispatch(q, idx, w, plan), 2, 10)))
        rows.append(("quantize x", _cuda_ms(lambda: fp8.quantize(x), 2, 10)))
    for n, (med, mn, host) in rows:
        print(f"{n:<36} {med:8.3f} ms  min {mn:8.3f}  host {host:6.3f}")
    buf.check()
    del buf
    torch.cuda.empty_cache()
