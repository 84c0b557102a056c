"""The activation table: each activation's fact is declared with its layer kind, and the fuse
passes, FusedActivation's check and the backends' codes all come from it."""

import numpy as np
import pytest

import flowrt
from flowrt.engine.graph import layer_kind
from flowrt.engine.graph.layer_kind import (
    ActivationFact,
    activation_facts,
    activation_kinds,
    declare_activation,
    get_layer_kind,
)
from flowrt.engine.graph.passes.fuse_activation import as_fused_activation
from flowrt.errors import GraphError
from flowrt.registry import FusedActivation

# Compiled into cached kernels (numba's cache, OpenCL binaries): these never change.
CODES = {
    "Relu": 1, "LeakyRelu": 2, "Clip": 3, "Sigmoid": 4, "Tanh": 5, "HardSigmoid": 6,
    "HardSwish": 7, "Elu": 8, "Softplus": 9, "Gelu": 10, "Swish": 12, "Mish": 13, "Softsign": 14,
}  # fmt: skip


@pytest.fixture
def scratch_table(monkeypatch):
    """A copy of the activation table that a test may add to; the real one is left as it was."""
    monkeypatch.setattr(layer_kind, "ACTIVATIONS", dict(activation_facts()))


def test_codes_are_those_compiled_into_kernels():
    assert {kind: fact.code for kind, fact in activation_facts().items()} == CODES
    assert dict(activation_facts()["Gelu"].variants) == {"tanh": 11}


def test_table_is_in_code_order_and_splits_by_who_fuses():
    assert list(activation_facts()) == sorted(CODES, key=CODES.get)
    assert activation_kinds("everywhere") == ("Relu", "LeakyRelu", "Clip", "Sigmoid", "Tanh")
    assert activation_kinds("curve") == ("HardSigmoid", "HardSwish", "Elu", "Gelu", "Swish", "Softsign")
    assert activation_kinds("never") == ("Softplus", "Mish")


@pytest.mark.parametrize("kind", sorted(CODES))
def test_each_activation_is_a_layer_kind_carrying_its_fact(kind):
    assert get_layer_kind(kind).activation is activation_facts()[kind]


def test_a_kind_that_is_no_activation_has_no_fact():
    assert get_layer_kind("Exp").activation is None
    assert get_layer_kind("Conv").activation is None


def test_fused_activation_names_exactly_the_kinds_that_are_fused():
    for kind in activation_kinds("everywhere", "curve"):
        assert FusedActivation(kind).kind == kind
    for kind in ("Softplus", "Mish", "Conv", "relu"):
        with pytest.raises(ValueError, match=rf"'kind' must be in .*got '{kind}'"):
            FusedActivation(kind)


@pytest.mark.parametrize(
    "kind, descriptor, constants, expected",
    [
        ("Relu", flowrt.descriptors.Relu(), (), FusedActivation("Relu")),
        ("LeakyRelu", flowrt.descriptors.LeakyRelu(alpha=0.25), (), FusedActivation("LeakyRelu", 0.25)),
        (
            "HardSigmoid",
            flowrt.descriptors.HardSigmoid(0.3, 0.4),
            (),
            FusedActivation("HardSigmoid", 0.3, 0.4),
        ),
        ("Elu", flowrt.descriptors.Elu(alpha=0.7), (), FusedActivation("Elu", 0.7)),
        ("Swish", flowrt.descriptors.Swish(alpha=1.5), (), FusedActivation("Swish", 1.5)),
        ("Gelu", flowrt.descriptors.Gelu("none"), (), FusedActivation("Gelu")),
        ("Gelu", flowrt.descriptors.Gelu("tanh"), (), FusedActivation("Gelu", form="tanh")),
        ("Clip", flowrt.descriptors.Clip(min=-1.0, max=6.0, opset=6), (), FusedActivation("Clip", -1.0, 6.0)),
        (
            "Clip",
            flowrt.descriptors.Clip(),
            (None, np.float32(0), np.float32(6)),
            FusedActivation("Clip", 0.0, 6.0),
        ),
        ("Clip", flowrt.descriptors.Clip(), (None, None, np.float32(6)), None),
        ("Clip", flowrt.descriptors.Clip(), (None,), FusedActivation("Clip", -np.inf, np.inf)),
        ("Softplus", flowrt.descriptors.Softplus(), (), None),
        ("Conv", flowrt.descriptors.Conv(), (), None),
    ],
)
def test_fused_activation_takes_its_parameters_as_the_fact_reads_them(kind, descriptor, constants, expected):
    assert as_fused_activation(kind, descriptor, constants) == expected


@pytest.mark.usefixtures("scratch_table")
def test_a_declared_activation_is_fusable_everywhere_the_table_is_read():
    declare_activation("Selu", ActivationFact(15, fused="curve"))
    assert activation_kinds("curve")[-1] == "Selu"
    assert get_layer_kind("Selu").activation == ActivationFact(15, fused="curve")
    assert as_fused_activation("Selu", flowrt.descriptors.Selu()) == FusedActivation("Selu")


@pytest.mark.usefixtures("scratch_table")
@pytest.mark.parametrize(
    "name, fact, message",
    [
        ("Selu", ActivationFact(4), r"'Selu' takes code 4, which is 'Sigmoid'"),
        ("Selu", ActivationFact(15, variants={"x": 11}), r"takes code 11, which is 'Gelu'"),
        ("Selu", ActivationFact(15, variants={"x": 15}), r"takes code 15, which is 'Selu'"),
        ("Relu", ActivationFact(15), r"activation 'Relu' declared twice"),
    ],
)
def test_an_activation_that_takes_a_taken_code_or_kind_is_refused(name, fact, message):
    before = dict(layer_kind.ACTIVATIONS)
    with pytest.raises(GraphError, match=message):
        declare_activation(name, fact)
    assert layer_kind.ACTIVATIONS == before


def test_code_zero_is_no_activation():
    with pytest.raises(ValueError, match="'code' must be >= 1"):
        ActivationFact(0)


def test_one_fact_is_one_kind():
    with pytest.raises(GraphError, match="an activation fact is one kind's"):
        layer_kind.layer_kind(["A", "B"], activation=ActivationFact(14))
