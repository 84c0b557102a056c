"""CpuRef NonMaxSuppression and RoiAlign against onnx's reference (and onnxruntime where the
reference falls short), their shape inference and errors, and both through the public API."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from oracle import assert_matches_reference, run_flowrt_node

import flowrt
from flowrt.engine.graph.layer_kind import get_layer_kind
from flowrt.engine.graph.layers.detection import NonMaxSuppressionDescriptor, RoiAlignDescriptor
from flowrt.errors import DataTypeError, ModelLoadError, ShapeError
from flowrt.frontends.onnx.descriptors import make_descriptor
from flowrt.types import DataType, TensorInfo
from flowrt.workers.cpu.ref.kernels import load_all

SEEDS = st.integers(0, 2**31 - 1)
F32, I64 = DataType.FLOAT32, DataType.INT64


def _model(op_type, inputs, attributes, opset, out_type):
    """One node of ``op_type`` whose inputs are the graph inputs (None: left out)."""
    names = [f"x{i}" if x is not None else "" for i, x in enumerate(inputs)]
    node = helper.make_node(op_type, names, ["y"], **attributes)
    graph_inputs = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)
        for n, x in zip(names, inputs)
        if x is not None
    ]
    out = helper.make_tensor_value_info("y", out_type, None)
    model = helper.make_model(
        helper.make_graph([node], "g", graph_inputs, [out]), opset_imports=[helper.make_opsetid("", opset)]
    )
    model.ir_version = 10
    return model, {n: x for n, x in zip(names, inputs) if x is not None}


def _onnxruntime(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _boxes(rng, batches, count, center):
    """Boxes on a coarse grid, so that identical boxes, shared edges and ties are common."""
    if center:
        centers = rng.integers(0, 8, (batches, count, 2)) / 2
        sizes = rng.integers(0, 6, (batches, count, 2)) / 2
        return np.concatenate([centers, sizes], axis=-1).astype(np.float32)
    return (rng.integers(0, 8, (batches, count, 4)) / 2).astype(np.float32)


@settings(max_examples=25, deadline=None)
@given(
    seed=SEEDS,
    batches=st.integers(1, 2),
    classes=st.integers(1, 3),
    count=st.integers(1, 9),
    center=st.sampled_from([0, 1]),
    max_boxes=st.integers(0, 6),  # the reference fails on negative counts
    iou=st.sampled_from([0.0, 0.2, 0.5, 1 / 3, 0.7, 1.0]),
    score_threshold=st.sampled_from([None, 0.0, 0.3, 0.5]),
)
def test_non_max_suppression_matches_reference(
    seed, batches, classes, count, center, max_boxes, iou, score_threshold
):
    rng = np.random.default_rng(seed)
    boxes = _boxes(rng, batches, count, center)
    scores = (rng.integers(0, 5, (batches, classes, count)) / 4).astype(np.float32)  # many ties
    inputs = [boxes, scores, np.array([max_boxes], np.int64), np.array([iou], np.float32)]
    if score_threshold is not None:
        inputs.append(np.array([score_threshold], np.float32))
    (selected,) = assert_matches_reference(
        "NonMaxSuppression", inputs, {"center_point_box": center}, opset=11
    )
    assert selected.dtype == np.int64 and selected.shape[1] == 3


@pytest.mark.parametrize("given_inputs", [2, 3, 4])
def test_non_max_suppression_absent_inputs_take_the_spec_defaults_like_onnxruntime(given_inputs):
    rng = np.random.default_rng(given_inputs)
    full = [
        _boxes(rng, 2, 7, 0),
        rng.random((2, 3, 7), dtype=np.float32),
        np.array([4], np.int64),
        np.array([0.4], np.float32),
    ]
    inputs = full[:given_inputs]
    (expected,) = _onnxruntime(*_model("NonMaxSuppression", inputs, {}, 11, TensorProto.INT64))
    (got,), _ = run_flowrt_node("NonMaxSuppression", inputs, opset=11)
    np.testing.assert_array_equal(got, expected)
    assert got.shape == (0, 3) if given_inputs == 2 else len(got) > 0  # max boxes default: 0


def test_non_max_suppression_keeps_boxes_of_equal_score_lowest_index_first():
    boxes = np.array([[[0, 0, 1, 1], [5, 5, 6, 6], [0, 0, 1, 1], [9, 9, 10, 10]]], np.float32)
    scores = np.full((1, 1, 4), 0.5, np.float32)
    inputs = [boxes, scores, np.array([10]), np.array([0.5], np.float32)]
    (got,), _ = run_flowrt_node("NonMaxSuppression", inputs, opset=11)
    np.testing.assert_array_equal(got, [[0, 0, 0], [0, 0, 1], [0, 0, 3]])
    inputs[2] = np.array([-1])  # a negative count keeps nothing, as in ONNX Runtime
    (got,), _ = run_flowrt_node("NonMaxSuppression", inputs, opset=11)
    assert got.shape == (0, 3)


def _infer(kind, desc, infos, consts=None):
    return get_layer_kind(kind).infer(desc, infos, consts or [None] * len(infos))


def test_non_max_suppression_infers_rows_known_only_when_run():
    infos = [TensorInfo(("N", 100, 4)), TensorInfo(("N", 80, 100)), TensorInfo((1,), I64)]
    (out,) = _infer("NonMaxSuppression", NonMaxSuppressionDescriptor(), infos)
    assert out.shape == (None, 3) and out.dtype is I64


@pytest.mark.parametrize(
    "infos, consts, error, message",
    [
        ([TensorInfo((1, 6, 3)), TensorInfo((1, 1, 6))], None, ShapeError, r"boxes \[num_batches.*\(\?, \?, 4\) expected, got \(1, 6, 3\)"),
        ([TensorInfo((1, 6, 4)), TensorInfo((1, 1, 5))], None, ShapeError, r"scores .* \(1, \?, 6\) expected, got \(1, 1, 5\)"),
        ([TensorInfo((2, 6, 4)), TensorInfo((1, 1, 6))], None, ShapeError, r"\(2, \?, 6\) expected"),
        ([TensorInfo((1, 6, 4), I64), TensorInfo((1, 1, 6))], None, DataTypeError, "boxes expects one of float32, got int64"),
        ([TensorInfo((1, 6, 4)), TensorInfo((1, 1, 6)), TensorInfo((1,), DataType.INT32)], None, DataTypeError, "max_output_boxes_per_class expects"),
        ([TensorInfo((1, 6, 4)), TensorInfo((1, 1, 6)), TensorInfo((2,), I64)], None, ShapeError, "must be a scalar or hold one value, got shape \\(2,\\)"),
        ([TensorInfo((1, 6, 4)), TensorInfo((1, 1, 6)), None, TensorInfo((1,))], [None, None, None, np.array([1.5], np.float32)], ShapeError, r"iou_threshold must be in \[0, 1\], got 1.5"),
    ],
)  # fmt: skip
def test_non_max_suppression_bad_inputs_say_what_is_wrong(infos, consts, error, message):
    with pytest.raises(error, match=message):
        _infer("NonMaxSuppression", NonMaxSuppressionDescriptor(), infos, consts)


def test_non_max_suppression_refuses_a_run_time_iou_threshold_outside_zero_to_one():
    boxes, scores = np.zeros((1, 2, 4), np.float32), np.zeros((1, 1, 2), np.float32)
    with pytest.raises(ShapeError, match=r"iou_threshold must be in \[0, 1\], got -0.5"):
        load_all()["NonMaxSuppression"](
            NonMaxSuppressionDescriptor(), boxes, scores, np.array([3]), np.array([-0.5], np.float32)
        )


def _rois(rng, count, height, width):
    """Regions mostly on the map, some past its edges, some inverted (x2 < x1)."""
    extent = np.array([width, height])
    corners = rng.uniform(-2, 1, (count, 2)) * extent / 2 + extent / 4
    sizes = rng.uniform(-1.5, 4, (count, 2)) * extent / 3
    return np.concatenate([corners, corners + sizes], axis=1)


@settings(max_examples=25, deadline=None)
@given(
    seed=SEEDS,
    dims=st.tuples(st.integers(1, 2), st.integers(1, 3), st.integers(1, 7), st.integers(1, 7)),
    count=st.integers(1, 4),
    output=st.tuples(st.integers(1, 4), st.integers(1, 4)),
    sampling_ratio=st.integers(0, 3),
    spatial_scale=st.sampled_from([1.0, 0.5, 0.25, 2.0]),
    mode=st.sampled_from(["avg", "max"]),
    transform=st.sampled_from(["half_pixel", "output_half_pixel", None]),
    dtype=st.sampled_from([np.float32, np.float64]),
)
def test_roi_align_matches_reference(
    seed, dims, count, output, sampling_ratio, spatial_scale, mode, transform, dtype
):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(dims).astype(dtype)
    rois = (_rois(rng, count, dims[2], dims[3]) / spatial_scale).astype(dtype)
    batch_indices = rng.integers(0, dims[0], count).astype(np.int64)
    attributes = {"output_height": output[0], "output_width": output[1], "sampling_ratio": sampling_ratio}
    attributes |= {"spatial_scale": spatial_scale, "mode": mode}
    if transform is not None:
        attributes["coordinate_transformation_mode"] = transform
    (y,) = assert_matches_reference("RoiAlign", [x, rois, batch_indices], attributes, opset=16, atol=1e-5)
    assert y.dtype == dtype and y.shape == (count, dims[1], *output)


def test_roi_align_in_float16_stays_float16():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 2, 6, 6)).astype(np.float16)
    rois = np.array([[0.5, 1, 4, 5], [1, 0, 5.5, 3]], np.float16)
    attributes = {"output_height": 3, "output_width": 2, "sampling_ratio": 2}
    (y,) = assert_matches_reference(
        "RoiAlign", [x, rois, np.zeros(2, np.int64)], attributes, opset=22, rtol=2e-3, atol=2e-3
    )
    assert y.dtype == np.float16


def test_roi_align_of_opset_10_samples_without_the_half_pixel_shift_like_onnxruntime():
    # onnx's reference ignores the opset here; the opset 10 spec (and ONNX Runtime) do not.
    rng = np.random.default_rng(10)
    inputs = [
        rng.random((2, 3, 6, 7), dtype=np.float32),
        np.array([[0, 0, 3, 4], [1, 1.5, 5, 6]], np.float32),
        np.array([0, 1]),
    ]
    attributes = {"output_height": 2, "output_width": 3, "sampling_ratio": 0}
    (expected,) = _onnxruntime(*_model("RoiAlign", inputs, attributes, 10, TensorProto.FLOAT))
    (got,), _ = run_flowrt_node("RoiAlign", inputs, attributes, opset=10)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert not make_descriptor("RoiAlign", {}, opset=10, num_outputs=1).half_pixel
    assert make_descriptor("RoiAlign", {}, opset=16, num_outputs=1).half_pixel


def test_roi_align_infers_rois_channels_and_output_size():
    infos = [TensorInfo(("N", 256, 14, 14)), TensorInfo((None, 4)), TensorInfo(("R",), I64)]
    (out,) = _infer("RoiAlign", RoiAlignDescriptor(output_height=7, output_width=5), infos)
    assert out.shape == ("R", 256, 7, 5) and out.dtype is F32


@pytest.mark.parametrize(
    "infos, error, message",
    [
        ([TensorInfo((1, 10, 10)), TensorInfo((3, 4)), TensorInfo((3,), I64)], ShapeError, r"X \[N, C, H, W\] of shape \(\?, \?, \?, \?\) expected, got \(1, 10, 10\)"),
        ([TensorInfo((1, 1, 10, 10)), TensorInfo((3, 5)), TensorInfo((3,), I64)], ShapeError, r"rois \[num_rois, 4\] of shape \(\?, 4\) expected, got \(3, 5\)"),
        ([TensorInfo((1, 1, 10, 10)), TensorInfo((3, 4)), TensorInfo((2,), I64)], ShapeError, r"batch_indices \[num_rois\] of shape \(3,\) expected, got \(2,\)"),
        ([TensorInfo((1, 1, 10, 10)), TensorInfo((3, 4)), TensorInfo((3,), DataType.INT32)], DataTypeError, "batch_indices expects one of int64, got int32"),
        ([TensorInfo((1, 1, 10, 10)), TensorInfo((3, 4), DataType.FLOAT64), TensorInfo((3,), I64)], DataTypeError, "rois of X's type float32 expected, got float64"),
        ([TensorInfo((1, 1, 10, 10), I64), TensorInfo((3, 4), I64), TensorInfo((3,), I64)], DataTypeError, "X expects one of"),
    ],
)  # fmt: skip
def test_roi_align_bad_inputs_say_what_is_wrong(infos, error, message):
    with pytest.raises(error, match=message):
        _infer("RoiAlign", RoiAlignDescriptor(), infos)


@pytest.mark.parametrize(
    "attributes, opset, message",
    [
        ({"mode": "sum"}, 16, "mode"),
        ({"output_height": 0}, 16, "output_height"),
        ({"sampling_ratio": -1}, 16, "sampling_ratio"),
        ({"coordinate_transformation_mode": "align_corners"}, 16, "coordinate_transformation_mode"),
        (
            {"coordinate_transformation_mode": "half_pixel"},
            10,
            "exists from opset 16, this model is opset 10",
        ),
    ],
)
def test_roi_align_bad_attributes_fail_at_load(attributes, opset, message):
    with pytest.raises(ModelLoadError, match=message):
        make_descriptor("RoiAlign", attributes, opset=opset, num_outputs=1, where="node 'roi'")


def test_roi_align_refuses_batch_indices_outside_the_batch():
    x, rois = np.zeros((2, 1, 4, 4), np.float32), np.zeros((2, 4), np.float32)
    with pytest.raises(
        ShapeError, match=r"batch_indices must be in \[0, 2\) \(X's batch size\), got \[0, 2\]"
    ):
        load_all()["RoiAlign"](RoiAlignDescriptor(), x, rois, np.array([0, 2]))


def test_roi_align_refuses_regions_of_infinite_or_nan_coordinates():
    x, rois = np.zeros((1, 1, 4, 4), np.float32), np.array([[0, 0, np.nan, 2]], np.float32)
    with pytest.raises(ShapeError, match="regions of finite coordinates expected"):
        load_all()["RoiAlign"](RoiAlignDescriptor(), x, rois, np.array([0]))


def _detector_model():
    """RoiAlign over a feature map, and NonMaxSuppression over the same regions' scores: an
    opset-16 graph with one output of data-dependent length."""
    roi_align = helper.make_node(
        "RoiAlign",
        ["features", "rois", "batch_indices"],
        ["pooled"],
        output_height=3,
        output_width=2,
        sampling_ratio=2,
        spatial_scale=0.5,
    )
    nms = helper.make_node(
        "NonMaxSuppression", ["boxes", "scores", "max_boxes", "iou"], ["selected"], center_point_box=0
    )
    inputs = [
        helper.make_tensor_value_info("features", TensorProto.FLOAT, (2, 3, 8, 8)),
        helper.make_tensor_value_info("rois", TensorProto.FLOAT, ("R", 4)),
        helper.make_tensor_value_info("batch_indices", TensorProto.INT64, ("R",)),
        helper.make_tensor_value_info("boxes", TensorProto.FLOAT, (1, "B", 4)),
        helper.make_tensor_value_info("scores", TensorProto.FLOAT, (1, 2, "B")),
    ]
    outputs = [
        helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ("R", 3, 3, 2)),
        helper.make_tensor_value_info("selected", TensorProto.INT64, (None, 3)),
    ]
    constants = [
        onnx.numpy_helper.from_array(np.array([3], np.int64), "max_boxes"),
        onnx.numpy_helper.from_array(np.array([0.3], np.float32), "iou"),
    ]
    graph = helper.make_graph([roi_align, nms], "detector", inputs, outputs, constants)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)])
    model.ir_version = 10
    return model


def test_detector_model_runs_through_the_public_api_like_onnxruntime():
    rng = np.random.default_rng(7)
    boxes = _boxes(rng, 1, 12, 0)
    feeds = {
        "features": rng.standard_normal((2, 3, 8, 8)).astype(np.float32),
        "rois": _rois(rng, 5, 16, 16).astype(np.float32),
        "batch_indices": np.array([0, 1, 1, 0, 1]),
        "boxes": boxes,
        "scores": rng.random((1, 2, 12), dtype=np.float32),
    }
    model = _detector_model()
    session = flowrt.InferenceSession(model, backends=["CpuRef"])
    pooled, selected = session.run(None, feeds)
    expected_pooled, expected_selected = _onnxruntime(model, feeds)
    np.testing.assert_allclose(pooled, expected_pooled, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(selected, expected_selected)
    assert 0 < len(selected) <= 6
    # A second run with fewer boxes gives fewer rows: the shape is decided per run.
    feeds |= {"boxes": boxes[:, :1], "scores": feeds["scores"][:, :, :1]}
    (_, selected), (_, expected_selected) = session.run(None, feeds), _onnxruntime(model, feeds)
    np.testing.assert_array_equal(selected, expected_selected)
    assert selected.shape == (2, 3)
