"""CpuRef Col2Im, CenterCropPad (against onnx's reference) and MaxRoiPool (against
onnxruntime: onnx has no reference for it), their shape inference and errors, and a model of
all three through the public API."""

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from oracle import assert_matches_reference, run_flowrt_node

import flowrt
from flowrt.engine.graph.layer_kind import get_layer_kind
from flowrt.engine.graph.layers.image import CenterCropPadDescriptor, Col2ImDescriptor, MaxRoiPoolDescriptor
from flowrt.errors import DataTypeError, ModelLoadError, ShapeError
from flowrt.frontends.onnx.descriptors import make_descriptor
from flowrt.types import DataType, TensorInfo
from flowrt.workers.cpu.ref.kernels import load_all

SEEDS = st.integers(0, 2**31 - 1)
F32, I64 = DataType.FLOAT32, DataType.INT64


def _infer(kind, desc, infos, consts=None):
    return get_layer_kind(kind).infer(desc, infos, consts or [None] * len(infos))


@st.composite
def _col2im_cases(draw):
    """(image, block, strides, pads, dilations) with at least one block position per dim."""
    rank = draw(st.integers(1, 3))
    image, block, strides, pads, dilations = [], [], [], [0] * (2 * rank), []
    for i in range(rank):
        block.append(draw(st.integers(1, 3)))
        dilations.append(draw(st.integers(1, 2)))
        pads[i], pads[i + rank] = draw(st.integers(0, 2)), draw(st.integers(0, 2))
        strides.append(draw(st.integers(1, 3)))
        span = dilations[-1] * (block[-1] - 1) + 1 - pads[i] - pads[i + rank]
        image.append(draw(st.integers(max(span, 1), max(span, 1) + 4)))
    return image, block, strides, pads, dilations


@settings(max_examples=25, deadline=None)
@given(seed=SEEDS, case=_col2im_cases(), channels=st.integers(1, 2))
def test_col2im_matches_reference(seed, case, channels):
    image, block, strides, pads, dilations = case
    rank = len(image)
    counts = [
        (image[i] + pads[i] + pads[i + rank] - dilations[i] * (block[i] - 1) - 1) // strides[i] + 1
        for i in range(rank)
    ]
    rng = np.random.default_rng(seed)
    data = rng.standard_normal((2, channels * int(np.prod(block)), int(np.prod(counts)))).astype(np.float32)
    attributes = {"strides": strides, "pads": pads, "dilations": dilations}
    inputs = [data, np.array(image, np.int64), np.array(block, np.int64)]
    (y,) = assert_matches_reference("Col2Im", inputs, attributes, opset=18, atol=1e-5)
    assert y.shape == (2, channels, *image)


def test_col2im_sums_overlapping_blocks():
    # A 1-D image of 4 from 3 blocks of 2 at stride 1: the middle pixels get two values.
    data = np.ones((1, 2, 3), np.int64)
    (y,), _ = run_flowrt_node("Col2Im", [data, np.array([4]), np.array([2])], opset=18)
    np.testing.assert_array_equal(y, [[[1, 2, 2, 1]]])


def test_col2im_infers_channels_and_image_dims():
    infos = [TensorInfo(("N", 18, 12)), TensorInfo((2,), I64), TensorInfo((2,), I64)]
    (known,) = _infer("Col2Im", Col2ImDescriptor(), infos, [None, np.array([5, 6]), np.array([3, 3])])
    (unknown,) = _infer("Col2Im", Col2ImDescriptor(), infos)
    assert known.shape == ("N", 2, 5, 6) and unknown.shape == ("N", None, None, None)


@pytest.mark.parametrize(
    "desc, data, image, block, message",
    [
        (Col2ImDescriptor(), (1, 10, 12), [5, 6], [3, 3], r"input dim 1 \(10\) is not a multiple of prod\(block_shape\) \[3, 3\]"),
        (Col2ImDescriptor(), (1, 9, 10), [5, 6], [3, 3], "input dim 2 of 12 block positions expected .* got 10"),
        (Col2ImDescriptor(), (1, 9, 1), [2, 6], [3, 3], r"image_shape \[2, 6\] cannot hold a block \[3, 3\]"),
        (Col2ImDescriptor(strides=(1,)), (1, 9, 12), [5, 6], [3, 3], "2 strides for 2 spatial dims expected, got \\[1\\]"),
        (Col2ImDescriptor(), (1, 9, 12), [5, 6], [3], "one value per spatial dim expected"),
    ],
)  # fmt: skip
def test_col2im_bad_inputs_say_what_is_wrong(desc, data, image, block, message):
    infos = [TensorInfo(data), TensorInfo((len(image),), I64), TensorInfo((len(block),), I64)]
    with pytest.raises(ShapeError, match=message):
        _infer("Col2Im", desc, infos, [None, np.array(image), np.array(block)])
    with pytest.raises(ShapeError, match=message):  # the kernel checks the run's values too
        load_all()["Col2Im"](desc, np.zeros(data, np.float32), np.array(image), np.array(block))


