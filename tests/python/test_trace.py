"""Router traces recorded from Python (evenep.trace, Buffer.record_trace, nn.MoE(trace=), train_moe.py --trace).

Cases:
  train_round_trip       examples/train_moe.py --trace on the CPU (4 steps, 2 layers, R=4, E=8, K=2): the file is
                         int32 [4, 2, 4, 8], equal to the per-rank bincount of every plan's topk_idx and to the plans'
                         tpe field; `evenep simulate --trace F.npy` replays it (exit 0, evenep.workload_run/1 JSON
                         with 4 steps, 2 layers and every system's step_ms)
  moe_layer_trace        nn.MoE(trace=...) records that layer's forwards only ([T, R, E]); masked entries (-1) not
                         counted; flush_trace rewrites the file with the steps so far
  record_trace_context   `with buf.record_trace(F)`: one step per plan (dispatch without a plan included); written on
                         leaving the block; a second record_trace while recording is refused
  incomplete_step        layers=2 and 3 plans: the file holds 1 step, a warning names the plan left out
  same_bytes_as_numpy    the writer's bytes equal numpy.save's for the same int32 array (the C++ writer's format)
  bad_input              path in a missing folder / a folder / not a str, layers 0 / bool: ValueError or TypeError;
                         a plan of another shape: ValueError; record after close: RuntimeError
"""

import io
import json
import os
import subprocess

import numpy as np
import pytest
import torch

import evenep
from evenep import bench, trace

from conftest import make_routing, make_weights
from test_train_example import _load as _train_module


def _bincount(topk_idx, E):
    idx = topk_idx.reshape(topk_idx.shape[0], -1)
    return torch.stack([torch.bincount(r[r >= 0], minlength=E) for r in idx]).to(torch.int32)


