"""CpuAcc Conv against CpuRef: every geometry, both splits, fused activations, a whole model."""

import functools

import attrs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kernelcases import ACTIVATIONS, close, conv_case

import flowrt
from flowrt.engine.scheduler.job import JobContext
from flowrt.engine.scheduler.window import SplitHint
from flowrt.models import expected_outputs, expected_tolerance, light_model, pattern_input
from flowrt.registry import FusedActivation
from flowrt.types import TensorInfo
from flowrt.workers.cpu.acc import gemv
from flowrt.workers.cpu.acc.conv.batched import Batched
from flowrt.workers.cpu.acc.conv.columns import Columns
from flowrt.workers.cpu.acc.conv.geometry import ConvGeometry
from flowrt.workers.cpu.acc.conv.tuning import ConvTuning
from flowrt.workers.cpu.acc.tile_ir import AVAILABLE as TILES_AVAILABLE
from flowrt.workers.cpu.acc.tile_ir import TILE_ROWS


@st.composite
def convolutions(draw):
    """A random 2-D conv: data, weights, optional bias and the descriptor's attributes."""
    depthwise = draw(st.booleans())
    group = draw(st.integers(2, 5)) if depthwise else draw(st.sampled_from([1, 1, 2, 3]))
    cg = 1 if depthwise else draw(st.integers(1, 4))
    mg = draw(st.sampled_from([1, 2])) if depthwise else draw(st.integers(1, 6))
    kernel = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    dilations = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    strides = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    auto_pad = draw(st.sampled_from(["NOTSET", "NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"]))
    pads = tuple(draw(st.integers(0, 2)) for _ in range(4))
    spans = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    spatial = [draw(st.integers(s, s + 12)) for s in spans]
    n = draw(st.integers(1, 2))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    x = rng.standard_normal((n, group * cg, *spatial), dtype=np.float32)
    w = rng.standard_normal((group * mg, cg, *kernel), dtype=np.float32)
    b = rng.standard_normal(group * mg, dtype=np.float32) if draw(st.booleans()) else None
    attrs = dict(group=group, strides=strides, dilations=dilations, auto_pad=auto_pad)
    if auto_pad == "NOTSET":
        attrs["pads"] = pads
    return x, w, b, attrs


# One pixel or one channel per slice, and chunks of a few pixels: every boundary is crossed;
# tap by tap, one output row per block.
_MANY_SLICES = dict(
    column_hint=SplitHint(axis=2, min_slice=1), row_hint=SplitHint(axis=1, min_slice=1), chunk_floats=5,
    taps_block_floats=1,
)  # fmt: skip
_NO_WINDOWS = dict(windows_max_depth=0)  # strided convs by columns, not windows.py
_BY_BLAS = dict(tiles_max_weights=-1)  # the column paths multiply by BLAS, not register tiles
_NOT_ACROSS_CHANNELS = dict(few_pixels_max=0, few_pixels_deep_max=0)  # no few_pixels path
# Any batch as one GEMM, without register tiles, which a 1x1 conv would take instead (as on
# CPUs without AVX2).
_MERGE_ANY_BATCH = dict(merge_pixels=10**9, merge_weights=0, tiles_max_weights=-1)


def _tuning(*changes):
    """The default ConvTuning with each of ``changes`` (dicts of fields) applied in turn."""
    return functools.reduce(lambda t, c: attrs.evolve(t, **c), changes, ConvTuning())


def _geometry(kernel, x_shape, w_shape, workers=None):
    return ConvGeometry.of(kernel.desc, x_shape, w_shape, workers or kernel.workers)


def _applies(algorithm, kernel, x_shape, w_shape):
    """Whether ``algorithm`` takes the shape, under the kernel's tuning (an earlier one in the
    order may take it first)."""
    return algorithm.applies(_geometry(kernel, x_shape, w_shape), kernel.tuning)


