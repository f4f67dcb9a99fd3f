"""Bad input raises one clear ValueError (or RuntimeError) and leaves the buffer usable (SPEC §8).

Cases: wrong dtype of x / topk_idx / topk_weights, wrong device (meta tensor), wrong shape (R, H, K), a
non-contiguous x, expert ids out of range (int32 and int64), s > max_tokens, num_tokens outside [1, s], a plan of
another routing, a bad configuration (E % R != 0), group= not a process group, device="cuda" without the CUDA ops
or a device (group= itself: test_group.py); after each failure a correct dispatch/combine still gives the right
answer.
"""

import pytest
import torch

import evenep
from conftest import make_routing, make_weights, rel_err


def _good(buf):
    i = buf.info
    idx = make_routing("random", i.R, i.S, i.E, i.K)
    return torch.randn(i.R, i.S, i.H).bfloat16(), idx, make_weights(idx)


def _still_works(buf):
    x, idx, w = _good(buf)
    recv_x, _, _, h = buf.dispatch(x, idx, w)
    out = buf.combine(recv_x, h, apply_weights=False)
    assert rel_err(out, x.float() * buf.info.K) <= 2**-8


def _bad_cases(buf):
    i = buf.info
    x, idx, w = _good(buf)
    over = idx.clone()
    over[1, 3, 0] = i.E
    neg = idx.int().clone()
    neg[2, 0, 1] = -2
    big = torch.zeros(i.R, i.S + 1, i.K, dtype=torch.int64)
    return {
        "x dtype": ((x.float(), idx, w), "dtype"),
        "x device": ((x.to("meta"), idx, w), "device|meta"),
        "x shape H": ((x[..., :16].contiguous(), idx, w), "shape"),
        "x ranks": ((x[:2].contiguous(), idx, w), "shape"),
        "x non-contiguous": ((x.transpose(0, 1).contiguous().transpose(0, 1), idx, w), "contiguous"),
        "topk_idx dtype": ((x, idx.float(), w), "int32 or int64"),
        "topk_idx shape K": ((x, idx[..., :1].contiguous(), w), "shape"),
        "expert id too large": ((x, over, w), "outside"),
        "expert id -2": ((x, neg, w), "-2"),
        "weights dtype": ((x, idx, w.double()), "dtype"),
        "s > max_tokens": ((torch.zeros(i.R, i.S + 1, i.H, dtype=torch.bfloat16), big, torch.zeros(big.shape)),
                           "max_tokens"),
    }


@pytest.mark.parametrize("case", [
    "x dtype", "x device", "x shape H", "x ranks", "x non-contiguous", "topk_idx dtype", "topk_idx shape K",
    "expert id too large", "expert id -2", "weights dtype", "s > max_tokens",
])
def test_bad_dispatch_input(small, case):
    args, pattern = _bad_cases(small)[case]
    with pytest.raises((ValueError, RuntimeError, NotImplementedError), match=pattern) as e:
        small.dispatch(*args)
    assert "\n" not in str(e.value).strip().split("\n")[0]
    _still_works(small)


def test_bad_num_tokens(small):
    x, idx, w = _good(small)
    with pytest.raises(ValueError, match=r"num_tokens\[1\] = 0"):
        small.dispatch(x, idx, w, num_tokens=[4, 0, 4, 4])
    with pytest.raises(ValueError, match="num_tokens has 2 values"):
        small.plan(idx, [4, 4])
    _still_works(small)


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
    out = small.combine(recv_x, h, apply_weights=False)
    assert rel_err(out, x.float() * small.info.K) <= 2**-8


def test_bad_config():
    with pytest.raises(ValueError, match="E"):
        evenep.Buffer(6, 2, 16, 32, virtual_ranks=4)
    with pytest.raises(ValueError):
        evenep.Buffer(8, 2, 16, 30, virtual_ranks=4)  # H % 8 != 0
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


def test_moe_bad_router(small):
    i = small.info
    with pytest.raises(ValueError, match="router"):
        evenep.nn.MoE(i.H, 16, i.E, i.K, buffer=small, router="relu")
    with pytest.raises(ValueError, match="does not match"):
        evenep.nn.MoE(i.H, 16, i.E + 4, i.K, buffer=small)
