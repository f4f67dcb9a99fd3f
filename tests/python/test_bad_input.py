"""Bad input raises one clear error naming the value as given, and leaves the buffer usable (SPEC §8, issue 35).

Cases (each table row is one test; every failing call on a buffer is followed by a correct dispatch/combine on that
same buffer, checked against the fp32 sum):
  dispatch/plan tensors: wrong dtype of x / topk_idx / topk_weights (integer weights too), wrong device (meta),
      wrong shape (R, H, K), a non-contiguous x, expert ids out of range (int32 and int64; -5 reported as -5),
      s > max_tokens, num_tokens outside [1, s], of the wrong length, float counts (1.5, a float tensor), bool,
      past int32 and int64 (2**32 + 8, 2**63), a plan of another routing, a tensor that is not a tensor;
  Buffer(...) integers: every integer argument at 2**32 + 8, 2**63, 2**31 (max_tokens: the real number reported)
      and below its minimum (ValueError naming the value), as a float (Buffer(8.0)), a bool or a string
      (TypeError); E % R != 0, H % 8 != 0; group= not a process group; device="cuda" without the CUDA ops or a
      device; an allocation that fails (torch.OutOfMemoryError, in a subprocess with a small address-space limit);
  handles: dst changed in place (to another valid destination, out of range, negative), a hand-made dst, a handle
      of another buffer, a handle whose plan was swapped for another plan: ValueError from combine and from each
      backward op (combine_backward, combine_backward_weighted, dispatch_backward) — never a wrong result, a
      segfault or a hang; a copy of a live handle and a live handle of an earlier dispatch are accepted and give
      the right result; a handle that is not an evenep.Handle (TypeError).
"""

import subprocess
import sys
import textwrap

import pytest
import torch

import evenep
from conftest import make_routing, make_weights, rel_err

ops = torch.ops.evenep
CFG = dict(num_experts=8, top_k=2, max_tokens=16, hidden=32, virtual_ranks=4, ffn_hidden=16, token_padding=8)


def _good(buf, seed=0):
    """A correct (x, topk_idx, topk_weights) on the buffer's device (test_cuda.py uses these helpers too)."""
    i = buf.info
    idx = make_routing("random", i.R, i.S, i.E, i.K, seed)
    x = torch.randn(i.R, i.S, i.H, generator=torch.Generator().manual_seed(seed)).bfloat16()
    return tuple(t.to(buf.device) for t in (x, idx, make_weights(idx, seed)))


def _still_works(buf):
    x, idx, w = _good(buf, seed=7)
    recv_x, _, _, h = buf.dispatch(x, idx, w)
    out = buf.combine(recv_x, h, apply_weights=False)
    assert rel_err(out, x.float() * buf.info.K) <= 2**-8


def _one_line(e):
    msg = str(e.value).strip()
    assert msg and "\n" not in msg.split("\n")[0]
    return msg


# ---- dispatch / plan arguments ----------------------------------------------------------------------------------


