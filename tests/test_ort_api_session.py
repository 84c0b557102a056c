"""InferenceSession's ONNX Runtime arguments: providers, SessionOptions, RunOptions,
metadata, profiling, and flowrt's own keywords next to them."""

from __future__ import annotations

import json
import logging
import threading
import warnings

import numpy as np
import onnxruntime
import pytest
from gatedbackend import gated_model
from ortmodels import TYPED_INPUTS, constant_subgraph_model, relu_model, tiny_model, typed_model

import flowrt
import flowrt.workers.gpu.device as opencl_device
from flowrt.defaults import gpu_device_present
from flowrt.errors import ArgumentError, BackendError, RunError
from flowrt.ort_compat import RunTerminatedError

X = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)


def _session(model=None, *args, **kwargs) -> flowrt.InferenceSession:
    model = relu_model() if model is None else model
    return flowrt.InferenceSession(model.SerializeToString(), *args, **kwargs)


def test_cpu_execution_provider_is_cpu_acc_then_cpu_ref_and_the_default(monkeypatch):
    monkeypatch.setattr(opencl_device, "gpu_device_present", lambda: False)  # with a GPU, GpuAcc comes first
    with _session(providers=["CPUExecutionProvider"]) as explicit, _session() as default:
        assert explicit.optimized.backends == default.optimized.backends == ["CpuAcc", "CpuRef"]
        assert default.get_providers() == ["CPUExecutionProvider"]
        np.testing.assert_array_equal(default.run(None, {"x": X})[0], np.maximum(X, 0))


def test_a_provider_tuple_carries_its_options():
    with _session(providers=[("CPUExecutionProvider", {"arena_extend_strategy": 1})]) as sess:
        assert sess.get_provider_options() == {"CPUExecutionProvider": {"arena_extend_strategy": "1"}}


def test_an_unknown_provider_is_a_value_error_listing_the_available_ones():
    with pytest.raises(
        ValueError, match=r"providers must be names of available providers \(.*CPUExecutionProvider"
    ):
        _session(providers=["CPUExecutionProvidr"])
    with pytest.raises(ArgumentError, match="providers must be a sequence of provider names"):
        _session(providers="CPUExecutionProvider")  # onnxruntime would try "C", "P", "U", ...


