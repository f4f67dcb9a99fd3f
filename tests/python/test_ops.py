"""torch.ops.evenep on the CPU backend.

Cases: opcheck of every op (schema, fake implementation, autograd registration, AOT dispatch) on small shapes;
dispatch rows and weights bit-exact against a plain-PyTorch gather built from the returned cu_seqlens and
destinations; combine (weighted and unweighted) against the fp32 sum; combine_backward then dispatch_backward
(the SPEC §4.3 identities); grouped GEMM fwd/dgrad/wgrad against fp32 torch matmuls (1e-5, fp32 path);
prefetch_weight / reduce_grad against their definition; unequal s; the plan tensor's shape is static.
"""

import pytest
import torch

import evenep
from conftest import ROUTINGS, make_routing, make_weights, rel_err

ops = torch.ops.evenep


def _inputs(buf, kind="random", s=None, seed=0):
    i = buf.info
    s = s or i.S
    idx = make_routing(kind, i.R, s, i.E, i.K, seed)
    x = torch.randn(i.R, s, i.H, generator=torch.Generator().manual_seed(seed)).bfloat16()
    return x, idx, make_weights(idx, seed)


def _entry_rows(buf, handle):
    """Flat receive row of every entry ([R, s, K], -1 for masked), decoded from the dispatch handle."""
    i = buf.info
    dst = handle.dst.reshape(i.R, -1, i.K).long()
    masked = dst == -(2**31)
    flat = torch.where(dst >= 0, dst, -(dst + 1))
    return torch.where(masked, torch.full_like(flat, -1), flat)


@pytest.mark.parametrize("kind", ROUTINGS)
def test_dispatch_rows_exact(small, kind):
    i = small.info
    x, idx, w = _inputs(small, kind)
    recv_x, recv_w, cu, h = small.dispatch(x, idx, w)
    assert recv_x.shape == (i.R, i.nvs, i.H) and recv_w.shape == (i.R, i.nvs) and cu.shape == (i.R, i.G)
    assert torch.equal(cu, small.layout.field(h.plan, "cu_seqlens"))
    rows = _entry_rows(small, h)
    flat_x = recv_x.reshape(-1, i.H)
    flat_w = recv_w.reshape(-1)
    used = rows >= 0
    assert torch.equal((idx >= 0), used)
    src = x.unsqueeze(2).expand(-1, -1, i.K, -1)
    assert torch.equal(flat_x[rows[used]], src[used])  # bit-exact rows
    assert torch.equal(flat_w[rows[used]], w[used])
    # every entry lands on a group of its own expert
    ge = small.layout.field(h.plan, "group_expert")
    rank, row = rows[used] // i.nvs, rows[used] % i.nvs
    g = torch.searchsorted(cu[rank].contiguous(), row.unsqueeze(1).int(), right=True).squeeze(1)
    assert torch.equal(ge[rank, g].long(), idx[used])
    # rows nobody wrote are zero
    mask = torch.ones(i.R * i.nvs, dtype=torch.bool)
    mask[rows[used]] = False
    assert flat_x[mask].abs().sum() == 0 and flat_w[mask].abs().sum() == 0


@pytest.mark.parametrize("kind", ROUTINGS)
def test_combine_matches_fp32_sum(small, kind):
    x, idx, w = _inputs(small, kind)
    recv_x, _, _, h = small.dispatch(x, idx, w)
    y = (recv_x.float() * 0.5).bfloat16()
    out = small.combine(y, h)
    ref = (x.float() * 0.5 * w.sum(-1, keepdim=True)).bfloat16()
    assert rel_err(out, ref) <= 2**-8
    out_nw = small.combine(y, h, apply_weights=False)
    ref_nw = (x.float() * 0.5 * (idx >= 0).sum(-1, keepdim=True)).bfloat16()
    assert rel_err(out_nw, ref_nw) <= 2**-8


