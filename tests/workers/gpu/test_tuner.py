"""GpuAcc's local-work-size tuner: tuning at load, the tuning file, and its errors."""

import logging

import msgpack
import numpy as np
import pytest
import trio

import flowrt
from flowrt.errors import ArgumentError, BackendError
from flowrt.types import TensorInfo
from flowrt.workers.gpu.kernels.gemm import TILINGS
from flowrt.workers.gpu.tuner import DEFAULT_LOCAL_SIZE, Tuner, TuningMode, candidate_sizes
from flowrt.workers.gpu.tuning_file import FORMAT, read_tuning_file, write_tuning_file

SHAPE = (2, 8, 40)


def _tiny_network() -> flowrt.Network:
    """Relu, a broadcast Add and a Softmax along an inner axis: three 1-D kernels (a Softmax
    along the last axis is a work-group per row, its local size not tuned)."""
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo(SHAPE))
    relu = net.add_layer("Relu", inputs=[x], name="relu")
    bias = np.linspace(-1, 1, SHAPE[-1], dtype=np.float32)
    added = net.add_layer("Add", inputs=[relu, bias], name="add")
    net.add_output("y", net.add_layer("Softmax", flowrt.descriptors.Softmax(axis=1), [added], name="softmax"))
    return net


def _feeds() -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32)}


async def _run(backends, **runtime_args):
    """(outputs, the GpuAcc tuner or None) of one load and run of the tiny network."""
    async with flowrt.Runtime(cpu_workers=1, **runtime_args) as rt:
        opt = flowrt.optimize(_tiny_network(), backends=backends)
        model = await rt.load(opt, max_in_flight=1)
        outputs = await model.run(_feeds())
        backend = rt._backends.get("GpuAcc")
        return outputs, (backend.tuner if backend is not None else None)


@pytest.fixture(scope="module")
def tuned(gpu, tmp_path_factory):
    """One rapid tuning of the tiny network: (tuning file, outputs, tuner)."""
    path = tmp_path_factory.mktemp("tuning") / "tiny.msgpack"
    outputs, tuner = trio.run(lambda: _run(["GpuAcc"], tuning_file=path, tuning_mode="rapid"))
    return path, outputs, tuner


def test_tuning_picks_a_candidate_per_kernel_and_writes_the_file(tuned, gpu):
    path, _, tuner = tuned
    kernels = {key[2] for key in tuner.entries}
    assert kernels == {"activation", "binary", "softmax"}
    assert tuner.timed >= len(tuner.entries) * 3  # every candidate of each kernel was timed
    largest = int(gpu.device.max_work_group_size)
    for (device, driver, _, global_size), (local,) in tuner.entries.items():
        assert device == gpu.device.name.strip() and driver == gpu.device.driver_version.strip()
        assert local in candidate_sizes(TuningMode.RAPID, largest, 1)
        assert global_size in {(int(np.prod(SHAPE)),), (SHAPE[0] * SHAPE[2],)}
    assert read_tuning_file(path) == tuner.entries


