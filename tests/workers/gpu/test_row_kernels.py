"""GpuAcc's row kernels (reduction.cl's ``*_rows``: one work-group per row) against CpuRef:
LayerNormalization, Softmax along the last axis and Reduce* over trailing axes, on rows
long enough to take them, of lengths that are and are not multiples of the work-group."""

import numpy as np
import pytest

import flowrt
from flowrt.workers.gpu.kernels import ROW_GROUP_MAX, ROW_GROUP_MIN, normalization, reduce, row_group
from flowrt.workers.gpu.kernels.reduce import REDUCE_CODES

LENGTHS = (ROW_GROUP_MIN, 37, 256, 1000, 5003)


class _Device:
    def __init__(self, limit: int) -> None:
        self.max_work_group_size = limit


def test_row_group_is_a_power_of_two_near_a_quarter_of_the_row_within_the_limits():
    assert row_group(ROW_GROUP_MIN - 1, _Device(1024)) is None
    assert row_group(ROW_GROUP_MIN, _Device(1024)) == ROW_GROUP_MIN
    assert row_group(256, _Device(1024)) == 64
    assert row_group(384, _Device(1024)) == 64
    assert row_group(768, _Device(1024)) == 128
    assert row_group(100_000, _Device(1024)) == ROW_GROUP_MAX
    assert row_group(100_000, _Device(64)) == 64
    assert row_group(100_000, _Device(16)) is None  # a device that cannot hold the smallest


@pytest.fixture
def groups(monkeypatch):
    """The work-group sizes the kernels made during the test chose (None: one work-item per row)."""
    chosen = []

    def spy(size, device):
        chosen.append(row_group(size, device))
        return chosen[-1]

    monkeypatch.setattr(normalization, "row_group", spy)
    monkeypatch.setattr(reduce, "row_group", spy)
    return chosen


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("outputs", [1, 3])
def test_layer_normalization_by_rows_matches_cpuref(run_both, groups, length, outputs):
    rng = np.random.default_rng(length)
    x = (rng.standard_normal((3, 5, length)) * 3 + 1).astype(np.float32)
    scale, bias = (rng.standard_normal(length).astype(np.float32) for _ in range(2))
    desc = flowrt.descriptors.LayerNormalization(axis=-1, epsilon=1e-5, num_outputs=outputs)
    got, expected = run_both("LayerNormalization", desc, [x, scale, bias], constant=(1, 2))
    assert groups == [row_group(length, _Device(ROW_GROUP_MAX))] and groups[0] is not None
    assert len(got) == outputs
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, e.reshape(g.shape), rtol=1e-4, atol=1e-5)


def test_layer_normalization_by_rows_over_two_axes_without_bias(run_both, groups):
    x = np.random.default_rng(1).standard_normal((4, 6, 50)).astype(np.float32)
    scale = np.float32([1.5])
    desc = flowrt.descriptors.LayerNormalization(axis=1, epsilon=1e-3)
    (got,), (expected,) = run_both("LayerNormalization", desc, [x, scale], constant=(1,))
    assert groups[0] == 64  # rows of 300 values
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("length", LENGTHS)
def test_softmax_along_the_last_axis_by_rows_matches_cpuref(run_both, groups, length):
    x = (np.random.default_rng(length).standard_normal((2, 3, length)) * 10).astype(np.float32)
    (got,), (expected,) = run_both("Softmax", flowrt.descriptors.Softmax(axis=-1), [x])
    assert groups and groups[0] is not None
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got.sum(axis=-1), 1.0, rtol=1e-5)


def test_softmax_by_rows_gives_nan_rows_where_a_row_holds_nan_and_no_overflow(run_both, groups):
    x = np.random.default_rng(0).standard_normal((3, 100)).astype(np.float32)
    x[0, 17] = np.nan
    x[1] += 1000  # exp would overflow unless shifted by the row's max
    (got,), (expected,) = run_both("Softmax", flowrt.descriptors.Softmax(axis=-1), [x])
    assert groups[0] is not None
    assert np.isnan(got[0]).all() and np.isnan(expected[0]).all()
    np.testing.assert_allclose(got[1:], expected[1:], rtol=1e-5, atol=1e-7)


def test_softmax_along_an_inner_axis_keeps_one_work_item_per_row(run_both, groups):
    x = np.random.default_rng(2).standard_normal((2, 64, 5)).astype(np.float32)
    (got,), (expected,) = run_both("Softmax", flowrt.descriptors.Softmax(axis=1), [x])
    assert groups == []  # not contiguous: the strided kernel
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("kind", sorted(REDUCE_CODES))
@pytest.mark.parametrize("length", [ROW_GROUP_MIN, 37, 1000])
def test_reduce_over_trailing_axes_by_rows_matches_cpuref(run_both, groups, kind, length):
    rng = np.random.default_rng(length)
    x = rng.standard_normal((3, 4, length)).astype(np.float32)
    if kind in ("ReduceLogSum", "ReduceProd"):
        x = np.abs(x) + 0.5 if kind == "ReduceLogSum" else (1 + 0.01 * x).astype(np.float32)
    desc = flowrt.descriptors.ReduceSum(axes=(-1,), keepdims=1)
    (got,), (expected,) = run_both(kind, desc, [x])
    assert groups == [row_group(length, _Device(ROW_GROUP_MAX))] and groups[0] is not None
    assert got.shape == expected.shape == (3, 4, 1)
    np.testing.assert_allclose(got, expected, rtol=2e-5, atol=1e-5)


