"""Shared fixtures of the Python tests: small buffers and the adversarial routings of SPEC §7.

Routings (topk_idx [R, s, K], -1 masked; distinct experts per token where possible):
  random        uniform distinct experts
  hot_expert    every entry of every token to expert 0 (one per token; the other k masked)
  hot_rank      all entries to rank 0's experts
  all_remote    each rank routes only to the next rank's experts
  one_remote    all K entries of a token on one remote rank
  masked        random with about a third of the entries masked (and one token fully masked)
"""

import atexit
import contextlib
import os
import shutil
import tempfile

# torch.compile's on-disk caches (inductor's FX graph cache, under /tmp/torchinductor_$USER by default) may hold a
# graph compiled against another version of evenep's ops (their fake kernels' output shapes are not part of the
# cache key): every test run gets its own, removed at exit. Set before torch is imported.
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    _inductor_cache = tempfile.mkdtemp(prefix="evenep-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = _inductor_cache
    atexit.register(shutil.rmtree, _inductor_cache, ignore_errors=True)

import pytest  # noqa: E402
import torch  # noqa: E402

import evenep

ROUTINGS = ["random", "hot_expert", "hot_rank", "all_remote", "one_remote", "masked"]


def make_routing(kind, R, s, E, K, seed=0):
    g = torch.Generator().manual_seed(seed)
    epn = E // R
    idx = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(R * s)]).reshape(R, s, K)
    if kind == "random":
        pass
    elif kind == "hot_expert":
        idx[:] = -1
        idx[..., 0] = 0
    elif kind == "hot_rank":
        assert K <= epn
        idx = torch.stack([torch.randperm(epn, generator=g)[:K] for _ in range(R * s)]).reshape(R, s, K)
    elif kind == "all_remote":
        assert K <= epn
        local = torch.stack([torch.randperm(epn, generator=g)[:K] for _ in range(R * s)]).reshape(R, s, K)
        idx = local + ((torch.arange(R) + 1) % R * epn).reshape(R, 1, 1)
    elif kind == "one_remote":
        assert K <= epn
        local = torch.stack([torch.randperm(epn, generator=g)[:K] for _ in range(R * s)]).reshape(R, s, K)
        dest = (torch.arange(R).reshape(R, 1, 1) + 1 + torch.randint(0, R - 1, (R, s, 1), generator=g)) % R
        idx = local + dest * epn
    elif kind == "masked":
        idx[torch.rand(R, s, K, generator=g) < 0.33] = -1
        idx[0, 0, :] = -1
    else:
        raise ValueError(kind)
    return idx.to(torch.int64)


def make_weights(idx, seed=0):
    g = torch.Generator().manual_seed(seed + 1)
    w = torch.rand(idx.shape, generator=g) + 0.1
    w = w * (idx >= 0)
    return (w / w.sum(-1, keepdim=True).clamp_min(1e-6)).contiguous()


@pytest.fixture
def small():
    """R=4, E=8, K=2, S=16, H=32, H'=16, tp=8."""
    return evenep.Buffer(8, 2, 16, 32, virtual_ranks=4, ffn_hidden=16, token_padding=8)


def rel_err(got, ref):
    got, ref = got.float(), ref.float()
    return ((got - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


@contextlib.contextmanager
def deterministic():
    """torch.use_deterministic_algorithms(True): the CUDA ops write zero where they otherwise leave memory unwritten
    (rows past the groups, slots without a copy), as the CPU ops do."""
    prev = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(prev)
