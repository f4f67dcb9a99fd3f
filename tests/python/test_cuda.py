"""torch.ops.evenep on CUDA (R virtual ranks on one GPU, cuda::Ep), checked against the CPU backend.

Cases: every op CUDA vs CPU — plan, dispatch, combine, combine_backward, dispatch_backward, prefetch_weight and
reduce_grad bit-exact, the grouped GEMM (the library's kAuto choice on H100/H200: CUTLASS or the hand-written Hopper kernel) within bf16-GEMM tolerance — on
the adversarial routings and unequal s; ops given plan tensors of two dispatches in flight and copies; opcheck on CUDA; nn.MoE forward+backward on CUDA against TorchMoE; a
CUDA-graph capture of a whole forward+backward+optimizer step replayed with changing routing against eager
steps; torch.compile(fullgraph=True); bad input (raises, the buffer stays usable).
"""

import copy

import pytest
import torch

import evenep
from evenep.bench import capture
from conftest import ROUTINGS, deterministic as _deterministic, make_routing, make_weights, rel_err

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(not evenep.cuda_built(), reason="evenep built without the CUDA ops"),
]

ops = torch.ops.evenep
CFG = dict(num_experts=8, top_k=2, max_tokens=16, hidden=32, virtual_ranks=4, ffn_hidden=16, token_padding=8)


@pytest.fixture(scope="module")
def pair():
    """The same configuration on the CPU and on the GPU."""
    return evenep.Buffer(**CFG), evenep.Buffer(**CFG, device="cuda")


def _inputs(i, kind, s=None, seed=0):
    s = s or i.S
    idx = make_routing(kind, i.R, s, i.E, i.K, seed)
    x = torch.randn(i.R, s, i.H, generator=torch.Generator().manual_seed(seed)).bfloat16()
    return x, idx, make_weights(idx, seed)


def _cu(*ts):
    return [t.cuda() for t in ts]


def _eq(got, ref):
    assert torch.equal(got.cpu(), ref), f"max |diff| {(got.cpu().float() - ref.float()).abs().max().item()}"


def _rows_in_groups(t, cu):
    """t [R, NvS, ...] with the rows past each rank's groups (cu_seqlens[r, -1]: not written on CUDA) zeroed."""
    t, cu = t.cpu(), cu.cpu()
    live = torch.arange(t.shape[1])[None, :] < cu[:, -1:].long()
    return torch.where(live.reshape(*live.shape, *([1] * (t.dim() - 2))), t, torch.zeros((), dtype=t.dtype))


def _used_slots(t, buf, plan):
    """t [R, B, ...] with the slots that hold no copy (not written on CUDA) zeroed."""
    used = buf.layout.field(plan.cpu(), "copies") >= 0
    t = t.cpu()
    return torch.where(used.reshape(*used.shape, *([1] * (t.dim() - 2))), t, torch.zeros((), dtype=t.dtype))


