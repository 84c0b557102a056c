"""onnx's conformance suite (onnx.backend.test) run through flowrt's onnx backend.

Two runs of the same cases: on CpuRef alone (the default run, CI's), and on CpuAcc then CpuRef
(``-m slow``: CpuAcc takes the layers it supports, CpuRef the rest).

What the runner reads: ``onnx.backend.test.BackendTest`` over the installed onnx package, every
kind it has: node (each operator one by one), real (the light models), simple,
pytorch-converted and pytorch-operator. The node cases are regenerated, not read: the
installed onnx (1.23 here; the node ``.pb`` data left the package with onnx PR #7959) builds
them in memory by running its generators, ``onnx.backend.test.case.node`` (each operator's
``export*`` calls ``expect``, which makes the model and its expected outputs), from
``load_model_tests(kind="node")``, which ``BackendTest`` calls; an older onnx still reads the
shipped ``data/node``. The other kinds are data the package ships (``onnx/backend/test/data``),
the light models' expected outputs computed by onnx's ReferenceEvaluator.

The cases excluded are exactly those ``EXCLUDED`` lists, each with its reason: it is computed
from the models themselves (an operator flowrt does not implement, a non-tensor type) plus the
hand-written ``KNOWN_DIFFERENCES``; the CpuAcc run also excludes ``CPUACC_KNOWN_DIFFERENCES``
(cases CpuRef passes and CpuAcc does not). ``python
tests/frontends/onnx/test_backend_conformance.py`` prints the lists;
``python scripts/conformance_report.py`` writes the pass rates to docs/conformance.md.

Each case has ``CASE_TIME_LIMIT_S`` to run (see ``time_limit``).
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import unittest
from collections.abc import Iterator, Sequence

import onnx
import onnx.backend.test
import pytest
from onnx.backend.test.loader import load_model_tests
from timelimit import time_limit as shared_time_limit

from flowrt.engine.graph.layer_kind import known_layer_kinds
from flowrt.onnx import backend as flowrt_backend

KINDS = ("node", "real", "simple", "pytorch-converted", "pytorch-operator")
# BackendTest's class for each kind: OnnxBackend<category>ModelTest.
CATEGORIES = {
    "node": "Node",
    "real": "Real",
    "simple": "Simple",
    "pytorch-converted": "PyTorchConverted",
    "pytorch-operator": "PyTorchOperator",
}
CASE_TIME_LIMIT_S = 60

# Element types flowrt has no DataType for (numpy's own types and ml_dtypes' cover the rest).
_NO_NUMPY_TYPE: dict[int, str] = {}

# Cases that use only supported operators and types but still differ, with the reason.
KNOWN_DIFFERENCES: list[tuple[str, str]] = [
    (
        r"^test_training_dropout(_default)?(_mask)?_cpu$",
        "training-mode Dropout drops at random; flowrt runs inference only",
    ),
    (
        r"^test_attention_4d_causal_fp16_expanded_cpu$",
        "float16 rounding: 2 of 192 values differ from onnx's float32-accumulated reference beyond rtol 1e-3",
    ),
]

# Cases CpuRef passes that fail once CpuAcc takes its layers, each with its reason: a CpuAcc
# bug, or CpuAcc's float32 rounding (another order of summation) where a case is that sensitive.
CPUACC_KNOWN_DIFFERENCES: list[tuple[str, str]] = [
    (
        r"^test_squeezenet_cpu$",
        "CpuAcc Conv: float32 rounding (sums in another order, within 6e-6 of CpuRef) on logits of "
        "~9.5e9 (1 ulp = 1024) that the reference has all equal; Softmax turns the difference "
        "into 0.0625 on 16 classes where onnx expects 0.001 on all 1000",
    ),
]


def _value_types(model: onnx.ModelProto) -> tuple[set[int], bool]:
    """Element types used by the model's tensors, and whether any input/output is not a tensor."""
    graph = model.graph
    types = {t.data_type for t in graph.initializer}
    non_tensor = False
    for value in [*graph.input, *graph.output, *graph.value_info]:
        if value.type.HasField("tensor_type"):
            types.add(value.type.tensor_type.elem_type)
        else:
            non_tensor = True
    for node in graph.node:
        for attr in node.attribute:
            if node.op_type in ("Cast", "CastLike") and attr.name == "to":
                types.add(attr.i)
            if attr.type == onnx.AttributeProto.TENSOR:
                types.add(attr.t.data_type)
    return types, non_tensor


def _unsupported_reason(model: onnx.ModelProto, known: set[str]) -> str | None:
    ops = {(n.domain, n.op_type) for n in model.graph.node}
    unknown = sorted(
        f"{d}.{op}" if d not in ("", "ai.onnx") else op
        for d, op in ops
        if d not in ("", "ai.onnx") or (op not in known and op != "Constant")
    )
    if unknown:
        return f"operator not implemented: {', '.join(unknown)}"
    types, non_tensor = _value_types(model)
    if non_tensor:
        return "sequence, optional and map types are not supported (tensors only)"
    missing = sorted(_NO_NUMPY_TYPE[t] for t in types if t in _NO_NUMPY_TYPE)
    if missing:
        return f"data type without a numpy dtype: {', '.join(missing)}"
    return None


