"""CpuAcc's convs of few output pixels (``conv/few_pixels.py``) against CpuRef: tiles of
pixels by output channels."""

import attrs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kernelcases import ACTIVATIONS, close, conv_case

from flowrt.registry import FusedActivation
from flowrt.workers.cpu.acc.conv.tuning import ConvTuning
from flowrt.workers.cpu.acc.tile_ir import AVAILABLE as TILES_AVAILABLE
from flowrt.workers.cpu.acc.tile_ir import TILE_COLUMNS, TILE_ROWS


@pytest.mark.skipif(not TILES_AVAILABLE, reason="no register tiles on this CPU")
@settings(max_examples=25, deadline=None)
@given(
    m=st.integers(1, 300),
    c=st.sampled_from([1, 7, 64, 255, 256, 257, 600]),
    hw=st.sampled_from([(1, 6), (2, 5), (3, 4), (7, 7), (8, 8), (4, 13)]),
    strides=st.sampled_from([(1, 1), (1, 1), (2, 2), (2, 1), (3, 2)]),
    batch=st.integers(1, 2),
    workers=st.integers(1, 3),
    activation=st.sampled_from(list(ACTIVATIONS)),
    constant=st.booleans(),
    bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_1x1_convs_of_few_pixels_tile_across_output_channels(
    m, c, hw, strides, batch, workers, activation, constant, bias, seed
):
    """From a tile's rows (6 with AVX2, 8 with AVX-512) up to 64 output pixels an image: tiles
    of pixels by output channels, the pixels packed by tiles (picked out of the input at a
    stride) or read in place (few panels per task), the last tile short, any depth (summed in
    blocks), the last panel of output channels partial."""
    rng = np.random.default_rng(seed)
    shape = tuple((d - 1) * s + 1 + rng.integers(0, s) for d, s in zip(hw, strides))  # hw out
    x = rng.standard_normal((batch, c, *shape), dtype=np.float32)
    w = rng.standard_normal((m, c, 1, 1), dtype=np.float32)
    b = rng.standard_normal(m, dtype=np.float32) if bias else None
    kernel, got, expected = conv_case(
        x,
        w,
        b,
        workers=workers,
        activation=activation,
        constant=constant,
        tuning=ConvTuning(),
        strides=strides,
    )
    close(got, expected)
    assert got.shape[2:] == hw
    few = kernel.plan(x.shape, w.shape).name == "few_pixels"
    assert few == (hw[0] * hw[1] >= TILE_ROWS)


@pytest.mark.skipif(not TILES_AVAILABLE, reason="no register tiles on this CPU")
@settings(max_examples=25, deadline=None)
@given(
    m=st.integers(33, 200),
    c=st.sampled_from([1, 5, 32, 64, 130]),
    kernel_shape=st.sampled_from([(3, 3), (3, 3), (5, 5), (2, 3), (1, 1), (7, 1)]),
    out_hw=st.sampled_from([(2, 3), (7, 7), (8, 8), (4, 13)]),
    strides=st.sampled_from([(1, 1), (1, 1), (2, 2), (2, 1)]),
    dilations=st.sampled_from([(1, 1), (1, 1), (2, 1)]),
    pads=st.sampled_from([(1, 1, 1, 1), (2, 2, 2, 2), (0, 1, 2, 0), (0, 0, 0, 0)]),
    batch=st.integers(1, 2),
    workers=st.integers(1, 3),
    activation=st.sampled_from(list(ACTIVATIONS)),
    constant=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_wider_or_padded_kernels_of_few_pixels_pack_each_pixels_taps(
    m, c, kernel_shape, out_hw, strides, dilations, pads, batch, workers, activation, constant, seed
):
    """Past 32 output channels, a conv of up to 64 output pixels with a wider kernel or pads
    packs each pixel's taps (zeros on pad cells) into its tile's column: any kernel, stride,
    dilation and pads, a tap row or column wholly in the pads, the 7x7 stage of a CNN."""
    rng = np.random.default_rng(seed)
    kh, kw = kernel_shape
    if kernel_shape == (1, 1) and not any(pads):
        pads = (1, 0, 0, 1)  # a 1x1 conv is padded here: unpadded ones pack no taps
    reach = [(k - 1) * d + 1 for k, d in zip(kernel_shape, dilations)]
    shape = tuple(
        max(1, (o - 1) * s + r - pads[i] - pads[i + 2])
        for i, (o, s, r) in enumerate(zip(out_hw, strides, reach))
    )
    x = rng.standard_normal((batch, c, *shape), dtype=np.float32)
    w = rng.standard_normal((m, c, kh, kw), dtype=np.float32)
    b = rng.standard_normal(m, dtype=np.float32)
    kernel, got, expected = conv_case(
        x, w, b, workers=workers, activation=activation, constant=constant, tuning=ConvTuning(),
        strides=strides, dilations=dilations, pads=pads,
    )  # fmt: skip
    close(got, expected)
    name, pixels = kernel.plan(x.shape, w.shape).name, got.shape[2] * got.shape[3]
    if name != "winograd":  # tried first: it takes 3x3 convs of enough tiles
        assert (name == "few_pixels") == (TILE_ROWS <= pixels <= 64)


@pytest.mark.skipif(not TILES_AVAILABLE, reason="no register tiles on this CPU")
@pytest.mark.parametrize("m", [32, 33])
def test_few_output_channels_of_a_wider_kernel_run_tap_by_tap_instead(m):
    rng = np.random.default_rng(m)
    x = rng.standard_normal((1, 64, 7, 7), dtype=np.float32)
    w = rng.standard_normal((m, 64, 3, 3), dtype=np.float32)
    kernel, got, expected = conv_case(x, w, tuning=ConvTuning(), pads=(1, 1, 1, 1))
    close(got, expected)
    assert kernel.plan(x.shape, w.shape).name == ("taps" if m == 32 else "few_pixels")


@pytest.mark.skipif(not TILES_AVAILABLE, reason="no register tiles on this CPU")
@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("activation", [FusedActivation("HardSwish"), FusedActivation("Swish", 0.5)])
def test_a_curve_is_applied_over_a_panels_tiles_at_once(workers, activation):
    # a 1x1 expansion at 7x7 as MobileNetV3's: the curve applied to a panel's tiles before
    # they are spread over the output's rows, every output once
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 96, 7, 7), dtype=np.float32)
    w = rng.standard_normal((200, 96, 1, 1), dtype=np.float32)
    b = rng.standard_normal(200, dtype=np.float32)
    kernel, got, expected = conv_case(x, w, b, workers=workers, activation=activation)
    assert kernel.plan(x.shape, w.shape).name == "few_pixels"
    close(got, expected)


