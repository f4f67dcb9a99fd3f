"""The FP8 path of the package (docs/python.md "FP8", docs/fp8.md) on the CPU backend.

Cases:
  casts        evenep.fp8.quantize / quantize_weight (the library's cpu::quantize_rows_fp8 / quantize_weight_fp8)
               bit for bit against an independent torch emulation of docs/fp8.md's rules (s = max(amax/448,
               2^-126), a power of two up with ue8m0; q = e4m3(x/s), torch's round-to-nearest-even cast), on
               normal, tiny (subnormal codes), outlier and all-zero blocks; dequantize exact
  dispatch     Buffer(fp8=True).dispatch of bf16 x (the library's FP8 dispatch) gives, on every entry row, the cast
               of the bf16 dispatch's row, padding rows codes +0 / scale 0; the DeepEP form (x_fp8, scales) gives the
               same bytes (with and without ue8m0; unequal token counts); recv_w / cu_seqlens / combine as bf16's
  gemm         grouped_gemm_fp8 against a float64 product of the dequantised operands (home and copied experts,
               forward and transposed) within the bound of docs/fp8.md section 3
  layer        nn.MoE(fp8=True) against TorchMoE (the same parameters) on the adversarial routings: output and every
               gradient within the FP8 layer tolerance (cpu::kFp8LayerTolerance: max rel 0.15, mean rel 0.10)
  refusals     bad fp8 / ue8m0 values, H not a multiple of 128, tuples on a bf16 buffer, wrong dtypes and shapes,
               NaN input, NaN codes, bad scales, MoE/buffer fp8 mismatch: each names the value (CUDA:
               test_fp8_cuda.py)
  training     examples/train_moe.py --fp8 against the bf16 run (short here; the 200-step figure in docs/python.md)
"""

import pytest
import torch

import evenep
from conftest import ROUTINGS, make_routing, make_weights, rel_err
from evenep import fp8
from test_train_example import _load as load_example

R, E, K, S, H, F = 4, 8, 2, 16, 128, 128
MAX_REL, MEAN_REL = 0.15, 0.10  # cpu::kFp8LayerTolerance


def _buf(**kw):
    kw.setdefault("ffn_hidden", F)
    kw.setdefault("token_padding", 8)
    return evenep.Buffer(E, K, S, H, virtual_ranks=R, fp8=True, **kw)


def _bytes(t):
    return t.contiguous().view(torch.uint8)


def _emulate(x, ue8m0, block=128):
    """docs/fp8.md's cast in torch ops alone: [..., D] bf16 -> codes, one scale per `block` values."""
    xf = x.float().unflatten(-1, (-1, block))
    s = (xf.abs().amax(-1) / 448.0).clamp_min(2.0**-126)
    if ue8m0:
        s = torch.exp2(torch.ceil(torch.log2(s)))
    q = (xf / s.unsqueeze(-1)).to(torch.float8_e4m3fn)
    return q.flatten(-2), s


