"""CpuAcc's Winograd 3x3 convs against CpuRef: both tile sizes, blocks, groups of small
images, and the rule that picks them."""

import attrs
import numpy as np
import pytest
from kernelcases import conv_case

import flowrt
from flowrt.registry import FusedActivation, WorkloadInfo
from flowrt.types import DataType, TensorInfo
from flowrt.workers.cpu.acc.conv.tuning import ConvTuning
from flowrt.workers.cpu.acc.conv.winograd import WinogradRule, winograd_blocks
from flowrt.workers.cpu.acc.conv.winograd_conv import winograd_conv
from flowrt.workers.cpu.acc.kernels.conv import ConvKernel
from flowrt.workers.cpu.acc.kernels.epilogue import NONE
from flowrt.workers.cpu.acc.tile_ir import AVAILABLE as TILES_AVAILABLE


def _force_winograd(tile, small_blocks=False, **more):
    """A ConvTuning that runs every 3x3 stride-1 conv of one group by Winograd in ``tile`` x
    ``tile`` output tiles (``small_blocks``: one row of tiles per block); 4x4 tiles need fast
    math."""
    rule = WinogradRule(min_channels=0, min_pixels=0, min_work=0, f4_min_side=0 if tile == 4 else 10**9)
    if small_blocks:
        more["winograd_block_tiles"] = 1
    return attrs.evolve(ConvTuning(), winograd_rule=rule, fast_math=tile == 4, **more)


@pytest.mark.parametrize("workers", [1, 3])
@pytest.mark.parametrize("constant", [True, False])
@pytest.mark.parametrize("tile", [2, 4])
@pytest.mark.parametrize("small_blocks", [False, True])
@pytest.mark.parametrize(
    "x_shape, w_shape, attrs",
    [
        ((2, 5, 9, 7), (3, 5, 3, 3), dict(pads=(1, 1, 1, 1))),  # odd sizes: partial tiles
        ((1, 4, 10, 11), (6, 4, 3, 3), dict(pads=(0, 2, 1, 0))),  # uneven pads
        ((1, 3, 6, 5), (2, 3, 3, 3), dict(auto_pad="VALID")),
        ((1, 3, 6, 6), (2, 3, 3, 3), dict(auto_pad="SAME_LOWER")),
        ((1, 2, 4, 4), (2, 2, 3, 3), dict(pads=(2, 2, 2, 2))),  # more padding than the kernel reach
        ((1, 3, 3, 3), (4, 3, 3, 3), {}),  # one output pixel
        ((1, 6, 13, 18), (5, 6, 3, 3), dict(pads=(1, 1, 1, 1))),  # 4x4 tiles: several per row
        # widths of whole 4s (4x4 tiles split the columns first), runs past a vector
        ((1, 3, 9, 72), (4, 3, 3, 3), dict(pads=(1, 1, 1, 1))),
        ((1, 2, 8, 40), (3, 2, 3, 3), dict(pads=(2, 3, 0, 1))),
    ],
)
def test_3x3_stride_1_convs_run_by_winograd(x_shape, w_shape, attrs, tile, small_blocks, constant, workers):
    rng = np.random.default_rng(4)
    x = rng.standard_normal(x_shape, dtype=np.float32)
    w = rng.standard_normal(w_shape, dtype=np.float32)
    b = rng.standard_normal(w_shape[0], dtype=np.float32)
    kernel, got, expected = conv_case(
        x, w, b, workers=workers, activation=FusedActivation("LeakyRelu", 0.1), constant=constant,
        tuning=_force_winograd(tile, small_blocks), **attrs,
    )  # fmt: skip
    plan = kernel.plan(x.shape, w.shape)
    assert plan.name == "winograd" and plan.tile == tile
    # F(4x4, 3x3)'s transforms round to about 1e-5 of the output's magnitude.
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=2e-5 * np.abs(expected).max())
    # A second image reuses the plan and the transformed weights.
    (again,) = kernel.execute([x, w, b])
    np.testing.assert_array_equal(again, got)


