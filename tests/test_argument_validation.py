"""Every argument of the public API is checked where it is given: a bad one raises
ArgumentError naming the entry point, the argument, what was expected and what was found."""

import math

import numpy as np
import pytest
import trio

import flowrt
from flowrt.errors import ArgumentError, FlowrtError
from flowrt.types import Priority, TensorInfo


def _relu_net() -> flowrt.Network:
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((1, 3)))
    net.add_output("y", net.add_layer("Relu", inputs=[x], name="relu"))
    return net


X = {"x": np.array([[-1.0, 0.0, 2.0]], np.float32)}


def test_argument_error_is_a_flowrt_error_and_python_s_own_argument_errors():
    with pytest.raises(ArgumentError) as raised:
        flowrt.Runtime(cpu_workers=1.5)
    assert isinstance(raised.value, FlowrtError)
    assert isinstance(raised.value, ValueError) and isinstance(raised.value, TypeError)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"priority_aging": math.nan}, "priority_aging must be a positive finite number of seconds, got nan"),
        ({"priority_aging": math.inf}, "priority_aging must be a positive finite number of seconds, got inf"),
        ({"priority_aging": 1e300}, "priority_aging must be a positive finite number of seconds at most"),
        ({"priority_aging": 0}, "priority_aging must be a positive finite number of seconds, got 0"),
        (
            {"priority_aging": "1"},
            "priority_aging must be a positive finite number of seconds, got '1' (str)",
        ),
        ({"cpu_workers": 1.5}, "cpu_workers must be an int from 1 to 1024, got 1.5"),
        ({"cpu_workers": 0}, "cpu_workers must be an int from 1 to 1024, got 0"),
        ({"cpu_workers": True}, "cpu_workers must be an int from 1 to 1024, got True (bool)"),
        ({"cpu_workers": 10**9}, "cpu_workers must be an int from 1 to 1024, got 1000000000"),
        ({"profiling": "yes"}, "profiling must be True or False, got 'yes' (str)"),
        ({"zero_memory_on_release": 1}, "zero_memory_on_release must be True or False, got 1"),
        ({"parallel_branches": None}, "parallel_branches must be True or False, got None"),
        (
            {"tuning_mode": "fast"},
            "tuning_mode must be one of 'none', 'rapid', 'normal', 'exhaustive', got 'fast'",
        ),
        ({"tuning_file": 3}, "tuning_file must be a path"),
        ({"opencl_device": 0}, "opencl_device must be a device name (str) or None, got 0"),
        ({"backend_paths": 3}, "backend_paths must be a path or a list of paths, got 3"),
        ({"backend_paths": ["", "/tmp"]}, "backend_paths[0] must be a path"),
        ({"registry": "CpuRef"}, "registry must be a flowrt.BackendRegistry or None, got 'CpuRef' (str)"),
        ({"allocators": 3}, "allocators must be a mapping {backend id: Allocator} or None, got 3"),
    ],
)
def test_a_bad_runtime_argument_is_refused_where_it_is_given(kwargs, words):
    with pytest.raises(ArgumentError) as raised:
        flowrt.Runtime(**kwargs)
    assert str(raised.value).startswith("Runtime: ")
    assert words in str(raised.value)


def test_runtime_takes_a_tuning_mode_in_any_case_and_numpy_ints():
    rt = flowrt.Runtime(tuning_mode="RAPID", cpu_workers=np.int64(2), priority_aging=np.float32(0.5))
    assert rt.options.tuning_mode == "rapid" and rt.cpu_workers == 2 and rt.priority_aging == 0.5


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda: flowrt.optimize(_relu_net(), backends=b"CpuRef"), 'backends must be a backend id or a list of them (e.g. ["CpuAcc", "CpuRef"]), got b\'CpuRef\' (bytes)'),
        (lambda: flowrt.optimize(_relu_net(), backends=[3]), "backends must be a backend id or a list of them"),
        (lambda: flowrt.optimize(_relu_net(), options={"fast_math": True}), "options must be a flowrt.OptimizerOptions or None, got {'fast_math': True} (dict)"),
        (lambda: flowrt.optimize("model.onnx"), "network must be a flowrt.Network, got 'model.onnx' (str)"),
        (lambda: flowrt.optimize(_relu_net(), registry={}), "registry must be a flowrt.BackendRegistry or None"),
        (lambda: flowrt.OptimizerOptions(fast_math="no"), "OptimizerOptions: fast_math must be True or False, got 'no' (str)"),
        (lambda: flowrt.OptimizerOptions(fold_constants=None), "OptimizerOptions: fold_constants must be True or False, got None"),
        (lambda: flowrt.OptimizerOptions(layer_backend_hints=3), "OptimizerOptions: layer_backend_hints must be a mapping {layer name: backend id}, got 3"),
    ],
)  # fmt: skip
def test_a_bad_optimize_argument_is_refused(call, words):
    with pytest.raises(ArgumentError) as raised:
        call()
    assert words in str(raised.value)


