"""The planner policy of evenep.Buffer (docs/auto.md): auto by default, exact and slack on request.

Cases: the default is auto with the largest budget 0.1 (the receive buffer sized for it); under exact every rank
receives exactly its quota of (token, expert) entries, under auto and slack at most ceil((1 + eps) * quota); the
same routing gives the same plan on two buffers of one policy; bad policies and budgets are refused naming the value.
"""

import math

import pytest
import torch

import evenep
from conftest import make_routing, make_weights

R, E, K, S, H, TP = 4, 16, 2, 32, 32, 8


def _buf(**kw):
    return evenep.Buffer(E, K, S, H, virtual_ranks=R, ffn_hidden=16, token_padding=TP, **kw)


def _entries_per_rank(buf, kind, seed):
    idx = make_routing(kind, R, S, E, K, seed)
    x = torch.randn(R, S, H, generator=torch.Generator().manual_seed(seed)).bfloat16()
    _, _, _, h = buf.dispatch(x, idx, make_weights(idx, seed))
    dst = h.dst.reshape(-1).long()
    dst = dst[dst != -(2**31)]
    rows = torch.where(dst >= 0, dst, -(dst + 1))  # duplicates share their first entry's row
    return torch.bincount(rows // buf.num_recv_rows, minlength=R), int((idx >= 0).sum())


def test_default_is_auto():
    auto, exact = _buf(), _buf(policy="exact")
    assert auto.policy == "auto" and auto.slack is None and "policy=auto" in repr(auto)
    epn = E // R
    assert exact.num_recv_rows == math.ceil((S * K + (TP - 1) * 2 * epn) / TP) * TP
    cap = S * K + math.ceil(S * K * 0.1)  # slack_cap(S*K, 0.1)
    assert auto.num_recv_rows == math.ceil((cap + (TP - 1) * 2 * epn) / TP) * TP > exact.num_recv_rows


@pytest.mark.parametrize("kind", ["random", "hot_expert", "hot_rank"])
def test_exact_balance_and_budgets(kind):
    for seed in range(3):
        got, n = _entries_per_rank(_buf(policy="exact"), kind, seed)
        assert sorted(got.tolist()) == sorted(n // R + (r < n % R) for r in range(R))  # the even quotas
        for kw, eps in ((dict(), 0.1), (dict(policy="slack", slack=0.25), 0.25), (dict(policy="auto", slack=0.5), 0.5)):
            got, n = _entries_per_rank(_buf(**kw), kind, seed)
            q = math.ceil(n / R)
            assert int(got.sum()) == n and int(got.max()) <= q + math.ceil(q * eps), (kw, got.tolist())


def test_same_plan_on_two_buffers():
    idx = make_routing("hot_expert", R, S, E, K, 7)
    a, b = _buf(), _buf()
    assert torch.equal(a.plan(idx), b.plan(idx))


@pytest.mark.parametrize("kw, err, text", [
    (dict(policy="fastest"), ValueError, "fastest"),
    (dict(policy=1), TypeError, "policy = 1"),
    (dict(slack="0.1"), TypeError, "slack = '0.1'"),
    (dict(slack=1.5), ValueError, "slack = 1.5"),
    (dict(slack=float("nan")), ValueError, "slack = nan"),
    (dict(policy="exact", slack=0.2), ValueError, "slack = 0.2"),
    (dict(policy="slack"), ValueError, "none given"),
    (dict(policy="slack", slack=0.0), ValueError, "slack = 0"),
])
def test_bad_policy(kw, err, text):
    with pytest.raises(err, match=text.replace("(", r"\(").replace(".", r"\.")):
        _buf(**kw)
    _buf()  # a good buffer afterwards
