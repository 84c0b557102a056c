"""OrtValue wraps arrays without copying; IOBinding writes into the arrays bound to outputs;
bad feeds, bad model files and failed runs are caught by the except clauses users write
around onnxruntime, imported from where onnxruntime has them (``capi.onnxruntime_pybind11_state``)."""

from __future__ import annotations

import numpy as np
import onnxruntime
import pytest
from fakes import PartialBackend
from onnx import TensorProto, helper
from ortmodels import relu_model

import flowrt
from flowrt.capi.onnxruntime_pybind11_state import Fail, InvalidArgument
from flowrt.errors import ArgumentError, InputError

X = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)


@pytest.fixture
def session():
    with flowrt.InferenceSession(relu_model().SerializeToString(), backends=["CpuRef"]) as sess:
        yield sess


def test_ortvalue_wraps_the_array_without_a_copy():
    value = flowrt.OrtValue.ortvalue_from_numpy(X)
    assert value.numpy() is X
    assert (value.shape(), value.data_type(), value.element_type()) == ([2, 3], "tensor(float)", 1)
    assert value.device_name() == "cpu" and value.is_tensor() and value.data_ptr() == X.ctypes.data
    assert np.asarray(value) is X
    with pytest.raises(ArgumentError, match=r'device_type must be "cpu", or "opencl" .*got \'cuda\''):
        flowrt.OrtValue.ortvalue_from_numpy(X, "cuda", 0)


def test_run_with_ort_values_reads_inputs_in_place_and_returns_ort_values(session):
    (y,) = session.run_with_ort_values(None, {"x": flowrt.OrtValue.ortvalue_from_numpy(X)})
    assert isinstance(y, flowrt.OrtValue)
    np.testing.assert_array_equal(y.numpy(), np.maximum(X, 0))


def test_io_binding_writes_into_a_preallocated_output(session):
    binding = session.io_binding()
    binding.bind_cpu_input("x", X)
    out = np.full((2, 3), np.nan, np.float32)
    binding.bind_output("y", "cpu", 0, np.float32, [2, 3], out.ctypes.data)
    session.run_with_iobinding(binding)
    np.testing.assert_array_equal(out, np.maximum(X, 0))
    (value,) = binding.get_outputs()
    assert np.shares_memory(value.numpy(), out)
    (copy,) = binding.copy_outputs_to_cpu()
    assert not np.shares_memory(copy, out) and np.array_equal(copy, out)


def test_io_binding_to_an_ort_value_and_a_raw_input_pointer(session):
    binding = session.io_binding()
    binding.bind_input("x", "cpu", 0, np.float32, [2, 3], X.ctypes.data)
    target = flowrt.OrtValue.ortvalue_from_shape_and_type([2, 3], np.float32)
    binding.bind_ortvalue_output("y", target)
    session.run_with_iobinding(binding)
    np.testing.assert_array_equal(target.numpy(), np.maximum(X, 0))
    binding.clear_binding_outputs()
    binding.bind_output("y")  # by name: a new array per run
    session.run_with_iobinding(binding)
    (y,) = binding.copy_outputs_to_cpu()
    assert not np.shares_memory(y, target.numpy())
    np.testing.assert_array_equal(y, np.maximum(X, 0))


def test_io_binding_of_another_session_or_with_no_output_is_refused(session):
    with flowrt.InferenceSession(relu_model(), backends=["CpuRef"]) as other:
        with pytest.raises(ArgumentError, match="iobinding must be an IOBinding of this session"):
            session.run_with_iobinding(other.io_binding())
    binding = session.io_binding()
    binding.bind_cpu_input("x", X)
    with pytest.raises(InputError, match="no output is bound"):
        session.run_with_iobinding(binding)
    with pytest.raises(ArgumentError, match="element_type and shape must be given with a buffer_ptr"):
        binding.bind_output("y", "cpu", 0, None, None, X.ctypes.data)


def test_an_output_bound_with_the_wrong_shape_is_an_invalid_argument(session):
    binding = session.io_binding()
    binding.bind_cpu_input("x", X)
    binding.bind_ortvalue_output("y", flowrt.OrtValue.ortvalue_from_shape_and_type([3, 2], np.float32))
    with pytest.raises(InvalidArgument):
        session.run_with_iobinding(binding)


@pytest.mark.parametrize(
    "feeds, message",
    [
        ({}, "missing input 'x'"),
        ({"x": X, "w": X}, "unknown input 'w'"),
        ({"x": X[:, :2]}, r"input 'x' expects shape \(2, 3\)"),
        ({"x": X.astype(np.int64)}, "input 'x' expects float32, got int64"),
    ],
    ids=["missing", "unknown", "shape", "dtype"],
)
def test_bad_feeds_are_value_errors_and_invalid_arguments(session, feeds, message):
    with pytest.raises(ValueError, match=message):
        session.run(None, feeds)
    with pytest.raises(InvalidArgument, match=message):
        session.run(None, feeds)