def test_backward_identities(small):
    i = small.info
    x, idx, w = _inputs(small, "masked")
    _, _, _, h = small.dispatch(x, idx, w)
    g = torch.randn(i.R, i.S, i.H).bfloat16()
    rows = ops.combine_backward(g, h.topk_weights, h.plan, h.dst, small.id)
    ref_rows, _, _, _ = small.dispatch(g, idx, w, h.plan)  # combine_backward = dispatch of g, plan reused
    assert torch.equal(rows, ref_rows)
    gw_rows = torch.randn(i.R, i.nvs)
    gx, gtw = ops.dispatch_backward(rows, gw_rows, h.topk_weights, h.plan, h.dst, small.id)
    assert torch.equal(gx, small.combine(rows, h, apply_weights=False))
    ent = _entry_rows(small, h)
    ref_gw = torch.where(ent >= 0, gw_rows.reshape(-1)[ent.clamp_min(0)], torch.zeros(()))
    assert torch.equal(gtw, ref_gw)
    # the weighted combine's backward: bf16(w * rows) and <rows, y> per receive row (the library's order; rows past
    # the groups are zero, so their <rows, y> is too)
    y = torch.randn(i.R, i.nvs, i.H).bfloat16()
    gy, gwr = ops.combine_backward_weighted(g, y, h.recv_w, h.topk_weights, h.plan, h.dst, small.id)
    assert torch.equal(gy, (rows.float() * h.recv_w.unsqueeze(-1)).bfloat16())
    assert torch.equal(gwr, _row_grad_reference(rows.reshape(-1, i.H), y.reshape(-1, i.H)).reshape(i.R, i.nvs))
    assert rel_err(gwr, (rows.float() * y.float()).sum(-1)) <= 1e-5
    # the GEMM's bf16 output is its fp32 output rounded once
    W = torch.randn(i.E, i.H, 8)
    slots = small.prefetch_weight(W, h.plan)
    out = small.grouped_gemm(rows, W, slots, h.plan)
    assert torch.equal(small.grouped_gemm(rows, W, slots, h.plan, out_dtype=torch.bfloat16), out.bfloat16())
    with pytest.raises(ValueError, match="out_dtype"):
        small.grouped_gemm(rows, W, slots, h.plan, out_dtype=torch.float16)


def test_unequal_tokens(small):
    i = small.info
    x, idx, w = _inputs(small, "random")
    n = [16, 3, 9, 1]
    plan = small.plan(idx, n)
    assert plan.shape == (i.R, i.plan_width)
    assert small.layout.field(plan, "s").flatten().tolist() == n
    recv_x, _, _, h = small.dispatch(x, idx, w, plan, n)
    out = small.combine(recv_x, h, apply_weights=False)
    for r in range(i.R):
        k = (idx[r, : n[r]] >= 0).sum(-1, keepdim=True)
        assert rel_err(out[r, : n[r]], x[r, : n[r]].float() * k) <= 2**-8
        assert out[r, n[r] :].abs().sum() == 0


def test_grouped_gemm_fp32_path(small):
    i = small.info
    x, idx, w = _inputs(small, "hot_rank")
    recv_x, _, cu, h = small.dispatch(x, idx, w)
    W = torch.randn(i.E, i.H, 16)
    slots = small.prefetch_weight(W, h.plan)
    out = small.grouped_gemm(recv_x, W, slots, h.plan)
    ref = torch.zeros_like(out)
    Wb = W.bfloat16().float()
    ent = _entry_rows(small, h)
    for r, s_, k in zip(*torch.nonzero(ent >= 0, as_tuple=True)):
        row = ent[r, s_, k]
        ref.view(-1, 16)[row] = recv_x.reshape(-1, i.H)[row].float() @ Wb[idx[r, s_, k]]
    assert rel_err(out, ref) <= 1e-5
    dy = torch.randn_like(out).bfloat16() * (ref != 0)
    dx = ops.grouped_gemm_dgrad(dy, W, slots, h.plan, small.id)
    ref_dx = torch.zeros_like(dx)
    for r, s_, k in zip(*torch.nonzero(ent >= 0, as_tuple=True)):
        row = ent[r, s_, k]
        ref_dx.view(-1, i.H)[row] = dy.reshape(-1, 16)[row].float() @ Wb[idx[r, s_, k]].T
    assert rel_err(dx, ref_dx) <= 1e-5
    gw, gs = ops.grouped_gemm_wgrad(recv_x, dy, h.plan, small.id)
    ref_gw = torch.zeros(i.E, i.H, 16)
    for r, s_, k in zip(*torch.nonzero(ent >= 0, as_tuple=True)):
        row = ent[r, s_, k]
        ref_gw[idx[r, s_, k]] += torch.outer(recv_x.reshape(-1, i.H)[row].float(), dy.reshape(-1, 16)[row].float())
    got = gw + small.reduce_grad(gs, h.plan)
    assert rel_err(got, ref_gw) <= 1e-5


