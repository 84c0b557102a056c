"""A model's ``config.pbtxt``: the fields of Triton's model configuration that mean something
to flowrt, read with protobuf's own text-format parser.

The messages below are a subset of Triton's ``model_config.proto`` (same names, field
numbers and enums), built at import as protobuf descriptors: a field of Triton's that flowrt
does not take (``sequence_batching``, ``ensemble_scheduling``, ``optimization``...) is an
unknown field to the parser, and the file is refused with the parser's message (line,
column, field), not silently ignored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format

from flowrt.errors import InputError

_PACKAGE = "flowrt.serve"
F = descriptor_pb2.FieldDescriptorProto

_DATA_TYPES = [
    "TYPE_INVALID", "TYPE_BOOL", "TYPE_UINT8", "TYPE_UINT16", "TYPE_UINT32", "TYPE_UINT64",
    "TYPE_INT8", "TYPE_INT16", "TYPE_INT32", "TYPE_INT64", "TYPE_FP16", "TYPE_FP32",
    "TYPE_FP64", "TYPE_STRING", "TYPE_BF16",
]  # fmt: skip


def _field(
    message, name: str, number: int, kind: int, *, repeated: bool = False, type_name: str = ""
) -> None:
    field = message.field.add(name=name, number=number, type=kind)
    field.label = F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL
    if type_name:
        field.type_name = f".{_PACKAGE}.{type_name}"


def _enum(file, name: str, values: list[str]) -> None:
    enum = file.enum_type.add(name=name)
    for number, value in enumerate(values):
        enum.value.add(name=value, number=number)


def _messages() -> Any:
    """The message class of ModelConfig (and its parts), made once."""
    file = descriptor_pb2.FileDescriptorProto(name="flowrt/serve/model_config.proto", package=_PACKAGE)
    file.syntax = "proto3"
    _enum(file, "DataType", _DATA_TYPES)
    io = []
    for name in ("ModelInput", "ModelOutput"):
        message = file.message_type.add(name=name)
        _field(message, "name", 1, F.TYPE_STRING)
        _field(message, "data_type", 2, F.TYPE_ENUM, type_name="DataType")
        _field(message, "dims", 3 if name == "ModelOutput" else 4, F.TYPE_INT64, repeated=True)
        io.append(message)
    policy = file.message_type.add(name="ModelQueuePolicy")
    timeout_action = policy.enum_type.add(name="TimeoutAction")
    for number, value in enumerate(("REJECT", "DELAY")):
        timeout_action.value.add(name=value, number=number)
    _field(policy, "timeout_action", 1, F.TYPE_ENUM, type_name="ModelQueuePolicy.TimeoutAction")
    _field(policy, "default_timeout_microseconds", 2, F.TYPE_UINT64)
    _field(policy, "allow_timeout_override", 3, F.TYPE_BOOL)
    _field(policy, "max_queue_size", 4, F.TYPE_UINT32)
    batching = file.message_type.add(name="ModelDynamicBatching")
    _field(batching, "preferred_batch_size", 1, F.TYPE_INT32, repeated=True)
    _field(batching, "max_queue_delay_microseconds", 2, F.TYPE_UINT64)
    _field(batching, "default_queue_policy", 4, F.TYPE_MESSAGE, type_name="ModelQueuePolicy")
    _field(batching, "priority_levels", 5, F.TYPE_UINT64)
    _field(batching, "default_priority_level", 6, F.TYPE_UINT64)
    group = file.message_type.add(name="ModelInstanceGroup")
    kind = group.enum_type.add(name="Kind")
    for number, value in enumerate(("KIND_AUTO", "KIND_GPU", "KIND_CPU", "KIND_MODEL")):
        kind.value.add(name=value, number=number)
    _field(group, "name", 1, F.TYPE_STRING)
    _field(group, "count", 2, F.TYPE_INT32)
    _field(group, "kind", 4, F.TYPE_ENUM, type_name="ModelInstanceGroup.Kind")
    step = file.message_type.add(name="Step")
    for name in ("InputMapEntry", "OutputMapEntry"):
        entry = step.nested_type.add(name=name)
        entry.options.map_entry = True
        _field(entry, "key", 1, F.TYPE_STRING)
        _field(entry, "value", 2, F.TYPE_STRING)
    _field(step, "model_name", 1, F.TYPE_STRING)
    _field(step, "model_version", 2, F.TYPE_INT64)
    _field(step, "input_map", 3, F.TYPE_MESSAGE, repeated=True, type_name="Step.InputMapEntry")
    _field(step, "output_map", 4, F.TYPE_MESSAGE, repeated=True, type_name="Step.OutputMapEntry")
    ensemble = file.message_type.add(name="ModelEnsembling")
    _field(ensemble, "step", 1, F.TYPE_MESSAGE, repeated=True, type_name="Step")
    parameter = file.message_type.add(name="ModelParameter")
    _field(parameter, "string_value", 1, F.TYPE_STRING)
    config = file.message_type.add(name="ModelConfig")
    entry = config.nested_type.add(name="ParametersEntry")
    entry.options.map_entry = True
    _field(entry, "key", 1, F.TYPE_STRING)
    _field(entry, "value", 2, F.TYPE_MESSAGE, type_name="ModelParameter")
    _field(config, "name", 1, F.TYPE_STRING)
    _field(config, "platform", 2, F.TYPE_STRING)
    _field(config, "max_batch_size", 4, F.TYPE_INT32)
    _field(config, "input", 5, F.TYPE_MESSAGE, repeated=True, type_name="ModelInput")
    _field(config, "output", 6, F.TYPE_MESSAGE, repeated=True, type_name="ModelOutput")
    _field(config, "instance_group", 7, F.TYPE_MESSAGE, repeated=True, type_name="ModelInstanceGroup")
    _field(config, "default_model_filename", 8, F.TYPE_STRING)
    _field(config, "dynamic_batching", 11, F.TYPE_MESSAGE, type_name="ModelDynamicBatching")
    _field(config, "ensemble_scheduling", 15, F.TYPE_MESSAGE, type_name="ModelEnsembling")
    _field(config, "parameters", 14, F.TYPE_MESSAGE, repeated=True, type_name="ModelConfig.ParametersEntry")
    _field(config, "backend", 17, F.TYPE_STRING)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.ModelConfig"))


_MODEL_CONFIG = _messages()


@attrs.frozen
class QueuePolicy:
    """``dynamic_batching.default_queue_policy``: requests waiting beyond ``max_queue_size``
    (0: no bound) are refused; one not started within ``timeout`` seconds (None: no limit)
    is rejected; ``allow_timeout_override``: a request's ``timeout`` parameter may set it."""

    max_queue_size: int = 0
    timeout: float | None = None
    allow_timeout_override: bool = False