def _case_model(case) -> onnx.ModelProto | None:
    if case.model is not None:
        return case.model
    if case.model_dir is not None:
        return onnx.load(os.path.join(case.model_dir, "model.onnx"), load_external_data=False)
    return None  # the light models: loaded by the runner, all supported


def case_names() -> dict[str, list[str]]:
    """The test name (``test_abs_cpu``) of every case of each kind, sorted."""
    return {kind: sorted(f"{case.name}_cpu" for case in load_model_tests(kind=kind)) for kind in KINDS}


def excluded_cases() -> list[tuple[str, str]]:
    """(test name regex, reason) for every case this suite excludes."""
    known = set(known_layer_kinds())
    excluded = []
    for kind in KINDS:
        for case in load_model_tests(kind=kind):
            model = _case_model(case)
            reason = _unsupported_reason(model, known) if model is not None else None
            if reason is not None:
                excluded.append((f"^{re.escape(case.name)}_cpu$", reason))
    return excluded + KNOWN_DIFFERENCES


EXCLUDED = excluded_cases()


class CaseTimeout(Exception):
    """A case ran past its time limit."""


def time_limit(seconds: float) -> contextlib.AbstractContextManager[None]:
    """Raise CaseTimeout once ``seconds`` have passed (``timelimit.time_limit``). Code that never
    returns to Python (a numba loop that does not end) is not interrupted: for that, pytest's
    own ``-o faulthandler_timeout=120 -o faulthandler_exit_on_timeout=true`` prints every
    thread's stack and ends the run."""
    message = f"the case ran past its {seconds:g} s limit (CASE_TIME_LIMIT_S in {__name__})"
    return shared_time_limit(seconds, lambda: CaseTimeout(message))


@pytest.fixture(autouse=True)
def case_time_limit() -> Iterator[None]:
    """Every test of this module, onnx's cases included, fails past ``CASE_TIME_LIMIT_S``."""
    with time_limit(CASE_TIME_LIMIT_S):
        yield


def test_time_limit_fails_a_case_that_runs_past_it():
    with pytest.raises(CaseTimeout, match=r"ran past its 0.05 s limit"), time_limit(0.05):
        threading.Event().wait(5)


class CpuRefBackend(flowrt_backend.FlowrtBackend):
    """flowrt's onnx backend on CpuRef alone: the reference is what this suite checks."""

    backends = ("CpuRef",)


class CpuAccBackend(flowrt_backend.FlowrtBackend):
    """flowrt's onnx backend on CpuAcc, with CpuRef for the layers CpuAcc declines."""

    backends = ("CpuAcc", "CpuRef")


def backend_test_classes(
    backend: type[flowrt_backend.FlowrtBackend],
    excluded: Sequence[tuple[str, str]],
    suffix: str = "",
    marks: Sequence[pytest.MarkDecorator] = (),
) -> dict[str, type[unittest.TestCase]]:
    """BackendTest's test classes for ``backend``, named ``OnnxBackend<kind>ModelTest<suffix>``:
    the CPU cases only (flowrt's backend has no CUDA device), ``excluded`` skipped with their
    pattern, ``marks`` on every case. Each class says its ``kind`` and ``backends``."""
    runner = onnx.backend.test.BackendTest(backend, __name__)
    for pattern, _reason in excluded:
        runner.exclude(pattern)
    generated = runner.test_cases
    classes = {}
    for kind, category in CATEGORIES.items():
        name = f"OnnxBackend{category}ModelTest"
        cases = {k: v for k, v in vars(generated[name]).items() if k.endswith("_cpu")}
        attributes = {"kind": kind, "backends": backend.backends, "pytestmark": list(marks)}
        classes[name + suffix] = type(
            name + suffix, (unittest.TestCase,), {**cases, **attributes, "__module__": __name__}
        )
    return classes


globals().update(backend_test_classes(CpuRefBackend, EXCLUDED))
globals().update(
    backend_test_classes(
        CpuAccBackend, EXCLUDED + CPUACC_KNOWN_DIFFERENCES, suffix="CpuAcc", marks=[pytest.mark.slow]
    )
)


if __name__ == "__main__":
    for title, listed in (("all runs", EXCLUDED), ("CpuAcc,CpuRef", CPUACC_KNOWN_DIFFERENCES)):
        by_reason: dict[str, list[str]] = {}
        for pattern, reason in listed:
            by_reason.setdefault(reason, []).append(pattern)
        for reason, patterns in sorted(by_reason.items(), key=lambda item: -len(item[1])):
            print(f"{len(patterns):4d}  {reason}")
        print(f"{len(listed)} excluded ({title})")
