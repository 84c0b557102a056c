"""GpuAcc Concat, Transpose and the view kinds against CpuRef."""

import numpy as np
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import flowrt
from flowrt.types import TensorInfo
from flowrt.workers.gpu.kernels.layout import ConcatKernel
from flowrt.workers.gpu.tensor import GpuTensor


@settings(max_examples=15, deadline=None)
@given(
    shape=hnp.array_shapes(min_dims=1, max_dims=4, max_side=6),
    data=st.data(),
)
def test_concat_matches_cpuref(run_both, shape, data):
    axis = data.draw(st.integers(0, len(shape) - 1))
    lengths = data.draw(st.lists(st.integers(1, 5), min_size=1, max_size=4))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    inputs = [
        rng.standard_normal(shape[:axis] + (n,) + shape[axis + 1 :]).astype(np.float32) for n in lengths
    ]
    (got,), (expected,) = run_both("Concat", flowrt.descriptors.Concat(axis=axis - len(shape)), inputs)
    np.testing.assert_array_equal(got, expected)


@settings(max_examples=15, deadline=None)
@given(shape=hnp.array_shapes(min_dims=1, max_dims=6, max_side=5), data=st.data())
def test_transpose_matches_cpuref(run_both, shape, data):
    perm = tuple(data.draw(st.permutations(range(len(shape)))))
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    (got,), (expected,) = run_both("Transpose", flowrt.descriptors.Transpose(perm=perm), [x])
    np.testing.assert_array_equal(got, expected)


@settings(max_examples=20, deadline=None)
@given(shape=hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=4), data=st.data())
def test_expand_matches_cpuref(run_both, shape, data):
    """Each dim of size 1 may grow, and leading dims may be added; the target may also name 1
    where the input is larger (ONNX's Expand broadcasts both ways)."""
    source = tuple(data.draw(st.sampled_from([s, 1])) for s in shape)
    target = [data.draw(st.sampled_from([s, 1])) if source[i] == s else s for i, s in enumerate(shape)]
    target = data.draw(st.lists(st.integers(1, 3), max_size=6 - len(shape))) + target
    x = np.arange(int(np.prod(source)), dtype=np.float32).reshape(source) - 5
    (got,), (expected,) = run_both("Expand", None, [x, np.array(target, np.int64)], (1,))
    assert got.shape == np.broadcast_shapes(source, tuple(target))
    np.testing.assert_array_equal(got, expected)


def test_reshape_and_flatten_are_views_of_the_input(gpu, run_both):
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    (got,), (expected,) = run_both("Reshape", flowrt.descriptors.Reshape(), [x, np.array([4, -1])], (1,))
    np.testing.assert_array_equal(got, expected)
    (got,), (expected,) = run_both("Flatten", flowrt.descriptors.Flatten(axis=2), [x])
    np.testing.assert_array_equal(got, expected)
    tensor = gpu.upload(x)
    view = tensor.reshape(6, 4)
    assert isinstance(view, GpuTensor) and view.buffer is tensor.buffer
    np.testing.assert_array_equal(np.asarray(view), x.reshape(6, 4))


def test_concat_copies_the_inputs_of_one_buffer_sixteen_a_launch(gpu, monkeypatch):
    """A DenseNet-like Concat of 21 pool tensors (one of them twice) over 2 images: the inputs
    lie in the memory pool's one buffer, so 16 go in one launch and the other 5 in a second."""
    calls = []
    copy = ConcatKernel._copy
    monkeypatch.setattr(
        ConcatKernel, "_copy", lambda self, q, parts, y: calls.append(len(parts)) or copy(self, q, parts, y)
    )
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((2, 3, 4, 5)))
    parts = [net.add_layer("Mul", inputs=[x, np.float32(i + 1)], name=f"mul{i}") for i in range(20)]
    net.add_output(
        "y", net.add_layer("Concat", flowrt.descriptors.Concat(axis=1), [*parts, parts[3]], name="concat")
    )
    feeds = {"x": np.random.default_rng(7).standard_normal((2, 3, 4, 5)).astype(np.float32)}

    async def run():
        async with flowrt.Runtime(cpu_workers=1) as rt:
            model = await rt.load(flowrt.optimize(net, backends=["GpuAcc"]), max_in_flight=1)
            return [(await model.run(feeds))["y"] for _ in range(3)]

    expected = np.concatenate([feeds["x"] * (i + 1) for i in [*range(20), 3]], axis=1)
    for got in trio.run(run):
        np.testing.assert_array_equal(got, expected)
    assert calls[:2] == [16, 5]


def test_a_transpose_keeping_the_last_axis_copies_runs_of_it(gpu, run_both, run_half):
    """(S, B, D) -> (B, S, D), as ViT's attention swaps its batch and sequence: the last
    axis is read in order, several values a work-item (8, 4 or 2 as D allows)."""
    for d in (24, 12, 6, 5):
        x = np.arange(7 * 3 * d, dtype=np.float32).reshape(7, 3, d)
        desc = flowrt.descriptors.Transpose(perm=(1, 0, 2))
        (got,), (expected,) = run_both("Transpose", desc, [x])
        np.testing.assert_array_equal(got, expected)
        (got,), (expected,) = run_half("Transpose", desc, [x / 64])
        np.testing.assert_array_equal(got, expected)
    # an Expand that repeats rows reads each row in order too
    x = np.arange(16, dtype=np.float32).reshape(1, 16)
    (got,), (expected,) = run_both("Expand", None, [x, np.array([3, 16], np.int64)], (1,))
    np.testing.assert_array_equal(got, expected)
