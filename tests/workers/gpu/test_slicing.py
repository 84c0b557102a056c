"""GpuAcc Slice and Split against CpuRef."""

import numpy as np
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import flowrt
from flowrt.types import TensorInfo


@st.composite
def _slices(draw):
    """A shape, and per sliced axis a start, end and step that leave at least one element."""
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=5, max_side=7))
    axes = draw(st.lists(st.integers(0, len(shape) - 1), min_size=1, max_size=len(shape), unique=True))
    starts, ends, steps = [], [], []
    for a in axes:
        n = shape[a]
        step = draw(st.sampled_from([1, 1, 2, 3, -1, -2]))
        start = draw(st.integers(-n - 2, n + 2))
        end = draw(st.integers(-n - 2, n + 2) | st.just(2**62 if step > 0 else -(2**62)))
        if not len(range(*slice(start, end, step).indices(n))):
            start, end = (0, n) if step > 0 else (n - 1, -n - 1)
        starts.append(start), ends.append(end), steps.append(step)
    negative = draw(st.booleans())  # axes counted from the end
    axes = [a - len(shape) if negative else a for a in axes]
    return shape, [np.array(v, np.int64) for v in (starts, ends, axes, steps)]


@settings(max_examples=25, deadline=None)
@given(case=_slices(), constant=st.booleans())
def test_slice_matches_cpuref(run_both, case, constant):
    shape, params = case
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    # constants are read at load; otherwise the bounds come at each run, read on the host
    (got,), (expected,) = run_both(
        "Slice", flowrt.descriptors.Slice(), [x, *params], constant=(1, 2, 3, 4) if constant else ()
    )
    np.testing.assert_array_equal(got, expected)


def test_slice_takes_its_bounds_as_attributes_before_opset_10(run_both):
    x = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    desc = flowrt.descriptors.Slice(starts=(1, -4), ends=(3, 100), axes=(0, 2))
    (got,), (expected,) = run_both("Slice", desc, [x])
    np.testing.assert_array_equal(got, x[1:3, :, 1:])
    np.testing.assert_array_equal(got, expected)


@settings(max_examples=20, deadline=None)
@given(shape=hnp.array_shapes(min_dims=1, max_dims=4, min_side=2, max_side=8), data=st.data())
def test_split_matches_cpuref(run_both, shape, data):
    axis = data.draw(st.integers(0, len(shape) - 1))
    n = shape[axis]
    cuts = sorted(data.draw(st.sets(st.integers(1, n - 1), min_size=1, max_size=min(3, n - 1))))
    lengths = np.diff([0, *cuts, n]).astype(np.int64)
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    desc = flowrt.descriptors.Split(axis=axis, num_outputs=len(lengths))
    got, expected = run_both("Split", desc, [x, lengths], constant=(1,))
    assert len(got) == len(lengths)
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_array_equal(g, e)


@pytest.mark.parametrize("num_outputs", [2, 3])
def test_split_into_equal_pieces_without_lengths(run_both, num_outputs):
    x = np.arange(2 * 9 * 2, dtype=np.float32).reshape(2, 9, 2)
    got, expected = run_both("Split", flowrt.descriptors.Split(axis=1, num_outputs=num_outputs), [x])
    assert [g.shape[1] for g in got] == [e.shape[1] for e in expected]
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_array_equal(g, e)


@settings(max_examples=20, deadline=None)
@given(shape=hnp.array_shapes(min_dims=1, max_dims=4, max_side=6), data=st.data())
def test_gather_by_a_scalar_index_matches_cpuref(run_both, shape, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    index = np.array(data.draw(st.integers(-shape[axis], shape[axis] - 1)), np.int64)
    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    constant = data.draw(st.booleans())  # at load, or read at each run
    (got,), (expected,) = run_both(
        "Gather", flowrt.descriptors.Gather(axis=axis), [x, index], constant=(1,) if constant else ()
    )
    np.testing.assert_array_equal(got, expected)


def test_gather_by_several_indices_along_the_first_axis(run_both):
    x = np.arange(5 * 3 * 4, dtype=np.float32).reshape(5, 3, 4)
    indices = np.array([[4, 0], [-1, 2]], np.int64)
    (got,), (expected,) = run_both("Gather", flowrt.descriptors.Gather(axis=0), [x, indices], constant=(1,))
    assert got.shape == (2, 2, 3, 4)
    np.testing.assert_array_equal(got, expected)


@settings(max_examples=20, deadline=None)
@given(shape=hnp.array_shapes(min_dims=1, max_dims=4, max_side=6), data=st.data())
def test_gather_by_many_indices_along_any_axis_matches_cpuref(run_both, shape, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    index_shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=2, max_side=40))
    rng = np.random.default_rng(3)
    indices = rng.integers(-shape[axis], shape[axis], index_shape).astype(np.int64)
    x = rng.standard_normal(shape).astype(np.float32)
    constant = data.draw(st.booleans())  # at load, or read at each run
    (got,), (expected,) = run_both(
        "Gather", flowrt.descriptors.Gather(axis=axis), [x, indices], constant=(1,) if constant else ()
    )
    np.testing.assert_array_equal(got, expected)