@pytest.mark.skipif(not TILES_AVAILABLE, reason="no register tiles on this CPU")
@pytest.mark.parametrize("workers", [1, 2])
def test_deep_1x1_convs_of_14x14_pixels_tile_across_output_channels_instead_of_blas(workers):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 384, 14, 14), dtype=np.float32)
    w = rng.standard_normal((70, 384, 1, 1), dtype=np.float32)
    b = rng.standard_normal(70, dtype=np.float32)
    kernel, got, expected = conv_case(
        x, w, b, workers=workers, activation=FusedActivation("Clip", -1.0, 2.0),
        tuning=attrs.evolve(ConvTuning(), tiles_max_depth=192),
    )  # fmt: skip
    close(got, expected)
    assert kernel.plan(x.shape, w.shape).name == "few_pixels"


@pytest.mark.skipif(not TILES_AVAILABLE, reason="no register tiles on this CPU")
@pytest.mark.parametrize(
    "m, c, hw, strides, workers, expected",
    [
        ((1000, 512, (13, 13), (1, 1), 2, "few_pixels")),
        ((48, 384, (13, 13), (1, 1), 2, "few_pixels")),
        ((70, 64, (10, 12), (2, 2), 3, "few_pixels")),
        ((1000, 512, (13, 13), (1, 1), 1, "packed")),
        ((64, 96, (14, 14), (1, 1), 2, "packed")),
    ],
)
def test_1x1_convs_whose_pixels_split_unevenly_tile_across_output_channels(
    m, c, hw, strides, workers, expected
):
    """169 pixels (squeezenet's 13x13) make one slice of the column tiles' pixels where two
    threads need two: the output channels are split instead, by tiles of pixels across
    panels, not by BLAS; with one thread, or 196 pixels (two slices), the column tiles."""
    rng = np.random.default_rng(m + c)
    x = rng.standard_normal((1, c, *((d - 1) * s + 1 for d, s in zip(hw, strides))), dtype=np.float32)
    w = rng.standard_normal((m, c, 1, 1), dtype=np.float32)
    b = rng.standard_normal(m, dtype=np.float32)
    kernel, got, expected_out = conv_case(
        x, w, b, workers=workers, activation=FusedActivation("Relu"), tuning=ConvTuning(), strides=strides
    )
    close(got, expected_out)
    assert kernel.plan(x.shape, w.shape).name == expected


@pytest.mark.skipif(not TILES_AVAILABLE, reason="no register tiles on this CPU")
@pytest.mark.parametrize(
    "panels, hw, workers, by_panels, by_tiles",
    [
        (2.5, (7, 7), 2, 1, 2),
        (3, (7, 7), 3, 3, 1),
        (5, (7, 7), 2, 1, 2),
        (6, (7, 7), 2, 2, 1),
        (1, (4, 5), 2, 1, 2),
    ],
)
def test_few_panels_are_shared_by_slices_of_the_pixels(panels, hw, workers, by_panels, by_tiles):
    """Three panels of output channels (``panels`` of the host's tile columns, the last one
    half full at 2.5) do not split evenly over two threads: each takes every panel over part
    of the pixels instead (the pixels' tiles split), reading them in place or packed, the
    short last tile in one of the slices."""
    m = round(panels * TILE_COLUMNS)
    rng = np.random.default_rng(m)
    for c, strides in ((200, (1, 1)), (64, (2, 2))):
        shape = tuple((d - 1) * s + 1 for d, s in zip(hw, strides))
        x = rng.standard_normal((2, c, *shape), dtype=np.float32)
        w = rng.standard_normal((m, c, 1, 1), dtype=np.float32)
        b = rng.standard_normal(m, dtype=np.float32)
        kernel, got, expected = conv_case(
            x, w, b, workers=workers, activation=FusedActivation("Relu"), strides=strides
        )
        close(got, expected)
        plan = kernel.plan(x.shape, w.shape)
        assert plan.name == "few_pixels"
        assert (len(plan.bounds) - 1, len(plan.tile_bounds) - 1) == (by_panels, by_tiles)
