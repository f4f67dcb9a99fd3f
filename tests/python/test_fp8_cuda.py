"""The FP8 ops on CUDA (docs/python.md "FP8"): evenep.Buffer(fp8=True, device="cuda") with virtual ranks, checked
against the CPU backend bit for bit.

Cases:
  casts       evenep.fp8.quantize / quantize_weight of CUDA tensors (the library's device casts) equal the CPU's
              bytes (normal, subnormal-code, outlier, all-zero and tiny blocks; fp32 and UE8M0 scales); NaN/Inf input
              refused naming the element
  dispatch    Buffer(fp8=True) on CUDA: codes and scales of every row in the groups, recv_w, cu_seqlens and the
              handle equal the CPU FP8 buffer's, for bf16 x (the library's FP8 dispatch) and DeepEP's (x_fp8, scales)
              (moved as given), equal and unequal token counts; combine of the dequantised rows equals the CPU's;
              the route weights' gradient flows
  graph       the FP8 dispatch captured in a CUDA graph, replayed with new routing and rows: equal to eager calls
  refusals    inf in x, a NaN code, a scale <= 0, a non-power-of-two scale under ue8m0: ValueError naming rank, token
              and channel / block (raised by the next op or Buffer.check()); the buffer still dispatches; the FP8
              expert GEMM and nn.MoE(fp8=True) on CUDA are refused by name
  opcheck     the casts and dispatch_fp8 on CUDA: fake implementation, autograd registration, AOT dispatch
"""

import pytest
import torch

import evenep
from conftest import ROUTINGS, deterministic, make_routing, make_weights
from evenep import fp8
from evenep.bench import capture

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(not evenep.cuda_built(), reason="evenep built without the CUDA ops"),
]

R, E, K, S, H, F = 4, 8, 2, 16, 256, 128


def _bufs(ue8m0=False):
    kw = dict(virtual_ranks=R, ffn_hidden=F, token_padding=8, fp8=True, ue8m0=ue8m0)
    return evenep.Buffer(E, K, S, H, **kw), evenep.Buffer(E, K, S, H, device="cuda", **kw)


def _bytes(t):
    return t.contiguous().view(torch.uint8)


def _inputs(kind, seed=0):
    idx = make_routing(kind, R, S, E, K, seed)
    g = torch.Generator().manual_seed(seed + 7)
    x = torch.randn(R, S, H, generator=g)
    x[0, 1] *= 1e-3  # subnormal codes next to the block's larger values
    x[1, 2, 130] = 60.0  # an outlier in its block
    x[2, 3, :128] = 0.0  # an all-zero block
    return x.to(torch.bfloat16), idx, make_weights(idx, seed)


def _live(t, cu):
    """t [R, NvS, ...] (CPU) with the rows past each rank's groups (not written on CUDA) zeroed, as bytes."""
    b = _bytes(t.cpu()).reshape(t.shape[0], t.shape[1], -1)
    live = torch.arange(t.shape[1])[None, :] < cu.cpu()[:, -1:].long()
    return torch.where(live.unsqueeze(-1), b, torch.zeros((), dtype=torch.uint8))


