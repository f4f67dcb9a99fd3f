"""evenep.Buffer: the EP communication buffer of one MoE group, and the handle of one dispatch."""

from __future__ import annotations

import operator
from typing import NamedTuple, Optional, Sequence

import torch

from . import _ops
from . import fp8 as _fp8
from . import trace as _trace
from ._ops import ops


class PlanLayout(NamedTuple):
    """Columns of one rank's row of the plan tensor (int32 [R, width]), as the library defines them.

    Row r holds rank r's share of every per-rank array of the plan (s, tpe[r], the group arrays, copies, ...);
    the columns come from the C++ core (evenep::plan_columns, through torch.ops.evenep.plan_columns), never
    written out here. The whole plan is a pure function of the gathered (s, tpe) (SPEC invariant 5).
    """

    columns: dict  # name -> (first column, count)
    width: int

    @staticmethod
    def of(buffer: int) -> "PlanLayout":
        names, offsets, counts = ops.plan_columns(buffer)
        columns = {n: (o, c) for n, o, c in zip(names, offsets, counts)}
        return PlanLayout(columns, max((o + c for o, c in columns.values()), default=0))

    def field(self, plan: torch.Tensor, name: str) -> torch.Tensor:
        """The columns of array `name` of every row: [R, count] (a view of `plan`)."""
        if name not in self.columns:
            raise ValueError(f"evenep.PlanLayout.field: the plan tensor has no column {name!r} "
                             f"(it has {', '.join(self.columns)})")
        start, count = self.columns[name]
        return plan[:, start : start + count]


class Handle(NamedTuple):
    """What one dispatch decided, passed to combine (tensors only: it composes with torch.compile).

    plan:          int32 [R, W] the group plan (PlanLayout)
    dst:           int32 [R, s*K] every entry's encoded destination (SPEC §3.4)
    topk_weights:  fp32 [R, s, K] the route weights as dispatched
    recv_w:        fp32 [R, NvS] the row weights dispatch returned (the autograd edge of the weights in combine)
    """

    plan: torch.Tensor
    dst: torch.Tensor
    topk_weights: torch.Tensor
    recv_w: torch.Tensor


