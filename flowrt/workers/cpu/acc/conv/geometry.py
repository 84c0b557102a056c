"""What CpuAcc's conv algorithms choose by: one conv's shapes and window, over a number of
workers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

from flowrt.engine.graph.layers.conv import WindowGeometry, window_geometry
from flowrt.engine.scheduler.window import split_bounds
from flowrt.types import static_dims

if TYPE_CHECKING:
    from flowrt.workers.cpu.acc.conv.tuning import ConvTuning


def balance(tasks: int, workers: int) -> float:
    """How busy ``workers`` are kept by ``tasks`` equal tasks (1: all of them, all the time)."""
    return tasks / (workers * -(-tasks // workers))


@attrs.frozen
class ConvGeometry:
    """One input shape of a conv layer, its weights' shape and the workers its window is split
    over, with the window resolved (output size, pads). Made once per shape and worker count;
    each algorithm's ``applies`` and ``plan`` read it."""

    x_shape: tuple[int, ...]  # (N, C, H, W)
    w_shape: tuple[int, ...]  # (M, C / groups, kh, kw)
    groups: int
    workers: int
    window: WindowGeometry

    @classmethod
    def of(cls, desc: Any, x_shape: tuple[int, ...], w_shape: tuple[int, ...], workers: int) -> ConvGeometry:
        """The geometry of conv ``desc`` (a Conv descriptor) on these shapes."""
        window = window_geometry(desc, x_shape[2:], w_shape[2:])
        return cls(tuple(x_shape), tuple(w_shape), desc.group, workers, window)

    @property
    def kernel(self) -> tuple[int, ...]:
        """The kernel's (kh, kw)."""
        return self.w_shape[2:]

    @property
    def out_hw(self) -> tuple[int, int]:
        """The output's (height, width)."""
        oh, ow = static_dims(self.window.out)  # static, as the input's shape is
        return oh, ow

    @property
    def out_shape(self) -> tuple[int, int, int, int]:
        """The output's (N, M, height, width)."""
        return (self.x_shape[0], self.w_shape[0], *self.out_hw)

    @property
    def pixels(self) -> int:
        """Output pixels per image (the GEMM's columns)."""
        oh, ow = self.out_hw
        return oh * ow

    @property
    def mg(self) -> int:
        """Output channels per group (the GEMM's rows)."""
        return self.w_shape[0] // self.groups

    @property
    def rows(self) -> int:
        """Inputs each output sees, per group: C / groups * kh * kw (the GEMM's depth)."""
        return self.w_shape[1] * self.kernel[0] * self.kernel[1]

    @property
    def group_weights(self) -> int:
        """Weights per group (floats): the GEMM's rows times its depth."""
        return self.mg * self.rows

    @property
    def unit_strides(self) -> bool:
        """Stride 1 on both axes."""
        return self.window.strides == (1, 1)

    @property
    def pointwise(self) -> bool:
        """1x1, no padding (any stride): each output pixel reads one input pixel."""
        g = self.window
        return self.kernel == (1, 1) and not any(g.pads_begin + g.pads_end)

    @property
    def direct(self) -> bool:
        """1x1, stride 1, no padding: the input is the column matrix itself."""
        return self.pointwise and self.unit_strides

    def geo(self) -> np.ndarray:
        """The int64 array the numba kernels read the window from: kh, kw, sh, sw, dh, dw, ph,
        pw, oh, ow (a new one per call: each plan keeps its own)."""
        g = self.window
        return np.array([*self.kernel, *g.strides, *g.dilations, *g.pads_begin, *g.out], np.int64)

    def column_bounds(self, tuning: ConvTuning) -> np.ndarray:
        """Each image's output pixels cut into slices (``tuning.column_hint``)."""
        return split_bounds(self.pixels, tuning.column_hint, self.workers)

    def batch_bounds(self, tuning: ConvTuning) -> np.ndarray:
        """All the images' output pixels, side by side, cut into slices as :meth:`column_bounds`."""
        return split_bounds(self.x_shape[0] * self.pixels, tuning.column_hint, self.workers)

    def row_bounds(self, tuning: ConvTuning) -> np.ndarray:
        """A group's output channels cut into slices (``tuning.row_hint``)."""
        return split_bounds(self.mg, tuning.row_hint, self.workers)

    def balance(self, bounds: np.ndarray) -> float:
        """How busy the workers are kept by one task per (group, slice of ``bounds``)."""
        return balance(self.groups * (len(bounds) - 1), self.workers)