def _dispatch_cases(buf):
    i = buf.info
    x, idx, w = _good(buf)
    over = idx.clone()
    over[1, 3, 0] = i.E
    neg = idx.int().clone()
    neg[2, 0, 1] = -2
    neg5 = idx.clone()
    neg5[0, 1, 0] = -5
    neg5_32 = neg5.int()
    huge = idx.clone()
    huge[3, 2, 1] = 2**40
    big = torch.zeros(i.R, i.S + 1, i.K, dtype=torch.int64)
    n = lambda *v: dict(num_tokens=list(v))  # noqa: E731
    # name -> (args, kwargs, exception, pattern)
    return {
        "x dtype": ((x.float(), idx, w), {}, ValueError, "x has dtype"),
        "x device": ((x.to("meta"), idx, w), {}, ValueError, "meta"),
        "x shape H": ((x[..., :16].contiguous(), idx, w), {}, ValueError, "x has shape"),
        "x ranks": ((x[:2].contiguous(), idx, w), {}, ValueError, "shape"),
        "x non-contiguous": ((x.transpose(0, 1).contiguous().transpose(0, 1), idx, w), {}, ValueError, "contiguous"),
        "x not a tensor": ((x.tolist(), idx, w), {}, TypeError, "x is a list"),
        "topk_idx dtype": ((x, idx.float(), w), {}, ValueError, "int32 or int64"),
        "topk_idx shape K": ((x, idx[..., :1].contiguous(), w), {}, ValueError, "shape"),
        "expert id too large": ((x, over, w), {}, ValueError, f"expert id {i.E}"),
        "expert id -2 int32": ((x, neg, w), {}, ValueError, "expert id -2"),
        "expert id -5 int64": ((x, neg5, w), {}, ValueError, "expert id -5 "),
        "expert id -5 int32": ((x, neg5_32, w), {}, ValueError, "expert id -5 "),
        "expert id 2**40": ((x, huge, w), {}, ValueError, "expert id 1099511627776 "),
        "weights float64": ((x, idx, w.double()), {}, ValueError, "topk_weights has dtype"),
        "weights int64": ((x, idx, torch.ones_like(idx)), {}, ValueError, "topk_weights has dtype"),
        "weights int32": ((x, idx, torch.ones_like(idx, dtype=torch.int32)), {}, ValueError, "topk_weights has dtype"),
        "weights bool": ((x, idx, idx >= 0), {}, ValueError, "topk_weights has dtype"),
        "s > max_tokens": ((torch.zeros(i.R, i.S + 1, i.H, dtype=torch.bfloat16), big, torch.zeros(big.shape)), {},
                           ValueError, "max_tokens"),
        "num_tokens 0": ((x, idx, w), n(16, 0, 16, 16), ValueError,
                         r"num_tokens\[1\] = 0 outside \[1, max_tokens = 16\]"),
        "num_tokens > max_tokens": ((x, idx, w), n(16, 17, 16, 16), ValueError,
                                    r"num_tokens\[1\] = 17 outside \[1, max_tokens = 16\]"),
        "num_tokens > s": ((x[:, :8].contiguous(), idx[:, :8].contiguous(), w[:, :8].contiguous()), n(8, 9, 8, 8),
                           ValueError, r"num_tokens\[1\] = 9 outside \[1, s = 8\]"),
        "num_tokens length": ((x, idx, w), n(16, 16), ValueError, "num_tokens has 2 values"),
        "num_tokens 1.5": ((x, idx, w), n(16, 1.5, 16, 16), TypeError, r"num_tokens\[1\] = 1.5 is not an integer"),
        "num_tokens 2.0": ((x, idx, w), n(2.0, 16, 16, 16), TypeError, r"num_tokens\[0\] = 2.0 is not an integer"),
        "num_tokens float tensor": ((x, idx, w), dict(num_tokens=torch.full((4,), 16.0)), TypeError, "float"),
        "num_tokens scalar": ((x, idx, w), dict(num_tokens=16), TypeError, "not a sequence"),
        "num_tokens bool": ((x, idx, w), n(16, True, 16, 16), TypeError, "bool"),
        "num_tokens 2**32 + 8": ((x, idx, w), n(16, 2**32 + 8, 16, 16), ValueError,
                                 r"= 4294967304 outside \[1, max_tokens = 16\]"),
        "num_tokens 2**63": ((x, idx, w), n(16, 2**63, 16, 16), ValueError, r"= 9223372036854775808 outside \[1, max"),
    }


_DISPATCH_CASES = list(_dispatch_cases(evenep.Buffer(**CFG)))


@pytest.mark.parametrize("case", _DISPATCH_CASES)
def test_bad_dispatch_input(small, case):
    args, kwargs, exc, pattern = _dispatch_cases(small)[case]
    with pytest.raises(exc, match=pattern) as e:
        small.dispatch(*args, **kwargs)
    _one_line(e)
    _still_works(small)


@pytest.mark.parametrize("case", ["expert id -5 int64", "expert id -5 int32", "num_tokens 1.5", "num_tokens 2**63"])
def test_bad_plan_input(small, case):
    args, kwargs, exc, pattern = _dispatch_cases(small)[case]
    with pytest.raises(exc, match=pattern):
        small.plan(args[1], **kwargs)
    _still_works(small)


