"""Which algorithm CpuAcc's Conv takes for each shape: the first of ``ALGORITHMS`` whose
``applies`` holds. The expected names were recorded from the kernel before its algorithms were
split into modules (one ``_Plan`` for every path), so that the split changed no choice, and
for 1x1 planes (``vector``) and small depthwise planes (``depthwise_vector``) when they came; only plans are made here (no numba call)."""

import attrs
import numpy as np
import pytest

import flowrt
from flowrt.engine.scheduler.window import SplitHint
from flowrt.registry import WorkloadInfo
from flowrt.types import TensorInfo
from flowrt.workers.cpu.acc.conv.algorithms import ALGORITHMS, choose
from flowrt.workers.cpu.acc.conv.geometry import ConvGeometry
from flowrt.workers.cpu.acc.conv.tuning import ConvTuning
from flowrt.workers.cpu.acc.conv.winograd import WinogradRule
from flowrt.workers.cpu.acc.kernels import load_all
from flowrt.workers.cpu.acc.tile_ir import AVAILABLE as TILES_AVAILABLE

pytestmark = pytest.mark.skipif(not TILES_AVAILABLE, reason="recorded where the register tiles are available")

P1 = (1, 1, 1, 1)

# (name, input shape, weight shape, descriptor attributes, algorithm on 1 worker, on 2)
# fmt: off
SHAPES = [
    ("dw_same3", (1, 32, 14, 14), (32, 1, 3, 3), dict(group=32, pads=P1), "depthwise_vector", "depthwise_vector"),
    ("dw_same3_big", (1, 16, 28, 28), (16, 1, 3, 3), dict(group=16, pads=P1), "depthwise_same3", "depthwise_same3"),
    ("dw_same3_mult", (2, 16, 7, 7), (32, 1, 3, 3), dict(group=16, pads=P1), "depthwise_vector", "depthwise_vector"),
    ("dw_row", (1, 8, 1, 6), (8, 1, 3, 3), dict(group=8, pads=P1), "depthwise_vector", "depthwise_vector"),
    ("dw_pads", (1, 8, 6, 6), (8, 1, 3, 3), dict(group=8, pads=(1, 1, 0, 2)), "depthwise", "depthwise"),
    ("dw_s2", (2, 16, 15, 15), (16, 1, 3, 3), dict(group=16, strides=(2, 2), pads=P1), "depthwise_vector", "depthwise_vector"),
    ("dw_s2_big", (1, 16, 56, 56), (16, 1, 3, 3), dict(group=16, strides=(2, 2), pads=P1), "depthwise_strided2", "depthwise_strided2"),
    ("dw_5x5", (1, 24, 14, 14), (24, 1, 5, 5), dict(group=24, pads=(2, 2, 2, 2)), "depthwise_vector", "depthwise_vector"),
    ("dw_5x5_big", (1, 8, 28, 28), (8, 1, 5, 5), dict(group=8, pads=(2, 2, 2, 2)), "depthwise_same5", "depthwise_same5"),
    ("dw_5x5_s2", (1, 24, 14, 14), (24, 1, 5, 5), dict(group=24, strides=(2, 2), pads=(2, 2, 2, 2)), "depthwise_vector", "depthwise_vector"),
    ("dw_dil", (1, 8, 12, 12), (8, 1, 3, 3), dict(group=8, dilations=(2, 2), pads=(2, 2, 2, 2)), "depthwise", "depthwise"),
    ("dw_s2_asymmetric", (1, 8, 9, 9), (8, 1, 3, 3), dict(group=8, strides=(2, 2), pads=(0, 0, 1, 1)), "depthwise", "depthwise"),
    ("dw_same_upper", (2, 6, 17, 15), (12, 1, 3, 3), dict(group=6, strides=(2, 2), auto_pad="SAME_UPPER"), "depthwise_vector", "depthwise_vector"),
    ("grp_3x3", (1, 32, 14, 14), (32, 8, 3, 3), dict(group=4, pads=P1), "grouped_same3", "grouped_same3"),
    ("grp_s2", (2, 48, 15, 17), (24, 16, 3, 3), dict(group=3, strides=(2, 2), pads=P1), "grouped_strided2", "grouped_strided2"),
    ("grp_wide", (1, 40, 10, 10), (8, 20, 3, 3), dict(group=2, pads=P1), "columns", "columns"),
    ("grp_1x1", (1, 32, 8, 8), (32, 8, 1, 1), dict(group=4), "packed", "packed"),
    ("grp_odd", (1, 6, 17, 19), (9, 2, 3, 2), dict(group=3, strides=(3, 2), dilations=(1, 2), pads=(2, 0, 1, 1)), "grouped", "grouped"),
    ("grp_dil", (2, 12, 9, 9), (63, 4, 3, 3), dict(group=3, dilations=(2, 1)), "grouped", "grouped"),
    ("wino_f2", (1, 64, 14, 14), (64, 64, 3, 3), dict(pads=P1), "winograd2", "winograd2"),
    ("wino_f4", (1, 16, 28, 28), (32, 16, 3, 3), dict(pads=P1), "winograd4", "winograd4"),
    ("wino_7x7_one", (1, 256, 7, 7), (256, 256, 3, 3), dict(pads=P1), "columns", "rows"),
    ("wino_7x7_four", (4, 256, 7, 7), (256, 256, 3, 3), dict(pads=P1), "winograd2", "winograd2"),
    ("wino_few_ch", (1, 8, 28, 28), (64, 8, 3, 3), dict(pads=P1), "columns", "columns"),
    ("wino_f4_batch", (2, 32, 28, 28), (32, 32, 3, 3), dict(pads=P1), "winograd4", "winograd4"),
    ("wino_valid", (1, 32, 16, 16), (64, 32, 3, 3), dict(auto_pad="VALID"), "winograd2", "winograd2"),
    ("wino_s2", (1, 64, 28, 28), (64, 64, 3, 3), dict(strides=(2, 2), pads=P1), "columns", "columns"),
    ("wino_dil", (1, 64, 28, 28), (64, 64, 3, 3), dict(dilations=(2, 2), pads=(2, 2, 2, 2)), "columns", "columns"),
    ("wino_grp", (1, 64, 28, 28), (64, 32, 3, 3), dict(group=2, pads=P1), "columns", "columns"),
    ("wino_5x5", (1, 64, 28, 28), (64, 64, 5, 5), dict(pads=(2, 2, 2, 2)), "columns", "columns"),
    ("wino_small_batch", (2, 36, 7, 7), (40, 36, 3, 3), dict(pads=P1), "columns", "rows"),
    ("taps_3x3", (1, 8, 16, 16), (16, 8, 3, 3), dict(pads=P1), "taps", "taps"),
    ("taps_5x3", (1, 5, 13, 11), (7, 5, 5, 3), dict(pads=(2, 0, 1, 3), dilations=(1, 2)), "taps", "taps"),
    ("taps_same_lower", (1, 4, 9, 12), (3, 4, 2, 2), dict(auto_pad="SAME_LOWER"), "taps", "taps"),
    ("taps_valid_dil", (1, 6, 7, 7), (8, 6, 3, 3), dict(auto_pad="VALID", dilations=(2, 2)), "taps", "taps"),
    ("taps_32", (2, 16, 14, 14), (32, 16, 3, 3), dict(pads=P1), "taps", "taps"),
    ("taps_24", (2, 16, 20, 20), (24, 16, 3, 3), dict(pads=P1), "taps", "taps"),
    ("cols_33", (1, 4, 9, 9), (33, 4, 3, 3), dict(pads=P1), "columns", "rows"),
    ("pw_14", (1, 64, 14, 14), (128, 64, 1, 1), dict(), "packed", "packed"),
    ("pw_14_b4", (4, 64, 14, 14), (128, 64, 1, 1), dict(), "packed", "packed"),
    ("pw_7_512", (4, 512, 7, 7), (512, 512, 1, 1), dict(), "packed", "packed"),
    ("pw_7_2048", (4, 512, 7, 7), (2048, 512, 1, 1), dict(), "packed", "packed"),
    ("pw_big", (2, 1024, 7, 7), (2048, 1024, 1, 1), dict(), "batched", "rows"),
    ("pw_rows", (1, 32, 6, 6), (64, 32, 1, 1), dict(), "packed", "rows"),
    ("pw_wide", (1, 24, 5, 41), (13, 24, 1, 1), dict(), "packed", "packed"),
    ("pw_b3", (3, 40, 7, 7), (48, 40, 1, 1), dict(), "packed", "rows"),
    ("pw_b5_grp", (5, 24, 3, 3), (26, 12, 1, 1), dict(group=2), "packed", "packed"),
    ("se_squeeze", (1, 576, 1, 1), (144, 576, 1, 1), dict(), "vector", "vector"),
    ("se_excite_b4", (4, 144, 1, 1), (576, 144, 1, 1), dict(), "vector", "vector"),
    ("se_b5", (5, 144, 1, 1), (576, 144, 1, 1), dict(), "packed", "rows"),
    ("se_grouped", (1, 32, 1, 1), (32, 8, 1, 1), dict(group=4), "packed", "packed"),
    ("pw_56", (1, 64, 56, 56), (64, 64, 1, 1), dict(), "packed", "packed"),
    ("pw_pad", (3, 8, 6, 6), (34, 8, 1, 1), dict(strides=(2, 1), pads=(0, 1, 1, 0)), "columns", "rows"),
    ("stem", (1, 3, 32, 32), (16, 3, 7, 7), dict(strides=(2, 2), pads=(3, 3, 3, 3)), "columns", "columns"),
    # strided convs whose output rows are wider than a vector, of one block of k (windows.py)
    ("stem_wide", (1, 3, 64, 64), (16, 3, 7, 7), dict(strides=(2, 2), pads=(3, 3, 3, 3)), "windows", "windows"),
    ("s2_3x3_wide", (2, 16, 80, 70), (24, 16, 3, 3), dict(strides=(2, 2), pads=P1), "windows", "windows"),
    ("s2_3x3_deep", (1, 32, 80, 80), (24, 32, 3, 3), dict(strides=(2, 2), pads=P1), "columns", "columns"),
    ("s2_3x3_small", (2, 3, 23, 24), (8, 3, 3, 3), dict(strides=(2, 2), pads=P1), "columns", "columns"),
    ("s2_1x1", (1, 64, 14, 14), (128, 64, 1, 1), dict(strides=(2, 2)), "columns", "rows"),
    ("s2_batched", (4, 64, 14, 14), (512, 64, 3, 3), dict(strides=(2, 2), pads=P1), "batched", "batched"),
    ("s2_asym", (1, 8, 33, 31), (12, 8, 3, 3), dict(strides=(2, 2), pads=(1, 0, 1, 2)), "columns", "columns"),
    ("s2_3x3", (1, 16, 8, 8), (24, 16, 3, 3), dict(strides=(2, 2), pads=P1), "columns", "columns"),
    ("s12", (2, 4, 12, 9), (5, 4, 2, 3), dict(strides=(1, 2), pads=(0, 1, 0, 2)), "columns", "columns"),
    ("s2_b4", (4, 16, 15, 13), (40, 16, 3, 3), dict(strides=(2, 2), pads=(1, 0, 0, 1)), "columns", "rows"),
    ("same_upper", (1, 16, 9, 9), (64, 16, 3, 3), dict(auto_pad="SAME_UPPER"), "columns", "rows"),
    ("blas_cols", (1, 512, 8, 8), (256, 512, 3, 3), dict(pads=P1), "columns", "rows"),
    ("blas_batched", (2, 512, 8, 8), (256, 512, 3, 3), dict(pads=P1), "batched", "rows"),
    ("rows_3x3", (2, 32, 5, 5), (64, 32, 3, 3), dict(pads=P1), "columns", "rows"),
    ("cols_flat", (2, 16, 20, 20), (40, 16, 3, 3), dict(pads=P1), "winograd2", "winograd2"),
    ("cols_s2_big", (1, 32, 56, 56), (64, 32, 3, 3), dict(strides=(2, 2), pads=P1), "columns", "columns"),
]
# fmt: on

