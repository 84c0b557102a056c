"""CpuAcc depthwise Conv (one input channel per group) against CpuRef: strides, channel
multipliers, the 3x3 and 5x5 same paths on bordered planes, and stride 2 on phase planes.
Small planes go to the explicit vectors (``test_depthwise_vector.py``): the loops' tests here
run with those off (``LOOPS``)."""

import numpy as np
import pytest
from attrs import evolve
from kernelcases import close, conv_case

from flowrt.registry import FusedActivation
from flowrt.workers.cpu.acc.conv.tuning import ConvTuning

LOOPS = evolve(ConvTuning(), depthwise_vector_max=0)


def test_depthwise_with_channel_multiplier_and_stride():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 6, 17, 15), dtype=np.float32)
    w = rng.standard_normal((12, 1, 3, 3), dtype=np.float32)
    _, got, expected = conv_case(x, w, None, group=6, strides=(2, 2), auto_pad="SAME_UPPER")
    close(got, expected)


@pytest.mark.parametrize("spatial", [(2, 2), (2, 5), (5, 2), (7, 7), (14, 9), (28, 28)])
@pytest.mark.parametrize(
    "activation",
    [None, FusedActivation("Relu"), FusedActivation("Clip", -1.0, 2.0), FusedActivation("HardSwish")],
)
def test_depthwise_3x3_same_runs_on_bordered_copies_of_the_planes(spatial, activation):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 5, *spatial), dtype=np.float32)
    # a huge value on the last column: a tap that wrapped into the next row would show it
    x[:, :, :, -1] = 1e30
    w = rng.standard_normal((10, 1, 3, 3), dtype=np.float32)
    b = rng.standard_normal(10, dtype=np.float32)
    kernel, got, expected = conv_case(
        x, w, b, activation=activation, group=5, pads=(1, 1, 1, 1), tuning=LOOPS
    )
    assert kernel.plan(x.shape, w.shape).name == "depthwise_same3"
    close(got, expected)


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("kernel_shape", [(3, 3), (5, 5)])
def test_a_curve_over_many_small_planes_is_applied_to_every_plane_once(workers, kernel_shape):
    # 7x7 planes, 96 of them: a curve other than Relu is applied once a slice's planes hold
    # enough values (ACTIVATE_BLOCK), several times in a slice, and after its last plane
    rng = np.random.default_rng(12)
    x = rng.standard_normal((1, 96, 7, 7), dtype=np.float32)
    w = rng.standard_normal((96, 1, *kernel_shape), dtype=np.float32)
    b = rng.standard_normal(96, dtype=np.float32)
    pad = kernel_shape[0] // 2
    for strides in ((1, 1), (2, 2)):
        kernel, got, expected = conv_case(
            x, w, b, workers=workers, activation=FusedActivation("HardSwish"), group=96, strides=strides,
            pads=(pad,) * 4, tuning=LOOPS,
        )  # fmt: skip
        same = "depthwise_same3" if pad == 1 else "depthwise_same5"
        assert kernel.plan(x.shape, w.shape).name == (same if strides == (1, 1) else "depthwise_strided2")
        close(got, expected)


def test_depthwise_3x3_same_never_reads_across_a_row_end():
    # +inf at the end of one row and the start of another: the outputs it does not reach
    # (the next row's first column, the row above's last) stay finite, where a tap that
    # wrapped around and was multiplied by zero would make them NaN.
    x = np.ones((1, 2, 5, 6), np.float32)
    x[0, 0, 2, -1] = np.inf
    x[0, 1, 3, 0] = np.inf
    w = np.ones((2, 1, 3, 3), np.float32)
    _, got, expected = conv_case(x, w, None, group=2, pads=(1, 1, 1, 1), tuning=LOOPS)
    np.testing.assert_array_equal(np.isinf(got), np.isinf(expected))
    assert np.isfinite(got[0, 0, 1:4, 0]).all() and np.isfinite(got[0, 1, 2:5, -1]).all()
    close(got[np.isfinite(expected)], expected[np.isfinite(expected)])


def test_depthwise_3x3_same_falls_back_on_single_rows_and_other_pads():
    rng = np.random.default_rng(4)
    for shape, attrs in [((1, 4, 1, 6), dict(pads=(1, 1, 1, 1))), ((1, 4, 6, 6), dict(pads=(1, 1, 0, 2)))]:
        x = rng.standard_normal(shape, dtype=np.float32)
        w = rng.standard_normal((4, 1, 3, 3), dtype=np.float32)
        kernel, got, expected = conv_case(x, w, None, group=4, tuning=LOOPS, **attrs)
        assert kernel.plan(x.shape, w.shape).name == "depthwise"
        close(got, expected)