def _blocks(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(6, 512, generator=g)
    x[1] *= 1e-3                      # values fall onto e4m3 subnormals next to a larger one
    x[1, 5] = 3.0
    x[2, 130] = 60.0                  # one outlier in its 128-block
    x[3, :128] = 0.0                  # an all-zero block: scale 2^-126, codes 0
    x[4] = torch.randn(512, generator=g) * 1e-30  # tiny amax: scale floored at 2^-126
    x[5] = torch.randn(512, generator=g) * 1e4
    return x.to(torch.bfloat16)


# --- casts ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("ue8m0", [False, True])
def test_quantize_matches_the_rules(ue8m0):
    x = _blocks()
    q, s = fp8.quantize(x, ue8m0)
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float32 and s.shape == (6, 4)
    q_ref, s_ref = _emulate(x, ue8m0)
    assert torch.equal(_bytes(s), _bytes(s_ref))
    assert torch.equal(_bytes(q), _bytes(q_ref))
    assert (s[3, 0] == 2.0**-126).item() and (_bytes(q)[3, :128] == 0).all()
    if ue8m0:
        assert torch.equal(s, torch.exp2(torch.log2(s).round()))
    # dequantize: float(q) * s, exact in fp32 (the library's fp8_dequantize)
    exact = (q.float().unflatten(-1, (4, 128)) * s[..., None]).flatten(-2)
    assert torch.equal(fp8.dequantize(q, s, torch.float32), exact)


@pytest.mark.parametrize("ue8m0", [False, True])
def test_quantize_weight_128x128_blocks(ue8m0):
    g = torch.Generator().manual_seed(3)
    w = (torch.randn(2, 256, 384, generator=g) * 0.05).to(torch.bfloat16)
    w[0, 130, 7] = 9.0
    q, s = fp8.quantize_weight(w, ue8m0)
    assert q.shape == w.shape and s.shape == (2, 2, 3)
    # a 128x128 block is one "row" of 16384 values for the emulation
    blocks = w.unflatten(1, (2, 128)).unflatten(3, (3, 128)).permute(0, 1, 3, 2, 4).reshape(2, 2, 3, 16384)
    qb, sb = _emulate(blocks, ue8m0, 16384)
    assert torch.equal(_bytes(s), _bytes(sb.squeeze(-1)))
    q_blocks = q.unflatten(1, (2, 128)).unflatten(3, (3, 128)).permute(0, 1, 3, 2, 4).reshape(2, 2, 3, 16384)
    assert torch.equal(_bytes(q_blocks), _bytes(qb))


def test_quantize_refuses():
    with pytest.raises(ValueError, match="multiple of 128"):
        fp8.quantize(torch.zeros(2, 96, dtype=torch.bfloat16))
    x = torch.zeros(2, 256, dtype=torch.bfloat16)
    x[1, 200] = float("nan")
    with pytest.raises(ValueError, match="200"):
        fp8.quantize(x)
    with pytest.raises(TypeError, match="floating-point"):
        fp8.quantize(torch.zeros(2, 128, dtype=torch.int32))
    with pytest.raises(ValueError, match="multiple of 128"):
        fp8.quantize_weight(torch.zeros(128, 100))


# --- dispatch -------------------------------------------------------------------------------------------------
def _inputs(kind, seed=0):
    idx = make_routing(kind, R, S, E, K, seed)
    g = torch.Generator().manual_seed(seed + 7)
    x = torch.randn(R, S, H, generator=g).to(torch.bfloat16)
    return x, idx, make_weights(idx, seed)


@pytest.mark.parametrize("kind", ROUTINGS)
@pytest.mark.parametrize("ue8m0", [False, True])
def test_dispatch_is_the_cast_of_the_bf16_rows(kind, ue8m0):
    x, idx, w = _inputs(kind)
    b16 = evenep.Buffer(E, K, S, H, virtual_ranks=R, ffn_hidden=F, token_padding=8)
    b8 = _buf(ue8m0=ue8m0)
    rx, rw, cu, h = b16.dispatch(x, idx, w)
    # The bf16 buffer's plan: under the auto policy the FP8 buffer's own step-cost model (make_auto_cost_model_fp8,
    # docs/auto.md) may choose another budget for the same routing.
    (q, s), rw8, cu8, h8 = b8.dispatch(x, idx, w, h.plan)
    assert q.shape == (R, b8.num_recv_rows, H) and s.shape == (R, b8.num_recv_rows, H // 128)
    assert torch.equal(rw8, rw) and torch.equal(cu8, cu) and torch.equal(h8.dst, h.dst)
    entry = rw != 0  # rows holding an entry (weights > 0); the other rows are padding or past the groups
    q_ref, s_ref = fp8.quantize(rx, ue8m0)
    assert torch.equal(_bytes(q)[entry], _bytes(q_ref)[entry])
    assert torch.equal(s[entry], s_ref[entry])
    assert (_bytes(q)[~entry] == 0).all() and (s[~entry] == 0).all()
    # the DeepEP form: rows quantised by the caller move unchanged (the same bytes as the library's own cast)
    (q2, s2), rw2, _, h2 = b8.dispatch(fp8.quantize(x, ue8m0), idx, w, h.plan)
    assert torch.equal(_bytes(q2), _bytes(q)) and torch.equal(_bytes(s2), _bytes(s)) and torch.equal(rw2, rw)
    # combine and its backward stay bf16
    y = fp8.dequantize(q, s)
    out = b8.combine(y, h8)
    out_ref = b16.combine(fp8.dequantize(q, s), h)
    assert torch.equal(out, out_ref)


def test_dispatch_unequal_tokens_and_autograd_of_weights():
    x, idx, w = _inputs("random", 2)
    n = [S, 5, 1, 9]
    b8 = _buf()
    w = w.clone().requires_grad_()
    (q, s), rw, cu, h = b8.dispatch(x, idx, w, num_tokens=n)
    (q2, s2), *_ = b8.dispatch(fp8.quantize(x), idx, w.detach(), num_tokens=n)
    assert torch.equal(_bytes(q), _bytes(q2)) and torch.equal(s, s2)
    assert (rw != 0).sum().item() == sum((idx[r, : n[r]] >= 0).sum().item() for r in range(R))  # entries received
    y = fp8.dequantize(q, s)
    b8.combine(y, h).float().sum().backward()  # the route weights' gradient flows through recv_w
    assert w.grad is not None and w.grad[1, 5:].abs().max() == 0 and w.grad[0].abs().max() > 0


# --- grouped GEMM -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("transposed", [False, True])
def test_grouped_gemm_fp8_within_bound(transposed):
    x, idx, w = _inputs("hot_rank", 1)  # copies: hot rank's experts are prefetched by the others
    b8 = _buf()
    (q, s), _, cu, h = b8.dispatch(x, idx, w)
    plan = h.plan
    g = torch.Generator().manual_seed(5)
    wt = (torch.randn(E, F if transposed else H, H if transposed else F, generator=g) * 0.1).to(torch.bfloat16)
    # transposed: weight [E, a, b] = [E, F, H], out = x [.., H] · W^T -> [.., F]
    w8, ws = fp8.quantize_weight(wt)
    s8, ss = evenep.ops.prefetch_weight(w8, plan, b8.id), evenep.ops.prefetch_weight(ws, plan, b8.id)
    assert (b8.layout.field(plan, "copies") >= 0).any()
    out = evenep.ops.grouped_gemm_fp8(q, s, w8, ws, s8, ss, plan, b8.id, transposed)
    # float64 reference: each row times its group's expert weight (dequantised)
    wd = (w8.double().unflatten(1, (-1, 128)).unflatten(3, (-1, 128)) *
          ws.double()[:, :, None, :, None]).flatten(3).flatten(1, 2)
    xd = fp8.dequantize(q, s, torch.float32).double()
    expert = b8.layout.field(plan, "group_expert")
    count = b8.layout.field(plan, "group_count")
    for r in range(R):
        begin = 0
        for gi in range(cu.shape[1]):
            end = int(cu[r, gi])
            rows = slice(begin, begin + int(count[r, gi]))
            we = wd[int(expert[r, gi])]
            ref = xd[r, rows] @ (we.T if transposed else we)
            mag = xd[r, rows].abs() @ (we.T if transposed else we).abs()
            assert ((out[r, rows].double() - ref).abs() <= 1e-5 * mag + 1e-30).all()
            assert (out[r, begin + int(count[r, gi]) : end] == 0).all()  # padding rows
            begin = end


# --- the layer ----------------------------------------------------------------------------------------------------
def _pair(buf, seed=0):
    torch.manual_seed(seed)
    moe = evenep.nn.MoE(H, F, E, K, buffer=buf, fp8=True)
    ref = evenep.nn.TorchMoE(H, F, E, K)
    ref.load_state_dict(moe.state_dict())
    return moe, ref


def _mean_rel(got, ref):
    got, ref = got.float(), ref.float()
    return ((got - ref).abs().mean() / ref.abs().mean()).item()


@pytest.mark.parametrize("kind", ROUTINGS)
def test_moe_fp8_against_torch(kind):
    moe, ref = _pair(_buf())
    x, idx, w = _inputs(kind, 4)
    x = x.float()
    g = torch.randn(R, S, H, generator=torch.Generator().manual_seed(9))
    outs = []
    for mod in (moe, ref):
        xi, wi = x.clone().requires_grad_(), w.clone().requires_grad_()
        out = mod(xi, routing=(idx, wi))
        out.backward(g)
        outs.append((out, xi.grad, wi.grad))
    (out, gx, gw), (out_r, gx_r, gw_r) = outs
    assert rel_err(out, out_r) <= MAX_REL and _mean_rel(out, out_r) <= MEAN_REL, "out"
    assert rel_err(gx, gx_r) <= MAX_REL, "grad x"
    assert rel_err(gw, gw_r) <= MAX_REL, "grad topk_weights"
    refs = dict(ref.named_parameters())
    for name, p in moe.named_parameters():
        if refs[name].grad is None or refs[name].grad.abs().max() == 0:
            assert p.grad is None or p.grad.abs().max() == 0, name
            continue
        assert rel_err(p.grad, refs[name].grad) <= MAX_REL, name
    assert rel_err(out, out_r) > 1e-3  # really the FP8 path (bf16 would be ~4e-3 of 6e-2)


def test_moe_fp8_ue8m0_router_and_unequal_tokens():
    moe, ref = _pair(_buf(ue8m0=True), 1)
    x = torch.randn(R, S, H)
    n = [3, S, 7, 1]
    out, out_r = moe(x, num_tokens=n), ref(x, num_tokens=n)
    assert rel_err(out, out_r) <= MAX_REL and _mean_rel(out, out_r) <= MEAN_REL
    assert out[0, 3:].abs().max() == 0
    out.float().pow(2).sum().backward()
    assert moe.router_weight.grad is not None and moe.w_down.grad.abs().max() > 0


# --- refusals -------------------------------------------------------------------------------------------------------
def test_refusals():
    with pytest.raises(ValueError, match="fp8 = 'yes'"):
        evenep.Buffer(E, K, S, H, virtual_ranks=R, fp8="yes")
    with pytest.raises(ValueError, match="ue8m0=True needs fp8=True"):
        evenep.Buffer(E, K, S, H, virtual_ranks=R, ue8m0=True)
    with pytest.raises(ValueError, match="H = 96"):
        evenep.Buffer(E, K, S, 96, virtual_ranks=R, fp8=True)
    b16 = evenep.Buffer(E, K, S, H, virtual_ranks=R, ffn_hidden=F, token_padding=8)
    x, idx, w = _inputs("random")
    with pytest.raises(ValueError, match="without fp8=True"):
        b16.dispatch(fp8.quantize(x), idx, w)
    with pytest.raises(ValueError, match=r"MoE\(fp8=True\) needs a buffer created with fp8=True"):
        evenep.nn.MoE(H, F, E, K, buffer=b16, fp8=True)
    b8 = _buf()
    with pytest.raises(ValueError, match=r"MoE\(fp8=False\)"):
        evenep.nn.MoE(H, F, E, K, buffer=b8)
    q, s = fp8.quantize(x)
    with pytest.raises(ValueError, match="x_fp8 is a torch.bfloat16"):
        b8.dispatch((x, s), idx, w)
    with pytest.raises(ValueError, match=r"scales has shape \[4, 16, 2\], expected \[4, 16, 1\]"):
        b8.dispatch((q, torch.ones(R, S, 2)), idx, w)
    with pytest.raises(ValueError, match="scales has dtype"):
        b8.dispatch((q, s.double()), idx, w)
    with pytest.raises(ValueError, match="3 items"):
        b8.dispatch((q, s, s), idx, w)
    bad = x.clone()
    bad[2, 3, 77] = float("inf")
    with pytest.raises(ValueError, match=r"rank 2: x\[3, 77\] = inf"):
        b8.dispatch(bad, idx, w)
    qb = q.clone()
    _bytes(qb)[1, 4, 9] = 0x7F
    with pytest.raises(ValueError, match=r"x_fp8\[1, 4, 9\] is NaN"):
        b8.dispatch((qb, s), idx, w)
    sb = s.clone()
    sb[0, 2, 0] = 0.0
    with pytest.raises(ValueError, match=r"scales\[0, 2, 0\] = 0"):
        b8.dispatch((q, sb), idx, w)
    with pytest.raises(ValueError, match=r"scales\[0, 0, 0\] = .* power of two"):
        _buf(ue8m0=True).dispatch((q, s * 0 + 0.75), idx, w)
    # after every refusal the buffer still dispatches
    (q2, _), *_ = b8.dispatch(x, idx, w)
    assert q2.shape == (R, b8.num_recv_rows, H)


# --- training -------------------------------------------------------------------------------------------------------
def test_train_fp8_close_to_bf16():
    """A short run (16 steps) of examples/train_moe.py --fp8 against the bf16 run from the same weights and batches:
    the loss falls and stays within 3% of the bf16 run's at the end (the 200-step run is within 2%:
    docs/python.md, FP8)."""
    train = load_example()
    common = ["--steps", "16", "--quiet", "--layers", "1", "--hidden", "128", "--ffn", "128", "--seq", "16",
              "--batch", "4"]
    bf16 = train.main(common)
    f8 = train.main([*common, "--fp8"])
    assert f8[-1] < f8[0] - 0.5
    assert abs(f8[-1] - bf16[-1]) <= 0.03 * bf16[-1], (f8[-1], bf16[-1])


def _opcheck(op, args):
    torch.library.opcheck(op, args, test_utils=("test_faketensor", "test_autograd_registration",
                                                "test_aot_dispatch_dynamic"))


def test_opcheck():
    """torch.library.opcheck of the FP8 ops: fake implementation, autograd registration, AOT dispatch (not test_schema:
    torch's schema check mode multiplies the outputs, which float8_e4m3fn does not implement on the CPU)."""
    x, idx, w = _inputs("random", 3)
    b8 = _buf()
    q, s = fp8.quantize(x)
    wt = (torch.randn(E, H, F) * 0.1).to(torch.bfloat16)
    _opcheck(evenep.ops.quantize_fp8, (x, True))
    _opcheck(evenep.ops.quantize_fp8_weight, (wt, False))
    plan = b8.plan(idx)
    for args in ((x, None), (q, s)):
        _opcheck(evenep.ops.dispatch_fp8, (*args, idx, w, plan, b8.id))
    (rq, rs), *_ = b8.dispatch(x, idx, w, plan)
    w8, ws = fp8.quantize_weight(wt)
    s8, ss = evenep.ops.prefetch_weight(w8, plan, b8.id), evenep.ops.prefetch_weight(ws, plan, b8.id)
    _opcheck(evenep.ops.grouped_gemm_fp8, (rq, rs, w8, ws, s8, ss, plan, b8.id, False, torch.bfloat16))