@attrs.frozen
class Tensor:
    """A tensor the configuration declares: name, element type (``TYPE_FP32``...) and dims."""

    name: str
    data_type: str
    dims: tuple[int, ...]


@attrs.frozen
class Step:
    """One step of an ensemble: the model it runs, and which of the ensemble's tensors feed
    its inputs (``inputs``: model input -> ensemble tensor) and take its outputs."""

    model: str
    inputs: tuple[tuple[str, str], ...]
    outputs: tuple[tuple[str, str], ...]


@attrs.frozen
class ModelConfig:
    """What flowrt takes of a model's ``config.pbtxt`` (defaults: no file)."""

    name: str = ""
    max_batch_size: int = 0
    dynamic_batching: bool = False
    preferred_batch_size: tuple[int, ...] = ()
    max_queue_delay: float = 0.0
    queue: QueuePolicy = QueuePolicy()
    priority_levels: int = 0
    default_priority_level: int = 0
    instances: int | None = None  # None: flowrt's default pools (one per CPU worker)
    default_model_filename: str = ""
    backends: str | None = None
    platform: str = ""
    inputs: tuple[Tensor, ...] = ()
    outputs: tuple[Tensor, ...] = ()
    steps: tuple[Step, ...] = ()  # an ensemble's (platform "ensemble")

    @property
    def max_batch(self) -> int:
        """The largest batch the dynamic batcher forms (1: none)."""
        if not self.dynamic_batching or self.max_batch_size <= 1:
            return 1
        return max((*self.preferred_batch_size, self.max_batch_size))