def test_prefetch_and_reduce(small):
    i = small.info
    x, idx, w = _inputs(small, "hot_rank")  # rank 0's experts need copies elsewhere
    plan = small.plan(idx)
    copies = small.layout.field(plan, "copies")
    assert (copies >= 0).any()
    W = torch.randn(i.E, 4, 3)
    slots = small.prefetch_weight(W, plan)
    G = torch.randn(i.R, i.B, 4, 3)
    red = small.reduce_grad(G, plan)
    ref = torch.zeros_like(red)
    for r in range(i.R):
        for b in range(i.B):
            e = int(copies[r, b])
            if e >= 0:
                assert torch.equal(slots[r, b], W[e])
                ref[e] += G[r, b]
            else:
                assert slots[r, b].abs().sum() == 0
    assert torch.equal(red, ref)
    # In place: only the experts with copies change, each copy added in turn in (rank, slot) order, (g + s1) + s2:
    # the library's order (cpu::ExpertPool, cuda::Experts, the CUDA op), bit for bit.
    G0 = torch.randn(i.E, 4, 3)
    want = G0.clone()
    for r in range(i.R):
        for b in range(i.B):
            if int(copies[r, b]) >= 0:
                want[int(copies[r, b])] += G[r, b]
    assert torch.equal(small.reduce_grad_add_(G0.clone(), G, plan), want)


def _opcheck(op, args):
    torch.library.opcheck(op, args)


def test_opcheck_every_op(small):
    i = small.info
    x, idx, w = _inputs(small, "masked", s=8)
    idx32 = idx.int()
    plan = small.plan(idx32)
    _opcheck(ops.plan.default, (idx32, small.id, None))
    xr = x.clone().requires_grad_(False)
    _opcheck(ops.dispatch.default, (xr, idx32, w, plan, small.id, None))
    recv_x, recv_w, _, h = small.dispatch(x, idx32, w, plan)
    _opcheck(ops.combine.default, (recv_x, recv_w, w, plan, h.dst, small.id, True))
    g = torch.randn(i.R, 8, i.H).bfloat16()
    _opcheck(ops.combine_backward.default, (g, w, plan, h.dst, small.id))
    _opcheck(ops.combine_backward_weighted.default, (g, recv_x, recv_w, w, plan, h.dst, small.id))
    _opcheck(ops.dispatch_backward.default, (recv_x, torch.randn(i.R, i.nvs), w, plan, h.dst, small.id))
    W = torch.randn(i.E, i.H, 8)
    _opcheck(ops.prefetch_weight.default, (W, plan, small.id))
    slots = ops.prefetch_weight(W, plan, small.id)
    _opcheck(ops.reduce_grad.default, (torch.randn(i.R, i.B, i.H, 8), plan, small.id))
    _opcheck(ops.reduce_grad_add_.default, (torch.randn(i.E, i.H, 8), torch.randn(i.R, i.B, i.H, 8), plan, small.id))
    _opcheck(ops.grouped_gemm.default, (recv_x, W, slots, plan, small.id))
    _opcheck(ops.grouped_gemm.default, (recv_x, W, slots, plan, small.id, torch.bfloat16))
    dy = torch.randn(i.R, i.nvs, 8).bfloat16()
    _opcheck(ops.grouped_gemm_dgrad.default, (dy, W, slots, plan, small.id))
    _opcheck(ops.grouped_gemm_wgrad.default, (recv_x, dy, plan, small.id))


