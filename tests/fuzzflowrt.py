"""Seeded mutations of a small .flowrt file, for the fuzz tests (see ``fuzzmodels`` for the
byte-level ones and the ONNX side), and RefFusing: CpuRef's kernels behind a backend that
fuses activations, so that a file carries fused activations without kernels to compile.

Metadata mutations unpack the file's msgpack map, change one field and pack it again with
its lengths and checksum made right, as a writer of such a file (or a hand edit) would.
"""

from __future__ import annotations

import copy
import struct
import zlib

import msgpack
import numpy as np
from fuzzmodels import BYTE_MUTATIONS, STRANGE_TEXT, Mutation, pick

from flowrt.engine.graph.layer_kind import known_layer_kinds
from flowrt.registry import BackendRegistry, FusedActivation, WorkloadInfo
from flowrt.workers.cpu.ref import RefBackend
from flowrt.workers.cpu.ref.kernels import load_all


# -- RefFusing ----------------------------------------------
def apply_activation(activation: FusedActivation, y: np.ndarray) -> np.ndarray:
    """``y`` through a fused activation, in numpy."""
    kind, alpha, beta = activation.kind, activation.alpha, activation.beta
    with np.errstate(all="ignore"):
        result = {
            "Relu": lambda: np.maximum(y, 0),
            "LeakyRelu": lambda: np.where(y > 0, y, y * alpha),
            "Clip": lambda: np.minimum(np.maximum(y, alpha), beta),
            "Sigmoid": lambda: 1 / (1 + np.exp(-y)),
            "Tanh": lambda: np.tanh(y),
        }[kind]()
    return np.asarray(result).astype(y.dtype)


class _FusingWorkload:
    def __init__(self, info: WorkloadInfo) -> None:
        self.info, self.kernel = info, load_all()[info.kind]

    def prepare(self) -> None:
        pass

    def execute(self, inputs):
        result = self.kernel(self.info.descriptor, *inputs)
        outputs = [np.asarray(o) for o in (result if isinstance(result, (tuple, list)) else (result,))]
        if self.info.activation is not None:
            outputs[0] = apply_activation(self.info.activation, outputs[0])
        return outputs


class _FusingFactory:
    def create_workload(self, info: WorkloadInfo) -> _FusingWorkload:
        return _FusingWorkload(info)


class FusingRefBackend(RefBackend):
    """CpuRef's kernels, fused activations applied after Conv, Gemm, MatMul and Add: a file
    optimized for it carries fused activations without any kernel to compile."""

    id = "RefFusing"

    @property
    def capabilities(self):
        return {**super().capabilities, "fused_activation": frozenset({"Conv", "Gemm", "MatMul", "Add"})}

    def create_workload_factory(self, memory_manager=None) -> _FusingFactory:
        return _FusingFactory()


def fuzz_registry(full: bool) -> BackendRegistry:
    """CpuRef and RefFusing; with ``full``, every backend of the process too (CpuAcc, GpuAcc)."""
    from flowrt import backend_registry

    registry = backend_registry().copy() if full else BackendRegistry()
    if not full:
        registry.register("CpuRef", RefBackend)
    registry.register("RefFusing", FusingRefBackend)
    return registry


