"""CpuRef Transpose, DepthToSpace and SpaceToDepth against onnx's reference, and their shape inference."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle import assert_matches_reference, run_flowrt_node

from flowrt.engine.graph.layer_kind import get_layer_kind
from flowrt.errors import ModelLoadError, ShapeError
from flowrt.frontends.onnx.descriptors import make_descriptor
from flowrt.types import TensorInfo


def _infer(op, info, **attributes):
    desc = make_descriptor(op, attributes, opset=21, num_outputs=1)
    return get_layer_kind(op).infer(desc, [info], [None])[0]


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=5), st.data())
def test_transpose_any_or_default_perm_matches_reference(dims, data):
    x = np.random.default_rng(1).standard_normal(dims).astype(np.float32)
    if data.draw(st.booleans()):
        assert_matches_reference("Transpose", [x])
    else:
        perm = data.draw(st.permutations(range(len(dims))))
        got = assert_matches_reference("Transpose", [x], {"perm": list(perm)})
        assert got[0].flags.c_contiguous


@settings(max_examples=25, deadline=None)
@given(
    st.integers(1, 2),
    st.integers(1, 3),
    st.integers(1, 3),
    st.integers(1, 3),
    st.sampled_from(["DCR", "CRD"]),
)
def test_depth_to_space_both_modes_match_reference(n, c, h, b, mode):
    x = np.arange(n * c * b * b * h * (h + 1), dtype=np.float32).reshape(n, c * b * b, h, h + 1)
    assert_matches_reference("DepthToSpace", [x], {"blocksize": b, "mode": mode})


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 2), st.integers(1, 3), st.integers(1, 3), st.integers(1, 3))
def test_space_to_depth_matches_reference(n, c, h, b):
    x = np.arange(n * c * b * b * h * (h + 1), dtype=np.int64).reshape(n, c, h * b, (h + 1) * b)
    assert_matches_reference("SpaceToDepth", [x], {"blocksize": b})


def test_space_to_depth_inverts_depth_to_space_in_crd_mode():
    x = np.arange(2 * 8 * 3 * 3, dtype=np.float32).reshape(2, 8, 3, 3)
    (space,), _ = run_flowrt_node("DepthToSpace", [x], {"blocksize": 2, "mode": "CRD"})
    (back,), _ = run_flowrt_node("SpaceToDepth", [space], {"blocksize": 2, "mode": "CRD"}, opset=28)
    np.testing.assert_array_equal(back, x)


def test_infer_keeps_symbolic_and_unknown_dims():
    assert _infer("Transpose", TensorInfo(("N", 3, None))).shape == (None, 3, "N")
    assert _infer("Transpose", TensorInfo(None), perm=[1, 0]).shape == (None, None)
    assert _infer("DepthToSpace", TensorInfo(("N", 8, None, 5)), blocksize=2).shape == ("N", 2, None, 10)
    assert _infer("SpaceToDepth", TensorInfo(("N", None, 4, 6)), blocksize=2).shape == ("N", None, 2, 3)
    assert _infer("SpaceToDepth", TensorInfo(None), blocksize=2).shape == (None, None, None, None)


def test_bad_perm_and_indivisible_blocks_raise():
    with pytest.raises(ShapeError, match="permutation"):
        _infer("Transpose", TensorInfo((2, 3, 4)), perm=[0, 0, 1])
    with pytest.raises(ShapeError, match="channels must be divisible by 4"):
        _infer("DepthToSpace", TensorInfo((1, 6, 2, 2)), blocksize=2)
    with pytest.raises(ShapeError, match="width must be divisible by 2"):
        _infer("SpaceToDepth", TensorInfo((1, 6, 2, 3)), blocksize=2)
    with pytest.raises(ShapeError, match="4-D input"):
        _infer("SpaceToDepth", TensorInfo((6, 2, 3)), blocksize=2)
    with pytest.raises(ModelLoadError, match="mode"):
        make_descriptor("DepthToSpace", {"blocksize": 2, "mode": "XYZ"}, opset=13, num_outputs=1)
