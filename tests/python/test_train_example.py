"""examples/train_moe.py: a short run of both back-ends from the same weights on the same batches.

Cases: 8 steps of the small MoE LM with --backend evenep and --backend reference; every step's loss agrees within
bf16 noise (2% relative: the EvenEP path stores bf16 between its GEMMs, the reference computes in fp32), and the
loss falls.
"""

import importlib.util
import pathlib

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "train_moe.py"


def _load():
    spec = importlib.util.spec_from_file_location("train_moe", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_backends_agree():
    train = _load()
    common = ["--steps", "8", "--quiet", "--layers", "1", "--hidden", "32", "--ffn", "32", "--seq", "16"]
    ev = train.main(["--backend", "evenep", *common])
    ref = train.main(["--backend", "reference", *common])
    assert len(ev) == len(ref) == 8
    for step, (a, b) in enumerate(zip(ev, ref)):
        assert abs(a - b) <= 0.02 * abs(b), f"step {step}: evenep {a:.4f} vs reference {b:.4f}"
    assert ev[-1] < ev[0] - 0.5