@pytest.mark.parametrize(
    "tile, side, outputs, workers, parts",
    [
        (2, 13, 130, 2, 2),  # 7 rows of tiles: 4 + 3 over two workers, so 64 + 66 channels
        (2, 13, 200, 3, 3),
        (2, 13, 100, 2, 1),  # too few channels for two parts: the rows split
        (4, 26, 130, 2, 2),
        (2, 16, 200, 2, 1),  # 8 rows split evenly
    ],
)
def test_winograd_splits_a_block_that_its_rows_would_split_unevenly_by_output_channels(
    tile, side, outputs, workers, parts
):
    rng = np.random.default_rng(9)
    x = rng.standard_normal((1, 8, side, side), dtype=np.float32)
    w = rng.standard_normal((outputs, 8, 3, 3), dtype=np.float32)
    b = rng.standard_normal(outputs, dtype=np.float32)
    kernel, got, expected = conv_case(
        x, w, b, workers=workers, activation=FusedActivation("Relu"), tuning=_force_winograd(tile),
        pads=(1, 1, 1, 1),
    )  # fmt: skip
    plan = kernel.plan(x.shape, w.shape)
    assert (plan.name, plan.tile, int(plan.parts)) == ("winograd", tile, parts)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=2e-5 * np.abs(expected).max())


@pytest.mark.parametrize("workers", [1, 3])
@pytest.mark.parametrize("tile", [2, 4])
@pytest.mark.parametrize("block_tiles, group", [(1, 1), ("two", 2), (256, 5)])
@pytest.mark.parametrize("x_shape", [(5, 4, 7, 7), (5, 3, 5, 6)])
def test_winograd_transforms_a_batch_of_small_images_in_groups(x_shape, block_tiles, group, tile, workers):
    # Where one image has fewer tiles than a block aims at, the block takes the rows of tiles
    # of several images, one image after another; 5 images in groups of 2 leave one alone.
    tiles_h, pitch = -(-x_shape[2] // tile), -(-x_shape[3] // tile) + 1
    if block_tiles == "two":
        block_tiles = 2 * tiles_h * pitch
    rng = np.random.default_rng(7)
    x = rng.standard_normal(x_shape, dtype=np.float32)
    w = rng.standard_normal((6, x_shape[1], 3, 3), dtype=np.float32)
    b = rng.standard_normal(6, dtype=np.float32)

    tuning = _force_winograd(tile, winograd_block_tiles=block_tiles, winograd_group_tiles=10**6)
    kernel, got, expected = conv_case(
        x, w, b, workers=workers, activation=FusedActivation("Relu"), tuning=tuning, pads=(1, 1, 1, 1)
    )
    plan = kernel.plan(x.shape, w.shape)
    assert (plan.name, plan.tile, plan.group) == ("winograd", tile, group)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=2e-5 * np.abs(expected).max())


@pytest.mark.parametrize(
    "out_hw, side, images, blocks",
    [
        ((7, 7), 2, 4, (16, 4)),  # 20 tiles an image: four make 80
        ((7, 7), 2, 1, (4, 1)),
        ((14, 14), 2, 4, (14, 2)),  # 56 tiles: two
        ((14, 14), 4, 4, (8, 2)),  # 4x4 tiles group to 32: 20 tiles, two images
        ((28, 28), 4, 4, (7, 1)),  # 56 tiles of 4x4: one at a time
        ((56, 56), 4, 4, (14, 1)),
    ],
)
def test_winograd_groups_small_images_up_to_a_block(out_hw, side, images, blocks):
    assert winograd_blocks(out_hw, side, images, block_tiles=256, group_tiles=64) == blocks