@pytest.mark.parametrize("kind", ROUTINGS)
@pytest.mark.parametrize("unequal", [False, True])
def test_data_path_bit_exact(pair, kind, unequal):
    cpu, gpu = pair
    i = cpu.info
    x, idx, w = _inputs(i, kind)
    n = [16, 3, 9, 1] if unequal else None
    plan = cpu.plan(idx, n)
    plan_g = gpu.plan(idx.cuda(), n)
    assert plan_g.dtype == torch.int32 and plan_g.shape == plan.shape and plan_g.is_cuda
    _eq(plan_g, plan)
    rx, rw, cu, h = cpu.dispatch(x, idx, w, plan, n)
    xg, idxg, wg = _cu(x, idx, w)
    rxg, rwg, cug, hg = gpu.dispatch(xg, idxg, wg, plan_g, n)
    for got, ref in ((_rows_in_groups(rxg, cug), rx), (rwg, rw), (cug, cu), (hg.dst, h.dst)):
        _eq(got, ref)
    with _deterministic():  # rows past the groups are zero, as on the CPU
        _eq(gpu.dispatch(xg, idxg, wg, plan_g, n)[0], rx)
    y = (rx.float() * 0.5).bfloat16()
    for apply in (True, False):
        _eq(gpu.combine(y.cuda(), hg, apply), cpu.combine(y, h, apply))
    g = torch.randn(i.R, i.S, i.H).bfloat16()
    rows = ops.combine_backward(g, h.topk_weights, h.plan, h.dst, cpu.id)
    rows_g = ops.combine_backward(g.cuda(), hg.topk_weights, hg.plan, hg.dst, gpu.id)
    _eq(_rows_in_groups(rows_g, cug), rows)
    gw_rows = torch.randn(i.R, i.nvs)
    gx, gtw = ops.dispatch_backward(rows, gw_rows, h.topk_weights, h.plan, h.dst, cpu.id)
    gx_g, gtw_g = ops.dispatch_backward(rows_g, gw_rows.cuda(), hg.topk_weights, hg.plan, hg.dst, gpu.id)
    _eq(gx_g, gx)
    _eq(gtw_g, gtw)
    # the weighted combine's backward in one op: bf16(w * rows) and <rows, y> bit for bit (one summation order,
    # evenep/detail/row_grad.hpp)
    gy, gw = ops.combine_backward_weighted(g, y, rw, h.topk_weights, h.plan, h.dst, cpu.id)
    gy_g, gw_g = ops.combine_backward_weighted(g.cuda(), y.cuda(), rwg, hg.topk_weights, hg.plan, hg.dst, gpu.id)
    _eq(_rows_in_groups(gy_g, cug), gy)
    _eq(gw_g, gw)
    # combine again after the backward: its plan comes from the plan tensor and the handle (nothing re-dispatched)
    _eq(gpu.combine(y.cuda(), hg), cpu.combine(y, h))
    gpu.check()


@pytest.mark.parametrize("unequal", [False, True])
def test_plans_from_tensors_cuda(pair, unequal):
    """An op given a plan tensor uses that plan (cuda::unpack_plan; no registry): two dispatches of one buffer in
    flight, combined and backpropagated in either order after both planned; dispatch given a copy of its plan
    tensor (planned again); combine given copies of the plan and the handle — bit for bit the CPU's."""
    cpu, gpu = pair
    i = cpu.info
    n = [16, 3, 9, 1] if unequal else None
    layers = []
    for seed, kind in ((1, "random"), (2, "hot_expert")):
        x, idx, w = _inputs(i, kind, seed=seed)
        out = cpu.dispatch(x, idx, w, cpu.plan(idx, n), n)
        xg, idxg, wg = _cu(x, idx, w)
        plan_g = gpu.plan(idxg, n)
        out_g = gpu.dispatch(xg, idxg, wg, plan_g.clone(), n)  # a copy: dispatch plans again
        _eq(_rows_in_groups(out_g[0], out_g[2]), out[0])
        _eq(out_g[3].dst, out[3].dst)
        y = (out[0].float() * (0.5 + seed)).bfloat16()
        layers.append((y, out, out_g))
    for y, (rx, rw, cu, h), (rxg, rwg, cug, hg) in (layers[0], layers[1], layers[0]):
        _eq(gpu.combine(y.cuda(), hg), cpu.combine(y, h))
        ref = ops.combine(y, rw, h.topk_weights, h.plan, h.dst, cpu.id, True)
        _eq(ops.combine(y.cuda(), rwg, hg.topk_weights, hg.plan.clone(), hg.dst.clone(), gpu.id, True), ref)
        g = torch.randn(i.R, i.S, i.H).bfloat16()
        rows = ops.combine_backward(g, h.topk_weights, h.plan, h.dst, cpu.id)
        rows_g = ops.combine_backward(g.cuda(), hg.topk_weights, hg.plan, hg.dst, gpu.id)
        _eq(_rows_in_groups(rows_g, cug), rows)
        gx, gtw = ops.dispatch_backward(rows, rw, h.topk_weights, h.plan, h.dst, cpu.id)
        gx_g, gtw_g = ops.dispatch_backward(rows_g, rwg, hg.topk_weights, hg.plan, hg.dst, gpu.id)
        _eq(gx_g, gx)
        _eq(gtw_g, gtw)
    gpu.check()


