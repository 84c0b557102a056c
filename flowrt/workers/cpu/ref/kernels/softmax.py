"""Softmax, LogSoftmax and Hardmax kernels, numerically stable (shifted by the max)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from flowrt.workers.cpu.ref.kernels import ref_kernel


def along_axis(desc, x: np.ndarray, where: str, fn: Callable[[np.ndarray, int], np.ndarray]) -> np.ndarray:
    """Apply ``fn(x, axis)`` along the op's axis, through the 2-D view before opset 13.

    Float16 is computed in float32 so that long sums keep their precision.
    """
    axis = desc.resolved_axis(x.ndim, where)
    work = x.astype(np.promote_types(x.dtype, np.float32), copy=False)
    if desc.coerces_to_2d:
        rows = int(np.prod(x.shape[:axis], dtype=np.int64))
        y = fn(work.reshape(rows, int(np.prod(x.shape[axis:], dtype=np.int64))), 1).reshape(x.shape)
    else:
        y = fn(work, axis)
    return y.astype(x.dtype, copy=False)


def _shifted(x: np.ndarray, axis: int) -> np.ndarray:
    return x - np.max(x, axis=axis, keepdims=True)


def _softmax(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(_shifted(x, axis))
    return e / np.sum(e, axis=axis, keepdims=True)


def _log_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    s = _shifted(x, axis)
    return s - np.log(np.sum(np.exp(s), axis=axis, keepdims=True))


def _hardmax(x: np.ndarray, axis: int) -> np.ndarray:
    # One-hot of the first maximum along the axis.
    y = np.zeros_like(x)
    np.put_along_axis(y, np.expand_dims(np.argmax(x, axis=axis), axis), 1, axis=axis)
    return y


def _nonempty(fn: Callable[[np.ndarray, int], np.ndarray]) -> Callable[[np.ndarray, int], np.ndarray]:
    # A max over an empty axis has no value; an empty input gives an empty output.
    return lambda x, axis: x.copy() if x.size == 0 else fn(x, axis)


@ref_kernel("Softmax")
def softmax(desc, x):
    return along_axis(desc, x, "Softmax", _nonempty(_softmax))


@ref_kernel("LogSoftmax")
def log_softmax(desc, x):
    return along_axis(desc, x, "LogSoftmax", _nonempty(_log_softmax))


@ref_kernel("Hardmax")
def hardmax(desc, x):
    return along_axis(desc, x, "Hardmax", _nonempty(_hardmax))


@ref_kernel("AttentionSoftmax")
def attention_softmax(desc, x, mask=None):
    """softmax(scale * x + mask) along the last axis, in float32 for float16 inputs."""
    work = x.astype(np.promote_types(x.dtype, np.float32), copy=False) * np.float32(desc.scale)
    if mask is not None:
        work = work + mask.astype(work.dtype, copy=False)
    return _nonempty(_softmax)(work, x.ndim - 1).astype(x.dtype, copy=False)
