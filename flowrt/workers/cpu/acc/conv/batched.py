"""Conv over a batch of small images as one GEMM: the images' column matrices side by side.

A layer with few output pixels (the 7x7 to 14x14 stages of the ImageNet models) makes a
GEMM only tens of columns wide, where BLAS runs below its speed, and a batch of such images
would read the layer's weights (up to megabytes, from L3 or memory) once per image. Here every image's
column matrix (its im2col, or its input itself for a 1x1 stride-1 conv) is copied into one
matrix ``(C/group * kh * kw, N * pixels)``, one GEMM per (group, column slice) multiplies the
weights by it, and the product is copied back into each image's output with bias and the
activation. The copies are small against the GEMM they widen. Its algorithm is :class:`Batched`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import attrs
import numpy as np
from numba import njit

from flowrt.workers.cpu.acc.blas import NATIVE, SliceFunction, call_native, run_stages, sgemm
from flowrt.workers.cpu.acc.conv.im2col import fill_address, fill_kind
from flowrt.workers.cpu.acc.conv.packed import Packed
from flowrt.workers.cpu.acc.kernels.epilogue import activate_row

if TYPE_CHECKING:
    from flowrt.workers.cpu.acc.conv.algorithms import ActArgs
    from flowrt.workers.cpu.acc.conv.geometry import ConvGeometry
    from flowrt.workers.cpu.acc.conv.tuning import ConvTuning
    from flowrt.workers.cpu.acc.conv.weights import ConvWeights


# Its three parallel loops are SliceFunctions, called by address from the one shared parallel
# loop (``calls.py``), and the im2col fill is called by address too: as prange loops of its
# own, this kernel took 9.5 s to compile on a cold cache.


@njit(**NATIVE)
def _batched_columns(task, _step, x_flat, src, image, geo, height, width, columns, kg, cg, chunks, fill):
    """Rows ``(r, n)`` of the batch's column matrix (flat ``columns``: (groups * kg, batch,
    pixels)), the ``task``-th of ``chunks`` runs of them: image ``n``'s pixels straight from
    ``x_flat`` when the conv is direct (``fill`` 0), else its im2col row ``r`` by the fill at
    address ``fill`` (``im2col.fill_address``)."""
    batch, pixels = x_flat.shape[0], geo[8] * geo[9]  # output pixels: x_flat's, if direct
    total = columns.shape[0] // pixels
    xf = x_flat.reshape(-1)
    for k in range(task * total // chunks, (task + 1) * total // chunks):
        r, n = divmod(k, batch)
        at = k * pixels
        if fill:
            g, rg = divmod(r, kg)
            call_native(
                fill,
                (
                    src,
                    n * image,
                    g * cg,
                    geo,
                    height,
                    width,
                    rg,
                    np.int64(0),
                    columns,
                    at,
                    np.int64(1),
                    pixels,
                ),
            )
        else:
            o, s = np.uint64(at), np.uint64((n * x_flat.shape[1] + r) * pixels)
            for t in range(np.uint64(pixels)):
                columns[o + t] = xf[s + t]


@njit(**NATIVE)
def _batched_gemm(task, _step, w, matrix, product, bounds):
    """The ``task``-th (group, slice of ``bounds``) block of ``product`` = ``w[g]`` @
    ``matrix`` (the group's rows of the column matrix, as (rows, batch * pixels))."""
    groups, mg, kg = w.shape
    slices = bounds.shape[0] - 1
    g, s = divmod(task, slices)
    q0, q1 = bounds[s], bounds[s + 1]
    sgemm(
        False,
        False,
        1.0,
        w[g],
        matrix[g * kg : (g + 1) * kg, q0:q1],
        0.0,
        product[g * mg : (g + 1) * mg, q0:q1],
    )


@njit(**NATIVE)
def _batched_finish(task, _step, out, product, bias, code, alpha, beta, chunks):
    """Output planes ``(n, m)``, the ``task``-th of ``chunks`` runs of them: ``product``'s row
    ``m``, image ``n``'s pixels, with bias and activation."""
    batch, m_count, pixels = out.shape
    for k in range(task * batch * m_count // chunks, (task + 1) * batch * m_count // chunks):
        n, m = divmod(k, m_count)
        activate_row(out[n, m], product[m][n * pixels : (n + 1) * pixels], bias[m], code, alpha, beta)


_COLUMNS = SliceFunction(_batched_columns)
_GEMM = SliceFunction(_batched_gemm)
_FINISH = SliceFunction(_batched_finish)


def conv_batched(x, x_flat, w, bias, out, geo, direct, bounds, code, alpha, beta):
    """``out`` (N, M, pixels) for every image of ``x``, by one GEMM per (group, slice of
    ``bounds`` over the N * pixels columns): the batch's column matrix first, then the GEMMs,
    then bias and activation, each split over the workers."""
    groups, mg, kg = w.shape
    batch, pixels = out.shape[0], out.shape[2]
    columns = np.empty((groups * kg, batch, pixels), np.float32)
    product = np.empty((groups * mg, batch * pixels), np.float32)
    slices = bounds.shape[0] - 1
    src = x.reshape(-1)
    fill = 0 if direct else fill_address(fill_kind(geo, x.shape[3], False), src, geo)
    image = x.shape[1] * x.shape[2] * x.shape[3]
    chunks = min(groups * kg * batch, slices)
    first = (
        x_flat,
        src,
        image,
        geo,
        x.shape[2],
        x.shape[3],
        columns.reshape(-1),
        kg,
        x.shape[1] // groups,
        chunks,
        fill,
    )
    second = (w, columns.reshape((groups * kg, batch * pixels)), product, bounds)
    run_stages(1, _COLUMNS.address(first), chunks, first, _GEMM.address(second), groups * slices, second)
    _FINISH.run(
        min(batch * groups * mg, slices),
        (out, product, bias, code, alpha, beta, min(batch * groups * mg, slices)),
    )


@attrs.frozen(eq=False)
class Batched:
    """Plan of a conv by :func:`conv_batched`: ``bounds`` over all the images' pixels."""

    name: ClassVar[str] = "batched"
    geo: np.ndarray
    direct: bool
    bounds: np.ndarray

    @classmethod
    def applies(cls, geometry: ConvGeometry, tuning: ConvTuning) -> bool:
        """A batch of small images (``tuning.merge_pixels``) through large weights
        (``tuning.merge_weights``), not one that :class:`Packed` takes, whose one GEMM splits
        over the workers as evenly as image by image would. (The tiles read the images in
        place, where the one GEMM copies them first: resnet50's 1x1 convs at 7x7 and 14x14
        and squeezenet's last, at batch 4, ran 1-12% faster by tiles on one thread and
        16-35% on two.)"""
        if not (
            geometry.x_shape[0] > 1
            and geometry.pixels <= tuning.merge_pixels
            and geometry.group_weights >= tuning.merge_weights
            and not Packed.applies(geometry, tuning)
        ):
            return False
        others = (geometry.column_bounds(tuning), geometry.row_bounds(tuning))
        return geometry.balance(geometry.batch_bounds(tuning)) >= max(geometry.balance(b) for b in others)

    @classmethod
    def plan(cls, geometry: ConvGeometry, tuning: ConvTuning) -> Batched:
        """All the images' pixels split over the workers."""
        return cls(geometry.geo(), geometry.direct, geometry.batch_bounds(tuning))

    def run(
        self, weights: ConvWeights, x, w, w_shape, bias, out, finish: bool, constant: bool, act: ActArgs
    ) -> None:
        """See ``algorithms.ConvAlgorithm.run``."""
        x_flat, out_flat = x.reshape(*x.shape[:2], -1), out.reshape(*out.shape[:2], -1)
        conv_batched(x, x_flat, w, bias, out_flat, self.geo, self.direct, self.bounds, *act)