def test_gathers_gpuacc_declines_say_why(gpu):
    from flowrt.types import TensorInfo
    from flowrt.workers.gpu.layer_support import GpuLayerSupport

    support = GpuLayerSupport()
    data, out = TensorInfo((2, 40, 8)), TensorInfo((2, 40, 8))
    many = support.is_layer_supported(
        "Gather", flowrt.descriptors.Gather(axis=1), [data, TensorInfo((40,), "int64")], [out]
    )
    assert many.supported  # one launch, whatever the count and the axis
    unknown = support.is_layer_supported(
        "Gather", flowrt.descriptors.Gather(axis=1), [data, TensorInfo(("n",), "int64")], [out]
    )
    assert not unknown.supported


async def test_a_token_embedding_lookup_runs_on_gpuacc_in_one_launch(gpu):
    rng = np.random.default_rng(4)
    table = rng.standard_normal((1000, 32)).astype(np.float32)
    net = flowrt.Network()
    ids = net.add_input("ids", flowrt.types.TensorInfo((2, 128), "int64"))
    net.add_output(
        "y", net.add_layer("Gather", flowrt.descriptors.Gather(axis=0), [table, ids], name="lookup")
    )
    opt = flowrt.optimize(net, backends=["GpuAcc", "CpuRef"])
    assert {layer.name: layer.backend for layer in opt.graph}["lookup"] == "GpuAcc"
    async with flowrt.Runtime(cpu_workers=1) as rt:
        model = await rt.load(opt)
        for seed in range(3):  # new indices each run, negative ones too
            ids_val = np.random.default_rng(seed).integers(-1000, 1000, (2, 128))
            y = (await model.run({"ids": ids_val}, profile=True))["y"]
            np.testing.assert_array_equal(y, table[ids_val])
        (record, *_) = [r for r in model.profile() if r.layer == "lookup"]
        assert record.launches == 1


async def test_a_gather_index_out_of_range_fails_the_run_with_a_clear_error(gpu):
    net = flowrt.Network()
    x = net.add_input("x", flowrt.types.TensorInfo((5, 4)))
    i = net.add_input("i", flowrt.types.TensorInfo((), "int64"))
    net.add_output("y", net.add_layer("Gather", flowrt.descriptors.Gather(axis=0), [x, i], name="gather"))
    opt = flowrt.optimize(net, backends=["GpuAcc", "CpuRef"])
    assert {layer.name: layer.backend for layer in opt.graph}["gather"] == "GpuAcc"
    x_val = np.arange(20, dtype=np.float32).reshape(5, 4)
    async with flowrt.Runtime(cpu_workers=1) as rt:
        model = await rt.load(opt)
        for index in (3, -1, 0):  # read at each run
            y = (await model.run({"x": x_val, "i": np.array(index, np.int64)}))["y"]
            np.testing.assert_array_equal(y, x_val[index])
        with pytest.raises(
            flowrt.errors.RunError, match=r"indices must lie in \[-5, 5\) along axis 0, found \[7\]"
        ):
            await model.run({"x": x_val, "i": np.array(7, np.int64)})
        y = (await model.run({"x": x_val, "i": np.array(2, np.int64)}))["y"]  # and runs on
        np.testing.assert_array_equal(y, x_val[2])


def _split_network(parts: int) -> flowrt.Network:
    """x (1, 6, 4 * parts) -> MatMul -> Split along the last axis -> each part scaled by its
    own factor -> an output each: every layer on GpuAcc, the parts in the pool's buffer."""
    rng = np.random.default_rng(5)
    width = 4 * parts
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((1, 6, width)))
    w = rng.standard_normal((width, width)).astype(np.float32)
    product = net.add_layer("MatMul", inputs=[x, w], name="mm")
    split = net.add_layer(
        "Split",
        flowrt.descriptors.Split(axis=-1, num_outputs=parts),
        [product],
        name="split",
        num_outputs=parts,
    )
    for i in range(parts):
        net.add_output(
            f"y{i}", net.add_layer("Mul", inputs=[split.outputs[i], np.float32(i + 1)], name=f"mul{i}")
        )
    return net


@pytest.mark.parametrize("parts", [3, 17])
def test_a_split_of_pool_tensors_is_one_launch_up_to_sixteen_outputs(gpu, parts):
    """GPT-2's Q, K and V out of one projection: one launch; more outputs than one launch
    takes, one each. Either way CpuRef's results."""
    feeds = {"x": np.random.default_rng(6).standard_normal((1, 6, 4 * parts)).astype(np.float32)}

    async def main(backends):
        async with flowrt.Runtime(cpu_workers=1) as rt:
            model = await rt.load(flowrt.optimize(_split_network(parts), backends=backends), max_in_flight=1)
            for _ in range(2):
                await model.run(feeds)
            out = await model.run(feeds, profile=True)
            return out, {r.layer: r.launches for r in model.profile()}

    got, launches = trio.run(main, ["GpuAcc", "CpuRef"])
    expected, _ = trio.run(main, ["CpuRef"])
    assert launches["split"] == (1 if parts <= 16 else parts)
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-5, atol=1e-5)