@settings(max_examples=30, deadline=None)
@given(
    case=convolutions(),
    workers=st.integers(1, 3),
    activation=st.sampled_from(list(ACTIVATIONS)),
    constant=st.booleans(),
    given_out=st.booleans(),
    tiny_slices=st.booleans(),
    merged=st.booleans(),
    blas=st.booleans(),
)
def test_conv_matches_cpuref(case, workers, activation, constant, given_out, tiny_slices, merged, blas):
    x, w, b, attrs = case
    tuning = _tuning(
        *[t for t, on in ((_MANY_SLICES, tiny_slices), (_MERGE_ANY_BATCH, merged), (_BY_BLAS, blas)) if on]
    )
    _, got, expected = conv_case(
        x, w, b, workers=workers, activation=activation, constant=constant, given_out=given_out,
        tuning=tuning, **attrs,
    )  # fmt: skip
    close(got, expected)


@pytest.mark.parametrize(
    "x_shape, w_shape, attrs, split",
    [
        ((2, 16, 20, 20), (24, 16, 3, 3), dict(pads=(1, 1, 1, 1)), "columns"),  # flat im2col
        ((1, 8, 33, 31), (12, 8, 3, 3), dict(strides=(2, 2), pads=(1, 0, 1, 2)), "columns"),
        ((1, 32, 16, 16), (16, 32, 1, 1), {}, "columns"),  # 1x1: no im2col
        ((2, 32, 5, 5), (64, 32, 3, 3), dict(pads=(1, 1, 1, 1)), "rows"),
        ((1, 32, 6, 6), (64, 32, 1, 1), {}, "rows"),
        ((1, 12, 9, 9), (96, 4, 3, 3), dict(group=3, dilations=(2, 1)), "rows"),
    ],
)
def test_large_layers_split_across_workers(x_shape, w_shape, attrs, split):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(x_shape, dtype=np.float32)
    w = rng.standard_normal(w_shape, dtype=np.float32)
    b = rng.standard_normal(w_shape[0], dtype=np.float32)
    kernel, got, expected = conv_case(x, w, b, activation=FusedActivation("Relu"), **attrs)
    close(got, expected)
    assert _applies(Columns, kernel, x.shape, w.shape) == (split == "columns")
    geometry = _geometry(kernel, x.shape, w.shape)
    bounds = (
        geometry.column_bounds(kernel.tuning) if split == "columns" else geometry.row_bounds(kernel.tuning)
    )
    assert len(bounds) == 3


