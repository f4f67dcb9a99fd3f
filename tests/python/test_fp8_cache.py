"""The FP8 weight cast cache of nn.MoE(fp8=True) (evenep.fp8.WeightCastCache; docs/python.md "FP8") on the CPU.

Cases:
  equal        the kept cast is byte for byte a fresh evenep.fp8.quantize_weight (with and without ue8m0), and the
               layer with the cache gives the same output as the layer without it
  once         forwards (and backwards: gradient accumulation) without a weight change cast each weight once
               (calls of ops.quantize_fp8_weight counted through monkeypatch); cache_fp8_weights=False casts every
               forward, as before
  updates      each update the cache detects makes the next forward cast again, and the output equals a layer built
               fresh from the updated weights: SGD step (for-loop, foreach, fused: fused kernels do not bump the
               version counter, the optimizer post-step hook does), no_grad add_, load_state_dict, nn.init,
               a replaced Parameter, `.data = t`
  .data        a write through .data is not detected (documented); fp8_weights_changed() recasts
  grads        gradient accumulation over two micro-batches, an SGD step, two more: outputs and every gradient equal
               bit for bit to the uncached layer's
  modes        a cast made under inference_mode is not saved by a training forward (recast); one made in training
               is reused under no_grad and inference_mode; a copied (deepcopy, pickle) cache starts empty; refusal of
               a non-bool flag
  compile      torch.compile(fullgraph=True, aot_eager) of the cached layer equals eager (the cast stays in the graph)
"""

import copy
import pickle

import pytest
import torch

import evenep
from conftest import make_routing, make_weights
from evenep import fp8

R, E, K, S, H, F = 4, 8, 2, 16, 128, 128


@pytest.fixture(scope="module")
def buf():
    return evenep.Buffer(E, K, S, H, virtual_ranks=R, ffn_hidden=F, token_padding=8, fp8=True)


def _moe(buf, seed=0, **kw):
    torch.manual_seed(seed)
    return evenep.nn.MoE(H, F, E, K, buffer=buf, fp8=True, **kw)


def _fresh(buf, moe, **kw):
    """A new layer holding moe's current weights (copied)."""
    m = _moe(buf, 99, **kw)
    m.load_state_dict(moe.state_dict())
    return m


def _inputs(seed=0):
    idx = make_routing("random", R, S, E, K, seed)
    x = torch.randn(R, S, H, generator=torch.Generator().manual_seed(seed + 1))
    return x, (idx, make_weights(idx, seed))


def _bytes(t):
    return t.contiguous().view(torch.uint8)


@pytest.fixture
def casts(monkeypatch):
    """Counts calls of torch.ops.evenep.quantize_fp8_weight (every weight cast of the package goes through it)."""
    count = [0]
    op = fp8.ops.quantize_fp8_weight

    def counting(*args, **kw):
        count[0] += 1
        return op(*args, **kw)

    monkeypatch.setattr(fp8.ops, "quantize_fp8_weight", counting)
    return count


# --- equal ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("ue8m0", [False, True])
def test_kept_cast_is_a_fresh_cast(ue8m0):
    w = torch.nn.Parameter(torch.randn(2, 256, 128) * 0.05)
    cache = fp8.WeightCastCache()
    first = cache.cast(w, (w,), ue8m0)
    again = cache.cast(w, (w,), ue8m0)
    assert again[0] is first[0] and again[1] is first[1]
    q, s = fp8.quantize_weight(w.detach(), ue8m0)
    assert torch.equal(_bytes(again[0]), _bytes(q)) and torch.equal(again[1], s)
    other = cache.cast(w, (w,), not ue8m0)  # ue8m0 is part of the key
    q2, s2 = fp8.quantize_weight(w.detach(), not ue8m0)
    assert torch.equal(_bytes(other[0]), _bytes(q2)) and torch.equal(other[1], s2)


def test_layer_output_equals_uncached(buf):
    x, routing = _inputs()
    cached, plain = _moe(buf), _moe(buf, cache_fp8_weights=False)
    for _ in range(2):
        assert torch.equal(cached(x, routing=routing), plain(x, routing=routing))


# --- once -----------------------------------------------------------------------------------------------------------
def test_unchanged_weights_cast_once(buf, casts):
    x, routing = _inputs()
    moe = _moe(buf)
    outs = []
    for _ in range(3):  # gradient accumulation: three micro-batches, no step
        out = moe(x, routing=routing)
        out.sum().backward()
        outs.append(out.detach())
    assert casts[0] == 2  # (w_gate|w_up) and w_down, once each
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])
    with torch.no_grad():
        moe(x, routing=routing)
    assert casts[0] == 2


def test_uncached_casts_every_forward(buf, casts):
    x, routing = _inputs()
    moe = _moe(buf, cache_fp8_weights=False)
    moe(x, routing=routing)
    moe(x, routing=routing)
    assert casts[0] == 4


# --- updates --------------------------------------------------------------------------------------------------------
def _sgd(moe, **kw):
    for p in moe.parameters():
        p.grad = torch.randn_like(p) * 0.1
    torch.optim.SGD(moe.parameters(), lr=1.0, **kw).step()


def _replace(moe):
    moe.w_down = torch.nn.Parameter(moe.w_down.detach() * 0.5)


