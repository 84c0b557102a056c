"""Grouped 3x3 convs with unit strides and one pad cell on each side, of few channels per group
(RegNet's and ResNeXt's): for each output channel, one loop over the plane per input channel
of its group, all nine taps of that channel in it. Its algorithm is :class:`GroupedSame3`.

The general grouped path (``grouped.py``) makes one pass per (input channel, kernel row) over a
padded copy on a wider pitch, three taps each, then copies the result out: 24 passes over the
output run for RegNet's 8 channels per group, each reading and writing it. Here the group's
input planes are copied once into a scratch whose zero borders stand for the pad rows, as
``depthwise.depthwise_same3`` does for one channel, and each output plane is built in place in
the output by one pass per input channel (9 taps), masks dropping the taps that fall off a
row's ends. At stride 2 (:class:`GroupedStrided2`), each channel is split into its phase planes
on the output's pitch instead, as ``depthwise_strided.py`` does. On one AVX2 EPYC core,
RegNet-Y-400MF's shapes (8 channels per group):
(1, 48, 56, 56) 643 -> 361 us, (1, 208, 14, 14) 350 -> 175 us, (1, 440, 7, 7) 351 -> 98 us;
at stride 2, (1, 48, 112, 112) 911 -> 591 us, (1, 440, 14, 14) 609 -> 189 us.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import attrs
import numpy as np
from numba import njit

from flowrt.workers.cpu.acc.calls import SliceFunction
from flowrt.workers.cpu.acc.conv.depthwise_strided import _GUARD, _fill_phases, columns3
from flowrt.workers.cpu.acc.conv.grouped import MAX_GROUP_CHANNELS
from flowrt.workers.cpu.acc.kernels.epilogue import NO_BIAS, activate_row

if TYPE_CHECKING:
    from flowrt.workers.cpu.acc.conv.algorithms import ActArgs
    from flowrt.workers.cpu.acc.conv.geometry import ConvGeometry
    from flowrt.workers.cpu.acc.conv.tuning import ConvTuning
    from flowrt.workers.cpu.acc.conv.weights import ConvWeights


@njit(inline="always", nogil=True, cache=True)
def _channel_taps(out, o, add, b, wm, middle, at, first, last, width, pixels):
    """``out[o + i]`` for ``i < pixels``: the nine taps of ``wm`` (3, 3) read from the
    bordered plane whose cell 0 is ``middle[at]``, added on (``add``) or onto ``b``. A tap left
    of column 0 reads the row above's last cell and one right of the last column the row
    below's first: ``first`` and ``last`` (per output) drop those."""
    w, one = np.uint64(width), np.uint64(1)
    up, down = at - w, at + w
    w00, w01, w02 = wm[0, 0], wm[0, 1], wm[0, 2]
    w10, w11, w12 = wm[1, 0], wm[1, 1], wm[1, 2]
    w20, w21, w22 = wm[2, 0], wm[2, 1], wm[2, 2]
    zero = np.float32(0)
    for i in range(np.uint64(pixels)):
        left = (w00 * middle[up + i - one] + w10 * middle[at + i - one]) + w20 * middle[down + i - one]
        centre = (w01 * middle[up + i] + w11 * middle[at + i]) + w21 * middle[down + i]
        right = (w02 * middle[up + i + one] + w12 * middle[at + i + one]) + w22 * middle[down + i + one]
        v = ((left if first[i] else zero) + centre) + (right if last[i] else zero)
        if add:
            out[o + i] += v
        else:
            out[o + i] = b + v


@njit(nogil=True, cache=True)
def _group_task(
    task, _step, x_flat, w, bias, out_flat, middle, first, last, width, pixels, groups, code, alpha, beta
):
    """Task (image, group): the group's input planes into this task's scratch (``middle``
    of the slice running it, row ``task``), then each of its output planes."""
    cg, m_count = w.shape[1], w.shape[0]
    mg = m_count // groups
    n, g = divmod(task, groups)
    scratch = middle[task]
    border = np.uint64(width + 1)
    plane = np.uint64(pixels)
    xo = np.uint64((n * groups + g) * cg * pixels)
    for j in range(np.uint64(cg)):
        at = border + j * (plane + border)
        src = xo + j * plane
        for t in range(plane):
            scratch[at + t] = x_flat[src + t]
    for mm in range(mg):
        m = g * mg + mm
        o = np.uint64((n * m_count + m) * pixels)
        for j in range(np.uint64(cg)):
            at = border + j * (plane + border)
            if j == 0:
                _channel_taps(out_flat, o, False, bias[m], w[m, j], scratch, at, first, last, width, pixels)
            else:
                _channel_taps(out_flat, o, True, bias[m], w[m, j], scratch, at, first, last, width, pixels)
        row = out_flat[o : o + plane]
        activate_row(row, row, NO_BIAS, code, alpha, beta)


_GROUP_TASK = SliceFunction(_group_task)