@pytest.mark.parametrize("workers", [1, 2, 3])
@pytest.mark.parametrize(
    "x_shape, w_shape, attrs",
    [
        ((3, 40, 7, 7), (48, 40, 1, 1), {}),  # 1x1: the images themselves side by side
        ((2, 36, 7, 7), (40, 36, 3, 3), dict(pads=(1, 1, 1, 1))),  # flat im2col
        ((4, 16, 15, 13), (40, 16, 3, 3), dict(strides=(2, 2), pads=(1, 0, 0, 1))),
        ((2, 12, 9, 9), (63, 4, 3, 3), dict(group=3, dilations=(2, 1))),
        ((3, 8, 6, 6), (34, 8, 1, 1), dict(strides=(2, 1), pads=(0, 1, 1, 0))),
    ],
)
def test_a_batch_of_small_images_runs_as_one_gemm(x_shape, w_shape, attrs, workers):
    """Each image's column matrix side by side in one GEMM (per group), the product copied back
    per image with bias and activation: the same result as CpuRef's."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal(x_shape, dtype=np.float32)
    w = rng.standard_normal(w_shape, dtype=np.float32)
    b = rng.standard_normal(w_shape[0], dtype=np.float32)
    for tuning in (_tuning(_MERGE_ANY_BATCH), _tuning(_MERGE_ANY_BATCH, _MANY_SLICES)):
        kernel, got, expected = conv_case(
            x, w, b, workers=workers, activation=FusedActivation("LeakyRelu", 0.1), tuning=tuning, **attrs
        )
        close(got, expected)
    # with one column per slice allowed, the batch splits over the workers as evenly as any split
    assert _applies(Batched, kernel, x.shape, w.shape)
    # one image, or weights small enough to stay in cache: image by image
    kernel, got, expected = conv_case(x[:1], w, b, workers=workers, tuning=_tuning(_MERGE_ANY_BATCH), **attrs)
    close(got, expected)
    assert not _applies(Batched, kernel, x[:1].shape, w.shape)
    assert not _applies(Batched, conv_case(x, w, b, **attrs)[0], x.shape, w.shape)


def test_large_weights_on_few_pixels_merge_the_batch_unless_tiled_across_output_channels():
    rng = np.random.default_rng(6)
    x = rng.standard_normal((4, 512, 7, 7), dtype=np.float32)
    w = rng.standard_normal((512, 512, 1, 1), dtype=np.float32) * np.float32(0.05)
    # 49 pixels an image: by register tiles across the output channels, image by image
    kernel, got, expected = conv_case(x, w, workers=2)
    close(got, expected)
    assert kernel.plan(x.shape, w.shape).name == ("few_pixels" if TILES_AVAILABLE else "batched")
    # By the column tiles, a 1x1 conv reads all the images' pixels in place, with no copy
    # (where the tiles take dot products of 512: AVX-512's, not AVX2's).
    kernel, got, expected = conv_case(x, w, workers=2, tuning=_tuning(_NOT_ACROSS_CHANNELS))
    close(got, expected)
    plan = kernel.plan(x.shape, w.shape)
    by_tiles = TILES_AVAILABLE and kernel.tuning.tiles(w.shape[0] * w.shape[1], w.shape[1])
    assert plan.name == ("packed" if by_tiles else "batched") and len(plan.bounds) == 3
    kernel, got, expected = conv_case(x, w, workers=2, tuning=_tuning(_BY_BLAS))
    close(got, expected)
    plan = kernel.plan(x.shape, w.shape)
    assert plan.name == "batched" and len(plan.bounds) == 3  # 196 pixels: one slice per worker
    # 98 pixels are one slice: two workers split the output channels of each image instead
    assert kernel.plan((2, 512, 7, 7), w.shape).name == "rows"
    assert kernel.plan((4, 512, 17, 17), w.shape).name != "batched"  # 289 pixels each


@pytest.mark.parametrize("workers", [1, 3])
@pytest.mark.parametrize("constant", [True, False])
@pytest.mark.parametrize(
    "x_shape, w_shape, attrs",
    [
        ((2, 16, 14, 14), (32, 16, 3, 3), dict(pads=(1, 1, 1, 1))),
        ((1, 5, 13, 11), (7, 5, 5, 3), dict(pads=(2, 0, 1, 3), dilations=(1, 2))),
        ((1, 4, 9, 12), (3, 4, 2, 2), dict(auto_pad="SAME_LOWER")),
        ((1, 6, 7, 7), (8, 6, 3, 3), dict(auto_pad="VALID", dilations=(2, 2))),
    ],
)
def test_few_output_channels_run_tap_by_tap(x_shape, w_shape, attrs, constant, workers):
    """Stride 1, one group, at most TAPS_MAX_ROWS output channels: no column matrix, one GEMM
    per kernel tap. The same conv with the tap path turned off goes through im2col."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal(x_shape, dtype=np.float32)
    w = rng.standard_normal(w_shape, dtype=np.float32)
    b = rng.standard_normal(w_shape[0], dtype=np.float32)
    for tuning, taps in [
        (None, True),
        (_tuning(_MANY_SLICES), True),
        (_tuning(dict(taps_max_rows=0)), False),
    ]:
        kernel, got, expected = conv_case(
            x,
            w,
            b,
            workers=workers,
            activation=FusedActivation("Relu"),
            constant=constant,
            tuning=tuning,
            **attrs,
        )
        close(got, expected)
        assert (kernel.plan(x.shape, w.shape).name == "taps") is taps


