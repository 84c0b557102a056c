"""CpuAcc Expand and Tile against CpuRef: broadcasting both ways, repeats per dim and opset 1's
axis form, constant or computed shapes, planned outputs; and in a network."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import flowrt
from flowrt.registry import WorkloadInfo
from flowrt.types import TensorInfo
from flowrt.workers.cpu.acc.kernels import load_all as acc_kernels
from flowrt.workers.cpu.ref.kernels import load_all as ref_kernels


def _run_both(kind, x, shape_inputs, workers=2, constant=True, given_outputs=False):
    desc = getattr(flowrt.descriptors, kind)()
    extra = [np.array(v, np.int64) for v in shape_inputs]
    inputs = [x, *extra]
    expected = ref_kernels()[kind](desc, *inputs)
    constants = (None, *extra) if constant else (None,) * len(inputs)
    infos = tuple(TensorInfo.of(a) for a in inputs)
    info = WorkloadInfo("layer", kind, desc, infos, (TensorInfo.of(expected),), constants)
    outputs = [np.empty(expected.shape, expected.dtype)] if given_outputs else None
    (got,) = acc_kernels()[kind](info, workers).execute(inputs, outputs)
    if given_outputs:
        assert got is outputs[0]
    assert got.dtype == expected.dtype and got.shape == expected.shape
    return got, expected


@st.composite
def expand_case(draw):
    """An input and a target shape that broadcast together: each dim 1 on one side or equal,
    the target sometimes of higher rank, sometimes of lower."""
    rank = draw(st.integers(1, 4))
    dims = draw(st.lists(st.integers(0, 5), min_size=rank, max_size=rank))
    shape = [d if draw(st.booleans()) else 1 for d in dims]
    target = [d if draw(st.booleans()) else 1 for d in dims]
    if draw(st.booleans()):
        target = draw(st.lists(st.integers(1, 3), max_size=2)) + target
    else:
        target = target[draw(st.integers(0, rank - 1)) :]
    dtype = draw(st.sampled_from([np.float32, np.float32, np.int64, np.bool_]))
    return draw(hnp.arrays(dtype, tuple(shape))), target


@settings(max_examples=25, deadline=None)
@given(case=expand_case(), workers=st.integers(1, 3), constant=st.booleans(), given_outputs=st.booleans())
def test_expand_matches_cpuref(case, workers, constant, given_outputs):
    x, target = case
    got, expected = _run_both("Expand", x, [target], workers, constant, given_outputs)
    np.testing.assert_array_equal(got, expected)


@st.composite
def tile_case(draw):
    dtype = draw(st.sampled_from([np.float32, np.float32, np.int64]))
    x = draw(hnp.arrays(dtype, hnp.array_shapes(min_dims=1, max_dims=4, min_side=0, max_side=5)))
    repeats = draw(st.lists(st.integers(0, 3), min_size=x.ndim, max_size=x.ndim))
    return x, repeats


@settings(max_examples=20, deadline=None)
@given(case=tile_case(), workers=st.integers(1, 3), constant=st.booleans(), given_outputs=st.booleans())
def test_tile_matches_cpuref(case, workers, constant, given_outputs):
    x, repeats = case
    got, expected = _run_both("Tile", x, [repeats], workers, constant, given_outputs)
    np.testing.assert_array_equal(got, expected)


def test_tile_with_opset_1_axis_input():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    got, _ = _run_both("Tile", x, [[3], [-1]])
    np.testing.assert_array_equal(got, np.tile(x, (1, 3)))


def test_large_repeats_split_across_workers():
    mask = np.random.default_rng(0).standard_normal((4, 1, 1, 128), dtype=np.float32)
    got, expected = _run_both("Expand", mask, [[4, 12, 128, 128]], workers=3, given_outputs=True)
    np.testing.assert_array_equal(got, expected)
    column = np.arange(300, dtype=np.float32).reshape(300, 1)
    got, expected = _run_both("Expand", column, [[1, 300, 200]], workers=2)  # rows of one value
    np.testing.assert_array_equal(got, expected)
    got, expected = _run_both("Tile", mask[0, 0], [[256, 3]], workers=3)
    np.testing.assert_array_equal(got, expected)


def test_expand_then_tile_run_on_cpuacc():
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((3, 1, 4)))
    expand = net.add_layer("Expand", inputs=[x, np.array([2, 1, 5, 1], np.int64)], name="expand")
    tile = net.add_layer("Tile", inputs=[expand, np.array([1, 1, 2, 3], np.int64)], name="tile")
    net.add_output("y", tile)
    opt = flowrt.optimize(net, backends=["CpuAcc", "CpuRef"])
    assert opt.assignments() == {"expand": "CpuAcc", "tile": "CpuAcc"}
    data = np.random.default_rng(1).standard_normal((3, 1, 4), dtype=np.float32)
    (y,) = flowrt.InferenceSession(opt).run(None, {"x": data})
    np.testing.assert_array_equal(y, np.tile(np.broadcast_to(data, (2, 3, 5, 4)), (1, 1, 2, 3)))