def test_opcheck_autograd(small):
    """opcheck with inputs that require grad: exercises the registered autograd of dispatch/combine/GEMM."""
    i = small.info
    x, idx, w = _inputs(small, "random", s=4)
    idx32 = idx.int()
    plan = small.plan(idx32)
    _opcheck(ops.dispatch.default, (x.clone().requires_grad_(), idx32, w.clone().requires_grad_(), plan, small.id,
                                    None))
    recv_x, recv_w, _, h = small.dispatch(x, idx32, w, plan)
    _opcheck(ops.combine.default, (recv_x.clone().requires_grad_(), recv_w.clone().requires_grad_(), w, plan,
                                   h.dst, small.id, True))
    W = torch.randn(i.E, i.H, 8, requires_grad=True)
    slots = ops.prefetch_weight(W.detach(), plan, small.id).requires_grad_()
    _opcheck(ops.grouped_gemm.default, (recv_x.clone().requires_grad_(), W, slots, plan, small.id))
    _opcheck(ops.prefetch_weight.default, (W, plan, small.id))
    _opcheck(ops.reduce_grad.default, (torch.randn(i.R, i.B, i.H, 8, requires_grad=True), plan, small.id))


def test_plan_columns(small):
    """The plan tensor's columns come from the library (evenep::plan_columns): contiguous, covering the row, and
    holding what they name."""
    i = small.info
    cols = small.layout.columns
    assert list(cols)[:2] == ["s", "tpe"] and "copies" in cols and "cu_seqlens" in cols
    at = 0
    for name, (start, count) in cols.items():
        assert start == at, name
        at += count
    assert at == small.layout.width == i.plan_width
    assert cols["tpe"][1] == i.E and cols["cu_seqlens"][1] == i.G and cols["copies"][1] == i.B
    x, idx, w = _inputs(small, "hot_expert")
    plan = small.plan(idx)
    assert plan.shape == (i.R, small.layout.width)
    hist = torch.stack([torch.bincount(idx[r][idx[r] >= 0].flatten(), minlength=i.E) for r in range(i.R)])
    assert torch.equal(small.layout.field(plan, "tpe"), hist.int())
    with pytest.raises(ValueError, match="no column 'alloc'"):
        small.layout.field(plan, "alloc")


def _row_grad_reference(g, y):
    """<g, y> per row in the order of evenep/detail/row_grad.hpp: lane l of 32 sums its 8-value vectors l, l+32, ...
    in order (fp32, each product and sum rounded), then a xor butterfly over the lanes."""
    rows, H = g.shape
    prod = (g.float() * y.float()).reshape(rows, H // 8, 8)
    nvec = H // 8
    lanes = torch.zeros(rows, 32)
    for base in range(0, nvec, 32):
        for j in range(8):
            for lane in range(32):
                if base + lane < nvec:
                    lanes[:, lane] = lanes[:, lane] + prod[:, base + lane, j]
    idx = torch.arange(32)
    for m in (16, 8, 4, 2, 1):
        lanes = lanes + lanes[:, idx ^ m]
    return lanes[:, 0]


def test_combine_backward_weighted_order():
    """grad_w of combine_backward_weighted is the library's row order, bit for bit (the CUDA op's too); 0 past the
    groups; the rows are bf16(w * rows)."""
    buf = evenep.Buffer(8, 2, 16, 512, virtual_ranks=4, token_padding=8)
    i = buf.info
    x, idx, w = _inputs(buf, "random", seed=5)
    recv_x, recv_w, cu, h = buf.dispatch(x, idx, w)
    y = (recv_x.float() * 0.75).bfloat16()
    g = torch.randn(i.R, i.S, i.H, generator=torch.Generator().manual_seed(6)).bfloat16()
    rows = ops.combine_backward(g, h.topk_weights, h.plan, h.dst, buf.id)
    gy, gw = ops.combine_backward_weighted(g, y, recv_w, h.topk_weights, h.plan, h.dst, buf.id)
    assert torch.equal(gy, (rows.float() * recv_w.unsqueeze(-1)).bfloat16())
    for r in range(i.R):
        used = int(cu[r, -1])
        assert torch.equal(gw[r, :used], _row_grad_reference(rows[r, :used], y[r, :used]))
        assert gw[r, used:].abs().sum() == 0