def test_train_round_trip(tmp_path, monkeypatch):
    seen, tpes = [], []
    original = evenep.Buffer.plan

    def plan(self, topk_idx, num_tokens=None):
        out = original(self, topk_idx, num_tokens)
        seen.append(_bincount(topk_idx, self.info.E))
        tpes.append(self.layout.field(out, "tpe").clone())
        return out

    monkeypatch.setattr(evenep.Buffer, "plan", plan)
    path = tmp_path / "run.npy"
    train = _train_module()
    args = ["--steps", "4", "--quiet", "--layers", "2", "--hidden", "32", "--ffn", "32", "--seq", "16",
            "--ranks", "4", "--experts", "8", "--top-k", "2", "--trace", str(path)]
    train.main(args)
    counts = np.load(path)
    assert counts.dtype == np.int32 and counts.shape == (4, 2, 4, 8)
    assert len(seen) == 8  # one plan per layer per step (backward reuses the forward's plan)
    expect = torch.stack(seen).reshape(4, 2, 4, 8).numpy()
    np.testing.assert_array_equal(counts, expect)
    np.testing.assert_array_equal(counts, torch.stack(tpes).reshape(4, 2, 4, 8).numpy())
    s = 8 * 16 // 4  # batch * seq / ranks tokens per rank
    assert (counts.sum(axis=-1) == s * 2).all()  # the router masks nothing: K entries per token

    cli = bench.find_cli()
    if cli is None:
        pytest.skip("no evenep CLI on PATH or under build*/ (build the evenep target)")
    out = tmp_path / "replay.json"
    r = subprocess.run([cli, "simulate", "--trace", str(path), "--K", "2", "--S", str(s), "--H", "32",
                        "--ffn-hidden", "32", "--tp", "16", "--json", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert doc["schema"] == "evenep.workload_run/1"
    assert doc["steps"] == 4 and doc["layers"] == 2 and doc["R"] == 4 and doc["E"] == 8
    names = [sys_["name"] for sys_ in doc["systems"]]
    assert names[:2] == ["evenep_auto", "evenep_exact"] and "conventional" in names and "lplb" in names and "llep" in names
    for sys_ in doc["systems"]:
        assert len(sys_["step_ms"]) == 4 and all(v > 0 for v in sys_["step_ms"])
    # The replay's per-rank rows of conventional EP are the trace's home-expert sums (expert e on rank e / 2).
    conv = next(x for x in doc["systems"] if x["name"] == "conventional")
    home = counts.sum(axis=(1, 2)).reshape(4, 4, 2).sum(axis=-1)  # [T, R]
    np.testing.assert_array_equal(np.array(conv["rows"]), home)


def test_moe_layer_trace(tmp_path):
    R, E, K, S = 4, 8, 2, 16
    buf = evenep.Buffer(E, K, S, 32, virtual_ranks=R, ffn_hidden=16, token_padding=8)
    path = tmp_path / "layer.npy"
    moe = evenep.nn.MoE(32, 16, E, K, buffer=buf, trace=str(path))
    other = evenep.nn.MoE(32, 16, E, K, buffer=buf)  # not traced
    x = torch.randn(R, S, 32)
    expect = []
    for step, kind in enumerate(["random", "masked", "hot_rank"]):
        idx = make_routing(kind, R, S, E, K, seed=step)
        moe(x, routing=(idx, make_weights(idx)))
        other(x)
        expect.append(_bincount(idx, E))
        assert moe.flush_trace() == str(path)
        assert np.load(path).shape == (step + 1, R, E)
    counts = np.load(path)
    np.testing.assert_array_equal(counts, torch.stack(expect).numpy())


def test_record_trace_context(tmp_path):
    R, E, K, S = 4, 8, 2, 16
    buf = evenep.Buffer(E, K, S, 32, virtual_ranks=R, ffn_hidden=16, token_padding=8)
    path = tmp_path / "buf.npy"
    idx = [make_routing(k, R, S, E, K, seed=i) for i, k in enumerate(["random", "one_remote"])]
    x = torch.randn(R, S, 32).to(torch.bfloat16)
    with buf.record_trace(str(path)):
        with pytest.raises(RuntimeError, match="already recording"):
            buf.record_trace(str(tmp_path / "other.npy"))
        buf.plan(idx[0])
        buf.dispatch(x, idx[1], make_weights(idx[1]))  # plans inside
        assert not path.exists()
    np.testing.assert_array_equal(np.load(path), torch.stack([_bincount(i, E) for i in idx]).numpy())
    buf.plan(idx[0])  # not recording any more
    assert np.load(path).shape == (2, R, E)
    assert buf.stop_trace() is None


def test_incomplete_step(tmp_path):
    buf = evenep.Buffer(8, 2, 16, 32, virtual_ranks=4, ffn_hidden=16, token_padding=8)
    path = tmp_path / "inc.npy"
    buf.record_trace(path, layers=2)
    for i in range(3):
        buf.plan(make_routing("random", 4, 16, 8, 2, seed=i))
    with pytest.warns(UserWarning, match="last 1 plan"):
        assert buf.stop_trace() == str(path)
    assert np.load(path).shape == (1, 2, 4, 8)


def test_same_bytes_as_numpy(tmp_path):
    a = torch.randint(0, 1000, (3, 2, 4, 8), dtype=torch.int32)
    path = tmp_path / "w.npy"
    trace.write_trace(str(path), a)
    ref = io.BytesIO()
    np.save(ref, a.numpy())
    assert path.read_bytes() == ref.getvalue()
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".evenep-trace-")]  # no temporary left


def test_bad_input(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        trace.TraceRecorder(tmp_path / "missing" / "t.npy")
    with pytest.raises(ValueError, match="is a folder"):
        trace.TraceRecorder(tmp_path)
    with pytest.raises(TypeError, match="path"):
        trace.TraceRecorder(3)
    with pytest.raises(ValueError, match="layers = 0"):
        trace.TraceRecorder(tmp_path / "t.npy", layers=0)
    with pytest.raises(TypeError, match="layers = True"):
        trace.TraceRecorder(tmp_path / "t.npy", layers=True)
    with pytest.raises(TypeError, match="integer tensor"):
        trace.write_trace(str(tmp_path / "f.npy"), torch.zeros(1, 2, 3))
    with pytest.raises(ValueError, match="shape"):
        trace.write_trace(str(tmp_path / "f.npy"), torch.zeros(2, 3, dtype=torch.int32))
    rec = trace.TraceRecorder(tmp_path / "t.npy")
    rec.record(torch.zeros(4, 8, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"\(2, 8\)"):
        rec.record(torch.zeros(2, 8, dtype=torch.int32))
    rec.close()
    with pytest.raises(RuntimeError, match="closed"):
        rec.record(torch.zeros(4, 8, dtype=torch.int32))
