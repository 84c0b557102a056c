"""5x5 depthwise convs with unit strides and two pad cells on each side (MobileNetV3's and
EfficientNet's): all 25 taps of an output in one loop over the plane, as
``depthwise.DEPTHWISE_SAME3`` takes 3x3 ones. Its algorithm is :class:`DepthwiseSame5`.

The general depthwise path makes five passes per plane (one per kernel row) over a padded
copy, on the padded row pitch, then copies the result out: at 7x7 and 14x14 those passes and
copies cost more than the taps. Here the plane is copied once into the middle of a scratch
whose zeros stand for the pad rows, and each output reads its 25 taps from it on the plane's
own pitch; a tap whose column falls off the left or right edge of the plane reads a cell of
the row above or below, which four per-output masks drop. On one AVX2 EPYC core, 576 planes
of 7x7: 162 -> 63 us; 480 planes of 14x14: 381 -> 194 us.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import attrs
import numpy as np
from numba import njit

from flowrt.workers.cpu.acc.calls import NATIVE, SliceFunction
from flowrt.workers.cpu.acc.conv.depthwise import Depthwise
from flowrt.workers.cpu.acc.kernels.epilogue import NONE, RELU, activate, activate_planes

if TYPE_CHECKING:
    from flowrt.workers.cpu.acc.conv.geometry import ConvGeometry
    from flowrt.workers.cpu.acc.conv.tuning import ConvTuning


@njit(inline="always", nogil=True, cache=True)
def _column(middle, at, p, w0, w1, w2, w3, w4):
    """One kernel column's five taps for the output whose centre cell is ``middle[at]``,
    ``p`` the plane's pitch."""
    return ((w0 * middle[at - p - p] + w1 * middle[at - p]) + w2 * middle[at]) + (
        w3 * middle[at + p] + w4 * middle[at + p + p]
    )


@njit(inline="always", nogil=True, cache=True)
def _twenty_five_taps(o, oo, b, wm, middle, masks, width, pixels, relu):
    """``o[oo + i]`` for ``i < pixels``: bias ``b`` plus the 25 taps of ``wm`` read from the
    bordered plane ``middle`` (the plane at ``2 * width + 2``), through Relu when ``relu``;
    ``masks[c, i]`` says whether column offset ``c - 2`` (c = 0, 1, 3, 4) stays on the plane."""
    p, one, two = np.uint64(width), np.uint64(1), np.uint64(2)
    start = np.uint64(2 * width + 2)
    zero = np.float32(0)
    for i in range(np.uint64(pixels)):
        at = start + i
        c0 = _column(middle, at - two, p, wm[0, 0], wm[1, 0], wm[2, 0], wm[3, 0], wm[4, 0])
        c1 = _column(middle, at - one, p, wm[0, 1], wm[1, 1], wm[2, 1], wm[3, 1], wm[4, 1])
        c2 = _column(middle, at, p, wm[0, 2], wm[1, 2], wm[2, 2], wm[3, 2], wm[4, 2])
        c3 = _column(middle, at + one, p, wm[0, 3], wm[1, 3], wm[2, 3], wm[3, 3], wm[4, 3])
        c4 = _column(middle, at + two, p, wm[0, 4], wm[1, 4], wm[2, 4], wm[3, 4], wm[4, 4])
        left = (c0 if masks[0, i] else zero) + (c1 if masks[1, i] else zero)
        right = (c3 if masks[3, i] else zero) + (c4 if masks[4, i] else zero)
        v = ((b + left) + c2) + right
        o[oo + i] = activate(v, RELU, zero, zero) if relu else v


@njit(**NATIVE)
def _same5_slice(s, _step, bounds, x, w, bias, out, code, alpha, beta):
    """Slice ``s`` of :data:`DEPTHWISE_SAME5` (a ``SliceFunction``): the 5x5 depthwise conv
    (unit strides and dilations, two pad cells on each side) of C-contiguous ``x`` into
    C-contiguous ``out``, (image, output channel) planes ``bounds[s] .. bounds[s + 1]``, on
    scratches of the slice."""
    channels, height, width = x.shape[1], x.shape[2], x.shape[3]
    m_count = out.shape[1]
    multiplier = m_count // channels
    pixels = height * width
    border = 2 * width + 2
    x_flat = x.reshape(-1)
    out_flat = out.reshape(-1)
    # zero borders of two rows and two cells on both sides, which the planes leave alone
    middle = np.zeros(pixels + 2 * border, np.float32)
    masks = np.ones((5, pixels), np.bool_)
    for i in range(pixels):
        column = i % width
        masks[0, i] = column >= 2
        masks[1, i] = column >= 1
        masks[3, i] = column + 1 < width
        masks[4, i] = column + 2 < width
    curve = NONE if code == RELU else code  # Relu in the taps' loop, any other curve after
    pending = bounds[s] * pixels
    for task in range(bounds[s], bounds[s + 1]):
        n, m = divmod(task, m_count)
        xo = np.uint64((n * channels + m // multiplier) * pixels)
        for t in range(np.uint64(pixels)):
            middle[np.uint64(border) + t] = x_flat[xo + t]
        oo = np.uint64(task * pixels)
        if code == RELU:
            _twenty_five_taps(out_flat, oo, bias[m], w[m], middle, masks, width, pixels, True)
        else:
            _twenty_five_taps(out_flat, oo, bias[m], w[m], middle, masks, width, pixels, False)
        end = (task + 1) * pixels
        pending = activate_planes(out_flat, pending, end, task == bounds[s + 1] - 1, curve, alpha, beta)


# args (bounds, x, w, bias, out, code, alpha, beta), as ``Depthwise.plane_kernel`` takes.
DEPTHWISE_SAME5 = SliceFunction(_same5_slice)


@attrs.frozen(eq=False)
class DepthwiseSame5(Depthwise):
    """Plan of a 5x5 depthwise conv with unit strides and dilations, two pad cells on every
    side and planes of at least 3x3: :data:`DEPTHWISE_SAME5` (``depthwise.DEPTHWISE``
    where the output given is not C-contiguous)."""

    name: ClassVar[str] = "depthwise_same5"
    plane_kernel = DEPTHWISE_SAME5

    @classmethod
    def applies(cls, geometry: ConvGeometry, tuning: ConvTuning) -> bool:
        """A depthwise conv of that shape."""
        g = geometry.window
        return (
            Depthwise.applies(geometry, tuning)
            and geometry.kernel == (5, 5)
            and g.strides == g.dilations == (1, 1)
            and g.pads_begin == g.pads_end == (2, 2)
            and min(geometry.x_shape[2:]) >= 3
        )
