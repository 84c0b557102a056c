"""Execution windows and their split across workers, as the Compute Library's ``Window``.

A kernel declares the n-dimensional range it computes (start, end, step per dimension) and a
split hint: which dimension may be cut, and the smallest slice worth its dispatch cost. The
scheduler cuts the window along that dimension into at most one slice per worker; slices never
overlap and together cover the window exactly.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs
import numpy as np


def _positive(_instance: object, attribute: attrs.Attribute, value: int) -> None:
    if value < 1:
        raise ValueError(f"{attribute.name} must be at least 1, got {value}")


@attrs.frozen
class Dimension:
    """The range [start, end) visited in steps of ``step``."""

    start: int
    end: int
    step: int = attrs.field(default=1, validator=_positive)

    def __attrs_post_init__(self) -> None:
        if self.end < self.start:
            raise ValueError(f"dimension end {self.end} is before its start {self.start}")

    @property
    def iterations(self) -> int:
        return -(-(self.end - self.start) // self.step)


def _dims(dims: Iterable[Dimension]) -> tuple[Dimension, ...]:
    # A named converter: attrs' mypy plugin cannot type a field converted by ``tuple`` itself.
    return tuple(dims)


@attrs.frozen
class Window:
    """An n-dimensional iteration range."""

    dims: tuple[Dimension, ...] = attrs.field(converter=_dims)

    @classmethod
    def of_shape(cls, shape: Sequence[int]) -> Window:
        """The window that visits every element of ``shape``."""
        return cls(Dimension(0, int(n)) for n in shape)

    @property
    def iterations(self) -> int:
        count = 1
        for dim in self.dims:
            count *= dim.iterations
        return count

    def with_dimension(self, axis: int, dim: Dimension) -> Window:
        dims = list(self.dims)
        dims[axis] = dim
        return Window(dims)


@attrs.frozen
class SplitHint:
    """Which dimension a kernel's window may be cut along, and the fewest iterations of that
    dimension a slice should have to be worth dispatching."""

    axis: int
    min_slice: int = attrs.field(default=1, validator=_positive)


def split(window: Window, hint: SplitHint, workers: int) -> list[Window]:
    """Cut ``window`` along ``hint.axis`` into at most ``workers`` slices of at least
    ``hint.min_slice`` iterations each (one slice when even that is too small).

    Slice boundaries fall on the dimension's step grid, sizes differ by at most one step.
    """
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    dim = window.dims[hint.axis]
    total = dim.iterations
    parts = max(1, min(workers, total // hint.min_slice))
    base, extra = divmod(total, parts)
    slices, first = [], 0
    for part in range(parts):
        count = base + (1 if part < extra else 0)
        start = dim.start + first * dim.step
        end = min(dim.end, dim.start + (first + count) * dim.step)
        slices.append(window.with_dimension(hint.axis, Dimension(start, end, dim.step)))
        first += count
    return slices


def split_bounds(size: int, hint: SplitHint, workers: int) -> np.ndarray:
    """The slice boundaries of ``split`` over a one-dimensional window of ``size`` iterations,
    as an int64 array ``[0, b1, ..., size]`` a numba kernel walks with ``prange``."""
    slices = split(Window.of_shape((size,)), SplitHint(0, hint.min_slice), workers)
    return np.array([s.dims[0].start for s in slices] + [size], dtype=np.int64)