@pytest.fixture(scope="module")
def few_slots():
    """B = 1 < E/R = 2: plans with peer groups (the home weight read directly), whose wgrad is one launch per rank."""
    return evenep.Buffer(**CFG, prefetch_slots=1), evenep.Buffer(**CFG, prefetch_slots=1, device="cuda")


@pytest.mark.parametrize("slots", ["default", "few"])
@pytest.mark.parametrize("kind", ["hot_rank", "hot_expert", "random"])
def test_experts_and_gemm(pair, few_slots, kind, slots):
    cpu, gpu = pair if slots == "default" else few_slots
    i = cpu.info
    x, idx, w = _inputs(i, kind, seed=3)
    rx, _, _, h = cpu.dispatch(x, idx, w)
    rxg, _, _, hg = gpu.dispatch(*_cu(x, idx, w))
    W = torch.randn(i.E, i.H, 16)
    slots, slots_g = cpu.prefetch_weight(W, h.plan), gpu.prefetch_weight(W.cuda(), hg.plan)
    _eq(_used_slots(slots_g, gpu, hg.plan), slots)
    with _deterministic():
        _eq(gpu.prefetch_weight(W.cuda(), hg.plan), slots)
    Gs = torch.randn(i.R, i.B, i.H, 16)
    _eq(gpu.reduce_grad(Gs.cuda(), hg.plan), cpu.reduce_grad(Gs, h.plan))
    G0 = torch.randn(i.E, i.H, 16)
    _eq(gpu.reduce_grad_add_(G0.cuda(), Gs.cuda(), hg.plan), cpu.reduce_grad_add_(G0.clone(), Gs, h.plan))
    cu_g = gpu.layout.field(hg.plan, "cu_seqlens")
    out, out_g = cpu.grouped_gemm(rx, W, slots, h.plan), gpu.grouped_gemm(rxg, W.cuda(), slots_g, hg.plan)
    assert rel_err(_rows_in_groups(out_g, cu_g), out) <= 1e-3
    # bf16 from the epilogue: the fp32 result rounded once (RNE), bit for bit
    out_b = gpu.grouped_gemm(rxg, W.cuda(), slots_g, hg.plan, out_dtype=torch.bfloat16)
    _eq(_rows_in_groups(out_b, cu_g), _rows_in_groups(out_g, cu_g).bfloat16())
    dy = (torch.randn_like(out) * (out != 0)).bfloat16()
    dx = ops.grouped_gemm_dgrad(dy, W, slots, h.plan, cpu.id)
    dx_g = ops.grouped_gemm_dgrad(dy.cuda(), W.cuda(), slots_g, hg.plan, gpu.id)
    assert rel_err(_rows_in_groups(dx_g, cu_g), dx) <= 1e-3
    gw, gs = ops.grouped_gemm_wgrad(rx, dy, h.plan, cpu.id)
    gw_g, gs_g = ops.grouped_gemm_wgrad(rxg, dy.cuda(), hg.plan, gpu.id)
    assert rel_err(gw_g.cpu(), gw) <= 1e-3 and rel_err(_used_slots(gs_g, gpu, hg.plan), gs) <= 1e-3
    gpu.check()


def test_opcheck_cuda(pair):
    # Deterministic mode: what the ops leave unwritten is zero, so eager and compiled outputs compare equal.
    with _deterministic():
        _opcheck_cuda(pair)


