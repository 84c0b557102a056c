"""CpuRef TensorScatter against onnx's reference, its shape inference and errors, and a KV
cache filled over two calls through the public API."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from oracle import assert_matches_reference

import flowrt
from flowrt.engine.graph.layer_kind import get_layer_kind
from flowrt.engine.graph.layers.tensor_scatter import TensorScatterDescriptor
from flowrt.errors import DataTypeError, ModelLoadError, ShapeError
from flowrt.frontends.onnx.descriptors import make_descriptor
from flowrt.types import DataType, TensorInfo
from flowrt.workers.cpu.ref.kernels import load_all

OPSET = 24


@settings(max_examples=25, deadline=None)
@given(
    data=st.data(),
    shape=st.lists(st.integers(1, 4), min_size=2, max_size=4).map(tuple),
    mode=st.sampled_from(["linear", "circular"]),
    with_indices=st.booleans(),
    dtype=st.sampled_from([np.float32, np.int64]),
)
def test_tensor_scatter_matches_reference(data, shape, mode, with_indices, dtype):
    rank = len(shape)
    axis = data.draw(st.sampled_from([a for a in range(-rank, rank) if a % rank]))
    room = shape[axis]
    length = data.draw(st.integers(0, room))
    update_shape = tuple(length if i == axis % rank else d for i, d in enumerate(shape))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31 - 1)))
    inputs = [rng.integers(-9, 9, shape).astype(dtype), rng.integers(-9, 9, update_shape).astype(dtype)]
    if with_indices:
        top = 2 * room if mode == "circular" else room - length
        inputs.append(rng.integers(0, top + 1, shape[0]).astype(np.int64))
    assert_matches_reference("TensorScatter", inputs, {"mode": mode, "axis": axis}, opset=OPSET)


def test_tensor_scatter_circular_wraps_around_the_cache():
    cache = np.zeros((1, 4, 1), np.float32)
    update = np.array([[[1], [2], [3]]], np.float32)
    desc = TensorScatterDescriptor(mode="circular", axis=1)
    present = load_all()["TensorScatter"](desc, cache, update, np.array([2]))
    np.testing.assert_array_equal(present.ravel(), [3, 0, 1, 2])


def test_tensor_scatter_linear_refuses_an_update_past_the_cache_end():
    cache, update = np.zeros((2, 4, 1), np.float32), np.ones((2, 2, 1), np.float32)
    with pytest.raises(ShapeError, match=r"write_indices in \[0, 2\] .* got values from 0 to 3"):
        load_all()["TensorScatter"](TensorScatterDescriptor(axis=1), cache, update, np.array([0, 3]))


def _infer(infos, **attributes):
    return get_layer_kind("TensorScatter").infer(
        TensorScatterDescriptor(**attributes), infos, [None] * len(infos)
    )


CACHE = TensorInfo((2, 8, 16, 4))


def test_tensor_scatter_infers_the_cache_info():
    cache = TensorInfo(("B", 8, 16, 4), DataType.FLOAT16)
    update = TensorInfo(("B", 8, "S", 4), DataType.FLOAT16)
    assert _infer([cache, update, TensorInfo(("B",), DataType.INT64)]) == [cache]


@pytest.mark.parametrize(
    "infos, attributes, error, message",
    [
        ([CACHE, TensorInfo((2, 8, 3, 4))], {"axis": 0}, ShapeError, "axis 0 is the batch axis"),
        ([CACHE, TensorInfo((2, 8, 3, 4))], {"axis": 4}, ShapeError, "axis 4 is out of range for rank 4"),
        ([CACHE, TensorInfo((2, 7, 3, 4))], {}, ShapeError, r"update \(the cache's shape .* of shape \(2, 8, \?, 4\) expected, got \(2, 7, 3, 4\)"),
        ([CACHE, TensorInfo((2, 8, 17, 4))], {}, ShapeError, r"at most the cache's 16 positions along axis 2 expected, got 17"),
        ([CACHE, TensorInfo((2, 8, 3, 4)), TensorInfo((3,), DataType.INT64)], {}, ShapeError, r"write_indices \[batch\] of shape \(2,\) expected, got \(3,\)"),
        ([CACHE, TensorInfo((2, 8, 3, 4)), TensorInfo((2,), DataType.INT32)], {}, DataTypeError, "write_indices expects one of int64, got int32"),
        ([CACHE, TensorInfo((2, 8, 3, 4), DataType.FLOAT16)], {}, DataTypeError, "inputs of one data type"),
    ],
)  # fmt: skip
def test_tensor_scatter_bad_inputs_say_what_is_wrong(infos, attributes, error, message):
    with pytest.raises(error, match=message):
        _infer(infos, **attributes)


def test_tensor_scatter_unknown_mode_fails_at_load():
    with pytest.raises(ModelLoadError, match="mode"):
        make_descriptor("TensorScatter", {"mode": "append"}, opset=OPSET, num_outputs=1)


def test_tensor_scatter_kv_cache_fills_over_two_calls_through_the_public_api():
    heads, room, size = 2, 6, 3
    graph = helper.make_graph(
        [helper.make_node("TensorScatter", ["past", "update", "at"], ["present"])],
        "kv_cache",
        [
            helper.make_tensor_value_info("past", TensorProto.FLOAT, ("B", heads, room, size)),
            helper.make_tensor_value_info("update", TensorProto.FLOAT, ("B", heads, "S", size)),
            helper.make_tensor_value_info("at", TensorProto.INT64, ("B",)),
        ],
        [helper.make_tensor_value_info("present", TensorProto.FLOAT, ("B", heads, room, size))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 10
    session = flowrt.InferenceSession(model, backends=["CpuRef"])
    rng = np.random.default_rng(24)
    prefill = rng.standard_normal((2, heads, 3, size)).astype(np.float32)
    step = rng.standard_normal((2, heads, 1, size)).astype(np.float32)
    lengths = np.array([2, 3], np.int64)  # the second entry's prompt is one token longer
    cache = np.zeros((2, heads, room, size), np.float32)
    (cache,) = session.run(None, {"past": cache, "update": prefill, "at": np.zeros(2, np.int64)})
    (cache,) = session.run(None, {"past": cache, "update": step, "at": lengths})
    np.testing.assert_array_equal(cache[0, :, :2], prefill[0, :, :2])
    np.testing.assert_array_equal(cache[0, :, 2:3], step[0])
    np.testing.assert_array_equal(cache[1, :, :3], prefill[1])
    np.testing.assert_array_equal(cache[1, :, 3:4], step[1])
    np.testing.assert_array_equal(cache[:, :, 4:], 0)
