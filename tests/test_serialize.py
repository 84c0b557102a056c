""".flowrt files: round trips, zero-copy weights, prepared data, and every malformation a ModelLoadError."""

from __future__ import annotations

import contextlib
import copy
import logging
import signal
import struct
import zlib
from pathlib import Path

import attrs
import msgpack
import numpy as np
import pytest
import trio
from fakes import PartialBackend
from netbuild import branchy_network

import flowrt
from flowrt import descriptors, serialize
from flowrt.cli import main
from flowrt.engine.graph.encoding import decode_value, encode_value
from flowrt.errors import FlowrtError, ModelLoadError
from flowrt.models import LIGHT_MODELS, light_model, pattern_input
from flowrt.registry import BackendRegistry
from flowrt.types import DataType, Quantization, TensorInfo
from flowrt.workers.cpu.ref import RefBackend

TIME_BOUND_S = 2.0


def small_network() -> flowrt.Network:
    """Conv, pooling, Gemm and friends on a symbolic batch, two outputs, a few KiB of weights."""
    rng = np.random.default_rng(0)
    weights = [rng.standard_normal(s).astype(np.float32) for s in ((3, 2, 3, 3), (3,), (4, 27), (4,))]
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo(("N", 2, 6, 6)))
    conv = net.add_layer("Conv", descriptors.Conv(pads=(1, 1, 1, 1)), inputs=[x, *weights[:2]], name="conv")
    relu = net.add_layer("Relu", inputs=[conv], name="relu")
    pool = net.add_layer("MaxPool", descriptors.MaxPool(kernel_shape=(2, 2), strides=(2, 2)), inputs=[relu])
    flat = net.add_layer("Flatten", inputs=[pool], name="flat")
    gemm = net.add_layer("Gemm", descriptors.Gemm(transB=1), inputs=[flat, *weights[2:]], name="gemm")
    clip = net.add_layer("Clip", descriptors.Clip(min=-1.0), inputs=[gemm], name="clip")
    soft = net.add_layer("Softmax", inputs=[clip], name="softmax")
    net.add_output("probs", soft)
    net.add_output("features", pool)
    return net


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
    optimized = flowrt.optimize(net, options=flowrt.OptimizerOptions(fold_constants=False))
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

    small = flowrt.optimize(small_network())
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
    optimized = flowrt.optimize(small_network())
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
    optimized = flowrt.optimize(small_network())
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


# -- errors ---------------------------------------------------------------------------------------
def _restamp(data: bytearray) -> bytearray:
    """Recompute the checksum, as a writer of the mutated file would have."""
    struct.pack_into("<I", data, 32, zlib.crc32(data[36:], zlib.crc32(data[:32])))
    return data


@pytest.fixture(scope="module")
def small_file(tmp_path_factory) -> bytes:
    path = tmp_path_factory.mktemp("small") / "small.flowrt"
    serialize.save(flowrt.optimize(small_network()), path)
    return path.read_bytes()