def _opcheck_cuda(pair):
    _, gpu = pair
    i = gpu.info
    x, idx, w = _cu(*_inputs(i, "masked", s=8))
    idx32 = idx.int()
    plan = gpu.plan(idx32)
    torch.library.opcheck(ops.plan.default, (idx32, gpu.id, None))
    torch.library.opcheck(ops.dispatch.default, (x, idx32, w, plan, gpu.id, None))
    recv_x, recv_w, _, h = gpu.dispatch(x, idx32, w, plan)
    torch.library.opcheck(ops.combine.default, (recv_x, recv_w, w, plan, h.dst, gpu.id, True))
    g = torch.randn(i.R, 8, i.H, device="cuda").bfloat16()
    torch.library.opcheck(ops.combine_backward.default, (g, w, plan, h.dst, gpu.id))
    torch.library.opcheck(ops.combine_backward_weighted.default, (g, recv_x, recv_w, w, plan, h.dst, gpu.id))
    gw = torch.randn(i.R, i.nvs, device="cuda")
    torch.library.opcheck(ops.dispatch_backward.default, (recv_x, gw, w, plan, h.dst, gpu.id))
    W = torch.randn(i.E, i.H, 8, device="cuda")
    torch.library.opcheck(ops.prefetch_weight.default, (W, plan, gpu.id))
    slots = ops.prefetch_weight(W, plan, gpu.id)
    torch.library.opcheck(ops.reduce_grad.default, (torch.randn(i.R, i.B, i.H, 8, device="cuda"), plan, gpu.id))
    torch.library.opcheck(ops.reduce_grad_add_.default, (torch.randn(i.E, i.H, 8, device="cuda"),
                                                         torch.randn(i.R, i.B, i.H, 8, device="cuda"), plan, gpu.id))
    torch.library.opcheck(ops.grouped_gemm.default, (recv_x, W, slots, plan, gpu.id))
    torch.library.opcheck(ops.grouped_gemm.default, (recv_x, W, slots, plan, gpu.id, torch.bfloat16))
    dy = torch.randn(i.R, i.nvs, 8, device="cuda").bfloat16()
    torch.library.opcheck(ops.grouped_gemm_dgrad.default, (dy, W, slots, plan, gpu.id))
    torch.library.opcheck(ops.grouped_gemm_wgrad.default, (recv_x, dy, plan, gpu.id))
    torch.library.opcheck(ops.dispatch.default, (x.clone().requires_grad_(), idx32, w.clone().requires_grad_(),
                                                 plan, gpu.id, None))
    gpu.check()


def _moe_pair(buf, seed=0, **kw):
    torch.manual_seed(seed)
    i = buf.info
    moe = evenep.nn.MoE(i.H, i.ffn_hidden, i.E, i.K, buffer=buf, **kw).cuda()
    ref = evenep.nn.TorchMoE(i.H, i.ffn_hidden, i.E, i.K, **kw).cuda()
    ref.load_state_dict(moe.state_dict())
    return moe, ref


@pytest.mark.parametrize("kind", ["router", "hot_rank", "masked"])
def test_moe_forward_backward_vs_torch(pair, kind):
    _, gpu = pair
    i = gpu.info
    moe, ref = _moe_pair(gpu)
    x = torch.randn(i.R, i.S, i.H, device="cuda", requires_grad=True)
    routing = None
    if kind != "router":
        idx = make_routing(kind, i.R, i.S, i.E, i.K).cuda()
        routing = (idx, make_weights(idx.cpu()).cuda())
    out = moe(x, routing=routing)
    out.square().mean().backward()
    gx, x.grad = x.grad, None
    out_ref = ref(x, routing=routing)
    out_ref.square().mean().backward()
    assert rel_err(out, out_ref) <= 2e-2  # bf16 between the GEMMs (the CPU oracle's tolerance)
    assert rel_err(gx, x.grad) <= 3e-2
    for name in ("w_gate", "w_up", "w_down", "router_weight"):
        g, gr = getattr(moe, name).grad, getattr(ref, name).grad
        if kind != "router" and name == "router_weight":
            continue
        assert rel_err(g, gr) <= 3e-2, name
    gpu.check()


