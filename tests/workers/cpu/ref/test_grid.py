"""CpuRef GridSample and AffineGrid against onnx's reference, their shape inference and
errors, and a spatial transformer (AffineGrid into GridSample) through the public API."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from oracle import assert_matches_reference, run_flowrt_node

import flowrt
from flowrt.engine.graph.layer_kind import get_layer_kind
from flowrt.engine.graph.layers.grid import AffineGridDescriptor, GridSampleDescriptor
from flowrt.errors import DataTypeError, ModelLoadError, ShapeError
from flowrt.frontends.onnx.descriptors import make_descriptor
from flowrt.types import DataType, TensorInfo
from flowrt.workers.cpu.ref.kernels import load_all

SEEDS = st.integers(0, 2**31 - 1)
F32, I64 = DataType.FLOAT32, DataType.INT64


@settings(max_examples=25, deadline=None)
@given(
    seed=SEEDS,
    spatial=st.sampled_from([2, 3]),
    mode=st.sampled_from(["linear", "nearest", "cubic"]),
    padding_mode=st.sampled_from(["zeros", "border", "reflection"]),
    align_corners=st.sampled_from([0, 1]),
    dtype=st.sampled_from([np.float32, np.float64]),
)
def test_grid_sample_matches_reference(seed, spatial, mode, padding_mode, align_corners, dtype):
    rng = np.random.default_rng(seed)
    # The reference divides by zero reflecting on a one-pixel axis with align_corners.
    dims = tuple(rng.integers(2, 5, spatial))
    x = rng.standard_normal((2, 2, *dims)).astype(dtype)
    out_dims = tuple(rng.integers(1, 4, spatial))
    grid = rng.uniform(-2.5, 2.5, (2, *out_dims, spatial))  # far past the edges: every padding
    grid[rng.random(grid.shape) < 0.2] = 0.5  # and exact half-pixel ties for nearest
    attributes = {"mode": mode, "padding_mode": padding_mode, "align_corners": align_corners}
    (y,) = assert_matches_reference("GridSample", [x, grid.astype(dtype)], attributes, opset=22, atol=1e-5)
    assert y.shape == (2, 2, *out_dims)


@pytest.mark.parametrize("mode, name", [("bilinear", "linear"), ("bicubic", "cubic"), (None, "linear")])
def test_grid_sample_opset_16_mode_names_mean_the_same_interpolation(mode, name):
    rng = np.random.default_rng(16)
    x, grid = rng.standard_normal((1, 3, 4, 5)).astype(np.float32), rng.uniform(-1.2, 1.2, (1, 2, 3, 2))
    attributes = {} if mode is None else {"mode": mode}
    (old,), _ = run_flowrt_node("GridSample", [x, grid.astype(np.float32)], attributes, opset=16)
    (new,) = assert_matches_reference("GridSample", [x, grid.astype(np.float32)], {"mode": name}, opset=22)
    np.testing.assert_array_equal(old, new)


def test_grid_sample_nearest_copies_integers_and_rounds_ties_to_even():
    x = np.arange(4, dtype=np.int32).reshape(1, 1, 1, 4)
    # x coordinate -0.5 denormalizes to 0.5 (tie: pixel 0), 0 to 1.5 (tie: pixel 2).
    grid = np.array([[[[-0.5, 0.0], [0.0, 0.0], [0.75, 0.0], [1.5, 0.0]]]], np.float32)
    (y,), (info,) = run_flowrt_node("GridSample", [x, grid], {"mode": "nearest"}, opset=22)
    np.testing.assert_array_equal(y, [[[[0, 2, 3, 0]]]])
    assert y.dtype == np.int32 and info.dtype is DataType.INT32


def test_grid_sample_in_float16_stays_float16():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 2, 4, 4)).astype(np.float16)
    grid = rng.uniform(-1, 1, (1, 3, 3, 2)).astype(np.float16)
    (y,) = assert_matches_reference("GridSample", [x, grid], {}, opset=22, rtol=5e-3, atol=5e-3)
    assert y.dtype == np.float16


def _infer(kind, desc, infos, consts=None):
    return get_layer_kind(kind).infer(desc, infos, consts or [None] * len(infos))


def test_grid_sample_infers_batch_channels_and_the_grids_dims():
    (out,) = _infer(
        "GridSample", GridSampleDescriptor(), [TensorInfo(("N", 3, 9, 9, 9)), TensorInfo(("N", 2, 5, 7, 3))]
    )
    assert out.shape == ("N", 3, 2, 5, 7) and out.dtype is F32


@pytest.mark.parametrize(
    "desc, infos, error, message",
    [
        (GridSampleDescriptor(), [TensorInfo((1, 1, 4, 4)), TensorInfo((1, 2, 2, 3))], ShapeError, r"grid \[N, \*output dims, 2\] of shape \(1, \?, \?, 2\) expected, got \(1, 2, 2, 3\)"),
        (GridSampleDescriptor(), [TensorInfo((2, 1, 4, 4)), TensorInfo((1, 2, 2, 2))], ShapeError, r"\(2, \?, \?, 2\) expected"),
        (GridSampleDescriptor(opset=16), [TensorInfo((1, 1, 4, 4, 4)), TensorInfo((1, 2, 2, 2, 3))], ShapeError, r"opset 16\): X 4-D \[N, C, H, W\] expected, got \(1, 1, 4, 4, 4\)"),
        (GridSampleDescriptor(), [TensorInfo((1, 1, 4, 4), DataType.INT32), TensorInfo((1, 2, 2, 2))], DataTypeError, r"\(linear\) input X expects one of float16, float32, float64, got int32"),
        (GridSampleDescriptor(), [TensorInfo((1, 1, 4, 4)), TensorInfo((1, 2, 2, 2), I64)], DataTypeError, "grid expects one of"),
    ],
)  # fmt: skip
def test_grid_sample_bad_inputs_say_what_is_wrong(desc, infos, error, message):
    with pytest.raises(error, match=message):
        _infer("GridSample", desc, infos)


@pytest.mark.parametrize(
    "attributes, opset, message",
    [
        ({"mode": "linear"}, 16, r"mode must be one of bilinear, nearest, bicubic in opset 16, got 'linear'"),
        ({"mode": "bilinear"}, 20, r"mode must be one of linear, nearest, cubic in opset 20"),
        ({"padding_mode": "wrap"}, 22, "padding_mode"),
        ({"align_corners": 2}, 22, "align_corners"),
    ],
)
def test_grid_sample_bad_attributes_fail_at_load(attributes, opset, message):
    with pytest.raises(ModelLoadError, match=message):
        make_descriptor("GridSample", attributes, opset=opset, num_outputs=1, where="node 'gs'")


def test_grid_sample_kernel_refuses_a_grid_of_another_batch():
    x, grid = np.zeros((2, 1, 3, 3), np.float32), np.zeros((1, 2, 2, 2), np.float32)
    with pytest.raises(ShapeError, match=r"grid \[N=2, \*output dims, 2\] expected for X \(2, 1, 3, 3\)"):
        load_all()["GridSample"](GridSampleDescriptor(), x, grid)


@pytest.mark.filterwarnings("ignore:divide by zero")  # the reference's, on one-pixel axes
@settings(max_examples=20, deadline=None)
@given(
    seed=SEEDS,
    dims=st.lists(st.integers(1, 5), min_size=2, max_size=3),
    align_corners=st.sampled_from([0, 1]),
)
def test_affine_grid_matches_reference(seed, dims, align_corners):
    rng = np.random.default_rng(seed)
    spatial = len(dims)
    theta = rng.standard_normal((2, spatial, spatial + 1)).astype(np.float32)
    size = np.array([2, 3, *dims], np.int64)
    (grid,) = assert_matches_reference(
        "AffineGrid", [theta, size], {"align_corners": align_corners}, opset=20
    )
    assert grid.shape == (2, *dims, spatial)


def test_affine_grid_identity_gives_pixel_centers_or_corners():
    theta = np.array([[[1, 0, 0], [0, 1, 0]]], np.float32)
    size = np.array([1, 1, 2, 4], np.int64)
    (centers,), _ = run_flowrt_node("AffineGrid", [theta, size], {"align_corners": 0}, opset=20)
    (corners,), _ = run_flowrt_node("AffineGrid", [theta, size], {"align_corners": 1}, opset=20)
    np.testing.assert_allclose(centers[0, 0, :, 0], [-0.75, -0.25, 0.25, 0.75])
    np.testing.assert_allclose(corners[0, :, 0, 1], [-1, 1])


def test_affine_grid_infers_dims_from_a_constant_size_and_rank_from_theta():
    theta, size = TensorInfo(("N", 3, 4)), TensorInfo((5,), I64)
    (known,) = _infer("AffineGrid", AffineGridDescriptor(), [theta, size], [None, np.array([2, 1, 4, 5, 6])])
    (unknown,) = _infer("AffineGrid", AffineGridDescriptor(), [theta, size])
    assert known.shape == (2, 4, 5, 6, 3) and unknown.shape == ("N", None, None, None, 3)


@pytest.mark.parametrize(
    "infos, consts, error, message",
    [
        ([TensorInfo((1, 2, 4)), TensorInfo((4,), I64)], None, ShapeError, r"theta \[N, 2, 3\] of shape \(\?, 2, 3\) expected, got \(1, 2, 4\)"),
        ([TensorInfo((1, 2, 3)), TensorInfo((5,), I64)], None, ShapeError, "size of 4 values .* expected, got 5"),
        ([TensorInfo((1, 2, 3)), TensorInfo((4,), I64)], [None, np.array([2, 1, 3, 3])], ShapeError, r"start with theta's N 1"),
        ([TensorInfo((1, 2, 3)), TensorInfo((4,), DataType.INT32)], None, DataTypeError, "size of type int64 expected, got int32"),
    ],
)  # fmt: skip
def test_affine_grid_bad_inputs_say_what_is_wrong(infos, consts, error, message):
    with pytest.raises(error, match=message):
        _infer("AffineGrid", AffineGridDescriptor(), infos, consts)


def _spatial_transformer():
    """theta -> AffineGrid -> GridSample over an image: an opset-20 graph."""
    nodes = [
        helper.make_node("AffineGrid", ["theta", "size"], ["grid"], align_corners=0),
        helper.make_node("GridSample", ["image", "grid"], ["warped"], mode="cubic", padding_mode="border"),
    ]
    inputs = [
        helper.make_tensor_value_info("image", TensorProto.FLOAT, (2, 3, 6, 7)),
        helper.make_tensor_value_info("theta", TensorProto.FLOAT, (2, 2, 3)),
    ]
    outputs = [helper.make_tensor_value_info("warped", TensorProto.FLOAT, (2, 3, 5, 4))]
    size = helper.make_tensor("size", TensorProto.INT64, (4,), [2, 3, 5, 4])
    graph = helper.make_graph(nodes, "stn", inputs, outputs, [size])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 10
    return model


def test_spatial_transformer_runs_through_the_public_api_like_onnx_reference():
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(11)
    feeds = {
        "image": rng.standard_normal((2, 3, 6, 7)).astype(np.float32),
        "theta": (np.eye(2, 3) + rng.normal(0, 0.3, (2, 2, 3))).astype(np.float32),
    }
    model = _spatial_transformer()
    (got,) = flowrt.InferenceSession(model, backends=["CpuRef"]).run(None, feeds)
    (expected,) = ReferenceEvaluator(model).run(None, feeds)
    assert got.shape == (2, 3, 5, 4)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