@pytest.mark.parametrize("workers", [1, 3])
@pytest.mark.parametrize("activation", [None, FusedActivation("Relu"), FusedActivation("Clip", -1.0, 2.0)])
@pytest.mark.parametrize(
    "x_shape, w_shape, attrs, direct",
    [
        ((2, 32, 14, 14), (32, 8, 3, 3), dict(group=4, pads=(1, 1, 1, 2)), True),
        ((1, 48, 15, 17), (24, 16, 3, 3), dict(group=3, strides=(2, 2), pads=(1, 1, 1, 1)), True),
        ((1, 12, 9, 11), (6, 4, 5, 3), dict(group=3, pads=(2, 1, 2, 0), dilations=(1, 2)), True),
        ((1, 40, 10, 10), (8, 20, 3, 3), dict(group=2, pads=(1, 1, 1, 1)), False),
    ],
)
def test_groups_of_few_channels_run_as_direct_windows(x_shape, w_shape, attrs, direct, activation, workers):
    """A grouped conv (not depthwise) of at most MAX_GROUP_CHANNELS input channels per group
    runs as direct sliding windows over each group's planes; wider groups use im2col."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal(x_shape, dtype=np.float32)
    w = rng.standard_normal(w_shape, dtype=np.float32)
    b = rng.standard_normal(w_shape[0], dtype=np.float32)
    kernel, got, expected = conv_case(x, w, b, workers=workers, activation=activation, **attrs)
    close(got, expected)
    assert kernel.plan(x.shape, w.shape).name.startswith("grouped") is direct


@pytest.mark.parametrize("workers", [1, 3])
@pytest.mark.parametrize("activation", [None, FusedActivation("Relu"), FusedActivation("Swish", 0.5)])
@pytest.mark.parametrize(
    "x_shape, w_shape",
    [((2, 32, 14, 14), (32, 8, 3, 3)), ((1, 6, 2, 7), (9, 2, 3, 3)), ((1, 48, 9, 5), (24, 16, 3, 3))],
)
@pytest.mark.parametrize("stride", [1, 2])
def test_grouped_3x3_convs_take_each_channels_taps_in_one_loop(x_shape, w_shape, stride, activation, workers):
    """RegNet's grouped 3x3 convs: the group's planes copied once into a bordered scratch (at
    stride 2: split into phase planes), each output plane built by one pass per input
    channel; huge values on the first and last columns show any tap that wrapped into
    another row."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal(x_shape, dtype=np.float32)
    x[..., 0] = x[..., -1] = 1e30
    w = rng.standard_normal(w_shape, dtype=np.float32)
    b = rng.standard_normal(w_shape[0], dtype=np.float32)
    group = x_shape[1] // w_shape[1]
    kernel, got, expected = conv_case(
        x,
        w,
        b,
        workers=workers,
        activation=activation,
        group=group,
        pads=(1, 1, 1, 1),
        strides=(stride, stride),
    )
    assert kernel.plan(x.shape, w.shape).name == ("grouped_same3" if stride == 1 else "grouped_strided2")
    finite = np.isfinite(expected)
    np.testing.assert_array_equal(np.isfinite(got), finite)
    np.testing.assert_allclose(got[finite], expected[finite], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("threads", [1, 2, None])
def test_a_conv_splits_its_window_by_the_threads_its_job_has_now(threads):
    # A run that shares the cores with others has one thread: one slice, not two in a row.
    rng = np.random.default_rng(8)
    x = rng.standard_normal((2, 16, 14, 14), dtype=np.float32)
    w = rng.standard_normal((32, 16, 3, 3), dtype=np.float32)
    kernel, first, expected = conv_case(x, w, None, workers=3, pads=(1, 1, 1, 1))
    kernel._plans.clear()
    (got,) = kernel.execute([x, w], None, None if threads is None else JobContext(threads))
    close(got, expected)
    workers = min(3, threads or 3)  # None: the kernel's own 3
    assert [key[-1] for key in kernel._plans] == [workers]
    assert len(kernel.plan(x.shape, w.shape, workers).row_bounds) - 1 == workers


async def test_a_conv_in_a_run_is_given_the_threads_its_job_has_now(monkeypatch):
    """The executor hands a conv (a kernel that ``takes_job``) the context the host runner
    gives before it; at load it warms up in the load's own job."""
    from flowrt.workers.cpu.workers import CpuWorkerPool

    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((1, 16, 14, 14), "float32"))
    w = np.ones((32, 16, 3, 3), np.float32)
    conv = net.add_layer("Conv", flowrt.descriptors.Conv(pads=(1, 1, 1, 1)), [x, w])
    net.add_output("y", net.add_layer("Relu", inputs=[conv]))
    opt = flowrt.optimize(net, backends=["CpuAcc", "CpuRef"])
    async with flowrt.Runtime(cpu_workers=2) as rt:
        model = await rt.load(opt)
        (kernel,) = [n.workload.kernel for n in model.dataflow.order if n.kind == "Conv"]
        assert [key[-1] for key in kernel._plans] == [min(kernel.workers, 2)]  # warmed up alone
        kernel._plans.clear()
        monkeypatch.setattr(CpuWorkerPool, "between_workloads", lambda self: JobContext(1))
        out = await model.run({"x": np.ones((1, 16, 14, 14), np.float32)})
    assert [key[-1] for key in kernel._plans] == [1]
    np.testing.assert_allclose(out["y"][0, :, 5, 5], 16 * 9, rtol=1e-5)