@pytest.mark.parametrize(
    "value, expected",
    [("HIGH", Priority.HIGH), ("high", Priority.HIGH), (" Low ", Priority.LOW), ("normal", Priority.MEDIUM),
     (0, Priority.HIGH), (np.int64(2), Priority.LOW), (Priority.MEDIUM, Priority.MEDIUM)],
)  # fmt: skip
def test_a_pipeline_takes_a_priority_by_member_value_or_name(value, expected):
    assert flowrt.Pipeline([lambda outputs: outputs], priority=value).priority is expected


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"priority": "urgent"}, "priority must be a flowrt.Priority (HIGH, MEDIUM or LOW), its value 0-2 or its name, got 'urgent' (str)"),
        ({"priority": 3}, "got 3"),
        ({"priority": True}, "got True (bool)"),
        ({"names": [3]}, "Pipeline: names[0] must be a str, got 3"),
    ],
)  # fmt: skip
def test_a_bad_pipeline_argument_is_refused(kwargs, words):
    with pytest.raises(ArgumentError) as raised:
        flowrt.Pipeline([lambda outputs: outputs], **kwargs)
    assert words in str(raised.value)


async def test_a_pipeline_of_a_lone_model_not_in_a_list_is_refused():
    async with flowrt.Runtime(cpu_workers=1) as rt:
        model = await rt.load(flowrt.optimize(_relu_net(), backends=["CpuRef"]))
        with pytest.raises(
            ArgumentError,
            match=r"Pipeline: stages must be a list of loaded models and functions, got one loaded model "
            r"\(a pipeline of one stage is Pipeline\(\[stage\]\)\)",
        ):
            flowrt.Pipeline(model)  # type: ignore[arg-type]
        with pytest.raises(ArgumentError, match=r"stages must be a list .*, got one function"):
            flowrt.Pipeline(lambda outputs: outputs)  # type: ignore[arg-type]
        with pytest.raises(
            ArgumentError, match=r"Pipeline.stream: max_in_flight must be a positive int, got True \(bool\)"
        ):
            flowrt.Pipeline([model]).stream(max_in_flight=True)


async def test_bad_load_arguments_are_refused():
    opt = flowrt.optimize(_relu_net(), backends=["CpuRef"])
    async with flowrt.Runtime(cpu_workers=1) as rt:
        cases = [
            ({"max_in_flight": 0}, "max_in_flight must be a positive int, got 0"),
            ({"max_in_flight": True}, "max_in_flight must be a positive int, got True (bool)"),
            ({"batch": 2.0}, "batch must be a positive int, got 2.0"),
            ({"batch": "2"}, "batch must be a positive int, got '2' (str)"),
        ]
        for kwargs, words in cases:
            with pytest.raises(ArgumentError) as raised:
                await rt.load(opt, **kwargs)
            assert str(raised.value).startswith("Runtime.load: ") and words in str(raised.value)
        with pytest.raises(
            ArgumentError, match="optimized must be an OptimizedNetwork .from flowrt.optimize., got a Network"
        ):
            await rt.load(_relu_net())  # type: ignore[arg-type]


async def test_a_run_takes_a_priority_by_name_and_refuses_a_bad_one():
    async with flowrt.Runtime(cpu_workers=1) as rt:
        model = await rt.load(flowrt.optimize(_relu_net(), backends=["CpuRef"]))
        with trio.fail_after(10):
            for priority in ("HIGH", "low", 1):
                np.testing.assert_array_equal((await model.run(X, priority=priority))["y"], [[0, 0, 2]])
            for priority, found in (
                ("HGH", "'HGH' (str)"),
                (5, "5"),
                (-1, "-1"),
                (1.5, "1.5"),
                (None, "None"),
            ):
                with pytest.raises(
                    ArgumentError, match=r"LoadedNetwork.run: priority must be a flowrt.Priority"
                ) as raised:
                    await model.run(X, priority=priority)
                assert str(raised.value).endswith(f"got {found}")
            with pytest.raises(
                ArgumentError, match=r"LoadedNetwork.run: profile must be True or False, got 'x' \(str\)"
            ):
                await model.run(X, profile="x")
            assert model.pools.free_count == model.pools.count


async def test_bad_stream_arguments_are_refused_when_the_stream_is_made():
    async with flowrt.Runtime(cpu_workers=1) as rt:
        model = await rt.load(flowrt.optimize(_relu_net(), backends=["CpuRef"]))
        cases = [
            ({"max_delay": math.inf}, "max_delay must be a finite number of seconds >= 0, got inf"),
            (
                {"max_batch": 2, "max_delay": math.inf},
                "max_delay must be a finite number of seconds >= 0, got inf",
            ),
            ({"max_batch": 2, "max_delay": math.nan}, "got nan"),
            ({"max_batch": 2, "max_delay": -0.5}, "got -0.5"),
            ({"max_batch": True}, "max_batch must be a positive int, got True (bool)"),
            ({"max_batch": 2.0}, "max_batch must be a positive int, got 2.0"),
            ({"max_in_flight": 0}, "max_in_flight must be a positive int, got 0"),
            ({"priority": "soon"}, "priority must be a flowrt.Priority"),
        ]
        for kwargs, words in cases:
            with pytest.raises(ArgumentError) as raised:
                model.stream(**kwargs)
            assert str(raised.value).startswith("LoadedNetwork.stream: ") and words in str(raised.value)
        with trio.fail_after(10):
            async with model.stream(priority="high") as s:
                assert (await s.submit(X))["y"].tolist() == [[0, 0, 2]]