# Tunings that force a path, as the kernel tests use them.
TUNINGS = {
    "many_slices": dict(
        column_hint=SplitHint(axis=2, min_slice=1), row_hint=SplitHint(axis=1, min_slice=1), chunk_floats=5,
        taps_block_floats=1,
    ),
    "merge_any_batch": dict(merge_pixels=10**9, merge_weights=0, tiles_max_weights=-1),
    "by_blas": dict(tiles_max_weights=-1),
    "no_taps": dict(taps_max_rows=0),
    "winograd2": dict(winograd_rule=WinogradRule(0, 0, 0, 10**9)),
    "winograd4": dict(winograd_rule=WinogradRule(0, 0, 0, 0), fast_math=True),
    "no_vector": dict(depthwise_vector_max=0),
}  # fmt: skip

# (shape name, tuning, algorithm on 2 workers)
TUNED = [
    ("dw_same3", "many_slices", "depthwise_vector"),
    ("dw_same3", "merge_any_batch", "depthwise_vector"),
    ("dw_same3", "by_blas", "depthwise_vector"),
    ("dw_same3", "no_taps", "depthwise_vector"),
    ("dw_same3", "winograd2", "depthwise_vector"),
    ("dw_same3", "winograd4", "depthwise_vector"),
    ("dw_s2", "many_slices", "depthwise_vector"),
    ("dw_s2", "merge_any_batch", "depthwise_vector"),
    ("dw_s2", "by_blas", "depthwise_vector"),
    ("dw_s2", "no_taps", "depthwise_vector"),
    ("dw_s2", "winograd2", "depthwise_vector"),
    ("dw_s2", "winograd4", "depthwise_vector"),
    ("dw_same3", "no_vector", "depthwise_same3"),
    ("dw_s2", "no_vector", "depthwise_strided2"),
    ("dw_5x5", "no_vector", "depthwise_same5"),
    ("grp_3x3", "many_slices", "grouped_same3"),
    ("grp_3x3", "merge_any_batch", "grouped_same3"),
    ("grp_3x3", "by_blas", "grouped_same3"),
    ("grp_3x3", "no_taps", "grouped_same3"),
    ("grp_3x3", "winograd2", "grouped_same3"),
    ("grp_3x3", "winograd4", "grouped_same3"),
    ("wino_f2", "many_slices", "winograd2"),
    ("wino_f2", "merge_any_batch", "winograd2"),
    ("wino_f2", "by_blas", "winograd2"),
    ("wino_f2", "no_taps", "winograd2"),
    ("wino_f2", "winograd2", "winograd2"),
    ("wino_f2", "winograd4", "winograd4"),
    ("taps_3x3", "many_slices", "taps"),
    ("taps_3x3", "merge_any_batch", "taps"),
    ("taps_3x3", "by_blas", "taps"),
    ("taps_3x3", "no_taps", "columns"),
    ("taps_3x3", "winograd2", "winograd2"),
    ("taps_3x3", "winograd4", "winograd4"),
    ("pw_14_b4", "many_slices", "packed"),
    ("pw_14_b4", "merge_any_batch", "batched"),
    ("pw_14_b4", "by_blas", "columns"),
    ("pw_14_b4", "no_taps", "packed"),
    ("pw_14_b4", "winograd2", "packed"),
    ("pw_14_b4", "winograd4", "packed"),
    ("pw_rows", "many_slices", "packed"),
    ("pw_rows", "merge_any_batch", "rows"),
    ("pw_rows", "by_blas", "rows"),
    ("pw_rows", "no_taps", "rows"),
    ("pw_rows", "winograd2", "rows"),
    ("pw_rows", "winograd4", "rows"),
    ("stem", "many_slices", "columns"),
    ("stem", "merge_any_batch", "columns"),
    ("stem", "by_blas", "columns"),
    ("stem", "no_taps", "columns"),
    ("stem", "winograd2", "columns"),
    ("stem", "winograd4", "columns"),
    ("s2_batched", "many_slices", "batched"),
    ("s2_batched", "merge_any_batch", "batched"),
    ("s2_batched", "by_blas", "batched"),
    ("s2_batched", "no_taps", "batched"),
    ("s2_batched", "winograd2", "batched"),
    ("s2_batched", "winograd4", "batched"),
    ("cols_33", "many_slices", "columns"),
    ("cols_33", "merge_any_batch", "rows"),
    ("cols_33", "by_blas", "rows"),
    ("cols_33", "no_taps", "rows"),
    ("cols_33", "winograd2", "winograd2"),
    ("cols_33", "winograd4", "winograd4"),
    ("same_upper", "many_slices", "columns"),
    ("same_upper", "merge_any_batch", "rows"),
    ("same_upper", "by_blas", "rows"),
    ("same_upper", "no_taps", "rows"),
    ("same_upper", "winograd2", "winograd2"),
    ("same_upper", "winograd4", "winograd4"),
]


