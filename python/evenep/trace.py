"""Router traces from a training run: the histogram every plan saw, written as one .npy (docs/traces.md).

    with buf.record_trace("trace.npy", layers=2):   # every plan of the buffer; 2 MoE layers per step
        train(...)
    moe = evenep.nn.MoE(..., buffer=buf, trace="layer0.npy")  # this layer's plans only; moe.flush_trace()

A trace is int32 [T, R, E] (one histogram per step), or [T, L, R, E] with `layers=L` (L consecutive plans make one
step): entry [t, (l,) r, e] = the (token, expert) entries rank r routed to expert e, masked entries not counted. The
histogram is the plan tensor's tpe field (PlanLayout): the gathered histogram the planner itself used, so a replay
(`evenep simulate --trace F.npy`, `evenep bench layer --trace F.npy`) sees what the run's planner saw.

The file is the C++ writer's format (evenep::write_trace: NumPy .npy 1.0, '<i4', C order, header padded to 64
bytes), replaced atomically (a temporary file in the same folder, then a rename): a run that stops mid-write leaves
the previous complete file. Recording keeps each plan's tpe on the plan's device (an asynchronous copy: no host
synchronisation); flush() moves them to the host.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import sys
import tempfile
import warnings
import weakref
from typing import List, Optional

import torch

_NPY_MAGIC = b"\x93NUMPY"
_NPY_ALIGN = 64  # header length, magic included, a multiple of this (as evenep::write_npy writes)


def _npy_bytes(counts: torch.Tensor) -> bytes:
    """counts (int32, CPU) as the bytes of a .npy file: version 1.0, '<i4', C order."""
    if sys.byteorder != "little":
        raise RuntimeError("evenep.trace: .npy traces are written little-endian; this host is big-endian")
    counts = counts.to(torch.int32).contiguous()
    shape = "(" + ", ".join(str(d) for d in counts.shape) + ")"  # 3 or 4 dimensions: no 1-tuple comma
    header = "{'descr': '<i4', 'fortran_order': False, 'shape': " + shape + ", }"
    prefix = len(_NPY_MAGIC) + 2 + 2
    total = -(-(prefix + len(header) + 1) // _NPY_ALIGN) * _NPY_ALIGN
    header = header + " " * (total - prefix - len(header) - 1) + "\n"
    head = _NPY_MAGIC + bytes([1, 0]) + len(header).to_bytes(2, "little") + header.encode("latin1")
    data = ctypes.string_at(counts.data_ptr(), counts.numel() * 4) if counts.numel() else b""
    return head + data


def write_trace(path: str, counts: torch.Tensor) -> None:
    """Writes counts ([T, R, E] or [T, L, R, E], integer, every count in [0, 2^31)) to `path` atomically."""
    if not isinstance(counts, torch.Tensor) or counts.dtype.is_floating_point or counts.dtype == torch.bool:
        raise TypeError(f"evenep.trace.write_trace: counts must be an integer tensor, got {type(counts).__name__}"
                        + (f" of {counts.dtype}" if isinstance(counts, torch.Tensor) else ""))
    if counts.dim() not in (3, 4) or counts.numel() == 0:
        raise ValueError(f"evenep.trace.write_trace: counts has shape {tuple(counts.shape)}, expected [T, R, E] or "
                         "[T, L, R, E] with every dimension >= 1")
    payload = _npy_bytes(counts.detach().cpu())
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".evenep-trace-", suffix=".npy", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class TraceRecorder:
    """Collects the tpe [R, E] of every plan given to record(); flush() writes the complete steps so far.

    path: the .npy to (re)write. layers: None for [T, R, E] (every plan one step), or L for [T, L, R, E] (L
    consecutive plans one step; a trailing incomplete step is left out of the file, with a warning at close).
    """

    def __init__(self, path, layers: Optional[int] = None):
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"evenep.trace: path = {path!r} is not a str or os.PathLike")
        path = os.fspath(path)
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise ValueError(f"evenep.trace: path = {path!r}: folder {folder!r} does not exist")
        if os.path.isdir(path):
            raise ValueError(f"evenep.trace: path = {path!r} is a folder")
        if layers is not None:
            if isinstance(layers, bool) or not isinstance(layers, int):
                raise TypeError(f"evenep.trace: layers = {layers!r} is not an int")
            if layers < 1:
                raise ValueError(f"evenep.trace: layers = {layers} must be >= 1")
        self.path = path
        self.layers = layers
        self._tpe: List[torch.Tensor] = []
        self._shape = None
        self.closed = False
        _OPEN.add(self)

    @property
    def num_plans(self) -> int:
        return len(self._tpe)

    @torch.compiler.disable
    def record(self, tpe: torch.Tensor) -> None:
        """Appends one plan's histogram tpe [R, E] (any integer dtype, any device; copied, not synchronised)."""
        if self.closed:
            raise RuntimeError(f"evenep.trace: the recorder of {self.path!r} is closed")
        if self._shape is None:
            self._shape = tuple(tpe.shape)
        elif tuple(tpe.shape) != self._shape:
            raise ValueError(f"evenep.trace: a plan's tpe has shape {tuple(tpe.shape)}, the trace's earlier plans "
                             f"{self._shape} (one trace per buffer shape)")
        self._tpe.append(tpe.detach().to(torch.int32, copy=True))

    def counts(self) -> torch.Tensor:
        """The recorded complete steps: int32 [T, R, E] or [T, L, R, E] on the CPU (T may be 0)."""
        L = self.layers or 1
        T = len(self._tpe) // L
        if T == 0:
            R, E = self._shape if self._shape is not None else (0, 0)
            return torch.zeros((0, R, E) if self.layers is None else (0, L, R, E), dtype=torch.int32)
        stacked = torch.stack([t.cpu() for t in self._tpe[: T * L]])
        return stacked if self.layers is None else stacked.reshape(T, L, *self._shape)

    def flush(self) -> Optional[str]:
        """(Re)writes the file with every complete step recorded so far; returns its path, or None (and writes
        nothing) while no complete step was recorded."""
        counts = self.counts()
        if counts.shape[0] == 0:
            return None
        write_trace(self.path, counts)
        return self.path

    def close(self) -> Optional[str]:
        """flush(), then stop: record() refuses from here on. Idempotent."""
        if self.closed:
            return self.path if os.path.exists(self.path) else None
        out = self.flush()
        L = self.layers or 1
        if len(self._tpe) % L:
            warnings.warn(f"evenep.trace: {self.path}: the last {len(self._tpe) % L} plan(s) do not make a whole step "
                          f"of {L} layers and were left out")
        if out is None:
            warnings.warn(f"evenep.trace: {self.path}: no complete step was recorded; nothing written")
        self.closed = True
        _OPEN.discard(self)
        return out

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def record_plan(recorder: Optional[TraceRecorder], plan: torch.Tensor, layout) -> None:
    """The hook of Buffer.plan and MoE.forward: records plan's tpe field (layout: the buffer's PlanLayout)."""
    if recorder is not None and not recorder.closed:
        recorder.record(layout.field(plan, "tpe"))


_OPEN = weakref.WeakSet()


@atexit.register
def _close_open_recorders():
    # A run that never closed its recorder still leaves its trace (each flush is atomic).
    for rec in list(_OPEN):
        try:
            rec.close()
        except Exception as e:  # interpreter shutdown: report, never raise
            sys.stderr.write(f"evenep.trace: could not write {rec.path}: {e}\n")
