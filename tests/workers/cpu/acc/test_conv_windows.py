"""Strided convs whose register tiles read their input windows from phase planes where they
lie (``conv/windows.py``): against CpuRef, and the planes and offsets the tiles read checked
cell by cell."""

import attrs
import numpy as np
import pytest
import trio
from kernelcases import close, conv_case
from onnx import TensorProto, helper, numpy_helper

import flowrt
from flowrt.engine.scheduler.window import SplitHint
from flowrt.registry import FusedActivation
from flowrt.workers.cpu.acc.conv import windows
from flowrt.workers.cpu.acc.conv.columns import phase_shape
from flowrt.workers.cpu.acc.conv.geometry import ConvGeometry
from flowrt.workers.cpu.acc.conv.tuning import ConvTuning
from flowrt.workers.cpu.acc.tile_ir import AVAILABLE as TILES_AVAILABLE
from flowrt.workers.cpu.acc.tile_ir import LANES

pytestmark = pytest.mark.skipif(not TILES_AVAILABLE, reason="the windows run on the register tiles")

# pixel slices of a few pixels: slices that start and end inside output rows
_MANY_SLICES = attrs.evolve(ConvTuning(), column_hint=SplitHint(axis=2, min_slice=1))

CASES = [
    ((2, 3, 41, 40), (16, 3, 7, 7), dict(strides=(2, 2), pads=(3, 3, 3, 3))),  # a stem, two images
    ((1, 3, 70, 66), (37, 3, 3, 3), dict(strides=(2, 2), pads=(1, 1, 1, 1))),  # a part-filled panel
    ((1, 20, 40, 75), (24, 20, 3, 3), dict(strides=(2, 2), pads=(1, 0, 0, 1))),  # depth 180
    ((1, 8, 35, 100), (9, 8, 3, 3), dict(strides=(2, 3), pads=(1, 1, 1, 1))),
    ((1, 4, 40, 80), (8, 4, 3, 3), dict(strides=(2, 2), dilations=(2, 2), pads=(2, 2, 2, 2))),
]
ACTS = [None, FusedActivation("Relu"), FusedActivation("Clip", -1.0, 2.0), FusedActivation("Sigmoid")]


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("tuning", [None, _MANY_SLICES], ids=["default", "many_slices"])
@pytest.mark.parametrize("activation", ACTS, ids=lambda a: a.kind if a else "none")
@pytest.mark.parametrize("x_shape, w_shape, attrs_", CASES)
def test_strided_convs_read_their_windows_where_they_lie(
    x_shape, w_shape, attrs_, activation, tuning, workers
):
    rng = np.random.default_rng(11)
    x = rng.standard_normal(x_shape, dtype=np.float32)
    w = rng.standard_normal(w_shape, dtype=np.float32)
    b = rng.standard_normal(w_shape[0], dtype=np.float32)
    kernel, got, expected = conv_case(
        x, w, b, workers=workers, activation=activation, tuning=tuning, **attrs_
    )
    assert kernel.plan(x_shape, w_shape).name == "windows"
    close(got, expected)


@pytest.mark.parametrize(
    "x_shape, w_shape, attrs_, taken",
    [
        ((1, 3, 64, 64), (16, 3, 3, 3), dict(strides=(2, 2), pads=(1, 1, 1, 1)), True),
        ((1, 3, 2 * LANES, 64), (16, 3, 3, 3), dict(strides=(2, 2), pads=(1, 1, 1, 1)), True),
        # output rows of at most a vector: narrow tiles throughout
        ((1, 3, 64, 2 * LANES), (16, 3, 3, 3), dict(strides=(2, 2), pads=(1, 1, 1, 1)), False),
        ((1, 32, 64, 64), (16, 32, 3, 3), dict(strides=(2, 2), pads=(1, 1, 1, 1)), False),  # depth 288
        ((1, 16, 64, 64), (16, 16, 1, 1), dict(strides=(2, 2)), False),  # 1x1: no phase planes
        ((1, 3, 64, 64), (16, 3, 3, 3), dict(pads=(1, 1, 1, 1)), False),  # unit strides
    ],
)
def test_windows_take_wide_strided_convs_of_one_block_of_k(x_shape, w_shape, attrs_, taken):
    geometry = ConvGeometry.of(flowrt.descriptors.Conv(**attrs_), x_shape, w_shape, 2)
    assert windows.Windows.applies(geometry, ConvTuning()) is taken
    deeper = attrs.evolve(ConvTuning(), windows_max_depth=geometry.rows - 1)
    assert not windows.Windows.applies(geometry, deeper)


