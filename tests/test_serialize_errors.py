"""Malformed .flowrt files: every damage, truncation, mutation or wrong metadata is a
ModelLoadError that says what was wrong, within a time bound."""

from __future__ import annotations

import contextlib
import copy
import struct
import zlib
from pathlib import Path

import msgpack
import numpy as np
import pytest
from netbuild import serializable_network
from timelimit import time_limit

import flowrt
from flowrt import serialize
from flowrt.errors import ModelLoadError
from flowrt.models import light_model

TIME_BOUND_S = 2.0


# -- errors ---------------------------------------------------------------------------------------
def _restamp(data: bytearray) -> bytearray:
    """Recompute the checksum, as a writer of the mutated file would have."""
    struct.pack_into("<I", data, 32, zlib.crc32(data[36:], zlib.crc32(data[:32])))
    return data


@pytest.fixture(scope="module")
def small_file(tmp_path_factory) -> bytes:
    path = tmp_path_factory.mktemp("small") / "small.flowrt"
    serialize.save(flowrt.optimize(serializable_network(), backends=["CpuRef"]), path)
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


def _time_bound(seconds: float) -> contextlib.AbstractContextManager[None]:
    return time_limit(seconds, lambda: _TooSlow(f"loading took over {seconds} s"))


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