def test_moe_shared_expert_side_stream(pair):
    _, gpu = pair
    i = gpu.info
    torch.manual_seed(3)
    shared = torch.nn.Linear(i.H, i.H).cuda()
    moe = evenep.nn.MoE(i.H, i.ffn_hidden, i.E, i.K, buffer=gpu, shared_expert=shared).cuda()
    ref = evenep.nn.TorchMoE(i.H, i.ffn_hidden, i.E, i.K, shared_expert=copy.deepcopy(shared)).cuda()
    ref.load_state_dict(moe.state_dict())
    x = torch.randn(i.R, i.S, i.H, device="cuda")
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    out, out_r = moe(xa), ref(xb)
    out.square().mean().backward()
    out_r.square().mean().backward()
    assert rel_err(out, out_r) <= 2e-2 and rel_err(xa.grad, xb.grad) <= 3e-2
    assert rel_err(moe.shared_expert.weight.grad, ref.shared_expert.weight.grad) <= 3e-2
    gpu.check()


def test_moe_cuda_matches_cpu_module(pair):
    """The same MoE on the CPU backend and on CUDA: outputs and gradients agree within the GEMM tolerance."""
    cpu, gpu = pair
    i = gpu.info
    moe_g, _ = _moe_pair(gpu, seed=1)
    torch.manual_seed(1)
    moe_c = evenep.nn.MoE(i.H, i.ffn_hidden, i.E, i.K, buffer=cpu)
    moe_c.load_state_dict({k: v.cpu() for k, v in moe_g.state_dict().items()})
    x = torch.randn(i.R, i.S, i.H)
    out_c = moe_c(x)
    out_g = moe_g(x.cuda())
    out_c.sum().backward()
    out_g.sum().backward()
    assert rel_err(out_g.cpu(), out_c) <= 1e-2
    assert rel_err(moe_g.w_down.grad.cpu(), moe_c.w_down.grad) <= 1e-2


