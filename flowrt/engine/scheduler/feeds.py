"""Checking a run's feeds against the network's inputs, before anything runs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from flowrt.engine.scheduler.device_array import DeviceArray
from flowrt.errors import DataTypeError, InputError, ShapeError
from flowrt.types import DataType, TensorInfo


def _describe(infos: Mapping[str, TensorInfo]) -> str:
    return ", ".join(f"{name} {info}" for name, info in infos.items()) or "none"


def _as_array(name: str, info: TensorInfo, value: Any) -> Any:
    """The feed as an array (a DeviceArray as it is); InputError when numpy cannot make one
    (ragged nested lists)."""
    if isinstance(value, DeviceArray):
        return value
    try:
        return np.asarray(value)
    except (ValueError, TypeError) as e:
        raise InputError(
            f"input {name!r} expects an array of {info}, got a {type(value).__name__} that is not one "
            f"array (nested lists of unequal lengths?): {e}"
        ) from e


def _data_type(dtype: np.dtype) -> DataType | None:
    """The DataType of a feed's dtype (ml_dtypes' included), None for one flowrt lacks."""
    try:
        return DataType.from_numpy(dtype)
    except DataTypeError:
        return None


def check_feeds(infos: Mapping[str, TensorInfo], feeds: Any) -> dict[str, Any]:
    """Return the feeds as arrays (DeviceArrays as they are), or raise naming the input and
    what was expected and found.

    A dimension the model leaves symbolic (or unknown) accepts any size.
    """
    if not isinstance(feeds, Mapping):
        raise InputError(f"feeds must be a mapping of input name to array, got {type(feeds).__name__}")
    unknown = [name for name in feeds if name not in infos]
    if unknown:
        raise InputError(f"unknown input {unknown[0]!r}; the network's inputs are: {_describe(infos)}")
    missing = [name for name in infos if name not in feeds]
    if missing:
        raise InputError(f"missing input {missing[0]!r} ({infos[missing[0]]}); every input must be fed")
    arrays = {}
    for name, info in infos.items():
        array = _as_array(name, info, feeds[name])
        if _data_type(array.dtype) != info.dtype:
            raise DataTypeError(f"input {name!r} expects {info.dtype.name.lower()}, got {array.dtype}")
        if info.shape is not None:
            expected = tuple(info.shape)
            if len(expected) != array.ndim or any(
                isinstance(d, int) and d != n for d, n in zip(expected, array.shape)
            ):
                raise ShapeError(
                    f"input {name!r} expects shape {info.format_shape()}, got {tuple(array.shape)}"
                )
        arrays[name] = array
    return arrays


def check_output_buffers(infos: Mapping[str, TensorInfo | None], outputs: Any) -> dict[str, np.ndarray]:
    """Caller arrays to write outputs into: each must be a writeable array of the output's dtype
    and (where known) shape."""
    if outputs is None:
        return {}
    if not isinstance(outputs, Mapping):
        raise InputError(f"outputs must be a mapping of output name to array, got {type(outputs).__name__}")
    for name, target in outputs.items():
        if name not in infos:
            raise InputError(f"unknown output {name!r}; the network's outputs are: {', '.join(infos)}")
        info = infos[name]
        if not isinstance(target, np.ndarray) or not target.flags.writeable:
            raise InputError(f"output {name!r} must be bound to a writeable numpy array")
        if info is None:
            continue
        if _data_type(target.dtype) != info.dtype:
            raise DataTypeError(
                f"output {name!r} produces {info.dtype.name.lower()}, bound array is {target.dtype}"
            )
        if info.shape is not None and (
            len(info.shape) != target.ndim
            or any(isinstance(d, int) and d != n for d, n in zip(info.shape, target.shape))
        ):
            raise ShapeError(
                f"output {name!r} has shape {info.format_shape()}, bound array is {tuple(target.shape)}"
            )
    return dict(outputs)