def test_loaded_tuning_file_means_no_timing_and_same_outputs(tuned):
    path, first, _ = tuned
    again, tuner = trio.run(lambda: _run(["GpuAcc"], tuning_file=path, tuning_mode="rapid"))
    assert tuner.timed == 0
    assert tuner.entries == read_tuning_file(path)
    reference, _ = trio.run(lambda: _run(["CpuRef"]))
    np.testing.assert_allclose(again["y"], reference["y"], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(again["y"], first["y"])


class _FakeKernel:
    function_name = "scale"

    def __init__(self) -> None:
        self.launches: list[tuple] = []

    def __call__(self, queue, global_size, local_size, *args):
        self.launches.append((global_size, local_size))


class _FakeDevice:
    name, driver_version, int_ptr = "Fake GPU ", "1.2", 1


def test_launch_uses_the_tuned_size_for_its_key_and_the_default_otherwise():
    tuner = Tuner()
    tuner.entries[("Fake GPU", "1.2", "scale", (100,))] = (32,)
    kernel = _FakeKernel()
    for n in (100, 101):
        tuner.enqueue(kernel, object(), _FakeDevice(), n, ())
    assert kernel.launches == [((128,), (32,)), ((128,), (DEFAULT_LOCAL_SIZE,))]
    assert tuner.timed == 0


def test_no_mode_and_no_file_times_nothing_and_matches_cpuref(gpu):
    outputs, tuner = trio.run(lambda: _run(["GpuAcc"]))
    assert tuner.timed == 0 and tuner.entries == {}
    reference, _ = trio.run(lambda: _run(["CpuRef"]))
    np.testing.assert_allclose(outputs["y"], reference["y"], rtol=1e-5, atol=1e-6)


def _corrupt_cases(good: bytes) -> dict[str, tuple[bytes, str]]:
    return {
        "truncated": (good[: len(good) // 2], "truncated"),
        "empty": (b"", "empty"),
        "not msgpack": (b"\xc1\xc1 not msgpack", "not valid msgpack"),
        "trailing bytes": (good + b"\x00junk", "bytes after"),
        "foreign format": (msgpack.packb({"format": "onnx", "version": 1, "entries": []}), "format"),
        "wrong version": (msgpack.packb({"format": FORMAT, "version": 99, "entries": []}), "version 1"),
        "not a map": (msgpack.packb([1, 2, 3]), "format"),
        "bad entry": (
            msgpack.packb({"format": FORMAT, "version": 1, "entries": [["dev", "1.0", "k", [0], [1]]]}),
            "entry 0",
        ),
        "zip file": (b"PK\x03\x04" + bytes(60), "msgpack"),
        # four dims are a GEMM plan's key only, and a local size has the global size's rank
        "4-d local size": (
            msgpack.packb(
                {"format": FORMAT, "version": 1, "entries": [["d", "1", "k", [8, 8, 8, 8], [1, 1, 1, 1]]]}
            ),
            "entry 0",
        ),
        "plan of 0 splits": (
            msgpack.packb(
                {
                    "format": FORMAT,
                    "version": 1,
                    "entries": [["d", "1", "gemm:plan", [8, 8, 8, 1], [64, 64, 0]]],
                }
            ),
            "entry 0",
        ),
    }


@pytest.mark.parametrize("case", list(_corrupt_cases(b"")))
def test_corrupt_tuning_file_raises_backend_error_naming_it(tuned, tmp_path, case):
    good = tuned[0].read_bytes()
    data, words = _corrupt_cases(good)[case]
    path = tmp_path / "bad.msgpack"
    path.write_bytes(data)
    with pytest.raises(BackendError, match=words) as raised:
        trio.run(lambda: _run(["GpuAcc", "CpuRef"], tuning_file=path, tuning_mode="none"))
    assert str(path) in str(raised.value)


def test_missing_file_with_mode_none_and_unknown_mode_are_errors(gpu, tmp_path):
    missing = tmp_path / "absent.msgpack"
    with pytest.raises(BackendError, match="not found"):
        trio.run(lambda: _run(["GpuAcc"], tuning_file=missing))
    with pytest.raises(
        ArgumentError, match="tuning_mode must be one of 'none', 'rapid', 'normal', 'exhaustive', got 'fast'"
    ):
        trio.run(lambda: _run(["GpuAcc"], tuning_mode="fast"))


def test_candidates_grow_with_the_mode_and_respect_the_limit():
    rapid = candidate_sizes(TuningMode.RAPID, 1024, 32)
    normal = candidate_sizes(TuningMode.NORMAL, 1024, 32)
    exhaustive = candidate_sizes(TuningMode.EXHAUSTIVE, 1024, 32)
    assert DEFAULT_LOCAL_SIZE in rapid and set(rapid) <= set(normal) < set(exhaustive)
    assert max(normal) == 1024 and 96 in exhaustive and 1 in exhaustive
    assert max(candidate_sizes(TuningMode.EXHAUSTIVE, 100, 8)) == 96


def _tiny_onnx(path) -> None:
    from onnx import TensorProto, helper, numpy_helper, save

    bias = numpy_helper.from_array(np.linspace(-1, 1, SHAPE[-1], dtype=np.float32), "bias")
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["r"]),
            helper.make_node("Add", ["r", "bias"], ["a"]),
            helper.make_node("Softmax", ["a"], ["y"], axis=1),
        ],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(SHAPE))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(SHAPE))],
        [bias],
    )
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def test_cli_tune_writes_a_tuning_file_with_a_progress_bar(gpu, tmp_path, capsys, monkeypatch):
    from flowrt.cli import main
    from flowrt.defaults import gpu_device_present
    from flowrt.progress import PROGRESS_ENV
    from flowrt.workers.gpu.device import DEVICE_ENV

    monkeypatch.setenv(PROGRESS_ENV, "1")  # the bar, though stderr is not a terminal here
    if not gpu_device_present():  # a CPU OpenCL device (PoCL) runs GpuAcc only when named
        monkeypatch.setenv(DEVICE_ENV, gpu.device.name.strip())

    model, output = tmp_path / "tiny.onnx", tmp_path / "tiny.msgpack"
    _tiny_onnx(model)
    assert main(["tune", str(model), "--mode", "rapid", "-o", str(output)]) == 0
    out, err = capsys.readouterr()
    entries = read_tuning_file(output)
    assert {key[2] for key in entries} == {"activation", "binary", "softmax"}
    assert (
        f"wrote {output}: {len(entries)} tuned local work sizes and 0 GEMM plans for 3 GpuAcc layers" in out
    )
    assert "tuning (rapid)" in err and "3/3" in err
    assert main(["tune", str(model), "--backends", "CpuRef", "-o", str(output)]) == 2
    assert "no layer of" in capsys.readouterr().err


