"""A 1x1 stride-1 conv by register tiles, over all the images of a batch as one GEMM.

The columns of the GEMM are (image, pixel) pairs, all the batch's pixels side by side, split
over the workers; the packed weights (``tiles.py``) multiply them where they lie, a run of
whole tiles of one image at a time. Read image by image, a 14x14 plane of 196 pixels fills six
tiles of 32 columns and a seventh masked one that costs as much as a whole tile, and a 7x7
plane one whole and one part-filled; here only the tile that holds the end of one image and
the start of the next is part of neither: its columns are copied into a small buffer, and its
product into each image's output through a scratch block. On one Zen 4 core, batch 4, M=128,
K=256-1024: 14x14 90-98 -> 96-109 GFLOP/s, 7x7 84-86 -> 92-93, 28x28 and 56x56 unchanged.
Its algorithm is :class:`Packed`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import attrs
import numpy as np
from numba import njit

from flowrt.workers.cpu.acc.blas import NATIVE, SliceFunction, call_native, run_tasks
from flowrt.workers.cpu.acc.tile_ir import TILE_COLUMNS
from flowrt.workers.cpu.acc.tiles import panels_address

if TYPE_CHECKING:
    from flowrt.workers.cpu.acc.conv.algorithms import ActArgs
    from flowrt.workers.cpu.acc.conv.geometry import ConvGeometry
    from flowrt.workers.cpu.acc.conv.tuning import ConvTuning
    from flowrt.workers.cpu.acc.conv.weights import ConvWeights


# The two copies of the tile that holds the end of one image and the start of the next: a
# few columns, by plain loops over indices (views per row and run cost more to compile).


@njit(inline="always", nogil=True, cache=True)
def _pack(x_flat, c0, q0, cols, pixels):
    """Columns ``q0 .. q0 + cols.shape[1]`` of the batch, channels ``c0 ..`` (as many as
    ``cols`` has rows), into ``cols``."""
    width = cols.shape[1]
    v = 0
    while v < width:
        n, p = divmod(q0 + v, pixels)
        run = min(width - v, pixels - p)
        for r in range(cols.shape[0]):
            for t in range(run):
                cols[r, v + t] = x_flat[n, c0 + r, p + t]
        v += run


@njit(inline="always", nogil=True, cache=True)
def _across(scratch, images, r0, r1, q0, pixels, store):
    """The columns of ``scratch`` (batch columns ``q0 ..``) into rows ``r0 .. r1`` of each
    image of ``images`` (N, M, pixels) they belong to where ``store``; else the other way
    (a residual into the scratch its tiles start from)."""
    width = scratch.shape[1]
    v = 0
    while v < width:
        n, p = divmod(q0 + v, pixels)
        run = min(width - v, pixels - p)
        for r in range(r0, r1):
            if store:
                for t in range(run):
                    images[n, r, p + t] = scratch[r - r0, v + t]
            else:
                for t in range(run):
                    scratch[r - r0, v + t] = images[n, r, p + t]
        v += run


@njit(**NATIVE)
def _packed_task(task, _step, x_flat, panels, panel_bias, out, z, bounds, code, alpha, beta, multiply):
    """Task (group, slice of ``bounds``) of :func:`conv_packed`; ``multiply``: the address of
    ``tiles.gemm_panels``, or of ``tiles.gemm_panels_onto`` where ``z`` (of ``out``'s shape)
    is a residual to add (``tiles.panels_address``); else ``z`` is empty."""
    residual = z.shape[0] > 0
    groups = panels.shape[0]
    cg = x_flat.shape[1] // groups
    mg = out.shape[1] // groups
    pixels = x_flat.shape[2]
    g, s = divmod(task, bounds.shape[0] - 1)
    start, stop = bounds[s], bounds[s + 1]
    c0, r0, r1 = g * cg, g * mg, (g + 1) * mg
    buffer = np.empty((cg, TILE_COLUMNS), np.float32)
    scratch = np.empty((mg, TILE_COLUMNS), np.float32)
    t = start
    while t < stop:
        n, p = divmod(t, pixels)
        # whole tiles inside image n, or the rest of the slice if it ends in image n
        image_end = (n + 1) * pixels
        t1 = stop if image_end >= stop else t + (image_end - t) // TILE_COLUMNS * TILE_COLUMNS
        if t1 > t:
            cols = x_flat[n, c0 : c0 + cg, p : p + t1 - t]
            block = out[n, r0:r1, p : p + t1 - t]
            if residual:
                onto = z[n, r0:r1, p : p + t1 - t]
                call_native(multiply, (panels[g], panel_bias[g], cols, block, onto, code, alpha, beta))
            else:
                call_native(multiply, (panels[g], panel_bias[g], cols, block, code, alpha, beta))
        else:  # one tile across images
            t1 = min(t + TILE_COLUMNS, stop)
            cols = buffer[:, : t1 - t]
            _pack(x_flat, c0, t, cols, pixels)
            part = scratch[:, : t1 - t]
            if residual:  # the part starts from its residual
                _across(part, z, r0, r1, t, pixels, False)
                call_native(multiply, (panels[g], panel_bias[g], cols, part, part, code, alpha, beta))
            else:
                call_native(multiply, (panels[g], panel_bias[g], cols, part, code, alpha, beta))
            _across(part, out, r0, r1, t, pixels, True)
        t = t1


_PACKED_TASK = SliceFunction(_packed_task)
# What conv_packed passes for ``z`` where there is no residual.
_NO_RESIDUAL = np.zeros((0, 0, 0), np.float32)


def conv_packed(x_flat, panels, panel_bias, out, bounds, code, alpha, beta, z=None):
    """``out`` (N, M, pixels) = activation(w @ x + bias [+ z]) for every image of ``x_flat``
    (N, C, pixels), ``w`` packed per group in ``panels``, ``z`` a residual of ``out``'s shape;
    one task per (group, slice of ``bounds`` over the N * pixels columns), called by address
    (``blas.run_tasks``)."""
    residual = z is not None
    multiply = panels_address(panels, panel_bias, residual)
    z = z if residual else _NO_RESIDUAL
    args = (x_flat, panels, panel_bias, out, z, bounds, code, alpha, beta, multiply)
    run_tasks(_PACKED_TASK.address(args), panels.shape[0] * (bounds.shape[0] - 1), args)


@attrs.frozen(eq=False)
class Packed:
    """Plan of a 1x1 stride-1 unpadded conv by :func:`conv_packed`: ``bounds`` over all the
    images' pixels side by side."""

    name: ClassVar[str] = "packed"
    # a FusedConv's residual is added as the tiles store (``kernels.conv.FusedConvKernel``)
    takes_residual: ClassVar[bool] = True
    bounds: np.ndarray

    @classmethod
    def applies(cls, geometry: ConvGeometry, tuning: ConvTuning) -> bool:
        """Such a conv whose weights the register tiles take (``tuning.tiles``),
        as long as splitting over all the pixels keeps the workers as busy as a split over
        output channels would."""
        return (
            tuning.tiles(geometry.group_weights, geometry.rows)
            and geometry.direct
            and geometry.balance(geometry.batch_bounds(tuning))
            >= geometry.balance(geometry.row_bounds(tuning))
        )

    @classmethod
    def plan(cls, geometry: ConvGeometry, tuning: ConvTuning) -> Packed:
        """All the images' pixels split over the workers."""
        return cls(geometry.batch_bounds(tuning))

    def forms(self, weights: ConvWeights, w, w_shape, bias, constant: bool) -> None:
        """See ``algorithms.ConvAlgorithm``."""
        weights.panels(w, bias, constant)

    def run(
        self,
        weights: ConvWeights,
        x,
        w,
        w_shape,
        bias,
        out,
        finish: bool,
        constant: bool,
        act: ActArgs,
        residual: np.ndarray | None = None,
    ) -> None:
        """See ``algorithms.ConvAlgorithm.run``; ``residual``: a FusedConv's Z."""
        panels, panel_bias = weights.panels(w, bias, constant)
        x_flat, out_flat = x.reshape(*x.shape[:2], -1), out.reshape(*out.shape[:2], -1)
        z = None if residual is None else residual.reshape(out_flat.shape)
        conv_packed(x_flat, panels, panel_bias, out_flat, self.bounds, *act, z)
