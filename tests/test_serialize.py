""".flowrt files: round trips, zero-copy weights, prepared data, the command line and the public
names (the malformed files are in test_serialize_errors.py)."""

from __future__ import annotations

import logging

import attrs
import msgpack
import numpy as np
import pytest
import trio
from fakes import PartialBackend
from netbuild import branchy_network, serializable_network

import flowrt
from flowrt import descriptors, serialize
from flowrt.cli import main
from flowrt.engine.graph.encoding import decode_value, encode_value
from flowrt.errors import FlowrtError
from flowrt.models import LIGHT_MODELS, light_model, pattern_input
from flowrt.registry import BackendRegistry
from flowrt.types import DataType, Quantization, TensorInfo
from flowrt.workers.cpu.ref import RefBackend


async def _outputs(optimized: flowrt.OptimizedNetwork) -> dict[str, np.ndarray]:
    async with flowrt.Runtime() as rt:
        model = await rt.load(optimized, max_in_flight=1)
        return await model.run({n: pattern_input(info) for n, info in model.inputs.items()})


def _same_network(a: flowrt.OptimizedNetwork, b: flowrt.OptimizedNetwork) -> None:
    assert list(b.graph.layers) == list(a.graph.layers)
    assert [x.name for x in b.graph.topological_order()] == [x.name for x in a.graph.topological_order()]
    assert (b.backends, b.passes, b.options, b.decisions) == (a.backends, a.passes, a.options, a.decisions)
    assert b.report() == a.report()
    for layer in a.graph:
        twin = b.graph.layers[layer.name]
        assert twin.kind == layer.kind and twin.backend == layer.backend
        assert twin.output_infos == layer.output_infos
        assert [repr(s.source) for s in twin.inputs] == [repr(s.source) for s in layer.inputs]
        for f in attrs.fields(type(layer.descriptor)):
            mine, theirs = getattr(layer.descriptor, f.name), getattr(twin.descriptor, f.name)
            assert type(theirs) is type(mine)
            if isinstance(mine, np.ndarray):
                assert mine.dtype.name == theirs.dtype.name and np.array_equal(mine, theirs)
            else:
                assert mine == theirs


# -- round trips --------------------------------------------------------------------------------
@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_light_model_round_trip_gives_bit_identical_outputs(name, tmp_path):
    optimized = flowrt.optimize(flowrt.onnx.load(light_model(name)), backends=["CpuRef"])
    path = tmp_path / f"{name}.flowrt"
    serialize.save(optimized, path)
    loaded = serialize.load(path)
    _same_network(optimized, loaded)
    expected, got = trio.run(_outputs, optimized), trio.run(_outputs, loaded)
    assert list(got) == list(expected)
    for key, array in expected.items():
        assert (got[key].dtype, got[key].shape) == (array.dtype, array.shape), key
        assert got[key].tobytes() == array.tobytes(), key  # bit for bit
    del loaded
    path.unlink()  # some are hundreds of MiB


@pytest.mark.parametrize("mapped", [False, True], ids=["read", "mmap"])
def test_weights_are_read_only_aligned_views_of_one_file_buffer(tmp_path, mapped):
    optimized = flowrt.optimize(flowrt.onnx.load(light_model("squeezenet")), backends=["CpuRef"])
    path = tmp_path / "squeezenet.flowrt"
    serialize.save(optimized, path)
    loaded = serialize.load(path, mmap=mapped)
    values = [layer.descriptor.value for layer in loaded.graph.of_kind("Constant")]
    roots = set()
    for value in values:
        root = value
        while isinstance(root.base, np.ndarray):
            root = root.base
        roots.add(id(root))
        assert not value.flags.writeable and not value.flags.owndata
        assert np.shares_memory(value, root) and value.ctypes.data % 64 == 0
    size = path.stat().st_size
    assert len(roots) == 1 and root.nbytes >= size
    assert root[-root.ctypes.data % 64 :][:size].tobytes() == path.read_bytes()  # the file, read once
    for layer, value in zip(optimized.graph.of_kind("Constant"), values):
        assert np.array_equal(layer.descriptor.value, value)
    expected, got = trio.run(_outputs, optimized), trio.run(_outputs, loaded)
    assert all(np.array_equal(got[key], array) for key, array in expected.items())