def _kernel(x_shape, w_shape, attrs_, workers, tuning=None):
    desc = flowrt.descriptors.Conv(**attrs_)
    w = np.zeros(w_shape, np.float32)
    inputs = (TensorInfo(x_shape, "float32"), TensorInfo(w_shape, "float32"))
    info = WorkloadInfo("conv", "Conv", desc, inputs, (None,), (None, w, None), None)
    # The table was recorded before the tiles had a depth limit and before few_pixels: it pins
    # the choice by every other knob (test_the_tiles_take_dot_products_up_to_their_depth_limit
    # and test_1x1_convs_of_few_pixels_take_the_tiles_across_output_channels pin those), and
    # with fast math, which allows Winograd's 4x4 tiles (test_winograd.py pins the default).
    unlimited = attrs.evolve(
        ConvTuning(), tiles_max_depth=1 << 30, few_pixels_max=0, few_pixels_deep_max=0, fast_math=True
    )
    return load_all()["Conv"](info, workers, tuning=attrs.evolve(unlimited, **(tuning or {})))


def _label(plan):
    """The algorithm's name, with Winograd's tile side."""
    return f"winograd{plan.tile}" if plan.name == "winograd" else plan.name


def test_the_algorithms_are_tried_in_a_fixed_order_ending_with_one_that_takes_any_shape():
    names = [a.name for a in ALGORITHMS]
    assert names == [
        "depthwise_vector", "depthwise_same3", "depthwise_same5", "depthwise_strided2", "depthwise", "grouped_same3", "grouped_strided2", "grouped", "winograd", "few_pixels", "taps", "vector", "batched", "packed", "windows",
        "columns", "rows",
    ]  # fmt: skip
    geometry = ConvGeometry.of(flowrt.descriptors.Conv(), (1, 3, 5, 5), (4, 3, 3, 3), 1)
    assert ALGORITHMS[-1].applies(geometry, ConvTuning())


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("name, x_shape, w_shape, attrs_, on_one, on_two", SHAPES, ids=[s[0] for s in SHAPES])
def test_each_shape_takes_the_algorithm_it_took_before_the_split(
    name, x_shape, w_shape, attrs_, on_one, on_two, workers
):
    kernel = _kernel(x_shape, w_shape, attrs_, workers)
    assert _label(kernel.plan(x_shape, w_shape)) == (on_one if workers == 1 else on_two)
    # the plan is made once per shape and worker count
    assert kernel.plan(x_shape, w_shape) is kernel.plan(x_shape, w_shape, workers)