def test_num_tokens_integer_forms(small):
    """Integer counts in any integer form (numpy, an integer tensor) are taken as given."""
    np = pytest.importorskip("numpy")
    x, idx, w = _good(small)
    n = [16, 3, 9, 1]
    ref = small.plan(idx, n)
    assert torch.equal(small.plan(idx, [np.int64(v) for v in n]), ref)
    assert torch.equal(small.plan(idx, torch.tensor(n)), ref)
    assert torch.equal(small.plan(idx, tuple(n)), ref)


def test_plan_of_other_routing(small):
    x, idx, w = _good(small)
    other = make_routing("hot_rank", *idx.shape[:2], small.info.E, small.info.K)
    with pytest.raises(ValueError):
        small.dispatch(x, idx, w, small.plan(other))
    _still_works(small)


def test_bad_combine_input(small):
    x, idx, w = _good(small)
    recv_x, _, _, h = small.dispatch(x, idx, w)
    with pytest.raises(ValueError, match="expert_out has dtype"):
        small.combine(recv_x.float(), h)
    with pytest.raises(ValueError, match="expert_out has shape"):
        small.combine(recv_x[:, :8].contiguous(), h)
    with pytest.raises(TypeError, match="expected the evenep.Handle"):
        small.combine(recv_x, tuple(h))
    out = small.combine(recv_x, h, apply_weights=False)
    assert rel_err(out, x.float() * small.info.K) <= 2**-8


# ---- Buffer(...) arguments --------------------------------------------------------------------------------------

_INT_ARGS = ["num_experts", "top_k", "max_tokens", "hidden", "virtual_ranks", "num_sms", "prefetch_slots",
             "ffn_hidden", "token_padding"]
_MIN = {"prefetch_slots": 0}


def _config_cases():
    cases = {}
    for name in _INT_ARGS:
        for v in (2**32 + 8, 2**63, 2**31):
            cases[f"{name}={v}"] = ({name: v}, ValueError, rf"{name} = {v} outside")
        lo = _MIN.get(name, 1)
        cases[f"{name}={lo - 1}"] = ({name: lo - 1}, ValueError, rf"{name} = {lo - 1} outside \[{lo}, ")
        cases[f"{name}=8.0"] = ({name: 8.0}, TypeError, rf"{name} = 8.0 is not an integer")
        cases[f"{name}=True"] = ({name: True}, TypeError, rf"{name} = True is a bool")
        cases[f"{name}='8'"] = ({name: "8"}, TypeError, rf"{name} = '8' is not an integer")
    cases["planner=1"] = ({"planner": 1}, TypeError, "planner = 1 is not a str")
    cases["planner='fast'"] = ({"planner": "fast"}, ValueError, "unknown mode 'fast'")
    cases["E % R"] = ({"num_experts": 6}, ValueError, "E = 6 is not a multiple of R = 4")
    cases["H % 8"] = ({"hidden": 30}, ValueError, "30")
    cases["top_k > 32"] = ({"top_k": 33}, ValueError, "K = 33")
    return cases


_CONFIG_CASES = _config_cases()


@pytest.mark.parametrize("case", list(_CONFIG_CASES))
def test_bad_config(small, case):
    change, exc, pattern = _CONFIG_CASES[case]
    with pytest.raises(exc, match=pattern) as e:
        evenep.Buffer(**{**CFG, **change})
    _one_line(e)
    _still_works(small)


def test_bad_config_positional():
    """Buffer(8.0): the issue's form (positional), TypeError rather than torch's RuntimeError."""
    with pytest.raises(TypeError, match=r"num_experts = 8.0 is not an integer"):
        evenep.Buffer(8.0, 2, 16, 32)
    with pytest.raises(ValueError, match=r"num_experts = 4294967304 outside \[1, 2147483647\]"):
        evenep.Buffer(2**32 + 8, 2, 16, 32)
    np = pytest.importorskip("numpy")
    assert evenep.Buffer(np.int64(8), 2, 16, 32, virtual_ranks=np.int32(4)).info.E == 8


def test_int_past_int32_refused_in_cpp():
    """The op itself (torch.ops.evenep.create_buffer, called without the Python checks) refuses what does not fit
    int32, naming it, instead of wrapping 2**32 + 8 to 8."""
    with pytest.raises(ValueError, match=r"num_experts = 4294967304 does not fit in int32"):
        ops.create_buffer(1, 2**32 + 8, 2, 16, 32, 32, -1, 8, "optimized")