@pytest.mark.skipif(not TILES_AVAILABLE, reason="no register tiles on this CPU")
@pytest.mark.parametrize("bias", [True, False])
def test_the_column_path_multiplies_by_register_tiles_packed_once(bias):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 20, 9, 11), dtype=np.float32)
    w = rng.standard_normal((13, 20, 1, 1), dtype=np.float32)  # 13 rows: a partial panel
    b = rng.standard_normal(13, dtype=np.float32) if bias else None
    kernel, got, expected = conv_case(x, w, b, workers=1, activation=FusedActivation("Relu"))
    close(got, expected)
    panels = kernel.weights._panels
    assert panels is not None and panels[0].shape[:2] == (1, -(-13 // TILE_ROWS))
    (again,) = kernel.execute([x, w] if b is None else [x, w, b])
    assert kernel.weights._panels is panels  # constant weights and bias: packed at the first run only
    close(again, expected)


@pytest.mark.skipif(not TILES_AVAILABLE, reason="no register tiles on this CPU")
@pytest.mark.parametrize("workers", [1, 2, 3])
@pytest.mark.parametrize("tiny_slices", [False, True])
@pytest.mark.parametrize(
    "x_shape, group",
    [
        ((4, 24, 7, 7), 1),  # 49 pixels: tiles across two images
        ((5, 24, 3, 3), 2),  # 9 pixels: one tile across four images, per group
        ((3, 24, 14, 14), 3),
        ((1, 24, 5, 41), 1),  # one image: whole tiles and a masked last one
    ],
)
def test_1x1_convs_multiply_all_images_pixels_side_by_side(x_shape, group, tiny_slices, workers):
    """A 1x1 conv by register tiles reads the batch's pixels as one row of columns, a tile
    holding the end of one image and the start of the next included."""
    rng = np.random.default_rng(8)
    x = rng.standard_normal(x_shape, dtype=np.float32)
    w = rng.standard_normal((13 * group, 24 // group, 1, 1), dtype=np.float32)  # partial panels
    b = rng.standard_normal(13 * group, dtype=np.float32)
    for activation in (FusedActivation("Relu"), FusedActivation("Clip", -1.0, 2.0)):
        kernel, got, expected = conv_case(
            x, w, b, workers=workers, group=group, activation=activation,
            tuning=_tuning(_NOT_ACROSS_CHANNELS, *([_MANY_SLICES] if tiny_slices else [])),
        )  # fmt: skip
        close(got, expected)
        plan = kernel.plan(x.shape, w.shape)
        assert plan.name == "packed" and plan.bounds[-1] == x_shape[0] * x_shape[2] * x_shape[3]
        assert kernel.weights._panels is not None


@pytest.mark.parametrize(
    "batch, m, c, workers", [(1, 7, 5, 1), (1, 70, 1000, 2), (3, 130, 600, 2), (4, 576, 144, 2)]
)
@pytest.mark.parametrize("constant", [True, False])
def test_1x1_convs_on_a_1x1_plane_are_weights_times_a_vector(batch, m, c, workers, constant):
    """Squeeze-excitation's convs: each image's output is the weights (M, C) times its C
    values, the rows split over the workers when there are enough of them."""
    rng = np.random.default_rng(batch + m)
    x = rng.standard_normal((batch, c, 1, 1), dtype=np.float32)
    w = rng.standard_normal((m, c, 1, 1), dtype=np.float32)
    b = rng.standard_normal(m, dtype=np.float32)
    for activation, bias in (
        (None, None),
        (FusedActivation("HardSigmoid", 0.2, 0.4), b),
        (FusedActivation("Relu"), b),
    ):
        kernel, got, expected = conv_case(
            x, w, bias, workers=workers, activation=activation, constant=constant, given_out=constant
        )
        close(got, expected)
        plan = kernel.plan(x.shape, w.shape)
        assert plan.name == "vector" and plan.bounds[-1] == m
        assert len(plan.bounds) - 1 == (2 if m * c >= 2 * gemv.MIN_TASK_WEIGHTS and workers == 2 else 1)


def test_weights_past_the_tile_limit_multiply_by_blas():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 16, 8, 8), dtype=np.float32)
    w = rng.standard_normal((24, 16, 3, 3), dtype=np.float32)

    limit = _tuning(dict(tiles_max_weights=24 * 16 * 9 - 1))
    kernel, got, expected = conv_case(x, w, pads=(1, 1, 1, 1), strides=(2, 2), tuning=limit)
    close(got, expected)
    assert kernel.plan(x.shape, w.shape).name == "columns" and kernel.weights._panels is None


def test_many_output_channels_or_strides_use_the_column_matrix():
    kernel, got, expected = conv_case(
        np.ones((1, 4, 9, 9), np.float32), np.ones((33, 4, 3, 3), np.float32), pads=(1, 1, 1, 1)
    )
    close(got, expected)
    assert kernel.plan((1, 4, 9, 9), (33, 4, 3, 3)).name == "rows"
    kernel, _, _ = conv_case(
        np.ones((1, 4, 9, 9), np.float32), np.ones((8, 4, 3, 3), np.float32), strides=(2, 2)
    )
    assert kernel.plan((1, 4, 9, 9), (8, 4, 3, 3)).name == "columns"


@pytest.mark.parametrize(
    "x_shape, w_shape, attrs",
    [
        ((2, 3, 31, 30), (16, 3, 7, 7), dict(strides=(2, 2), pads=(3, 3, 3, 3))),  # a stem
        ((2, 3, 23, 24), (8, 3, 3, 3), dict(strides=(2, 2), pads=(1, 1, 1, 1))),
        ((1, 6, 17, 19), (9, 2, 3, 2), dict(group=3, strides=(3, 2), dilations=(1, 2), pads=(2, 0, 1, 1))),
        ((2, 4, 12, 9), (5, 4, 2, 3), dict(strides=(1, 2), pads=(0, 1, 0, 2))),
    ],
)
@pytest.mark.parametrize("tuning", [_tuning(_NO_WINDOWS), _tuning(_MANY_SLICES, _NO_WINDOWS)])
def test_strided_convs_read_their_columns_from_phase_planes(x_shape, w_shape, attrs, tuning):
    """Each image's padded channels split by the strides once; im2col copies unit-stride
    runs of them (pad cells are the planes' zeros, which later images leave untouched)."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal(x_shape, dtype=np.float32)
    w = rng.standard_normal(w_shape, dtype=np.float32)
    b = rng.standard_normal(w_shape[0], dtype=np.float32)
    kernel, got, expected = conv_case(x, w, b, activation=FusedActivation("Relu"), tuning=tuning, **attrs)
    geometry = _geometry(kernel, x.shape, w.shape)
    assert kernel.plan(x.shape, w.shape).name != "windows"
    assert (
        Columns.applies(geometry, kernel.tuning) and Columns.plan(geometry, kernel.tuning).phase_shape.all()
    )
    close(got, expected)


def test_kernel_can_run_from_two_threads_at_once():
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 16, 30, 30), dtype=np.float32)
    w = rng.standard_normal((32, 16, 3, 3), dtype=np.float32)
    kernel, first, expected = conv_case(x, w, None, pads=(1, 1, 1, 1))
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda _: kernel.execute([x, w])[0], range(8)))
    for got in results:
        np.testing.assert_array_equal(got, first)


def _conv_support(dtype, x_shape, w_shape):
    support = flowrt.backend_registry().get("CpuAcc").layer_support()
    return support.is_layer_supported(
        "Conv", flowrt.descriptors.Conv(), [TensorInfo(x_shape, dtype), TensorInfo(w_shape, dtype)], [None]
    )


def test_non_float32_conv_is_declined_with_a_reason():
    answer = _conv_support("float64", (1, 3, 8, 8), (4, 3, 3, 3))
    assert not answer.supported and answer.reason == "CpuAcc Conv takes float32 only"


@pytest.mark.parametrize("x_shape, w_shape", [((1, 3, 8), (4, 3, 3)), ((1, 3, 8, 8, 8), (4, 3, 3, 3, 3))])
def test_conv_other_than_2d_is_declined_with_a_reason(x_shape, w_shape):
    answer = _conv_support("float32", x_shape, w_shape)
    assert not answer.supported and "2-D spatial data (rank 4) only" in answer.reason
    assert _conv_support("float32", (1, 3, 8, 8), (4, 3, 3, 3)).supported


def _run_light_model(name):
    path = light_model(name)
    opt = flowrt.optimize(flowrt.onnx.load(path), backends=["CpuAcc", "CpuRef"])
    assert {layer.backend for layer in opt.graph if layer.kind == "Conv"} == {"CpuAcc"}
    sess = flowrt.InferenceSession(opt)
    feeds = {a.name: pattern_input(TensorInfo(a.shape)) for a in sess.get_inputs()}
    (y,) = sess.run(None, feeds)
    return path, y


def test_squeezenet_runs_every_conv_on_cpuacc():
    # Not compared with the shipped output: the light model's weights are the same for every
    # output channel, its logits reach 1e10, and the uniform softmax it expects survives only
    # bit-identical channels; one ulp of difference in the final conv (any other summation
    # order than CpuRef's) turns it into a spike. resnet50 below is the well-conditioned check.
    _, y = _run_light_model("squeezenet")
    assert y.shape == (1, 1000, 1, 1) and np.isfinite(y).all()
    np.testing.assert_allclose(y.sum(), 1, rtol=1e-5)


def test_resnet50_runs_every_conv_on_cpuacc_and_matches_expected_output():
    path, y = _run_light_model("resnet50")
    np.testing.assert_allclose(y, expected_outputs(path)[0], **expected_tolerance(path))


async def test_a_batch_of_resnet50_images_matches_each_image_alone():
    """At batch 3 the 7x7 and 14x14 stages run each conv's images as one GEMM; every image's
    output is the one it gets alone."""
    path = light_model("resnet50")
    opt = flowrt.optimize(flowrt.onnx.load(path), backends=["CpuAcc", "CpuRef"])
    async with flowrt.Runtime(cpu_workers=2) as rt:
        model = await rt.load(opt)
        ((name, info),) = model.inputs.items()
        image = pattern_input(info)
        images = np.concatenate([image, image[:, :, ::-1], np.flip(image, axis=3)])
        alone = [(await model.run({name: images[i : i + 1]})) for i in range(3)]
        together = await (await model.batched(3)).run({name: images})
    (out,) = together
    for i, single in enumerate(alone):
        np.testing.assert_allclose(together[out][i : i + 1], single[out], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(together[out][:1], expected_outputs(path)[0], **expected_tolerance(path))
