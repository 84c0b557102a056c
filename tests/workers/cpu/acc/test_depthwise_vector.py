"""Depthwise convs of small planes by explicit vectors (``conv/depthwise_taps.py``): against
CpuRef at both strides and kernel sizes, the taps' places in the scratch checked cell by
cell, the rule, and a model through the public API."""

import attrs
import numpy as np
import pytest
import trio
from kernelcases import conv_case
from onnx import TensorProto, helper, numpy_helper

import flowrt
from flowrt.registry import FusedActivation
from flowrt.workers.cpu.acc.conv.depthwise_taps import DepthwiseVector, tap_places
from flowrt.workers.cpu.acc.conv.geometry import ConvGeometry
from flowrt.workers.cpu.acc.conv.tuning import DEPTHWISE_VECTOR_MAX, ConvTuning
from flowrt.workers.cpu.acc.tile_ir import AVAILABLE as TILES_AVAILABLE
from flowrt.workers.cpu.acc.tile_ir import LANES

pytestmark = pytest.mark.skipif(not TILES_AVAILABLE, reason="the explicit vectors run where the tiles do")

ACTS = [None, FusedActivation("Relu"), FusedActivation("Clip", -1.0, 2.0), FusedActivation("HardSwish")]


def _finite_close(got, expected):
    finite = np.isfinite(expected)
    np.testing.assert_array_equal(np.isfinite(got), finite)
    np.testing.assert_allclose(got[finite], expected[finite], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("activation", ACTS, ids=lambda a: a.kind if a else "none")
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("k", [3, 5])
@pytest.mark.parametrize("spatial", [(1, 1), (2, 5), (5, 2), (7, 7), (9, 14), (14, 13), (LANES + 1, 3)])
def test_small_depthwise_planes_run_a_vector_of_outputs_at_a_time(spatial, k, stride, activation, workers):
    """Two images, a channel multiplier of 2; huge values on the first and last two columns,
    which a tap that wrapped into the row above or below would carry into an output."""
    rng = np.random.default_rng(21)
    x = rng.standard_normal((2, 3, *spatial), dtype=np.float32)
    x[:, :, :, :2] = x[:, :, :, -2:] = 1e30
    w = rng.standard_normal((6, 1, k, k), dtype=np.float32)
    b = rng.standard_normal(6, dtype=np.float32)
    kernel, got, expected = conv_case(
        x, w, b, workers=workers, activation=activation, group=3, strides=(stride, stride), pads=(k // 2,) * 4
    )
    assert kernel.plan(x.shape, w.shape).name == "depthwise_vector"
    _finite_close(got, expected)


@pytest.mark.parametrize("stride", [1, 2])
def test_a_tap_off_the_plane_never_reaches_an_output(stride):
    """+inf at the end of one row and the start of another: a column sum that wrapped around
    is selected away, not multiplied by zero (which would make the outputs NaN)."""
    x = np.ones((1, 2, 6, 8), np.float32)
    x[0, 0, 2, -1] = np.inf
    x[0, 1, 3, 0] = np.inf
    w = np.ones((2, 1, 3, 3), np.float32)
    kernel, got, expected = conv_case(x, w, None, group=2, strides=(stride, stride), pads=(1, 1, 1, 1))
    assert kernel.plan(x.shape, w.shape).name == "depthwise_vector"
    np.testing.assert_array_equal(np.isinf(got), np.isinf(expected))
    _finite_close(got, expected)


@pytest.mark.parametrize("size, stride", [(3, 1), (5, 1), (3, 2), (5, 2)])
def test_each_tap_is_read_from_its_cell_of_the_phase_planes(size, stride):
    """For every output (r, c) and tap (i, j): the plane, row and column :func:`tap_places`
    give hold input cell (stride * r + i - pad, stride * c + j - pad), phase plane 2a + b
    holding input (2R + a, 2C + b) at (R, C)."""
    pad = size // 2
    for plane, row, column, tap in tap_places(size, stride):
        i, j = divmod(tap, size)
        a, b = divmod(plane, stride)
        for r in range(4):
            for c in range(4):
                # the cell the plane holds at (r + row, c + column), in input coordinates
                assert (stride * (r + row) + a, stride * (c + column) + b) == (
                    stride * r + i - pad,
                    stride * c + j - pad,
                )
    assert sorted(tap for *_, tap in tap_places(size, stride)) == list(range(size * size))


def _geometry(x_shape, w_shape, **attrs_):
    return ConvGeometry.of(flowrt.descriptors.Conv(**attrs_), x_shape, w_shape, 2)


def test_the_vectors_take_small_planes_of_same_pads_only():
    tuning = ConvTuning()
    side = int(DEPTHWISE_VECTOR_MAX**0.5)  # 14: the largest square output plane taken
    takes = [
        ((1, 8, side, side), (8, 1, 3, 3), dict(group=8, pads=(1, 1, 1, 1))),
        ((1, 8, 2 * side, 2 * side), (8, 1, 5, 5), dict(group=8, strides=(2, 2), pads=(2, 2, 2, 2))),
    ]
    declines = [
        ((1, 8, side + 1, side), (8, 1, 3, 3), dict(group=8, pads=(1, 1, 1, 1))),  # too many pixels
        ((1, 8, 9, 9), (8, 1, 3, 3), dict(group=8, pads=(0, 0, 1, 1))),  # asymmetric pads
        ((1, 8, 9, 9), (8, 1, 3, 3), dict(group=8, dilations=(2, 2), pads=(2, 2, 2, 2))),
        ((1, 8, 9, 9), (8, 1, 3, 3), dict(group=8, strides=(3, 3), pads=(1, 1, 1, 1))),
        ((1, 8, 9, 9), (8, 1, 7, 7), dict(group=8, pads=(3, 3, 3, 3))),
        ((1, 8, 9, 9), (8, 2, 3, 3), dict(group=4, pads=(1, 1, 1, 1))),  # grouped, not depthwise
    ]
    for x_shape, w_shape, attrs_ in takes:
        geometry = _geometry(x_shape, w_shape, **attrs_)
        assert DepthwiseVector.applies(geometry, tuning)
        assert not DepthwiseVector.applies(geometry, attrs.evolve(tuning, depthwise_vector_max=0))
    for x_shape, w_shape, attrs_ in declines:
        assert not DepthwiseVector.applies(_geometry(x_shape, w_shape, **attrs_), tuning)


def _mobile_block(path):
    """Depthwise 3x3 stride 2 + Clip(0, 6), then depthwise 5x5 + Relu, on 2x8x13x13."""
    rng = np.random.default_rng(5)
    inits = [
        numpy_helper.from_array(rng.standard_normal((8, 1, 3, 3)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b1"),
        numpy_helper.from_array(rng.standard_normal((8, 1, 5, 5)).astype(np.float32), "w2"),
        numpy_helper.from_array(np.array(0.0, np.float32), "lo"),
        numpy_helper.from_array(np.array(6.0, np.float32), "hi"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], group=8, strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Clip", ["c1", "lo", "hi"], ["a1"]),
        helper.make_node("Conv", ["a1", "w2"], ["c2"], group=8, pads=[2, 2, 2, 2]),
        helper.make_node("Relu", ["c2"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mobile_block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, 13, 13])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8, 7, 7])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path.write_bytes(model.SerializeToString())
    return path


def test_a_mobile_block_through_the_public_api_matches_cpuref(tmp_path):
    path = _mobile_block(tmp_path / "block.onnx")
    x = np.random.default_rng(6).standard_normal((2, 8, 13, 13)).astype(np.float32)

    async def run(backends):
        async with flowrt.Runtime() as rt:
            model = await rt.load(flowrt.optimize(flowrt.onnx.load(str(path)), backends=backends))
            return (await model.run({"x": x}))["y"]

    got = trio.run(run, ["CpuAcc"])
    expected = trio.run(run, ["CpuRef"])
    assert got.shape == (2, 8, 7, 7) and (got >= 0).all()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