@pytest.mark.parametrize("name, tuning, expected", TUNED, ids=[f"{n}-{t}" for n, t, _ in TUNED])
def test_a_tuning_forces_the_path_it_forced_before_the_split(name, tuning, expected):
    (_, x_shape, w_shape, attrs_, _, _) = next(s for s in SHAPES if s[0] == name)
    kernel = _kernel(x_shape, w_shape, attrs_, 2, TUNINGS[tuning])
    assert _label(kernel.plan(x_shape, w_shape)) == expected


@pytest.mark.parametrize("x_shape", [(5, 4, 7, 7), (5, 3, 5, 6)])
def test_winograd_tunings_force_the_tile_and_the_grouping(x_shape):
    small = dict(TUNINGS["winograd4"], winograd_block_tiles=1)
    grouped = dict(TUNINGS["winograd2"], winograd_block_tiles=256, winograd_group_tiles=10**6)
    w_shape = (6, x_shape[1], 3, 3)
    plan = _kernel(x_shape, w_shape, dict(pads=P1), 3, small).plan(x_shape, w_shape)
    assert (_label(plan), plan.block, plan.group) == ("winograd4", 1, 1)
    plan = _kernel(x_shape, w_shape, dict(pads=P1), 3, grouped).plan(x_shape, w_shape)
    assert _label(plan) == "winograd2" and plan.group == 5


