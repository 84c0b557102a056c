"""CpuAcc GatherND and the logical ops (And, Or, Xor, Not) against CpuRef, and through a model
whose layers all run on CpuAcc."""

import numpy as np
import onnx
import pytest
import trio
from onnx import TensorProto, helper, numpy_helper

import flowrt
from flowrt.errors import RunError, ShapeError
from flowrt.registry import WorkloadInfo
from flowrt.types import TensorInfo
from flowrt.workers.cpu.acc.kernels import load_all as acc_kernels
from flowrt.workers.cpu.ref.kernels import load_all as ref_kernels


def _gather_nd_both(x, indices, batch_dims=0, given_out=False):
    desc = flowrt.descriptors.GatherND(batch_dims=batch_dims)
    expected = ref_kernels()["GatherND"](desc, x, indices)
    info = WorkloadInfo(
        "layer", "GatherND", desc, (TensorInfo.of(x), TensorInfo.of(indices)), (TensorInfo.of(expected),)
    )
    assert acc_kernels()["GatherND"].supports(info).supported
    kernel = acc_kernels()["GatherND"](info, 2)
    outputs = [np.empty_like(expected)] if given_out else None
    (got,) = kernel.execute([x, indices], outputs)
    return got, expected


@pytest.mark.parametrize("given_out", [False, True])
@pytest.mark.parametrize("index_type", [np.int64, np.int32])
@pytest.mark.parametrize(
    "data_shape, index_shape, batch_dims",
    [
        ((5, 4, 3), (2, 1), 0),  # whole planes
        ((5, 4, 3), (6, 2), 0),  # rows
        ((5, 4, 3), (2, 3, 3), 0),  # single elements, a grid of tuples
        ((2, 5, 4), (2, 3, 1), 1),  # a batch dim shared by data and indices
        ((2, 3, 5, 4), (2, 3, 2, 2), 2),
    ],
)
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.int8, np.bool_])
def test_gather_nd_matches_cpuref(data_shape, index_shape, batch_dims, index_type, given_out, dtype):
    rng = np.random.default_rng(sum(data_shape) + len(index_shape))
    x = (rng.standard_normal(data_shape) * 10).astype(dtype)
    k = index_shape[-1]
    dims = data_shape[batch_dims : batch_dims + k]
    # negative indices too, counted from the end of their dim
    indices = np.stack([rng.integers(-d, d, index_shape[:-1]) for d in dims], axis=-1).astype(index_type)
    got, expected = _gather_nd_both(x, indices, batch_dims, given_out)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)


def test_an_index_outside_its_dim_is_refused_with_where_it_was():
    x = np.zeros((5, 4), np.float32)
    indices = np.array([[1, 2], [3, 4]], np.int64)  # 4 is past the second dim (4)
    info = WorkloadInfo(
        "pick", "GatherND", flowrt.descriptors.GatherND(), (TensorInfo.of(x), TensorInfo.of(indices)), ()
    )
    kernel = acc_kernels()["GatherND"](info, 1)
    with pytest.raises(
        ShapeError, match=r"GatherND 'pick': indices in \[-4, 4\) expected, got 4 at \(1, 1\)"
    ):
        kernel.execute([x, indices])


@pytest.mark.parametrize("kind", ["And", "Or", "Xor"])
@pytest.mark.parametrize("shapes", [((3, 4), (3, 4)), ((1, 4), (3, 1)), ((2, 3, 4), ()), ((4,), (2, 3, 4))])
def test_logical_binary_ops_broadcast_as_cpuref(kind, shapes):
    rng = np.random.default_rng(len(shapes[0]) + len(shapes[1]))
    a, b = (rng.random(s) > 0.5 for s in shapes)
    a, b = np.asarray(a), np.asarray(b)
    desc = None  # And, Or and Xor have no attributes
    expected = {"And": np.logical_and, "Or": np.logical_or, "Xor": np.logical_xor}[kind](a, b)
    info = WorkloadInfo("layer", kind, desc, (TensorInfo.of(a), TensorInfo.of(b)), (TensorInfo.of(expected),))
    kernel = acc_kernels()[kind](info, 2)
    (got,) = kernel.execute([a, b])
    np.testing.assert_array_equal(got, expected)
    out = np.empty_like(expected)
    (into,) = kernel.execute([a, b], [out])
    assert into is out
    np.testing.assert_array_equal(out, expected)