# -- .flowrt: structural mutations -----------------------------------------------------------------
def _align(n: int) -> int:
    return -(-n // 64) * 64


def split_flowrt(data: bytes) -> tuple[dict, bytes]:
    """The metadata map and the data section of a .flowrt file."""
    metadata_length = struct.unpack_from("<Q", data, 24)[0]
    metadata = msgpack.unpackb(data[64 : 64 + metadata_length], raw=False)
    return metadata, data[_align(64 + metadata_length) :]


def join_flowrt(header: bytes, metadata: dict, section: bytes) -> bytes:
    """A .flowrt file of ``metadata`` and ``section``, its lengths and checksum made right."""
    body = msgpack.packb(metadata, use_bin_type=True)
    start = _align(64 + len(body))
    out = bytearray(header[:64]) + body + bytes(start - 64 - len(body)) + section
    struct.pack_into("<Q", out, 16, len(out))
    struct.pack_into("<Q", out, 24, len(body))
    return restamp(out)


def restamp(data: bytearray) -> bytes:
    """Recompute the checksum, as a writer of the mutated file would have."""
    struct.pack_into("<I", data, 32, zlib.crc32(data[36:], zlib.crc32(data[:32])))
    return bytes(data)


def _random_value(rng: np.random.Generator, depth: int = 0):
    choices = [
        None,
        True,
        -1,
        0,
        3,
        2**40,
        2**63 - 1,
        -(2**63),
        0.5,
        float("nan"),
        float("inf"),
        "",
        "Relu",
        "\u00e9\u4e2d",
        ["tuple", [1, 2]],
        ["array", 0],
        ["array", 999],
        ["scalar", ["float32", 1.5]],
        ["DataType", "int64"],
        ["FusedActivation", {"kind": "Relu"}],
        ["nope", 1],
        {"k": 1},
        [1, 2, 3],
    ]
    value = pick(rng, choices)
    if depth < 2 and rng.random() < 0.1:
        return ["tuple", [_random_value(rng, depth + 1) for _ in range(int(rng.integers(0, 4)))]]
    return value


def _flowrt_layer(meta: dict, rng: np.random.Generator) -> str:
    layer = pick(rng, meta["layers"])
    field = pick(rng, ("backend", "activation", "kind", "descriptor", "outputs", "inputs", "name"))
    if field == "backend":
        layer["backend"] = pick(rng, [*meta["backends"], "CpuRef", "CpuAcc", "GpuAcc", "NoSuch", None])
    elif field == "activation":
        kind = pick(rng, ("Relu", "LeakyRelu", "Clip", "Sigmoid", "Tanh", "Elu"))
        layer["activation"] = pick(
            rng, [None, ["FusedActivation", {"kind": kind, "alpha": -1.0, "beta": 1.0}], _random_value(rng)]
        )
    elif field == "kind":
        layer["kind"] = pick(rng, [*known_layer_kinds(), "NoSuch"])
    elif field == "descriptor" and layer["descriptor"]:
        key = pick(rng, list(layer["descriptor"]))
        layer["descriptor"][key] = _random_value(rng)
        field = f"descriptor.{key}"
    elif field == "outputs" and layer["outputs"]:
        layer["outputs"][0] = pick(
            rng,
            [
                _random_value(rng),
                ["TensorInfo", {"shape": ["tuple", [2**40, 2**40]], "dtype": ["DataType", "float32"]}],
            ],
        )
    elif field == "inputs" and layer["inputs"]:
        layer["inputs"][int(rng.integers(0, len(layer["inputs"])))] = pick(
            rng, [None, [0, 0], [999, 0], [0, 5], "x"]
        )
    else:
        layer["name"] = pick(rng, STRANGE_TEXT)
    return f"layer {layer.get('name')!r} {field}"


def _flowrt_tensor(meta: dict, rng: np.random.Generator) -> str:
    if not meta["tensors"]:
        return "no tensors"
    index = int(rng.integers(0, len(meta["tensors"])))
    entry = meta["tensors"][index]
    key = pick(rng, ("dtype", "shape", "offset", "nbytes"))
    entry[key] = pick(
        rng,
        {
            "dtype": ["int8", "float64", "bool", "object", 3],
            "shape": [[], [2**40], [-1], [0], [1] * 70, "x"],
            "offset": [-64, 1, 2**62, 64],
            "nbytes": [0, -1, 2**62, 4],
        }[key],
    )
    return f"tensors[{index}].{key} -> {entry[key]!r}"


def _flowrt_root(meta: dict, rng: np.random.Generator) -> str:
    key = pick(rng, ("backends", "options", "graph_order", "layers", "prepared", "substitutions"))
    if key == "backends":
        meta[key] = pick(
            rng,
            [
                ["RefFusing", "CpuRef"],
                ["CpuRef", "CpuAcc"],
                ["CpuAcc", "GpuAcc"],
                [],
                ["CpuRef", "CpuRef"],
                ["NoSuch"],
            ],
        )
    elif key == "options" and meta["options"]:
        option = pick(rng, list(meta["options"]))
        meta["options"][option] = _random_value(rng)
        key = f"options.{option}"
    elif key == "graph_order":
        rng.shuffle(meta["graph_order"])
        if rng.random() < 0.5:
            meta["graph_order"].append(0)
    elif key == "layers":
        layers = meta["layers"]
        at = int(rng.integers(0, len(layers)))
        if rng.random() < 0.5:
            layers.insert(at, copy.deepcopy(layers[at]))
        else:
            layers.pop(at)
    else:
        meta[key] = _random_value(rng)
    return f"metadata {key}"


FLOWRT_MUTATIONS = (_flowrt_layer, _flowrt_layer, _flowrt_layer, _flowrt_tensor, _flowrt_root)


def mutate_flowrt(original: bytes, rng: np.random.Generator) -> Mutation:
    """A metadata mutation (checksum recomputed) two times in three, else a byte-level one
    (its checksum recomputed half the time)."""
    if rng.random() < 1 / 3:
        data, what = pick(rng, BYTE_MUTATIONS)(original, rng)
        if rng.random() < 0.5 and len(data) >= 64:
            return restamp(bytearray(data)), f"{what}, checksum recomputed"
        return data, what
    meta, section = split_flowrt(original)
    done = [pick(rng, FLOWRT_MUTATIONS)(meta, rng) for _ in range(int(rng.integers(1, 3)))]
    return join_flowrt(original, meta, section), "; ".join(done)