@settings(max_examples=25, deadline=None)
@given(
    seed=SEEDS,
    dims=st.lists(st.integers(1, 7), min_size=1, max_size=4),
    data=st.data(),
    dtype=st.sampled_from([np.float32, np.int32, np.bool_]),
)
def test_center_crop_pad_matches_reference(seed, dims, data, dtype):
    rank = len(dims)
    axes = data.draw(
        st.none()
        | st.lists(st.integers(-rank, rank - 1), min_size=1, max_size=rank, unique_by=lambda a: a % rank)
    )
    count = rank if axes is None else len(axes)
    sizes = data.draw(st.lists(st.integers(0, 9), min_size=count, max_size=count))
    x = (np.random.default_rng(seed).standard_normal(dims) * 5).astype(dtype)
    attributes = {} if axes is None else {"axes": axes}
    (y,) = assert_matches_reference("CenterCropPad", [x, np.array(sizes, np.int64)], attributes, opset=18)
    assert y.dtype == dtype


def test_center_crop_pad_puts_the_odd_element_at_the_end():
    x = np.arange(1, 6, dtype=np.float32)
    (cropped,), _ = run_flowrt_node("CenterCropPad", [x, np.array([2])], opset=18)
    (padded,), _ = run_flowrt_node("CenterCropPad", [x, np.array([8], np.int32)], opset=18)
    np.testing.assert_array_equal(cropped, [2, 3])
    np.testing.assert_array_equal(padded, [0, 1, 2, 3, 4, 5, 0, 0])


def test_center_crop_pad_infers_the_axes_sizes_when_constant():
    infos = [TensorInfo(("N", 20, 8, 3)), TensorInfo((2,), I64)]
    desc = CenterCropPadDescriptor(axes=(1, -2))
    (known,) = _infer("CenterCropPad", desc, infos, [None, np.array([10, 12])])
    (unknown,) = _infer("CenterCropPad", desc, infos)
    assert known.shape == ("N", 10, 12, 3) and unknown.shape == ("N", None, None, 3)


@pytest.mark.parametrize(
    "axes, shape, consts, error, message",
    [
        ((0, 3), TensorInfo((2,), I64), None, ShapeError, r"distinct axes in \[-3, 3\) expected, got \[0, 3\]"),
        ((0, -3), TensorInfo((2,), I64), None, ShapeError, "distinct axes"),
        (None, TensorInfo((2,), I64), None, ShapeError, r"shape \(one value per axis, 3\) of shape \(3,\) expected, got \(2,\)"),
        (None, TensorInfo((3,), F32), None, DataTypeError, "input shape expects one of int32, int64, got float32"),
        (None, TensorInfo((3,), I64), [None, np.array([1, -1, 2])], ShapeError, r"non-negative sizes expected, got \[1, -1, 2\]"),
    ],
)  # fmt: skip
def test_center_crop_pad_bad_inputs_say_what_is_wrong(axes, shape, consts, error, message):
    with pytest.raises(error, match=message):
        _infer("CenterCropPad", CenterCropPadDescriptor(axes=axes), [TensorInfo((4, 4, 4)), shape], consts)