def test_bad_config_other():
    with pytest.raises(TypeError, match="ProcessGroup"):
        evenep.Buffer(8, 2, 16, 32, group=object())
    if not evenep.cuda_built():
        with pytest.raises(NotImplementedError, match="no CUDA ops"):
            evenep.Buffer(8, 2, 16, 32, device="cuda")
    elif not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="no CUDA device"):
            evenep.Buffer(8, 2, 16, 32, device="cuda")
    with pytest.raises(NotImplementedError, match="only cpu and cuda"):
        evenep.Buffer(8, 2, 16, 32, device="meta")


def test_out_of_memory_is_torch_oom():
    """An allocation that fails (here: the buffer's receive rows, in a process limited to 1 GiB more address space
    than it already has) raises torch.OutOfMemoryError, not a bare std::bad_alloc; the process stays usable."""
    code = textwrap.dedent("""
        import resource, torch, evenep
        vm = int(open('/proc/self/status').read().split('VmSize:')[1].split()[0]) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (vm + 2**30, resource.RLIM_INFINITY))
        try:
            evenep.Buffer(8, 2, 2**20, 4096, virtual_ranks=4, token_padding=8)
        except torch.OutOfMemoryError as e:
            assert "out of host memory" in str(e), str(e)
            print("OOM:", str(e).splitlines()[0])
        b = evenep.Buffer(8, 2, 16, 32, virtual_ranks=4, token_padding=8)
        x = torch.randn(4, 16, 32).bfloat16()
        idx = torch.stack([torch.randperm(8)[:2] for _ in range(64)]).reshape(4, 16, 2)
        rx, _, _, h = b.dispatch(x, idx, torch.full((4, 16, 2), 0.5))
        print("ok", float((b.combine(rx, h, apply_weights=False).float() - 2 * x.float()).abs().max()))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "OOM: evenep: out of host memory" in r.stdout, r.stdout
    assert "ok 0.0" in r.stdout, r.stdout


# ---- handles ----------------------------------------------------------------------------------------------------


def _tampered(buf, h, how):
    """A handle whose dst was changed `how` (in place on h.dst, or a new tensor), or another buffer's handle."""
    i = buf.info
    dst = h.dst
    live = (dst >= 0).nonzero()
    r, c = live[0].tolist()
    if how == "swap two destinations":  # still a valid destination of the plan: would be a silently wrong result
        r2, c2 = live[1].tolist()
        a, b = dst[r, c].item(), dst[r2, c2].item()
        dst[r, c], dst[r2, c2] = b, a
    elif how == "out of range":  # was SIGSEGV
        dst[r, c] = i.R * i.nvs + 12345
    elif how == "negative":  # was a hang
        dst[r, c] = -(i.R * i.nvs) - 7
    elif how == "masked":
        dst[r, c] = -(2**31)
    elif how == "hand-made":
        return h._replace(dst=torch.zeros_like(dst))
    elif how == "changed and restored":  # equal again: the CPU accepts it (by value), CUDA refuses it (version)
        v = dst[r, c].item()
        dst[r, c] = v + 1
        dst[r, c] = v
    elif how == "other plan":
        x, idx, w = _good(buf, seed=3)
        return h._replace(plan=buf.plan(idx))
    else:
        raise ValueError(how)
    return h


_TAMPER = ["swap two destinations", "out of range", "negative", "masked", "hand-made", "other plan"]
_OPS = ["combine", "combine unweighted", "combine_backward", "combine_backward_weighted", "dispatch_backward"]


def _call(buf, op, recv_x, h):
    i = buf.info
    g = torch.ones(i.R, h.topk_weights.shape[1], i.H, device=buf.device).bfloat16()
    if op == "combine":
        return buf.combine(recv_x, h)
    if op == "combine unweighted":
        return buf.combine(recv_x, h, apply_weights=False)
    if op == "combine_backward":
        return ops.combine_backward(g, h.topk_weights, h.plan, h.dst, buf.id)
    if op == "combine_backward_weighted":
        return ops.combine_backward_weighted(g, recv_x, h.recv_w, h.topk_weights, h.plan, h.dst, buf.id)
    if op == "dispatch_backward":
        return ops.dispatch_backward(recv_x, torch.ones(i.R, i.nvs, device=buf.device), h.topk_weights, h.plan, h.dst,
                                     buf.id)
    raise ValueError(op)


@pytest.mark.parametrize("op", _OPS)
@pytest.mark.parametrize("how", _TAMPER)
def test_tampered_handle(small, how, op):
    x, idx, w = _good(small)
    recv_x, _, _, h = small.dispatch(x, idx, w)
    h = _tampered(small, h, how)
    with pytest.raises(ValueError, match="handle was not made by this buffer's dispatch") as e:
        _call(small, op, recv_x, h)
    _one_line(e)
    _still_works(small)


@pytest.mark.parametrize("op", _OPS)
def test_handle_of_another_buffer(small, op):
    other = evenep.Buffer(**CFG)
    x, idx, w = _good(other, seed=5)
    recv_x, _, _, h = other.dispatch(x, idx, w)
    small.dispatch(*_good(small))  # this buffer's own, different, dispatch
    with pytest.raises(ValueError, match="handle was not made by this buffer's dispatch"):
        _call(small, op, recv_x, h)
    _still_works(small)
    _call(other, op, recv_x, h)  # still valid where it came from


def test_handle_copies_and_earlier_handles(small):
    """Valid: a copy of a live handle (opcheck makes those), and the handle of an earlier dispatch while its tensors
    are alive (re-dispatched from its plan, SPEC: no op depends on the call history)."""
    i = small.info
    x1, idx1, w1 = _good(small, seed=1)
    x2, idx2, w2 = _good(small, seed=2)
    rx1, _, _, h1 = small.dispatch(x1, idx1, w1)
    rx2, _, _, h2 = small.dispatch(x2, idx2, w2)
    copy = evenep.Handle(*(t.clone() for t in h1))
    for rx, h, x in ((rx1, h1, x1), (rx2, h2, x2), (rx1, copy, x1)):
        assert rel_err(small.combine(rx, h, apply_weights=False), x.float() * i.K) <= 2**-8


def test_changed_in_place_then_restored_cpu(small):
    """The CPU recognises a handle by value: changed and changed back is the handle dispatch made (the CUDA ops,
    which recognise it by identity and version counter, refuse it: test_cuda.py)."""
    x, idx, w = _good(small)
    recv_x, _, _, h = small.dispatch(x, idx, w)
    h = _tampered(small, h, "changed and restored")
    assert rel_err(small.combine(recv_x, h, apply_weights=False), x.float() * small.info.K) <= 2**-8


def test_tampered_handle_in_autograd(small):
    """dispatch's saved handle changed in place before backward: torch's saved-tensor version check refuses it (the
    backward op never runs with it)."""
    x, idx, w = _good(small)
    xg = x.float().requires_grad_()
    recv_x, _, _, h = small.dispatch(xg.bfloat16(), idx, w)
    out = small.combine(recv_x, h, apply_weights=False)
    h.dst[0, 0] = h.dst[0, 1]
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.float().sum().backward()
    _still_works(small)


def test_moe_bad_router(small):
    i = small.info
    with pytest.raises(ValueError, match="router"):
        evenep.nn.MoE(i.H, 16, i.E, i.K, buffer=small, router="relu")
    with pytest.raises(ValueError, match="does not match"):
        evenep.nn.MoE(i.H, 16, i.E + 4, i.K, buffer=small)


def test_moe_bad_input_shape(small):
    """x of the wrong hidden size or rank count: a ValueError naming the layer and the shape (not the router
    matmul's error), and the layer keeps working."""
    i = small.info
    moe = evenep.nn.MoE(i.H, 16, i.E, i.K, buffer=small)
    for bad in (torch.randn(i.R, i.S, i.H + 1), torch.randn(i.R * i.S, i.H)):
        with pytest.raises(ValueError, match=r"evenep.nn.MoE: x has shape .*expected \[R = 4, s, H = 32\]"):
            moe(bad)
    assert moe(torch.randn(i.R, i.S, i.H)).shape == (i.R, i.S, i.H)
