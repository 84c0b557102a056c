"""An optimized network as plain data, and back: what ``flowrt.save`` packs with msgpack.

Plain data is what msgpack carries without extensions: None, bool, int, float, str, lists and
maps with str keys. Arrays are never inlined: the encoder hands each one to ``store(array,
where) -> int`` and writes that index; the decoder asks ``fetch(index, where) -> np.ndarray``
for it (``flowrt.serialize`` keeps the bytes).

A value (a descriptor field, a tensor info) is written as itself when it is None, a bool, an
int, a float or a str, and otherwise as a two-item list ``[tag, payload]``:

    ["tuple", [item, ...]]               items encoded alike, so tuples nest
    ["array", index]                     a numpy array, by its index in the tensor table
    ["scalar", [dtype name, value]]      a numpy scalar, e.g. ["scalar", ["float32", 0.5]]
    ["DataType", name]                   e.g. ["DataType", "float32"]
    ["TensorInfo", {field: value}]       and ["Quantization", {field: value}]

A descriptor is a map ``{field: value}``; the class comes from its layer kind. Decoding is the
checked inverse: only those tags and classes, nested at most ``MAX_DEPTH`` deep; descriptors
are rebuilt through their class (so its converters and validators run); connections may only
point at earlier layers (so the graph is acyclic), slot counts must suit the layer kind, and
every layer's outputs are inferred again and must equal the infos written. Anything else
raises ModelLoadError naming where, e.g. ``layers[12] 'conv1' (Conv): descriptor.strides: ...``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn, cast

import attrs
import numpy as np

from flowrt.engine.graph.graph import Graph, Layer, constant_value
from flowrt.engine.graph.layer_kind import LayerKind, get_layer_kind
from flowrt.engine.graph.optimizer import DATA_KINDS, Assignment, OptimizedNetwork, OptimizerOptions
from flowrt.engine.graph.passes.crossings import Crossing
from flowrt.engine.graph.passes.substitute import SubstitutionRecord
from flowrt.errors import FlowrtError, ModelLoadError
from flowrt.registry import FusedActivation
from flowrt.types import DataType, Quantization, TensorInfo

MAX_DEPTH = 16
# The numpy dtypes an array may have in a file: every DataType numpy can hold as raw bytes
# (the low-precision ones as ml_dtypes arrays, one element a byte or two, never packed).
ARRAY_DTYPES = frozenset(d.value for d in DataType if d is not DataType.STRING)
_RECORDS: dict[str, type] = {
    "TensorInfo": TensorInfo,
    "Quantization": Quantization,
    "FusedActivation": FusedActivation,
}
_PLAIN = (type(None), bool, int, float, str)
_SCALAR_VALUES = {"b": (bool,), "i": (int,), "u": (int,), "f": (int, float)}  # by numpy dtype kind


def _scalar_kind(dtype: DataType) -> str:
    """The numpy kind of a scalar's values; ml_dtypes' types say "V" (float8_e5m2 "f")."""
    if dtype.is_low_precision:
        return "f" if dtype.is_float else "i"
    return dtype.numpy.kind


Store = Callable[[np.ndarray, str], int]
Fetch = Callable[[int, str], np.ndarray]


def _fail(where: str, what: str) -> NoReturn:
    raise ModelLoadError(f"{where}: {what}")


def expect_type(value: Any, kind: type, where: str) -> Any:
    """``value`` when its type is exactly ``kind`` (a bool is not an int here)."""
    if type(value) is not kind:
        _fail(where, f"expected {kind.__name__}, found {type(value).__name__}")
    return value


def expect_field(record: dict, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    """``record[key]`` when present and of exactly one of the types ``kind``."""
    if key not in record:
        _fail(where, f"missing {key!r}")
    value = record[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if type(value) not in kinds:
        names = " or ".join("nil" if k is type(None) else k.__name__ for k in kinds)
        _fail(f"{where}.{key}", f"expected {names}, found {type(value).__name__}")
    return value


def _strings(value: Any, where: str) -> list[str]:
    for i, item in enumerate(expect_type(value, list, where)):
        expect_type(item, str, f"{where}[{i}]")
    return value


def _string_map(value: Any, where: str) -> dict[str, str]:
    for key, item in expect_type(value, dict, where).items():
        expect_type(key, str, f"{where} key")
        expect_type(item, str, f"{where}[{key!r}]")
    return value


# -- values -----------------------------------------------------------------------------------
def encode_value(value: Any, store: Store, where: str, depth: int = 0) -> Any:
    """``value`` as plain data (see the module docstring); FlowrtError for what a file cannot hold."""
    kind = type(value)
    if kind is int and not -(2**63) <= value < 2**64:
        raise FlowrtError(f"{where}: cannot save the int {value}: it does not fit in 64 bits")
    if kind in _PLAIN:
        return value
    if depth >= MAX_DEPTH:
        raise FlowrtError(f"{where}: cannot save values nested deeper than {MAX_DEPTH} levels")
    if kind is tuple:
        return ["tuple", [encode_value(v, store, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]]
    if isinstance(value, np.ndarray):
        return ["array", store(value, where)]
    if isinstance(value, np.generic) and value.dtype.name in ARRAY_DTYPES:
        return ["scalar", [value.dtype.name, value.item()]]
    if kind is DataType:
        return ["DataType", value.value]
    if kind in _RECORDS.values():
        return [kind.__name__, encode_fields(value, store, where, depth + 1)]
    raise FlowrtError(
        f"{where}: cannot save a value of type {kind.__name__}; a .flowrt file holds None, bool, int, "
        "float, str, tuples, numpy arrays and scalars, DataType, TensorInfo and Quantization"
    )


def encode_fields(record: Any, store: Store, where: str, depth: int = 0) -> dict[str, Any]:
    """An attrs instance as ``{field: encoded value}`` (fields set by ``__init__`` only)."""
    return {
        f.name: encode_value(getattr(record, f.name), store, f"{where}.{f.name}", depth)
        for f in attrs.fields(type(record))
        if f.init
    }


def decode_value(data: Any, fetch: Fetch, where: str, depth: int = 0) -> Any:
    """The checked inverse of :func:`encode_value`."""
    if type(data) in _PLAIN:
        return data
    if depth >= MAX_DEPTH:
        _fail(where, f"values nest deeper than {MAX_DEPTH} levels")
    if type(data) is not list or len(data) != 2 or type(data[0]) is not str:
        _fail(where, f"expected a value or a [tag, payload] pair, found {type(data).__name__}")
    tag, payload = data
    if tag == "tuple":
        items = expect_type(payload, list, where)
        return tuple(decode_value(v, fetch, f"{where}[{i}]", depth + 1) for i, v in enumerate(items))
    if tag == "array":
        return fetch(expect_type(payload, int, where), where)
    if tag == "scalar":
        if type(payload) is not list or len(payload) != 2 or payload[0] not in ARRAY_DTYPES:
            _fail(where, "a scalar is [dtype name, value] with a numeric or bool dtype")
        dtype, value = DataType(payload[0]), payload[1]
        kind = _scalar_kind(dtype)
        if type(value) not in _SCALAR_VALUES[kind]:
            _fail(where, f"a {dtype.value} scalar cannot hold a {type(value).__name__}")
        try:
            return _make_scalar(dtype, value)
        except (OverflowError, ValueError, TypeError) as e:
            _fail(where, f"not a {dtype.value} value: {value!r}: {e}")
    if tag == "DataType":
        try:
            return DataType(expect_type(payload, str, where))
        except ValueError:
            _fail(where, f"unknown data type {payload!r}")
    if tag in _RECORDS:
        return decode_fields(_RECORDS[tag], payload, fetch, where, depth + 1)
    _fail(where, f"unknown value tag {tag!r}")


def _make_scalar(dtype: DataType, value: int | float | bool) -> np.generic:
    """A numpy scalar of ``dtype`` holding ``value``, which must fit it exactly (a float that
    rounds, or an int out of range, is refused rather than changed)."""
    if not dtype.is_low_precision:
        return dtype.numpy.type(value)
    scalar = cast(np.generic, np.asarray(float(value) if dtype.is_float else value).astype(dtype.numpy)[()])
    same = scalar.item() == value or (value != value and scalar != scalar)  # NaN is NaN
    if not same:
        raise ValueError(f"{value!r} is not exactly a {dtype.value}")
    return scalar


def decode_fields(cls: type, data: Any, fetch: Fetch, where: str, depth: int = 0) -> Any:
    """An instance of the attrs class ``cls`` from ``{field: encoded value}``; fields not
    written take their defaults, unknown fields are refused."""
    fields = {f.name: f for f in attrs.fields(cls) if f.init}
    unknown = [key for key in expect_type(data, dict, where) if key not in fields]
    if unknown:
        _fail(where, f"{cls.__name__} has no field {unknown[0]!r}")
    kwargs = {
        fields[name].alias: decode_value(value, fetch, f"{where}.{name}", depth)
        for name, value in data.items()
    }
    try:
        return cls(**kwargs)
    except Exception as e:  # a converter's or validator's refusal, a missing required field
        _fail(where, f"not a valid {cls.__name__}: {type(e).__name__}: {e}")


# -- networks ---------------------------------------------------------------------------------
def encode_network(optimized: OptimizedNetwork, store: Store) -> dict[str, Any]:
    """The plain data of an optimized network (without its tensors, which go to ``store``)."""
    order = optimized.graph.topological_order()
    position = {layer.name: i for i, layer in enumerate(order)}
    assigned = {layer.name for layer in order if layer.backend is not None}
    if assigned != set(optimized.decisions):
        stray = sorted(assigned ^ set(optimized.decisions))
        raise FlowrtError(f"cannot save: layer {stray[0]!r} has a backend or a decision, but not both")
    return {
        "backends": [str(b) for b in optimized.backends],
        "options": encode_fields(optimized.options, store, "options"),
        "passes": [str(p) for p in optimized.passes],
        "layers": [_encode_layer(layer, position, optimized.decisions, store) for layer in order],
        "graph_order": [position[name] for name in optimized.graph.layers],
        "substitutions": [
            encode_fields(r, store, f"substitutions[{i}]") for i, r in enumerate(optimized.substitutions)
        ],
        "crossings": [encode_fields(c, store, f"crossings[{i}]") for i, c in enumerate(optimized.crossings)],
    }


def _decode_records(root: dict, key: str, cls: type, fetch: Fetch) -> list[Any]:
    """The records under ``key`` (absent in files written before they were kept: none)."""
    items = expect_type(root.get(key, []), list, key)
    return [decode_fields(cls, item, fetch, f"{key}[{i}]") for i, item in enumerate(items)]


def _encode_layer(layer: Layer, position: dict[str, int], decisions: dict, store: Store) -> dict[str, Any]:
    where = f"layer {layer.name!r} ({layer.kind})"
    spec = get_layer_kind(layer.kind)
    if type(layer.descriptor) is not spec.descriptor:
        raise FlowrtError(
            f"cannot save {where}: its descriptor is a {type(layer.descriptor).__name__}, "
            f"its kind's is {spec.descriptor.__name__}"
        )
    decision = decisions.get(layer.name)
    return {
        "name": layer.name,
        "kind": layer.kind,
        "descriptor": encode_fields(layer.descriptor, store, f"{where}: descriptor"),
        "inputs": [
            None if s.source is None else [position[s.source.layer.name], s.source.index]
            for s in layer.inputs
        ],
        "outputs": [encode_value(o.info, store, f"{where}: output {o.index}") for o in layer.outputs],
        "backend": None if layer.backend is None else str(layer.backend),
        "declined": None if decision is None else {str(b): str(r) for b, r in decision.declined.items()},
        "activation": encode_value(layer.activation, store, f"{where}: activation"),
    }


def decode_network(data: Any, fetch: Fetch) -> OptimizedNetwork:
    """The checked inverse of :func:`encode_network`; raises ModelLoadError naming the field."""
    root = expect_type(data, dict, "metadata")
    backends = _strings(expect_field(root, "backends", list, "metadata"), "backends")
    if not backends or len(set(backends)) != len(backends):
        _fail("backends", f"expected a non-empty list of distinct backend ids, found {backends}")
    options = decode_fields(
        OptimizerOptions, expect_field(root, "options", dict, "metadata"), fetch, "options"
    )
    for f in attrs.fields(OptimizerOptions):  # no validators there: check plain defaults' types
        if type(f.default) in _PLAIN[1:] and type(getattr(options, f.name)) is not type(f.default):
            _fail(f"options.{f.name}", f"expected {type(f.default).__name__}")
    passes = _strings(expect_field(root, "passes", list, "metadata"), "passes")
    records = expect_field(root, "layers", list, "metadata")
    layers: list[Layer] = []
    names: set[str] = set()
    decisions: dict[str, Assignment] = {}
    for i, record in enumerate(records):
        where = f"layers[{i}]"
        try:
            layer, declined = _decode_layer(
                expect_type(record, dict, where), layers, names, backends, fetch, where
            )
        except ModelLoadError:
            raise
        except Exception as e:  # whatever a malformed layer sets off is still a malformed file
            raise ModelLoadError(f"{where}: {type(e).__name__}: {e}") from e
        layers.append(layer)
        names.add(layer.name)
        if layer.backend is not None:
            decisions[layer.name] = Assignment(layer.backend, declined)
    order = expect_field(root, "graph_order", list, "metadata")
    if sorted(expect_type(i, int, "graph_order") for i in order) != list(range(len(layers))):
        _fail("graph_order", f"expected a permutation of the {len(layers)} layer indices")
    graph = Graph()
    graph.layers = {layers[i].name: layers[i] for i in order}
    substitutions = _decode_records(root, "substitutions", SubstitutionRecord, fetch)
    crossings = _decode_records(root, "crossings", Crossing, fetch)
    return OptimizedNetwork(graph, backends, decisions, passes, options, substitutions, crossings)


def _decode_layer(
    record: dict, built: list[Layer], names: set[str], backends: list[str], fetch: Fetch, where: str
) -> tuple[Layer, dict[str, str]]:
    name = expect_field(record, "name", str, where)
    kind = expect_field(record, "kind", str, where)
    if name in names:
        _fail(where, f"a second layer named {name!r}")
    where = f"{where} {name!r} ({kind})"
    try:
        spec = get_layer_kind(kind)
    except KeyError:
        _fail(where, f"unknown layer kind {kind!r}")
    descriptor = decode_fields(
        spec.descriptor, expect_field(record, "descriptor", dict, where), fetch, f"{where}: descriptor"
    )
    sources = expect_field(record, "inputs", list, where)
    infos = expect_field(record, "outputs", list, where)
    layer = Layer(name, kind, descriptor, len(sources), len(infos))
    layer.backend = expect_field(record, "backend", (str, type(None)), where)
    declined = expect_field(record, "declined", (dict, type(None)), where)
    if (layer.backend is None) != (kind in DATA_KINDS) or (declined is None) != (layer.backend is None):
        _fail(
            where,
            "Input, Output and Constant layers have no backend; every other layer has one and its decision",
        )
    if layer.backend is not None and layer.backend not in backends:
        _fail(f"{where}.backend", f"{layer.backend!r} is not in the backend list {backends}")
    activation = decode_value(record.get("activation"), fetch, f"{where}.activation")
    if activation is not None and not isinstance(activation, FusedActivation):
        _fail(
            f"{where}.activation", f"expected a FusedActivation or nothing, found {type(activation).__name__}"
        )
    layer.activation = activation
    for slot, source in zip(layer.inputs, sources):
        _connect(slot, source, built, f"{where}: input {slot.index}")
    _check_slots(layer, spec, where)
    _set_outputs(layer, spec, infos, fetch, where)
    return layer, _string_map(declined, f"{where}.declined") if declined is not None else {}


def _connect(slot, source: Any, built: list[Layer], where: str) -> None:
    if source is None:
        return
    if type(source) is not list or len(source) != 2 or any(type(v) is not int for v in source):
        _fail(where, "expected nil or [layer index, output index]")
    index, output = source
    if not 0 <= index < len(built):
        _fail(where, f"source layer {index} is not an earlier layer (0 to {len(built) - 1})")
    producer = built[index]
    if not 0 <= output < len(producer.outputs):
        _fail(where, f"layer {producer.name!r} has no output {output}")
    producer.outputs[output].connect(slot)


def _check_slots(layer: Layer, spec: LayerKind, where: str) -> None:
    """The slot rules of ``Graph.validate``, checked in one pass in file order."""
    connected = [s.source is not None for s in layer.inputs]
    if len(layer.inputs) < spec.min_inputs or not all(connected[: spec.min_inputs]):
        _fail(where, f"expects at least {spec.min_inputs} connected inputs, has {sum(connected)}")
    if spec.max_inputs is not None and len(layer.inputs) > spec.max_inputs:
        _fail(where, f"takes at most {spec.max_inputs} inputs, has {len(layer.inputs)}")


def _set_outputs(layer: Layer, spec: LayerKind, written: list, fetch: Fetch, where: str) -> None:
    """Infer the layer's outputs again; they must be the infos the file holds."""
    infos = [decode_value(v, fetch, f"{where}: output {k}") for k, v in enumerate(written)]
    consts = [constant_value(s.source) for s in layer.inputs]
    try:
        inferred = spec.infer(layer.descriptor, layer.input_infos, consts)
    except Exception as e:
        _fail(where, f"shape inference fails: {type(e).__name__}: {e}")
    if len(inferred) < len(infos):
        _fail(where, f"has {len(infos)} outputs but its kind produces {len(inferred)}")
    for slot, info, expected in zip(layer.outputs, infos, inferred):
        if info != expected:
            _fail(where, f"output {slot.index} is written as {info}, but shape inference gives {expected}")
        slot.info = info
