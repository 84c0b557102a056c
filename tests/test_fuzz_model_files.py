"""Seeded fuzzing of model files: mutated ONNX models and .flowrt files (see ``fuzzmodels``
and ``fuzzflowrt``) go through ``flowrt.onnx.load`` / ``flowrt.load``, ``optimize``,
``rt.load`` and ``run``.

Every failure must be a ``flowrt.errors`` error; no case may take more than 10 s; and a
mutated file that runs must give what it says: a .flowrt network's outputs are those of its
layers run one by one through CpuRef's kernels (fused activations applied), an ONNX model's
(all on CpuRef) those of ONNX Runtime. 100 cases of each in CI; ``-m slow`` runs 2,000 of each.
"""

from __future__ import annotations

import collections
import contextlib
import time
from collections.abc import Callable

import numpy as np
import onnxruntime
import pytest
import trio
from fuzzflowrt import apply_activation, fuzz_registry, mutate_flowrt
from fuzzmodels import mutate_onnx, small_onnx_model
from netbuild import serializable_network
from timelimit import time_limit

import flowrt
from flowrt import serialize
from flowrt.errors import FlowrtError
from flowrt.workers.cpu.ref.kernels import load_all

CASES = 100
SLOW_CASES = 2000
CASE_LIMIT_S = 10.0
BUDGET = 32 * 2**20  # far above the originals' needs; mutated sizes past it are ResourceErrors
MAX_FEED_ELEMENTS = 2**20


class _TooSlow(Exception):
    pass


def _time_limit(seconds: float) -> contextlib.AbstractContextManager[None]:
    """Raise _TooSlow in the main thread once ``seconds`` have passed (the synchronous steps)."""
    return time_limit(seconds, lambda: _TooSlow(f"over {seconds:.1f} s"))


def _feeds(model: flowrt.LoadedNetwork, rng: np.random.Generator) -> dict[str, np.ndarray] | None:
    """Random feeds for the model's inputs (symbolic dims 1); None when one would be huge."""
    feeds = {}
    for name, info in model.inputs.items():
        shape = (1,) if info.shape is None else tuple(d if isinstance(d, int) else 1 for d in info.shape)
        if np.prod(shape, dtype=float) > MAX_FEED_ELEMENTS:
            return None
        dtype = np.dtype(info.dtype.value) if info.dtype.value != "string" else np.dtype(object)
        feeds[name] = (rng.standard_normal(shape) * 3).astype(dtype)
    return feeds