def test_an_onnxruntime_provider_flowrt_lacks_is_skipped_with_onnxruntime_s_warning():
    with pytest.warns(
        UserWarning, match="Specified provider 'CUDAExecutionProvider' is not in available provider"
    ):
        sess = _session(providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    with sess:
        assert sess.get_providers() == ["CPUExecutionProvider"]


def test_a_backend_id_is_taken_as_a_provider_and_a_plain_string_as_a_list_of_one():
    with _session(providers=["CpuRef"]) as by_provider, _session(backends="CpuRef") as by_string:
        assert by_provider.optimized.backends == by_string.optimized.backends == ["CpuRef"]
    assert flowrt.optimize(flowrt.onnx.load(relu_model()), backends="CpuRef").backends == ["CpuRef"]


def test_providers_and_backends_together_are_refused():
    with pytest.raises(ArgumentError, match="give providers= or backends=, not both"):
        _session(providers=["CPUExecutionProvider"], backends=["CpuRef"])


@pytest.mark.skipif(gpu_device_present(), reason="this machine has an OpenCL GPU")
def test_opencl_provider_without_a_gpu_is_an_error_that_says_so():
    with pytest.raises(BackendError, match="OpenCLExecutionProvider needs an OpenCL GPU device"):
        _session(providers=["OpenCLExecutionProvider"])
    assert flowrt.get_available_providers() == ["CPUExecutionProvider"]
    assert flowrt.get_device() == "CPU"


def test_flowrt_s_old_positional_backends_still_work():
    with _session(None, ["CpuRef"]) as sess:
        assert sess.optimized.backends == ["CpuRef"]
        assert isinstance(sess.get_session_options(), flowrt.SessionOptions)


def test_intra_op_num_threads_is_the_number_of_cpu_workers():
    so = flowrt.SessionOptions()
    so.intra_op_num_threads = 3
    with _session(None, so, backends=["CpuRef"]) as sess:
        assert sess._thread.value.cpu_workers == 3
        assert sess.get_session_options().intra_op_num_threads == 3
    with _session(None, so, backends=["CpuRef"], cpu_workers=1) as sess:
        assert sess._thread.value.cpu_workers == 1  # flowrt's keyword wins


def test_session_options_fields_are_checked_when_set():
    so = flowrt.SessionOptions()
    with pytest.raises(
        ArgumentError, match="SessionOptions: intra_op_num_threads must be an int >= 0, got -1"
    ):
        so.intra_op_num_threads = -1
    with pytest.raises(ArgumentError, match="GraphOptimizationLevel.ORT_DISABLE_ALL"):
        so.graph_optimization_level = 7
    with pytest.raises(ArgumentError, match="does not have configuration with key: 'missing'"):
        so.get_session_config_entry("missing")
    so.graph_optimization_level = 0
    assert so.graph_optimization_level is flowrt.GraphOptimizationLevel.ORT_DISABLE_ALL


def test_graph_optimization_level_disable_all_turns_the_graph_passes_off():
    so = flowrt.SessionOptions()
    so.graph_optimization_level = flowrt.GraphOptimizationLevel.ORT_DISABLE_ALL
    model = constant_subgraph_model()
    with _session(model, so, backends=["CpuRef"]) as plain, _session(model, backends=["CpuRef"]) as folded:
        assert "const_add" in plain.optimized.assignments()
        assert "const_add" not in folded.optimized.assignments()
        np.testing.assert_array_equal(plain.run(None, {"x": X})[0], X * 4)
        np.testing.assert_array_equal(folded.run(None, {"x": X})[0], X * 4)


def test_execution_mode_parallel_runs_branches_in_parallel():
    so = flowrt.SessionOptions()
    so.execution_mode = flowrt.ExecutionMode.ORT_PARALLEL
    with _session(tiny_model(), so, backends=["CpuRef"]) as sess:
        assert sess._thread.value.parallel_branches is True


def test_an_ignored_field_is_logged_once(caplog):
    so = flowrt.SessionOptions()
    so.enable_mem_pattern = False
    with caplog.at_level(logging.INFO, logger="flowrt"):
        _session(None, so, backends=["CpuRef"]).close()
        _session(None, so, backends=["CpuRef"]).close()
    notes = [r.getMessage() for r in caplog.records if "enable_mem_pattern" in r.getMessage()]
    assert len(notes) <= 1  # once per process: an earlier test may have logged it already
    assert all("accepted and ignored" in n for n in notes)


def test_free_dimension_override_fixes_a_symbolic_input_dim():
    so = flowrt.SessionOptions()
    so.add_free_dimension_override_by_name("batch", 2)
    with _session(tiny_model(), so, backends=["CpuRef"]) as sess:
        assert sess.get_inputs()[0].shape == [2, 4]


def test_optimized_model_filepath_saves_a_flowrt_file_a_session_loads(tmp_path):
    so = flowrt.SessionOptions()
    so.optimized_model_filepath = tmp_path / "relu.flowrt"
    _session(None, so, backends=["CpuRef"]).close()
    with flowrt.InferenceSession(tmp_path / "relu.flowrt") as sess:
        np.testing.assert_array_equal(sess.run(None, {"x": X})[0], np.maximum(X, 0))
        with pytest.raises(ArgumentError, match="set_providers: this session runs a network optimized for"):
            sess.set_providers(["CPUExecutionProvider"])


def test_run_options_terminate_cancels_a_run_in_flight():
    with gated_model() as (opt, gate), flowrt.InferenceSession(opt) as sess:
        run_options, outcome = flowrt.RunOptions(), {}
        run_options.logid = "slow one"

        def run():
            try:
                outcome["result"] = sess.run(None, {"x": np.ones(1, np.float32)}, run_options)
            except Exception as e:
                outcome["error"] = e

        runner = threading.Thread(target=run)
        runner.start()
        assert gate.wait_started()
        run_options.terminate = True
        gate.release()
        runner.join(10)
        assert not runner.is_alive()
        error = outcome.get("error")
        assert isinstance(error, RunTerminatedError) and isinstance(error, RuntimeError | RunError)
        assert "run 'slow one' terminated: RunOptions.terminate was set" in str(error)
        with pytest.raises(RunTerminatedError):  # still set: the next run ends at once
            sess.run(None, {"x": np.ones(1, np.float32)}, run_options)
        run_options.terminate = False
        np.testing.assert_array_equal(sess.run(None, {"x": np.ones(1, np.float32)}, run_options)[0], [1])
        with pytest.raises(ArgumentError, match="run_options must be a flowrt.RunOptions or None, got 'x'"):
            sess.run(None, {"x": np.ones(1, np.float32)}, "x")


def test_end_profiling_writes_a_chrome_trace_and_returns_its_path(tmp_path):
    so = flowrt.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "profile")
    with _session(None, so, backends=["CpuRef"]) as sess:
        sess.run(None, {"x": X})
        path = sess.end_profiling()
        assert path.startswith(str(tmp_path / "profile_")) and path.endswith(".json")
        with open(path) as f:
            events = json.load(f)["traceEvents"]
        assert [e["name"] for e in events if e["ph"] == "X"] == ["relu"]
        assert sess.end_profiling() == ""  # profiling ended, as in onnxruntime
    with _session(backends=["CpuRef"]) as unprofiled:
        assert unprofiled.end_profiling() == ""


