"""EvenEP for PyTorch: balanced expert-parallel dispatch/combine ops (torch.ops.evenep) and an MoE layer.

    import evenep
    buf = evenep.Buffer(num_experts=8, top_k=2, max_tokens=64, hidden=128, virtual_ranks=4)
    moe = evenep.nn.MoE(128, 256, 8, 2, buffer=buf)
    out = moe(x)            # x: [R, s, H], the tokens of every virtual rank

    # or one rank per process (torchrun), over EvenEP's NCCL team: x [1, s, H], this rank's E/R experts
    buf = evenep.Buffer(num_experts=8, top_k=2, max_tokens=64, hidden=128, group=torch.distributed.group.WORLD)

    # FP8 (docs/python.md, FP8): e4m3 rows + 1x128 scales through dispatch, FP8 expert GEMMs
    buf = evenep.Buffer(num_experts=8, top_k=2, max_tokens=64, hidden=128, virtual_ranks=4, fp8=True)
    moe = evenep.nn.MoE(128, 256, 8, 2, buffer=buf, fp8=True)

See docs/python.md.
"""

from . import _ops  # noqa: F401  (registers fake implementations and autograd)
from . import fp8  # noqa: F401  (the FP8 casts, their fake implementations and autograd)
from . import nn  # noqa: F401
from .buffer import Buffer, Handle, PlanLayout, cuda_built

__all__ = ["Buffer", "Handle", "PlanLayout", "cuda_built", "fp8", "nn", "ops"]
__version__ = "0.1.0"

ops = _ops.ops
