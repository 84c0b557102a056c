"""A quantized layer's scales and zero points (QLinearConv's and QLinearMatMul's inputs 1, 2,
4, 5, 6 and 7) and what its kernel makes of them, made again only when they change."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np


def per_row(value, rows: int, dtype) -> np.ndarray:
    """A per-tensor or per-row parameter as one value per row."""
    flat = np.asarray(value).reshape(-1).astype(dtype)
    return np.broadcast_to(flat, (rows,)).copy() if flat.size == 1 else flat


def requantization_scales(x_scale, w_scale, y_scale, rows: int) -> np.ndarray:
    """Per output row, the epilogue's ``x_scale * w_scale / y_scale``, in float32 as ONNX
    Runtime computes it."""
    product = np.float32(np.asarray(x_scale).reshape(())) * per_row(w_scale, rows, np.float32)
    return (product / np.float32(np.asarray(y_scale).reshape(()))).astype(np.float32)


class ParameterCache:
    """``make(x_scale, x_zero, w_scale, w_zero, y_scale, y_zero)``, kept while the parameters
    hold the same values; when they are constants (``constant``: a QDQ model's always are),
    made at the first run and not looked at again."""

    def __init__(self, make: Callable[..., Any], constant: bool) -> None:
        self.make, self.constant = make, constant
        self._key: tuple | None = None
        self._values: Any = None

    def __call__(self, *params) -> Any:
        if self.constant and self._key is not None:
            return self._values
        key = tuple(np.asarray(v).tobytes() for v in params)
        if key != self._key:
            self._values, self._key = self.make(*params), key
        return self._values
