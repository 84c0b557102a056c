"""CpuRef MaxUnpool against onnx's reference evaluator (and onnxruntime where they agree), and
its shape inference."""

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from oracle import assert_matches_reference, run_flowrt_node

import flowrt
from flowrt.engine.graph.layer_kind import get_layer_kind
from flowrt.errors import DataTypeError, ModelLoadError, ShapeError
from flowrt.frontends.onnx.descriptors import make_descriptor
from flowrt.types import DataType, TensorInfo

I64 = DataType.INT64


@st.composite
def unpool_cases(draw):
    """(x, indices, output_shape or None, attributes): up to 3 spatial axes (the reference's limit),
    indices anywhere in the unpooled tensor, repeats included."""
    spatial = draw(st.integers(1, 3))
    kernel = draw(st.lists(st.integers(1, 3), min_size=spatial, max_size=spatial))
    strides = draw(st.lists(st.integers(1, 3), min_size=spatial, max_size=spatial))
    pads = [draw(st.integers(0, k - 1)) for k in kernel * 2]
    # The pooled size of each axis, large enough that (p - 1) * stride covers the pads: the
    # unpooled size is then >= the kernel.
    low = [1 - (-(pads[a] + pads[spatial + a]) // strides[a]) for a in range(spatial)]
    pooled = [draw(st.integers(lo, lo + 2)) for lo in low]
    n, c = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    unpooled = (n, c) + tuple(
        (p - 1) * s - pads[a] - pads[spatial + a] + k
        for a, (p, s, k) in enumerate(zip(pooled, strides, kernel))
    )
    dtype = draw(st.sampled_from([np.float32, np.float64, np.float16]))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    x = rng.standard_normal((n, c, *pooled)).astype(dtype)
    size = int(np.prod(unpooled))
    indices = rng.choice(size, x.shape, replace=draw(st.booleans()) or x.size > size)
    output_shape = None
    if draw(st.booleans()):
        output_shape = np.array([d + draw(st.integers(0, 2)) for d in unpooled], dtype=np.int64)
    attributes = {"kernel_shape": kernel, "strides": strides, "pads": pads}
    if draw(st.booleans()) and all(s == 1 for s in strides):
        del attributes["strides"]
    return x, indices.astype(np.int64), output_shape, attributes


@settings(max_examples=25, deadline=None)
@given(unpool_cases(), st.sampled_from([9, 11, 22]))
def test_max_unpool_matches_reference_on_any_geometry(case, opset):
    x, indices, output_shape, attributes = case
    inputs = [x, indices] if output_shape is None else [x, indices, output_shape]
    (y,) = assert_matches_reference("MaxUnpool", inputs, attributes, opset=opset)
    assert np.count_nonzero(y) <= np.count_nonzero(x)


def test_repeated_indices_keep_the_last_value():
    x = np.arange(1, 5, dtype=np.float32).reshape(1, 1, 2, 2)
    indices = np.array([3, 0, 3, 3]).reshape(1, 1, 2, 2)
    (y,), _ = run_flowrt_node("MaxUnpool", [x, indices], {"kernel_shape": [2, 2], "strides": [2, 2]})
    np.testing.assert_array_equal(y.reshape(-1)[[0, 3]], [2, 4])


def test_output_shape_pads_the_unpooled_tensor_at_the_end_as_the_conformance_case():
    x = np.array([5, 6, 7, 8], dtype=np.float32).reshape(1, 1, 2, 2)
    indices = np.array([5, 7, 13, 15]).reshape(1, 1, 2, 2)
    attributes = {"kernel_shape": [2, 2], "strides": [2, 2]}
    (y,), (info,) = run_flowrt_node("MaxUnpool", [x, indices, np.array([1, 1, 5, 5])], attributes)
    expected = np.zeros((1, 1, 5, 5), np.float32)
    expected[0, 0, 1::2, 1:4:2] = [[5, 6], [7, 8]]
    np.testing.assert_array_equal(y, expected)
    assert info.shape == (1, 1, 5, 5)


def _infer(x, indices, output_shape=None, consts=(None, None, None), **attributes):
    desc = flowrt.descriptors.MaxUnpool(**{"kernel_shape": (2, 2), "strides": (2, 2), **attributes})
    infos = [x, indices] if output_shape is None else [x, indices, output_shape]
    return get_layer_kind("MaxUnpool").infer(desc, infos, list(consts)[: len(infos)])[0]


def test_infer_unpools_known_dims_and_leaves_the_rest_unknown():
    x = TensorInfo(("N", 3, 4, None), DataType.FLOAT16)
    assert _infer(x, TensorInfo(None, I64)) == TensorInfo(("N", 3, 8, None), DataType.FLOAT16)
    assert _infer(x, TensorInfo(None, I64), pads=(1, 0, 1, 0)).shape == ("N", 3, 6, None)
    assert _infer(TensorInfo(None), TensorInfo(None, I64)).shape == (None, None, None, None)
    shape_input = TensorInfo((4,), I64)
    assert _infer(x, TensorInfo(None, I64), shape_input).shape == (None, None, None, None)
    given = _infer(
        TensorInfo((1, 3, 4, 4)), TensorInfo(None, I64), shape_input, consts=(None, None, [1, 3, 9, 8])
    )
    assert given.shape == (1, 3, 9, 8)


X, IDX = TensorInfo((1, 2, 3, 3)), TensorInfo((1, 2, 3, 3), I64)


@pytest.mark.parametrize(
    ("infos", "consts", "attributes", "error", "message"),
    [
        ([TensorInfo((1, 2)), TensorInfo(None, I64)], (), {}, ShapeError, r"X of rank >= 3 \(N, C, spatial...\) expected, got rank 2"),
        ([TensorInfo((1, 2, 3)), TensorInfo(None, I64)], (), {}, ShapeError, r"kernel_shape \[2, 2\] needs 2 spatial dims, got X of rank 3"),
        ([X, IDX], (), {"strides": (2,)}, ShapeError, r"strides must have 2 entries for 2 spatial dims, got \[2\]"),
        ([X, IDX], (), {"pads": (0, 0)}, ShapeError, r"pads must have 4 entries"),
        ([X, TensorInfo((1, 2, 3, 4), I64)], (), {}, ShapeError, r"indices of X's shape \(1, 2, 3, 3\) expected, got \(1, 2, 3, 4\)"),
        ([X, TensorInfo((1, 2, 3, 3), DataType.INT32)], (), {}, DataTypeError, r"indices expects one of int64, got int32"),
        ([TensorInfo((1, 2, 3, 3), I64), IDX], (), {}, DataTypeError, r"X expects a float16, float32 or float64 tensor, got int64"),
        ([X, IDX, TensorInfo((4,), DataType.INT32)], (), {}, DataTypeError, r"output_shape expects one of int64"),
        ([X, IDX, TensorInfo((2, 2), I64)], (), {}, ShapeError, r"output_shape must be 1-D, got shape \(2, 2\)"),
        ([X, IDX, TensorInfo((3,), I64)], (), {}, ShapeError, r"output_shape of 4 dims expected, got \(3,\)"),
        ([X, IDX, TensorInfo((4,), I64)], (None, None, [1, 2, 6, 5]), {}, ShapeError, r"each at least the unpooled shape \(1, 2, 6, 6\), expected; got \[1, 2, 6, 5\]"),
        ([X, IDX], (None, np.full((1, 2, 3, 3), 72)), {}, ShapeError, r"indices must be in \[0, 72\) \(the unpooled element count\), got 72 at index \[0, 0, 0, 0\]"),
        ([TensorInfo((1, 1, 1, 1)), TensorInfo((1, 1, 1, 1), I64)], (), {"pads": (2, 0, 1, 0)}, ShapeError, r"spatial axis 0 of X has 1 cells, which unpool to -1 .*a size >= 0 expected"),
    ],
)  # fmt: skip
def test_infer_says_what_was_expected_and_what_was_found(infos, consts, attributes, error, message):
    with pytest.raises(error, match=f"MaxUnpool.*{message}"):
        _infer(*infos, consts=tuple(consts) + (None,) * (3 - len(consts)), **attributes)


@pytest.mark.parametrize(
    ("attributes", "message"),
    [({}, "kernel_shape"), ({"kernel_shape": [0, 2]}, "kernel_shape must all be >= 1"), ({"kernel_shape": [2], "pads": [-1, 0]}, "pads must all be >= 0")],
)  # fmt: skip
def test_bad_attributes_fail_where_the_node_is_read(attributes, message):
    with pytest.raises(ModelLoadError, match=f"invalid attributes for MaxUnpool.*{message}"):
        make_descriptor("MaxUnpool", attributes, opset=11, num_outputs=1)


def test_index_outside_the_unpooled_tensor_raises_in_the_kernel():
    x = np.ones((1, 1, 2), np.float32)
    with pytest.raises(ShapeError, match=r"indices must be in \[0, 4\).*got -1 at index \[0, 0, 1\]"):
        run_flowrt_node("MaxUnpool", [x, np.array([[[0, -1]]])], {"kernel_shape": [2], "strides": [2]})


def test_max_pool_then_unpool_model_runs_through_inference_session_as_onnxruntime():
    window = {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [1, 1, 1, 1]}
    graph = helper.make_graph(
        [helper.make_node("MaxPool", ["x"], ["p", "i"], **window), helper.make_node("MaxUnpool", ["p", "i"], ["y"], **window)],
        "unpool",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (2, 3, 6, 6))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (2, 3, 6, 6)), helper.make_tensor_value_info("p", TensorProto.FLOAT, (2, 3, 4, 4))],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    x = np.abs(np.random.default_rng(3).standard_normal((2, 3, 6, 6))).astype(np.float32) + 0.1
    y, pooled = flowrt.InferenceSession(model, backends=["CpuRef"]).run(None, {"x": x})
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(y, session.run(None, {"x": x})[0])
    assert np.count_nonzero(y) == pooled.size
    # Pooling the unpooled tensor gives back the pooled one, as the spec promises.
    (pooled_again,), _ = run_flowrt_node("MaxPool", [y], window)
    np.testing.assert_array_equal(pooled_again, pooled)