@pytest.mark.parametrize(
    "x_shape, w_shape, attrs_, within, beyond",
    [
        ((1, 256, 14, 14), (64, 256, 1, 1), {}, "packed", "columns"),
        ((4, 512, 7, 7), (512, 512, 1, 1), {}, "packed", "batched"),
        ((1, 64, 28, 28), (64, 64, 3, 3), dict(strides=(2, 2), pads=(1, 1, 1, 1)), "columns", "columns"),
    ],
)
def test_the_tiles_take_dot_products_up_to_their_depth_limit(x_shape, w_shape, attrs_, within, beyond):
    depth = w_shape[1] * w_shape[2] * w_shape[3]
    inside = _kernel(x_shape, w_shape, attrs_, 1, dict(tiles_max_depth=depth)).plan(x_shape, w_shape)
    outside = _kernel(x_shape, w_shape, attrs_, 1, dict(tiles_max_depth=depth - 1)).plan(x_shape, w_shape)
    assert (inside.name, outside.name) == (within, beyond)
    if inside.name == "columns":  # the same path, by tiles or by BLAS
        assert (inside.tiles, outside.tiles) == (True, False)


DEEP = 192  # a depth limit of the column tiles (AVX2's)


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize(
    "x_shape, w_shape, attrs_, depth_limit, few",
    [
        ((1, 160, 7, 7), (960, 160, 1, 1), {}, DEEP, True),
        ((1, 960, 7, 7), (160, 960, 1, 1), {}, 1 << 30, True),  # 49 pixels at any depth
        ((1, 16, 8, 8), (24, 16, 1, 1), {}, DEEP, True),  # 64 pixels
        ((1, 16, 9, 9), (24, 16, 1, 1), {}, DEEP, False),  # 81, shallow: the column tiles
        ((1, 384, 14, 14), (64, 384, 1, 1), {}, DEEP, True),  # deep: else BLAS
        ((1, 384, 14, 14), (64, 384, 1, 1), {}, 1 << 30, False),  # the column tiles take it
        ((1, 384, 15, 15), (64, 384, 1, 1), {}, DEEP, False),  # 225 pixels
        ((2, 160, 7, 7), (960, 160, 1, 1), {}, DEEP, True),  # image by image
        ((2, 16, 9, 9), (24, 16, 1, 1), {}, DEEP, False),  # 81 an image, shallow
        ((1, 160, 2, 2), (960, 160, 1, 1), {}, DEEP, False),  # fewer pixels than a tile's rows
        ((1, 32, 7, 7), (32, 16, 1, 1), dict(group=2), DEEP, False),
        ((1, 32, 13, 13), (32, 32, 1, 1), dict(strides=(2, 2)), DEEP, True),  # 7x7 of 13x13
        ((1, 1024, 14, 14), (2048, 1024, 1, 1), dict(strides=(2, 2)), DEEP, True),  # 8 MiB of weights
        ((1, 32, 13, 13), (32, 32, 1, 1), dict(strides=(2, 2), pads=(1, 1, 0, 0)), DEEP, False),
        ((1, 32, 7, 7), (32, 32, 3, 3), dict(pads=(1, 1, 1, 1)), DEEP, False),
    ],
)
def test_1x1_convs_of_few_pixels_take_the_tiles_across_output_channels(
    x_shape, w_shape, attrs_, depth_limit, few, workers
):
    tuning = attrs.evolve(ConvTuning(), tiles_max_depth=depth_limit)
    geometry = ConvGeometry.of(flowrt.descriptors.Conv(**attrs_), x_shape, w_shape, workers)
    assert (choose(geometry, tuning).name == "few_pixels") == few