def test_get_modelmeta_reads_the_onnx_model_from_a_path_bytes_or_a_proto(tmp_path):
    model = tiny_model()
    (tmp_path / "tiny.onnx").write_bytes(model.SerializeToString())
    for source in (tmp_path / "tiny.onnx", model.SerializeToString(), model):
        with flowrt.InferenceSession(source, backends=["CpuRef"]) as sess:
            meta = sess.get_modelmeta()
            assert (meta.producer_name, meta.graph_name, meta.domain) == (
                "flowrt-tests",
                "tiny",
                "ai.flowrt.test",
            )
            assert (meta.description, meta.graph_description, meta.version) == (
                "a tiny model",
                "a tiny graph",
                3,
            )
            assert meta.custom_metadata_map == {"author": "tests", "license": "none"}
    with flowrt.InferenceSession(flowrt.onnx.load(model), backends=["CpuRef"]) as sess:
        assert sess.get_modelmeta() == flowrt.ModelMetadata()


def test_node_arg_types_are_named_as_onnxruntime_names_them():
    model = typed_model()
    expected = [
        (i.name, i.type) for i in onnxruntime.InferenceSession(model.SerializeToString()).get_inputs()
    ]
    with _session(model, backends=["CpuRef"]) as sess:
        assert [(i.name, i.type) for i in sess.get_inputs()] == expected
        assert [o.type for o in sess.get_outputs()] == [t for _, t in expected]
    assert dict(expected)["f32"] == "tensor(float)" and dict(expected)["f64"] == "tensor(double)"
    assert len(expected) == len(TYPED_INPUTS)


def test_set_default_logger_severity_sets_the_flowrt_logger_level():
    logger = logging.getLogger("flowrt")
    before = logger.level
    try:
        flowrt.set_default_logger_severity(3)
        assert logger.level == logging.ERROR
        with pytest.raises(ArgumentError, match="severity must be an int from 0 to 4, got 5"):
            flowrt.set_default_logger_severity(5)
    finally:
        logger.setLevel(before)


def test_unknown_keyword_is_refused_and_onnxruntime_s_are_accepted():
    with pytest.raises(TypeError, match="unexpected keyword argument 'provider'"):
        _session(provider=["CPUExecutionProvider"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _session(backends=["CpuRef"], enable_fallback=0).close()


def test_run_async_with_terminated_run_options_calls_back_with_the_error():
    run_options, done, seen = flowrt.RunOptions(), threading.Event(), {}
    run_options.terminate = True

    def callback(outputs, user_data, error):
        seen.update(outputs=outputs, error=error)
        done.set()

    with _session(backends=["CpuRef"]) as sess:
        sess.run_async(None, {"x": X}, callback, None, run_options)
        assert done.wait(10)
    assert seen["outputs"] is None and seen["error"].startswith("RunTerminatedError: run terminated")