def _interpret(optimized: flowrt.OptimizedNetwork, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The network's outputs, each layer run by its CpuRef kernel in topological order."""
    values: dict[tuple[str, int], np.ndarray] = {}
    results = {}
    for layer in optimized.graph.topological_order():
        inputs = [
            None if s.source is None else values[(s.source.layer.name, s.source.index)] for s in layer.inputs
        ]
        if layer.kind == "Input":
            outputs = [feeds[layer.descriptor.name]]
        elif layer.kind == "Constant":
            outputs = [layer.descriptor.value]
        elif layer.kind == "Output":
            results[layer.descriptor.name] = inputs[0]
            continue
        else:
            result = load_all()[layer.kind](layer.descriptor, *inputs)
            outputs = [np.asarray(o) for o in (result if isinstance(result, (tuple, list)) else (result,))]
            if layer.activation is not None:
                outputs[0] = apply_activation(layer.activation, outputs[0])
        values.update({(layer.name, k): np.asarray(v) for k, v in enumerate(outputs)})
    return results


def _same(got: dict, expected: dict, exact: bool) -> str:
    """An empty string when the outputs match, else what differs."""
    if set(got) != set(expected):
        return f"outputs {sorted(got)}, expected {sorted(expected)}"
    for name, value in got.items():
        want = np.asarray(expected[name])
        if value.shape != want.shape or value.dtype != want.dtype:
            return f"output {name!r} is {value.dtype}{value.shape}, expected {want.dtype}{want.shape}"
        if value.dtype.kind == "f" and not exact:
            ok = np.allclose(value, want, rtol=1e-4, atol=1e-5, equal_nan=True)
        else:
            ok = np.array_equal(value, want, equal_nan=value.dtype.kind in "fc")
        if not ok:
            return f"output {name!r} differs from the reference"
    return ""


def _onnx_reference(data: bytes, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
    """ONNX Runtime's outputs; None when it cannot run the model (it refuses many mutations
    flowrt refuses too, and a few flowrt takes: then there is nothing to compare)."""
    try:
        with _time_limit(CASE_LIMIT_S), np.errstate(all="ignore"):
            options = onnxruntime.SessionOptions()
            options.log_severity_level = 4
            session = onnxruntime.InferenceSession(data, options, providers=["CPUExecutionProvider"])
            names = [o.name for o in session.get_outputs()]
            return dict(zip(names, session.run(names, feeds)))
    except Exception:
        return None


async def _run(rt: flowrt.Runtime, optimized, rng: np.random.Generator, seconds: float):
    """Load and run ``optimized``; returns (feeds, outputs), or None when no feed can be made."""
    with trio.fail_after(max(seconds, 0.01)):
        model = await rt.load(optimized, max_in_flight=1)
        try:
            feeds = _feeds(model, rng)
            return None if feeds is None else (feeds, await model.run(feeds))
        finally:
            await model.unload()


Prepare = Callable[[bytes, int], flowrt.OptimizedNetwork]
Reference = Callable[[bytes, flowrt.OptimizedNetwork, dict], tuple[dict | None, bool]]


async def _fuzz(
    original: bytes, mutate, prepare: Prepare, reference: Reference, count: int, seed: int, registry
):
    """Run ``count`` mutated cases; returns (problems, outcome counts, (seconds, case) of the slowest)."""
    problems: list[str] = []
    outcomes: collections.Counter = collections.Counter()
    slowest = (0.0, "")
    async with flowrt.Runtime(registry, cpu_workers=1, memory_budget=BUDGET) as rt:
        for index in range(count):
            rng = np.random.default_rng([seed, index])
            data, what = mutate(original, rng)
            start, stage = time.monotonic(), "load"
            try:
                with _time_limit(CASE_LIMIT_S):
                    optimized = prepare(data, index)
                stage = "run"
                ran = await _run(rt, optimized, rng, CASE_LIMIT_S - (time.monotonic() - start))
                stage = "compare"
                outcome = "loaded, no feed"
                if ran is not None:
                    expected, exact = reference(data, optimized, ran[0])
                    problem = "" if expected is None else _same(ran[1], expected, exact)
                    if problem:
                        problems.append(f"case {index} ({what}): silent wrong output? {problem}")
                    outcome = "ran, no reference" if expected is None else "ran, matched the reference"
                outcomes[outcome] += 1
            except FlowrtError as e:
                outcomes[f"{type(e).__name__} at {stage}"] += 1
            except (Exception, trio.TooSlowError) as e:
                problems.append(f"case {index} ({what}): {stage} raised {type(e).__name__}: {str(e)[:300]}")
            elapsed = time.monotonic() - start
            slowest = max(slowest, (elapsed, f"case {index} ({what[:120]})"))
            if elapsed > CASE_LIMIT_S:
                problems.append(f"case {index} ({what}): took {elapsed:.1f} s")
    return problems, outcomes, slowest


def _onnx_expected(data: bytes, optimized, feeds: dict):
    """ONNX Runtime's outputs where every layer is on CpuRef; on another backend, the rounding
    of its kernels may be magnified past any tolerance (a Tan near pi/2), so none."""
    if any(layer.backend not in (None, "CpuRef") for layer in optimized.graph):
        return None, False
    return _onnx_reference(data, feeds), False


def _flowrt_expected(data: bytes, optimized, feeds: dict):
    """CpuRef's kernels give CpuRef's (and RefFusing's) results exactly; another backend's
    within rounding."""
    exact = all(layer.backend in (None, "CpuRef", "RefFusing") for layer in optimized.graph)
    return _interpret(optimized, feeds), exact


def _check(name: str, result) -> None:
    problems, outcomes, slowest = result
    print(f"\n{name}: {dict(sorted(outcomes.items()))}; slowest {slowest[1]}: {slowest[0]:.2f} s")
    assert not problems, f"{len(problems)} problem(s):\n" + "\n".join(problems[:20])


async def fuzz_onnx(count: int, seed: int, full: bool):
    """``count`` mutated ONNX models through load (onnx's checker on for even cases, off for
    odd: the importer's own checks), optimize (on CpuRef; with ``full``, one case in three on
    CpuAcc first), load and run."""
    registry = fuzz_registry(full)
    options = flowrt.OptimizerOptions(memory_budget=BUDGET)

    def prepare(data: bytes, index: int) -> flowrt.OptimizedNetwork:
        net = flowrt.onnx.load(data, check=index % 2 == 0, memory_budget=BUDGET)
        backends = ["CpuAcc", "CpuRef"] if full and index % 3 == 0 else ["CpuRef"]
        return flowrt.optimize(net, backends, options, registry=registry)

    original = small_onnx_model().SerializeToString()
    return await _fuzz(original, mutate_onnx, prepare, _onnx_expected, count, seed, registry)


async def fuzz_flowrt(directory, count: int, seed: int, full: bool):
    """``count`` mutated .flowrt files of a network optimized for RefFusing (Conv and Gemm
    carry fused activations) through flowrt.load (mapped for even cases), load and run; with
    ``full`` every registered backend (CpuAcc, GpuAcc) can be named, else CpuRef and RefFusing."""
    registry = fuzz_registry(full)
    original = directory / "original.flowrt"
    serialize.save(
        flowrt.optimize(serializable_network(), ["RefFusing", "CpuRef"], registry=registry), original
    )
    path = directory / "mutated.flowrt"

    def prepare(data: bytes, index: int) -> flowrt.OptimizedNetwork:
        path.write_bytes(data)
        return serialize.load(path, mmap=index % 2 == 0, registry=registry)

    return await _fuzz(original.read_bytes(), mutate_flowrt, prepare, _flowrt_expected, count, seed, registry)


async def test_mutated_onnx_models_fail_with_flowrt_errors_or_run_right():
    _check("onnx", await fuzz_onnx(CASES, seed=1, full=False))


async def test_mutated_flowrt_files_fail_with_flowrt_errors_or_run_right(tmp_path):
    _check("flowrt", await fuzz_flowrt(tmp_path, CASES, seed=2, full=False))


@pytest.mark.slow
async def test_2000_mutated_onnx_models():
    _check("onnx", await fuzz_onnx(SLOW_CASES, seed=101, full=True))


@pytest.mark.slow
async def test_2000_mutated_flowrt_files_on_every_backend(tmp_path):
    _check("flowrt", await fuzz_flowrt(tmp_path, SLOW_CASES, seed=102, full=True))