def test_a_failed_run_is_a_runtime_error_and_a_fail():
    registry = flowrt.backend_registry()
    registry.register(
        "FailingOrtTest", lambda: PartialBackend("FailingOrtTest", {"Relu"}, fail_kinds={"Relu"})
    )
    try:
        with flowrt.InferenceSession(relu_model(), providers=["FailingOrtTest"]) as sess:
            with pytest.raises(RuntimeError, match="layer 'relu' on backend FailingOrtTest failed"):
                sess.run(None, {"x": X})
            with pytest.raises(Fail, match="deliberate failure"):
                sess.run(None, {"x": X})
    finally:
        registry.unregister("FailingOrtTest")


def _reshape_model() -> bytes:
    """y = Reshape(x[n], s[2]): a run fails when s does not fit x."""
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "s"], ["y"], name="reshape")],
        "reshape",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"]),
            helper.make_tensor_value_info("s", TensorProto.INT64, [2]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def _bad_models(tmp_path) -> dict:
    """Models neither runtime loads, by what is wrong with them."""
    relu = relu_model()
    unknown_op, dangling = relu_model(), relu_model()
    unknown_op.graph.node[0].op_type = "NoSuchOp"
    dangling.graph.node[0].input[0] = "nothing"
    (tmp_path / "garbage.onnx").write_bytes(b"\x00\xffnot a model")
    (tmp_path / "empty.onnx").write_bytes(b"")
    return {
        "missing file": str(tmp_path / "missing.onnx"),
        "garbage file": str(tmp_path / "garbage.onnx"),
        "empty file": str(tmp_path / "empty.onnx"),
        "a directory": str(tmp_path),
        "garbage bytes": b"\x00\xffnot a model",
        "truncated bytes": relu.SerializeToString()[:20],
        "unknown op": unknown_op.SerializeToString(),
        "dangling node input": dangling.SerializeToString(),
    }


def _bad_runs() -> dict:
    """(model, output names, feeds) of runs neither runtime completes."""
    relu, reshape = relu_model().SerializeToString(), _reshape_model()
    return {
        "missing input": (relu, None, {}),
        "unknown input": (relu, None, {"x": X, "w": X}),
        "wrong shape": (relu, None, {"x": X[:, :2]}),
        "wrong dtype": (relu, None, {"x": X.astype(np.float64)}),
        "unknown output": (relu, ["nothing"], {"x": X}),
        "failing layer": (reshape, None, {"x": np.ones(6, np.float32), "s": np.array([4, 4], np.int64)}),
    }


def _raised(call, *args, **kwargs) -> BaseException:
    try:
        call(*args, **kwargs)
    except Exception as e:
        return e
    raise AssertionError("nothing was raised")


def _onnxruntime_class(error: BaseException):
    """The class to catch onnxruntime's error by: its pybind11_state name, or a builtin."""
    name = type(error).__name__
    if type(error).__module__ == "builtins":
        return name, type(error)
    return name, getattr(flowrt.capi.onnxruntime_pybind11_state, name)


def test_model_load_errors_are_caught_by_the_class_onnxruntime_raises(tmp_path):
    for case, model in _bad_models(tmp_path).items():
        theirs = _raised(onnxruntime.InferenceSession, model, providers=["CPUExecutionProvider"])
        ours = _raised(flowrt.InferenceSession, model, backends=["CpuRef"])
        name, clause = _onnxruntime_class(theirs)
        assert isinstance(ours, clause), f"{case}: onnxruntime raised {name}, flowrt {ours!r}"


def test_run_errors_are_caught_by_the_class_onnxruntime_raises():
    for case, (model, names, feeds) in _bad_runs().items():
        ort = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
        theirs = _raised(ort.run, names, feeds)
        with flowrt.InferenceSession(model, backends=["CpuRef"]) as sess:
            ours = _raised(sess.run, names, feeds)
        name, clause = _onnxruntime_class(theirs)
        assert isinstance(ours, clause), f"{case}: onnxruntime raised {name}, flowrt {ours!r}"


def test_onnxruntime_s_exception_names_are_at_its_capi_path_after_import_flowrt_as_ort():
    import flowrt as ort
    from flowrt.capi import onnxruntime_pybind11_state as state
    from flowrt.ort_compat import exceptions

    assert ort.capi.onnxruntime_pybind11_state is state
    theirs = onnxruntime.capi.onnxruntime_pybind11_state
    names = {
        n
        for n in dir(theirs)
        if isinstance(getattr(theirs, n), type) and issubclass(getattr(theirs, n), Exception)
    }
    assert names <= set(state.__all__)
    for name in state.__all__:
        assert getattr(state, name) is getattr(exceptions, name), name
    with flowrt.InferenceSession(relu_model(), backends=["CpuRef"]) as sess:
        with pytest.raises(state.InvalidArgument):
            sess.run(None, {"x": X[:1]})
