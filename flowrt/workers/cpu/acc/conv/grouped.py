"""Grouped Conv with few channels per group (RegNet's and ResNeXt's 3x3 convs): a direct
sliding window, as the depthwise kernel runs, over each group's input channels.

im2col and GEMM run such a conv as one small GEMM per group (8 output channels by 72 taps in
RegNet), whose tiles are mostly border and whose column matrix is copied for every group:
RegNet-Y-400MF's grouped convs ran at 5-9 GFLOP/s. Here a task is one (image, group): its
``cg`` input channels are copied once into zero-bordered (or phase) planes, and each of its
output planes is the sum of ``cg`` depthwise passes, every kernel row's taps one vectorized
loop over the plane (``depthwise._row_taps``). Its algorithm, :class:`Grouped`, takes groups of
at most ``MAX_GROUP_CHANNELS`` input channels and kernels larger than 1x1 (a grouped 1x1 conv
is a GEMM per group, which register tiles run better).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import attrs
import numpy as np
from numba import njit, prange

from flowrt.engine.scheduler.window import SplitHint, split_bounds
from flowrt.workers.cpu.acc.blas import PRANGE_ONLY
from flowrt.workers.cpu.acc.conv.depthwise import _source_shape, kernel_row, store_plane
from flowrt.workers.cpu.acc.kernels.epilogue import NO_BIAS, RELU, activate_row
from flowrt.workers.cpu.acc.phases import fill_phase_planes

if TYPE_CHECKING:
    from flowrt.workers.cpu.acc.conv.geometry import ConvGeometry
    from flowrt.workers.cpu.acc.conv.tuning import ConvTuning
    from flowrt.workers.cpu.acc.conv.weights import ConvWeights

# Input channels per group up to which a grouped conv runs here rather than by im2col.
MAX_GROUP_CHANNELS = 16


@njit(inline="always", nogil=True, cache=True)
def _output_plane(src, plane, cg, wm, b, acc, total, geo, rows, pitch, relu):
    """``acc[:total]`` = ``b`` plus the taps of ``wm`` (cg, kh, kw) over the ``cg`` planes in
    ``src`` (each ``plane`` long), on the planes' row pitch; through Relu when ``relu``."""
    kh, kw = geo[0], geo[1]
    for j in range(cg):
        for ki in range(kh):
            last = relu and j == cg - 1 and ki == kh - 1
            kernel_row(
                acc, b, j == 0 and ki == 0, last, wm[j, ki], kw, src, j * plane, geo, rows, pitch, ki, total
            )


@njit(parallel=PRANGE_ONLY, nogil=True, cache=True)
def grouped_direct(x, w, bias, out, geo, code, alpha, beta, bounds):
    """Tasks are (image, group) pairs, cut into slices by ``bounds``; ``w`` is (M, cg, kh,
    kw), output channel m belonging to group ``m // (M // groups)``."""
    sh, sw, ph, pw = geo[2], geo[3], geo[6], geo[7]
    channels, height, width = x.shape[1], x.shape[2], x.shape[3]
    m_count, oh_count, ow_count = out.shape[1], out.shape[2], out.shape[3]
    cg = w.shape[1]
    groups = channels // cg
    mg = m_count // groups
    rows, pitch = _source_shape(geo, height, width, oh_count, ow_count)
    plane = sh * sw * rows * pitch
    total = (oh_count - 1) * pitch + ow_count
    relu = code == RELU
    for s in prange(bounds.shape[0] - 1):
        # scratch per slice: the group's padded or phase planes (pad cells stay zero), the run
        src = np.zeros(cg * plane, np.float32)
        acc = np.empty(oh_count * pitch, np.float32)
        for task in range(bounds[s], bounds[s + 1]):
            n, g = divmod(task, groups)
            for j in range(cg):
                fill_phase_planes(
                    src[j * plane : (j + 1) * plane],
                    x[n, g * cg + j],
                    rows,
                    pitch,
                    rows * pitch,
                    sh,
                    sw,
                    ph,
                    pw,
                )
            for mm in range(mg):
                m = g * mg + mm
                _output_plane(src, plane, cg, w[m], bias[m], acc, total, geo, rows, pitch, relu)
                if not relu:
                    activate_row(acc[:total], acc[:total], NO_BIAS, code, alpha, beta)
                store_plane(acc, out, n, m, pitch)


@attrs.frozen(eq=False)
class Grouped:
    """Plan of a grouped conv of few channels per group: :func:`grouped_direct` over (image,
    group) tasks, ``bounds`` of them per slice."""

    name: ClassVar[str] = "grouped"
    geo: np.ndarray
    bounds: np.ndarray

    @classmethod
    def applies(cls, geometry: ConvGeometry, tuning: ConvTuning) -> bool:
        """Groups (not depthwise) of at most ``MAX_GROUP_CHANNELS`` input channels, a kernel
        larger than 1x1."""
        return (
            1 < geometry.groups < geometry.x_shape[1]
            and geometry.w_shape[1] <= MAX_GROUP_CHANNELS
            and geometry.kernel != (1, 1)
        )

    @classmethod
    def plan(cls, geometry: ConvGeometry, tuning: ConvTuning) -> Grouped:
        """The (image, group) tasks split over the workers."""
        tasks = geometry.x_shape[0] * geometry.groups
        return cls(geometry.geo(), split_bounds(tasks, SplitHint(0, 1), geometry.workers))

    def run(
        self, weights: ConvWeights, x, w, w_shape, bias, out, finish: bool, constant: bool, act: Any
    ) -> None:
        """See ``algorithms.ConvAlgorithm.run``."""
        grouped_direct(x, w.reshape(w_shape), bias, out, self.geo, *act, self.bounds)