@pytest.mark.parametrize(
    "x_shape, w_shape, attrs, winograd",
    [
        ((1, 64, 14, 14), (64, 64, 3, 3), dict(pads=(1, 1, 1, 1)), 2),
        ((1, 16, 28, 28), (32, 16, 3, 3), dict(pads=(1, 1, 1, 1)), 2),  # 4x4 tiles: fast math only
        ((1, 256, 7, 7), (256, 256, 3, 3), dict(pads=(1, 1, 1, 1)), 0),  # 16 tiles: too few
        ((4, 256, 7, 7), (256, 256, 3, 3), dict(pads=(1, 1, 1, 1)), 2),  # 4 images together: enough
        ((1, 8, 28, 28), (64, 8, 3, 3), dict(pads=(1, 1, 1, 1)), 0),  # too few channels
        ((1, 64, 28, 28), (64, 64, 3, 3), dict(strides=(2, 2), pads=(1, 1, 1, 1)), 0),
        ((1, 64, 28, 28), (64, 64, 3, 3), dict(dilations=(2, 2), pads=(2, 2, 2, 2)), 0),
        ((1, 64, 28, 28), (64, 32, 3, 3), dict(group=2, pads=(1, 1, 1, 1)), 0),
        ((1, 64, 28, 28), (64, 64, 5, 5), dict(pads=(2, 2, 2, 2)), 0),
    ],
)
def test_winograd_is_chosen_for_large_3x3_stride_1_convs(x_shape, w_shape, attrs, winograd):
    rng = np.random.default_rng(5)
    x = rng.standard_normal(x_shape, dtype=np.float32)
    w = rng.standard_normal(w_shape, dtype=np.float32) / np.float32(np.sqrt(np.prod(w_shape[1:])))
    kernel, got, expected = conv_case(x, w, None, workers=2, activation=FusedActivation("Relu"), **attrs)
    plan = kernel.plan(x.shape, w.shape)
    assert (plan.tile if plan.name == "winograd" else 0) == winograd
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=2e-5 * np.abs(expected).max())


@pytest.mark.parametrize("fast_math, tile", [(False, 2), (True, 4)])
def test_4x4_tiles_take_large_outputs_only_in_a_network_optimized_with_fast_math(fast_math, tile):
    # the kernel's default tuning follows the network's fast_math (its WorkloadInfo's)
    rng = np.random.default_rng(6)
    x = rng.standard_normal((1, 16, 28, 28), dtype=np.float32)
    w = rng.standard_normal((32, 16, 3, 3), dtype=np.float32) / np.float32(12)
    info = WorkloadInfo(
        "conv", "Conv", flowrt.descriptors.Conv(pads=(1, 1, 1, 1)),
        (TensorInfo(x.shape, DataType.FLOAT32), TensorInfo(w.shape, DataType.FLOAT32)),
        (TensorInfo((1, 32, 28, 28), DataType.FLOAT32),), (None, w), fast_math=fast_math,
    )  # fmt: skip
    kernel = ConvKernel(info, workers=2)
    assert kernel.tuning.fast_math is fast_math
    plan = kernel.plan(x.shape, w.shape)
    assert plan.name == "winograd" and plan.tile == tile


@pytest.mark.skipif(not TILES_AVAILABLE, reason="no register tiles on this CPU: BLAS runs every GEMM")
@pytest.mark.parametrize("tile", [2, 4])
def test_the_gemms_by_register_tiles_match_those_by_blas(tile):
    # where the host has register tiles the transforms are kept as their panels; the
    # matrices for BLAS (other hosts) give the same output. 19 output channels: a padded
    # last panel.
    rng = np.random.default_rng(tile)
    x = rng.standard_normal((2, 12, 10, 9), dtype=np.float32)
    w = rng.standard_normal((19, 12, 3, 3), dtype=np.float32)
    b = rng.standard_normal(19, dtype=np.float32)
    kernel, got, expected = conv_case(x, w, b, workers=1, tuning=_force_winograd(tile), pads=(1, 1, 1, 1))
    plan = kernel.plan(x.shape, w.shape)
    weights = kernel.weights
    assert weights.winograd_panels(weights.packed, w.shape, tile).ndim == 4  # what the plan ran
    u = weights.winograd(weights.packed, w.shape, tile)
    by_blas = np.full_like(got, np.nan)
    winograd_conv(
        x, u, b, by_blas, 1, 1, plan.bounds, plan.parts, plan.block, plan.group, NONE, np.float32(0),
        np.float32(0), tile,
    )  # fmt: skip
    np.testing.assert_allclose(by_blas, got, rtol=1e-5, atol=1e-5 * np.abs(expected).max())
    np.testing.assert_allclose(by_blas, expected, rtol=1e-4, atol=2e-5 * np.abs(expected).max())
