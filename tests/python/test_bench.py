"""python -m evenep.bench: a tiny run on the CPU (and on the GPU: eager, graph replays of every op, no C++ CLI) writes
its table and JSON and passes its own check; the C++ rows map onto the Python ops."""

import json

import pytest
import torch

import evenep
from evenep import bench

TINY = ["--ranks", "2", "--experts", "4", "--top-k", "2", "--tokens", "8", "--hidden", "16", "--ffn", "16",
        "--token-padding", "8", "--iters", "1", "--warmup", "0", "--cpp", "none"]


def _run(tmp_path, *extra):
    path = tmp_path / "bench.json"
    rows = bench.main([*TINY, *extra, "--json", str(path)])
    doc = json.loads(path.read_text())
    assert doc["self_check_rel_err"] <= 2**-7
    assert [r["what"] for r in doc["rows"]] == [r[0] for r in rows]
    return [r[0] for r in rows]


def test_bench_cpu(tmp_path):
    names = _run(tmp_path)
    assert names[0] == "MoE fwd+bwd evenep" and "op dispatch" in names and "op grouped_gemm wgrad" in names
    names = _run(tmp_path, "--ops-only")
    assert not any(n.startswith("MoE") or "grouped_gemm" in n for n in names) and "op reduce_grad" in names
    names = _run(tmp_path, "--ops-only", "--ops", "plan,combine")
    assert names == ["op plan", "op combine"]
    with pytest.raises(SystemExit, match="plan_x"):
        bench.main([*TINY, "--ops-only", "--ops", "plan_x"])


def test_cpp_rows_map():
    cpp = {"plan_fused_rows": 1.0, "dispatch": 2.0, "dispatch_graph": 1.5, "combine_pull_weighted": 3.0}
    assert bench._cpp_of("op plan", cpp) == 1.0
    assert bench._cpp_of("op dispatch", cpp) == 2.0 and bench._cpp_of("op dispatch graph", cpp) == 1.5
    assert bench._cpp_of("op combine", cpp) == 3.0 and bench._cpp_of("op combine graph", cpp) is None
    assert bench._cpp_of("op combine_backward", cpp) is None and bench._cpp_of("MoE fwd+bwd evenep", cpp) is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.skipif(not evenep.cuda_built(), reason="evenep built without the CUDA ops")
def test_bench_cuda(tmp_path):
    names = _run(tmp_path, "--device", "cuda")
    for op in ("dispatch", "combine", "prefetch_weight", "reduce_grad_add_", "plan"):
        assert f"op {op} graph" in names, names
    assert "MoE fwd+bwd evenep graph" in names