def test_logical_ops_take_bool_only_and_refuse_shapes_that_do_not_broadcast():
    f = TensorInfo((3,), "float32")
    support = acc_kernels()["And"].supports(
        WorkloadInfo("l", "And", None, (f, f), (TensorInfo((3,), "bool"),))
    )
    assert not support.supported and "bool inputs only" in support.reason
    a, b = np.ones(3, bool), np.ones(4, bool)
    info = WorkloadInfo("l", "Or", None, (TensorInfo.of(a), TensorInfo.of(b)), ())
    with pytest.raises(ShapeError):
        acc_kernels()["Or"](info, 1).execute([a, b])


def _mask_model(path):
    # a causal mask and'ed with a padding mask, a row picked from a table by GatherND
    nodes = [
        helper.make_node("Less", ["q", "k"], ["causal"]),
        helper.make_node("Not", ["causal"], ["open"]),
        helper.make_node("And", ["open", "pad"], ["mask"]),
        helper.make_node("Where", ["mask", "scores", "low"], ["masked"]),
        helper.make_node("GatherND", ["table", "ids"], ["rows"]),
    ]
    inits = [
        numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(1, 6), "k"),
        numpy_helper.from_array(np.float32(-1e9), "low"),
        numpy_helper.from_array(
            np.random.default_rng(0).standard_normal((10, 8)).astype(np.float32), "table"
        ),
    ]
    graph = helper.make_graph(
        nodes,
        "masks",
        [
            helper.make_tensor_value_info("q", TensorProto.FLOAT, [6, 1]),
            helper.make_tensor_value_info("pad", TensorProto.BOOL, [1, 6]),
            helper.make_tensor_value_info("scores", TensorProto.FLOAT, [6, 6]),
            helper.make_tensor_value_info("ids", TensorProto.INT64, [3, 1]),
        ],
        [
            helper.make_tensor_value_info("masked", TensorProto.FLOAT, [6, 6]),
            helper.make_tensor_value_info("rows", TensorProto.FLOAT, [3, 8]),
        ],
        inits,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_a_model_of_masks_and_picks_runs_them_on_cpuacc(tmp_path):
    path = tmp_path / "masks.onnx"
    _mask_model(path)
    feeds = {
        "q": np.arange(6, dtype=np.float32).reshape(6, 1),
        "pad": np.array([[True, True, True, True, False, False]]),
        "scores": np.random.default_rng(1).standard_normal((6, 6)).astype(np.float32),
        "ids": np.array([[2], [9], [-1]], np.int64),
    }

    async def run(backends):
        opt = flowrt.optimize(flowrt.onnx.load(str(path)), backends=backends)
        async with flowrt.Runtime() as rt:
            model = await rt.load(opt)
            return opt, await model.run(feeds)

    opt, got = trio.run(run, ["CpuAcc", "CpuRef"])
    _, expected = trio.run(run, ["CpuRef"])
    kinds = {opt.graph.layers[name].kind: backend for name, backend in opt.assignments().items()}
    assert [kinds[kind] for kind in ("And", "Not", "GatherND")] == ["CpuAcc"] * 3
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name])
    bad = dict(feeds, ids=np.array([[2], [10], [0]], np.int64))

    async def run_bad():
        opt = flowrt.optimize(flowrt.onnx.load(str(path)), backends=["CpuAcc", "CpuRef"])
        async with flowrt.Runtime() as rt:
            model = await rt.load(opt)
            await model.run(bad)

    with pytest.raises(RunError, match=r"indices in \[-10, 10\) expected, got 10"):
        trio.run(run_bad)
