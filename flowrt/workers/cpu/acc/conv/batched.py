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

from typing import TYPE_CHECKING, Any, ClassVar

import attrs
import numpy as np
from numba import njit, prange

from flowrt.workers.cpu.acc.blas import PRANGE_ONLY, sgemm
from flowrt.workers.cpu.acc.conv.im2col import fill_columns
from flowrt.workers.cpu.acc.conv.packed import Packed
from flowrt.workers.cpu.acc.kernels.epilogue import activate_row
from flowrt.workers.cpu.acc.phases import copy_run

if TYPE_CHECKING:
    from flowrt.workers.cpu.acc.conv.geometry import ConvGeometry
    from flowrt.workers.cpu.acc.conv.tuning import ConvTuning
    from flowrt.workers.cpu.acc.conv.weights import ConvWeights


@njit(parallel=PRANGE_ONLY, nogil=True, cache=True)
def conv_batched(x, x_flat, w, bias, out, geo, direct, bounds, code, alpha, beta):
    """``out`` (N, M, pixels) for every image of ``x``, by one GEMM per (group, slice of
    ``bounds`` over the N * pixels columns)."""
    groups, mg, kg = w.shape
    cg = x.shape[1] // groups
    batch, pixels = out.shape[0], out.shape[2]
    columns = np.empty((groups * kg, batch, pixels), np.float32)
    product = np.empty((groups * mg, batch * pixels), np.float32)
    for task in prange(batch * groups * kg):
        n, r = divmod(np.int64(task), groups * kg)
        if direct:
            copy_run(columns[r, n], x_flat[n, r])
        else:
            g, rg = divmod(r, kg)
            fill_columns(x[n], x_flat[n], g * cg, geo, rg, np.int64(0), columns[r, n : n + 1])
    matrix = columns.reshape((groups * kg, batch * pixels))
    slices = bounds.shape[0] - 1
    for task in prange(groups * slices):
        g, s = divmod(np.int64(task), slices)
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
    for task in prange(batch * groups * mg):
        n, m = divmod(np.int64(task), groups * mg)
        activate_row(out[n, m], product[m][n * pixels : (n + 1) * pixels], bias[m], code, alpha, beta)


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
        self, weights: ConvWeights, x, w, w_shape, bias, out, finish: bool, constant: bool, act: Any
    ) -> None:
        """See ``algorithms.ConvAlgorithm.run``."""
        x_flat, out_flat = x.reshape(*x.shape[:2], -1), out.reshape(*out.shape[:2], -1)
        conv_batched(x, x_flat, w, bias, out_flat, self.geo, self.direct, self.bounds, *act)