@pytest.mark.parametrize("chunks", [1, 3])
@pytest.mark.parametrize(
    "x_shape, w_shape, attrs_",
    [
        ((1, 3, 23, 40), (8, 3, 7, 7), dict(strides=(2, 2), pads=(3, 3, 3, 3))),
        ((1, 4, 17, 50), (6, 2, 3, 3), dict(group=2, strides=(2, 3), pads=(1, 0, 2, 1))),
        ((1, 2, 30, 41), (4, 2, 3, 3), dict(strides=(2, 2), dilations=(2, 2), pads=(2, 2, 2, 2))),
    ],
)
def test_each_row_of_the_operand_is_read_from_its_input_cells(x_shape, w_shape, attrs_, chunks):
    """The phase planes a run of tasks makes (every cell written, the pad cells zero), read at
    ``offsets[g, r]`` plus an output pixel's place, give the input cell that pixel's kernel
    cell ``r`` sees, in each group."""
    desc = flowrt.descriptors.Conv(**attrs_)
    geometry = ConvGeometry.of(desc, x_shape, w_shape, 1)
    geo, shape = geometry.geo(), phase_shape(geometry)
    kh, kw, sh, sw, dh, dw, ph, pw, oh, ow = (int(v) for v in geo)
    rows, pitch = int(shape[0]), int(shape[1])
    x = np.random.default_rng(3).standard_normal(x_shape, dtype=np.float32)
    phases = np.full(x_shape[1] * sh * sw * rows * pitch, np.nan, np.float32)
    split = (phases, x, np.int64(rows), np.int64(pitch), np.int64(sh), np.int64(sw), np.int64(ph), np.int64(pw),
             np.int64(chunks))  # fmt: skip
    windows._SPLIT_ROWS.run(chunks, split)
    assert not np.isnan(phases).any()
    offsets = windows.window_offsets(geo, w_shape, desc.group, shape)
    assert offsets.shape == (desc.group, w_shape[1] * kh * kw)
    padded = np.zeros(
        (x_shape[1], ph + x_shape[2] + kh * dh + sh, pw + x_shape[3] + kw * dw + sw), np.float32
    )
    padded[:, ph : ph + x_shape[2], pw : pw + x_shape[3]] = x[0]
    out_h, out_w = np.meshgrid(np.arange(oh), np.arange(ow), indexing="ij")
    for g in range(desc.group):
        for r in range(offsets.shape[1]):
            c = g * w_shape[1] + r // (kh * kw)
            ki, kj = (r // kw) % kh, r % kw
            read = phases[offsets[g, r] + out_h * pitch + out_w]
            seen = padded[c, out_h * sh + ki * dh, out_w * sw + kj * dw]
            np.testing.assert_array_equal(read, seen)


def _stem_model(x_shape, w, b) -> bytes:
    nodes = [
        helper.make_node(
            "Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]
        ),
        helper.make_node("Relu", ["c"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "stem",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
        [
            helper.make_tensor_value_info(
                "y", TensorProto.FLOAT, [1, w.shape[0], x_shape[2] // 2, x_shape[3] // 2]
            )
        ],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_a_models_stem_runs_by_windows_and_matches_cpuref():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 3, 96, 96), dtype=np.float32)
    w = rng.standard_normal((24, 3, 3, 3), dtype=np.float32)
    b = rng.standard_normal(24, dtype=np.float32)
    model = _stem_model(x.shape, w, b)

    async def run(backends):
        async with flowrt.Runtime(cpu_workers=2) as rt:
            loaded = await rt.load(flowrt.optimize(flowrt.onnx.load(model), backends=backends))
            (y,) = (await loaded.run({"x": x})).values()
            plans = [
                plan
                for node in loaded.dataflow.order
                for plan in getattr(getattr(node.workload, "kernel", None), "_plans", {}).values()
            ]
            return y, [p[0].name for p in plans if isinstance(p, tuple)]

    got, names = trio.run(run, ["CpuAcc"])
    expected, _ = trio.run(run, ["CpuRef"])
    assert names == ["windows"]
    close(got, expected)