@pytest.mark.skipif(not TILES_AVAILABLE, reason="the few-pixel tiles need AVX2 or AVX-512")
@pytest.mark.parametrize("workers", [1, 2])
def test_winograd_gives_way_to_the_few_pixel_tiles_whose_panels_are_made(workers):
    # 512 -> 512 at 7x7: Winograd at batch 4 (four images transformed together), the few-pixel
    # tiles at batch 1; at batch 4 too where their panels of the weights exist already.
    conv = flowrt.descriptors.Conv(pads=(1, 1, 1, 1))
    w_shape = (512, 512, 3, 3)
    tuning = ConvTuning()
    one = ConvGeometry.of(conv, (1, 512, 7, 7), w_shape, workers)
    four = ConvGeometry.of(conv, (4, 512, 7, 7), w_shape, workers)
    assert choose(one, tuning).name == "few_pixels"
    assert choose(four, tuning).name == "winograd"
    assert choose(four, tuning, lambda form: form == "conv.column_panels").name == "few_pixels"
    assert choose(four, tuning, lambda form: form == "conv.panels").name == "winograd"
    # a form made does not take a shape its algorithm does not apply to
    big = ConvGeometry.of(conv, (4, 512, 14, 14), w_shape, workers)
    assert choose(big, tuning, lambda form: True).name == "winograd"


