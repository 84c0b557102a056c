"""CpuRef Einsum against onnx's reference, and its shape inference."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle import assert_matches_reference

from flowrt.engine.graph.layer_kind import get_layer_kind
from flowrt.engine.graph.layers.einsum import EinsumDescriptor
from flowrt.errors import ShapeError
from flowrt.types import TensorInfo

# Equations with the letters of each input; "." stands for one broadcast dim under "...".
EQUATIONS = [
    "ij,jk->ik",
    "bij,bjk->bik",
    "ij->ji",
    "ji",
    "ii->i",
    "ii",
    "ij->",
    "i,i",
    "i,j->ij",
    "bn,anm,bm->ba",
    "...ij,...jk->...ik",
    "...ii->...i",
    "ij...,jk",
    "b i j , b j k -> b k i",
]


def _term_shape(term: str, sizes: dict[str, int], ellipsis: list[int]) -> list[int]:
    term = term.replace(" ", "")
    head, _, tail = term.partition("...")
    extra = ellipsis if "..." in term else []
    return [sizes[c] for c in head] + extra + [sizes[c] for c in tail]


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(EQUATIONS), st.data())
def test_einsum_equations_match_reference(equation, data):
    sizes = {c: data.draw(st.integers(1, 4)) for c in "abijkmn"}
    ellipsis = data.draw(st.lists(st.integers(1, 3), max_size=2))
    terms = equation.split("->")[0].split(",")
    rng = np.random.default_rng(len(equation))
    inputs = [rng.standard_normal(_term_shape(t, sizes, ellipsis)).astype(np.float32) for t in terms]
    assert_matches_reference("Einsum", inputs, {"equation": equation}, opset=12, rtol=1e-4, atol=1e-5)


def test_einsum_keeps_integer_type():
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    (got,) = assert_matches_reference("Einsum", [a, a], {"equation": "ij,kj->ik"}, opset=12)
    np.testing.assert_array_equal(got, a @ a.T)


def _infer(equation, *infos):
    return get_layer_kind("Einsum").infer(EinsumDescriptor(equation), list(infos), [None] * len(infos))[0]


def test_infer_copes_with_symbolic_unknown_and_broadcast_dims():
    assert _infer("bij,bjk->bik", TensorInfo(("B", 2, None)), TensorInfo((None, 3, 4))).shape == ("B", 2, 4)
    assert _infer("ij,jk", TensorInfo((1, 3)), TensorInfo((1, 4))).shape == (1, 4)
    assert _infer("...ij,jk", TensorInfo(("N", 5, 2, 3)), TensorInfo((3, 4))).shape == ("N", 5, 2, 4)
    assert _infer("...ij,...jk", TensorInfo(None), TensorInfo((2, 3, 4))).shape is None
    assert _infer("ij,jk->ik", TensorInfo(None), TensorInfo((3, 4))).shape == (None, 4)


def test_bad_equations_and_shapes_raise():
    with pytest.raises(ShapeError, match="stands for dims 3 and 4"):
        _infer("ij,jk->ik", TensorInfo((2, 3)), TensorInfo((4, 5)))
    with pytest.raises(ShapeError, match="2 input terms for 1 inputs"):
        _infer("ij,jk->ik", TensorInfo((2, 3)))
    with pytest.raises(ShapeError, match="does not fit an input of rank 3"):
        _infer("ij->i", TensorInfo((2, 3, 4)))
    with pytest.raises(ShapeError, match="uses one no input has"):
        _infer("ij->iz", TensorInfo((2, 3)))
    with pytest.raises(ValueError, match="einsum equation"):
        EinsumDescriptor("ij->i->j")