def test_arrays_of_every_dtype_and_shape_round_trip(tmp_path):
    arrays = {
        "scalar": np.array(1.5, np.float32),
        "empty": np.zeros((0, 3), np.int64),
        "big_endian": np.arange(4, dtype=">f4"),
        "half": np.ones((2, 2), np.float16),
        "mask": np.array([True, False]),
        "transposed": np.arange(12, dtype=np.uint16).reshape(3, 4).T,
    }
    net = flowrt.Network()
    for name, array in arrays.items():
        net.add_output(name, net.add_constant(array, name=name))
    net.add_output("again", net.add_constant(arrays["half"], name="half_again"))
    shape = net.add_constant(np.array([2, 3], np.int64), name="shape")
    fill = net.add_layer(
        "ConstantOfShape", descriptors.ConstantOfShape(value=np.array([7], np.int32)), [shape]
    )
    net.add_output("filled", fill)
    optimized = flowrt.optimize(
        net, options=flowrt.OptimizerOptions(fold_constants=False), backends=["CpuRef"]
    )
    serialize.save(optimized, tmp_path / "arrays.flowrt")
    loaded = serialize.load(tmp_path / "arrays.flowrt")
    _same_network(optimized, loaded)
    for name, array in arrays.items():
        value = loaded.graph.layers[name].descriptor.value
        assert value.shape == array.shape and np.array_equal(value, array)
        assert value.dtype == array.dtype.newbyteorder("<")  # files are little-endian
    assert loaded.graph.layers["half_again"].descriptor.value is loaded.graph.layers["half"].descriptor.value
    assert trio.run(_outputs, loaded)["filled"].tolist() == [[7, 7, 7], [7, 7, 7]]


def test_fallback_decisions_options_and_output_order_survive(tmp_path):
    registry = BackendRegistry()
    registry.register("CpuRef", RefBackend)
    registry.register("Partial", lambda: PartialBackend("Partial", {"Relu", "Add"}))
    options = flowrt.OptimizerOptions(fold_batch_norm=False, fast_math=True)
    optimized = flowrt.optimize(branchy_network(), ["Partial", "CpuRef"], options, registry=registry)
    serialize.save(optimized, tmp_path / "branchy.flowrt")
    loaded = serialize.load(tmp_path / "branchy.flowrt", registry=registry)
    _same_network(optimized, loaded)
    assert loaded.decisions["left"].declined == {"Partial": "Partial only runs Add, Relu"}

    small = flowrt.optimize(serializable_network(), backends=["CpuRef"])
    serialize.save(small, tmp_path / "small.flowrt")
    # Outputs in the graph's order ("probs" first), not the topological one ("features" first).
    assert [x.descriptor.name for x in serialize.load(tmp_path / "small.flowrt").graph.output_layers] == [
        "probs",
        "features",
    ]


def test_values_round_trip_with_their_types():
    arrays: list[np.ndarray] = []

    def store(array, where):
        arrays.append(array)
        return len(arrays) - 1

    values = [
        None,
        True,
        -(2**63),
        2**64 - 1,
        float("inf"),
        "NOTSET",
        (),
        (1, (2, (3, None)), "N"),
        np.arange(6, dtype=np.int64).reshape(2, 3),
        np.float32(0.1),
        np.bool_(True),
        DataType.FLOAT16,
        TensorInfo(("N", 3, None), DataType.UINT8, Quantization(0.5, 3)),
        TensorInfo(None, DataType.BOOL),
    ]
    for value in values:
        data = msgpack.unpackb(msgpack.packb(encode_value(value, store, "v")), strict_map_key=True)
        back = decode_value(data, lambda i, where: arrays[i], "v")
        assert type(back) is type(value)
        if isinstance(value, np.ndarray):
            assert back is value
        else:
            assert back == value and repr(back) == repr(value)