def parse(text: str, where: str) -> ModelConfig:
    """``text`` (``config.pbtxt``'s content) as a ModelConfig; InputError naming ``where``
    and the parser's complaint when it is not Triton's text format or has fields flowrt does
    not take."""
    message = _MODEL_CONFIG()
    try:
        text_format.Parse(text, message)
    except text_format.ParseError as e:
        raise InputError(
            f"{where}: not a model configuration flowrt takes ({e}); flowrt reads name, platform, backend, "
            "max_batch_size, input, output, instance_group, default_model_filename, dynamic_batching "
            "(preferred_batch_size, max_queue_delay_microseconds, default_queue_policy, priority_levels, "
            "default_priority_level) and parameters"
        ) from None
    if message.max_batch_size < 0:
        raise InputError(f"{where}: max_batch_size must be >= 0, got {message.max_batch_size}")
    batching = message.dynamic_batching
    for size in batching.preferred_batch_size:
        if not 1 <= size <= max(message.max_batch_size, 1):
            raise InputError(
                f"{where}: preferred_batch_size {size} is not within 1..max_batch_size ({message.max_batch_size})"
            )
    policy = batching.default_queue_policy
    if policy.timeout_action == 1:  # DELAY
        raise InputError(
            f"{where}: timeout_action DELAY is not supported; flowrt rejects requests past their timeout"
        )
    instances = sum(group.count or 1 for group in message.instance_group) or None
    parameters = {key: value.string_value for key, value in message.parameters.items()}
    unknown = sorted(set(parameters) - {"backends"})
    if unknown:
        raise InputError(
            f"{where}: unknown parameters {unknown}; flowrt takes 'backends' (a preference list)"
        )
    timeout_us = policy.default_timeout_microseconds
    ensemble = message.platform == "ensemble"
    if ensemble != message.HasField("ensemble_scheduling"):
        raise InputError(f'{where}: platform "ensemble" and ensemble_scheduling go together')
    steps = tuple(
        Step(s.model_name, tuple(sorted(s.input_map.items())), tuple(sorted(s.output_map.items())))
        for s in message.ensemble_scheduling.step
    )
    if ensemble and not steps:
        raise InputError(f"{where}: an ensemble needs at least one step")
    return ModelConfig(
        platform=message.platform,
        inputs=tuple(Tensor(t.name, _DATA_TYPES[t.data_type], tuple(t.dims)) for t in message.input),
        outputs=tuple(Tensor(t.name, _DATA_TYPES[t.data_type], tuple(t.dims)) for t in message.output),
        steps=steps,
        name=message.name,
        max_batch_size=message.max_batch_size,
        dynamic_batching=message.HasField("dynamic_batching"),
        preferred_batch_size=tuple(batching.preferred_batch_size),
        max_queue_delay=batching.max_queue_delay_microseconds / 1e6,
        queue=QueuePolicy(
            policy.max_queue_size, timeout_us / 1e6 if timeout_us else None, policy.allow_timeout_override
        ),
        priority_levels=batching.priority_levels,
        default_priority_level=batching.default_priority_level,
        instances=instances,
        default_model_filename=message.default_model_filename,
        backends=parameters.get("backends"),
    )


def read(directory: Path) -> ModelConfig:
    """The configuration in ``directory``/config.pbtxt, or the defaults where there is none."""
    path = directory / "config.pbtxt"
    if not path.is_file():
        return ModelConfig(name=directory.name)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: cannot be read: {e}") from None
    config = parse(text, str(path))
    if config.name and config.name != directory.name:
        raise InputError(f"{path}: name {config.name!r} differs from its directory's, {directory.name!r}")
    return attrs.evolve(config, name=directory.name)