@pytest.mark.parametrize("spatial", [(3, 3), (3, 8), (8, 3), (7, 7), (14, 9)])
@pytest.mark.parametrize(
    "activation",
    [None, FusedActivation("Relu"), FusedActivation("Clip", -1.0, 2.0), FusedActivation("Swish", 0.5)],
)
def test_depthwise_5x5_same_takes_all_taps_from_bordered_planes(spatial, activation):
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 5, *spatial), dtype=np.float32)
    # huge values on the first two and last two columns: a tap that wrapped into the next or
    # the last row would show them
    x[:, :, :, :2] = x[:, :, :, -2:] = 1e30
    w = rng.standard_normal((10, 1, 5, 5), dtype=np.float32)
    b = rng.standard_normal(10, dtype=np.float32)
    kernel, got, expected = conv_case(
        x, w, b, activation=activation, group=5, pads=(2, 2, 2, 2), tuning=LOOPS
    )
    assert kernel.plan(x.shape, w.shape).name == "depthwise_same5"
    finite = np.isfinite(expected)
    np.testing.assert_array_equal(np.isfinite(got), finite)
    np.testing.assert_allclose(got[finite], expected[finite], rtol=1e-4, atol=1e-5)


def test_depthwise_5x5_same_falls_back_on_small_planes_and_other_pads():
    rng = np.random.default_rng(7)
    for shape, attrs in [((1, 4, 2, 6), dict(pads=(2, 2, 2, 2))), ((1, 4, 6, 6), dict(pads=(2, 2, 1, 3)))]:
        x = rng.standard_normal(shape, dtype=np.float32)
        w = rng.standard_normal((4, 1, 5, 5), dtype=np.float32)
        kernel, got, expected = conv_case(x, w, None, group=4, tuning=LOOPS, **attrs)
        assert kernel.plan(x.shape, w.shape).name == "depthwise"
        close(got, expected)


@pytest.mark.parametrize("k", [3, 5])
@pytest.mark.parametrize("spatial", [(2, 2), (3, 8), (8, 3), (14, 14), (15, 13)])
@pytest.mark.parametrize("activation", [None, FusedActivation("Relu"), FusedActivation("HardSwish")])
def test_depthwise_with_stride_2_takes_all_taps_from_phase_planes(k, spatial, activation):
    """3x3 and 5x5 at stride 2 with k // 2 pad cells: the input's four phase planes on the
    output's pitch, odd and even sizes, a channel multiplier of 2."""
    rng = np.random.default_rng(8)
    x = rng.standard_normal((2, 3, *spatial), dtype=np.float32)
    x[:, :, :, :2] = x[:, :, :, -2:] = 1e30  # a tap that wrapped into another row would show them
    w = rng.standard_normal((6, 1, k, k), dtype=np.float32)
    b = rng.standard_normal(6, dtype=np.float32)
    pad = k // 2
    kernel, got, expected = conv_case(
        x, w, b, activation=activation, group=3, strides=(2, 2), pads=(pad,) * 4, tuning=LOOPS
    )
    assert kernel.plan(x.shape, w.shape).name == "depthwise_strided2"
    finite = np.isfinite(expected)
    np.testing.assert_array_equal(np.isfinite(got), finite)
    np.testing.assert_allclose(got[finite], expected[finite], rtol=1e-4, atol=1e-5)


def test_depthwise_with_stride_2_and_other_pads_takes_the_general_path():
    rng = np.random.default_rng(9)
    x = rng.standard_normal((1, 4, 9, 9), dtype=np.float32)
    w = rng.standard_normal((4, 1, 3, 3), dtype=np.float32)
    kernel, got, expected = conv_case(x, w, None, group=4, strides=(2, 2), pads=(0, 0, 1, 1), tuning=LOOPS)
    assert kernel.plan(x.shape, w.shape).name == "depthwise"
    close(got, expected)


@pytest.mark.parametrize("kernel_shape", [(1, 3), (3, 3), (5, 3), (3, 5), (2, 2)])
@pytest.mark.parametrize("strides, dilations", [((2, 2), (1, 1)), ((1, 2), (2, 1)), ((1, 1), (2, 2))])
@pytest.mark.parametrize("activation", [None, FusedActivation("Relu"), FusedActivation("Clip", -1.0, 2.0)])
def test_depthwise_on_phase_planes_with_each_activation(kernel_shape, strides, dilations, activation):
    """The general path: a 3-wide kernel row's taps in one loop, Relu applied with the last
    row's, other activations after; other widths tap by tap."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 3, 13, 12), dtype=np.float32)
    w = rng.standard_normal((6, 1, *kernel_shape), dtype=np.float32)
    b = rng.standard_normal(6, dtype=np.float32)
    kernel, got, expected = conv_case(
        x,
        w,
        b,
        activation=activation,
        group=3,
        strides=strides,
        dilations=dilations,
        pads=(1, 2, 2, 1),
        tuning=LOOPS,
    )
    assert kernel.plan(x.shape, w.shape).name == "depthwise"
    close(got, expected)