@pytest.mark.parametrize("layers", [1, 2])
def test_cuda_graph_training_step(pair, layers):
    """A whole forward+backward+optimizer step captured once and replayed with new routing (static tensors updated
    in place) gives the losses and weights of the same steps run eagerly. layers=2: two MoE layers share the one
    buffer in the captured step (each op takes its plan from its plan tensor and handle)."""
    _, gpu = pair
    i = gpu.info
    steps = 4
    xs = [torch.randn(i.R, i.S, i.H, device="cuda") for _ in range(steps)]
    routings = []
    for k, kind in enumerate(["random", "hot_rank", "masked", "one_remote"]):
        idx = make_routing(kind, i.R, i.S, i.E, i.K, seed=k).cuda()
        routings.append((idx, make_weights(idx.cpu(), seed=k).cuda()))

    def layer_routing(step, layer):
        return routings[(step + layer) % steps]

    def make_model():
        moes = [_moe_pair(gpu, seed=5 + l)[0] for l in range(layers)]
        return moes, torch.optim.SGD([p for m in moes for p in m.parameters()], lr=0.1)

    def forward(moes, x, rs):
        for m, r in zip(moes, rs):
            x = m(x, routing=r)
        return x.square().mean()

    def run_eager():
        moes, opt = make_model()
        losses = []
        for k, x in enumerate(xs):
            opt.zero_grad(set_to_none=False)
            loss = forward(moes, x, [layer_routing(k, l) for l in range(layers)])
            loss.backward()
            opt.step()
            losses.append(loss.detach().clone())
        return torch.stack(losses), moes

    ref_losses, ref_moes = run_eager()

    moes, opt = make_model()
    sx = torch.zeros(i.R, i.S, i.H, device="cuda")
    sr = [(torch.zeros(i.R, i.S, i.K, dtype=torch.int64, device="cuda"), torch.zeros(i.R, i.S, i.K, device="cuda"))
          for _ in range(layers)]

    def set_static(k):
        sx.copy_(xs[k])
        for l, (sidx, sw) in enumerate(sr):
            idx, w = layer_routing(k, l)
            sidx.copy_(idx), sw.copy_(w)

    def step():
        opt.zero_grad(set_to_none=False)
        loss = forward(moes, sx, sr)
        loss.backward()
        opt.step()
        return loss.detach()

    # Warm-up (on a side stream) and capture; the warm-up changes the weights: restore them before replaying.
    saved = [{k: v.clone() for k, v in m.state_dict().items()} for m in moes]
    set_static(0)
    replay, static_loss = capture(step)
    with torch.no_grad():
        for m, sv in zip(moes, saved):
            for k, v in m.state_dict().items():
                v.copy_(sv[k])
            for p in m.parameters():
                if p.grad is not None:  # parameters outside this step's graph (the router, given a routing) have none
                    p.grad.zero_()
    losses = []
    for k in range(steps):
        set_static(k)
        replay()
        losses.append(static_loss.clone())
    torch.cuda.synchronize()
    gpu.check()
    got = torch.stack(losses)
    assert torch.allclose(got, ref_losses, rtol=1e-5, atol=0), (got, ref_losses)
    for m, ref in zip(moes, ref_moes):
        for name in ("w_gate", "w_up", "w_down"):
            assert rel_err(getattr(m, name).detach(), getattr(ref, name).detach()) <= 1e-5, name


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_compile_fullgraph(pair, backend):
    _, gpu = pair
    i = gpu.info
    moe, ref = _moe_pair(gpu, seed=2)
    x = torch.randn(i.R, i.S, i.H, device="cuda")
    compiled = torch.compile(moe, fullgraph=True, backend=backend)
    xg = x.clone().requires_grad_()
    out = compiled(xg)
    out.square().mean().backward()
    xr = x.clone().requires_grad_()
    out_r = ref(xr)
    out_r.square().mean().backward()
    assert rel_err(out, out_r) <= 2e-2 and rel_err(xg.grad, xr.grad) <= 3e-2
    assert rel_err(moe.w_down.grad, ref.w_down.grad) <= 3e-2
    gpu.check()


def test_bad_input_cuda(pair):
    _, gpu = pair
    i = gpu.info
    x, idx, w = _cu(*_inputs(i, "random"))
    cases = [
        lambda: gpu.dispatch(x.float(), idx, w),  # wrong dtype
        lambda: gpu.dispatch(x.cpu(), idx, w),  # wrong device
        lambda: gpu.dispatch(x[:, :, :16], idx, w),  # wrong shape
        lambda: gpu.dispatch(x.transpose(0, 1).contiguous().transpose(0, 1), idx, w),  # non-contiguous
        lambda: gpu.plan(torch.zeros(i.R, i.S + 1, i.K, dtype=torch.int64, device="cuda")),  # s > max_tokens
        lambda: gpu.plan(idx, [0, 1, 1, 1]),  # num_tokens outside [1, s]
        lambda: gpu.plan(idx.float()),
    ]
    for bad in cases:
        with pytest.raises((ValueError, RuntimeError)):
            bad()
    # An expert id out of range is found on the device: the next call (or check()) raises ValueError.
    gpu.plan(idx + i.E)
    with pytest.raises(ValueError, match="expert"):
        gpu.check()
    # The buffer stays usable.
    cpu_ref = evenep.Buffer(**CFG)
    _eq(gpu.plan(idx), cpu_ref.plan(idx.cpu()))
    gpu.check()