@pytest.mark.skipif(not TILES_AVAILABLE, reason="the column tiles' panels need AVX2 or AVX-512")
@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize(
    "channels, w_shape, pads",
    [(256, (256, 256, 3, 3), (1, 1, 1, 1)), (512, (1024, 512, 1, 1), (0, 0, 0, 0))],
)
def test_the_batched_gemm_gives_way_to_the_column_tiles_whose_panels_are_made(
    channels, w_shape, pads, workers
):
    # ResNet-50's stride-2 convs at 28x28: the column tiles at batch 1, one batched GEMM at
    # batch 2 and more; the column tiles again where their panels of the weights exist already
    # (a batch-1 load of the network made them), so that a batch variant makes no new form.
    conv = flowrt.descriptors.Conv(strides=(2, 2), pads=pads)
    tuning = ConvTuning()
    assert choose(ConvGeometry.of(conv, (1, channels, 28, 28), w_shape, workers), tuning).name == "columns"
    for batch in (2, 4, 8):
        geometry = ConvGeometry.of(conv, (batch, channels, 28, 28), w_shape, workers)
        assert choose(geometry, tuning).name == "batched"
        assert choose(geometry, tuning, lambda form: form == "conv.panels").name == "columns"
        assert choose(geometry, tuning, lambda form: form == "conv.column_panels").name == "batched"