class Buffer:
    """The EP buffer of one MoE group, shared by all MoE layers of a model.

    Args:
        num_experts: E routed experts of the group (E % R == 0).
        top_k: K experts per token (1..32).
        max_tokens: S, the most tokens one rank passes in one call; sizes the fixed receive buffer
            (NvS = align(ceil((1+slack)*S*K) + (tp-1)*2*E/R, tp) rows per rank; slack = 0 under policy "exact").
            Calls may pass any s <= S.
        hidden: H, the token row size (bf16 elements, H % 8 == 0).
        group: a torch.distributed process group (e.g. dist.group.WORLD under torchrun): R = group.size()
            processes, one rank and one GPU each, over EvenEP's NCCL team (collective: every rank of the group
            creates its Buffer together; the NCCL unique id is broadcast over the group). Every tensor then leads
            with 1 (this rank): x [1, s, H]; expert weights are this rank's E/R home experts; every rank passes
            the same s (or the same num_tokens list of all R counts). Needs device="cuda" (the current device by
            default: torch.cuda.set_device(LOCAL_RANK) first) and a build linked with NCCL >= 2.28.
        virtual_ranks: R ranks in this process (threads on the CPU, or R ranks on one GPU). Every tensor of the
            API then leads with R: x [R, s, H], topk_idx/topk_weights [R, s, K]. Default 1.
        num_sms: SMs per virtual rank the communication kernels may use (CUDA; clamped so that every rank's
            blocks are co-resident). Unused on the CPU.
        prefetch_slots: B expert copies per rank (default E/R, required for training).
        device: "cpu" (the CPU backend: virtual ranks are threads; the default without group=) or "cuda" /
            "cuda:i" (cuda::Ep over R virtual ranks on that GPU, or this rank with group=; every op runs on the
            current torch stream, without host synchronisation).
        ffn_hidden: H' of the experts (sizes the library's expert pools; default hidden).
        token_padding: tp, the row padding of every expert segment (128 matches the GPU GEMM tile; smaller
            values make CPU tests faster).
        planner: "optimized" (default) or "reference".
        policy: how each plan's imbalance budget is chosen (docs/auto.md): "auto" (the default: per step, from the
            gathered histogram, whichever of exact balance, a slack budget in [0, slack] or no copies at all a
            step-cost model for this layer shape predicts fastest; decided on the device, no host sync), "exact"
            (every rank computes exactly its quota: SPEC invariant 1) or "slack" (every plan with the budget slack).
        slack: the imbalance budget eps in [0, 1] (docs/slack.md): under "auto" the largest a plan may choose
            (default 0.1), under "slack" every plan's (required, > 0); "exact" takes none (or 0). The receive
            buffer is sized for it: num_recv_rows grows with slack.
        fp8: True for the FP8 data path (docs/fp8.md, docs/python.md "FP8"): dispatch sends e4m3 rows with one fp32
            scale per 128 channels (dedup kept) and returns (recv_x_fp8, recv_scales); H and H' must be multiples
            of 128. A bool (anything else: ValueError). On CUDA, with virtual ranks or group=, the library's FP8
            dispatch (bit for bit the CPU's; with group= the rows arrive in this rank's window and are copied out,
            as the bf16 dispatch's are). evenep.nn.MoE(fp8=True) on CUDA runs the library's CUTLASS FP8 grouped
            GEMM (a build with EVENEP_CUTLASS, an H100/H200).
        ue8m0: with fp8, every scale rounded up to a power of two (UE8M0).
        bf16_partials: combine sends a rank's partial sum of >= 2 entries of a token (its deduplicated chain) as
            bf16 instead of fp32 (upstream MoonEP's format: fewer combine bytes, one more rounding; docs/fp8.md
            section 4). A bool; with or without fp8, on every backend and with group=. Default False: fp32
            partials, no rounding beyond the experts' bf16 outputs (SPEC 4.2).
    """

    def __init__(
        self,
        num_experts: int,
        top_k: int,
        max_tokens: int,
        hidden: int,
        *,
        group=None,
        virtual_ranks: Optional[int] = None,
        num_sms: int = 32,
        prefetch_slots: Optional[int] = None,
        device=None,
        ffn_hidden: Optional[int] = None,
        token_padding: int = 128,
        planner: str = "optimized",
        policy: str = "auto",
        slack: Optional[float] = None,
        fp8: bool = False,
        ue8m0: bool = False,
        bf16_partials: bool = False,
    ):
        # Every integer is checked here, as given, before it reaches C++ (whose int32 sizes would wrap it).
        num_experts, top_k, max_tokens, hidden = (
            _int_arg("Buffer", name, v, 1)
            for name, v in (("num_experts", num_experts), ("top_k", top_k), ("max_tokens", max_tokens),
                            ("hidden", hidden)))
        num_sms = _int_arg("Buffer", "num_sms", num_sms, 1)
        token_padding = _int_arg("Buffer", "token_padding", token_padding, 1)
        if prefetch_slots is not None:
            prefetch_slots = _int_arg("Buffer", "prefetch_slots", prefetch_slots, 0)
        if ffn_hidden is not None:
            ffn_hidden = _int_arg("Buffer", "ffn_hidden", ffn_hidden, 1)
        if not isinstance(planner, str):
            raise TypeError(f"evenep.Buffer: planner = {planner!r} is not a str ('optimized' or 'reference')")
        if not isinstance(policy, str):
            raise TypeError(f"evenep.Buffer: policy = {policy!r} is not a str ('auto', 'exact' or 'slack')")
        if policy not in ("auto", "exact", "slack"):
            raise ValueError(f"evenep.Buffer: policy = {policy!r} is not one of 'auto', 'exact', 'slack'")
        if slack is not None:
            if isinstance(slack, bool) or not isinstance(slack, (int, float)):
                raise TypeError(f"evenep.Buffer: slack = {slack!r} is not a number")
            if not 0.0 <= float(slack) <= 1.0:  # also refuses NaN
                raise ValueError(f"evenep.Buffer: slack = {slack!r} is outside [0, 1]")
        self.policy = policy
        self.slack = slack
        policy_args = (policy, -1.0 if slack is None else float(slack))
        for name, v in (("fp8", fp8), ("ue8m0", ue8m0), ("bf16_partials", bf16_partials)):
            if not isinstance(v, bool):
                raise ValueError(f"evenep.Buffer: {name} = {v!r}, expected True or False")
        if ue8m0 and not fp8:
            raise ValueError("evenep.Buffer: ue8m0=True needs fp8=True (it rounds the FP8 scales)")
        self.fp8, self.ue8m0, self.bf16_partials = fp8, ue8m0, bf16_partials
        if group is not None:
            self._init_group(group, virtual_ranks, device, num_sms, num_experts, top_k, max_tokens, hidden,
                             prefetch_slots, ffn_hidden, token_padding, planner, policy_args)
            return
        self.group = None
        self.device = torch.device("cpu" if device is None else device)
        R = 1 if virtual_ranks is None else _int_arg("Buffer", "virtual_ranks", virtual_ranks, 1)
        self.num_sms = num_sms
        args = (
            R,
            num_experts,
            top_k,
            max_tokens,
            hidden,
            hidden if ffn_hidden is None else ffn_hidden,
            -1 if prefetch_slots is None else prefetch_slots,
            token_padding,
            planner,
        )
        if self.device.type == "cuda":
            if not cuda_built():
                raise NotImplementedError(
                    "evenep.Buffer(device='cuda'): this build of evenep has no CUDA ops (built without nvcc or "
                    "against a CPU-only torch)"
                )
            if not torch.cuda.is_available():
                raise RuntimeError("evenep.Buffer(device='cuda'): no CUDA device available")
            if self.device.index is None:
                self.device = torch.device("cuda", torch.cuda.current_device())
            self._release = ops.release_cuda_buffer
            self._id = ops.create_cuda_buffer(*args, self.device.index, num_sms, *policy_args, fp8, ue8m0,
                                              bf16_partials)
        elif self.device.type == "cpu":
            self._release = ops.release_buffer
            self._id = ops.create_buffer(*args, *policy_args, fp8, ue8m0, bf16_partials)
        else:
            raise NotImplementedError(f"evenep.Buffer(device={self.device}): only cpu and cuda are supported")
        self._finish()

    def _finish(self):
        self._trace = None
        self.info = _ops.info(self._id)
        self.layout = PlanLayout.of(self._id)

    def _init_group(self, group, virtual_ranks, device, num_sms, E, K, S, H, slots, ffn_hidden, tp, planner,
                    policy_args):
        """group=: this process is rank group.rank() of an EP group of group.size() processes, one GPU each, over
        EvenEP's NCCL team; the NCCL unique id is made by the group's rank 0 and broadcast over `group`."""
        import torch.distributed as dist

        if not (dist.is_available() and isinstance(group, dist.ProcessGroup)):
            raise TypeError(f"evenep.Buffer(group=...): expected a torch.distributed ProcessGroup, got {type(group)}")
        if virtual_ranks is not None:
            raise ValueError("evenep.Buffer: give group= or virtual_ranks=, not both")
        self.device = torch.device("cuda" if device is None else device)
        if self.device.type != "cuda":
            raise ValueError(
                f"evenep.Buffer(group=...): device={self.device}, but group= runs one rank per process on a GPU "
                "over EvenEP's NCCL team (device='cuda'); on the CPU use virtual_ranks=R in one process"
            )
        if not cuda_built() or not ops.nccl_built():
            raise NotImplementedError(
                "evenep.Buffer(group=...): this build of evenep has no "
                + ("CUDA ops" if not cuda_built() else "NCCL team")
                + " (group= needs the CUDA build linked with NCCL >= 2.28; see docs/python.md)"
            )
        if not torch.cuda.is_available():
            raise RuntimeError("evenep.Buffer(group=...): no CUDA device available")
        if self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        uid = _group_unique_id(group, rank, self.device)
        self.num_sms = num_sms
        self.group = group
        self._release = ops.release_cuda_buffer
        config = [E, K, S, H, H if ffn_hidden is None else ffn_hidden, -1 if slots is None else slots, tp]
        self._id = ops.create_nccl_buffer(config, planner, uid, rank, world, self.device.index, num_sms, *policy_args,
                                          self.fp8, self.ue8m0, self.bf16_partials)
        self._finish()

    # Static shape -----------------------------------------------------------------------------------------
    @property
    def id(self) -> int:
        """The int every torch.ops.evenep op takes as `buffer`."""
        return self._id

    @property
    def num_ranks(self) -> int:
        """R, the ranks of the EP group (all in this process with virtual_ranks, one per process with group=)."""
        return self.info.R

    @property
    def local_ranks(self) -> int:
        """L, the ranks this process serves: the leading dimension of every op's tensors (R, or 1 with group=)."""
        return self.info.L

    @property
    def rank(self) -> int:
        """The first rank this process serves (0 with virtual ranks; the process's group rank with group=)."""
        return self.info.rank_begin

    @property
    def num_home_experts(self) -> int:
        """Home experts of the served ranks: the expert weights' dimension 0 (E, or E/R with group=)."""
        return self.info.home

    @property
    def num_recv_rows(self) -> int:
        """NvS: receive-buffer rows per rank (fixed, independent of the routing)."""
        return self.info.nvs

    @property
    def num_slots(self) -> int:
        return self.info.B

    def __del__(self):
        try:
            self._release(self._id)
        except Exception:  # interpreter shutdown
            pass

    # A Buffer is a communication resource that the layers using it share (as they share a process group): copying
    # a module that holds one (copy.deepcopy(nn.MoE), an EMA or reference model) shares it. A copied Buffer object
    # would release the same id when collected, leaving the original's layers with a freed buffer.
    def __deepcopy__(self, memo):
        memo[id(self)] = self
        return self

    def __copy__(self):
        return self

    def __reduce__(self):
        raise TypeError(
            "evenep.Buffer cannot be pickled (it holds device memory, the planner's state and, with group=, a "
            "communicator): create one per process and pass it to the layers (evenep.nn.MoE(buffer=...)); "
            "save the model's state_dict instead of the module"
        )

    def __repr__(self) -> str:
        i = self.info
        dev = "" if self.device.type == "cpu" else f", device={self.device}"
        if self.group is not None:
            dev += f", group rank={i.rank_begin}"
        if self.fp8:
            dev += ", fp8" + (", ue8m0" if self.ue8m0 else "")
        if self.bf16_partials:
            dev += ", bf16_partials"
        pol = self.policy if self.slack is None else f"{self.policy}, slack={self.slack:g}"
        return (f"evenep.Buffer(R={i.R}, E={i.E}, K={i.K}, S={i.S}, H={i.H}, B={i.B}, tp={i.tp}, NvS={i.nvs}, "
                f"policy={pol}{dev})")

    def check(self) -> None:
        """CUDA: waits for the buffer's work on the current stream and raises what the device recorded (an expert
        id outside [-1, E) in a plan: ValueError), leaving the buffer usable. The ops never synchronise; such an
        error is otherwise raised by the first op of this buffer called after the device recorded it. No-op on the
        CPU (where bad input raises at once)."""
        if self.device.type == "cuda":
            ops.check_cuda_buffer(self._id)

    # Data path --------------------------------------------------------------------------------------------
    def plan(self, topk_idx: torch.Tensor, num_tokens: Optional[Sequence[int]] = None) -> torch.Tensor:
        """Plans a dispatch of every rank's routing topk_idx ([R, s, K], int32/int64, -1 = masked).

        num_tokens: optional s_r per rank (each <= s; rows past s_r are ignored), for unequal token counts.
        Returns the plan tensor (int32 [R, W], see PlanLayout).
        """
        self._on_device("plan", topk_idx=topk_idx)
        plan = ops.plan(topk_idx, self._id, _tokens("plan", num_tokens, self.info.S))
        _trace.record_plan(self._trace, plan, self.layout)
        return plan

    def dispatch(
        self,
        x,
        topk_idx: torch.Tensor,
        topk_weights: torch.Tensor,
        plan: Optional[torch.Tensor] = None,
        num_tokens: Optional[Sequence[int]] = None,
    ):
        """Sends every token row to the ranks computing its entries (autograd-aware).

        x: bf16 [R, s, H]; topk_idx: [R, s, K]; topk_weights: fp32 [R, s, K]; plan: from plan() (planned here
        when None). Returns (recv_x bf16 [R, NvS, H], recv_w fp32 [R, NvS], cu_seqlens int32 [R, G], handle):
        rank r's rows in group order, group g ending at cu_seqlens[r, g] (padding rows zero).

        FP8 buffer (fp8=True): x is bf16 [R, s, H] (quantised once per token by the library's FP8 dispatch) or,
        as DeepEP's, a tuple (x_fp8 torch.float8_e4m3fn [R, s, H], scales fp32 [R, s, H/128]) quantised by the
        caller (evenep.fp8.quantize gives the library's bytes; moved as given, nothing requantised). recv_x is then
        the tuple (recv_x_fp8 [R, NvS, H], recv_scales fp32 [R, NvS, H/128]) (padding rows: codes +0, scale 0);
        evenep.fp8.dequantize makes bf16 rows of it. Not differentiable in x (recv_w still is, to topk_weights);
        evenep.nn.MoE(fp8=True) uses the straight-through form (evenep.fp8.DispatchFp8).
        """
        if self.fp8:
            recv_x8, recv_sc, _, recv_w, cu, handle = self._dispatch_fp8(x, topk_idx, topk_weights, plan, num_tokens,
                                                                         dequantized=False)
            return (recv_x8, recv_sc), recv_w, cu, handle
        if isinstance(x, tuple):
            raise ValueError("evenep.dispatch: x is a tuple (x_fp8, scales) but the buffer was created without "
                             "fp8=True (its rows are bf16)")
        self._on_device("dispatch", x=x, topk_idx=topk_idx, topk_weights=topk_weights, plan=plan)
        n = _tokens("dispatch", num_tokens, self.info.S)
        plan = self._plan_for(plan, topk_idx, n)
        recv_x, recv_w, cu, dst = ops.dispatch(x, topk_idx, topk_weights, plan, self._id, n)
        return recv_x, recv_w, cu, Handle(plan, dst, topk_weights.detach(), recv_w)

    def _plan_for(self, plan, topk_idx, n):
        if plan is None:
            plan = ops.plan(topk_idx, self._id, n)
            _trace.record_plan(self._trace, plan, self.layout)
        return plan

    def _dispatch_fp8(self, x, topk_idx, topk_weights, plan=None, num_tokens=None, dequantized=True):
        """The FP8 dispatch with its straight-through form (evenep.fp8.DispatchFp8): (recv_x8, recv_scales,
        recv_deq bf16 (differentiable; with dequantized=False an empty tensor, nothing dequantised), recv_w,
        cu_seqlens, Handle)."""
        scales = None
        if isinstance(x, tuple):
            if len(x) != 2:
                raise ValueError(f"evenep.dispatch: x is a {type(x).__name__} of {len(x)} items, expected "
                                 "(x_fp8, scales)")
            x, scales = x
            if not isinstance(x, torch.Tensor) or x.dtype != torch.float8_e4m3fn:
                raise ValueError(f"evenep.dispatch: x_fp8 is a {_fp8._what(x)}, expected torch.float8_e4m3fn")
        self._on_device("dispatch", x=x, scales=scales, topk_idx=topk_idx, topk_weights=topk_weights, plan=plan)
        n = _tokens("dispatch", num_tokens, self.info.S)
        plan = self._plan_for(plan, topk_idx, n)
        recv_x8, recv_sc, recv_deq, recv_w, cu, dst = _fp8.DispatchFp8.apply(x, scales, topk_idx, topk_weights, plan,
                                                                            self._id, n, dequantized)
        return recv_x8, recv_sc, recv_deq, recv_w, cu, Handle(plan, dst, topk_weights.detach(), recv_w)

    def combine(self, expert_out: torch.Tensor, handle: Handle, apply_weights: bool = True) -> torch.Tensor:
        """Sums every token's expert outputs back on its rank (autograd-aware): [R, NvS, H] bf16 -> [R, s, H].

        With apply_weights each entry is multiplied by its route weight (fp32 accumulation, one bf16 rounding);
        the route weights' gradient flows through handle.recv_w to dispatch's topk_weights.
        """
        if not isinstance(handle, Handle):
            raise TypeError(f"evenep.combine: handle is a {type(handle).__name__}, expected the evenep.Handle "
                            "dispatch returned")
        self._on_device("combine", expert_out=expert_out, plan=handle.plan, dst=handle.dst,
                        topk_weights=handle.topk_weights, recv_w=handle.recv_w)
        return ops.combine(
            expert_out, handle.recv_w, handle.topk_weights, handle.plan, handle.dst, self._id, apply_weights
        )

    def prefetch_weight(self, weight: torch.Tensor, plan: torch.Tensor) -> torch.Tensor:
        """Copies of the experts each rank computes without owning them: weight [E, a, b] -> slots [R, B, a, b].

        Autograd-aware: the slots' gradients are reduced home (reduce_grad) into weight's gradient, so the
        optimizer only ever sees home weights.
        """
        return ops.prefetch_weight(weight, plan, self._id)

    def reduce_grad(self, slot_grads: torch.Tensor, plan: torch.Tensor) -> torch.Tensor:
        """Adds every copy's gradient home: slot_grads fp32 [R, B, a, b] -> fp32 [E, a, b] (deterministic)."""
        return ops.reduce_grad(slot_grads, plan, self._id)

    def reduce_grad_add_(self, grad: torch.Tensor, slot_grads: torch.Tensor, plan: torch.Tensor) -> torch.Tensor:
        """In place: grad[e] += the sum of expert e's copies' gradients (fp32 [E, a, b], ranks then slots
        ascending), for the experts with copies only; returns grad. The form to use where a home gradient already
        exists (it moves only the copies' gradients: no [E, a, b] zero-fill). Not autograd-aware."""
        ops.reduce_grad_add_(grad, slot_grads, plan, self._id)
        return grad

    def grouped_gemm(self, x: torch.Tensor, weight: torch.Tensor, slots: torch.Tensor, plan: torch.Tensor,
                     out_dtype: Optional[torch.dtype] = None):
        """Per receive-buffer group, x_rows · W_g (W_g the group's home weight or prefetched slot):
        x bf16 [R, NvS, a], weight [E, a, b], slots [R, B, a, b] -> fp32 [R, NvS, b], or out_dtype=torch.bfloat16
        (rounded once in the GEMM's epilogue). Padding rows are 0; rows past the groups are unspecified on CUDA.
        Autograd-aware (dgrad and wgrad)."""
        return ops.grouped_gemm(x, weight, slots, plan, self._id, out_dtype)

    def expert_linear(self, x: torch.Tensor, weight: torch.Tensor, plan: torch.Tensor,
                      out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """grouped_gemm with the copies made inside (what evenep.nn.MoE uses): x bf16 [R, NvS, a], weight [E, a, b]
        home weights (fp32 master weights are cast to bf16 once; the copies are prefetched from that bf16 cast)
        -> fp32 [R, NvS, b] (or out_dtype=torch.bfloat16). Autograd-aware: the weight's gradient (weight's dtype)
        has every copy's gradient reduced home in place, so the optimizer only ever sees home weights."""
        return _ops.ExpertLinear.apply(x, weight, plan, self._id, out_dtype)


    # Router traces (evenep.trace) ------------------------------------------------------------------------
    def record_trace(self, path, layers: Optional[int] = None) -> "_trace.TraceRecorder":
        """Starts recording the histogram tpe [R, E] of every plan this buffer makes (plan(), and dispatch without
        a plan) into the router trace `path` (docs/traces.md): int32 [T, R, E], or [T, L, R, E] with layers=L (L
        consecutive plans make one step: the MoE layers of one forward). stop_trace() (or leaving the returned
        recorder's `with` block, or the interpreter's exit) writes the file atomically. Virtual-rank buffers only:
        a group= buffer's plan holds this rank's row alone (NotImplementedError)."""
        if self.group is not None:
            raise NotImplementedError("evenep.Buffer.record_trace: a group= buffer plans this rank's row only; "
                                      "record a trace on virtual ranks (virtual_ranks=R) for now")
        if self._trace is not None and not self._trace.closed:
            raise RuntimeError(f"evenep.Buffer.record_trace: already recording into {self._trace.path!r} "
                               "(stop_trace() first)")
        self._trace = _trace.TraceRecorder(path, layers)
        return self._trace

    def stop_trace(self) -> Optional[str]:
        """Writes the trace being recorded (every complete step) and stops; returns its path (None when nothing
        was recording or no complete step was recorded)."""
        rec, self._trace = self._trace, None
        return None if rec is None or rec.closed else rec.close()

    def _on_device(self, op, **tensors):
        # The ops would dispatch a tensor of another device to that device's kernel (meta: shapes only).
        for name, t in tensors.items():
            if t is not None and not isinstance(t, torch.Tensor):
                raise TypeError(f"evenep.{op}: {name} is a {type(t).__name__}, expected a torch.Tensor")
            if t is not None and t.device != self.device:
                raise ValueError(f"evenep.{op}: {name} is on {t.device}, the buffer on {self.device}")


def cuda_built() -> bool:
    """Whether this build of evenep has the CUDA kernels of the ops."""
    return hasattr(ops, "create_cuda_buffer")


_GROUP_IDS = {}  # (group ranks) -> NCCL unique id: one root communicator per group and process


def _group_unique_id(group, rank, device):
    import torch.distributed as dist

    try:
        key = tuple(dist.get_process_group_ranks(group if group is not None else dist.group.WORLD))
    except Exception:  # older torch
        key = (id(group),)
    if key in _GROUP_IDS:
        return _GROUP_IDS[key]
    payload = [None]
    if rank == 0:
        try:
            payload = [("id", ops.nccl_unique_id())]
        except Exception as e:  # every rank raises, none waits for an id
            payload = [("error", str(e))]
    try:
        src = dist.get_global_rank(group, 0) if group is not None else 0
    except Exception:
        src = 0
    with torch.cuda.device(device):
        dist.broadcast_object_list(payload, src=src, group=group)
    kind, value = payload[0]
    if kind != "id":
        raise RuntimeError(f"evenep.Buffer(group=...): rank 0 could not make the NCCL unique id: {value}")
    _GROUP_IDS[key] = value
    return value


_INT32_MAX = 2**31 - 1


def _int_arg(op: str, name: str, value, lo: int, hi: int = _INT32_MAX) -> int:
    """value as a Python int in [lo, hi]: TypeError unless it is an integer (int, numpy or 0-dim integer tensor;
    bool and float refused), ValueError naming the value as given outside the range (the library's sizes are
    int32: nothing wraps)."""
    if isinstance(value, bool) or (isinstance(value, torch.Tensor) and value.dtype == torch.bool):
        raise TypeError(f"evenep.{op}: {name} = {value!r} is a bool, expected an integer")
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"evenep.{op}: {name} = {value!r} is not an integer") from None
    if not lo <= v <= hi:
        bound = "max_tokens = " if name.startswith("num_tokens") else ""
        raise ValueError(f"evenep.{op}: {name} = {v} outside [{lo}, {bound}{hi}]")
    return v


def _tokens(op: str, num_tokens, max_tokens: int):
    """num_tokens (None, or one token count per rank: a list or tuple of integers, or an integer tensor) as a list
    of ints, each in [1, max_tokens] here (the op then checks the count and the served ranks' against s)."""
    if num_tokens is None:
        return None
    if isinstance(num_tokens, torch.Tensor):
        if num_tokens.dtype.is_floating_point or num_tokens.dtype.is_complex or num_tokens.dtype == torch.bool:
            raise TypeError(f"evenep.{op}: num_tokens has dtype {num_tokens.dtype}, expected integers")
        num_tokens = num_tokens.tolist()
    if not isinstance(num_tokens, (list, tuple)):
        raise TypeError(f"evenep.{op}: num_tokens = {num_tokens!r} is not a sequence of token counts (one per rank)")
    return [_int_arg(op, f"num_tokens[{r}]", v, 1, max_tokens) for r, v in enumerate(num_tokens)]