# --- casts ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("ue8m0", [False, True])
def test_casts_equal_the_cpu(ue8m0):
    x, _, _ = _inputs("random")
    q, s = fp8.quantize(x, ue8m0)
    qc, sc = fp8.quantize(x.cuda(), ue8m0)
    assert qc.is_cuda and torch.equal(_bytes(qc.cpu()), _bytes(q)) and torch.equal(_bytes(sc.cpu()), _bytes(s))
    w = torch.randn(3, 256, 384, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    w[1, :128, :128] = 0.0
    w[2, 5, 300] = 1e4
    q, s = fp8.quantize_weight(w, ue8m0)
    qc, sc = fp8.quantize_weight(w.cuda(), ue8m0)
    assert sc.shape == (3, 2, 3)
    assert torch.equal(_bytes(qc.cpu()), _bytes(q)) and torch.equal(_bytes(sc.cpu()), _bytes(s))


def test_casts_refuse_nonfinite():
    x = torch.zeros(2, 256, dtype=torch.bfloat16, device="cuda")
    x[1, 200] = float("nan")
    with pytest.raises(ValueError, match=r"x\[1, 200\] = nan is not finite"):
        fp8.quantize(x)
    w = torch.zeros(128, 256, dtype=torch.bfloat16, device="cuda")
    w[3, 7] = float("inf")
    with pytest.raises(ValueError, match=r"weight\[3, 7\] = inf is not finite"):
        fp8.quantize_weight(w)
    with pytest.raises(ValueError, match="multiple of 128"):
        fp8.quantize(torch.zeros(2, 96, dtype=torch.bfloat16, device="cuda"))


# --- dispatch -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ROUTINGS)
@pytest.mark.parametrize("ue8m0", [False, True])
def test_dispatch_equals_the_cpu(kind, ue8m0):
    cpu, gpu = _bufs(ue8m0)
    x, idx, w = _inputs(kind)
    (q, s), rw, cu, h = cpu.dispatch(x, idx, w)
    (qg, sg), rwg, cug, hg = gpu.dispatch(x.cuda(), idx.cuda(), w.cuda())
    assert torch.equal(cug.cpu(), cu) and torch.equal(rwg.cpu(), rw) and torch.equal(hg.dst.cpu(), h.dst)
    assert torch.equal(_live(qg, cu), _live(q, cu)) and torch.equal(_live(sg, cu), _live(s, cu))
    # DeepEP's form: the caller's codes and scales move as given
    x8 = fp8.quantize(x.cuda(), ue8m0)
    (q2, s2), rw2, _, _ = gpu.dispatch(x8, idx.cuda(), w.cuda())
    assert torch.equal(_live(q2, cu), _live(q, cu)) and torch.equal(_live(s2, cu), _live(s, cu))
    assert torch.equal(rw2.cpu(), rw)
    # combine stays bf16: the same bits as the CPU's
    y = fp8.dequantize(q, s)
    out = cpu.combine(y, h)
    yg = fp8.dequantize(qg, sg)
    outg = gpu.combine(torch.where(torch.isfinite(yg), yg, torch.zeros((), dtype=yg.dtype, device="cuda")), hg)
    assert torch.equal(outg.cpu(), out)
    gpu.check()


def test_dispatch_unequal_tokens_and_weight_gradient():
    cpu, gpu = _bufs()
    x, idx, w = _inputs("random", 2)
    n = [S, 5, 1, 9]
    (q, s), rw, cu, _ = cpu.dispatch(x, idx, w, num_tokens=n)
    wg = w.cuda().requires_grad_()
    (qg, sg), rwg, cug, hg = gpu.dispatch(x.cuda(), idx.cuda(), wg, num_tokens=n)
    assert torch.equal(cug.cpu(), cu) and torch.equal(rwg.detach().cpu(), rw)
    assert torch.equal(_live(qg, cu), _live(q, cu)) and torch.equal(_live(sg, cu), _live(s, cu))
    y = fp8.dequantize(qg, sg)
    y = torch.where(torch.isfinite(y), y, torch.zeros((), dtype=y.dtype, device="cuda"))
    gpu.combine(y, hg).float().sum().backward()
    assert wg.grad is not None and wg.grad[1, 5:].abs().max() == 0 and wg.grad[0].abs().max() > 0


def test_dispatch_in_a_cuda_graph():
    _, gpu = _bufs()
    inputs = [_inputs(kind, k) for k, kind in enumerate(["random", "hot_rank", "masked"])]
    sx, sidx, sw = (t.cuda().clone() for t in inputs[0])

    def step():
        (q, s), rw, cu, _ = gpu.dispatch(sx, sidx, sw)
        return q, s, rw, cu

    replay, out = capture(step)
    for x, idx, w in inputs[1:]:
        sx.copy_(x)
        sidx.copy_(idx)
        sw.copy_(w)
        replay()
        (q, s), rw, cu, _ = gpu.dispatch(x.cuda(), idx.cuda(), w.cuda())
        assert torch.equal(out[3], cu) and torch.equal(out[2], rw)
        assert torch.equal(_live(out[0], cu), _live(q, cu)) and torch.equal(_live(out[1], cu), _live(s, cu))
    gpu.check()


# --- refusals -------------------------------------------------------------------------------------------------------
def test_refusals():
    _, gpu = _bufs()
    x, idx, w = (t.cuda() for t in _inputs("random"))
    q, s = fp8.quantize(x)

    def refused(args, pattern, buf=gpu):
        with pytest.raises(ValueError, match=pattern):
            buf.dispatch(*args)
            buf.check()  # the device records the row; the next op or check() raises it

    bad = x.clone()
    bad[2, 3, 77] = float("inf")
    refused((bad, idx, w), r"rank 2: x\[3, 77\] = inf")
    qb = q.clone()
    _bytes(qb)[1, 4, 9] = 0x7F
    refused(((qb, s), idx, w), r"rank 1: x_fp8\[4, 9\] is NaN \(e4m3 code 127\)")
    sb = s.clone()
    sb[0, 2, 1] = 0.0
    refused(((q, sb), idx, w), r"rank 0: scales\[2, 1\] = 0 is not positive and finite")
    _, g8 = _bufs(ue8m0=True)
    refused(((q, s * 0 + 0.75), idx, w), r"scales\[\d+, \d+\] = 0.75 is not a power of two", g8)
    with pytest.raises(ValueError, match=r"scales has shape"):
        gpu.dispatch((q, torch.ones(R, S, 1, device="cuda")), idx, w)
    # after every refusal the buffers still dispatch
    for b in (gpu, g8):
        (q2, _), *_ = b.dispatch(x, idx, w)
        assert q2.shape == (R, b.num_recv_rows, H)
        b.check()
    with pytest.raises(NotImplementedError, match="grouped_gemm_fp8: no CUDA kernel"):
        wt = torch.zeros(E, H, F, dtype=torch.bfloat16, device="cuda")
        w8, ws = fp8.quantize_weight(wt)
        plan = gpu.plan(idx)
        evenep.ops.grouped_gemm_fp8(q, s, w8, ws, w8, ws, plan, gpu.id)
    with pytest.raises(NotImplementedError, match=r"MoE\(fp8=True\)"):
        evenep.nn.MoE(H, F, E, K, buffer=gpu, fp8=True)


def _opcheck(op, args):
    torch.library.opcheck(op, args, test_utils=("test_faketensor", "test_autograd_registration",
                                                "test_aot_dispatch_dynamic"))


def test_opcheck():
    _, gpu = _bufs()
    x, idx, w = (t.cuda() for t in _inputs("random", 3))
    _opcheck(evenep.ops.quantize_fp8, (x, True))
    _opcheck(evenep.ops.quantize_fp8_weight, (torch.randn(E, H, F, device="cuda").bfloat16(), False))
    plan = gpu.plan(idx)
    q, s = fp8.quantize(x)
    with deterministic():  # rows past the groups are zero, so every run returns the same tensors
        for args in ((x, None), (q, s)):
            _opcheck(evenep.ops.dispatch_fp8, (*args, idx, w, plan, gpu.id))