def test_reduce_max_and_min_by_rows_keep_nan_as_numpy_does(run_both, groups):
    x = np.random.default_rng(3).standard_normal((2, 300)).astype(np.float32)
    x[1, 299] = np.nan
    for kind in ("ReduceMax", "ReduceMin"):
        (got,), (expected,) = run_both(kind, flowrt.descriptors.ReduceSum(axes=(1,), keepdims=0), [x])
        np.testing.assert_array_equal(got, expected)
        assert np.isnan(got[1]) and not np.isnan(got[0])
    assert groups and all(g is not None for g in groups)


def test_half_storage_layer_normalization_and_softmax_by_rows(run_half, groups):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((8, 384)).astype(np.float32)
    scale, bias = (rng.standard_normal(384).astype(np.float32) for _ in range(2))
    desc = flowrt.descriptors.LayerNormalization(axis=-1)
    (got,), (expected,) = run_half("LayerNormalization", desc, [x, scale, bias], constant=(1, 2))
    np.testing.assert_allclose(got, expected, rtol=1e-2, atol=1e-2)
    (got,), (expected,) = run_half("Softmax", flowrt.descriptors.Softmax(axis=-1), [x])
    np.testing.assert_allclose(got, expected, rtol=1e-2, atol=1e-4)
    assert groups == [64, 64]


@pytest.mark.parametrize("length", [5, *LENGTHS])
def test_rms_normalization_matches_cpuref(run_both, groups, length):
    rng = np.random.default_rng(length)
    x = (rng.standard_normal((4, 3, length)) * 3 + 1).astype(np.float32)
    scale = rng.standard_normal(length).astype(np.float32)
    desc = flowrt.descriptors.RMSNormalization(epsilon=1e-6)
    (got,), (expected,) = run_both("RMSNormalization", desc, [x, scale], constant=(1,))
    assert groups == [row_group(length, _Device(ROW_GROUP_MAX))]  # None: one work-item per row
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_rms_normalization_over_two_axes_in_half_storage(run_half, groups):
    rng = np.random.default_rng(6)
    x = rng.standard_normal((5, 4, 96)).astype(np.float32)
    scale = rng.standard_normal((4, 96)).astype(np.float32)
    desc = flowrt.descriptors.RMSNormalization(axis=1)
    (got,), (expected,) = run_half("RMSNormalization", desc, [x, scale], constant=(1,))
    assert groups == [64]  # rows of 384
    np.testing.assert_allclose(got, expected, rtol=1e-2, atol=1e-2)


def test_llamas_norm_written_out_is_one_rms_normalization_on_gpuacc():
    """transformers' LlamaRMSNorm as exported (Pow, ReduceMean, Add, Sqrt, Reciprocal, Mul,
    Mul): GpuAcc takes the fused layer, one launch, and matches ONNX Runtime."""
    import onnxruntime as ort
    import trio
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(8)
    gamma = rng.standard_normal(256).astype(np.float32)
    nodes = [
        helper.make_node("Pow", ["x", "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], keepdims=1),
        helper.make_node("Add", ["ms", "eps"], ["mse"]),
        helper.make_node("Sqrt", ["mse"], ["rms"]),
        helper.make_node("Reciprocal", ["rms"], ["inv"]),
        helper.make_node("Mul", ["x", "inv"], ["normed"]),
        helper.make_node("Mul", ["gamma", "normed"], ["y"]),
    ]
    constants = {
        "two": np.float32(2.0),
        "axes": np.array([-1], np.int64),
        "eps": np.float32(1e-6),
        "gamma": gamma,
    }
    graph = helper.make_graph(
        nodes,
        "llama_norm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 128, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 128, 256])],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in constants.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    opt = flowrt.optimize(flowrt.onnx.load(model), backends=["GpuAcc", "CpuRef"])
    (record,) = opt.substitutions
    assert (record.backend, record.kind) == ("GpuAcc", "RMSNormalization")
    assert opt.assignments() == {record.layer: "GpuAcc"}
    x = rng.standard_normal((2, 128, 256)).astype(np.float32)

    async def main():
        async with flowrt.Runtime(cpu_workers=1) as rt:
            return (await (await rt.load(opt, max_in_flight=1)).run({"x": x}))["y"]

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(trio.run(main), session.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)