def test_unsavable_values_fail_at_save_and_leave_no_file(tmp_path):
    optimized = flowrt.optimize(serializable_network(), backends=["CpuRef"])
    clip = optimized.graph.layers["clip"]
    clip.descriptor = attrs.evolve(clip.descriptor, min=[0.0])
    with pytest.raises(
        FlowrtError, match=r"layer 'clip' \(Clip\): descriptor.min: cannot save a value of type list"
    ):
        serialize.save(optimized, tmp_path / "bad.flowrt")
    clip.descriptor = attrs.evolve(clip.descriptor, min=2**64)
    with pytest.raises(FlowrtError, match="does not fit in 64 bits"):
        serialize.save(optimized, tmp_path / "bad.flowrt")
    assert list(tmp_path.iterdir()) == []


# -- prepared data -------------------------------------------------------------------------------
def test_prepared_data_is_loaded_only_for_the_version_that_made_it(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="flowrt.serialize")
    optimized = flowrt.optimize(serializable_network(), backends=["CpuRef"])
    path = tmp_path / "small.flowrt"
    blob = bytes(range(256)) * 3
    prepared = {"CpuRef": ((1, 0), {"conv": blob, "gemm": b""}), "Acme_Npu": ((1, 0), {"conv": b"x"})}
    serialize.save(optimized, path, prepared=prepared)
    loaded = serialize.load(path)
    assert set(loaded.prepared) == {"CpuRef"}
    version, blobs = loaded.prepared["CpuRef"]
    assert version == (1, 0) and bytes(blobs["conv"]) == blob and bytes(blobs["gemm"]) == b""
    assert isinstance(blobs["conv"], memoryview) and blobs["conv"].readonly
    assert "prepared data of Acme_Npu 1.0 not used: it is not registered" in caplog.text

    serialize.save(loaded, tmp_path / "again.flowrt")  # default: what the network carries
    assert bytes(serialize.load(tmp_path / "again.flowrt").prepared["CpuRef"][1]["conv"]) == blob

    serialize.save(optimized, path, prepared={"CpuRef": ((1, 7), {"conv": blob})})
    assert serialize.load(path).prepared == {}
    assert "its registered version is (1, 0)" in caplog.text

    with pytest.raises(FlowrtError, match="names layer 'nope', which the network lacks"):
        serialize.save(optimized, path, prepared={"CpuRef": ((1, 0), {"nope": blob})})


# -- command line and public names ------------------------------------------------------------------
def test_convert_then_run_a_flowrt_file_matches_the_onnx_run(tmp_path, capsys):
    onnx_path, flowrt_path = light_model("squeezenet"), tmp_path / "sq.flowrt"
    assert main(["convert", str(onnx_path), "-o", str(flowrt_path), "--backends", "CpuRef"]) == 0
    assert f"wrote {flowrt_path}: 119 layers (CpuRef=" in capsys.readouterr().out
    assert main(["run", str(flowrt_path), "--output-dir", str(tmp_path / "a")]) == 0
    assert main(["run", str(onnx_path), "--backends", "CpuRef", "--output-dir", str(tmp_path / "b")]) == 0
    (a,), (b,) = list((tmp_path / "a").glob("*.npy")), list((tmp_path / "b").glob("*.npy"))
    assert a.name == b.name and np.array_equal(np.load(a), np.load(b))
    capsys.readouterr()
    assert main(["inspect", str(flowrt_path)]) == 0
    from_file = capsys.readouterr().out.split("\n", 1)[1]
    assert main(["inspect", str(onnx_path), "--backends", "CpuRef"]) == 0
    assert capsys.readouterr().out.split("\n", 1)[1] == from_file
    assert main(["run", str(flowrt_path), "--backends", "CpuAcc,CpuRef"]) == 2
    assert "differs from the backends" in capsys.readouterr().err
    flowrt_path.write_bytes(flowrt_path.read_bytes()[:1000])
    assert main(["run", str(flowrt_path)]) == 2
    assert "ModelLoadError: " in (err := capsys.readouterr().err) and "truncated flowrt file" in err


def test_public_names():
    assert flowrt.save is serialize.save and flowrt.load is serialize.load
    assert {"save", "load"} <= set(flowrt.__all__)