def _error(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    with pytest.raises(ModelLoadError) as info:
        serialize.load(path)
    return str(info.value)


def test_wrong_magic_newer_version_truncation_and_damage_each_say_so(tmp_path, small_file):
    path = tmp_path / "m.flowrt"
    onnx_bytes = light_model("squeezenet").read_bytes()
    assert "not a flowrt file: it starts with b'\\x08" in _error(path, onnx_bytes)
    assert f"{path} is empty" in _error(path, b"")
    newer = bytearray(small_file)
    struct.pack_into("<H", newer, 8, 2)
    message = _error(path, bytes(_restamp(newer)))
    assert "newer flowrt file format: format version 2 (written by flowrt 0.1.0)" in message
    for cut in (3, 40, 100, len(small_file) - 1):
        message = _error(path, small_file[:cut])
        assert f"{path}: truncated flowrt file" in message, cut
    assert "inside the 64-byte header" in _error(path, small_file[:40])
    damaged = bytearray(small_file)
    damaged[-5] ^= 0x10
    assert "corrupt flowrt file: checksum mismatch" in _error(path, bytes(damaged))
    assert "bytes follow the end its header declares" in _error(path, small_file + b"\0")
    api = bytearray(small_file)
    struct.pack_into("<H", api, 10, 2)
    assert "incompatible flowrt file: written for Backend API 2.0" in _error(path, bytes(_restamp(api)))
    with pytest.raises(ModelLoadError, match="does not exist"):
        serialize.load(tmp_path / "missing.flowrt")
    with pytest.raises(ModelLoadError, match="is not a regular file"):
        serialize.load(tmp_path)


def test_metadata_errors_name_the_field(tmp_path, small_file):
    metadata = _metadata(small_file)
    conv = next(layer for layer in metadata["layers"] if layer["kind"] == "Conv")
    conv["descriptor"]["strides"] = ["tuple", [0, 1]]
    message = _error(tmp_path / "m.flowrt", _with_metadata(small_file, metadata))
    assert "corrupt flowrt file: metadata (bytes 64-" in message
    assert "'conv' (Conv): descriptor: not a valid ConvDescriptor" in message
    conv["descriptor"]["strides"] = None
    conv["kind"] = "Convolution9000"
    assert "unknown layer kind 'Convolution9000'" in _error(
        tmp_path / "m.flowrt", _with_metadata(small_file, metadata)
    )


class _TooSlow(BaseException):  # not an Exception: load must not turn it into a ModelLoadError
    pass


@contextlib.contextmanager
def _time_bound(seconds: float):
    def alarm(signum, frame):
        raise _TooSlow(f"loading took over {seconds} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _outcome(path: Path, data: bytes) -> str:
    """'error' (ModelLoadError) or 'loaded'; anything else, or a load past the bound, fails the test."""
    path.write_bytes(data)
    with _time_bound(TIME_BOUND_S):
        try:
            loaded = serialize.load(path)
        except ModelLoadError:
            return "error"
    loaded.report()
    return "loaded"


def _metadata(data: bytes) -> dict:
    (length,) = struct.unpack_from("<Q", data, 24)
    return msgpack.unpackb(data[64 : 64 + length], strict_map_key=True)


def _with_metadata(data: bytes, metadata: dict) -> bytes:
    """``data`` with its metadata replaced, header lengths and checksum made to match."""
    (old,) = struct.unpack_from("<Q", data, 24)
    body = msgpack.packb(metadata)
    start = -(-(64 + len(body)) // 64) * 64
    tensors = data[-(-(64 + old) // 64) * 64 :]
    out = bytearray(data[:64]) + body + bytes(start - 64 - len(body)) + tensors
    struct.pack_into("<QQ", out, 16, len(out), len(body))
    return bytes(_restamp(out))


def _mutate_bytes(data: bytes, rng: np.random.Generator) -> bytearray:
    out = bytearray(data)
    kind = rng.integers(5)
    if kind == 0:  # bit flips anywhere
        for at in rng.integers(0, len(out), rng.integers(1, 9)):
            out[at] ^= 1 << int(rng.integers(8))
    elif kind == 1:  # truncation
        del out[int(rng.integers(0, len(out))) :]
    elif kind == 2:  # a header field overwritten
        at = int(rng.choice([8, 10, 12, 14, 16, 24, 32, 36]))
        out[at : at + 2] = bytes(((out[at] + int(rng.integers(1, 256))) % 256, int(rng.integers(256))))
    elif kind == 3:  # bytes inserted or removed
        at = int(rng.integers(0, len(out)))
        if rng.integers(2):
            out[at:at] = rng.integers(0, 256, int(rng.integers(1, 64)), dtype=np.uint8).tobytes()
        else:
            del out[at : at + int(rng.integers(1, 64))]
    else:  # a run of junk
        at = int(rng.integers(0, len(out)))
        out[at : at + 16] = rng.integers(0, 256, 16, dtype=np.uint8).tobytes()
    return out


def test_mutated_files_all_give_model_load_error_within_the_time_bound(tmp_path, small_file):
    rng = np.random.default_rng(20240501)
    path = tmp_path / "m.flowrt"
    for i in range(300):
        mutated = _mutate_bytes(small_file, rng)
        if mutated == small_file:
            continue
        assert _outcome(path, bytes(mutated)) == "error", i


_ODD_VALUES = [
    None,
    True,
    -1,
    0,
    7,
    2**63 - 1,
    1.5,
    float("nan"),
    "",
    "Conv",
    b"\x00",
    [],
    {},
    ["tuple", [1]],
    ["array", 0],
    ["array", 10**6],
    ["scalar", ["int8", 300]],
    ["DataType", "nope"],
    ["TensorInfo", {"shape": None}],
    ["TensorInfo", {"shape": ["tuple", [2**62, 2**62]]}],
    ["Nope", 1],
    [[1, 2], 3],
    {"": None},
]


def _nested(depth: int):
    value: object = 1
    for _ in range(depth):
        value = ["tuple", [value]]
    return value


def _nodes(tree, found):
    items = tree.items() if isinstance(tree, dict) else enumerate(tree)
    for key, value in items:
        found.append((tree, key))
        if isinstance(value, dict | list):
            _nodes(value, found)
    return found


def _mutate_tree(metadata: dict, rng: np.random.Generator) -> dict:
    tree = copy.deepcopy(metadata)
    nodes = _nodes(tree, [])
    for _ in range(int(rng.integers(1, 4))):
        container, key = nodes[int(rng.integers(len(nodes)))]
        action = rng.integers(4)
        if action == 0:
            container[key] = copy.deepcopy(_ODD_VALUES[int(rng.integers(len(_ODD_VALUES)))])
        elif action == 1 and isinstance(container, dict):
            del container[key]
        elif action == 2:
            other, other_key = nodes[int(rng.integers(len(nodes)))]
            container[key] = copy.deepcopy(other[other_key])
        else:
            value = container[key]
            container[key] = (
                value + int(rng.choice([-1, 1, 64, 10**9])) if type(value) is int else _nested(40)
            )
        nodes = _nodes(tree, [])
    return tree


def test_well_formed_but_wrong_metadata_gives_model_load_error_or_a_network(tmp_path, small_file):
    """Files whose checksum matches (as a buggy or hostile writer would make them): the decoder
    itself must refuse what is malformed, and never raise anything else or hang."""
    rng = np.random.default_rng(7)
    path = tmp_path / "m.flowrt"
    metadata = _metadata(small_file)
    outcomes = []
    for _ in range(250):
        outcomes.append(_outcome(path, _with_metadata(small_file, _mutate_tree(metadata, rng))))
    for _ in range(150):  # raw flips in the header and the metadata, checksum restamped
        mutated = bytearray(small_file)
        for at in rng.integers(8, 64 + 200, int(rng.integers(1, 4))):
            mutated[at] ^= 1 << int(rng.integers(8))
        outcomes.append(_outcome(path, bytes(_restamp(mutated))))
    assert outcomes.count("error") > 0.7 * len(outcomes)


# -- command line and public names ------------------------------------------------------------------
def test_convert_then_run_a_flowrt_file_matches_the_onnx_run(tmp_path, capsys):
    onnx_path, flowrt_path = light_model("squeezenet"), tmp_path / "sq.flowrt"
    assert main(["convert", str(onnx_path), "-o", str(flowrt_path), "--backends", "CpuRef"]) == 0
    assert f"wrote {flowrt_path}: 119 layers (CpuRef=" in capsys.readouterr().out
    assert main(["run", str(flowrt_path), "--output-dir", str(tmp_path / "a")]) == 0
    assert main(["run", str(onnx_path), "--output-dir", str(tmp_path / "b")]) == 0
    (a,), (b,) = list((tmp_path / "a").glob("*.npy")), list((tmp_path / "b").glob("*.npy"))
    assert a.name == b.name and np.array_equal(np.load(a), np.load(b))
    capsys.readouterr()
    assert main(["inspect", str(flowrt_path)]) == 0
    from_file = capsys.readouterr().out.split("\n", 1)[1]
    assert main(["inspect", str(onnx_path)]) == 0
    assert capsys.readouterr().out.split("\n", 1)[1] == from_file
    assert main(["run", str(flowrt_path), "--backends", "CpuAcc,CpuRef"]) == 2
    assert "differs from the backends" in capsys.readouterr().err
    flowrt_path.write_bytes(flowrt_path.read_bytes()[:1000])
    assert main(["run", str(flowrt_path)]) == 2
    assert "ModelLoadError: " in (err := capsys.readouterr().err) and "truncated flowrt file" in err


def test_public_names():
    assert flowrt.save is serialize.save and flowrt.load is serialize.load
    assert {"save", "load"} <= set(flowrt.__all__)