def _max_roi_pool_model(pooled_shape, spatial_scale):
    node = helper.make_node(
        "MaxRoiPool", ["x", "rois"], ["y"], pooled_shape=pooled_shape, spatial_scale=spatial_scale
    )
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, None),
        helper.make_tensor_value_info("rois", TensorProto.FLOAT, None),
    ]
    graph = helper.make_graph(
        [node], "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


@settings(max_examples=25, deadline=None)
@given(
    seed=SEEDS,
    dims=st.tuples(st.integers(1, 2), st.integers(1, 3), st.integers(1, 8), st.integers(1, 8)),
    count=st.integers(1, 4),
    pooled=st.tuples(st.integers(1, 4), st.integers(1, 4)),
    spatial_scale=st.sampled_from([1.0, 0.5, 0.25, 2.0]),
)
def test_max_roi_pool_matches_onnxruntime(seed, dims, count, pooled, spatial_scale):
    rng = np.random.default_rng(seed)
    # Positive values only: ONNX Runtime starts each bin's maximum at FLT_MIN, not -inf.
    x = rng.uniform(0.1, 2, dims).astype(np.float32)
    corners = rng.integers(-2, 10, (count, 4)) / (2 * spatial_scale)  # half pixels: rounding ties
    rois = np.concatenate([rng.integers(0, dims[0], (count, 1)), corners], axis=1).astype(np.float32)
    model = _max_roi_pool_model(list(pooled), spatial_scale)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (expected,) = session.run(None, {"x": x, "rois": rois})
    attributes = {"pooled_shape": list(pooled), "spatial_scale": spatial_scale}
    (got,), (info,) = run_flowrt_node("MaxRoiPool", [x, rois], attributes, opset=22)
    np.testing.assert_array_equal(got, expected)
    assert info.shape == (count, dims[1], *pooled)


def test_max_roi_pool_takes_the_true_maximum_of_negative_values():
    x = -np.arange(1, 17, dtype=np.float32).reshape(1, 1, 4, 4)
    rois = np.array([[0, 0, 0, 3, 3]], np.float32)
    (y,), _ = run_flowrt_node("MaxRoiPool", [x, rois], {"pooled_shape": [2, 2]}, opset=22)
    np.testing.assert_array_equal(y, [[[[-1, -3], [-9, -11]]]])


@pytest.mark.parametrize(
    "infos, error, message",
    [
        ([TensorInfo((1, 4, 4)), TensorInfo((2, 5))], ShapeError, r"X \[N, C, H, W\] of shape \(\?, \?, \?, \?\) expected, got \(1, 4, 4\)"),
        ([TensorInfo((1, 1, 4, 4)), TensorInfo((2, 4))], ShapeError, r"rois \[num_rois, 5\] .* expected, got \(2, 4\)"),
        ([TensorInfo((1, 1, 4, 4)), TensorInfo((2, 5), DataType.FLOAT64)], DataTypeError, "rois of X's type float32 expected, got float64"),
        ([TensorInfo((1, 1, 4, 4), I64), TensorInfo((2, 5), I64)], DataTypeError, "X expects one of"),
    ],
)  # fmt: skip
def test_max_roi_pool_bad_inputs_say_what_is_wrong(infos, error, message):
    with pytest.raises(error, match=message):
        _infer("MaxRoiPool", MaxRoiPoolDescriptor(pooled_shape=(2, 2)), infos)


@pytest.mark.parametrize(
    "attributes, message",
    [({}, "pooled_shape"), ({"pooled_shape": (2, 0)}, "two positive ints"), ({"pooled_shape": (2, 2), "spatial_scale": 0.0}, "spatial_scale")],
)  # fmt: skip
def test_max_roi_pool_bad_attributes_fail_at_load(attributes, message):
    with pytest.raises(ModelLoadError, match=message):
        make_descriptor("MaxRoiPool", attributes, opset=22, num_outputs=1, where="node 'pool'")


def test_max_roi_pool_refuses_a_batch_index_outside_the_batch():
    x, rois = np.zeros((2, 1, 4, 4), np.float32), np.array([[2, 0, 0, 1, 1]], np.float32)
    with pytest.raises(ShapeError, match=r"region 0's batch index must be in \[0, 2\), got 2.0"):
        load_all()["MaxRoiPool"](MaxRoiPoolDescriptor(pooled_shape=(1, 1)), x, rois)


def _image_model():
    """Col2Im of run-time columns, center-cropped, then MaxRoiPool: an opset-21 graph (ONNX Runtime has MaxRoiPool up to 21) whose
    middle shapes come from constant inputs."""
    nodes = [
        helper.make_node("Col2Im", ["cols", "image_shape", "block_shape"], ["image"], strides=[2, 2]),
        helper.make_node("CenterCropPad", ["image", "crop"], ["cropped"], axes=[2, 3]),
        helper.make_node("MaxRoiPool", ["cropped", "rois"], ["pooled"], pooled_shape=[2, 3]),
    ]
    inputs = [
        helper.make_tensor_value_info("cols", TensorProto.FLOAT, (1, 8, 9)),
        helper.make_tensor_value_info("rois", TensorProto.FLOAT, ("R", 5)),
    ]
    constants = [
        helper.make_tensor("image_shape", TensorProto.INT64, (2,), [6, 6]),
        helper.make_tensor("block_shape", TensorProto.INT64, (2,), [2, 2]),
        helper.make_tensor("crop", TensorProto.INT64, (2,), [5, 8]),
    ]
    outputs = [helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ("R", 2, 2, 3))]
    graph = helper.make_graph(nodes, "image_ops", inputs, outputs, constants)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


def test_image_model_runs_through_the_public_api_like_onnxruntime():
    rng = np.random.default_rng(3)
    feeds = {
        "cols": rng.uniform(0.1, 1, (1, 8, 9)).astype(np.float32),
        "rois": np.array([[0, 0, 0, 7, 4], [0, 2, 1, 5, 3], [0, 6, 4, 2, 1]], np.float32),
    }
    model = _image_model()
    (got,) = flowrt.InferenceSession(model, backends=["CpuRef"]).run(None, feeds)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (expected,) = session.run(None, feeds)
    assert got.shape == (3, 2, 2, 3)
    np.testing.assert_allclose(got, expected, rtol=1e-6)