def test_tuning_times_gemm_plans_that_a_later_load_reads(
    gpu, tmp_path, conv_network, conv_net_reference, caplog
):
    """The small CNN's 3x3 conv (an implicit GEMM), its 1x1 conv and its Gemm each get the
    fastest of the plans timed, in the file; a load with mode none uses them, timing nothing,
    and ignores (with a warning) a plan this version has no tiling for."""
    path = tmp_path / "cnn.msgpack"
    feeds, expected = conv_net_reference

    async def run(mode):
        async with flowrt.Runtime(cpu_workers=1, tuning_file=path, tuning_mode=mode) as rt:
            model = await rt.load(flowrt.optimize(conv_network(), backends=["GpuAcc"]), max_in_flight=1)
            return await model.run(feeds), rt._backends["GpuAcc"].tuner

    outputs, tuner = trio.run(run, "rapid")
    np.testing.assert_allclose(outputs["y"], expected["y"], rtol=1e-5, atol=1e-6)
    plans = {key: plan for key, plan in tuner.entries.items() if key[2].endswith(":plan")}
    assert sorted(key[2] for key in plans) == ["gemm:plan", "gemm:plan", "gemm_implicit:plan"]
    assert all(f"{rows}x{cols}" in TILINGS and splits >= 1 for rows, cols, splits in plans.values())
    assert read_tuning_file(path) == tuner.entries

    again, reader = trio.run(run, "none")
    assert reader.timed == 0
    np.testing.assert_allclose(again["y"], expected["y"], rtol=1e-5, atol=1e-6)

    (implicit,) = [key for key in plans if key[2] == "gemm_implicit:plan"]
    write_tuning_file(path, {**tuner.entries, implicit: (48, 48, 1)})
    with caplog.at_level(logging.WARNING, logger="flowrt.workers.gpu.kernels.gemm"):
        third, _ = trio.run(run, "none")
    assert "ignoring the tuned plan (48, 48, 1) of gemm_implicit" in caplog.text
    np.testing.assert_allclose(third["y"], expected["y"], rtol=1e-5, atol=1e-6)
