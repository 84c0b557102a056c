"""The ONNX Runtime idioms a user writes daily give, after ``import flowrt as ort``, what
onnxruntime gives: the very same code (``daily_idioms``) runs against both modules."""

from __future__ import annotations

import json
import logging
import os
import threading
import types

import numpy as np
import onnxruntime
import pytest
from ortmodels import tiny_model

import flowrt

X = np.array([[-1.0, 0.5, 2.0, -3.0], [4.0, -0.25, 0.0, 1.5]], np.float32)


def _bad_feed_errors(errors, sess) -> dict:
    """Which of the except clauses users write catch each bad feed."""
    cases = {
        "missing input": {},
        "unknown input": {"x": X, "w": X},
        "wrong shape": {"x": X[:, :3]},
        "wrong dtype": {"x": X.astype(np.float64)},
    }
    clauses = {"ValueError": ValueError, "InvalidArgument": errors.InvalidArgument, "Fail": errors.Fail}
    caught = {}
    for case, feed in cases.items():
        caught[case] = set()
        for name, clause in clauses.items():
            try:
                sess.run(None, feed)
            except clause:
                caught[case].add(name)
            except Exception:
                pass
    return caught


def daily_idioms(ort: types.ModuleType, path: str, workdir: str) -> dict:
    """ONNX Runtime code as users write it, on the module ``ort``; returns what it saw."""
    seen: dict = {}
    errors = ort.capi.onnxruntime_pybind11_state
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2  # onnxruntime needs 2 for run_async
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(workdir, ort.__name__)
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    seen["config entry"] = so.get_session_config_entry("session.intra_op.allow_spinning")
    sess = ort.InferenceSession(path, sess_options=so, providers=["CPUExecutionProvider"])
    seen["providers"] = sess.get_providers()
    seen["provider options"] = sess.get_provider_options()
    seen["inputs"] = [(i.name, i.shape, i.type) for i in sess.get_inputs()]
    seen["outputs"] = [(o.name, o.shape, o.type) for o in sess.get_outputs()]
    seen["overridable initializers"] = sess.get_overridable_initializers()
    options = sess.get_session_options()
    seen["session options"] = (options.intra_op_num_threads, int(options.graph_optimization_level))
    meta = sess.get_modelmeta()
    seen["meta"] = (
        meta.producer_name,
        meta.graph_name,
        meta.domain,
        meta.description,
        meta.graph_description,
        meta.version,
        meta.custom_metadata_map,
    )
    input_name = sess.get_inputs()[0].name
    seen["run all"] = sess.run(None, {input_name: X})
    seen["run one"] = sess.run(["z"], {input_name: X})
    ro = ort.RunOptions()
    ro.log_severity_level = 3
    ro.logid = "daily"
    seen["run with options"] = sess.run(["y"], {input_name: X}, ro)

    value = ort.OrtValue.ortvalue_from_numpy(X, "cpu", 0)
    seen["ortvalue"] = (
        value.shape(),
        value.data_type(),
        value.element_type(),
        value.device_name(),
        value.is_tensor(),
        np.shares_memory(value.numpy(), X),
    )
    outs = sess.run_with_ort_values(["y", "z"], {input_name: value})
    seen["run with ort values"] = [v.numpy() for v in outs]

    binding = sess.io_binding()
    binding.bind_cpu_input(input_name, X)
    y = np.zeros(X.shape, np.float32)
    binding.bind_output("y", "cpu", 0, np.float32, list(y.shape), y.ctypes.data)
    binding.bind_output("z")
    binding.synchronize_inputs()
    sess.run_with_iobinding(binding)
    binding.synchronize_outputs()
    seen["io binding"] = binding.copy_outputs_to_cpu()
    seen["io binding wrote into y"] = np.array_equal(y, seen["run all"][0])
    seen["io binding outputs"] = [v.shape() for v in binding.get_outputs()]

    done = threading.Event()
    results = {}

    def callback(outputs, user_data, error):
        results[user_data] = (outputs, error)
        done.set()

    sess.run_async(["z"], {input_name: X}, callback, "request")
    assert done.wait(10)
    seen["run async"] = results["request"]

    seen["bad feeds"] = _bad_feed_errors(errors, sess)
    profile = sess.end_profiling()
    with open(profile) as f:
        seen["profile is json"] = bool(json.load(f))
    sess.set_providers(["CPUExecutionProvider"])
    seen["after set_providers"] = sess.run(None, {input_name: X})

    seen["available"] = "CPUExecutionProvider" in ort.get_available_providers()
    seen["all"] = "CPUExecutionProvider" in ort.get_all_providers()
    seen["device"] = ort.get_device() in ("CPU", "GPU")
    ort.set_default_logger_severity(3)
    return seen


def _compare(got, expected, key: str) -> None:
    if isinstance(expected, np.ndarray):
        np.testing.assert_allclose(got, expected, rtol=1e-6, err_msg=key)
    elif isinstance(expected, list | tuple) and expected and not isinstance(expected, str):
        assert isinstance(got, list | tuple) and len(got) == len(expected), key
        for g, e in zip(got, expected):
            _compare(g, e, key)
    else:
        assert got == expected, key


@pytest.fixture
def restore_logger_levels():
    levels = {name: logging.getLogger(name).level for name in ("flowrt", "onnxruntime")}
    yield
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)
    onnxruntime.set_default_logger_severity(2)


def test_daily_onnxruntime_idioms_give_what_onnxruntime_gives(tmp_path, restore_logger_levels):
    path = str(tmp_path / "tiny.onnx")
    with open(path, "wb") as f:
        f.write(tiny_model().SerializeToString())
    expected = daily_idioms(onnxruntime, path, str(tmp_path))
    got = daily_idioms(flowrt, path, str(tmp_path))
    assert got.keys() == expected.keys()
    for key in expected.keys() - {"bad feeds"}:
        _compare(got[key], expected[key], key)
    for case, clauses in expected["bad feeds"].items():  # what catches onnxruntime's catches ours
        assert got["bad feeds"][case] >= clauses, case
    # What the comparison rests on: the values are there, and are what they should be.
    assert got["providers"] == ["CPUExecutionProvider"]
    assert got["inputs"] == [("x", ["batch", 4], "tensor(float)")]
    assert got["meta"][0] == "flowrt-tests" and got["meta"][-1] == {"author": "tests", "license": "none"}
    assert expected["bad feeds"]["missing input"] == {"ValueError"}
    assert expected["bad feeds"]["wrong shape"] == {"InvalidArgument"}
    assert got["run async"][1] == ""
