"""Buffer(group=...): one rank per process over EvenEP's NCCL team, bootstrapped through torch.distributed.

CPU (every build): a gloo group gives one clear error naming group= (the CPU backend runs its ranks in one process:
virtual_ranks=R); group= with virtual_ranks= is refused. GPU (CUDA ops and the NCCL team built): `torchrun
--nproc-per-node 1 tests/python/group_worker.py` must pass (group= equals virtual_ranks=1 bit for bit: plan,
dispatch, combine and their backward, nn.MoE forward and backward).
"""

import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

import evenep

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture
def gloo_world(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def test_group_on_cpu_is_a_clear_error(gloo_world):
    with pytest.raises(ValueError, match=r"group=.*device=cpu.*virtual_ranks=R"):
        evenep.Buffer(8, 2, 16, 32, group=gloo_world, device="cpu")
    with pytest.raises(ValueError, match="group= or virtual_ranks="):
        evenep.Buffer(8, 2, 16, 32, group=gloo_world, virtual_ranks=2)
    if not (torch.cuda.is_available() and evenep.cuda_built() and torch.ops.evenep.nccl_built()):
        # device="cuda" (the default with group=) where this build or machine cannot run the NCCL team
        with pytest.raises((NotImplementedError, RuntimeError), match="group="):
            evenep.Buffer(8, 2, 16, 32, group=gloo_world)
    # The CPU backend is unaffected.
    buf = evenep.Buffer(8, 2, 16, 32, virtual_ranks=2, token_padding=8)
    assert buf.local_ranks == 2 and buf.rank == 0 and buf.num_home_experts == 8


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.skipif(not evenep.cuda_built(), reason="evenep built without the CUDA ops")
@pytest.mark.skipif(evenep.cuda_built() and not torch.ops.evenep.nccl_built(), reason="evenep built without NCCL")
def test_group_torchrun_one_process():
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
           os.path.join(HERE, "group_worker.py")]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    assert "group= check OK: rank 0 of 1" in out, out[-6000:]
