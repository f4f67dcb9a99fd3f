"""evenep.nn.MoE against the plain PyTorch MoE (evenep.nn.TorchMoE) with the same parameters.

Cases: forward and backward (output, grad x, grad of the route weights / router weight, every expert weight) on
the adversarial routings of SPEC §7 (hot expert, hot rank, all remote, all K on one remote rank, masked entries)
and unequal s; softmax and sigmoid routers; fp32 and bf16 parameters; a shared expert; two layers sharing one
buffer; copy.deepcopy of a layer shares its buffer (pickling a Buffer is refused). Tolerance: rel = max|got - ref| / max|ref| <= 2e-2 per tensor, the CPU oracle's (cpu::default_tolerances,
tests/unit/cpu_moe_layer_test.cpp): the EP path stores bf16 between the GEMMs, the reference does not.
"""

import copy

import pytest
import torch

import evenep
from conftest import ROUTINGS, make_routing, make_weights, rel_err

TOL = 2e-2  # cpu::default_tolerances()


def _pair(buf, dtype=torch.float32, router="softmax", shared=None, seed=0):
    i = buf.info
    torch.manual_seed(seed)
    moe = evenep.nn.MoE(i.H, i.ffn_hidden, i.E, i.K, buffer=buf, router=router, shared_expert=shared, dtype=dtype)
    ref = evenep.nn.TorchMoE(i.H, i.ffn_hidden, i.E, i.K, router=router, shared_expert=copy.deepcopy(shared),
                             dtype=dtype)
    ref.load_state_dict(moe.state_dict())
    return moe, ref


def _run(mod, x, g, **kw):
    x = x.clone().requires_grad_()
    out = mod(x, **kw)
    out.backward(g)
    return out, x.grad


def _check(moe, ref, x, g, ref_kw=None, **kw):
    out, gx = _run(moe, x, g, **kw)
    out_r, gx_r = _run(ref, x, g, **(kw if ref_kw is None else ref_kw))
    assert rel_err(out, out_r) <= TOL, "out"
    assert rel_err(gx, gx_r) <= TOL, "grad x"
    for name, p in moe.named_parameters():
        p_r = dict(ref.named_parameters())[name]
        if p_r.grad is None:
            assert p.grad is None or p.grad.abs().max() == 0, name
            continue
        assert rel_err(p.grad, p_r.grad) <= TOL, name


@pytest.mark.parametrize("kind", ROUTINGS[1:])
def test_moe_adversarial_routings(small, kind):
    i = small.info
    moe, ref = _pair(small)
    idx = make_routing(kind, i.R, i.S, i.E, i.K)
    tw = make_weights(idx).requires_grad_()
    tw_r = tw.detach().clone().requires_grad_()
    x = torch.randn(i.R, i.S, i.H).bfloat16().float()
    g = torch.randn(i.R, i.S, i.H)
    _check(moe, ref, x, g, ref_kw={"routing": (idx, tw_r)}, routing=(idx, tw))
    assert rel_err(tw.grad, tw_r.grad) <= TOL, "grad topk_weights"
    assert tw.grad[idx < 0].abs().sum() == 0


@pytest.mark.parametrize("router", ["softmax", "sigmoid"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_moe_router(small, router, dtype):
    i = small.info
    moe, ref = _pair(small, dtype=dtype, router=router)
    x = torch.randn(i.R, i.S, i.H).to(dtype)
    g = torch.randn(i.R, i.S, i.H).to(dtype)
    _check(moe, ref, x, g)


def test_moe_unequal_tokens(small):
    i = small.info
    moe, ref = _pair(small)
    n = [5, 16, 1, 11]
    x = torch.randn(i.R, i.S, i.H)
    valid = (torch.arange(i.S)[None, :] < torch.tensor(n)[:, None]).unsqueeze(-1)
    g = torch.randn(i.R, i.S, i.H) * valid
    _check(moe, ref, x, g, num_tokens=n)
    out = moe(x, num_tokens=n)
    assert out[~valid.expand_as(out)].abs().sum() == 0


def test_moe_variable_s_and_shared_expert():
    buf = evenep.Buffer(8, 2, 16, 32, virtual_ranks=4, ffn_hidden=16, token_padding=8)
    shared = torch.nn.Linear(32, 32)
    moe, ref = _pair(buf, shared=shared)
    for s in (16, 3, 9):  # s <= max_tokens changes from call to call
        x = torch.randn(4, s, 32)
        _check(moe, ref, x, torch.randn(4, s, 32))
        moe.zero_grad()
        ref.zero_grad()


def test_two_layers_share_one_buffer(small):
    i = small.info
    a, a_r = _pair(small, seed=1)
    b, b_r = _pair(small, seed=2)
    x = torch.randn(i.R, i.S, i.H)
    g = torch.randn(i.R, i.S, i.H)
    net = torch.nn.Sequential(a, b)
    net_r = torch.nn.Sequential(a_r, b_r)
    _check(net, net_r, x, g)


def test_deepcopy_shares_buffer(small):
    """copy.deepcopy of a layer (an EMA or reference model) shares its Buffer: the copy computes what the original
    does, and collecting the copy does not release the original's buffer. Pickling a Buffer is refused by name."""
    import gc
    import pickle

    i = small.info
    moe, _ = _pair(small, seed=3)
    twin = copy.deepcopy(moe)
    assert twin.buffer is moe.buffer and copy.copy(small) is small
    assert all(p is not q for p, q in zip(twin.parameters(), moe.parameters()))
    x = torch.randn(i.R, i.S, i.H)
    assert torch.equal(twin(x), moe(x))
    del twin
    gc.collect()
    assert moe(x).shape == x.shape  # the original's buffer is alive
    with pytest.raises(TypeError, match="evenep.Buffer cannot be pickled"):
        pickle.dumps(small)


def test_compile_fullgraph(small):
    i = small.info
    moe, ref = _pair(small)
    compiled = torch.compile(moe, fullgraph=True, backend="aot_eager")
    x = torch.randn(i.R, i.S, i.H)
    g = torch.randn(i.R, i.S, i.H)
    out, gx = _run(compiled, x, g)
    out_r, gx_r = _run(ref, x, g)
    assert rel_err(out, out_r) <= TOL and rel_err(gx, gx_r) <= TOL
    assert rel_err(moe.w_down.grad, ref.w_down.grad) <= TOL


@pytest.mark.slow
def test_compile_fullgraph_inductor(small):
    i = small.info
    moe, ref = _pair(small)
    compiled = torch.compile(moe, fullgraph=True)
    x = torch.randn(i.R, i.S, i.H)
    out = compiled(x)
    assert rel_err(out, ref(x)) <= TOL
