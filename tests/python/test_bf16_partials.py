"""evenep.Buffer(bf16_partials=True): combine's partial sums of >= 2 entries cross as bf16 (DataPrecision::
bf16_partials, upstream MoonEP's format; docs/fp8.md section 4).

Cases (CPU backend): the argument is a bool (anything else: ValueError naming it) and shows in repr; tokens whose
entries land on distinct ranks (no chain of >= 2) combine bit for bit as with fp32 partials; on the others the result
is the sum of the ranks' partials with each multi-entry partial rounded to bf16 (a Python emulation built from the
dispatch handle's destinations, within the output's bf16 rounding) and differs from the fp32-partials result
somewhere; combine with apply_weights=False alike; nn.MoE over such a buffer runs forward and backward close to the
default. CUDA (skipped without a device): the GPU combine equals the CPU backend's bit for bit, with the knob.
"""

import pytest
import torch

import evenep
from conftest import make_routing, make_weights, rel_err

CFG = dict(num_experts=16, top_k=4, max_tokens=32, hidden=64, virtual_ranks=4, ffn_hidden=32, token_padding=8)


def _entry_ranks(buf, h):
    """Destination rank of every entry ([R, s, K] long, -1 for masked), from the dispatch handle."""
    i = buf.info
    dst = h.dst.reshape(i.R, -1, i.K).long()
    masked = dst == -(2**31)
    flat = torch.where(dst >= 0, dst, -(dst + 1))
    return torch.where(masked, torch.full_like(flat, -1), flat // i.nvs)


def _run(buf, seed=0, kind="random"):
    i = buf.info
    idx = make_routing(kind, i.R, i.S, i.E, i.K, seed)
    x = torch.randn(i.R, i.S, i.H, generator=torch.Generator().manual_seed(seed)).bfloat16()
    w = make_weights(idx, seed)
    recv_x, _, _, h = buf.dispatch(x, idx, w)
    # a per-row expert output that differs between the entries of one token: y = bf16(x * (1 + expert / 8))
    scale = 1 + idx.clamp_min(0).float() / 8  # [R, s, K]
    return x, idx, w, h, scale


def _emulated(x, idx, w, ranks, scale, apply_weights=True):
    """bf16(sum over destination ranks of the rank's partial), a partial of >= 2 entries rounded to bf16 first."""
    xf = x.float()
    R, s, K = idx.shape
    out = torch.zeros_like(xf)
    for r in range(R):
        for t in range(s):
            acc = torch.zeros(x.shape[-1])
            for d in ranks[r, t].unique().tolist():
                if d < 0:
                    continue
                ks = (ranks[r, t] == d).nonzero().flatten().tolist()
                part = torch.zeros(x.shape[-1])
                for k in ks:
                    yk = (xf[r, t] * scale[r, t, k]).bfloat16().float()
                    part += (w[r, t, k] if apply_weights else 1.0) * yk
                acc += part.bfloat16().float() if len(ks) > 1 else part
            out[r, t] = acc
    return out.bfloat16()


def _expert_outputs(buf, h, x, idx, scale):
    """recv rows y_e = bf16(x * (1 + e / 8)) for every entry's receive row (duplicates included)."""
    i = buf.info
    dst = h.dst.reshape(i.R, -1, i.K).long()
    used = dst != -(2**31)
    rows = torch.where(dst >= 0, dst, -(dst + 1))
    y = torch.zeros(i.R * i.nvs, i.H, dtype=torch.bfloat16)
    src = (x.float().unsqueeze(2) * scale.unsqueeze(-1)).bfloat16()  # [R, s, K, H]
    y[rows[used]] = src[used]
    return y.reshape(i.R, i.nvs, i.H)


@pytest.mark.parametrize("bad", [1, "yes", None, 1.0])
def test_flag_must_be_bool(bad):
    with pytest.raises(ValueError, match="bf16_partials"):
        evenep.Buffer(**CFG, bf16_partials=bad)


def test_repr_and_attribute():
    b = evenep.Buffer(**CFG, bf16_partials=True)
    assert b.bf16_partials and "bf16_partials" in repr(b)
    d = evenep.Buffer(**CFG)
    assert not d.bf16_partials and "bf16_partials" not in repr(d)


@pytest.mark.parametrize("apply_weights", [True, False])
@pytest.mark.parametrize("seed", [0, 1])
def test_multi_entry_partials_round_to_bf16(seed, apply_weights):
    plain, knob = evenep.Buffer(**CFG), evenep.Buffer(**CFG, bf16_partials=True)
    x, idx, w, h, scale = _run(plain, seed)
    _, _, _, hk, _ = _run(knob, seed)
    assert torch.equal(h.dst, hk.dst)  # same plan: the knob changes only how combine sends partials
    y = _expert_outputs(plain, h, x, idx, scale)
    out = plain.combine(y, h, apply_weights=apply_weights)
    out_k = knob.combine(y, hk, apply_weights=apply_weights)
    ranks = _entry_ranks(plain, h)
    # tokens with no two entries on one rank: bit for bit the default's
    chains = torch.stack([(ranks == ranks[..., k : k + 1]).sum(-1) for k in range(ranks.shape[-1])], -1)
    multi = ((chains >= 2) & (ranks >= 0)).any(-1)  # [R, s]
    assert multi.any() and (~multi).any()
    assert torch.equal(out_k[~multi], out[~multi])
    # the others: the emulated bf16-partial sum, within the output's rounding; and not the fp32-partial result
    ref = _emulated(x, idx, w, ranks, scale, apply_weights)
    assert rel_err(out_k, ref) <= 2**-8
    assert not torch.equal(out_k[multi], out[multi])
    full = _emulated(x, idx, w, torch.arange(idx.shape[-1]).expand_as(idx).where(idx >= 0, -1), scale, apply_weights)
    assert rel_err(out, full) <= 2**-8  # the default: no partial rounded (every entry its own "rank" here)


def test_moe_forward_backward_close_to_default():
    torch.manual_seed(0)
    H, F, E, K = 64, 32, 16, 4
    layers = []
    for knob in (False, True):
        buf = evenep.Buffer(E, K, 32, H, virtual_ranks=4, ffn_hidden=F, token_padding=8, bf16_partials=knob)
        torch.manual_seed(0)
        layers.append(evenep.nn.MoE(H, F, E, K, buffer=buf))
    x = torch.randn(4, 32, H)
    outs, grads = [], []
    for moe in layers:
        xi = x.clone().requires_grad_(True)
        out = moe(xi)
        out.float().square().sum().backward()
        outs.append(out.detach())
        grads.append(xi.grad)
    assert rel_err(outs[1], outs[0]) <= 2**-6
    assert rel_err(grads[1], grads[0]) <= 2**-5
    assert not torch.equal(outs[1], outs[0])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.skipif(not evenep.cuda_built(), reason="evenep built without the CUDA ops")
def test_cuda_combine_matches_cpu():
    cpu, gpu = evenep.Buffer(**CFG, bf16_partials=True), evenep.Buffer(**CFG, bf16_partials=True, device="cuda")
    x, idx, w, h, scale = _run(cpu, 3)
    _, _, _, hg = gpu.dispatch(x.cuda(), idx.cuda(), w.cuda())
    assert torch.equal(hg.dst.cpu(), h.dst)
    y = _expert_outputs(cpu, h, x, idx, scale)
    for apply in (True, False):
        assert torch.equal(gpu.combine(y.cuda(), hg, apply).cpu(), cpu.combine(y, h, apply))