def test_group_needs_a_process_group():
    # group= itself (torchrun, one process over the NCCL team): test_group.py
    with pytest.raises(TypeError, match="ProcessGroup"):
        evenep.Buffer(8, 2, 16, 32, group=object(), device="cuda")


# ---- issue 35: the Python lines on CUDA (the CPU table: test_bad_input.py) ----

from test_bad_input import _OPS, _TAMPER, _call, _good, _tampered  # noqa: E402


def _gpu_still_works(pair):
    cpu, gpu = pair
    x, idx, w = _good(cpu, seed=11)
    rx, _, _, h = cpu.dispatch(x, idx, w)
    rxg, _, _, hg = gpu.dispatch(*_cu(x, idx, w))
    _eq(gpu.combine(rxg, hg), cpu.combine(rx, h))
    gpu.check()


@pytest.mark.parametrize("op", _OPS)
@pytest.mark.parametrize("how", _TAMPER + ["changed and restored"])
def test_tampered_handle_cuda(pair, how, op):
    """A handle changed in place after dispatch (the version counter moved), made by hand or swapped to another
    plan: ValueError before anything is launched; the buffer stays usable."""
    _, gpu = pair
    x, idx, w = _good(gpu)
    recv_x, _, _, h = gpu.dispatch(x, idx, w)
    h = _tampered(gpu, h, how)
    with pytest.raises(ValueError, match="handle was (not made by this buffer's dispatch|written in place)"):
        _call(gpu, op, recv_x, h)
    _gpu_still_works(pair)


def test_handle_copies_and_other_buffers_cuda(pair):
    cpu, gpu = pair
    x, idx, w = _good(cpu, seed=1)
    rx, _, _, h = cpu.dispatch(x, idx, w)
    rxg, _, _, hg = gpu.dispatch(*_cu(x, idx, w))
    rxg2, _, _, hg2 = gpu.dispatch(*_cu(*_good(cpu, seed=2)))
    # a copy of a live handle (outside graph capture: matched by value) and an earlier live handle are valid
    _eq(gpu.combine(rxg, evenep.Handle(*(t.clone() for t in hg))), cpu.combine(rx, h))
    _eq(gpu.combine(rxg, hg), cpu.combine(rx, h))
    # another CUDA buffer's handle of a routing this one did not dispatch is not (one equal in value to a live
    # handle of this buffer, for an equal plan, is indistinguishable from a copy of it: accepted, and right)
    other = evenep.Buffer(**CFG, device="cuda")
    xo, idxo, wo = _good(cpu, seed=5)
    rxo, _, _, ho = other.dispatch(*_cu(xo, idxo, wo))
    for op in _OPS:  # its handle is refused (this buffer's dispatch did not make it)
        with pytest.raises(ValueError, match="(handle|plan tensor) was not made by this buffer"):
            _call(gpu, op, rxo, ho)
    rxo_c, _, _, ho_c = cpu.dispatch(xo, idxo, wo)
    _eq(other.combine(rxo, ho), cpu.combine(rxo_c, ho_c))
    _gpu_still_works(pair)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_expert_id_reported_as_given_cuda(pair, dtype):
    """A routing value of -5 is reported as -5 (int64 ids were clamped to [-2, E] and reported as -2)."""
    _, gpu = pair
    x, idx, w = _good(gpu)
    bad = idx.clone()
    bad[0, 1, 0] = -5
    gpu.plan(bad.to(dtype))
    with pytest.raises(ValueError, match="expert id -5 outside"):
        gpu.check()
    _gpu_still_works(pair)


def test_out_of_memory_cuda(pair):
    """A buffer larger than the GPU (R*NvS*H*2 bytes ~ 1 TiB of receive rows): torch.OutOfMemoryError."""
    with pytest.raises(torch.OutOfMemoryError):
        evenep.Buffer(8, 2, 2**22, 8192, virtual_ranks=8, token_padding=8, device="cuda")
    _gpu_still_works(pair)
