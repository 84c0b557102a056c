"""Small exports of real architectures (random weights) match ONNX Runtime on CpuAcc + CpuRef.

The files under ``zoo/`` are shrunk relatives of ``benchmarks/zoo.py``'s models, exported by
torch's TorchScript and dynamo exporters (``python benchmarks/zoo.py --export-test-models
tests/integration/zoo`` makes them again): an inverted-residual CNN with depthwise convs and
squeeze-excitation, a BERT encoder with a padding mask, a GPT-2 decoder with its causal mask, a
U-Net with ConvTranspose, resizes and skip concats. No torch is needed to run them. The slow test
runs the whole zoo through ``benchmarks/zoo.py`` where torch is installed.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import onnxruntime as ort
import pytest

import flowrt

ZOO_DIR = Path(__file__).parent / "zoo"
BENCHMARKS = Path(__file__).parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

from zoo import compare_outputs  # noqa: E402
from zoo_models import TEST_MODELS, make_feeds  # noqa: E402

FILES = sorted(ZOO_DIR.glob("*.onnx"))


def test_every_test_model_is_committed_and_the_files_stay_small():
    names = {path.name.split(".")[0] for path in FILES}
    assert names == set(TEST_MODELS)
    assert sum(path.stat().st_size for path in FILES) <= 1_200_000


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_zoo_test_model_matches_onnxruntime(path):
    feeds = make_feeds(TEST_MODELS[path.name.split(".")[0]].inputs)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    expected = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    with flowrt.InferenceSession(path, backends=["CpuAcc", "CpuRef"]) as sess:
        got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    max_abs, max_rel, ok = compare_outputs(got, expected)
    assert ok, f"{path.name}: largest error {max_abs:.2e} ({max_rel:.2e} of the output's scale)"


# Zoo models that flowrt cannot load yet, with the reason; the others must all match.
KNOWN_GAPS: dict[str, str] = {}  # model -> why it may fail (none now: LSTM runs on both CPU backends)


@pytest.mark.slow
def test_whole_zoo_exports_and_matches_onnxruntime():
    for package in ("torch", "torchvision", "transformers", "onnxscript"):
        if importlib.util.find_spec(package) is None:
            pytest.skip(f"the zoo needs the zoo extra ({package} is not installed)")
    import zoo

    results = zoo.run_zoo(zoo.parse_args(["--iterations", "1"]))
    exported = {r.model for r in results if r.status != "export failed"}
    assert exported == set(zoo.ZOO), [
        f"{r.model} ({r.exporter}): {r.detail}" for r in results if r.model not in exported
    ]
    failed = [
        f"{r.model} ({r.exporter}): {r.status}: {r.detail}"
        for r in results
        if r.status not in ("ok", "export failed") and r.model not in KNOWN_GAPS
    ]
    assert not failed, "\n".join(failed)
    assert all(r.ort_ms > 0 for r in results if r.status != "export failed")
