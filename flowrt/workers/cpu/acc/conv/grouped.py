"""Grouped Conv with few channels per group (RegNet's and ResNeXt's 3x3 convs): a direct
sliding window, as the depthwise kernel runs, over each group's input channels.

im2col and GEMM run such a conv as one small GEMM per group (8 output channels by 72 taps in
RegNet), whose tiles are mostly border and whose column matrix is copied for every group:
RegNet-Y-400MF's grouped convs ran at 5-9 GFLOP/s. Here a task is one (image, group): its
``cg`` input channels are copied once into zero-bordered (or phase) planes, and each of its
output planes is the sum of ``cg`` depthwise passes, every 3-wide kernel row's taps one
vectorized loop over the plane (as ``depthwise._row_taps``). Its algorithm, :class:`Grouped`, takes groups of
at most ``MAX_GROUP_CHANNELS`` input channels and kernels larger than 1x1 (a grouped 1x1 conv
is a GEMM per group, which register tiles run better).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import attrs
import numpy as np
from numba import njit

from flowrt.engine.scheduler.window import SplitHint, split_bounds
from flowrt.workers.cpu.acc.calls import NATIVE, SliceFunction
from flowrt.workers.cpu.acc.conv.depthwise import _source_shape, store_plane
from flowrt.workers.cpu.acc.conv.finish import finish_row_late
from flowrt.workers.cpu.acc.kernels.epilogue import NO_BIAS, NONE, RELU, relu
from flowrt.workers.cpu.acc.phases import cell_offset, fill_phase_planes_late

if TYPE_CHECKING:
    from flowrt.workers.cpu.acc.conv.algorithms import ActArgs
    from flowrt.workers.cpu.acc.conv.geometry import ConvGeometry
    from flowrt.workers.cpu.acc.conv.tuning import ConvTuning
    from flowrt.workers.cpu.acc.conv.weights import ConvWeights

# Input channels per group up to which a grouped conv runs here rather than by im2col.
MAX_GROUP_CHANNELS = 16


@njit(**NATIVE)
def _output_plane(src, plane, cg, wm, b, acc, total, taps, with_relu):
    """``acc[:total]`` = ``b`` plus the taps of ``wm`` (cg, kh, kw) over the ``cg`` planes in
    ``src`` (each ``plane`` long), through Relu when ``with_relu``; ``taps[ki * kw + kj]``:
    where tap (ki, kj) starts reading a channel's planes. A 3-wide kernel row is one loop over
    the run, as ``depthwise.kernel_row`` does (the bias with the first, Relu with the last),
    any other a loop per tap. (Not ``kernel_row`` itself: its inlined variants took numba 6 s
    to compile here.)"""
    kh, kw = wm.shape[1], wm.shape[2]
    u8 = np.uint64
    n, zero = u8(total), np.float32(0)
    if kw != 3:
        for i in range(n):
            acc[i] = b
    for j in range(cg):
        base = j * plane
        for ki in range(kh):
            if kw != 3:
                for kj in range(kw):
                    wv, s0 = wm[j, ki, kj], u8(base + taps[ki * kw + kj])
                    for i in range(n):
                        acc[i] += wv * src[s0 + i]
                continue
            s0, s1, s2 = u8(base + taps[3 * ki]), u8(base + taps[3 * ki + 1]), u8(base + taps[3 * ki + 2])
            w0, w1, w2 = wm[j, ki, 0], wm[j, ki, 1], wm[j, ki, 2]
            if j == 0 and ki == 0:
                for i in range(n):
                    acc[i] = b + (w0 * src[s0 + i] + w1 * src[s1 + i] + w2 * src[s2 + i])
            elif with_relu and j == cg - 1 and ki == kh - 1:
                for i in range(n):
                    acc[i] = relu(
                        acc[i] + (w0 * src[s0 + i] + w1 * src[s1 + i] + w2 * src[s2 + i]), zero, zero
                    )
                return
            else:
                for i in range(n):
                    acc[i] += w0 * src[s0 + i] + w1 * src[s1 + i] + w2 * src[s2 + i]
    if with_relu:
        for i in range(n):
            acc[i] = relu(acc[i], zero, zero)


@njit(**NATIVE)
def _grouped_slice(s, _step, x, w, bias, out, geo, code, alpha, beta, bounds):
    """Slice ``s`` of the (image, group) tasks of :func:`grouped_direct` (a
    :class:`~flowrt.workers.cpu.acc.calls.SliceFunction`)."""
    sh, sw, ph, pw = geo[2], geo[3], geo[6], geo[7]
    channels, height, width = x.shape[1], x.shape[2], x.shape[3]
    m_count, oh_count, ow_count = out.shape[1], out.shape[2], out.shape[3]
    cg = w.shape[1]
    groups = channels // cg
    mg = m_count // groups
    rows, pitch = _source_shape(geo, height, width, oh_count, ow_count)
    plane = sh * sw * rows * pitch
    total = (oh_count - 1) * pitch + ow_count
    # scratch: the group's padded or phase planes (pad cells stay zero), the output run
    src = np.zeros(cg * plane, np.float32)
    acc = np.empty(oh_count * pitch, np.float32)
    kh, kw = w.shape[2], w.shape[3]
    taps = np.empty(kh * kw, np.int64)
    for t in range(kh * kw):
        taps[t] = cell_offset(t // kw, t % kw, sh, sw, geo[4], geo[5], rows * pitch, pitch)
    for task in range(bounds[s], bounds[s + 1]):
        n, g = divmod(task, groups)
        for j in range(cg):
            fill_phase_planes_late(
                src[j * plane : (j + 1) * plane], x[n, g * cg + j], rows, pitch, rows * pitch, sh, sw, ph, pw
            )
        for mm in range(mg):
            m = g * mg + mm
            _output_plane(src, plane, cg, w[m], bias[m], acc, total, taps, code == RELU)
            if code != NONE and code != RELU:
                finish_row_late(acc[:total], NO_BIAS, code, alpha, beta)
            store_plane(acc, out, n, m, pitch)


# Its slices are a SliceFunction, called by address from the one shared parallel loop: as a
# prange loop of its own, with depthwise's tap rows inlined into it, this kernel took 20 s to
# compile on a cold cache.
_GROUPED_SLICE = SliceFunction(_grouped_slice)


def grouped_direct(x, w, bias, out, geo, code, alpha, beta, bounds) -> None:
    """Tasks are (image, group) pairs, cut into slices by ``bounds``; ``w`` is (M, cg, kh,
    kw), output channel m belonging to group ``m // (M // groups)``."""
    _GROUPED_SLICE.run(bounds.shape[0] - 1, (x, w, bias, out, geo, code, alpha, beta, bounds))


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
        self, weights: ConvWeights, x, w, w_shape, bias, out, finish: bool, constant: bool, act: ActArgs
    ) -> None:
        """See ``algorithms.ConvAlgorithm.run``."""
        grouped_direct(x, w.reshape(w_shape), bias, out, self.geo, *act, self.bounds)
