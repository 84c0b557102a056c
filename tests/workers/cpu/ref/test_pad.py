"""CpuRef Pad against onnx's reference, and its shape inference."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle import assert_matches_reference, run_flowrt_node

from flowrt.engine.graph.layer_kind import get_layer_kind
from flowrt.errors import ModelLoadError, ShapeError
from flowrt.frontends.onnx.descriptors import make_descriptor
from flowrt.types import DataType, TensorInfo

dims_strategy = st.lists(st.integers(1, 4), min_size=1, max_size=4)
modes = st.sampled_from(["constant", "reflect", "edge", "wrap"])
PADS = TensorInfo((None,), DataType.INT64)


def _infer(inputs, consts, opset=21, **attributes):
    desc = make_descriptor("Pad", attributes, opset=opset, num_outputs=1)
    return get_layer_kind("Pad").infer(desc, inputs, consts)[0]


def _pads(data, dims, mode):
    """Begin counts then end counts; reflect may not reach past the edge."""
    limit = [d - 1 if mode == "reflect" else 3 for d in dims]
    begins = [data.draw(st.integers(0, n)) for n in limit]
    return begins + [data.draw(st.integers(0, n)) for n in limit]


@settings(max_examples=25, deadline=None)
@given(dims_strategy, modes, st.data())
def test_pad_every_mode_with_input_pads_matches_reference(dims, mode, data):
    x = np.random.default_rng(4).standard_normal(dims).astype(np.float32)
    pads = np.array(_pads(data, dims, mode), dtype=np.int64)
    value = np.array(data.draw(st.floats(-5, 5, width=32)), dtype=np.float32)
    assert_matches_reference("Pad", [x, pads, value], {"mode": mode}, opset=13)


@settings(max_examples=25, deadline=None)
@given(dims_strategy, modes, st.data())
def test_pad_chosen_axes_of_opset_18_matches_reference(dims, mode, data):
    x = np.arange(np.prod(dims), dtype=np.int32).reshape(dims)
    axes = data.draw(
        st.lists(st.integers(-len(dims), len(dims) - 1), min_size=1, unique_by=lambda a: a % len(dims))
    )
    full = _pads(data, dims, mode)
    rank = len(dims)
    pads = [full[a % rank] for a in axes] + [full[rank + a % rank] for a in axes]
    inputs = [x, np.array(pads, dtype=np.int64), None, np.array(axes, dtype=np.int64)]
    assert_matches_reference("Pad", inputs, {"mode": mode}, opset=18)


def test_pad_attributes_before_opset_11_match_reference():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert_matches_reference("Pad", [x], {"pads": [1, 2, 0, 1], "value": 1.5}, opset=2)
    assert_matches_reference("Pad", [x], {"paddings": [0, 1, 2, 0], "mode": "edge"}, opset=1)


def test_negative_pads_crop():
    x = np.arange(20, dtype=np.float32).reshape(4, 5)
    pads = np.array([-1, 2, 1, -2], dtype=np.int64)
    (got,), (info,) = run_flowrt_node("Pad", [x, pads], {"mode": "edge"}, opset=13)
    np.testing.assert_array_equal(got, np.pad(x[1:, :3], [(0, 1), (2, 0)], mode="edge"))
    assert info.shape == got.shape == (4, 5)


def test_infer_copes_with_unknown_dims_and_pads():
    assert _infer([TensorInfo(("N", 3)), PADS], [None, np.array([0, 1, 0, 2])]).shape == ("N", 6)
    assert _infer([TensorInfo(("N", 3)), PADS], [None, np.array([1, 1, 0, 2])]).shape == (None, 6)
    assert _infer([TensorInfo(("N", 3)), PADS], [None, None]).shape == (None, None)
    axes = TensorInfo((1,), DataType.INT64)
    assert _infer(
        [TensorInfo(("N", 3)), PADS, None, axes], [None, None, None, np.array([1])], opset=18
    ).shape == ("N", None)
    assert _infer([TensorInfo(None), PADS], [None, np.array([0, 1])]).shape is None


def test_bad_pads_and_modes_raise():
    with pytest.raises(ShapeError, match="4 pads expected"):
        _infer([TensorInfo((2, 3)), PADS], [None, np.array([1, 1])])
    with pytest.raises(ShapeError, match="crop more"):
        _infer([TensorInfo((2, 3)), PADS], [None, np.array([-2, 0, -1, 0])])
    with pytest.raises(ModelLoadError, match="mode"):
        make_descriptor("Pad", {"mode": "mirror"}, opset=13, num_outputs=1)
