"""onnx's conformance suite (onnx.backend.test) run against flowrt's CpuRef.

Covers every kind the onnx package ships: real (the light models), simple, pytorch-converted,
pytorch-operator and node (each operator one by one). The cases excluded are exactly those
``EXCLUDED`` lists, each with its reason: it is computed from the models themselves (an
operator flowrt does not implement, a data type numpy lacks, a non-tensor type) plus the
hand-written ``KNOWN_DIFFERENCES``. Run ``python tests/frontends/onnx/test_backend_conformance.py``
to print the list.
"""

from __future__ import annotations

import os
import re

import onnx
import onnx.backend.test
from onnx.backend.test.loader import load_model_tests

from flowrt.engine.graph.layer_kind import known_layer_kinds
from flowrt.onnx import backend as flowrt_backend

KINDS = ("node", "real", "simple", "pytorch-converted", "pytorch-operator")

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


class CpuRefBackend(flowrt_backend.FlowrtBackend):
    """flowrt's onnx backend on CpuRef alone: the reference is what this suite checks."""

    backends = ("CpuRef",)


backend_test = onnx.backend.test.BackendTest(CpuRefBackend, __name__)
backend_test.include(r"_cpu$")
for pattern, _reason in EXCLUDED:
    backend_test.exclude(pattern)

globals().update(backend_test.test_cases)


if __name__ == "__main__":
    by_reason: dict[str, list[str]] = {}
    for pattern, reason in EXCLUDED:
        by_reason.setdefault(reason, []).append(pattern)
    for reason, patterns in sorted(by_reason.items(), key=lambda item: -len(item[1])):
        print(f"{len(patterns):4d}  {reason}")
    print(f"{len(EXCLUDED)} excluded")
