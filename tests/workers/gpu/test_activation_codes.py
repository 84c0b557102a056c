"""common.cl's activate() switch has a case for each activation every fusing backend applies,
under the activation table's code (no OpenCL device needed: this reads the source)."""

import re
from importlib import resources

import pytest

from flowrt.engine.graph.layer_kind import activation_facts, activation_kinds
from flowrt.errors import BackendError
from flowrt.registry import FusedActivation
from flowrt.workers.gpu.kernels import GPU_CURVES, activation_args, activation_codes


def _macro(kind: str) -> str:
    """``ACT_LEAKY_RELU`` for LeakyRelu."""
    return "ACT_" + re.sub(r"(?<!^)(?=[A-Z])", "_", kind).upper()


def _common_cl() -> str:
    return (resources.files("flowrt.workers.gpu.kernels") / "common.cl").read_text()


def _expected_codes() -> dict[str, int]:
    """Each activation GpuAcc applies, and each of its other forms (``ACT_GELU_TANH``), by macro."""
    facts = activation_facts()
    expected = {}
    for kind in {*activation_kinds("everywhere"), *GPU_CURVES}:
        expected[_macro(kind)] = facts[kind].code
        for form, code in facts[kind].variants.items():
            expected[f"{_macro(kind)}_{form.upper()}"] = code
    return expected


def test_common_cl_defines_each_code_of_the_table():
    defines = {name: int(code) for name, code in re.findall(r"#define (ACT_\w+) (\d+)", _common_cl())}
    assert defines == {"ACT_NONE": 0, **_expected_codes()}


def test_activate_switch_has_a_case_for_each_activation():
    switch = _common_cl().split("\nfloat activate(", 1)[1].split("\n}\n", 1)[0]
    cases = set(re.findall(r"case (ACT_\w+):", switch))
    assert cases == set(_expected_codes())


def test_kernel_arguments_carry_the_table_code():
    kinds = {*activation_kinds("everywhere"), *GPU_CURVES}
    assert activation_codes() == {k: activation_facts()[k].code for k in kinds}
    code, alpha, beta = activation_args(FusedActivation("Clip", -1.0, 6.0))
    assert (int(code), float(alpha), float(beta)) == (3, -1.0, 6.0)
    assert int(activation_args(None)[0]) == 0
    assert (
        int(activation_args(FusedActivation("Gelu", form="tanh"))[0])
        == activation_facts()["Gelu"].variants["tanh"]
    )


def test_an_activation_gpuacc_does_not_apply_is_refused_by_name():
    # a curve (fused by CpuAcc only) on a GpuAcc layer: only a hand-edited .flowrt file has one
    with pytest.raises(
        BackendError, match=r"GpuAcc applies the fused activations Relu, .* only; got Softsign"
    ):
        activation_args(FusedActivation("Softsign"))