def _assign_data(moe):
    moe.w_gate.data = moe.w_gate.detach() * 0.5


def _no_grad_add(moe):
    with torch.no_grad():
        moe.w_up.add_(0.01)


def _load(moe):
    state = {k: v * 0.5 for k, v in moe.state_dict().items()}
    moe.load_state_dict(state)


UPDATES = {
    "sgd": lambda m: _sgd(m, foreach=False),
    "sgd_foreach": lambda m: _sgd(m, foreach=True),
    "sgd_fused": lambda m: _sgd(m, fused=True),
    "no_grad_add": _no_grad_add,
    "load_state_dict": _load,
    "init": lambda m: torch.nn.init.uniform_(m.w_down, -0.1, 0.1),
    "replace_parameter": _replace,
    "assign_data": _assign_data,
}


@pytest.mark.parametrize("update", list(UPDATES))
def test_update_recasts(buf, casts, update):
    x, routing = _inputs(1)
    moe = _moe(buf)
    before = moe(x, routing=routing)
    assert casts[0] == 2
    UPDATES[update](moe)
    out = moe(x, routing=routing)
    assert casts[0] > 2, "the update was not detected"
    assert not torch.equal(out, before)
    assert torch.equal(out, _fresh(buf, moe, cache_fp8_weights=False)(x, routing=routing))


def test_data_writes_are_not_detected(buf, casts):
    x, routing = _inputs(2)
    moe = _moe(buf)
    before = moe(x, routing=routing)
    moe.w_down.data.mul_(0.5)  # .data has a version counter of its own: the kept cast is stale (documented)
    assert torch.equal(moe(x, routing=routing), before) and casts[0] == 2
    moe.fp8_weights_changed()
    out = moe(x, routing=routing)
    assert casts[0] == 4
    assert torch.equal(out, _fresh(buf, moe, cache_fp8_weights=False)(x, routing=routing))


# --- grads ----------------------------------------------------------------------------------------------------------
def test_gradients_equal_uncached(buf):
    cached, plain = _moe(buf), _moe(buf, cache_fp8_weights=False)
    opts = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (cached, plain)]
    for step in range(2):
        for micro in range(2):
            x, routing = _inputs(10 * step + micro)
            w = routing[1].clone()
            res = []
            for m in (cached, plain):
                xi, wi = x.clone().requires_grad_(), w.clone().requires_grad_()
                out = m(xi, routing=(routing[0], wi))
                out.pow(2).sum().backward()
                res.append((out, xi.grad, wi.grad))
            for a, b in zip(*res):
                assert torch.equal(a, b)
            for (name, p), q in zip(cached.named_parameters(), plain.parameters()):
                # (router_weight has no gradient: the routing is given)
                assert (p.grad is None and q.grad is None) or torch.equal(p.grad, q.grad), (step, micro, name)
            assert cached.w_gate.grad.abs().max() > 0 and cached.w_down.grad.abs().max() > 0
        for o in opts:
            o.step()
            o.zero_grad()
        for p, q in zip(cached.parameters(), plain.parameters()):
            assert torch.equal(p, q)


# --- modes ----------------------------------------------------------------------------------------------------------
def test_inference_mode_cast_not_saved_by_training(buf, casts):
    x, routing = _inputs(3)
    moe = _moe(buf)
    with torch.inference_mode():
        ref = moe(x, routing=routing)
    assert casts[0] == 2
    out = moe(x, routing=routing)  # an inference tensor cannot be saved for backward: cast again
    out.sum().backward()
    assert casts[0] == 4 and torch.equal(out, ref)
    with torch.inference_mode():
        moe(x, routing=routing)
    with torch.no_grad():
        moe(x, routing=routing)
    assert casts[0] == 4  # a training cast serves inference


def test_copy_starts_empty():
    # (the cache alone; a deepcopy of nn.MoE shares its evenep.Buffer: test_moe.py::test_deepcopy_shares_buffer)
    w = torch.nn.Parameter(torch.randn(256, 128))
    cache = fp8.WeightCastCache()
    cache.cast(w, (w,), False)
    for twin in (copy.deepcopy(cache), pickle.loads(pickle.dumps(cache))):
        assert twin._cast is None and twin._refs == ()
        q, s = twin.cast(w, (w,), False)
        assert torch.equal(_bytes(q), _bytes(cache._cast[0])) and torch.equal(s, cache._cast[1])


def test_flag_refused(buf):
    with pytest.raises(ValueError, match="cache_fp8_weights = 1"):
        evenep.nn.MoE(H, F, E, K, buffer=buf, fp8=True, cache_fp8_weights=1)


# --- compile --------------------------------------------------------------------------------------------------------
def test_compile_fullgraph(buf):
    x, routing = _inputs(5)
    moe = _moe(buf)
    ref = moe(x, routing=routing)
    compiled = torch.compile(moe, fullgraph=True, backend="aot_eager")
    out = compiled(x, routing=routing)
    assert torch.equal(out, ref)
    out.sum().backward()
    _sgd(moe)  # the compiled graph casts the updated weights
    assert torch.equal(compiled(x, routing=routing), _fresh(buf, moe)(x, routing=routing))