@attrs.frozen(eq=False)
class GroupedSame3:
    """Plan of a grouped 3x3 conv (not depthwise) of at most ``MAX_GROUP_CHANNELS`` channels
    per group, unit strides and dilations, one pad cell on each side, planes of at least 2x2:
    one task per (image, group)."""

    name: ClassVar[str] = "grouped_same3"
    first: np.ndarray  # per output: whether its left taps are on the plane
    last: np.ndarray  # and its right taps

    @classmethod
    def applies(cls, geometry: ConvGeometry, tuning: ConvTuning) -> bool:
        """A grouped conv of that shape."""
        g = geometry.window
        return (
            1 < geometry.groups < geometry.x_shape[1]
            and geometry.w_shape[1] <= MAX_GROUP_CHANNELS
            and geometry.kernel == (3, 3)
            and g.strides == g.dilations == (1, 1)
            and g.pads_begin == g.pads_end == (1, 1)
            and min(geometry.x_shape[2:]) >= 2
        )

    @classmethod
    def plan(cls, geometry: ConvGeometry, tuning: ConvTuning) -> GroupedSame3:
        """The masks of the plane's first and last columns."""
        width = geometry.x_shape[3]
        column = np.arange(geometry.x_shape[2] * width) % width
        return cls(column > 0, column < width - 1)

    def run(
        self, weights: ConvWeights, x, w, w_shape, bias, out, finish: bool, constant: bool, act: ActArgs
    ) -> None:
        """See ``algorithms.ConvAlgorithm.run``."""
        batch, channels, height, width = x.shape
        groups = channels // w_shape[1]
        pixels = height * width
        tasks = batch * groups
        # a scratch per task, zero borders around each of the group's planes
        middle = np.zeros((tasks, w_shape[1] * (pixels + width + 1) + width + 1), np.float32)
        args = (
            x.reshape(-1), w.reshape(w_shape), bias, out.reshape(-1), middle, self.first, self.last,
            np.int64(width), np.int64(pixels), np.int64(groups), *act,
        )  # fmt: skip
        _GROUP_TASK.run(tasks, args)


@njit(inline="always", nogil=True, cache=True)
def _channel_taps_s2(out, o, add, b, wm, p00, p01, p10, p11, left, ow_count, pixels):
    """:func:`_channel_taps` at stride 2, from one input channel's four phase planes on the
    output's pitch (``depthwise_strided.py``); ``left[i]``: whether output i's column has one
    to its left."""
    zero, p = np.float32(0), np.uint64(ow_count)
    start = np.uint64(_GUARD + ow_count)
    for i in range(np.uint64(pixels)):
        c0, c1, c2 = columns3(p00, p01, p10, p11, start + i, p, wm)
        v = ((c0 if left[i] else zero) + c1) + c2
        if add:
            out[o + i] += v
        else:
            out[o + i] = b + v


@njit(nogil=True, cache=True)
def _group_task_s2(task, _step, x_flat, w, bias, out_flat, phases, left, height, width, oh, ow, groups, code, alpha, beta):  # fmt: skip
    """:func:`_group_task` at stride 2: the group's channels split into phase planes (rows
    ``task`` of ``phases``), then each of its output planes."""
    cg, m_count = w.shape[1], w.shape[0]
    mg = m_count // groups
    n, g = divmod(task, groups)
    mine = phases[task]
    pixels = oh * ow
    for j in range(cg):
        _fill_phases(mine[j], x_flat, ((n * groups + g) * cg + j) * height * width, height, width, oh, ow)
    for mm in range(mg):
        m = g * mg + mm
        o = np.uint64((n * m_count + m) * pixels)
        for j in range(cg):
            q = mine[j]
            if j == 0:
                _channel_taps_s2(
                    out_flat, o, False, bias[m], w[m, j], q[0], q[1], q[2], q[3], left, ow, pixels
                )
            else:
                _channel_taps_s2(
                    out_flat, o, True, bias[m], w[m, j], q[0], q[1], q[2], q[3], left, ow, pixels
                )
        row = out_flat[o : o + np.uint64(pixels)]
        activate_row(row, row, NO_BIAS, code, alpha, beta)


_GROUP_TASK_S2 = SliceFunction(_group_task_s2)


@attrs.frozen(eq=False)
class GroupedStrided2:
    """Plan of a grouped 3x3 conv (not depthwise) of at most ``MAX_GROUP_CHANNELS`` channels
    per group, stride 2, no dilation, one pad cell on each side: one task per (image, group),
    from the group's phase planes."""

    name: ClassVar[str] = "grouped_strided2"
    left: np.ndarray  # per output: whether its column has one to its left

    @classmethod
    def applies(cls, geometry: ConvGeometry, tuning: ConvTuning) -> bool:
        """A grouped conv of that shape."""
        g = geometry.window
        return (
            1 < geometry.groups < geometry.x_shape[1]
            and geometry.w_shape[1] <= MAX_GROUP_CHANNELS
            and geometry.kernel == (3, 3)
            and g.strides == (2, 2)
            and g.dilations == (1, 1)
            and g.pads_begin == g.pads_end == (1, 1)
        )

    @classmethod
    def plan(cls, geometry: ConvGeometry, tuning: ConvTuning) -> GroupedStrided2:
        """The mask of the output's first column."""
        oh, ow = geometry.out_hw
        return cls(np.arange(oh * ow) % ow > 0)

    def run(
        self, weights: ConvWeights, x, w, w_shape, bias, out, finish: bool, constant: bool, act: ActArgs
    ) -> None:
        """See ``algorithms.ConvAlgorithm.run``."""
        batch, channels, height, width = x.shape
        oh, ow = out.shape[2], out.shape[3]
        groups = channels // w_shape[1]
        tasks = batch * groups
        phases = np.empty((tasks, w_shape[1], 4, (oh + 2) * ow + 2 * _GUARD), np.float32)
        args = (
            x.reshape(-1), w.reshape(w_shape), bias, out.reshape(-1), phases, self.left,
            np.int64(height), np.int64(width), np.int64(oh), np.int64(ow), np.int64(groups), *act,
        )  # fmt: skip
        _GROUP_TASK_S2.run(tasks, args)
