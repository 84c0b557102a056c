"""Overridable initializers, as ONNX Runtime has them: an initializer that a model also lists
among its graph inputs is a default value, which a run may replace by feeding it. Each test
runs the same model on onnxruntime and on flowrt."""

from __future__ import annotations

import json
import threading

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import flowrt
from flowrt.capi.onnxruntime_pybind11_state import InvalidArgument
from flowrt.errors import DataTypeError, InputError, ShapeError

X = np.array([[-1.0, 0.5, 2.0]], np.float32)
W = np.array([1.0, 2.0, 3.0], np.float32)
V = np.array([0.5, -1.0, 4.0], np.float32)
B = np.array([10.0, 20.0, 30.0], np.float32)


def _model(nodes, overridable, initializers, ir_version=8, w_dims=(3,)) -> bytes:
    """x[1, 3] -> ... -> y[1, 3]; ``overridable`` initializers are also graph inputs, declared
    with ``w_dims``."""
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])]
    inputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(w_dims)) for n in overridable]
    graph = helper.make_graph(
        nodes,
        "initializers",
        inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])],
        [numpy_helper.from_array(value, name) for name, value in initializers.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = ir_version
    return model.SerializeToString()


def add_model(**kwargs) -> bytes:
    """y = x + w, w overridable."""
    return _model([helper.make_node("Add", ["x", "w"], ["y"], name="add")], ["w"], {"w": W}, **kwargs)


def two_initializers_model() -> bytes:
    """y = (x + w) * v + b: w and v overridable, b a plain initializer."""
    nodes = [
        helper.make_node("Add", ["x", "w"], ["s"], name="add"),
        helper.make_node("Mul", ["s", "v"], ["p"], name="mul"),
        helper.make_node("Add", ["p", "b"], ["y"], name="add_b"),
    ]
    return _model(nodes, ["w", "v"], {"w": W, "v": V, "b": B})


def folded_model() -> bytes:
    """y = x * (w + b): a constant Add while w is not fed."""
    nodes = [
        helper.make_node("Add", ["w", "b"], ["c"], name="const_add"),
        helper.make_node("Mul", ["x", "c"], ["y"], name="mul"),
    ]
    return _model(nodes, ["w"], {"w": W, "b": B})


def _sessions(model: bytes, **kwargs):
    ort = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
    return ort, flowrt.InferenceSession(model, backends=["CpuRef"], **kwargs)


def _args(node_args) -> list[tuple]:
    return [(a.name, a.shape, a.type) for a in node_args]


@pytest.mark.parametrize("w_dims", [(3,), ("n",)], ids=["fixed", "symbolic"])
def test_overridable_initializers_are_the_initializers_listed_as_inputs(w_dims):
    ort, sess = _sessions(
        _model([helper.make_node("Add", ["x", "w"], ["y"])], ["w"], {"w": W}, w_dims=w_dims)
    )
    with sess:
        assert _args(sess.get_overridable_initializers()) == _args(ort.get_overridable_initializers())
        assert _args(sess.get_overridable_initializers()) == [("w", list(w_dims), "tensor(float)")]
        assert isinstance(sess.get_overridable_initializers()[0], flowrt.NodeArg)
        assert _args(sess.get_inputs()) == _args(ort.get_inputs()) == [("x", [1, 3], "tensor(float)")]


def test_a_run_uses_the_initializers_it_feeds_and_the_model_s_for_the_rest():
    ort, sess = _sessions(two_initializers_model())
    new_w, new_v = W * 3 - 1, V + 2
    feeds = [{}, {"w": new_w}, {"v": new_v}, {"w": new_w, "v": new_v}, {}, {"v": V * 0}]
    with sess:
        assert [a.name for a in sess.get_overridable_initializers()] == ["w", "v"]
        for feed in feeds:
            (expected,) = ort.run(None, {"x": X, **feed})
            (got,) = sess.run(None, {"x": X, **feed})
            np.testing.assert_allclose(got, expected, rtol=1e-6, err_msg=str(sorted(feed)))
        np.testing.assert_allclose(sess.run(None, {"x": X})[0], (X + W) * V + B, rtol=1e-6)


def test_runs_that_feed_no_initializer_keep_it_a_folded_constant():
    ort, sess = _sessions(folded_model())
    with sess:
        assert "const_add" not in sess.optimized.assignments()  # folded away: the fast path
        for feed in ({}, {"w": -W}, {}):
            (expected,) = ort.run(None, {"x": X, **feed})
            np.testing.assert_allclose(sess.run(None, {"x": X, **feed})[0], expected, rtol=1e-6)


@pytest.mark.parametrize(
    ("w", "error", "message"),
    [
        (W.astype(np.float64), DataTypeError, "input 'w' expects float32, got float64"),
        (W[None], ShapeError, r"input 'w' expects shape \(3,\), got \(1, 3\)"),
        (np.ones(4, np.float32), ShapeError, r"input 'w' expects shape \(3,\), got \(4,\)"),
    ],
    ids=["dtype", "rank", "dim"],
)
def test_a_wrong_initializer_feed_is_the_error_a_wrong_input_gets(w, error, message):
    ort, sess = _sessions(add_model())
    with pytest.raises(onnxruntime.capi.onnxruntime_pybind11_state.InvalidArgument):
        ort.run(None, {"x": X, "w": w})
    with sess, pytest.raises(error, match=message) as caught:
        sess.run(None, {"x": X, "w": w})
    assert isinstance(caught.value, InvalidArgument)


def test_feeding_only_an_initializer_is_a_missing_input_value_error():
    ort, sess = _sessions(add_model())
    with pytest.raises(ValueError, match="x"):
        ort.run(None, {"w": W})
    with sess, pytest.raises(InputError, match="missing input 'x'"):
        sess.run(None, {"w": W})


def test_before_ir_version_4_an_initializer_listed_as_input_cannot_be_fed():
    ort, sess = _sessions(add_model(ir_version=3))
    assert ort.get_overridable_initializers() == []
    with pytest.raises(onnxruntime.capi.onnxruntime_pybind11_state.InvalidArgument):
        ort.run(None, {"x": X, "w": W})
    with sess:
        assert sess.get_overridable_initializers() == []
        with pytest.raises(InputError, match="unknown input 'w'"):
            sess.run(None, {"x": X, "w": W})
        np.testing.assert_allclose(sess.run(None, {"x": X})[0], X + W)


def test_run_async_io_binding_and_ort_values_feed_initializers_too():
    _, sess = _sessions(add_model())
    expected = X - W
    with sess:
        (y,) = sess.run_with_ort_values(None, {"x": flowrt.OrtValue(X), "w": flowrt.OrtValue(-W)})
        np.testing.assert_allclose(y.numpy(), expected)

        binding = sess.io_binding()
        binding.bind_cpu_input("x", X)
        binding.bind_cpu_input("w", -W)
        binding.bind_output("y")
        sess.run_with_iobinding(binding)
        np.testing.assert_allclose(binding.copy_outputs_to_cpu()[0], expected)

        done, results = threading.Event(), []
        sess.run_async(
            None, {"x": X, "w": -W}, lambda out, data, error: (results.append((out, error)), done.set())
        )
        assert done.wait(10)
        (outputs, error) = results[0]
        assert error == ""
        np.testing.assert_allclose(outputs[0], expected)


def test_set_providers_keeps_initializers_overridable():
    _, sess = _sessions(add_model())
    with sess:
        np.testing.assert_allclose(sess.run(None, {"x": X, "w": 2 * W})[0], X + 2 * W)
        sess.set_providers(["CPUExecutionProvider"])
        np.testing.assert_allclose(sess.run(None, {"x": X, "w": 3 * W})[0], X + 3 * W)
        np.testing.assert_allclose(sess.run(None, {"x": X})[0], X + W)


def test_end_profiling_records_the_runs_that_override_initializers(tmp_path):
    so = flowrt.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "profile")
    with flowrt.InferenceSession(add_model(), so, backends=["CpuRef"]) as sess:
        sess.run(None, {"x": X})
        sess.run(None, {"x": X, "w": W})
        with open(sess.end_profiling()) as f:
            events = json.load(f)["traceEvents"]
    assert sum(e["name"] == "add" and e["ph"] == "X" for e in events) == 2


def test_a_model_from_the_cpu_provider_overrides_on_cpu_acc():
    model = add_model()
    ort = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
    with flowrt.InferenceSession(onnx.load_from_string(model), providers=["CPUExecutionProvider"]) as sess:
        for feed in ({}, {"w": W * 5}):
            (expected,) = ort.run(None, {"x": X, **feed})
            np.testing.assert_allclose(sess.run(None, {"x": X, **feed})[0], expected, rtol=1e-6)
        assert sess.optimized.assignments()["add"] == "CpuAcc"
